"""Attention-map matching (the map-level alternative to attention-output matching)."""
from typing import Sequence

import torch

from .base import DistillLossBase
from .token_utils import TensorOrSeq, check_layout, check_same_shape

MAP_MODES = ('mse', 'kl')


def _patch_block(maps: torch.Tensor, layout: Sequence[int], name: str) -> torch.Tensor:
    """Keeps the patch rows and columns of (B, H, N, N) maps."""
    prefix, suffix = check_layout(layout, f'the token layout of {name}')
    if maps.ndim != 4 or maps.shape[-1] != maps.shape[-2]:
        raise ValueError(f'{name} must be (B, heads, N, N) attention maps, got shape '
                         f'{tuple(maps.shape)}')
    n = maps.shape[-1]
    if prefix + suffix >= n:
        raise ValueError(f'{name} has {n} tokens, not more than its {prefix} prefix + '
                         f'{suffix} suffix special tokens')
    return maps[..., prefix:n - suffix, prefix:n - suffix]


class AttentionMapLoss(DistillLossBase):
    """Matches (B, heads, N, N) attention maps block by block.

    ``mode='mse'`` (default) compares the map entries and accepts signed maps (InLine's
    subtractive normalisation gives rows that sum to one but have negative entries).
    ``mode='kl'`` is the Attention-Transfer form KL(teacher row || student row); it needs
    non-negative maps and raises for signed ones.  Record maps with the ``AttentionMaps``
    recorder (it calls the operator's ``attention_map``; O(N^2), for small grids).

    Args:
        loss_weight: Weight of the term (the paper sweeps 3e3..3e5 for map matching).
        mode: ``'mse'`` or ``'kl'``.
        patch_tokens_only: Keep patch rows/columns only (rows are renormalised for ``'kl'``).
        block_reduction: ``'mean'`` or ``'sum'`` over blocks.
        eps: Clamp for logarithms in ``'kl'`` mode.
    """

    def __init__(self, loss_weight: float = 1.0, mode: str = 'mse',
                 patch_tokens_only: bool = False, block_reduction: str = 'mean',
                 eps: float = 1e-8) -> None:
        super().__init__(loss_weight, block_reduction, 'block_reduction')
        if mode not in MAP_MODES:
            raise ValueError(f'Unknown mode {mode!r}; available: {MAP_MODES}')
        self.mode = mode
        self.patch_tokens_only = patch_tokens_only
        self.eps = eps

    def _kl(self, student: torch.Tensor, teacher: torch.Tensor, idx: int) -> torch.Tensor:
        for name, maps in (('student', student), ('teacher', teacher)):
            if (maps < 0).any():
                raise ValueError(f"AttentionMapLoss(mode='kl') block {idx}: the {name} map has "
                                 f"negative entries (a signed map, e.g. InLine); use mode='mse'")
        if self.patch_tokens_only:
            student = student / student.sum(-1, keepdim=True).clamp_min(self.eps)
            teacher = teacher / teacher.sum(-1, keepdim=True).clamp_min(self.eps)
        log_t = teacher.clamp_min(self.eps).log()
        log_s = student.clamp_min(self.eps).log()
        return (teacher * (log_t - log_s)).sum(-1).mean()

    def forward(self,
                student_maps: TensorOrSeq,
                teacher_maps: TensorOrSeq,
                student_token_layout: Sequence[int] = (0, 0),
                teacher_token_layout: Sequence[int] = (0, 0)) -> torch.Tensor:
        """Weighted loss.

        Args:
            student_maps: (B, H, N, N) map, or one per block.
            teacher_maps: Teacher map(s), same blocks.
            student_token_layout: Student ``(prefix, suffix)`` special-token counts.
            teacher_token_layout: Teacher ``(prefix, suffix)`` special-token counts.
        """
        pairs = self.record_pairs(student_maps, teacher_maps, ('student_maps', 'teacher_maps'))
        return self.weighted([
            self.block_loss(idx, s, t, student_token_layout, teacher_token_layout)
            for idx, (s, t) in enumerate(pairs)
        ])

    def block_loss(self, idx: int, student: torch.Tensor, teacher: torch.Tensor,
                   student_token_layout: Sequence[int],
                   teacher_token_layout: Sequence[int]) -> torch.Tensor:
        """Unweighted loss of one block's (B, H, N, N) maps.

        Args:
            idx: Block index, for error messages.
            student: Student map.
            teacher: Teacher map.
            student_token_layout: Student ``(prefix, suffix)`` special-token counts.
            teacher_token_layout: Teacher ``(prefix, suffix)`` special-token counts.
        """
        s, t = student.float(), teacher.detach().float()
        if self.patch_tokens_only:
            s = _patch_block(s, student_token_layout, f'student map {idx}')
            t = _patch_block(t, teacher_token_layout, f'teacher map {idx}')
        check_same_shape(s, t, f'AttentionMapLoss block {idx}')
        if self.mode == 'mse':
            return (s - t).pow(2).mean()
        return self._kl(s, t, idx)
