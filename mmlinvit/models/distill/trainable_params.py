"""``trainable_params``: which student parameters train, by fnmatch pattern of their names."""
import fnmatch
from typing import Optional, Sequence

import torch.nn as nn

from .errors import DistillationConfigError


def check_patterns(patterns: Optional[Sequence[str]]) -> None:
    """Refuses ``trainable_params`` given as one string instead of a list of patterns.

    Raises:
        DistillationConfigError: naming the string and the list to write.
    """
    if isinstance(patterns, str):
        raise DistillationConfigError(
            f'trainable_params is a list of fnmatch patterns, got the string {patterns!r} '
            f'(its characters would be taken as patterns): write [{patterns!r}]')


def freeze_all_but(model: nn.Module, patterns: Sequence[str]) -> None:
    """Freezes every parameter of ``model`` whose name matches none of ``patterns``.

    Args:
        model: The student.
        patterns: fnmatch patterns of parameter names (e.g. ``['blocks.*.attn.*']``).

    Raises:
        DistillationConfigError: naming a pattern that matches no parameter (a typo would
            otherwise freeze everything it meant to train), or ``patterns`` given as one
            string (its characters would be taken as patterns).
    """
    check_patterns(patterns)
    names = [name for name, _ in model.named_parameters()]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise DistillationConfigError(
                f'trainable_params pattern {pattern!r} matches no student parameter; '
                f'first names: {names[:8]}')
    for name, param in model.named_parameters():
        if not any(fnmatch.fnmatchcase(name, p) for p in patterns):
            param.requires_grad_(False)
