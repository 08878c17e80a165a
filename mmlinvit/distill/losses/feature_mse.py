"""Final-feature MSE (ViT-AdaLA Stage 2: the whole student matches the teacher's features)."""
from typing import Sequence

import torch

from .token_mse import TokenMSEBase
from .token_utils import TensorOrSeq


class FeatureMSELoss(TokenMSEBase):
    """MSE between student and teacher features (e.g. the final normalised tokens).

    Args:
        loss_weight: Weight of the term.
        patch_tokens_only: Compare patch tokens only (see ``AttentionOutputMSELoss``).
        reduction: ``'mean'`` or ``'sum'`` over the records when several are given.
    """

    def __init__(self, loss_weight: float = 1.0, patch_tokens_only: bool = False,
                 reduction: str = 'mean') -> None:
        super().__init__(loss_weight, patch_tokens_only, reduction, 'reduction')

    def forward(self,
                student_feats: TensorOrSeq,
                teacher_feats: TensorOrSeq,
                student_token_layout: Sequence[int] = (0, 0),
                teacher_token_layout: Sequence[int] = (0, 0)) -> torch.Tensor:
        """Weighted loss.

        Args:
            student_feats: Student feature tensor(s).
            teacher_feats: Teacher feature tensor(s) of the same shape.
            student_token_layout: Student ``(prefix, suffix)`` special-token counts.
            teacher_token_layout: Teacher ``(prefix, suffix)`` special-token counts.
        """
        return self.records_loss(student_feats, teacher_feats, student_token_layout,
                                 teacher_token_layout)
