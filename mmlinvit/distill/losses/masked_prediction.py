"""ViT-Linearizer masked prediction: Smooth L1 on the teacher's features at masked patches."""
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .token_utils import check_same_shape, patch_tokens


class MaskedPredictionLoss(nn.Module):
    """Smooth L1 between student and teacher final patch features where the student was masked.

    The student sees the image with a ratio of its patch tokens replaced by a learnable mask
    token; the teacher sees the full image.  The loss is the Smooth L1 (``beta``) averaged
    over the channels of the masked patches of the batch.  The student features must already
    have the teacher's width (map them through a connector, e.g. ``LinearConnector``).

    Args:
        loss_weight: Weight lambda of the term (1 in ViT-Linearizer).
        beta: Smooth L1 threshold.
    """

    def __init__(self, loss_weight: float = 1.0, beta: float = 1.0) -> None:
        super().__init__()
        self.loss_weight = loss_weight
        self.beta = beta

    def forward(self,
                student_feats: torch.Tensor,
                teacher_feats: torch.Tensor,
                patch_mask: torch.Tensor,
                student_token_layout: Sequence[int] = (0, 0),
                teacher_token_layout: Sequence[int] = (0, 0)) -> torch.Tensor:
        """Weighted loss.

        Args:
            student_feats: (B, N_s, C) student final tokens (projected to the teacher width).
            teacher_feats: (B, N_t, C) teacher final tokens.
            patch_mask: (B, L) bool, True where the student's patch was masked.
            student_token_layout: Student ``(prefix, suffix)`` special-token counts.
            teacher_token_layout: Teacher ``(prefix, suffix)`` special-token counts.
        """
        if patch_mask is None:
            raise ValueError('MaskedPredictionLoss needs a patch_mask; enable patch_masking '
                             'in the DistillationModel and map context.patch_mask')
        s = patch_tokens(student_feats, student_token_layout, 'student_feats')
        t = patch_tokens(teacher_feats, teacher_token_layout, 'teacher_feats').detach()
        check_same_shape(s, t, 'MaskedPredictionLoss',
                         'project the student width with a connector (e.g. LinearConnector)'
                         if s.shape[:2] == t.shape[:2] else None)
        if patch_mask.shape != s.shape[:2]:
            raise ValueError(f'patch_mask has shape {tuple(patch_mask.shape)} but the features '
                             f'have {tuple(s.shape[:2])} (batch, patches)')
        mask = patch_mask.to(device=s.device, dtype=torch.bool)
        if not mask.any():
            return s.float().sum() * 0.0
        loss = F.smooth_l1_loss(s[mask].float(), t[mask].float(), beta=self.beta)
        return self.loss_weight * loss
