"""ViT-Linearizer activation matching: token-by-token cosine-similarity maps."""
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from .base import DistillLossBase
from mmlinvit.ops.precision import autocast_disabled
from .token_utils import TensorOrSeq, patch_tokens


def cosine_similarity_map(feats: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Row-l2-normalised token-by-token cosine-similarity map over the kept tokens.

    Args:
        feats: (B, L, C) token features.
        keep: (B, L) bool; columns of dropped tokens are zeroed before the rows are
            normalised, so each row only involves kept tokens.

    Returns:
        (B, L, L) float32 map A with A(i, j) = cos(f_i, f_j) (kept j), rows of unit l2 norm.
        Computed in float32 with autocast switched off, so it is the same under AMP (autocast
        would run the token-by-token matmul in fp16 / bf16).
    """
    with autocast_disabled(feats.device):
        unit = F.normalize(feats.float(), dim=-1)
        sim = unit @ unit.transpose(1, 2)
        sim = sim * keep.unsqueeze(1).to(sim.dtype)
        return F.normalize(sim, dim=-1)


class ActivationMatchingLoss(DistillLossBase):
    """L_act = 1 / (K L) sum_k sum_i [1 - <A_t(i, :), A_s(i, :)>] (ViT-Linearizer).

    For each of the K recorded stage boundaries, the patch tokens of student and teacher are
    turned into cosine-similarity maps A(i, j) = cos(f_i, f_j) with l2-normalised rows; the
    loss is one minus the inner product of matching rows, averaged over the L rows and the K
    stages (and the batch).  Maps do not depend on the width, so student and teacher widths
    may differ; their patch-token counts must agree.

    With ``visible_only=True`` (default, the paper's best setting) and a ``patch_mask``,
    rows and columns of masked tokens are left out: each image's rows and the average use
    its visible tokens only.

    The maps and the loss are computed in float32 with autocast switched off (also under
    ``--amp``): the loss is a small difference of near-one inner products, which fp16 / bf16
    matmuls would swamp with rounding noise.

    Args:
        loss_weight: Weight of the term.
        visible_only: Restrict the maps to visible (unmasked) tokens when a mask is given.
        stage_reduction: ``'mean'`` or ``'sum'`` over stages.
    """

    def __init__(self, loss_weight: float = 1.0, visible_only: bool = True,
                 stage_reduction: str = 'mean') -> None:
        super().__init__(loss_weight, stage_reduction, 'stage_reduction')
        self.visible_only = visible_only

    def forward(self,
                student_feats: TensorOrSeq,
                teacher_feats: TensorOrSeq,
                patch_mask: Optional[torch.Tensor] = None,
                student_token_layout: Sequence[int] = (0, 0),
                teacher_token_layout: Sequence[int] = (0, 0)) -> torch.Tensor:
        """Weighted loss.

        Args:
            student_feats: (B, N_s, C_s) tokens at a stage boundary, or one per stage.
            teacher_feats: (B, N_t, C_t) teacher tokens at the same stages.
            patch_mask: (B, L) bool, True where the student's patch was masked.
            student_token_layout: Student ``(prefix, suffix)`` special-token counts.
            teacher_token_layout: Teacher ``(prefix, suffix)`` special-token counts.
        """
        pairs = self.record_pairs(student_feats, teacher_feats, ('student_feats', 'teacher_feats'))
        return self.weighted([
            self.stage_loss(idx, s, t, patch_mask, student_token_layout, teacher_token_layout)
            for idx, (s, t) in enumerate(pairs)
        ])

    def stage_loss(self, idx: int, student: torch.Tensor, teacher: torch.Tensor,
                   patch_mask: Optional[torch.Tensor], student_token_layout: Sequence[int],
                   teacher_token_layout: Sequence[int]) -> torch.Tensor:
        """Unweighted loss of one stage (mean over the batch of the per-image row average).

        Args:
            idx: Stage index, for error messages.
            student: (B, N_s, C_s) student tokens.
            teacher: (B, N_t, C_t) teacher tokens.
            patch_mask: (B, L) bool mask or None (see :meth:`forward`).
            student_token_layout: Student ``(prefix, suffix)`` special-token counts.
            teacher_token_layout: Teacher ``(prefix, suffix)`` special-token counts.
        """
        s = patch_tokens(student, student_token_layout, f'student stage {idx}')
        t = patch_tokens(teacher.detach(), teacher_token_layout, f'teacher stage {idx}')
        if s.shape[:2] != t.shape[:2]:
            raise ValueError(f'ActivationMatchingLoss stage {idx}: student patch tokens '
                             f'{tuple(s.shape)} and teacher patch tokens {tuple(t.shape)} '
                             f'differ in batch or token count')
        keep = torch.ones(s.shape[:2], dtype=torch.bool, device=s.device)
        if patch_mask is not None and self.visible_only:
            if patch_mask.shape != keep.shape:
                raise ValueError(f'patch_mask has shape {tuple(patch_mask.shape)} but the '
                                 f'records have {tuple(keep.shape)} (batch, patches)')
            keep = ~patch_mask.to(device=s.device, dtype=torch.bool)
        with autocast_disabled(s.device):  # fp32 math under AMP too (see the class doc)
            a_s = cosine_similarity_map(s.float(), keep)
            a_t = cosine_similarity_map(t.float(), keep)
            # = 1 - <a_s, a_t> for unit rows, without its fp32 cancellation near 1 (the value
            # was 30 % to 9x off below ~1e-7); gradients are the same (normalised rows)
            per_row = 0.5 * (a_s - a_t).pow(2).sum(-1)
            weight = keep.float()
            per_image = (per_row * weight).sum(-1) / weight.sum(-1).clamp_min(1.0)
            return per_image.mean()
