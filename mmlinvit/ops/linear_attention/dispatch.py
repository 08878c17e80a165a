"""Entry points of non-causal linear attention that pick the implementation.

Callers (the attention operators) pass raw per-head q, k, v; the feature map is applied
here (fused into the kernel on the Triton path).

Backend choice, most specific first:

1. the ``backend`` argument (``'torch'``, ``'triton'``; ``None``/``'auto'`` = not forced);
2. the environment variable ``MMLINVIT_LINEAR_ATTN_BACKEND`` = ``torch`` | ``triton`` | ``auto``;
3. auto: CUDA tensors with Triton installed and a supported shape/dtype -> Triton kernel
   (:mod:`.triton_kernel`), everything else -> PyTorch (:mod:`.torch_impl`).

The package follows the layout of :mod:`mmlinvit.ops.ssd`: ``naive.py`` (O(N^2) oracle,
``linear_attention_naive``), ``torch_impl.py`` (``linear_attention_torch``),
``triton_kernel.py`` (``linear_attention_triton``), ``checks.py`` (input checks and the
kernel's limits, shared by all of them) and this dispatcher; every implementation takes the
same arguments (raw q, k, v, the feature map's name, eps).

The PyTorch backend runs the chunked, feature-map-fused :func:`.torch_impl.linear_attention_torch`
(peak memory: the output plus chunk buffers) in eager mode, and the whole-tensor
:func:`.torch_impl.linear_attention_graph` while a graph is captured (``torch.compile``,
``torch.export`` and the ONNX exporter, ``torch.jit.trace``), where the compiler fuses and plans
memory itself.

Forcing ``'triton'`` on CPU tensors is allowed only with ``TRITON_INTERPRET=1`` (the Triton
interpreter; tests only).  Each distinct choice is logged once on the ``mmlinvit`` logger.
Triton availability is checked with :func:`importlib.util.find_spec`; :mod:`.triton_kernel` (which
imports triton) is imported only when the kernel path is actually taken.
"""
import importlib
from types import ModuleType
from typing import Optional, Set, Tuple

import torch

from ..feature_maps import get_feature_map
from ..graph_capture import capturing_graph
from ..triton_utils import (check_forced_triton, choose_auto_backend, log_choice_once,
                            requested_backend, triton_available)
from .checks import kernel_unsupported_reason
from .torch_impl import inline_attention_torch, linear_attention_graph, linear_attention_torch

#: Environment variable that forces a backend for every call without ``backend=``.
BACKEND_ENV_VAR = 'MMLINVIT_LINEAR_ATTN_BACKEND'
BACKENDS = ('torch', 'triton')
_CHOICES = ('auto', ) + BACKENDS
_OPERATION = 'linear attention'

_logged_choices: Set[Tuple[str, str]] = set()


def _log_choice_once(backend: str, reason: str) -> None:
    log_choice_once(_logged_choices, _OPERATION, backend, reason)


def select_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   backend: Optional[str] = None) -> str:
    """Returns ``'torch'`` or ``'triton'`` for these inputs and logs the choice once.

    Args:
        q: Queries (B, H, N, d).
        k: Keys (B, H, M, d).
        v: Values (B, H, M, e).
        backend: ``None``/``'auto'``, ``'torch'`` or ``'triton'``; ``None`` defers to
            ``MMLINVIT_LINEAR_ATTN_BACKEND``.

    Returns:
        The backend name.

    Raises:
        RuntimeError: ``'triton'`` is forced but triton is missing, or the tensors are on CPU
            without ``TRITON_INTERPRET=1``.
        ValueError: unknown backend name, or ``'triton'`` forced on inputs it cannot take.
    """
    requested = requested_backend(backend, _CHOICES, BACKEND_ENV_VAR, _CHOICES, _OPERATION)
    if requested == 'torch':
        _log_choice_once('torch', 'forced')
        return 'torch'
    if requested == 'triton':
        check_forced_triton(q.device, triton_available(),
                            lambda: kernel_unsupported_reason(q, k, v), _OPERATION)
        _log_choice_once('triton', 'forced')
        return 'triton'
    return choose_auto_backend(q.device, triton_available,
                               lambda: kernel_unsupported_reason(q, k, v), _log_choice_once)


def _triton_module() -> ModuleType:
    """Imports the Triton kernels (only called once the triton path was chosen)."""
    return importlib.import_module('.triton_kernel', __package__)


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature_map: str = 'elu',
                     eps: float = 1e-6, backend: Optional[str] = None) -> torch.Tensor:
    """phi(Q) S / (phi(Q) z + eps), S = phi(K)^T V / N, z = mean(phi(K)), fp32 accumulation.

    Args:
        q, k, v, feature_map, eps: As :func:`.naive.linear_attention_naive` (the contract of
            every backend).
        backend: ``None`` (environment / auto), ``'auto'``, ``'torch'`` or ``'triton'``.

    Returns:
        (B, H, N, e) in the dtype of ``v``.
    """
    get_feature_map(feature_map)  # validates the name on every path
    if select_backend(q, k, v, backend) == 'triton':
        return _triton_module().linear_attention_triton(q, k, v, feature_map, eps)
    if capturing_graph():
        return linear_attention_graph(q, k, v, feature_map, eps)
    return linear_attention_torch(q, k, v, feature_map, eps)


def inline_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     backend: Optional[str] = None) -> torch.Tensor:
    """InLine attention: A_ij = (s/M) q_i.k_j + (1/M)(1 - s q_i.kbar); rows sum to 1.

    out_i = s q_i (K^T V / M) + (1 - s q_i.kbar) vbar, accumulated in fp32.

    Args:
        q, k, v, scale: As :func:`.torch_impl.inline_attention_torch`.
        backend: ``None`` (environment / auto), ``'auto'``, ``'torch'`` or ``'triton'``.

    Returns:
        (B, H, N, e) in the dtype of ``v``.
    """
    if select_backend(q, k, v, backend) == 'triton':
        return _triton_module().inline_attention_triton(q, k, v, scale)
    return inline_attention_torch(q, k, v, scale)
