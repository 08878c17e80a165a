"""Helpers shared by the Triton kernels of :mod:`mmlinvit.ops` and their dispatchers.

Two groups:

* kernel side (used by the two ``triton_kernel`` modules): whether ``@triton.jit`` decorates
  for the CPU interpreter, what keeps the interpreter from running, the device check of the
  launches, the ``tl.dot`` input precision and the device guard;
* both sides: the kernels' limits (:data:`KERNEL_MAX_HEAD_DIM`, :data:`KERNEL_DTYPES`,
  :func:`kernel_limits_reason`), so that the dispatcher's choice and the kernel's own check
  give the same reason;
* dispatcher side (used by the two ``dispatch`` modules): triton availability (checked with
  :func:`importlib.util.find_spec`, nothing imported), the ``TRITON_INTERPRET`` switch, the
  requested backend (argument, environment variable), the errors of a forced ``'triton'``, the
  log-once of a choice and the ``auto`` selection.

This module does not import triton at import time: the functions that need it import it when
called, so the dispatchers can use it on machines without triton.
"""
import contextlib
import importlib.util
import logging
import os
from typing import Callable, ContextManager, Dict, Optional, Sequence, Set, Tuple

import torch

from .graph_capture import capturing_graph

_TRUE_VALUES = ('1', 'true', 'on', 'yes')

#: Limits of every Triton kernel of the package (linear attention and SSD scan), kept here so
#: that the dispatchers can read them without importing triton: the largest head dim (q/k/v
#: head dims; SSD: head dim P and state size N) and the supported dtypes.
KERNEL_MAX_HEAD_DIM = 128
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def triton_available() -> bool:
    """Whether the ``triton`` package is installed (checked without importing it)."""
    return importlib.util.find_spec('triton') is not None


def triton_interpreter_enabled() -> bool:
    """Whether ``TRITON_INTERPRET=1`` is set (Triton kernels then run on CPU tensors)."""
    return os.environ.get('TRITON_INTERPRET', '0').strip().lower() in _TRUE_VALUES


def interpreter_active() -> bool:
    """Whether ``@triton.jit`` currently decorates for the CPU interpreter (imports triton)."""
    import triton
    knobs = getattr(triton, 'knobs', None)  # triton >= 3.4; older versions read the env var
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return triton_interpreter_enabled()


def interpreter_problem() -> Optional[str]:
    """None when interpreted kernels can run now, else what is wrong and how to fix it."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    if not isinstance(tl.standard.sum, InterpretedFunction):
        return ('triton was imported before TRITON_INTERPRET=1 was set (e.g. timm imports '
                'torch._dynamo, which imports triton); set it before anything imports triton')
    if not interpreter_active():
        return 'TRITON_INTERPRET=1 was unset after the kernels were imported; keep it set'
    return None


def check_kernel_device(device: torch.device, interpreted: bool, kernels: str) -> None:
    """Raises a RuntimeError naming the fix when kernels cannot run on ``device``.

    Args:
        device: Device of the input tensors.
        interpreted: Whether the kernels were decorated for the CPU interpreter.
        kernels: How the error names the kernels, e.g. ``'Triton SSD'``.

    Raises:
        RuntimeError: CUDA tensors for interpreted kernels, CPU tensors for compiled ones, or
            an interpreter that cannot run (see :func:`interpreter_problem`).
    """
    if device.type == 'cuda':
        if interpreted:
            raise RuntimeError('the Triton kernels were imported with TRITON_INTERPRET=1 and can '
                               'only run on CPU tensors; unset TRITON_INTERPRET for CUDA')
    elif not interpreted:
        raise RuntimeError(f'the {kernels} kernels need CUDA tensors (got {device}); set '
                           'TRITON_INTERPRET=1 before triton is imported to run them on CPU in '
                           'the interpreter, or use backend="torch"')
    else:
        problem = interpreter_problem()
        if problem is not None:
            raise RuntimeError(f'cannot run the Triton interpreter: {problem}')


def dot_precision(interpreted: bool, *tensors: torch.Tensor) -> str:
    """IEEE fp32 in the interpreter and for fp32 inputs (unless torch allows TF32), else TF32.

    Args:
        interpreted: Whether the kernels run in the CPU interpreter.
        *tensors: The inputs whose dtypes decide.

    Returns:
        ``'ieee'`` or ``'tf32'`` (the ``input_precision`` of ``tl.dot``).
    """
    if interpreted:
        return 'ieee'
    if any(t.dtype == torch.float32 for t in tensors):
        return 'tf32' if torch.backends.cuda.matmul.allow_tf32 else 'ieee'
    return 'tf32'


def device_guard(device: torch.device) -> ContextManager:
    """Makes ``device`` current for the launches (Triton launches on the current device)."""
    if device.type == 'cuda':
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def backend_from_env(env_var: str) -> str:
    """The lower-cased value of ``env_var``, ``'auto'`` when unset or empty (not validated)."""
    env = os.environ.get(env_var, '').strip().lower()
    return env if env != '' else 'auto'


def log_choice_once(logged: Set[Tuple[str, str]], operation: str, backend: str,
                    reason: str) -> None:
    """Logs ``'<operation> backend: <backend> (<reason>)'`` on the ``mmlinvit`` logger once.

    Args:
        logged: The caller's memory of (backend, reason) pairs already logged; updated.
        operation: What the backend is for, e.g. ``'SSD scan'``.
        backend: The chosen backend.
        reason: Why it was chosen.
    """
    if capturing_graph():  # the logging module is not traceable; eager calls log it
        return
    key = (backend, reason)
    if key not in logged:
        logged.add(key)
        logging.getLogger('mmlinvit').info('%s backend: %s (%s)', operation, backend, reason)


#: Oldest NVIDIA compute capability the ``auto`` choice sends to the Triton kernels: they are
#: tuned and tested on sm_80+ (A100, H100 / H200); older GPUs (V100 sm_70, T4 sm_75) lack bf16
#: ``tl.dot`` and Triton's current releases list sm_80+ as supported hardware.
MIN_AUTO_CAPABILITY = (8, 0)


@torch.compiler.assume_constant_result
def cuda_capability(index: Optional[int]) -> Tuple[int, int]:
    """``torch.cuda.get_device_capability(index)``, a constant to ``torch.compile`` (dynamo
    does not fold the call itself, so a compiled model's dispatch would break its graph)."""
    return tuple(torch.cuda.get_device_capability(index))


def accelerator_unsupported_reason(device: torch.device) -> Optional[str]:
    """Why ``auto`` keeps the PyTorch path on this CUDA device, or None when the kernels fit.

    ROCm devices (``torch.version.hip``) and NVIDIA GPUs below :data:`MIN_AUTO_CAPABILITY` get
    a reason; ``backend='triton'`` (or the environment variable) still forces the kernels.

    Args:
        device: A ``cuda`` device.
    """
    if getattr(torch.version, 'hip', None):
        return ('ROCm device: the Triton kernels are tested on NVIDIA sm_80+ only; '
                "backend='triton' forces them")
    major, minor = cuda_capability(device.index)
    if (major, minor) < MIN_AUTO_CAPABILITY:
        want = '.'.join(map(str, MIN_AUTO_CAPABILITY))
        return (f'compute capability {major}.{minor} < {want}: the Triton kernels are tested '
                f"on sm_80+ only; backend='triton' forces them")
    return None


def choose_auto_backend(device: torch.device, kernel_available: Callable[[], bool],
                        unsupported_reason: Callable[[], Optional[str]],
                        log_choice: Callable[[str, str], None]) -> str:
    """The ``auto`` choice: ``'triton'`` for CUDA tensors the installed kernel can take.

    CUDA tensors stay on the PyTorch path on ROCm and below compute capability 8.0
    (:func:`accelerator_unsupported_reason`).

    Args:
        device: Device of the inputs.
        kernel_available: Whether triton (and the kernel module) is installed.
        unsupported_reason: Why the kernel cannot take the inputs, or None when it can.
        log_choice: Called with (backend, reason) for the choice made.

    Returns:
        ``'triton'`` or ``'torch'``.
    """
    if device.type != 'cuda':
        log_choice('torch', f'auto: {device.type} tensors')
        return 'torch'
    if not kernel_available():
        log_choice('torch', 'auto: triton is not installed')
        return 'torch'
    reason = accelerator_unsupported_reason(device)
    if reason is not None:
        log_choice('torch', f'auto: {reason}')
        return 'torch'
    reason = unsupported_reason()
    if reason is not None:
        log_choice('torch', f'auto: {reason}')
        return 'torch'
    log_choice('triton', 'auto: CUDA tensors and triton installed')
    return 'triton'


def requested_backend(backend: Optional[str], choices: Sequence[str], env_var: str,
                      env_choices: Sequence[str], operation: str) -> str:
    """The backend asked for: the ``backend`` argument, else ``env_var``, else ``'auto'``.

    Args:
        backend: The argument (``None`` defers to the environment variable).
        choices: Names the argument accepts (``'auto'`` included).
        env_var: Environment variable read when ``backend`` is None.
        env_choices: Names the environment variable accepts.
        operation: How errors name the operation, e.g. ``'SSD scan'``.

    Returns:
        One of ``choices``.

    Raises:
        ValueError: naming the unknown value and the accepted ones.
    """
    if backend is not None:
        if backend not in choices:
            raise ValueError(f'Unknown {operation} backend {backend!r}; available: '
                             f'{list(choices)} (or None)')
        return backend
    env = backend_from_env(env_var)
    if env not in env_choices:
        raise ValueError(f'{env_var}={env!r} is not a {operation} backend; available: '
                         f'{list(env_choices)}')
    return env


def check_forced_triton(device: torch.device, kernel_available: bool,
                        unsupported_reason: Callable[[], Optional[str]],
                        operation: str) -> None:
    """Raises when ``backend='triton'`` was forced but the kernel cannot run these inputs.

    Args:
        device: Device of the inputs.
        kernel_available: Whether triton (and the kernel module) is installed.
        unsupported_reason: Why the kernel cannot take the inputs, or None when it can.
        operation: How errors name the operation, e.g. ``'SSD scan'``.

    Raises:
        RuntimeError: triton missing, or CPU tensors without ``TRITON_INTERPRET=1``.
        ValueError: inputs outside the kernel's limits (the reason is named).
    """
    if not kernel_available:
        raise RuntimeError(f"{operation} backend='triton' was requested but triton is not "
                           "installed; install triton or use backend='torch'")
    if device.type != 'cuda' and not triton_interpreter_enabled():
        raise RuntimeError(f"{operation} backend='triton' needs CUDA tensors (got {device}); "
                           'set TRITON_INTERPRET=1 to run the kernels in the Triton CPU '
                           "interpreter, or use backend='torch'")
    reason = unsupported_reason()
    if reason is not None:
        raise ValueError(f"{operation} backend='triton' cannot take these inputs: {reason}; "
                         "use backend='torch'")


def kernel_limits_reason(dims: Dict[str, int],
                         tensors: Sequence[Tuple[str, torch.Tensor]]) -> Optional[str]:
    """Why inputs are outside the kernels' limits (:data:`KERNEL_MAX_HEAD_DIM`, dtypes), or None.

    Args:
        dims: Name -> size of the dims the kernels tile in registers (head dims, state size).
        tensors: (name, tensor) of every input (dtype check; all on one device).
    """
    too_big = {name: size for name, size in dims.items() if size > KERNEL_MAX_HEAD_DIM}
    if too_big:
        return f'head dims / state size {too_big}, supported <= {KERNEL_MAX_HEAD_DIM}'
    for name, t in tensors:
        if t.dtype not in KERNEL_DTYPES:
            return (f'{name} has dtype {t.dtype}; the kernels take '
                    f'{[str(d) for d in KERNEL_DTYPES]}')
    devices = {str(t.device) for _, t in tensors}
    if len(devices) != 1:
        return f'inputs are on different devices: {sorted(devices)}'
    return None
