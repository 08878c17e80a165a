"""Full-precision math under automatic mixed precision (``torch.autocast``).

mmengine's ``AmpOptimWrapper`` runs the whole model forward, losses included, inside
``torch.autocast``.  Autocast lowers matmul-like ops (``matmul`` / ``bmm`` / ``mm`` /
``linear`` / ``einsum`` built on them, ``scaled_dot_product_attention``...) to fp16 / bf16
even when their inputs were cast to float32 with ``.float()``, so a loss built on such an op
silently loses precision under ``--amp``.  Code that needs one (the torch linear-attention
path, distillation losses) computes it inside
:func:`autocast_disabled` on float32 copies of its inputs; its value under autocast then equals
the float32 value.  Element-wise ops and reductions (``-``, ``pow``, ``mean``, ``log``,
``F.normalize``) and autocast's float32-list ops (``mse_loss``, ``smooth_l1_loss``) keep
float32 inputs in float32 and need no guard.
"""
import contextlib
from typing import ContextManager

import torch


def autocast_disabled(device: torch.device) -> ContextManager:
    """Context that switches autocast off for ops on ``device``.

    Args:
        device: Device of the tensors the guarded math runs on.  On the meta device (shape /
            FLOP tracing) autocast has no backend and the context does nothing.

    Returns:
        The context manager.
    """
    if device.type == 'meta':
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, enabled=False)
