"""ViT^3 test-time-training inner updates (Han et al., 2025, arXiv 2512.01643), torch only.

Two inner models are trained by ONE gradient step on the sample's own keys / values and then
applied to its queries.  Both use the dot-product inner loss of ViT^3,

    L(W) = -scale * mean_n ( f_W(k_n) . v_n ),    so   e = dL/df_W(k_n) = -scale * v_n / N,

an error signal that does not depend on the prediction.  ``scale`` is 9 ** -0.5 in ViT^3 (the
"equivalent head dim" 1 x 3 x 3 of the 3x3 depthwise-conv branch, used for both branches).

* Simplified SwiGLU (SwiGLU with identity output layer), per sample and head:
  ``f(x) = (x W1) * silu(x W2)`` with W1, W2 of shape (d, d).  With z1 = k W1, z2 = k W2,
  ``G1 = k^T (e * silu(z2))`` and ``G2 = k^T (e * z1 * silu'(z2))``; each gradient is clipped
  per column, ``G / (||G[:, j]|| + 1)`` (norm over the input dim), and ``W' = W - lr * G``.
* 3x3 depthwise convolution, per sample and channel: ``f(x) = conv(x, w)`` ('same' zero
  padding, cross-correlation as ``F.conv2d``), ``G[c, i, j] = sum_{y, x} k_pad[c, y + i, x + j]
  e[c, y, x]``, clipped per channel by its k x k Frobenius norm, ``w' = w - lr * G``.

Everything is written with differentiable torch ops, so the outer training back-propagates
through the inner step.  Callers pass fp32 tensors (sums over N tokens).
"""
from typing import Tuple

import torch
import torch.nn.functional as F


def clip_columns(grad: torch.Tensor) -> torch.Tensor:
    """``g / (||g||_col + 1)``, the norm taken over dim -2 (each column of a (..., d, m) matrix)."""
    return grad / (grad.norm(dim=-2, keepdim=True) + 1.0)


def clip_kernels(grad: torch.Tensor) -> torch.Tensor:
    """``g / (||g||_F + 1)`` per k x k kernel (norm over the last two dims)."""
    return grad / (grad.flatten(-2).norm(dim=-1)[..., None, None] + 1.0)


def simplified_swiglu(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """``(x W1) * silu(x W2)`` for x (B, H, N, d) and W of shape (H, d, m) or (B, H, d, m)."""
    return torch.matmul(x, w1) * F.silu(torch.matmul(x, w2))


def simplified_swiglu_inner_step(k: torch.Tensor, v: torch.Tensor, w1: torch.Tensor,
                                 w2: torch.Tensor, scale: float,
                                 lr: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """One clipped gradient step of the simplified SwiGLU inner model on (k, v).

    Args:
        k: Keys (B, H, N, d).
        v: Values (B, H, N, d).
        w1: Initial W1, (H, d, d) (or (B, H, d, d)).
        w2: Initial W2, same shape as ``w1``.
        scale: Inner-loss scale (ViT^3: 9 ** -0.5).
        lr: Inner learning rate (ViT^3: 1.0).

    Returns:
        The updated per-sample weights W1', W2', each (B, H, d, d).
    """
    z1 = torch.matmul(k, w1)
    z2 = torch.matmul(k, w2)
    sig = torch.sigmoid(z2)
    e = v * (-scale / k.shape[-2])
    k_t = k.transpose(-2, -1)
    g1 = torch.matmul(k_t, e * (z2 * sig))
    g2 = torch.matmul(k_t, e * z1 * (sig * (1.0 + z2 * (1.0 - sig))))
    return w1 - lr * clip_columns(g1), w2 - lr * clip_columns(g2)


def ttt_simplified_swiglu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w1: torch.Tensor,
                          w2: torch.Tensor, scale: float, lr: float) -> torch.Tensor:
    """ViT^3 SwiGLU branch: train on (k, v) with one clipped step, apply to q, (B, H, N, d)."""
    w1_new, w2_new = simplified_swiglu_inner_step(k, v, w1, w2, scale, lr)
    return simplified_swiglu(q, w1_new, w2_new)


def depthwise_conv_inner_step(k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor,
                              scale: float, lr: float) -> torch.Tensor:
    """One clipped gradient step of the depthwise-conv inner model on (k, v).

    Args:
        k: Keys on the grid, (B, C, h, w).
        v: Values on the grid, (B, C, h, w).
        weight: Initial kernels (C, ks, ks), ks odd.
        scale: Inner-loss scale (ViT^3: 9 ** -0.5).
        lr: Inner learning rate (ViT^3: 1.0).

    Returns:
        Per-sample kernels (B, C, ks, ks).
    """
    _, _, h, w = k.shape
    ks = weight.shape[-1]
    pad = ks // 2
    e = v * (-scale / (h * w))
    k_pad = F.pad(k, (pad, pad, pad, pad))
    taps = [(k_pad[:, :, i:i + h, j:j + w] * e).sum(dim=(-2, -1))
            for i in range(ks) for j in range(ks)]
    grad = torch.stack(taps, dim=-1).unflatten(-1, (ks, ks))
    return weight - lr * clip_kernels(grad)


def per_sample_depthwise_conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """'Same' zero-padded depthwise cross-correlation of (B, C, h, w) with (B, C, ks, ks)."""
    b, c, h, w = x.shape
    ks = weight.shape[-1]
    out = F.conv2d(x.reshape(1, b * c, h, w), weight.reshape(b * c, 1, ks, ks),
                   padding=ks // 2, groups=b * c)
    return out.reshape(b, c, h, w)


def ttt_depthwise_conv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor,
                       scale: float, lr: float) -> torch.Tensor:
    """ViT^3 conv branch: train the kernels on (k, v) with one clipped step, apply to q."""
    return per_sample_depthwise_conv(q, depthwise_conv_inner_step(k, v, weight, scale, lr))
