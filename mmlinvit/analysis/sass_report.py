"""Machine code of the Triton kernels for a CUDA GPU, built on a machine without one.

The kernels' host code runs on CPU tensors while every launch is recorded instead of run;
each recorded launch is then compiled through Triton's own JIT specialisation (strides equal
to 1, 16-divisible integers and 16-byte aligned pointers are specialised as on a GPU) for the
target architecture, and the SASS that Triton's bundled ``cuobjdump`` prints is summarised:
registers, stack (spills), and the count of each memory and matrix instruction.

This is how the H200 runs' first defect was found and is kept fixed: every bf16 tile access
was a 2-byte ``LDG.E.U16`` (feature masks the compiler could not prove constant) and is now a
16-byte ``LDG.E.128`` / ``LDGSTS.E.128``.  Needs triton with its NVIDIA back end (the wheel's
``ptxas`` / ``cuobjdump``); no GPU, no CUDA driver.
"""
import collections
import contextlib
import os
import re
import subprocess
import tempfile
from typing import Callable, Dict, Iterator, List, Tuple

import torch

#: Instruction families counted, each split by access width (``.128``, ``.64``, ``.U16``,
#: ``.S16``, ``.U8``, ``.S8``; none: 32-bit).
COUNTED = ('LDG', 'STG', 'LDGSTS', 'LDS', 'STS', 'LDL', 'STL', 'HGMMA', 'HMMA')
_WIDTHS = ('128', '64', 'U16', 'S16', 'U8', 'S8')
_INSTRUCTION = re.compile(r'\b((?:' + '|'.join(sorted(COUNTED, key=len, reverse=True)) +
                          r')(?:\.[\w]+)*)\b')  # whole names: not LDGDEPBAR, LDSM


class _TargetDriver:
    """The parts of Triton's active driver the JIT asks for, answering for a CUDA target."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget('cuda', arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int = 0) -> int:
        return 0


@contextlib.contextmanager
def recorded_launches(arch: int = 90) -> Iterator[List[Tuple[object, tuple, tuple, dict]]]:
    """Within the block, kernel launches are recorded (kernel, grid, args, kwargs), not run,
    Triton's JIT targets ``sm_<arch>`` (compile them inside the block, with
    :func:`compile_launches`) and the kernels' device checks accept CPU tensors."""
    import triton.runtime.jit as jit
    from triton.runtime import driver

    import mmlinvit.ops.linear_attention.triton_kernel as la_kernel
    import mmlinvit.ops.ssd.triton_kernel as ssd_kernel
    launches: List[Tuple[object, tuple, tuple, dict]] = []
    saved_getitem = jit.JITFunction.__getitem__
    saved_checks = [(m, m.check_kernel_device) for m in (la_kernel, ssd_kernel)]
    jit.JITFunction.__getitem__ = (
        lambda fn, grid: lambda *args, **kwargs: launches.append((fn, grid, args, kwargs)))
    for module, _ in saved_checks:
        module.check_kernel_device = lambda *args, **kwargs: None
    saved_driver = driver._active  # None until a real driver was needed (none on this machine)
    driver.set_active(_TargetDriver(arch))
    try:
        yield launches
    finally:
        driver._active = saved_driver
        jit.JITFunction.__getitem__ = saved_getitem
        for module, check in saved_checks:
            module.check_kernel_device = check


def _cuobjdump(*args: str) -> str:
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin',
                        'cuobjdump')
    return subprocess.run([tool, *args], capture_output=True, text=True, check=True).stdout


def sass_summary(cubin: bytes) -> Dict[str, object]:
    """Registers, stack bytes and instruction counts (``'LDG.128'``, ``'LDG.U16'``, ``'LDG'``
    for 32-bit...) of one compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(cubin)
        f.flush()
        usage = _cuobjdump('--dump-resource-usage', f.name)
        sass = _cuobjdump('--dump-sass', f.name)
    regs = re.search(r'REG:(\d+)', usage)
    stack = re.search(r'STACK:(\d+)', usage)
    counts: Dict[str, int] = collections.Counter()
    for name in _INSTRUCTION.findall(sass):
        parts = name.split('.')
        width = next((w for w in _WIDTHS if w in parts[1:]), None)
        counts[parts[0] + ('.' + width if width else '')] += 1
    return dict(regs=int(regs.group(1)) if regs else None,
                stack=int(stack.group(1)) if stack else None, counts=dict(sorted(counts.items())))


def compile_launches(launches: List[Tuple[object, tuple, tuple, dict]]) -> List[Dict[str, object]]:
    """One summary per distinct compiled kernel of the recorded launches (kernel name first)."""
    rows, seen = [], set()
    for fn, grid, args, kwargs in launches:
        compiled = fn.warmup(*args, grid=grid, **kwargs)
        row = dict(kernel=fn.__name__, **sass_summary(compiled.asm['cubin']))
        key = (row['kernel'], row['regs'], row['stack'], tuple(row['counts'].items()))
        if key not in seen:
            seen.add(key)
            rows.append(row)
    return rows


def kernel_reports(dtype: torch.dtype = torch.bfloat16, tokens: int = 1000, arch: int = 90
                   ) -> Dict[str, List[Dict[str, object]]]:
    """SASS summaries of the linear attention (ELU, forward and backward; B=1, H=4, d=e=64)
    and SSD scan (forward and backward; Adventurer-B heads P=N=64, chunk 256) kernels."""
    from mmlinvit.ops.linear_attention.triton_kernel import linear_attention_triton
    from mmlinvit.ops.ssd.triton_kernel import ssd_scan_triton

    def run(fn: Callable[[], torch.Tensor], grad_like: Callable[[torch.Tensor], torch.Tensor]):
        with recorded_launches(arch) as launches:
            out = fn()
            out.backward(grad_like(out))  # recorded launches leave garbage: only shapes matter
            return compile_launches(launches)

    def leaf(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape).to(dt).requires_grad_()

    q, k, v = leaf(1, 4, tokens, 64), leaf(1, 4, tokens, 64), leaf(1, 4, tokens, 64)
    x, b, c = leaf(1, tokens, 8, 64), leaf(1, tokens, 1, 64), leaf(1, tokens, 1, 64)
    dt, a, d = leaf(1, tokens, 8, dt=torch.float32), leaf(8, dt=torch.float32), leaf(8, dt=torch.float32)
    return {
        'linear_attention': run(lambda: linear_attention_triton(q, k, v, 'elu'), torch.randn_like),
        'ssd': run(lambda: ssd_scan_triton(x, dt, a, b, c, d, chunk_size=256), torch.randn_like),
    }
