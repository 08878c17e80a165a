"""Toy blocks and backbones for the teacher-forcing tests: each block's output and what its
attention branch was given are known by hand."""
from typing import List, Sequence

import torch
import torch.nn as nn


class ToyBlock(nn.Module):
    """``forward`` is ``2 x + 1``; ``forward_attn`` records its arguments and returns
    ``x * weight``."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(()))
        self.calls: List[tuple] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x + 1

    def forward_attn(self, x: torch.Tensor, hw_shape: Sequence[int], num_prefix_tokens: int,
                     with_layer_scale: bool = False) -> torch.Tensor:
        self.calls.append((x.detach().clone(), tuple(hw_shape), num_prefix_tokens,
                           with_layer_scale))
        return x * self.weight


class ToyBackbone(nn.Module):
    """``depth`` toy blocks run in order on (B, N, C) tokens.

    Args:
        depth: Number of blocks.
        patch_size: The ``patch_size`` attribute teacher forcing compares.
        num_prefix_tokens: The ``num_prefix_tokens`` attribute.
        with_cp: The ``with_cp`` attribute.
    """

    def __init__(self, depth: int, patch_size: int = 16, num_prefix_tokens: int = 1,
                 with_cp: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ToyBlock() for _ in range(depth))
        self.patch_size, self.num_prefix_tokens, self.with_cp = (patch_size, num_prefix_tokens,
                                                                 with_cp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return x
