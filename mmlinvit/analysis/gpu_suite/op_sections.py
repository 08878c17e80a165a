"""Sections 0-3 of the GPU suite: ceilings, kernel correctness, linear attention and SSD ops.

* :func:`section_ceilings`: a 1 GiB device-to-device copy and an 8192^3 bf16 matmul;
* :func:`section_check`: the Triton kernels against the PyTorch paths
  (:mod:`mmlinvit.analysis.kernel_checks`), forward and backward;
* :func:`section_linear_attention`: the Triton kernel, the PyTorch path and each fused SDPA
  backend per N, with the kernel's bandwidth against the peak and the measured copy;
* :func:`section_ssd`: the Triton SSD scan against the vectorised PyTorch scan per L.

Each case runs through :meth:`~mmlinvit.analysis.gpu_suite.run.SuiteRun.run_case`.
"""
import contextlib
import importlib
from types import ModuleType
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F

from mmlinvit.analysis.kernel_checks import (check_linear_attention, check_ssd, make_qkv,
                                             make_ssd_inputs)

from .metadata import L2_RULE_TOKENS, l2_bytes
from .run import SuiteRun
from .sdpa import SDPA_BACKENDS, attention_kernels, sdpa_context, sdpa_unavailable
from .sizes import Sizes
from .timing import bench_ms, try_graph_ms
from .verdicts import ratio

DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16}
#: What section 3 times as the PyTorch scan (also in the JSON).
SSD_TORCH_FORM = ('ssd_scan_torch, vectorised chunked form (INFERENCE_FORM=False: all chunks '
                  'of chunk_size tokens in one step; autograd form for f+b)')


def triton_kernels(device: torch.device) -> Tuple[ModuleType, ModuleType]:
    """The Triton modules (linear attention, SSD), imported through the dispatchers' rules.

    Args:
        device: The device the kernels run on.

    Raises:
        RuntimeError: A dispatcher did not choose its Triton kernel.
    """
    from mmlinvit.ops.linear_attention import select_backend
    from mmlinvit.ops.ssd import select_ssd_backend
    probe = torch.zeros(1, 1, 1, 16, device=device)
    if select_backend(probe, probe, probe, backend='triton') != 'triton':
        raise RuntimeError('the linear attention dispatcher did not choose the Triton kernel')
    leaves = make_ssd_inputs(1, 4, 2, 16, 1, 16, torch.float32, device)
    if select_ssd_backend(*leaves, backend='triton') != 'triton':
        raise RuntimeError('the SSD dispatcher did not choose the Triton kernel')
    from mmlinvit.ops.linear_attention import triton_kernel as la_kernel
    from mmlinvit.ops.ssd import triton_kernel as ssd_kernel
    return la_kernel, ssd_kernel


def section_ceilings(device: torch.device) -> Dict[str, Optional[float]]:
    """Measured ceilings: device-to-device copy (bytes read + written) and a bf16 matmul.

    Args:
        device: The device (CPU: both None).
    """
    if device.type != 'cuda':
        return {'copy TB/s': None, 'bf16 matmul TFLOP/s': None}
    src = torch.randn(2**29, device=device, dtype=torch.bfloat16)  # 1 GiB
    dst = torch.empty_like(src)
    t_copy = bench_ms(lambda: dst.copy_(src), device, 10)
    src = dst = None  # free before the matmul operands
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    t_mm = bench_ms(lambda: a @ b, device, 10)
    a = b = None
    torch.cuda.empty_cache()
    return {'copy TB/s': 2 * 2**30 / (t_copy * 1e-3) / 1e12,
            'bf16 matmul TFLOP/s': 2 * 8192**3 / (t_mm * 1e-3) / 1e12}


def section_check(run: SuiteRun, sizes: Sizes, la_rows: List[Dict[str, object]],
                  ssd_rows: List[Dict[str, object]]) -> None:
    """Fills ``la_rows`` / ``ssd_rows`` with the check rows (a case that raises: ``ok`` =
    ``'ERROR'`` and its ``error``).

    Args:
        run: The suite run.
        sizes: The run's sizes.
        la_rows: The linear attention check rows (filled).
        ssd_rows: The SSD check rows (filled).
    """
    device, dry = run.device, run.dry
    la_kernel, kernel = triton_kernels(device)
    h, d = sizes.la_heads, sizes.la_head_dim

    def case(rows: List[Dict[str, object]], row: Dict[str, object],
             check: Callable[[], Dict[str, object]]) -> None:
        rows.append(row)

        def body() -> None:
            done = check()
            row.clear()
            row.update(done)

        if not run.run_case(f'check {row["kernel"]} {row["case"]} {row["dtype"]}', [row], body):
            row['ok'] = 'ERROR'

    la_cases = [('elu', n, n, h, d, d, dtype, 'elu') for dtype in DTYPES.values()
                for n in sizes.la_check_tokens] + list(sizes.extra_la_cases)
    for c in la_cases:
        case(la_rows, dict(kernel='linear-attn', case=c[0], dtype=str(c[6]).split('.')[-1]),
             lambda c=c: check_linear_attention(la_kernel, *c, device))
    s = sizes.ssd_shape
    ssd_cases = [('adventurer', 1, length, s['heads'], s['headdim'], s['groups'], s['d_state'],
                  s['chunk'], dtype) for dtype in DTYPES.values()
                 for length in sizes.ssd_check_lengths]
    small = min(sizes.ssd_check_lengths)
    ssd_cases.append(('ragged groups P48 N40' if not dry else 'ragged groups', 2, small + 37, 4,
                      48 if not dry else 12, 2, 40 if not dry else 10, s['chunk'],
                      torch.bfloat16))
    for c in ssd_cases:
        case(ssd_rows, dict(kernel='ssd', case=c[0], dtype=str(c[-1]).split('.')[-1]),
             lambda c=c: check_ssd(kernel, *c, device))


def section_linear_attention(run: SuiteRun, sizes: Sizes, peak_bw: Optional[float],
                             rows: List[Dict[str, object]],
                             sdpa_rows: List[Dict[str, object]]) -> None:
    """Fills ``rows`` (one per N: the Triton kernel, the torch path, bandwidth) and
    ``sdpa_rows`` (per N: the default dispatch's kernel, then each of :data:`SDPA_BACKENDS`
    timed, or skipped with the reason).

    Args:
        run: The suite run (its :attr:`~SuiteRun.copy_bw` gives the ``fwd vs copy`` column).
        sizes: The run's sizes.
        peak_bw: Peak HBM bandwidth in B/s (None: the fractions of peak are None).
        rows: The Triton kernel rows (filled).
        sdpa_rows: The SDPA rows (filled).
    """
    device = run.device
    la_kernel, _ = triton_kernels(device)
    from mmlinvit.ops.linear_attention import linear_attention
    dtype = torch.bfloat16 if not run.dry else torch.float32
    h, d = sizes.la_heads, sizes.la_head_dim
    l2 = l2_bytes(device)

    def inputs(n: int) -> Tuple[torch.Tensor, ...]:
        q, k, v = make_qkv(n, n, h, d, d, dtype, device)
        return q, k, v, torch.randn_like(q)

    def fwd_bwd(fn: Callable[..., torch.Tensor], q, k, v, grad) -> Callable[[], None]:
        def call():
            torch.autograd.grad(fn(q, k, v), (q, k, v), grad)
        return call

    def triton_case(row: Dict[str, object]) -> None:
        n = row['N']
        q, k, v, grad = inputs(n)
        nbytes = q.numel() * q.element_size()
        tri = lambda: la_kernel.linear_attention_triton(q, k, v, 'elu')  # noqa: E731
        tri_fb = fwd_bwd(lambda a, b, c: la_kernel.linear_attention_triton(a, b, c, 'elu'),
                         q, k, v, grad)
        with torch.no_grad():
            row['triton ms'] = bench_ms(tri, device, sizes.repeats)
            row['graph triton ms'], why = try_graph_ms(tri, device, row['triton ms'])
        row['triton f+b ms'] = bench_ms(tri_fb, device, sizes.repeats)
        row['graph triton f+b ms'], why_fb = try_graph_ms(tri_fb, device, row['triton f+b ms'])
        with torch.no_grad():
            row['torch ms'] = bench_ms(lambda: linear_attention(q, k, v, 'elu', backend='torch'),
                                       device, sizes.repeats)
        row['torch/triton'] = ratio(row['torch ms'], row['triton ms'])
        # bandwidth of the kernels themselves: graph replays where capture worked
        t_bw = row['graph triton ms'] or row['triton ms']
        t_bw_fb = row['graph triton f+b ms'] or row['triton f+b ms']
        row['BW from'] = '/'.join('graph' if w is None else 'eager'
                                  for w in (why, why_fb))  # fwd/f+b
        if device.type == 'cuda' and (why or why_fb):
            row['BW note'] = f'eager times used: {why or why_fb}'
        row['fwd traffic MiB'] = 4 * nbytes / 2**20  # q, k, v read + out written
        row['in L2'] = 'yes' if (4 * nbytes <= l2 if l2 else n < L2_RULE_TOKENS) else 'no'
        bytes_per_s = 4 * nbytes / (t_bw * 1e-3)
        row['HBM fwd'] = bytes_per_s / peak_bw if peak_bw else None
        row['HBM f+b'] = 11 * nbytes / (t_bw_fb * 1e-3) / peak_bw if peak_bw else None
        row['fwd vs copy'] = bytes_per_s / (run.copy_bw * 1e12) if run.copy_bw else None
        row['target >=0.7'] = ('-' if row['in L2'] == 'yes' or n < L2_RULE_TOKENS
                               or row['HBM fwd'] is None
                               else 'met' if row['HBM fwd'] >= 0.7 else 'NOT met')

    def sdpa_case(row: Dict[str, object]) -> None:
        n, backend = row['N'], row['sdpa']
        q, k, v, grad = inputs(n)
        fwd = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
        if backend != 'default':
            reason = sdpa_unavailable(fwd, backend)
            if reason:
                row['skipped'] = reason
                return
        with sdpa_context(backend):
            row.update(attention_kernels(fwd, device))
        if backend == 'default':  # recorded, not timed: it is one of the forced backends
            return
        tri = next((r for r in rows if r['N'] == n), None) or {}
        with sdpa_context(backend):
            with torch.no_grad():
                row['ms'] = bench_ms(fwd, device, sizes.repeats)
                row['sdpa/triton'] = ratio(row['ms'], tri.get('triton ms'))
                row['graph ms'], _ = try_graph_ms(fwd, device, row['ms'])
                row['graph sdpa/triton'] = ratio(row['graph ms'], tri.get('graph triton ms'))
            fb = fwd_bwd(F.scaled_dot_product_attention, q, k, v, grad)
            row['f+b ms'] = bench_ms(fb, device, sizes.repeats)
            row['f+b sdpa/triton'] = ratio(row['f+b ms'], tri.get('triton f+b ms'))

    for n in sizes.la_bench_tokens:
        row: Dict[str, object] = {'N': n}
        rows.append(row)
        run.run_case(f'la triton N={n}', [row], lambda row=row: triton_case(row))
        for backend in ('default', ) + tuple(SDPA_BACKENDS):
            srow: Dict[str, object] = {'N': n, 'sdpa': backend}
            sdpa_rows.append(srow)
            run.run_case(f'la sdpa-{backend} N={n}', [srow], lambda srow=srow: sdpa_case(srow))


@contextlib.contextmanager
def ssd_torch_vectorised() -> Iterator[None]:
    """Within the block the PyTorch SSD scan runs its vectorised chunked form without
    autograd too (``torch_impl.INFERENCE_FORM = False``, read at call time; restored after):
    all chunks of ``chunk_size`` tokens in one batched step, the form a GPU should be compared
    with (the inference form loops over chunks of 64 in Python, tuned for CPU caches)."""
    torch_impl = importlib.import_module('mmlinvit.ops.ssd.torch_impl')
    before = torch_impl.INFERENCE_FORM
    torch_impl.INFERENCE_FORM = False
    try:
        yield
    finally:
        torch_impl.INFERENCE_FORM = before


def section_ssd(run: SuiteRun, sizes: Sizes, rows: List[Dict[str, object]]) -> None:
    """Fills ``rows``: per L, the Triton scan vs the vectorised PyTorch scan.

    Args:
        run: The suite run.
        sizes: The run's sizes.
        rows: The SSD rows (filled).
    """
    device = run.device
    _, kernel = triton_kernels(device)
    from mmlinvit.ops.ssd import ssd_scan_torch
    s = sizes.ssd_shape
    dtype = torch.bfloat16 if not run.dry else torch.float32

    def case(row: Dict[str, object]) -> None:
        length = row['L']
        leaves = make_ssd_inputs(1, length, s['heads'], s['headdim'], s['groups'], s['d_state'],
                                 dtype, device)
        grad = torch.randn(1, length, s['heads'], s['headdim'], device=device).to(dtype)

        def fb(fn):
            def call():
                torch.autograd.grad(fn(*leaves, chunk_size=s['chunk']), leaves, grad)
            return call

        tri = lambda: kernel.ssd_scan_triton(*leaves, chunk_size=s['chunk'])  # noqa: E731
        ref = lambda: ssd_scan_torch(*leaves, chunk_size=s['chunk'])  # noqa: E731
        with torch.no_grad():
            row['triton ms'] = bench_ms(tri, device, sizes.repeats)
            row['graph triton ms'], _ = try_graph_ms(tri, device, row['triton ms'])
            with ssd_torch_vectorised():  # eager only: it reads A / dt on the host
                row['torch ms'] = bench_ms(ref, device, sizes.repeats)
        row['torch/triton'] = ratio(row['torch ms'], row['triton ms'])
        row['triton f+b ms'] = bench_ms(fb(kernel.ssd_scan_triton), device, sizes.repeats)
        row['torch f+b ms'] = bench_ms(fb(ssd_scan_torch), device, sizes.repeats)
        row['f+b torch/triton'] = ratio(row['torch f+b ms'], row['triton f+b ms'])

    for length in sizes.ssd_bench_lengths:
        row: Dict[str, object] = {'L': length}
        rows.append(row)
        run.run_case(f'ssd L={length}', [row], lambda row=row: case(row))
