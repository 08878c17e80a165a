"""Float64 references of the attention operators' projections, shared by the layer tests.

Per-head q / k / v from an operator's fused ``qkv`` projection and its output projection,
written out in float64 (independent of the operators' own ``split_qkv`` / ``project``), plus
seeded inputs and parameters.
"""
from typing import Tuple

import torch


def heads64(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, N, C) -> (B, H, N, d) in float64, head h owning channels [h d, (h + 1) d)."""
    b, n, c = t.shape
    return t.double().reshape(b, n, num_heads, c // num_heads).transpose(1, 2)


def qkv64(op: torch.nn.Module, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """Per-head q, k, v in float64 from the fused projection (rows ordered q, k, v)."""
    y = x.double() @ op.qkv.weight.double().T
    if op.qkv.bias is not None:
        y = y + op.qkv.bias.double()
    q, k, v = y.split(op.embed_dims, dim=-1)
    return heads64(q, op.num_heads), heads64(k, op.num_heads), heads64(v, op.num_heads)


def project64(op: torch.nn.Module, out: torch.Tensor) -> torch.Tensor:
    """(B, H, N, d) float64 -> merged heads -> output projection (with its bias if any)."""
    b, h, n, d = out.shape
    y = out.transpose(1, 2).reshape(b, n, h * d) @ op.proj.weight.double().T
    return y if op.proj.bias is None else y + op.proj.bias.double()


def randomise_(module: torch.nn.Module, std: float = 0.3, seed: int = 0) -> torch.nn.Module:
    """Replaces every parameter by seeded noise (biases included, so they are visible)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(std * torch.randn(p.shape, generator=gen))
    return module


def tokens(shape, seed: int = 1) -> torch.Tensor:
    """Seeded standard-normal float32 tensor."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def assert_close64(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-5) -> None:
    """Compares an fp32 result with its float64 reference."""
    torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=tol)
