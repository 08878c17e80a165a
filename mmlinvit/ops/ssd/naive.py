"""Sequential reference of the Mamba-2 state-space duality (SSD) scan (tests only).

Written directly from the recurrence, one token at a time, per head ``h`` whose B/C come from
group ``g = h // (H // G)``::

    h_t = exp(A_h dt_t) h_{t-1} + dt_t x_t B_t^T        (state (P, N), h_0 = 0)
    y_t = h_t C_t + D_h x_t

It keeps only the running state, so its memory is O(1) in the sequence length, but it runs
L Python steps: use it as the oracle of :mod:`.chunked`, never in a model.
"""
from typing import Optional

import torch

from .checks import check_ssd_inputs


def ssd_scan_naive(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mamba-2 scan by the token-by-token recurrence, in fp32 (fp64 for fp64 inputs).

    Args:
        x: Inputs (batch, L, H, P).
        dt: Step sizes (batch, L, H), already positive (softplus applied).
        A: Per-head decay rates (H,), negative.
        B: Input projections (batch, L, G, N), ``H % G == 0``; head h reads group
            ``h // (H // G)``.
        C: Output projections (batch, L, G, N).
        D: Optional per-head skip (H,).

    Returns:
        y (batch, L, H, P) in the dtype of ``x``.
    """
    check_ssd_inputs(x, dt, A, B, C, D)
    batch, length, heads, headdim = x.shape
    groups, d_state = B.shape[2], B.shape[3]
    head_to_group = torch.arange(heads, device=x.device) // (heads // groups)
    acc = torch.promote_types(x.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
    x32, dt32, a32 = x.to(acc), dt.to(acc), A.to(acc)
    b32 = B.to(acc)[:, :, head_to_group]  # (batch, L, H, N)
    c32 = C.to(acc)[:, :, head_to_group]
    state = x32.new_zeros(batch, heads, headdim, d_state)
    ys = []
    for t in range(length):
        decay = torch.exp(a32 * dt32[:, t])  # (batch, H)
        inject = (dt32[:, t, :, None, None] * x32[:, t, :, :, None] * b32[:, t, :, None, :])
        state = decay[:, :, None, None] * state + inject
        ys.append(torch.einsum('bhpn,bhn->bhp', state, c32[:, t]))
    y = torch.stack(ys, dim=1) if ys else x32.new_zeros(x32.shape)
    if D is not None:
        y = y + D.to(acc)[None, None, :, None] * x32
    return y.to(x.dtype)
