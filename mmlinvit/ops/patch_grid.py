"""Patch-grid maths shared by the spatial attention operators (InLine, MHLA, TTT; torch only).

Operators see per-head tensors (B, H, N, d) whose first ``num_prefix_tokens`` rows are class /
register tokens and whose remaining ``h * w`` rows are patch tokens in raster order.  These
helpers move the patch part to and from the (B, H * d, h, w) image layout (channel ``c = head * d
+ i``, the order :meth:`AttentionOperator.merge_heads` produces), and provide a depthwise
convolution with static or per-sample kernels plus an explicit shift-and-add reference of it.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F


def check_patch_grid(op_name: str, num_tokens: int, hw_shape: Optional[Tuple[int, int]],
                     num_prefix_tokens: int) -> Tuple[int, int]:
    """Validates that ``num_tokens == num_prefix_tokens + h * w`` and returns ``(h, w)``.

    Args:
        op_name: Operator name used in the error message.
        num_tokens: Sequence length N.
        hw_shape: The (h, w) patch grid, or ``None``.
        num_prefix_tokens: Number of class / register tokens at the front.

    Raises:
        ValueError: If the grid is missing, has a negative side or does not match the token
            count.
    """
    if hw_shape is None:
        raise ValueError(f'The {op_name!r} attention operator needs the patch grid: call it '
                         f'with hw_shape=(h, w) (VisionTransformer passes it automatically)')
    h, w = int(hw_shape[0]), int(hw_shape[1])
    if h < 0 or w < 0:
        raise ValueError(f'The {op_name!r} attention operator got hw_shape={tuple(hw_shape)}; '
                         'the sides of the patch grid must be >= 0')
    if num_prefix_tokens < 0 or h * w + num_prefix_tokens != num_tokens:
        raise ValueError(f'The {op_name!r} attention operator got {num_tokens} tokens but '
                         f'hw_shape={tuple(hw_shape)} and num_prefix_tokens={num_prefix_tokens} '
                         f'imply {h * w + num_prefix_tokens}; pass the grid of these tokens')
    return h, w


def heads_to_grid(t: torch.Tensor, hw_shape: Tuple[int, int],
                  num_prefix_tokens: int) -> torch.Tensor:
    """Patch tokens of a per-head tensor as an image.

    Args:
        t: (B, H, N, d) per-head tokens, prefix tokens first.
        hw_shape: (h, w) patch grid.
        num_prefix_tokens: Number of prefix tokens to drop.

    Returns:
        (B, H * d, h, w) with channel ``head * d + i``.
    """
    b, nh, _, d = t.shape
    patches = t[:, :, num_prefix_tokens:]  # (B, H, h*w, d)
    return patches.permute(0, 1, 3, 2).reshape(b, nh * d, hw_shape[0], hw_shape[1])


def grid_to_heads(grid: torch.Tensor, num_heads: int, num_prefix_tokens: int) -> torch.Tensor:
    """Inverse of :func:`heads_to_grid`; prefix rows are filled with zeros.

    Args:
        grid: (B, H * d, h, w) image.
        num_heads: Number of heads H.
        num_prefix_tokens: Number of zero rows to prepend (prefix tokens get no local term).

    Returns:
        (B, H, num_prefix_tokens + h * w, d).
    """
    b, c, h, w = grid.shape
    t = grid.reshape(b, num_heads, c // num_heads, h * w).permute(0, 1, 3, 2)
    if num_prefix_tokens:
        t = F.pad(t, (0, 0, num_prefix_tokens, 0))
    return t


def depthwise_conv2d(x: torch.Tensor,
                     weight: torch.Tensor,
                     bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Zero-padded 'same' depthwise cross-correlation with static or per-sample kernels.

    Args:
        x: (B, C, h, w) input.
        weight: (C, k, k) static kernels or (B, C, k, k) per-sample kernels, k odd.
        bias: Optional (C,) bias.

    Returns:
        (B, C, h, w).
    """
    b, c, h, w = x.shape
    k = weight.shape[-1]
    pad = k // 2
    if weight.dim() == 3:
        return F.conv2d(x, weight.unsqueeze(1), bias, padding=pad, groups=c)
    out = F.conv2d(x.reshape(1, b * c, h, w), weight.reshape(b * c, 1, k, k), None,
                   padding=pad, groups=b * c).reshape(b, c, h, w)
    if bias is not None:
        out = out + bias.view(1, c, 1, 1)
    return out


def depthwise_conv2d_reference(x: torch.Tensor,
                               weight: torch.Tensor,
                               bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Explicit shift-and-add version of :func:`depthwise_conv2d` (tests and references only).

    ``out[c, y, x] = sum_{i, j} weight[c, i, j] * x_pad[c, y + i, x + j] + bias[c]``.
    """
    b, c, h, w = x.shape
    k = weight.shape[-1]
    pad = k // 2
    x_pad = F.pad(x, (pad, pad, pad, pad))
    kernel = weight if weight.dim() == 4 else weight.unsqueeze(0)
    out = torch.zeros_like(x)
    for i in range(k):
        for j in range(k):
            out = out + kernel[:, :, i, j, None, None] * x_pad[:, :, i:i + h, j:j + w]
    if bias is not None:
        out = out + bias.view(1, c, 1, 1)
    return out
