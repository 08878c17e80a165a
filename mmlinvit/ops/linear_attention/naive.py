"""O(N^2) references for non-causal kernel linear attention (tests only).

Both build the full N x M attention map explicitly (N queries, M keys; M = N in
self-attention).  They define the semantics the O(N) implementations (:mod:`.torch_impl`,
:mod:`.triton_kernel`) must reproduce, with the same arguments (raw q, k, v and the feature
map's name):

    A_ij = phi(q_i).phi(k_j) / (sum_l phi(q_i).phi(k_l) + M * eps)
    out_i = sum_j A_ij v_j

which is ``phi(q_i) S / (phi(q_i) z + eps)`` with the 1/M-scaled sums
``S = phi(K)^T V / M`` and ``z = mean_j phi(k_j)``.
"""
import torch

from ..feature_maps import get_feature_map
from ..precision import autocast_disabled


def linear_attention_map_naive(q: torch.Tensor, k: torch.Tensor, feature_map: str = 'elu',
                               eps: float = 1e-6) -> torch.Tensor:
    """Implied attention map of kernel linear attention.

    Args:
        q: Queries, (B, H, N, d), before the feature map.
        k: Keys, (B, H, M, d), before the feature map.
        feature_map: ``'elu'``, ``'relu'`` or ``'identity'`` (already feature-mapped inputs).
        eps: Normaliser epsilon (applied to the 1/M-scaled denominator).

    Returns:
        The (B, H, N, M) map in fp32; rows sum to ~1 for positive feature maps.
    """
    phi = get_feature_map(feature_map)
    with autocast_disabled(q.device):  # fp32 under AMP too (fp16 row sums overflow at N ~ 1k)
        phi_q, phi_k = phi(q.float()), phi(k.float())
        scores = phi_q @ phi_k.transpose(-2, -1)
        return scores / (scores.sum(-1, keepdim=True) + phi_k.shape[-2] * eps)


def linear_attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           feature_map: str = 'elu', eps: float = 1e-6) -> torch.Tensor:
    """Kernel linear attention through the explicit map (O(N^2) memory).

    Args:
        q: Queries, (B, H, N, d), before the feature map.
        k: Keys, (B, H, M, d), before the feature map.
        v: Values, (B, H, M, e).
        feature_map: ``'elu'``, ``'relu'`` or ``'identity'`` (already feature-mapped inputs).
        eps: Normaliser epsilon.

    Returns:
        (B, H, N, e) in the dtype of ``v``.
    """
    attn = linear_attention_map_naive(q, k, feature_map, eps)
    return (attn @ v.float()).to(v.dtype)
