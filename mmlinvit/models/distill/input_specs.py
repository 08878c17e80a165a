"""Input specs: where each argument of a distillation loss comes from.

A spec names a record as ``'student.<recorder>'``, ``'teacher.<recorder>'`` or a context entry
``'context.<key>'``; the dict form ``dict(source='student.feat', connector='proj')`` passes a
student/teacher record through a connector first.  The context entries
``student_token_layout`` / ``teacher_token_layout`` come from :func:`token_layout`.
"""
from typing import Optional, Sequence, Tuple, Union

import torch.nn as nn

from .errors import DistillationConfigError

#: Context entries input specs may name as ``'context.<key>'``.
CONTEXT_KEYS = ('patch_mask', 'student_token_layout', 'teacher_token_layout')
SIDES = ('student', 'teacher', 'context')


class InputSpec:
    """Where one loss argument comes from.

    Args:
        arg: Loss argument name.
        side: ``'student'``, ``'teacher'`` or ``'context'``.
        name: Recorder name or context key.
        connector: Optional connector name applied to the record.
    """

    def __init__(self, arg: str, side: str, name: str, connector: Optional[str] = None) -> None:
        self.arg = arg
        self.side = side
        self.name = name
        self.connector = connector

    def __repr__(self) -> str:
        via = f' via connector {self.connector!r}' if self.connector else ''
        return f'{self.side}.{self.name}{via}'


def parse_input_spec(term: str, arg: str, spec: Union[str, dict]) -> InputSpec:
    """Parses ``'side.name'`` or ``dict(source='side.name', connector=...)``."""
    connector = None
    if isinstance(spec, dict):
        unknown = sorted(set(spec) - {'source', 'connector'})
        if unknown or 'source' not in spec:
            raise DistillationConfigError(
                f"distill term {term!r}, argument {arg!r}: a dict input spec takes 'source' "
                f"(required) and 'connector', got keys {sorted(spec)}")
        connector = spec.get('connector')
        spec = spec['source']
    if not isinstance(spec, str) or '.' not in spec:
        raise DistillationConfigError(
            f"distill term {term!r}, argument {arg!r}: input spec {spec!r} must look like "
            f"'student.<recorder>', 'teacher.<recorder>' or 'context.<key>'")
    side, name = spec.split('.', 1)
    if side not in SIDES:
        raise DistillationConfigError(
            f'distill term {term!r}, argument {arg!r}: unknown side {side!r} in {spec!r}; '
            f'use one of {SIDES}')
    if side == 'context' and connector is not None:
        raise DistillationConfigError(
            f'distill term {term!r}, argument {arg!r}: context entries take no connector')
    return InputSpec(arg, side, name, connector)


def token_layout(layout: Optional[Sequence[int]],
                 backbone: nn.Module) -> Optional[Tuple[int, int]]:
    """The ``(prefix, suffix)`` special-token counts of a backbone's records.

    Args:
        layout: The configured ``(prefix, suffix)``; ``None`` reads the backbone.
        backbone: The student or teacher backbone (its ``num_prefix_tokens`` and
            ``num_suffix_tokens``, the latter 0 when absent).

    Returns:
        The layout, or ``None`` when neither is given (a term that maps it then fails at
        build time).

    Raises:
        DistillationConfigError: when ``layout`` is not a pair.
    """
    if layout is not None:
        if len(layout) != 2:
            raise DistillationConfigError(f'a token layout is (prefix, suffix), got '
                                          f'{tuple(layout)}')
        return int(layout[0]), int(layout[1])
    if not hasattr(backbone, 'num_prefix_tokens'):
        return None  # an error is raised if a term maps it
    return int(backbone.num_prefix_tokens), int(getattr(backbone, 'num_suffix_tokens', 0))
