"""Per-block attention-output MSE (copy-the-MLP / distill-the-attention; ViT-AdaLA Stage 1)."""
from typing import Sequence

import torch

from .token_mse import TokenMSEBase
from .token_utils import TensorOrSeq


class AttentionOutputMSELoss(TokenMSEBase):
    """MSE between the student's and the teacher's attention outputs, block by block.

    The records are the outputs of ``blocks[i].attn`` (post-projection, pre-layer-scale,
    pre-residual).  The per-block MSE (mean over batch, tokens and channels) is averaged
    (``block_reduction='mean'``) or summed over the recorded blocks, then multiplied by
    ``loss_weight`` (the paper's lambda: 50 for seed 000).

    Args:
        loss_weight: Weight lambda of the term.
        patch_tokens_only: Compare patch tokens only (MHLA / TTT students have no class
            token while the softmax teacher has one); the token layouts tell how many special
            tokens each side carries.
        block_reduction: ``'mean'`` or ``'sum'`` over blocks.
    """

    def __init__(self, loss_weight: float = 1.0, patch_tokens_only: bool = False,
                 block_reduction: str = 'mean') -> None:
        super().__init__(loss_weight, patch_tokens_only, block_reduction, 'block_reduction')

    def forward(self,
                student_outputs: TensorOrSeq,
                teacher_outputs: TensorOrSeq,
                student_token_layout: Sequence[int] = (0, 0),
                teacher_token_layout: Sequence[int] = (0, 0)) -> torch.Tensor:
        """Weighted loss.

        Args:
            student_outputs: (B, N_s, C) attention output, or one per block.
            teacher_outputs: (B, N_t, C) teacher attention output(s), same blocks.
            student_token_layout: Student ``(prefix, suffix)`` special-token counts.
            teacher_token_layout: Teacher ``(prefix, suffix)`` special-token counts.
        """
        return self.records_loss(student_outputs, teacher_outputs, student_token_layout,
                                 teacher_token_layout)
