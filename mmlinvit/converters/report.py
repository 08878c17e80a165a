"""What a checkpoint conversion did: renamed, dropped and set-aside keys, and notes."""
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

import torch

_BLOCK_INDEX = re.compile(r'^(.*?\b(?:blocks|layers|resblocks))\.(\d+)\.(.*)$')


def summarise_keys(keys: Iterable[str], limit: int = 40) -> List[str]:
    """Groups per-block keys so long key lists stay readable.

    ``blocks.0.ls1.gamma`` ... ``blocks.11.ls1.gamma`` becomes ``blocks.{0-11}.ls1.gamma``.

    Args:
        keys: Parameter names.
        limit: Maximum number of lines returned; the rest is counted in a last line.

    Returns:
        Sorted, grouped key descriptions.
    """
    groups: Dict[str, List[int]] = {}
    singles: List[str] = []
    for key in keys:
        match = _BLOCK_INDEX.match(key)
        if match:
            pattern = f'{match.group(1)}.{{}}.{match.group(3)}'
            groups.setdefault(pattern, []).append(int(match.group(2)))
        else:
            singles.append(key)
    lines = sorted(singles)
    for pattern, indices in sorted(groups.items()):
        indices = sorted(set(indices))
        if len(indices) == 1:
            text = str(indices[0])
        elif indices == list(range(indices[0], indices[-1] + 1)):
            text = f'{{{indices[0]}-{indices[-1]}}}'
        else:
            text = '{' + ','.join(str(i) for i in indices) + '}'
        lines.append(pattern.format(text))
    if len(lines) > limit:
        lines = lines[:limit] + [f'... and {len(lines) - limit} more']
    return lines


@dataclass
class ConversionReport:
    """Record of one conversion into the canonical layout (and, after loading, of the load).

    Attributes:
        source_layout: Layout the checkpoint was read as (``'dinov2'``, ``'timm'``...).
        prefix: The wrapper prefix whose keys were kept (``'backbone.'``, ``'student.'``...;
            ``''``: none, a plain backbone file).
        renamed: Source key -> canonical key, for keys whose name changed.
        dropped: Source key -> reason, for keys not carried into the canonical state dict.
        notes: Value changes and other facts worth knowing (e.g. a zero class position).
        extras: Tensors set aside instead of dropped (CLIP ``proj`` with ``keep_projection``).
        missing: Model keys the checkpoint lacked (filled after loading).
        initialised: The missing keys that keep the model's init by design (a mask token,
            operator parameters without a softmax counterpart), each with the reason.
        unexpected: Checkpoint keys the model lacks (filled after a non-strict load).
        loaded: Number of tensors loaded into the model (0 until loaded).
    """

    source_layout: str
    prefix: str = ''
    renamed: Dict[str, str] = field(default_factory=dict)
    dropped: Dict[str, str] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    extras: Dict[str, torch.Tensor] = field(default_factory=dict)
    missing: List[str] = field(default_factory=list)
    initialised: Dict[str, str] = field(default_factory=dict)
    unexpected: List[str] = field(default_factory=list)
    loaded: int = 0

    def drop(self, key: str, reason: str) -> None:
        """Records that ``key`` was left out, and why."""
        self.dropped[key] = reason

    def to_dict(self) -> dict:
        """Plain-data form (strings, lists, dicts) that ``torch.load(weights_only=True)`` reads."""
        return dict(
            source_layout=self.source_layout,
            prefix=self.prefix,
            renamed=dict(self.renamed),
            dropped=dict(self.dropped),
            notes=list(self.notes),
            extras={k: list(v.shape) for k, v in self.extras.items()},
            missing=list(self.missing),
            initialised=dict(self.initialised),
            unexpected=list(self.unexpected),
            loaded=self.loaded)

    def describe_initialised(self, keys: Optional[Iterable[str]] = None) -> List[str]:
        """The missing keys (or ``keys`` of them) grouped by reason, e.g.
        ``'blocks.{0-11}.attn.block_mixing (attention-operator parameter ...)'``; keys without
        a reason (skipped by a non-strict load) come last."""
        by_reason: Dict[str, List[str]] = {}
        for key in self.missing if keys is None else keys:
            by_reason.setdefault(self.initialised.get(key, 'skipped (strict=False)'),
                                 []).append(key)
        return [f'{", ".join(summarise_keys(keys, limit=8))} ({reason})'
                for reason, keys in by_reason.items()]

    def format(self) -> str:
        """Human-readable summary, one fact a line."""
        lines = [f'source layout: {self.source_layout}']
        if self.prefix:
            lines.append(f'keys under {self.prefix!r}')
        lines.append(f'renamed keys: {len(self.renamed)}')
        if self.dropped:
            by_reason: Dict[str, List[str]] = {}
            for key, reason in self.dropped.items():
                by_reason.setdefault(reason, []).append(key)
            lines.append(f'dropped keys: {len(self.dropped)}')
            for reason, keys in by_reason.items():
                shown = summarise_keys(keys, limit=8)
                lines.append(f'  {reason}: {", ".join(shown)}')
        for name, value in self.extras.items():
            lines.append(f'set aside: {name} {tuple(value.shape)}')
        lines.extend(f'note: {note}' for note in self.notes)
        if self.loaded:
            lines.append(f'loaded tensors: {self.loaded}')
        if self.missing:
            lines.append('missing (left at init): ' + '; '.join(self.describe_initialised()))
        if self.unexpected:
            lines.append(f'unexpected (ignored): {", ".join(summarise_keys(self.unexpected))}')
        return '\n'.join(lines)

    def summary(self) -> str:
        """:meth:`format` on one line (facts separated by ``'; '``), for log lines."""
        return '; '.join(line.strip() for line in self.format().splitlines())

    def __str__(self) -> str:
        return self.format()
