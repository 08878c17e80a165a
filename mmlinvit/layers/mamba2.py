"""Mamba-2 token mixer (the SSD layer of Adventurer) in plain PyTorch.

Data flow for tokens u (B, L, d_model), with d_inner = expand * d_model, H = d_inner //
headdim heads, G = ngroups B/C groups and N = d_state::

    [z, xBC, dt] = in_proj(u)                  z: d_inner, xBC: d_inner + 2 G N, dt: H
    xBC = silu(causal depthwise conv1d(xBC))   kernel d_conv, left-padded
    [x, B, C] = xBC                            x: (H, headdim), B, C: (G, N)
    dt = clamp(softplus(dt + dt_bias), dt_limit)
    A = -exp(A_log)                            (H,)
    y = ssd_scan(x, dt, A, B, C, D)            h_t = exp(A dt_t) h_{t-1} + dt_t x_t B_t^T
    out = out_proj(GatedRMSNorm(y, z))         rmsnorm(y * silu(z)) * weight

Parameter names follow the reference implementation (``in_proj``, ``conv1d``, ``dt_bias``,
``A_log``, ``D``, ``norm.weight``, ``out_proj``; in_proj rows ordered z, x, B, C, dt), so
Mamba-2 / Adventurer checkpoints load unchanged.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmlinvit.ops.causal_conv import causal_depthwise_conv1d
from mmlinvit.ops.precision import autocast_disabled
from mmlinvit.ops.ssd import SSD_BACKENDS, ssd_scan
from mmlinvit.ops.ssd.checks import check_chunk_size
from .norm import GatedRMSNorm


class Mamba2Mixer(nn.Module):
    """Mamba-2 mixer: (B, L, d_model) -> (B, L, d_model), causal along L.

    Initialisation (the documented Mamba-2 defaults, see :meth:`reset_ssm_parameters`):
    ``dt_bias = softplus^-1(dt)`` with dt log-uniform in [dt_min, dt_max] and floored at
    ``dt_init_floor``; ``A_log = log(U[A_init_range])``; ``D = 1``; linear and conv layers keep
    the PyTorch defaults (backbones may rescale ``out_proj``).

    Args:
        d_model: Token width.
        d_state: State size N per group (64, Adventurer's; mamba's own ``Mamba2`` defaults to 128).
        d_conv: Kernel size of the causal depthwise convolution.
        expand: d_inner = expand * d_model.
        headdim: Channels per head P; d_inner must be divisible by it.
        ngroups: Number of B/C groups G; the head count must be divisible by it.
        chunk_size: Chunk length of the SSD scan (the Triton kernel's tile).  Outputs do
            not depend on it; with the PyTorch scan under autograd, memory and time of the
            within-chunk part grow as L * H * chunk_size, so 64 is cheaper than the reference
            256 for CPU training.  Without autograd the PyTorch scan uses chunks of at most
            ``mmlinvit.ops.ssd.torch_impl.INFERENCE_CHUNK`` (64) tokens anyway.
        A_init_range: Range of the uniform init of -A.
        dt_min: Smallest initial step size.
        dt_max: Largest initial step size.
        dt_init_floor: Floor of the initial step sizes.
        dt_limit: (min, max) clamp of dt after the softplus; (0, inf) disables it.
        bias: Whether in_proj / out_proj have biases.
        conv_bias: Whether the depthwise convolution has a bias.
        norm_eps: Epsilon of the gated RMSNorm.
        norm_before_gate: Gate after (True) or before (False, Mamba-2 default) the norm.
        ssd_backend: Backend of :func:`mmlinvit.ops.ssd.ssd_scan` (``None`` = auto: the
            Triton kernel for CUDA tensors when triton is installed, else torch).
        chunks_per_step: Chunks vectorised together by the torch scan (``None`` = all).
    """

    def __init__(self,
                 d_model: int,
                 d_state: int = 64,
                 d_conv: int = 4,
                 expand: int = 2,
                 headdim: int = 64,
                 ngroups: int = 1,
                 chunk_size: int = 256,
                 A_init_range: Tuple[float, float] = (1.0, 16.0),
                 dt_min: float = 0.001,
                 dt_max: float = 0.1,
                 dt_init_floor: float = 1e-4,
                 dt_limit: Tuple[float, float] = (0.0, float('inf')),
                 bias: bool = False,
                 conv_bias: bool = True,
                 norm_eps: float = 1e-5,
                 norm_before_gate: bool = False,
                 ssd_backend: Optional[str] = None,
                 chunks_per_step: Optional[int] = None) -> None:
        super().__init__()
        d_inner = expand * d_model
        if d_inner % headdim != 0:
            raise ValueError(f'Mamba2Mixer: d_inner = expand * d_model = {d_inner} must be '
                             f'divisible by headdim ({headdim})')
        nheads = d_inner // headdim
        if ngroups < 1 or nheads % ngroups != 0:
            raise ValueError(f'Mamba2Mixer: the number of heads ({nheads}) must be divisible '
                             f'by ngroups ({ngroups})')
        if not 0 < A_init_range[0] <= A_init_range[1]:
            raise ValueError(f'A_init_range must satisfy 0 < low <= high, got {A_init_range}')
        if not 0 < dt_min <= dt_max:
            raise ValueError(f'dt_min / dt_max must satisfy 0 < dt_min <= dt_max, got '
                             f'{dt_min} / {dt_max}')
        self.d_model = d_model
        self.d_state = d_state
        self.d_conv = d_conv
        self.expand = expand
        self.headdim = headdim
        self.ngroups = ngroups
        self.d_inner = d_inner
        self.nheads = nheads
        check_chunk_size(chunk_size)  # at build time, not at the first forward
        self.chunk_size = chunk_size
        self.A_init_range = tuple(A_init_range)
        self.dt_min, self.dt_max, self.dt_init_floor = dt_min, dt_max, dt_init_floor
        self.dt_limit = tuple(dt_limit)
        if ssd_backend not in (None, 'auto') + SSD_BACKENDS:
            raise ValueError(f'Mamba2Mixer: unknown ssd_backend {ssd_backend!r}; available: '
                             f"{[None, 'auto', *SSD_BACKENDS]}")
        self.ssd_backend = ssd_backend
        self.chunks_per_step = chunks_per_step

        conv_dim = d_inner + 2 * ngroups * d_state
        self.in_proj = nn.Linear(d_model, d_inner + conv_dim + nheads, bias=bias)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, kernel_size=d_conv, groups=conv_dim,
                                padding=d_conv - 1, bias=conv_bias)
        self.dt_bias = nn.Parameter(torch.empty(nheads))
        self.A_log = nn.Parameter(torch.empty(nheads))
        self.D = nn.Parameter(torch.empty(nheads))
        self.norm = GatedRMSNorm(d_inner, eps=norm_eps, group_size=d_inner // ngroups,
                                 norm_before_gate=norm_before_gate)
        self.out_proj = nn.Linear(d_inner, d_model, bias=bias)
        self.reset_ssm_parameters()

    @torch.no_grad()
    def reset_ssm_parameters(self) -> None:
        """Mamba-2 init of ``dt_bias``, ``A_log`` and ``D`` (see the class docstring)."""
        device = self.dt_bias.device
        log_min, log_max = math.log(self.dt_min), math.log(self.dt_max)
        dt = torch.exp(torch.rand(self.nheads, device=device) * (log_max - log_min) + log_min)
        dt = dt.clamp(min=self.dt_init_floor)
        # softplus^-1(dt) = dt + log(1 - exp(-dt))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        a = torch.empty(self.nheads, device=device).uniform_(*self.A_init_range)
        self.A_log.copy_(torch.log(a))
        self.D.fill_(1.0)

    def step_sizes(self, dt_raw: torch.Tensor) -> torch.Tensor:
        """dt = clamp(softplus(dt_raw + dt_bias), dt_limit), in fp32 (at least)."""
        acc = torch.promote_types(dt_raw.dtype, torch.float32)
        dt = F.softplus(dt_raw.to(acc) + self.dt_bias.to(acc))
        low, high = self.dt_limit
        if low > 0.0 or high != float('inf'):
            dt = dt.clamp(min=low, max=high)
        return dt

    def _in_proj_rows(self, part: int) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Weight rows (and bias) of ``in_proj`` for part 0 (z), 1 (xBC) or 2 (dt)."""
        rows = (self.d_inner, self.d_inner + 2 * self.ngroups * self.d_state, self.nheads)
        weight = torch.split(self.in_proj.weight, rows)[part]
        bias = self.in_proj.bias
        return weight, (None if bias is None else torch.split(bias, rows)[part])

    def conv_input(self, u: torch.Tensor) -> torch.Tensor:
        """xBC after the causal depthwise ``conv1d`` (before the SiLU), (B, L, conv_dim).

        On CPU token-major throughout: ``in_proj``'s xBC rows, then the convolution by
        shifted multiply-adds (:func:`~mmlinvit.ops.causal_conv.causal_depthwise_conv1d`,
        several times faster than oneDNN's depthwise convolution there; in ONNX graphs it
        also saves two transposes of xBC per block, 20 ms each in onnxruntime at 512), so
        that the scan reads x, B and C with contiguous channels.  On accelerators
        channels-first, the layout of ``nn.Conv1d`` (cuDNN), returned as a transposed view.
        Same parameters, values equal to fp32 rounding.  Under autocast the 16-bit xBC is
        convolved with the fp32 weights in fp32 (the official ``causal_conv1d`` kernel's
        precision); the result is in fp32 then, rounded once after the SiLU (:meth:`forward`).
        """
        batch, length, _ = u.shape
        w_xbc, b_xbc = self._in_proj_rows(1)
        if u.device.type == 'cpu':
            return causal_depthwise_conv1d(F.linear(u, w_xbc, b_xbc), self.conv1d.weight,
                                           self.conv1d.bias, channels_last=True)
        w_xbc = w_xbc.expand(batch, -1, -1)
        if b_xbc is None:  # bmm writes a contiguous (B, conv_dim, L): the conv copies nothing
            xbc_t = torch.bmm(w_xbc, u.transpose(1, 2))
        else:
            xbc_t = torch.baddbmm(b_xbc[:, None].expand(batch, -1, length), w_xbc,
                                  u.transpose(1, 2))
        acc = torch.promote_types(xbc_t.dtype, self.conv1d.weight.dtype)
        with autocast_disabled(xbc_t.device):
            out = self.conv1d(xbc_t.to(acc))
        return out[..., :length].transpose(1, 2)  # causal: drop the right pad

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """Mixes tokens u (B, L, d_model) causally along L; returns (B, L, d_model).

        Without autograd (``torch.no_grad`` / ``inference_mode``) the SiLU and the gated norm
        run in place on this call's own buffers (same values, less peak memory).
        """
        if u.ndim != 3 or u.shape[-1] != self.d_model:
            raise ValueError(f'Mamba2Mixer expects (batch, L, {self.d_model}), got '
                             f'{tuple(u.shape)}')
        batch, length, _ = u.shape
        gn = self.ngroups * self.d_state
        # in_proj part by part: xBC (convolved, see conv_input), dt, and the gate z only after
        # the scan (not alive during it).
        dt_raw = F.linear(u, *self._in_proj_rows(2))
        inference = not torch.is_grad_enabled()
        # conv and SiLU in fp32 under autocast, one rounding to in_proj's (autocast) dtype
        xbc = F.silu(self.conv_input(u), inplace=inference).to(dt_raw.dtype)
        x, b, c = torch.split(xbc, [self.d_inner, gn, gn], dim=-1)
        y = ssd_scan(
            x.reshape(batch, length, self.nheads, self.headdim),
            self.step_sizes(dt_raw),
            # fp32 at least (bf16 parameters), fp64 for fp64 modules like every other input
            -torch.exp(self.A_log.to(torch.promote_types(self.A_log.dtype, torch.float32))),
            b.reshape(batch, length, self.ngroups, self.d_state),
            c.reshape(batch, length, self.ngroups, self.d_state),
            self.D,
            chunk_size=self.chunk_size,
            backend=self.ssd_backend,
            chunks_per_step=self.chunks_per_step)
        del xbc, x, b, c
        z = F.linear(u, *self._in_proj_rows(0))
        y = self.norm(y.reshape(batch, length, self.d_inner), z, consume=inference)
        return self.out_proj(y)

    def extra_repr(self) -> str:
        return (f'd_model={self.d_model}, d_state={self.d_state}, heads={self.nheads}x'
                f'{self.headdim}, ngroups={self.ngroups}, d_conv={self.d_conv}, '
                f'chunk_size={self.chunk_size}')
