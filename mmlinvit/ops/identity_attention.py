"""Linear attention with the identity feature map and a sign-safe normaliser (torch only).

    out_i = q_i S / safe(q_i . kbar),  S = K^T V / N,  kbar = mean_j k_j

where ``safe`` is :func:`~mmlinvit.ops.signed_normaliser.signed_safe_denominator`.  The implied
map ``A_ij = q_i.k_j / (N safe(q_i.kbar))`` is signed and unbounded where ``q_i.kbar`` ~ 0.
"""
import torch

from .precision import autocast_disabled
from .signed_normaliser import signed_safe_denominator


def identity_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              eps: float) -> torch.Tensor:
    """O(N) identity-map linear attention, fp32 accumulation.

    Args:
        q: Queries (B, H, N, d).
        k: Keys (B, H, M, d).
        v: Values (B, H, M, e).
        eps: Minimum magnitude of the normaliser.

    Returns:
        (B, H, N, e) in the dtype of ``v``.
    """
    with autocast_disabled(q.device):  # fp32 math under AMP too (fp16 sums overflow)
        q32, k32, v32 = q.float(), k.float(), v.float()
        kv = torch.matmul(k32.transpose(-2, -1), v32).div_(k32.shape[-2])  # (B, H, d, e)
        den = torch.matmul(q32, k32.mean(dim=-2).unsqueeze(-1))  # (B, H, N, 1)
        out = torch.matmul(q32, kv) / signed_safe_denominator(den, eps)
    return out.to(v.dtype)


def identity_linear_attention_map(q: torch.Tensor, k: torch.Tensor, eps: float) -> torch.Tensor:
    """The explicit (B, H, N, M) map of :func:`identity_linear_attention` in fp32 (O(N^2)).

    Args:
        q: Queries (B, H, N, d).
        k: Keys (B, H, M, d).
        eps: Minimum magnitude of the normaliser.
    """
    with autocast_disabled(q.device):  # fp32 under AMP too
        scores = q.float() @ k.float().transpose(-2, -1)
        n = scores.shape[-1]
        den = scores.sum(-1, keepdim=True) / n
        return scores / (n * signed_safe_denominator(den, eps))
