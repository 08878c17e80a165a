"""Non-overlapping patch embedding (``patch_embed.proj`` as in timm / DINOv2)."""
from typing import Tuple

import torch
import torch.nn as nn


class PatchEmbed(nn.Module):
    """Conv patchify: (B, C_in, H, W) -> (B, h * w, C), (h, w) = (H // p, W // p).

    Args:
        in_channels: Input channels.
        embed_dims: Token width.
        patch_size: Patch side p.
        bias: Whether the projection has a bias (OpenAI CLIP has none).
    """

    def __init__(self, in_channels: int = 3, embed_dims: int = 768, patch_size: int = 16,
                 bias: bool = True) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, embed_dims, kernel_size=patch_size,
                              stride=patch_size, bias=bias)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        x = self.proj(x)
        hw_shape = (x.shape[-2], x.shape[-1])
        return x.flatten(2).transpose(1, 2), hw_shape
