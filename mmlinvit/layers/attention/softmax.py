"""Softmax attention (the teacher operator) via ``scaled_dot_product_attention``."""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .base import ATTENTION_OPERATORS, AttentionOperator


@ATTENTION_OPERATORS.register_module('softmax')
class SoftmaxAttention(AttentionOperator):
    """Standard multi-head softmax attention, O(N^2) compute.

    Uses PyTorch SDPA (FlashAttention / memory-efficient kernels where available).
    """

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            hw_shape: Optional[Tuple[int, int]], num_prefix_tokens: int) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)

    def map_from_qk(self, q: torch.Tensor, k: torch.Tensor, hw_shape: Optional[Tuple[int, int]],
                    num_prefix_tokens: int) -> torch.Tensor:
        return ((q.float() * self.scale) @ k.float().transpose(-2, -1)).softmax(-1)
