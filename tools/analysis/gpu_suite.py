"""One-GPU suite (<= 5 min on an H200): kernel correctness, kernel speed, whole backbones.

Sections (each prints a table; everything also goes to ``suite.json`` and ``suite.png`` in
``--out-dir``):

1. **Correctness** of the Triton kernels against the PyTorch paths, forward and backward
   (relative Frobenius error of the output and every input gradient), fp32 and bf16, ragged
   token counts (not multiples of any block), cross attention (N != M), ReLU at d = e = 128,
   a non-power-of-two head (48 -> 40), InLine; the SSD scan (Adventurer-B shapes, ragged L,
   groups, P / N not powers of two) against the chunked PyTorch scan.  The reference is run in
   fp32 on the same (rounded) inputs.  Exit code 1 if any check fails.
2. **Linear attention op** at 1k-64k tokens (B=1, H=16, d=64, ELU+1, bf16): Triton forward and
   forward + backward, the PyTorch path (chunked, forward), SDPA (FlashAttention for 16-bit,
   forward and forward + backward), ratios, and the Triton kernel's achieved HBM bandwidth
   as a fraction of ``--peak-bw`` counting the minimal traffic (forward: read q, k, v, write
   out = 4 tensors; forward + backward: that plus read q, k, v, dout and write dq, dk, dv =
   11 tensors); target >= 70 % at N >= 16k.
3. **SSD scan** (Adventurer-B: H=24, P=64, N=64, chunk 256, bf16 x / B / C): Triton vs the
   chunked PyTorch scan, forward and forward + backward.
4. **Whole backbones** (random weights, bf16, batch 1, inference): ViT-L/14 softmax (SDPA) vs
   ELU + Triton at 518, 1024, 2048; Adventurer-B vs ViT-B/16 softmax at 512x1024 and
   1024x2048; time and peak activation memory (``max_memory_allocated`` during the call minus
   the allocation before it: weights excluded).  Target: ViT-L/14 at 1024 >= 1.7x the softmax
   model at <= 40 % of its memory.

0. **Ceilings** measured first: a 1 GiB device-to-device copy (bytes read + written) and an
   8192^3 bf16 matmul; section 2 also gives the kernel's bandwidth against the measured copy.
4b. **Profile**: device time per kernel (torch.profiler) of one forward of each ViT-L/14 at
   1024 and of Adventurer-B at the larger pair size.
5. **Launch sweeps**: tile sizes / warps / stages / programs of the linear attention and SSD
   kernels (``_LaunchConfig`` fields overridden one variant at a time), each timed by CUDA
   graph replay and checked against the default launch's outputs; ``--sweep-budget-s`` bounds
   it.  The data the defaults are chosen from.

Sections 2-4 time eagerly (CUDA events per call: host launch overhead included, as a user
sees it) and by CUDA graph replay (the device's own time; the kernel bandwidth figures use
it).  A failing section prints its traceback and the rest still run; ``suite.json`` is
rewritten after each section.

``--dry-run`` runs every section at tiny sizes on CPU with ``TRITON_INTERPRET=1`` (the Triton
interpreter; set before triton is imported), so CI proves the script works before a GPU is
there (tests/analysis/test_gpu_suite_dry_run.py).  Its timings and bandwidths are
meaningless; its correctness checks are real.

Examples::

    PYTHONPATH=. python tools/analysis/gpu_suite.py                 # on the GPU machine
    PYTHONPATH=. python tools/analysis/gpu_suite.py --dry-run --out-dir /tmp/suite
"""
import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Dict, Iterator, List, Optional, Tuple

if __name__ == '__main__' and '--dry-run' in sys.argv:
    os.environ['TRITON_INTERPRET'] = '1'  # before anything imports triton

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mmlinvit.analysis.kernel_checks import (check_linear_attention,  # noqa: E402
                                             check_ssd, make_qkv, make_ssd_inputs)
from mmlinvit.utils.benchmarking import (cuda_peak_memory, print_table,  # noqa: E402
                                         rel_err, time_round_robin)

#: Sections in run order (``--sections`` picks a subset).
SECTIONS = ('ceilings', 'check', 'la', 'ssd', 'backbones', 'profile', 'sweeps')
#: Peak HBM bandwidth (B/s) by device-name substring; ``--peak-bw`` overrides.
PEAK_BW = {'H200': 4.8e12, 'H100': 3.35e12, 'A100': 2.0e12, 'L40': 0.864e12}
DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16}


@dataclass
class Sizes:
    """Problem sizes of one suite run (full GPU run or ``--dry-run``)."""
    la_check_tokens: List[int]
    la_heads: int
    la_head_dim: int
    la_bench_tokens: List[int]
    ssd_check_lengths: List[int]
    ssd_shape: Dict[str, int]
    ssd_bench_lengths: List[int]
    vit_l: object
    vit_l_sizes: List[Tuple[int, int]]
    vit_b: object
    adventurer_b: object
    adventurer_mixer: Optional[dict]
    pair_sizes: List[Tuple[int, int]]
    repeats: int
    extra_la_cases: List[tuple] = field(default_factory=list)
    sweep_tokens: Tuple[int, int] = (16384, 65536)
    sweep_ssd_length: int = 16384
    sweep_programs: Tuple[int, ...] = (132, 264, 1056)
    sweep_programs_out: Tuple[int, ...] = (264, 528, 1056, 2112)
    sweep_limit: Optional[int] = None  # most variants per list (dry run: a few)


def full_sizes() -> Sizes:
    return Sizes(
        la_check_tokens=[1000, 4097, 16411], la_heads=16, la_head_dim=64,
        la_bench_tokens=[1024, 4096, 16384, 65536],
        ssd_check_lengths=[1024, 4133], ssd_shape=dict(heads=24, headdim=64, d_state=64,
                                                       groups=1, chunk=256),
        ssd_bench_lengths=[1024, 4096, 16384, 65536],
        vit_l='l', vit_l_sizes=[(518, 518), (1024, 1024), (2048, 2048)],
        vit_b='b', adventurer_b='b', adventurer_mixer=None,
        pair_sizes=[(512, 1024), (1024, 2048)], repeats=10,
        extra_la_cases=[  # (name, N, M, H, d, e, dtype, mode)
            ('relu d=e=128', 4097, 4097, 4, 128, 128, torch.bfloat16, 'relu'),
            ('relu d=e=128 fp32', 1000, 1000, 4, 128, 128, torch.float32, 'relu'),
            ('elu d=48 e=40 ragged', 4101, 4101, 4, 48, 40, torch.float16, 'elu'),
            ('inline', 4097, 4097, 16, 64, 64, torch.bfloat16, 'inline'),
            ('inline fp32 ragged', 1001, 1001, 16, 64, 64, torch.float32, 'inline'),
            ('elu cross N!=M', 977, 3079, 16, 64, 64, torch.bfloat16, 'elu'),
        ])


def dry_sizes() -> Sizes:
    tiny_vit = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
    return Sizes(
        la_check_tokens=[37, 70], la_heads=2, la_head_dim=16, la_bench_tokens=[64, 130],
        ssd_check_lengths=[40], ssd_shape=dict(heads=2, headdim=16, d_state=16, groups=1,
                                               chunk=16),
        ssd_bench_lengths=[48],
        vit_l=tiny_vit, vit_l_sizes=[(28, 28), (42, 42)],
        vit_b=tiny_vit, adventurer_b=dict(embed_dims=32, num_layers=2),
        adventurer_mixer=dict(d_state=16, headdim=16, chunk_size=16),
        pair_sizes=[(32, 48)], repeats=1,
        extra_la_cases=[('elu d=12 e=10 ragged', 29, 29, 2, 12, 10, torch.float16, 'elu'),
                        ('inline', 33, 33, 2, 16, 16, torch.bfloat16, 'inline'),
                        ('elu cross N!=M', 17, 41, 2, 16, 16, torch.bfloat16, 'elu')],
        sweep_tokens=(40, 70), sweep_ssd_length=40, sweep_programs=(4, ), sweep_programs_out=(2, ), sweep_limit=2)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--dry-run', action='store_true',
                        help='tiny sizes on CPU with TRITON_INTERPRET=1 (CI)')
    parser.add_argument('--out-dir', default=os.path.join(ROOT, 'work_dirs', 'gpu_suite'))
    parser.add_argument('--peak-bw', type=float, default=None,
                        help='peak HBM bandwidth in B/s (default: by device name, H200 4.8e12)')
    parser.add_argument('--sections', nargs='+', default=list(SECTIONS), choices=list(SECTIONS))
    parser.add_argument('--sweep-budget-s', type=float, default=120.0,
                        help='the sweeps stop starting variants after this many seconds')
    parser.add_argument('--sweep-kernels', nargs='+', default=['la', 'ssd'],
                        choices=['la', 'ssd'], help='kernels the sweeps cover')
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------- helpers
def bench_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median ms of ``fn`` (CUDA events after 2 warm-ups; CPU: perf_counter after 1)."""
    warmups = 2 if device.type == 'cuda' else 1
    return time_round_robin({'fn': fn}, device, repeats, warmups=warmups)['fn']


def graph_ms(fn: Callable[[], object], device: torch.device, replays: int = 20,
             rounds: int = 5) -> Optional[float]:
    """Median ms per replay of ``fn`` captured in a CUDA graph (None on CPU).

    Replays leave out the host's launch overhead (Python dispatch of every kernel): this is
    the time the device needs, the number to set against the bytes moved.
    """
    if device.type != 'cuda':
        return None
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize(device)
    times = []
    for _ in range(rounds):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / replays)
    del graph
    torch.cuda.empty_cache()
    return sorted(times)[len(times) // 2]


def try_graph_ms(fn: Callable[[], object], device: torch.device) -> Optional[float]:
    """:func:`graph_ms`, or None (with the reason printed) where capture fails."""
    try:
        return graph_ms(fn, device)
    except Exception as exc:  # capture is a measurement aid: report and go on
        print(f'   (CUDA graph capture failed: {type(exc).__name__}: {str(exc)[:160]})')
        torch.cuda.synchronize(device)
        return None


def section_ceilings() -> Dict[str, Optional[float]]:
    """Measured ceilings: device-to-device copy (bytes read + written) and a bf16 matmul."""
    if DEVICE.type != 'cuda':
        return {'copy TB/s': None, 'bf16 matmul TFLOP/s': None}
    src = torch.randn(2**29, device=DEVICE, dtype=torch.bfloat16)  # 1 GiB
    dst = torch.empty_like(src)
    t_copy = bench_ms(lambda: dst.copy_(src), DEVICE, 10)
    del src, dst
    a = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    t_mm = bench_ms(lambda: a @ b, DEVICE, 10)
    del a, b
    torch.cuda.empty_cache()
    return {'copy TB/s': 2 * 2**30 / (t_copy * 1e-3) / 1e12,
            'bf16 matmul TFLOP/s': 2 * 8192**3 / (t_mm * 1e-3) / 1e12}


def peak_mib(fn: Callable[[], object], device: torch.device) -> Optional[float]:
    """Peak allocation above the pre-call allocation (CUDA), None on CPU."""
    if device.type != 'cuda':
        fn()
        return None
    return cuda_peak_memory(fn, device)[0]


def print_section(title: str, rows: List[Dict[str, object]]) -> None:
    """``title``, then ``rows`` as a table (floats with 3 significant digits)."""
    print(title)
    if not rows:
        return
    cols = list(dict.fromkeys(k for r in rows for k in r))

    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f'{v:.3g}' if abs(v) < 1e4 else f'{v:.0f}'
        return '-' if v is None else str(v)

    print_table(cols, [{c: fmt(r.get(c)) for c in cols} for r in rows], indent='  ',
                rule=False)


# ---------------------------------------------------------------------------------- kernels
def _kernels():
    """The Triton modules, imported through the dispatchers' rules."""
    from mmlinvit.ops.linear_attention import select_backend
    from mmlinvit.ops.ssd import select_ssd_backend
    probe = torch.zeros(1, 1, 1, 16, device=DEVICE)
    if select_backend(probe, probe, probe, backend='triton') != 'triton':
        raise RuntimeError('the linear attention dispatcher did not choose the Triton kernel')
    leaves = make_ssd_inputs(1, 4, 2, 16, 1, 16, torch.float32, DEVICE)
    if select_ssd_backend(*leaves, backend='triton') != 'triton':
        raise RuntimeError('the SSD dispatcher did not choose the Triton kernel')
    from mmlinvit.ops.linear_attention import triton_kernel as la_kernel
    from mmlinvit.ops.ssd import triton_kernel as ssd_kernel
    return la_kernel, ssd_kernel


def section_check(sizes: Sizes) -> Tuple[List[Dict[str, object]], List[Dict[str, object]]]:
    la_kernel, kernel = _kernels()
    la_rows = []
    h, d = sizes.la_heads, sizes.la_head_dim
    for dtype in DTYPES.values():
        for n in sizes.la_check_tokens:
            la_rows.append(check_linear_attention(la_kernel, 'elu', n, n, h, d, d, dtype, 'elu',
                                                  DEVICE))
    for case in sizes.extra_la_cases:
        la_rows.append(check_linear_attention(la_kernel, *case, DEVICE))
    ssd_rows = []
    s = sizes.ssd_shape
    for dtype in DTYPES.values():
        for length in sizes.ssd_check_lengths:
            ssd_rows.append(check_ssd(kernel, 'adventurer', 1, length, s['heads'], s['headdim'],
                                      s['groups'], s['d_state'], s['chunk'], dtype, DEVICE))
    small = min(sizes.ssd_check_lengths)
    ssd_rows.append(check_ssd(kernel, 'ragged groups P48 N40' if not DRY else 'ragged groups',
                              2, small + 37, 4, 48 if not DRY else 12, 2,
                              40 if not DRY else 10, s['chunk'], torch.bfloat16, DEVICE))
    return la_rows, ssd_rows


# ---------------------------------------------------------------------------------- timing
def section_linear_attention(sizes: Sizes, peak_bw: float) -> List[Dict[str, object]]:
    la_kernel, _ = _kernels()
    from mmlinvit.ops.linear_attention import linear_attention
    dtype = torch.bfloat16 if not DRY else torch.float32
    rows = []
    for n in sizes.la_bench_tokens:
        q, k, v = make_qkv(n, n, sizes.la_heads, sizes.la_head_dim, sizes.la_head_dim, dtype,
                           DEVICE)
        grad = torch.randn_like(q)
        nbytes = q.numel() * q.element_size()

        def fb(fn):
            def run():
                torch.autograd.grad(fn(q, k, v), (q, k, v), grad)
            return run

        with torch.no_grad():
            t_tri = bench_ms(lambda: la_kernel.linear_attention_triton(q, k, v, 'elu'), DEVICE,
                             sizes.repeats)
            t_torch = bench_ms(lambda: linear_attention(q, k, v, 'elu', backend='torch'),
                               DEVICE, sizes.repeats)
            t_sdpa = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v), DEVICE,
                              sizes.repeats)
        t_tri_fb = bench_ms(fb(lambda a, b, c: la_kernel.linear_attention_triton(a, b, c, 'elu')),
                            DEVICE, sizes.repeats)
        t_sdpa_fb = bench_ms(fb(F.scaled_dot_product_attention), DEVICE, sizes.repeats)
        with torch.no_grad():
            g_tri = try_graph_ms(lambda: la_kernel.linear_attention_triton(q, k, v, 'elu'),
                                 DEVICE)
            g_sdpa = try_graph_ms(lambda: F.scaled_dot_product_attention(q, k, v), DEVICE)
        g_tri_fb = try_graph_ms(
            fb(lambda a, b, c: la_kernel.linear_attention_triton(a, b, c, 'elu')), DEVICE)
        # bandwidth of the kernels themselves: graph replays where capture worked
        t_bw, t_bw_fb = g_tri or t_tri, g_tri_fb or t_tri_fb
        bw = 4 * nbytes / (t_bw * 1e-3) / peak_bw
        bw_fb = 11 * nbytes / (t_bw_fb * 1e-3) / peak_bw
        rows.append({'N': n, 'triton ms': t_tri, 'torch ms': t_torch, 'sdpa ms': t_sdpa,
                     'sdpa/triton': t_sdpa / t_tri, 'torch/triton': t_torch / t_tri,
                     'triton f+b ms': t_tri_fb, 'sdpa f+b ms': t_sdpa_fb,
                     'f+b sdpa/triton': t_sdpa_fb / t_tri_fb,
                     'graph triton ms': g_tri, 'graph sdpa ms': g_sdpa,
                     'graph sdpa/triton': (g_sdpa / g_tri) if g_sdpa and g_tri else None,
                     'graph triton f+b ms': g_tri_fb,
                     'HBM fwd': bw, 'HBM f+b': bw_fb,
                     'HBM fwd vs copy': (bw * peak_bw / (COPY_BW[0] * 1e12)
                                         if COPY_BW[0] else None),
                     'target >=0.7': ('met' if bw >= 0.7 else 'NOT met') if n >= 16384
                     else '-'})
        del q, k, v, grad
    return rows


def section_ssd(sizes: Sizes) -> List[Dict[str, object]]:
    _, kernel = _kernels()
    from mmlinvit.ops.ssd import ssd_scan_torch
    s = sizes.ssd_shape
    dtype = torch.bfloat16 if not DRY else torch.float32
    rows = []
    for length in sizes.ssd_bench_lengths:
        leaves = make_ssd_inputs(1, length, s['heads'], s['headdim'], s['groups'], s['d_state'],
                                 dtype, DEVICE)
        grad = torch.randn(1, length, s['heads'], s['headdim'], device=DEVICE).to(dtype)

        def fb(fn):
            def run():
                torch.autograd.grad(fn(*leaves, chunk_size=s['chunk']), leaves, grad)
            return run

        with torch.no_grad():
            t_torch = bench_ms(lambda: ssd_scan_torch(*leaves, chunk_size=s['chunk']), DEVICE,
                               sizes.repeats)
            t_tri = bench_ms(lambda: kernel.ssd_scan_triton(*leaves, chunk_size=s['chunk']),
                             DEVICE, sizes.repeats)
            g_tri = try_graph_ms(lambda: kernel.ssd_scan_triton(*leaves, chunk_size=s['chunk']),
                                 DEVICE)
        t_torch_fb = bench_ms(fb(ssd_scan_torch), DEVICE, sizes.repeats)
        t_tri_fb = bench_ms(fb(kernel.ssd_scan_triton), DEVICE, sizes.repeats)
        rows.append({'L': length, 'torch ms': t_torch, 'triton ms': t_tri,
                     'torch/triton': t_torch / t_tri, 'torch f+b ms': t_torch_fb,
                     'triton f+b ms': t_tri_fb, 'f+b torch/triton': t_torch_fb / t_tri_fb,
                     'graph triton ms': g_tri})
    return rows


def section_backbones(sizes: Sizes) -> List[Dict[str, object]]:
    from mmlinvit.backbones import Adventurer, VisionTransformer
    dtype = torch.bfloat16 if not DRY else torch.float32
    rows = []

    def measure(label: str, pair: str, model: torch.nn.Module, hw: Tuple[int, int]) -> None:
        model = model.to(device=DEVICE, dtype=dtype).eval()
        images = torch.randn(1, 3, hw[0], hw[1], device=DEVICE, dtype=dtype)
        with torch.no_grad():
            fn = lambda: model(images)  # noqa: E731
            fn()
            mem = peak_mib(fn, DEVICE)
            ms = bench_ms(fn, DEVICE, sizes.repeats)
            g_ms = try_graph_ms(fn, DEVICE)
        rows.append({'pair': pair, 'model': label, 'size': f'{hw[0]}x{hw[1]}', 'ms': ms,
                     'graph ms': g_ms, 'act MiB': mem})
        del model, images
        if DEVICE.type == 'cuda':
            torch.cuda.empty_cache()

    for hw in sizes.vit_l_sizes:
        for op in ('softmax', 'elu'):
            torch.manual_seed(0)
            model = VisionTransformer(sizes.vit_l, family='dinov2', patch_size=14, img_size=518,
                                      attn_cfg=op, out_type='featmap')
            measure(f'ViT-L/14 {op}', 'ViT-L/14', model, hw)
    for hw in sizes.pair_sizes:
        torch.manual_seed(0)
        measure('ViT-B/16 softmax', 'B-pair', VisionTransformer(
            sizes.vit_b, family='deit', attn_cfg='softmax', out_type='featmap'), hw)
        measure('Adventurer-B', 'B-pair', Adventurer(
            sizes.adventurer_b, mixer_cfg=sizes.adventurer_mixer, with_mask_token=False,
            out_type='featmap'), hw)
    # ratios against the softmax model of the same pair and size
    for r in rows:
        base = next(b for b in rows if b['pair'] == r['pair'] and b['size'] == r['size']
                    and 'softmax' in b['model'])
        r['speed x'] = base['ms'] / r['ms']
        r['graph speed x'] = (base['graph ms'] / r['graph ms']
                              if r['graph ms'] and base['graph ms'] else None)
        r['mem frac'] = (r['act MiB'] / base['act MiB']
                         if r['act MiB'] is not None and base['act MiB'] else None)
    return rows


# ---------------------------------------------------------------------------------- sweeps
@contextlib.contextmanager
def launch_config(module: ModuleType, **overrides: object) -> Iterator[None]:
    """Within the block, ``module``'s kernels launch with ``overrides`` set on the default
    ``_LaunchConfig`` (tile sizes, warps, stages): one variant of a launch-parameter sweep."""
    base = module._LaunchConfig

    class Variant(base):  # type: ignore[misc, valid-type]

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            for key, value in overrides.items():
                if not hasattr(self, key):
                    raise AttributeError(f'{module.__name__}._LaunchConfig has no {key!r}')
                setattr(self, key, value)

    module._LaunchConfig = Variant
    try:
        yield
    finally:
        module._LaunchConfig = base


def _sweep(module: ModuleType, variants: List[Dict[str, object]],
           cases: List[Tuple[str, Callable[[], object], Callable[[object], List[torch.Tensor]]]],
           deadline: float, exact: Optional[Dict[str, List[torch.Tensor]]] = None,
           exact_names: Optional[Dict[str, Tuple[str, ...]]] = None) -> List[Dict[str, object]]:
    """Times each launch variant on each case (graph replays on CUDA) and checks its outputs
    against the default configuration's (relative error; a variant that errs is reported).

    ``exact`` (case -> fp32 reference outputs) adds each variant's error against it, one column
    per output named in ``exact_names`` (else the largest)."""
    reference = {name: [t.float() for t in outputs(run())] for name, run, outputs in cases}
    rows = []
    for overrides in variants:
        if time.perf_counter() > deadline:
            rows.append({'variant': 'deadline reached: rest skipped'})
            break
        row: Dict[str, object] = {'variant': ' '.join(f'{k}={v}' for k, v in overrides.items())}
        try:
            with launch_config(module, **overrides):
                err = 0.0
                for name, run, outputs in cases:
                    got = outputs(run())
                    err = max([err] + [rel_err(g, w) for g, w in zip(got, reference[name])])
                    if exact and name in exact:
                        errs = [rel_err(g, w) for g, w in zip(got, exact[name])]
                        names = (exact_names or {}).get(name)
                        if names:
                            row.update({f'{n} err': e for n, e in zip(names, errs)})
                        else:
                            row[name + ' err vs fp32'] = max(errs)
                    row[name + ' ms'] = (graph_ms(run, DEVICE) if DEVICE.type == 'cuda'
                                         else bench_ms(run, DEVICE, 1))
                row['max rel err vs default'] = err
        except Exception as exc:  # a variant the compiler or the device refuses
            row['error'] = f'{type(exc).__name__}: {str(exc)[:120]}'
        rows.append(row)
    return rows


def section_sweeps(sizes: Sizes, deadline: float,
                   kernels: Tuple[str, ...] = ('la', 'ssd')) -> Dict[str, List[Dict[str, object]]]:
    """Launch-parameter sweeps of the linear attention and (``'ssd'`` in ``kernels``) the SSD
    kernels, forward and f+b."""
    la_kernel, ssd_kernel = _kernels()
    dtype = torch.bfloat16 if not DRY else torch.float32
    out: Dict[str, List[Dict[str, object]]] = {}
    n_small, n_big = sizes.sweep_tokens
    cases = []
    for n in (n_small, n_big):
        q, k, v = make_qkv(n, n, sizes.la_heads, sizes.la_head_dim, sizes.la_head_dim, dtype,
                           DEVICE)
        cases.append((f'fwd N={n}', _no_grad(
            lambda q=q, k=k, v=v: la_kernel.linear_attention_triton(q, k, v, 'elu')),
            lambda o: [o]))
    q, k, v = make_qkv(n_small, n_small, sizes.la_heads, sizes.la_head_dim, sizes.la_head_dim,
                       dtype, DEVICE)
    grad = torch.randn_like(q)
    cases.append((f'f+b N={n_small}', lambda: torch.autograd.grad(
        la_kernel.linear_attention_triton(q, k, v, 'elu'), (q, k, v), grad), list))
    lim = sizes.sweep_limit
    variants = [dict(block_state=bs, block_out=bo, num_warps=w, num_stages=st)
                for bs in (64, 128) for bo in (64, 128) for w in (4, 8) for st in (2, 3)][:lim]
    variants += [dict(block_bwd_q=bq, block_bwd_kv=bkv, num_warps_bwd=w)
                 for bq in (32, 64) for bkv in (32, 64, 128) for w in (4, 8)][:lim]
    variants += [dict(target_programs=tp) for tp in sizes.sweep_programs]
    variants += [dict(target_programs_out=tp, num_stages=st)
                 for tp in sizes.sweep_programs_out for st in (2, 3)][:lim]
    out['linear_attention'] = _sweep(la_kernel, variants, cases, deadline)
    if 'ssd' not in kernels:
        return out

    s = sizes.ssd_shape
    length = sizes.sweep_ssd_length
    leaves = make_ssd_inputs(1, length, s['heads'], s['headdim'], s['groups'], s['d_state'],
                             dtype, DEVICE)
    grad_y = torch.randn(1, length, s['heads'], s['headdim'], device=DEVICE).to(dtype)
    ssd_cases = [
        (f'fwd L={length}', _no_grad(
            lambda: ssd_kernel.ssd_scan_triton(*leaves, chunk_size=s['chunk'])), lambda o: [o]),
        (f'f+b L={length}', lambda: torch.autograd.grad(
            ssd_kernel.ssd_scan_triton(*leaves, chunk_size=s['chunk']), leaves, grad_y), list)]
    from mmlinvit.ops.ssd import ssd_scan_torch
    ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
    ref_out = ssd_scan_torch(*ref_leaves, chunk_size=s['chunk'])
    exact = {f'fwd L={length}': [ref_out.detach()],
             f'f+b L={length}': list(torch.autograd.grad(ref_out, ref_leaves, grad_y.float()))}
    variants = [dict(num_warps=w, num_stages=st, block_t=bt, block_p=bp)
                for w in (4, 8) for st in (2, 3) for bt in (32, 64) for bp in (32, 64)][:lim]
    variants += [dict(num_warps_bwd=w, block_t=bt, split_grad_dots=sp)
                 for sp in (True, False) for w in (4, 8) for bt in (32, 64)][:lim]
    out['ssd'] = _sweep(ssd_kernel, variants, ssd_cases, deadline, exact=exact,
                        exact_names={f'f+b L={length}': ('dx', 'ddt', 'dA', 'dB', 'dC', 'dD')})
    return out


def _no_grad(fn: Callable[[], object]) -> Callable[[], object]:
    def run():
        with torch.no_grad():
            return fn()
    return run


def section_profile(sizes: Sizes, top: int = 12) -> Dict[str, List[Dict[str, object]]]:
    """Device time per kernel (torch.profiler) of one forward of the ViT-L/14 pair at 1024
    and of Adventurer-B at the larger pair size: where the time of each model goes."""
    from torch.profiler import ProfilerActivity, profile

    from mmlinvit.backbones import Adventurer, VisionTransformer
    dtype = torch.bfloat16 if not DRY else torch.float32
    hw_l = sizes.vit_l_sizes[min(1, len(sizes.vit_l_sizes) - 1)]
    models = {f'ViT-L/14 {op} {hw_l[0]}': (lambda op=op: VisionTransformer(
        sizes.vit_l, family='dinov2', patch_size=14, img_size=518, attn_cfg=op,
        out_type='featmap'), hw_l) for op in ('softmax', 'elu')}
    hw_a = sizes.pair_sizes[-1]
    models[f'Adventurer-B {hw_a[0]}x{hw_a[1]}'] = (lambda: Adventurer(
        sizes.adventurer_b, mixer_cfg=sizes.adventurer_mixer, with_mask_token=False,
        out_type='featmap'), hw_a)
    activities = [ProfilerActivity.CUDA] if DEVICE.type == 'cuda' else [ProfilerActivity.CPU]
    out = {}
    for label, (build, hw) in models.items():
        torch.manual_seed(0)
        model = build().to(device=DEVICE, dtype=dtype).eval()
        images = torch.randn(1, 3, hw[0], hw[1], device=DEVICE, dtype=dtype)
        with torch.no_grad():
            model(images)
            synchronize_device()
            with profile(activities=activities) as prof:
                model(images)
                synchronize_device()
        key = 'device_time_total' if DEVICE.type == 'cuda' else 'cpu_time_total'
        events = [e for e in prof.key_averages() if getattr(e, key, 0) > 0]
        if DEVICE.type == 'cuda':
            events = [e for e in events if e.device_type.name == 'CUDA'] or events
        total = sum(getattr(e, key) for e in events) or 1.0
        events.sort(key=lambda e: getattr(e, key), reverse=True)
        out[label] = [{'kernel': e.key[:60], 'calls': e.count, 'ms': getattr(e, key) / 1e3,
                       'share': getattr(e, key) / total} for e in events[:top]]
        out[label].append({'kernel': 'TOTAL (all kernels)', 'calls': sum(e.count for e in events),
                           'ms': total / 1e3, 'share': 1.0})
        del model, images
        if DEVICE.type == 'cuda':
            torch.cuda.empty_cache()
    return out


def synchronize_device() -> None:
    if DEVICE.type == 'cuda':
        torch.cuda.synchronize(DEVICE)


def verdicts(la_rows: List[Dict[str, object]], bb_rows: List[Dict[str, object]]) -> List[str]:
    lines = []
    big = [r for r in la_rows if r['N'] >= 16384]
    if big:
        worst = min(r['HBM fwd'] for r in big)
        lines.append(f'kernel HBM bandwidth at N >= 16k: min {worst:.0%} of peak (target 70%): '
                     f'{"met" if worst >= 0.7 else "NOT met"}')
    elu = next((r for r in bb_rows if r['model'] == 'ViT-L/14 elu' and r['size'] == '1024x1024'),
               None)
    if elu is not None:
        mem = elu['mem frac']
        speed = max(x for x in (elu['speed x'], elu['graph speed x']) if x is not None)
        ok = speed >= 1.7 and mem is not None and mem <= 0.4
        graph = elu['graph speed x']
        lines.append(f"ViT-L/14 at 1024: {elu['speed x']:.2f}x the softmax model eager, "
                     f"{'-' if graph is None else f'{graph:.2f}x'} in CUDA graphs (target 1.7x) "
                     f"at {mem if mem is None else f'{mem:.0%}'} of its activation memory "
                     f"(target <= 40%): {'met' if ok else 'NOT met'}")
    return lines


def plot(result: Dict[str, object], path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    la = result.get('linear_attention') or []
    if la:
        n = [r['N'] for r in la]
        for key, style in (('triton ms', 'o-'), ('torch ms', 's-'), ('sdpa ms', 'x--'),
                           ('triton f+b ms', 'o:'), ('sdpa f+b ms', 'x:')):
            axes[0].plot(n, [r[key] for r in la], style, label=key)
        axes[0].set(xscale='log', yscale='log', xlabel='tokens N', ylabel='ms',
                    title='linear attention op (B=1)')
        axes[0].legend(fontsize=7)
        axes[1].plot(n, [r['HBM fwd'] for r in la], 'o-', label='fwd')
        axes[1].plot(n, [r['HBM f+b'] for r in la], 's-', label='fwd+bwd')
        axes[1].axhline(0.7, color='gray', linestyle='--', label='target 70%')
        axes[1].set(xscale='log', xlabel='tokens N', ylabel='fraction of peak HBM BW',
                    title='Triton kernel bandwidth')
        axes[1].legend(fontsize=7)
    bb = result.get('backbones') or []
    if bb:
        labels = [f"{r['model']}\n{r['size']}" for r in bb]
        axes[2].bar(range(len(bb)), [r['ms'] for r in bb],
                    color=['C0' if 'softmax' in r['model'] else 'C1' for r in bb])
        axes[2].set_xticks(range(len(bb)), labels, fontsize=6, rotation=60)
        axes[2].set(ylabel='ms (batch 1)', yscale='log', title='backbones')
    fig.suptitle(f"{result['device']} ({'dry run: timings meaningless' if DRY else 'bf16'})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


DEVICE = torch.device('cpu')
DRY = False
#: Measured copy bandwidth in TB/s (set by the ceilings section; None before / on CPU).
COPY_BW: List[Optional[float]] = [None]


def main(argv: Optional[List[str]] = None) -> int:
    global DEVICE, DRY
    args = parse_args(argv)
    DRY = args.dry_run
    if DRY:
        if os.environ.get('TRITON_INTERPRET') != '1':
            raise SystemExit('--dry-run needs TRITON_INTERPRET=1 set before triton is imported '
                             '(run the script directly, or export TRITON_INTERPRET=1)')
        os.environ['MMLINVIT_LINEAR_ATTN_BACKEND'] = 'triton'
        os.environ['MMLINVIT_SSD_BACKEND'] = 'triton'
        DEVICE = torch.device('cpu')
        sizes = dry_sizes()
        torch.set_num_threads(min(2, torch.get_num_threads()))
    else:
        if not torch.cuda.is_available():
            raise SystemExit('no CUDA device; run with --dry-run for the CPU smoke run')
        DEVICE = torch.device('cuda')
        sizes = full_sizes()
    from mmlinvit.ops.triton_utils import triton_available
    if not triton_available():
        raise SystemExit('the suite needs triton')
    import triton
    name = torch.cuda.get_device_name(DEVICE) if DEVICE.type == 'cuda' else 'CPU (interpreter)'
    peak_bw = args.peak_bw or next((bw for key, bw in PEAK_BW.items() if key in name), 4.8e12)
    os.makedirs(args.out_dir, exist_ok=True)
    result: Dict[str, object] = dict(device=name, torch=torch.__version__,
                                     triton=triton.__version__, dry_run=DRY, peak_bw=peak_bw)
    print(f'device: {name}  torch {torch.__version__}  triton {triton.__version__}  '
          f'peak BW {peak_bw / 1e12:.2f} TB/s{"  (DRY RUN: timings meaningless)" if DRY else ""}')
    t_start = time.perf_counter()
    json_path = os.path.join(args.out_dir, 'suite.json')
    result['errors'] = {}

    def run_section(name: str, fn: Callable[[], object]) -> object:
        """Runs one section; a failure is printed and recorded, and the next section runs."""
        if name not in args.sections:
            return None
        try:
            return fn()
        except Exception:  # one broken section must not cost the others' numbers
            import traceback
            trace = traceback.format_exc()
            print(f'section {name} FAILED:\n{trace}')
            result['errors'][name] = trace[-4000:]
            if DEVICE.type == 'cuda':
                torch.cuda.synchronize(DEVICE)
                torch.cuda.empty_cache()
            return None
        finally:
            result['seconds'] = time.perf_counter() - t_start
            with open(json_path, 'w') as f:  # after every section: a killed run keeps its part
                json.dump(result, f, indent=2)

    def elapsed() -> str:
        return f'[{time.perf_counter() - t_start:.0f} s]'

    def ceilings() -> None:
        result['ceilings'] = section_ceilings()
        COPY_BW[0] = result['ceilings']['copy TB/s']
        print_section(f'0. measured ceilings {elapsed()}:', [result['ceilings']])

    def check() -> bool:
        la_rows, ssd_rows = section_check(sizes)
        result['check_linear_attention'], result['check_ssd'] = la_rows, ssd_rows
        print_section('1. correctness, linear attention (rel. Frobenius error vs fp32 torch path):',
                      la_rows)
        print_section('   correctness, SSD scan (rel. error vs fp32 chunked torch scan):', ssd_rows)
        passed = all(r['ok'] == 'PASS' for r in la_rows + ssd_rows)
        print(f'   correctness {"PASSED" if passed else "FAILED"} {elapsed()}')
        return passed

    def la() -> List[Dict[str, object]]:
        rows = section_linear_attention(sizes, peak_bw)
        result['linear_attention'] = rows
        print_section(f'2. linear attention op, B=1 H={sizes.la_heads} d={sizes.la_head_dim} '
                      f'ELU+1 (median ms; graph = CUDA graph replay; HBM = fraction of '
                      f'{peak_bw / 1e12:.2f} TB/s from graph times) {elapsed()}:', rows)
        return rows

    def ssd() -> None:
        result['ssd'] = section_ssd(sizes)
        print_section(f'3. SSD scan {sizes.ssd_shape} (median ms) {elapsed()}:', result['ssd'])

    def backbones() -> List[Dict[str, object]]:
        rows = section_backbones(sizes)
        result['backbones'] = rows
        print_section('4. backbones, batch 1 inference (act MiB = peak above weights; speed x and '
                      f'mem frac vs the softmax model) {elapsed()}:', rows)
        return rows

    def profile_models() -> None:
        result['profile'] = section_profile(sizes)
        for name, rows in result['profile'].items():
            print_section(f'4b. device time per kernel, one forward of {name} {elapsed()}:', rows)

    def sweeps() -> None:
        result['sweeps'] = section_sweeps(sizes, time.perf_counter() + args.sweep_budget_s,
                                          tuple(args.sweep_kernels))
        for name, rows in result['sweeps'].items():
            print_section(f'5. launch sweep, {name} (graph ms; error vs the default launch) '
                          f'{elapsed()}:', rows)

    run_section('ceilings', ceilings)
    ok = run_section('check', check) is True or 'check' not in args.sections
    la_rows = run_section('la', la) or []
    run_section('ssd', ssd)
    bb_rows = run_section('backbones', backbones) or []
    run_section('profile', profile_models)
    run_section('sweeps', sweeps)
    lines = verdicts(la_rows, bb_rows)
    result['verdicts'] = lines
    result['correctness_ok'] = ok
    result['seconds'] = time.perf_counter() - t_start
    for line in lines:
        print(line)
    with open(json_path, 'w') as f:
        json.dump(result, f, indent=2)
    plot(result, os.path.join(args.out_dir, 'suite.png'))
    failed = sorted(result['errors'])
    print(f'total {result["seconds"]:.0f} s; correctness {"PASSED" if ok else "FAILED"}; '
          f'sections failed: {failed or "none"}; wrote {json_path} and suite.png')
    return 0 if ok and not failed else 1


if __name__ == '__main__':
    sys.exit(main())
