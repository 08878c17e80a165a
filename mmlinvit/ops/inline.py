"""InLine attention's explicit O(N^2) map (torch only; analysis and tests).

    A_ij = (s / M) q_i.k_j + (1 / M) (1 - s q_i.kbar),   kbar = mean_j k_j

Rows sum to exactly 1; entries may be negative.  The O(N) path is
:func:`mmlinvit.ops.linear_attention.inline_attention`.
"""
import torch

from .precision import autocast_disabled


def inline_attention_map(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """The signed InLine map (B, H, N, M) in fp32.

    Args:
        q: Queries (B, H, N, d).
        k: Keys (B, H, M, d).
        scale: s, usually d ** -0.5.
    """
    with autocast_disabled(q.device):  # fp32 under AMP too
        q32, k32 = q.float(), k.float()
        n = k32.shape[-2]
        bilinear = scale * (q32 @ k32.transpose(-2, -1))  # (B, H, N, M)
        return (bilinear - bilinear.mean(dim=-1, keepdim=True) + 1.0) / n
