"""Entry point of the Mamba-2 SSD scan that picks the implementation.

Backends:

* ``'torch'`` (always available): :func:`.torch_impl.ssd_scan_torch`, the CPU path.
* ``'naive'``: the token-by-token oracle :func:`.naive.ssd_scan_naive` (tests, debugging).
* ``'triton'``: the fused kernels of :mod:`.triton_kernel` (``TRITON_KERNEL_MODULE``, which
  defines ``ssd_scan_triton(x, dt, A, B, C, D, chunk_size) -> y`` with the semantics of
  :func:`ssd_scan`; forward and backward in Triton).

Backend choice, most specific first:

1. the ``backend`` argument (``'torch'``, ``'naive'``, ``'triton'``; ``None``/``'auto'`` = not
   forced);
2. the environment variable ``MMLINVIT_SSD_BACKEND`` = ``torch`` | ``triton`` | ``auto``;
3. auto: CUDA tensors with triton installed and a supported shape/dtype (P, N <= 128;
   fp32/fp16/bf16) -> Triton kernel, everything else -> torch.

The package follows the layout of :mod:`mmlinvit.ops.linear_attention`: ``naive.py``,
``torch_impl.py``, ``triton_kernel.py``, ``checks.py`` (input checks and the kernel's limits)
and this dispatcher, with ``ssd_scan_naive`` / ``ssd_scan_torch`` / ``ssd_scan_triton`` of one
contract.

Forcing ``'triton'`` on CPU tensors is allowed only with ``TRITON_INTERPRET=1`` (the Triton
interpreter; tests only).  Each distinct choice is logged once on the ``mmlinvit`` logger.
Availability is checked with :func:`importlib.util.find_spec`; :mod:`.triton_kernel` (which
imports triton) is imported only when the kernel path is actually taken.
"""
import importlib
import importlib.util
from typing import Optional, Set, Tuple

import torch

from ..triton_utils import (check_forced_triton, choose_auto_backend, log_choice_once,
                            requested_backend, triton_available)
from .checks import check_chunk_size, kernel_unsupported_reason
from .naive import ssd_scan_naive
from .torch_impl import ssd_scan_torch

#: Module that the fused Triton implementation lives in.
TRITON_KERNEL_MODULE = 'mmlinvit.ops.ssd.triton_kernel'
#: Environment variable that forces a backend for every call without ``backend=``.
SSD_BACKEND_ENV_VAR = 'MMLINVIT_SSD_BACKEND'
SSD_BACKENDS = ('torch', 'naive', 'triton')
_ENV_CHOICES = ('auto', 'torch', 'triton')
_OPERATION = 'SSD scan'

_logged_choices: Set[Tuple[str, str]] = set()


def triton_kernel_available() -> bool:
    """Whether triton and :data:`TRITON_KERNEL_MODULE` are installed (nothing imported)."""
    return triton_available() and importlib.util.find_spec(TRITON_KERNEL_MODULE) is not None


def _log_choice_once(backend: str, reason: str) -> None:
    log_choice_once(_logged_choices, _OPERATION, backend, reason)


def select_ssd_backend(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                       C: torch.Tensor, D: Optional[torch.Tensor] = None,
                       backend: Optional[str] = None) -> str:
    """Returns ``'torch'``, ``'naive'`` or ``'triton'`` for these inputs; logs it once.

    Args:
        x: Inputs (batch, L, H, P).
        dt: Step sizes (batch, L, H).
        A: (H,).
        B: (batch, L, G, N).
        C: (batch, L, G, N).
        D: Optional (H,).
        backend: ``None``/``'auto'``, ``'torch'``, ``'naive'`` or ``'triton'``; ``None`` defers
            to ``MMLINVIT_SSD_BACKEND``.

    Returns:
        The backend name.

    Raises:
        RuntimeError: ``'triton'`` is forced but triton or the kernel module is missing, or
            the tensors are on CPU without ``TRITON_INTERPRET=1``.
        ValueError: unknown backend name (argument or environment variable), or ``'triton'``
            forced on inputs the kernel cannot take.
    """
    requested = requested_backend(backend, ('auto', ) + SSD_BACKENDS, SSD_BACKEND_ENV_VAR,
                                  _ENV_CHOICES, _OPERATION)
    if requested in ('torch', 'naive'):
        _log_choice_once(requested, 'forced')
        return requested
    if requested == 'triton':
        check_forced_triton(x.device, triton_kernel_available(),
                            lambda: kernel_unsupported_reason(x, dt, A, B, C, D), _OPERATION)
        _log_choice_once('triton', 'forced')
        return 'triton'
    return choose_auto_backend(x.device, triton_kernel_available,
                               lambda: kernel_unsupported_reason(x, dt, A, B, C, D),
                               _log_choice_once)


def ssd_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, D: Optional[torch.Tensor] = None, chunk_size: int = 256,
             backend: Optional[str] = None,
             chunks_per_step: Optional[int] = None) -> torch.Tensor:
    """Mamba-2 SSD scan: h_t = exp(A dt_t) h_{t-1} + dt_t x_t B_t^T; y_t = C_t h_t + D x_t.

    Args:
        x, dt, A, B, C, D: As :func:`.naive.ssd_scan_naive` (the contract of every backend).
        chunk_size: Tokens per chunk (any L works).
        backend: ``None`` (environment / auto), ``'auto'``, ``'torch'``, ``'naive'`` or
            ``'triton'`` (see the module docstring).
        chunks_per_step: Torch backend only: chunks vectorised together (``None`` = all).

    Returns:
        y (batch, L, H, P) in the dtype of ``x`` (fp32 accumulation).
    """
    check_chunk_size(chunk_size)  # every backend refuses what one refuses
    chosen = select_ssd_backend(x, dt, A, B, C, D, backend)
    if chosen == 'naive':
        return ssd_scan_naive(x, dt, A, B, C, D)
    if chosen == 'triton':
        kernel = importlib.import_module(TRITON_KERNEL_MODULE)
        return kernel.ssd_scan_triton(x, dt, A, B, C, D, chunk_size)
    return ssd_scan_torch(x, dt, A, B, C, D, chunk_size=chunk_size,
                          chunks_per_step=chunks_per_step)
