"""Input checks shared by every implementation of the SSD scan (naive, torch, Triton)."""
from typing import Optional

import torch

from ..triton_utils import kernel_limits_reason


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


def check_chunk_size(chunk_size: int) -> None:
    """Raises a ValueError unless ``chunk_size`` is a positive int."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f'chunk_size must be a positive int, got {chunk_size!r}')


def kernel_unsupported_reason(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                              B: torch.Tensor, C: torch.Tensor,
                              D: Optional[torch.Tensor]) -> Optional[str]:
    """Why the Triton kernels cannot take these inputs, or None when they can.

    The dispatcher falls back to torch for this reason (``auto``) or raises it (a forced
    ``'triton'``); the kernel module raises it for direct calls.
    """
    if x.ndim != 4 or B.ndim != 4:
        return 'x / B are not 4-D'
    if x.shape[0] == 0 or x.shape[1] == 0:
        return 'empty batch or sequence'
    named = [('x', x), ('dt', dt), ('A', A), ('B', B), ('C', C)]
    if D is not None:
        named.append(('D', D))
    return kernel_limits_reason({'P': x.shape[-1], 'N': B.shape[-1]}, named)
