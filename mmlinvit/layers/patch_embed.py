"""Non-overlapping patch embedding (``patch_embed.proj`` as in timm / DINOv2).

Inputs whose height or width is not a multiple of the patch size are zero-padded at the
bottom / right before the projection, as mmseg's ``PatchEmbed`` does for its ViT
(``AdaptivePadding(padding='corner')``) and timm's ``PatchEmbed(dynamic_img_pad=True)``: every
pixel reaches a token, and the patch grid is ``(ceil(H / p), ceil(W / p))`` with its top-left
patch at the image's top-left corner.  (A plain strided convolution would drop the last
``H % p`` rows and ``W % p`` columns without a word.)  Inputs that divide are unchanged.
"""
from typing import Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


def patch_grid(hw: Sequence[int], patch_size: int) -> Tuple[int, int]:
    """The (h, w) token grid of an (H, W) input: ``(ceil(H / p), ceil(W / p))``.

    Args:
        hw: Input height and width in pixels.
        patch_size: Patch side p.

    Returns:
        The grid of the corner-padded input.
    """
    return (-(-int(hw[0]) // patch_size), -(-int(hw[1]) // patch_size))


def corner_pad(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Zero-pads (B, C, H, W) at the bottom / right to multiples of ``patch_size``.

    Args:
        x: Images (normalised, so zero is the mean colour).
        patch_size: Patch side p.

    Returns:
        ``x`` itself when H and W divide by p, else the padded tensor.
    """
    pad_h = -x.shape[-2] % patch_size
    pad_w = -x.shape[-1] % patch_size
    if pad_h == 0 and pad_w == 0:
        return x
    return F.pad(x, (0, pad_w, 0, pad_h))


class PatchEmbed(nn.Module):
    """Conv patchify: (B, C_in, H, W) -> (B, h * w, C), (h, w) = (ceil(H / p), ceil(W / p)).

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
        x = self.proj(corner_pad(x, self.patch_size))
        hw_shape = (x.shape[-2], x.shape[-1])
        return x.flatten(2).transpose(1, 2), hw_shape
