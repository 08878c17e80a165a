"""Mamba-2 state-space duality (SSD) scan: sequential oracle, chunked PyTorch path, dispatch."""
from .chunked import segment_sums, ssd_scan_chunked
from .dispatch import SSD_BACKENDS, TRITON_KERNEL_MODULE, ssd_scan, triton_kernel_available
from .naive import ssd_scan_naive

__all__ = [
    'ssd_scan', 'ssd_scan_chunked', 'ssd_scan_naive', 'segment_sums', 'SSD_BACKENDS',
    'TRITON_KERNEL_MODULE', 'triton_kernel_available'
]
