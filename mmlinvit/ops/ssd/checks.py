"""Shape validation shared by every implementation of the SSD scan."""
from typing import Optional

import torch


def check_ssd_inputs(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                     C: torch.Tensor, D: Optional[torch.Tensor] = None) -> None:
    """Raises a ``ValueError`` naming the offending argument when shapes disagree.

    Args:
        x: (batch, L, H, P).
        dt: (batch, L, H).
        A: (H,).
        B: (batch, L, G, N) with ``H % G == 0``.
        C: (batch, L, G, N).
        D: Optional (H,).
    """
    if x.ndim != 4:
        raise ValueError(f'x must be (batch, L, heads, headdim), got shape {tuple(x.shape)}')
    batch, length, heads, _ = x.shape
    if tuple(dt.shape) != (batch, length, heads):
        raise ValueError(f'dt must be (batch, L, heads) = {(batch, length, heads)}, got '
                         f'{tuple(dt.shape)}')
    if tuple(A.shape) != (heads, ):
        raise ValueError(f'A must be (heads,) = ({heads},), got {tuple(A.shape)}')
    if B.ndim != 4 or tuple(B.shape[:2]) != (batch, length):
        raise ValueError(f'B must be (batch, L, groups, d_state) with batch={batch}, L={length}, '
                         f'got {tuple(B.shape)}')
    if tuple(C.shape) != tuple(B.shape):
        raise ValueError(f'C must have the shape of B {tuple(B.shape)}, got {tuple(C.shape)}')
    groups = B.shape[2]
    if groups < 1 or heads % groups != 0:
        raise ValueError(f'heads ({heads}) must be a multiple of the number of B/C groups '
                         f'({groups})')
    if D is not None and tuple(D.shape) != (heads, ):
        raise ValueError(f'D must be (heads,) = ({heads},), got {tuple(D.shape)}')
