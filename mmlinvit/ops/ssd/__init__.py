"""Mamba-2 state-space duality (SSD) scan: sequential oracle, chunked PyTorch path, dispatch.

The layout of :mod:`mmlinvit.ops.linear_attention`: ``naive`` / ``torch_impl`` /
``triton_kernel`` / ``checks`` / ``dispatch``, functions ``ssd_scan_naive``,
``ssd_scan_torch``, ``ssd_scan_triton`` with one contract.  The Triton kernels live in
:mod:`.triton_kernel`, which imports triton and is therefore not imported here;
:func:`ssd_scan` loads it when it chooses it.
"""
from .checks import check_chunk_size, check_ssd_inputs, kernel_unsupported_reason
from .dispatch import (SSD_BACKEND_ENV_VAR, SSD_BACKENDS, TRITON_KERNEL_MODULE, select_ssd_backend,
                       ssd_scan, triton_kernel_available)
from .naive import ssd_scan_naive
from .torch_impl import LOG_DECAY_FLOOR, decay_matrix, segment_sums, ssd_scan_torch

__all__ = [
    'ssd_scan', 'ssd_scan_torch', 'ssd_scan_naive', 'segment_sums', 'decay_matrix',
    'LOG_DECAY_FLOOR', 'SSD_BACKENDS', 'SSD_BACKEND_ENV_VAR', 'select_ssd_backend',
    'TRITON_KERNEL_MODULE', 'triton_kernel_available', 'check_ssd_inputs', 'check_chunk_size',
    'kernel_unsupported_reason'
]
