"""Mamba-2 state-space duality (SSD) scan: sequential oracle, chunked PyTorch path, dispatch."""
from .chunked import LOG_DECAY_FLOOR, decay_matrix, segment_sums, ssd_scan_chunked
from .dispatch import SSD_BACKENDS, TRITON_KERNEL_MODULE, ssd_scan, triton_kernel_available
from .naive import ssd_scan_naive

__all__ = [
    'ssd_scan', 'ssd_scan_chunked', 'ssd_scan_naive', 'segment_sums', 'decay_matrix',
    'LOG_DECAY_FLOOR', 'SSD_BACKENDS',
    'TRITON_KERNEL_MODULE', 'triton_kernel_available'
]
