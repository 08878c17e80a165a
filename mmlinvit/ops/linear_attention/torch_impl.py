"""O(N) non-causal kernel linear attention in plain PyTorch (the CPU path).

Semantics are those of :func:`.naive.linear_attention_naive`.  Sums are accumulated in fp32
and scaled by 1/N whatever the input dtype, so fp16/bf16 inputs neither overflow nor lose
the normaliser.

Implementation notes (CPU speed): leading dims are flattened into one contiguous batch so
every product is a single ``bmm``; the 1/N is folded into the (d x e) state instead of being
applied to N x e tensors; the normaliser is a mat-vec against ``z = mean(phi(K))`` instead of
an extra column of ones appended to V (which cost a copy of V and a strided output); inputs
that already are fp32 are not copied.  Few, large ops also matter on busy machines, where
every multi-threaded op pays a synchronisation cost.
"""
from typing import Tuple

import torch


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Tuple[int, ...]:
    """Validates (..., N, d), (..., M, d), (..., M, e) and returns the leading shape."""
    if q.dim() < 3 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError('linear attention expects q (..., N, d), k (..., M, d), v (..., M, e) '
                         f'with equal rank >= 3; got {tuple(q.shape)}, {tuple(k.shape)}, '
                         f'{tuple(v.shape)}')
    lead = tuple(q.shape[:-2])
    if tuple(k.shape[:-2]) != lead or tuple(v.shape[:-2]) != lead:
        raise ValueError('q, k and v must share their leading (batch, head) dims; got '
                         f'{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}')
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f'q and k need the same feature dim; got {q.shape[-1]} and '
                         f'{k.shape[-1]}')
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f'k and v need the same token count; got {k.shape[-2]} and '
                         f'{v.shape[-2]}')
    if k.shape[-2] == 0:
        raise ValueError('linear attention needs at least one key token (M >= 1)')
    return lead


def _as_fp32_batch(x: torch.Tensor) -> torch.Tensor:
    """(..., T, c) -> contiguous fp32 (batch, T, c); no copy when already so."""
    return x.float().reshape(-1, x.shape[-2], x.shape[-1])


def _kv_state(k32: torch.Tensor, v32: torch.Tensor) -> torch.Tensor:
    """S = K^T V / M as a (batch, d, e) fp32 tensor, 1/M folded into the product."""
    m = k32.shape[-2]
    state = torch.empty(k32.shape[0], k32.shape[-1], v32.shape[-1], dtype=torch.float32,
                        device=k32.device)
    return torch.baddbmm(state, k32.transpose(1, 2), v32, beta=0.0, alpha=1.0 / m)


def linear_attention_torch(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                           eps: float = 1e-6) -> torch.Tensor:
    """phi(Q) S / (phi(Q) z + eps) with S = phi(K)^T V / N and z = mean(phi(K)).

    Args:
        phi_q: Feature-mapped queries, (B, H, N, d) (any equal leading dims).
        phi_k: Feature-mapped keys, (B, H, M, d).
        v: Values, (B, H, M, e).
        eps: Normaliser epsilon; keeps the division finite when phi(q).z == 0.

    Returns:
        (B, H, N, e) in the dtype of ``v``.
    """
    lead = _check_qkv(phi_q, phi_k, v)
    out_dtype = v.dtype
    n, e = phi_q.shape[-2], v.shape[-1]
    q32, k32, v32 = _as_fp32_batch(phi_q), _as_fp32_batch(phi_k), _as_fp32_batch(v)
    state = _kv_state(k32, v32)  # (BH, d, e)
    k_mean = k32.mean(dim=1).unsqueeze(-1)  # (BH, d, 1)
    eps_column = torch.full((1, 1, 1), eps, dtype=torch.float32, device=q32.device)
    den = torch.baddbmm(eps_column, q32, k_mean)  # (BH, N, 1) = phi(q).z + eps, one op
    num = torch.bmm(q32, state)  # (BH, N, e)
    if torch.is_grad_enabled() and (num.requires_grad or den.requires_grad):
        out = num / den
    else:
        out = num.div_(den)
    return out.reshape(lead + (n, e)).to(out_dtype)


def inline_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """InLine attention out_i = s q_i (K^T V / M) + (1 - s q_i.kbar) vbar, fp32 accumulation.

    Args:
        q: Queries (B, H, N, d) (identity feature map).
        k: Keys (B, H, M, d).
        v: Values (B, H, M, e).
        scale: s, usually d ** -0.5.

    Returns:
        (B, H, N, e) in the dtype of ``v``.
    """
    lead = _check_qkv(q, k, v)
    out_dtype = v.dtype
    n, e = q.shape[-2], v.shape[-1]
    q32, k32, v32 = _as_fp32_batch(q), _as_fp32_batch(k), _as_fp32_batch(v)
    state = _kv_state(k32, v32)  # (BH, d, e)
    k_mean = k32.mean(dim=1).unsqueeze(-1)  # (BH, d, 1)
    v_mean = v32.mean(dim=1, keepdim=True)  # (BH, 1, e)
    # (1 - s q.kbar) as a (BH, N, 1) column, then out = s q S + col * vbar.
    weight = torch.baddbmm(torch.ones_like(k_mean[:, :1, :1]), q32, k_mean, alpha=-scale)
    out = torch.baddbmm(weight * v_mean, q32, state, alpha=scale)
    return out.reshape(lead + (n, e)).to(out_dtype)
