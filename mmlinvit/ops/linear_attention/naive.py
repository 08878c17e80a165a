"""O(N^2) references for non-causal kernel linear attention (tests only).

Both build the full N x N attention map explicitly.  They define the semantics the O(N)
implementations (:mod:`.torch_impl`, :mod:`.fused`) must reproduce:

    A_ij = phi(q_i).phi(k_j) / (sum_l phi(q_i).phi(k_l) + N * eps)
    out_i = sum_j A_ij v_j

which is ``phi(q_i) S / (phi(q_i) z + eps)`` with the 1/N-scaled sums
``S = phi(K)^T V / N`` and ``z = mean_j phi(k_j)``.
"""
import torch


def linear_attention_map_naive(phi_q: torch.Tensor, phi_k: torch.Tensor,
                               eps: float = 1e-6) -> torch.Tensor:
    """Implied attention map of kernel linear attention.

    Args:
        phi_q: Feature-mapped queries, (B, H, N, d).
        phi_k: Feature-mapped keys, (B, H, M, d).
        eps: Normaliser epsilon (applied to the 1/M-scaled denominator).

    Returns:
        The (B, H, N, M) map in fp32; rows sum to ~1 for positive feature maps.
    """
    q, k = phi_q.float(), phi_k.float()
    scores = q @ k.transpose(-2, -1)
    return scores / (scores.sum(-1, keepdim=True) + k.shape[-2] * eps)


def linear_attention_naive(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                           eps: float = 1e-6) -> torch.Tensor:
    """Kernel linear attention through the explicit map (O(N^2) memory).

    Args:
        phi_q: Feature-mapped queries, (B, H, N, d).
        phi_k: Feature-mapped keys, (B, H, M, d).
        v: Values, (B, H, M, e).
        eps: Normaliser epsilon.

    Returns:
        (B, H, N, e) in the dtype of ``v``.
    """
    attn = linear_attention_map_naive(phi_q, phi_k, eps)
    return (attn @ v.float()).to(v.dtype)
