"""Softmax attention (the teacher operator) via ``scaled_dot_product_attention``."""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .base import ATTENTION_OPERATORS, AttentionOperator


@ATTENTION_OPERATORS.register_module('softmax')
class SoftmaxAttention(AttentionOperator):
    """Standard multi-head softmax attention, O(N^2) compute.

    Uses PyTorch SDPA (FlashAttention / memory-efficient kernels where available).
    ``attn_drop`` drops attention probabilities in training (SDPA's ``dropout_p``), as timm's
    and mmpretrain's ViT attention do, not the attention output as the linear operators (which
    have no probabilities) do.
    """

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            hw_shape: Optional[Tuple[int, int]], num_prefix_tokens: int) -> torch.Tensor:
        dropout = self.attn_drop.p if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)

    def project(self, out: torch.Tensor) -> torch.Tensor:
        """Head merge and output projection (``attn_drop`` acted on the probabilities)."""
        return self.proj_drop(self.proj(self.merge_heads(out)))

    def map_from_qk(self, q: torch.Tensor, k: torch.Tensor, hw_shape: Optional[Tuple[int, int]],
                    num_prefix_tokens: int) -> torch.Tensor:
        return ((q.float() * self.scale) @ k.float().transpose(-2, -1)).softmax(-1)
