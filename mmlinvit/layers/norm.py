"""RMS normalisation layers: plain ``RMSNorm`` and the gated, grouped variant of Mamba-2."""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmlinvit.ops.graph_capture import capturing_graph


#: Rows (tokens) normalised at once by the in-place path on the CPU (bounds its x^2
#: temporary).  On accelerators all rows go at once: there a launch costs more than the
#: temporary (H200 profile of Adventurer-B at 1024x2048: 421 launches of each of the three
#: per-chunk ops, 4.6 of the forward's 20.6 ms).  Rows are independent, so the values do not
#: depend on the chunking.
IN_PLACE_ROWS = 256


def _rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, computed in fp32 (at least)."""
    x32 = x.to(torch.promote_types(x.dtype, torch.float32))
    return x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight (no mean subtraction, no bias).

    Statistics are computed in fp32; the output has the dtype of the input.

    Args:
        dims: Normalised (last) dimension.
        eps: Added to the mean square.
    """

    def __init__(self, dims: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dims = dims
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dims))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (_rms_normalize(x, self.eps) * self.weight).to(x.dtype)

    def extra_repr(self) -> str:
        return f'{self.dims}, eps={self.eps}'


class GatedRMSNorm(RMSNorm):
    """RMSNorm with a SiLU gate, normalised in groups of channels (Mamba-2 output norm).

    With ``norm_before_gate=False`` (the Mamba-2 default) it computes
    ``rmsnorm(x * silu(z)) * weight``; with ``True``, ``rmsnorm(x) * weight * silu(z)``.
    Each contiguous group of ``group_size`` channels is normalised separately (Mamba-2 uses
    ``d_inner // ngroups``, one group per B/C group).

    Args:
        dims: Normalised (last) dimension.
        eps: Added to the mean square.
        group_size: Channels per normalisation group; ``None`` means ``dims`` (one group).
        norm_before_gate: Whether the gate multiplies after the normalisation.
    """

    def __init__(self,
                 dims: int,
                 eps: float = 1e-5,
                 group_size: Optional[int] = None,
                 norm_before_gate: bool = False) -> None:
        group_size = dims if group_size is None else group_size
        if group_size < 1 or dims % group_size != 0:
            raise ValueError(f'GatedRMSNorm: dims ({dims}) must be a multiple of group_size '
                             f'({group_size})')
        super().__init__(dims, eps)
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate

    def forward(self,
                x: torch.Tensor,
                z: Optional[torch.Tensor] = None,
                consume: bool = False) -> torch.Tensor:
        """Normalises ``x`` (..., dims), gated by ``z`` (same shape) when given.

        Args:
            x: Input (..., dims).
            z: Optional gate, the shape of ``x``.
            consume: ``x`` and ``z`` are the caller's temporaries and may be overwritten:
                without autograd the gate, normalisation and weight are applied in place
                (same values, no extra full-size buffers).  Ignored under autograd.
        """
        if consume and not torch.is_grad_enabled():
            return self._forward_in_place(x, z)
        dtype = x.dtype
        acc = torch.promote_types(dtype, torch.float32)
        x = x.to(acc)
        if z is not None and not self.norm_before_gate:
            x = x * F.silu(z.to(acc))
        shape = x.shape
        y = _rms_normalize(x.reshape(*shape[:-1], -1, self.group_size), self.eps).reshape(shape)
        y = y * self.weight
        if z is not None and self.norm_before_gate:
            y = y * F.silu(z.to(acc))
        return y.to(dtype)

    def _forward_in_place(self, x: torch.Tensor, z: Optional[torch.Tensor]) -> torch.Tensor:
        """:meth:`forward` overwriting ``x`` (or its fp32 copy) and ``z`` (no autograd)."""
        dtype = x.dtype
        acc = torch.promote_types(dtype, torch.float32)
        y = x.to(acc).contiguous()
        gate = None if z is None else F.silu(z.to(acc), inplace=True)
        if gate is not None and not self.norm_before_gate:
            y.mul_(gate)
        rows = y.view(-1, y.shape[-1] // self.group_size, self.group_size)
        # One step on accelerators and in captured graphs (a step is a slice update there).
        step = (IN_PLACE_ROWS if rows.device.type == 'cpu' and not capturing_graph() else
                max(1, rows.shape[0]))
        for start in range(0, rows.shape[0], step):  # bounded mean-square temporaries
            g = rows[start:start + step]
            g.mul_(torch.rsqrt(g.pow(2).mean(dim=-1, keepdim=True) + self.eps))
        y.mul_(self.weight)
        if gate is not None and self.norm_before_gate:
            y.mul_(gate)
        return y.to(dtype)

    def extra_repr(self) -> str:
        return (f'{super().extra_repr()}, group_size={self.group_size}, '
                f'norm_before_gate={self.norm_before_gate}')
