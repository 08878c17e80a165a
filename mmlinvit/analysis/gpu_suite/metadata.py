"""What a GPU-suite run's numbers depend on besides the code, and the bandwidth references.

:func:`run_metadata` records the device, SM count, MIG mode, TF32 settings, cuDNN, torch and
triton versions and the forced kernel backends; :data:`PEAK_BW` is the peak HBM bandwidth
by exact device name, and :func:`l2_bytes` / :data:`L2_RULE_TOKENS` say where a working set
fits in L2 (a bandwidth measured there is L2's, not HBM's).
"""
import os
import shutil
import subprocess
import sys
import warnings
from typing import Dict, Optional

import torch

#: Peak HBM bandwidth (B/s) by exact ``torch.cuda.get_device_name()`` (vendor data sheets);
#: another device needs ``--peak-bw`` (without it only the measured copy is the reference).
PEAK_BW = {
    'NVIDIA H200': 4.8e12,
    'NVIDIA H100 80GB HBM3': 3.35e12,
    'NVIDIA H100 PCIe': 2.0e12,
    'NVIDIA A100-SXM4-80GB': 2.039e12,
    'NVIDIA A100-SXM4-40GB': 1.555e12,
    'NVIDIA A100 80GB PCIe': 1.935e12,
    'NVIDIA A100-PCIE-40GB': 1.555e12,
    'NVIDIA L40S': 0.864e12,
}
#: Nominal peak of the dry run (its bandwidth figures are meaningless anyway).
DRY_RUN_PEAK_BW = 4.8e12
#: The kernel-backend environment variables (``mmlinvit.ops.*.dispatch``) the suite forces to
#: ``triton``: a linear model that cannot take the kernel raises instead of silently timing
#: the PyTorch path.
FORCED_BACKEND_ENV = ('MMLINVIT_LINEAR_ATTN_BACKEND', 'MMLINVIT_SSD_BACKEND')
#: Forward working sets at or below the device's L2 measure L2 bandwidth; where the L2 size
#: is unknown (CPU) the rule of thumb for the H200 (50 MiB L2, 32 MiB per tensor at 16k).
L2_RULE_TOKENS = 16384


def peak_bandwidth(name: str) -> Optional[float]:
    """Peak HBM bandwidth (B/s) of the device called exactly ``name``, None if not in
    :data:`PEAK_BW` (a substring match would give an H100 PCIe the SXM part's 3.35 TB/s).

    Args:
        name: ``torch.cuda.get_device_name()`` of the device.
    """
    return PEAK_BW.get(name.strip())


def l2_bytes(device: torch.device) -> Optional[int]:
    """The device's L2 cache size in bytes (None on CPU or where torch does not say).

    Args:
        device: The device.
    """
    if device.type != 'cuda':
        return None
    return getattr(torch.cuda.get_device_properties(device), 'L2_cache_size', None) or None


def mig_mode() -> str:
    """The MIG mode as ``nvidia-smi`` reports it (or why it could not be queried)."""
    if os.environ.get('CUDA_VISIBLE_DEVICES', '').startswith('MIG-'):
        return 'enabled (CUDA_VISIBLE_DEVICES names a MIG instance)'
    if shutil.which('nvidia-smi') is None:
        return 'unknown (no nvidia-smi)'
    try:
        proc = subprocess.run(['nvidia-smi', '--query-gpu=name,mig.mode.current',
                               '--format=csv,noheader'], capture_output=True, text=True,
                              timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f'unknown ({type(exc).__name__})'
    out = (proc.stdout or proc.stderr).strip().replace('\n', '; ')
    return out[:200] if proc.returncode == 0 else f'unknown (nvidia-smi: {out[:120]})'


def run_metadata(name: str, peak_bw: Optional[float], peak_source: str, device: torch.device,
                 dry: bool) -> Dict[str, object]:
    """What the numbers depend on besides the code: device, versions, precision settings.

    Args:
        name: The device's name.
        peak_bw: The peak HBM bandwidth the fractions are taken of (B/s), or None.
        peak_source: Where ``peak_bw`` came from.
        device: The device the suite runs on.
        dry: Whether this is the ``--dry-run``.
    """
    import triton
    meta: Dict[str, object] = dict(
        device=name, torch=torch.__version__, triton=triton.__version__,
        cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(), dry_run=dry,
        peak_bw=peak_bw, peak_bw_source=peak_source, python=sys.version.split()[0])
    with warnings.catch_warnings():  # the TF32 flags are deprecated in newer torch
        warnings.simplefilter('ignore')
        meta['matmul allow_tf32'] = torch.backends.cuda.matmul.allow_tf32
        meta['cudnn allow_tf32'] = torch.backends.cudnn.allow_tf32
        meta['float32_matmul_precision'] = torch.get_float32_matmul_precision()
        meta['sdp enabled'] = {b: getattr(torch.backends.cuda, f'{b}_sdp_enabled')()
                               for b in ('flash', 'mem_efficient', 'cudnn', 'math')
                               if hasattr(torch.backends.cuda, f'{b}_sdp_enabled')}
    if device.type == 'cuda':
        props = torch.cuda.get_device_properties(device)
        meta.update(sm_count=props.multi_processor_count,
                    capability=f'{props.major}.{props.minor}',
                    memory_GiB=round(props.total_memory / 2**30, 1),
                    l2_MiB=(l2_bytes(device) or 0) / 2**20 or None, mig=mig_mode())
    else:
        meta.update(sm_count=None, capability=None, memory_GiB=None, l2_MiB=None,
                    mig='n/a (CPU)')
    meta['env'] = {k: os.environ.get(k) for k in FORCED_BACKEND_ENV + ('TRITON_INTERPRET', )}
    return meta
