"""Input checks shared by every implementation of linear attention (naive, torch, Triton)."""
from typing import Optional, Sequence, Tuple

import torch

from ..triton_utils import kernel_limits_reason


def check_linear_attention_inputs(q: torch.Tensor, k: torch.Tensor,
                                  v: torch.Tensor) -> Tuple[int, ...]:
    """Validates q (..., N, d), k (..., M, d), v (..., M, e); returns the leading shape.

    Raises:
        ValueError: naming the shapes that disagree.
    """
    if q.dim() < 3 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError('linear attention expects q (..., N, d), k (..., M, d), v (..., M, e) '
                         f'with equal rank >= 3; got {tuple(q.shape)}, {tuple(k.shape)}, '
                         f'{tuple(v.shape)}')
    lead = tuple(q.shape[:-2])
    if tuple(k.shape[:-2]) != lead or tuple(v.shape[:-2]) != lead:
        raise ValueError('q, k and v must share their leading (batch, head) dims; got '
                         f'{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}')
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f'q and k need the same feature dim; got {q.shape[-1]} and '
                         f'{k.shape[-1]}')
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f'k and v need the same token count; got {k.shape[-2]} and '
                         f'{v.shape[-2]}')
    if k.shape[-2] == 0:
        raise ValueError('linear attention needs at least one key token (M >= 1)')
    for name, t in (('q', q), ('k', k), ('v', v)):
        if not t.is_floating_point():
            raise ValueError(f'linear attention takes floating-point q, k, v; {name} has '
                             f'dtype {t.dtype} (convert it with .float())')
    return lead


def check_feature_map(feature_map: str, available: Sequence[str], implementation: str) -> None:
    """Raises a ValueError listing ``available`` when ``feature_map`` is not one of them.

    Args:
        feature_map: The requested name.
        available: Names the implementation fuses.
        implementation: How the error names the implementation, e.g. ``'the Triton kernel'``.
    """
    if feature_map not in available:
        raise ValueError(f'Unknown feature map {feature_map!r} for {implementation}; available: '
                         f'{sorted(available)}')


def kernel_unsupported_reason(q: torch.Tensor, k: torch.Tensor,
                              v: torch.Tensor) -> Optional[str]:
    """Why the Triton kernels cannot take these inputs, or None when they can.

    The dispatcher falls back to torch for this reason (``auto``) or raises it (a forced
    ``'triton'``); the kernel module raises it for direct calls.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return 'inputs are not 4-D (B, H, N, d)'
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        return 'empty token dimension'
    return kernel_limits_reason({'d': q.shape[-1], 'e': v.shape[-1]},
                                (('q', q), ('k', k), ('v', v)))
