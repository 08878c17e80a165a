"""Attention-map matching (the map-level alternative to attention-output matching)."""
from typing import Sequence

import torch
import torch.nn as nn

from .token_utils import (TensorOrSeq, as_tensor_list, check_layout, check_same_length,
                          check_same_shape, reduce_over_records)

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


class AttentionMapLoss(nn.Module):
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
        super().__init__()
        if mode not in MAP_MODES:
            raise ValueError(f'Unknown mode {mode!r}; available: {MAP_MODES}')
        self.loss_weight = loss_weight
        self.mode = mode
        self.patch_tokens_only = patch_tokens_only
        self.block_reduction = block_reduction
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
        s_list = as_tensor_list(student_maps, 'student_maps')
        t_list = as_tensor_list(teacher_maps, 'teacher_maps')
        check_same_length(s_list, t_list, 'AttentionMapLoss')
        values = []
        for idx, (s, t) in enumerate(zip(s_list, t_list)):
            s, t = s.float(), t.detach().float()
            if self.patch_tokens_only:
                s = _patch_block(s, student_token_layout, f'student map {idx}')
                t = _patch_block(t, teacher_token_layout, f'teacher map {idx}')
            check_same_shape(s, t, f'AttentionMapLoss block {idx}')
            if self.mode == 'mse':
                values.append((s - t).pow(2).mean())
            else:
                values.append(self._kl(s, t, idx))
        return self.loss_weight * reduce_over_records(values, self.block_reduction)
