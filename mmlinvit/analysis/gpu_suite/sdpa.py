"""``scaled_dot_product_attention`` backends: forcing one, whether it runs, which kernel ran.

The suite times SDPA under each fused backend of :data:`SDPA_BACKENDS` (forced with
``torch.nn.attention.sdpa_kernel``) and records, for torch's default dispatch, the aten op
and CUDA kernel it chose (profiled, not timed: on the H200 the default ran cuDNN).
"""
import contextlib
import warnings
from typing import Callable, Dict, Optional

import torch

from mmlinvit.utils.benchmarking import synchronize

#: Fused SDPA backends timed in section 2 (name in the tables -> ``SDPBackend`` member).
SDPA_BACKENDS = {'flash': 'FLASH_ATTENTION', 'cudnn': 'CUDNN_ATTENTION'}
#: Substrings that mark an attention kernel among the device kernels of a profile.
ATTENTION_KERNEL_MARKS = ('sdpa', 'flash', 'fmha', 'attention', 'attn', 'softmax')


def sdpa_context(backend: str) -> contextlib.AbstractContextManager:
    """``sdpa_kernel`` restricted to one fused backend (:data:`SDPA_BACKENDS`), or a no-op
    for ``'default'`` (torch's own dispatch).

    Args:
        backend: ``'default'`` or a key of :data:`SDPA_BACKENDS`.
    """
    if backend == 'default':
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[backend]))


def sdpa_unavailable(fn: Callable[[], object], backend: str) -> Optional[str]:
    """None if one call of ``fn`` under ``backend`` runs, else torch's reason it cannot.

    Args:
        fn: A call of ``scaled_dot_product_attention``.
        backend: A key of :data:`SDPA_BACKENDS`.

    Raises:
        RuntimeError: ``fn`` failed for another reason than a dispatch refusal.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        try:
            with torch.no_grad(), sdpa_context(backend):
                fn()
        except RuntimeError as exc:
            if 'backend' not in str(exc) and 'kernel' not in str(exc):
                raise  # not a dispatch refusal: a real error
            # torch warns why each backend refused; the exception only says none was left
            why = '; '.join(dict.fromkeys(str(w.message).strip().splitlines()[0][:160]
                                          for w in caught if issubclass(w.category, UserWarning)))
            return f'unavailable: {why or str(exc).splitlines()[0]}'[:400]
    return None


def attention_kernels(fn: Callable[[], object], device: torch.device) -> Dict[str, Optional[str]]:
    """The SDPA aten op(s) and CUDA kernel(s) one call of ``fn`` runs (torch.profiler).

    Args:
        fn: The call to profile (run once untimed first).
        device: Where it runs (CUDA: device kernels are profiled too).

    Returns:
        ``{'aten op': ..., 'kernel': ...}``: the ``aten::_scaled_dot_product_*`` /
        ``aten::_*attention*`` ops below ``scaled_dot_product_attention`` (they name the
        backend: flash, cudnn, efficient, math, ..._for_cpu) and the device kernels whose names
        mark attention (:data:`ATTENTION_KERNEL_MARKS`), heaviest first; None where there is
        none (no device kernels on CPU).
    """
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU]
    if device.type == 'cuda':
        activities.append(ProfilerActivity.CUDA)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter('ignore')
        fn()
        synchronize(device)
        with profile(activities=activities) as prof:
            fn()
            synchronize(device)
    ops, kernels = [], []
    for e in prof.key_averages():
        key = e.key
        on_device = getattr(getattr(e, 'device_type', None), 'name', 'CPU') == 'CUDA'
        if on_device:
            if any(m in key.lower() for m in ATTENTION_KERNEL_MARKS):
                kernels.append((getattr(e, 'device_time_total', 0.0), key))
        elif key.startswith('aten::') and key != 'aten::scaled_dot_product_attention' and (
                'scaled_dot_product' in key or 'attention' in key):
            ops.append(key)
    kernels.sort(reverse=True)
    return {'aten op': ', '.join(sorted(set(ops))) or None,
            'kernel': ', '.join(dict.fromkeys(k[:90] for _, k in kernels)) or None}
