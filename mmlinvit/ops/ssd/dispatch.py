"""Entry point of the Mamba-2 SSD scan that picks the implementation.

Backends:

* ``'torch'`` (the default, always available): :func:`.chunked.ssd_scan_chunked`.
* ``'naive'``: the token-by-token oracle :func:`.naive.ssd_scan_naive` (tests, debugging).
* ``'triton'``: hook point for a fused kernel.  It is used only when the module
  ``mmlinvit.ops.ssd.triton_kernel`` exists and defines
  ``ssd_scan_triton(x, dt, A, B, C, D, chunk_size) -> y`` with the semantics of
  :func:`ssd_scan`; until then asking for it raises ``NotImplementedError``.  ``backend=None``
  never switches to it silently: it means ``'torch'``.
"""
import importlib
import importlib.util
from typing import Optional

import torch

from .chunked import ssd_scan_chunked
from .naive import ssd_scan_naive

#: Module that a fused Triton implementation must live in to be reachable.
TRITON_KERNEL_MODULE = 'mmlinvit.ops.ssd.triton_kernel'
SSD_BACKENDS = ('torch', 'naive', 'triton')


def triton_kernel_available() -> bool:
    """Whether :data:`TRITON_KERNEL_MODULE` exists (checked explicitly, nothing imported)."""
    return importlib.util.find_spec(TRITON_KERNEL_MODULE) is not None


def ssd_scan(x: torch.Tensor,
             dt: torch.Tensor,
             A: torch.Tensor,
             B: torch.Tensor,
             C: torch.Tensor,
             D: Optional[torch.Tensor] = None,
             chunk_size: int = 256,
             backend: Optional[str] = None,
             chunks_per_step: Optional[int] = None) -> torch.Tensor:
    """Mamba-2 SSD scan: h_t = exp(A dt_t) h_{t-1} + dt_t x_t B_t^T; y_t = C_t h_t + D x_t.

    Args:
        x: Inputs (batch, L, H, P).
        dt: Step sizes (batch, L, H), already positive (softplus applied).
        A: Per-head decay rates (H,), negative.
        B: Input projections (batch, L, G, N), ``H % G == 0``; head h reads group
            ``h // (H // G)``.
        C: Output projections (batch, L, G, N).
        D: Optional per-head skip (H,).
        chunk_size: Tokens per chunk (any L works).
        backend: ``None`` / ``'torch'``, ``'naive'`` or ``'triton'`` (see module docstring).
        chunks_per_step: Torch backend only: chunks vectorised together (``None`` = all).

    Returns:
        y (batch, L, H, P) in the dtype of ``x`` (fp32 accumulation).
    """
    backend = 'torch' if backend is None else backend
    if backend == 'torch':
        return ssd_scan_chunked(x, dt, A, B, C, D, chunk_size=chunk_size,
                                chunks_per_step=chunks_per_step)
    if backend == 'naive':
        return ssd_scan_naive(x, dt, A, B, C, D)
    if backend == 'triton':
        if not triton_kernel_available():
            raise NotImplementedError(
                f"ssd_scan backend='triton' needs a fused kernel module {TRITON_KERNEL_MODULE} "
                f"defining ssd_scan_triton(x, dt, A, B, C, D, chunk_size); none is installed. "
                f"Use backend='torch' (or None), the chunked PyTorch implementation.")
        kernel = importlib.import_module(TRITON_KERNEL_MODULE)
        return kernel.ssd_scan_triton(x, dt, A, B, C, D, chunk_size)
    raise KeyError(f'Unknown ssd_scan backend {backend!r}; available: {SSD_BACKENDS} '
                   f'(None means torch)')
