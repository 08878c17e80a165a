"""Entry points of non-causal linear attention that pick the implementation.

Callers (the attention operators) pass raw per-head q, k, v; the feature map is applied
here (fused into the kernel on the Triton path).
"""
import torch

from ..feature_maps import get_feature_map
from .torch_impl import linear_attention_torch


def linear_attention(q: torch.Tensor,
                     k: torch.Tensor,
                     v: torch.Tensor,
                     feature_map: str = 'elu',
                     eps: float = 1e-6) -> torch.Tensor:
    """phi(Q) S / (phi(Q) z + eps), S = phi(K)^T V / N, z = mean(phi(K)), fp32 accumulation.

    Args:
        q: Queries (B, H, N, d), before the feature map.
        k: Keys (B, H, M, d), before the feature map.
        v: Values (B, H, M, e).
        feature_map: ``'elu'``, ``'relu'`` or ``'identity'``.
        eps: Normaliser epsilon.

    Returns:
        (B, H, N, e) in the dtype of ``v``.
    """
    phi = get_feature_map(feature_map)
    return linear_attention_torch(phi(q.float()), phi(k.float()), v, eps)


def inline_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """InLine attention: A_ij = (s/M) q_i.k_j + (1/M)(1 - s q_i.kbar); rows sum to 1.

    out_i = s q_i (K^T V / M) + (1 - s q_i.kbar) vbar, accumulated in fp32.

    Args:
        q: Queries (B, H, N, d) (identity feature map).
        k: Keys (B, H, M, d).
        v: Values (B, H, M, e).
        scale: s, usually d ** -0.5.

    Returns:
        (B, H, N, e) in the dtype of ``v``.
    """
    q32, k32, v32 = q.float(), k.float(), v.float()
    m = k32.shape[-2]
    kv = torch.matmul(k32.transpose(-2, -1), v32).div_(m)
    k_mean = k32.mean(dim=-2, keepdim=True)  # (B, H, 1, d)
    v_mean = v32.mean(dim=-2, keepdim=True)  # (B, H, 1, e)
    out = scale * torch.matmul(q32, kv)
    out = out + (1.0 - scale * (q32 * k_mean).sum(-1, keepdim=True)) * v_mean
    return out.to(v.dtype)
