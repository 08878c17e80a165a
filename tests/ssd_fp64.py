"""The Mamba-2 SSD recurrence in float64, token by token (test oracle shared by the
Adventurer / SSD tests)."""
from typing import Optional

import torch


def reference_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``ssd_minimal.py``'s recurrence as a per-token, per-head loop in float64.

    Head h reads B / C group ``h // (H // G)``; the state starts at zero.
    """
    x, dt, A, B, C = (t.double() for t in (x, dt, A, B, C))
    batch, length, heads, headdim = x.shape
    groups, d_state = B.shape[2], B.shape[3]
    per_group = heads // groups
    y = torch.zeros(batch, length, heads, headdim, dtype=torch.float64)
    for h in range(heads):
        g = h // per_group
        state = torch.zeros(batch, headdim, d_state, dtype=torch.float64)
        for t in range(length):
            decay = torch.exp(dt[:, t, h] * A[h])[:, None, None]
            state = decay * state + dt[:, t, h, None, None] * x[:, t, h, :, None] * \
                B[:, t, g, None, :]
            y[:, t, h] = (state * C[:, t, g, None, :]).sum(-1)
            if D is not None:
                y[:, t, h] += D[h].double() * x[:, t, h]
    return y
