"""Entry points of non-causal linear attention that pick the implementation.

Callers (the attention operators) pass raw per-head q, k, v; the feature map is applied
here (fused into the kernel on the Triton path).

Backend choice, most specific first:

1. the ``backend`` argument (``'torch'``, ``'triton'``; ``None``/``'auto'`` = not forced);
2. the environment variable ``MMLINVIT_LINEAR_ATTN_BACKEND`` = ``torch`` | ``triton`` | ``auto``;
3. auto: CUDA tensors with Triton installed and a supported shape/dtype -> Triton kernel
   (:mod:`.fused`), everything else -> PyTorch (:mod:`.torch_impl`).

The PyTorch backend runs the chunked, feature-map-fused :func:`.torch_impl.linear_attention_chunked`
(peak memory: the output plus chunk buffers) in eager mode, and the whole-tensor
:func:`.torch_impl.linear_attention_graph` while a graph is captured (``torch.compile``,
``torch.export`` and the ONNX exporter, ``torch.jit.trace``), where the compiler fuses and plans
memory itself.

Forcing ``'triton'`` on CPU tensors is allowed only with ``TRITON_INTERPRET=1`` (the Triton
interpreter; tests only).  Each distinct choice is logged once on the ``mmlinvit`` logger.
Triton availability is checked with :func:`importlib.util.find_spec`; :mod:`.fused` (which
imports triton) is imported only when the kernel path is actually taken.
"""
import importlib
from types import ModuleType
from typing import Optional, Set, Tuple

import torch

from ..feature_maps import get_feature_map
from ..triton_utils import (KERNEL_DTYPES, KERNEL_MAX_HEAD_DIM, backend_from_env,
                            choose_auto_backend, log_choice_once, triton_available,
                            triton_interpreter_enabled)
from .torch_impl import (inline_attention_torch, linear_attention_chunked,
                         linear_attention_graph)

#: Environment variable that forces a backend for every call without ``backend=``.
BACKEND_ENV_VAR = 'MMLINVIT_LINEAR_ATTN_BACKEND'
BACKENDS = ('torch', 'triton')
_ENV_CHOICES = ('auto', ) + BACKENDS

# The kernel limits (the same constants as fused.MAX_HEAD_DIM / fused._SUPPORTED_DTYPES).
_KERNEL_MAX_HEAD_DIM = KERNEL_MAX_HEAD_DIM
_KERNEL_DTYPES = KERNEL_DTYPES

_logged_choices: Set[Tuple[str, str]] = set()


def _log_choice_once(backend: str, reason: str) -> None:
    log_choice_once(_logged_choices, 'linear attention', backend, reason)


def _requested_backend(backend: Optional[str]) -> str:
    """'auto', 'torch' or 'triton' from the argument, else from the environment."""
    if backend is not None:
        if backend not in _ENV_CHOICES:
            raise ValueError(f'Unknown linear attention backend {backend!r}; available: '
                             f'{list(_ENV_CHOICES)} (or None)')
        return backend
    env = backend_from_env(BACKEND_ENV_VAR)
    if env not in _ENV_CHOICES:
        raise ValueError(f'{BACKEND_ENV_VAR}={env!r} is not a backend; use one of '
                         f'{list(_ENV_CHOICES)}')
    return env


def _kernel_unsupported_reason(q: torch.Tensor, k: torch.Tensor,
                               v: torch.Tensor) -> Optional[str]:
    """Why the Triton kernel cannot take these inputs, or None when it can."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return 'inputs are not 4-D (B, H, N, d)'
    if max(q.shape[-1], v.shape[-1]) > _KERNEL_MAX_HEAD_DIM:
        return f'head dim > {_KERNEL_MAX_HEAD_DIM}'
    if any(t.dtype not in _KERNEL_DTYPES for t in (q, k, v)):
        return f'dtype not in {[str(t) for t in _KERNEL_DTYPES]}'
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        return 'empty token dimension'
    return None


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
    requested = _requested_backend(backend)
    if requested == 'torch':
        _log_choice_once('torch', 'forced')
        return 'torch'
    if requested == 'triton':
        if not triton_available():
            raise RuntimeError('linear attention backend "triton" was requested but triton is '
                               'not installed; install triton or use backend "torch"')
        if q.device.type != 'cuda' and not triton_interpreter_enabled():
            raise RuntimeError(f'linear attention backend "triton" needs CUDA tensors (got '
                               f'{q.device}); set TRITON_INTERPRET=1 to run the kernel in the '
                               'Triton CPU interpreter, or use backend "torch"')
        reason = _kernel_unsupported_reason(q, k, v)
        if reason is not None:
            raise ValueError(f'linear attention backend "triton" cannot take these inputs: '
                             f'{reason}; use backend "torch"')
        _log_choice_once('triton', 'forced')
        return 'triton'
    return choose_auto_backend(q.device, triton_available,
                               lambda: _kernel_unsupported_reason(q, k, v), _log_choice_once)


def capturing_graph() -> bool:
    """Whether a graph is being captured (torch.compile / export, ONNX export, jit trace)."""
    return (torch.compiler.is_compiling() or torch.compiler.is_exporting()
            or torch.onnx.is_in_onnx_export() or torch.jit.is_tracing())


def _fused_module() -> ModuleType:
    """Imports the Triton kernels (only called once the triton path was chosen)."""
    return importlib.import_module('.fused', __package__)


def linear_attention(q: torch.Tensor,
                     k: torch.Tensor,
                     v: torch.Tensor,
                     feature_map: str = 'elu',
                     eps: float = 1e-6,
                     backend: Optional[str] = None) -> torch.Tensor:
    """phi(Q) S / (phi(Q) z + eps), S = phi(K)^T V / N, z = mean(phi(K)), fp32 accumulation.

    Args:
        q: Queries (B, H, N, d), before the feature map.
        k: Keys (B, H, M, d), before the feature map.
        v: Values (B, H, M, e).
        feature_map: ``'elu'``, ``'relu'`` or ``'identity'``.
        eps: Normaliser epsilon.
        backend: ``None`` (environment / auto), ``'auto'``, ``'torch'`` or ``'triton'``.

    Returns:
        (B, H, N, e) in the dtype of ``v``.
    """
    get_feature_map(feature_map)  # validates the name on every path
    if select_backend(q, k, v, backend) == 'triton':
        return _fused_module().fused_linear_attention(q, k, v, feature_map, eps)
    if capturing_graph():
        return linear_attention_graph(q, k, v, feature_map, eps)
    return linear_attention_chunked(q, k, v, feature_map, eps)


def inline_attention(q: torch.Tensor,
                     k: torch.Tensor,
                     v: torch.Tensor,
                     scale: float,
                     backend: Optional[str] = None) -> torch.Tensor:
    """InLine attention: A_ij = (s/M) q_i.k_j + (1/M)(1 - s q_i.kbar); rows sum to 1.

    out_i = s q_i (K^T V / M) + (1 - s q_i.kbar) vbar, accumulated in fp32.

    Args:
        q: Queries (B, H, N, d) (identity feature map).
        k: Keys (B, H, M, d).
        v: Values (B, H, M, e).
        scale: s, usually d ** -0.5.
        backend: ``None`` (environment / auto), ``'auto'``, ``'torch'`` or ``'triton'``.

    Returns:
        (B, H, N, e) in the dtype of ``v``.
    """
    if select_backend(q, k, v, backend) == 'triton':
        return _fused_module().fused_inline_attention(q, k, v, scale)
    return inline_attention_torch(q, k, v, scale)
