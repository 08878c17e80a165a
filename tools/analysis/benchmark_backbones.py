"""Whole-backbone benchmark: softmax (SDPA) vs linear attention operators (and Adventurer).

For every model (ViT-B/16 by default, ViT-L/14 with ``--large``), input size and operator, ONE
run measures two scopes and prints them side by side with their ratios to softmax:

* ``op``: the token mixing alone, ``operator.mix(q, k, v)`` on random per-head (1, H, N, d)
  inputs (SDPA for softmax, the O(N) kernel / PyTorch path for the linear operators; MHLA
  includes its block mixing and 5 x 5 local conv).  For Adventurer it is the block's whole
  Mamba-2 mixer on (1, N + 1, D) tokens (in/out projections included: the SSD scan is not
  separable from them), so its ``op`` ratio is not like-for-like;
* ``backbone``: the whole forward ``model(images)``, batch 1, random weights.

Timing: median over ``--repeats`` calls after the first (measuring) call, stopped early after
``--max-seconds``; CPU ``time.perf_counter``, CUDA events.  Memory (printed with the table):

* CPU: every (model, size, operator) runs in a fresh subprocess; before each measured call
  freed heap memory is handed back (``malloc_trim``) and the kernel's peak-RSS mark is reset
  (``/proc/self/clear_refs`` = 5); memory = peak RSS (``VmHWM``) during the call minus RSS just
  before it (weights and inputs excluded, output included).  Lazily loaded kernels and thread
  pools are made resident first by a warm-up call on a 2 x 2 patch grid.  Memory is measured
  in its own subprocess started with ``EXACT_RSS_ENV`` (glibc maps allocations of 1 MiB or more
  on their own), so the peak is that of the live tensors rather than of the allocator's
  history; the timings run in another subprocess with the default allocator.
* CUDA: ``torch.cuda.max_memory_allocated`` during the call minus the allocation before it,
  all cases in this process.

FLOPs (2 x MACs, :class:`mmlinvit.analysis.FlopCounter`) are counted on one call of the
measured function (the Adventurer's SSD scan at its configured ``chunk_size``, on every
backend: see :mod:`mmlinvit.analysis.flops`), so the table also gives the FLOP ratio, and
the closing lines compare the whole-backbone speed-up at 1024 x 1024 with the analytic FLOP ratio (issue convention: 24 N D^2 + 4 N^2 D vs
4 N d D per layer; counted FLOPs where an operator has no closed form).

A PNG (``--out-dir``) plots time and memory of both scopes against the token count.

``--compile`` also times the backbone compiled with ``torch.compile`` (inductor, static
shapes; eager stays the default everywhere else): columns ``compiled ms`` and
``eager/compiled`` (> 1: compiling pays), plus the one-off compile time.

Examples::

    # quick CPU run (a few minutes on 2 cores)
    PYTHONPATH=. python tools/analysis/benchmark_backbones.py --sizes 224 512 512x1024 1024 \\
        --repeats 2
    # GPU
    PYTHONPATH=. python tools/analysis/benchmark_backbones.py --device cuda --large
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mmlinvit.analysis import (ANALYTIC_OPERATORS, COMPARED_MODELS,  # noqa: E402
                               FLOP_CONVENTION, SMOKE_MODEL, FlopCounter, analytic_vit_flops)
from mmlinvit.layers.patch_embed import patch_grid  # noqa: E402
from mmlinvit.utils.benchmarking import (CpuPeakMemory, cuda_peak_memory,  # noqa: E402
                                         parse_size, print_table, run_case_phases,
                                         size_label, synchronize, timed_calls)

ADVENTURER_FILE = os.path.join(ROOT, 'mmlinvit', 'backbones', 'adventurer.py')
ADVENTURER = 'adventurer'
BASELINE = 'softmax'
SCOPES = ('op', 'backbone')

MODELS = dict(COMPARED_MODELS, tiny=SMOKE_MODEL)
DTYPES = {'float32': torch.float32, 'float16': torch.float16, 'bfloat16': torch.bfloat16}
DEFAULT_SIZES = ['224', '512', '512x1024', '1024x1024', '2048x2048']


# ---------------------------------------------------------------------------------- arguments
def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    parser.add_argument('--dtype', choices=sorted(DTYPES), default=None,
                        help='default: float32 on CPU, bfloat16 on CUDA')
    parser.add_argument('--sizes', nargs='+', type=parse_size,
                        default=[parse_size(s) for s in DEFAULT_SIZES],
                        help=f'input sizes, N or HxW (default: {" ".join(DEFAULT_SIZES)})')
    parser.add_argument('--operators', nargs='+', default=['elu', 'relu', 'inline', 'mhla'],
                        help='linear operators compared with softmax (always measured)')
    parser.add_argument('--no-adventurer', action='store_true', help='skip Adventurer')
    parser.add_argument('--large', action='store_true',
                        help='also benchmark ViT-L/14 (DINOv2 family; slow on CPU)')
    parser.add_argument('--tiny', action='store_true',
                        help='a 2-layer, 64-wide model instead of ViT-B/L (smoke tests)')
    parser.add_argument('--scopes', nargs='+', default=list(SCOPES), choices=SCOPES)
    parser.add_argument('--repeats', type=int, default=None,
                        help='timed calls per cell after the measuring call (default 3 on CPU, '
                        '20 on CUDA)')
    parser.add_argument('--max-seconds', type=float, default=30.0,
                        help='stop repeating a cell after this many seconds')
    parser.add_argument('--case-timeout', type=float, default=1800.0,
                        help='CPU: kill a case subprocess after this many seconds')
    parser.add_argument('--cpu-memory', default='subprocess', choices=['subprocess', 'inprocess'],
                        help="CPU: 'subprocess' (default) runs every case in a fresh "
                        "interpreter; 'inprocess' runs all cases here (fast smoke tests; "
                        'allocator state then carries over between cases)')
    parser.add_argument('--threads', type=int, default=2, help='torch CPU threads')
    parser.add_argument('--compile', action='store_true',
                        help='also time the backbone under torch.compile (inductor)')
    parser.add_argument('--out-dir', default=os.path.join(ROOT, 'work_dirs',
                                                          'benchmark_backbones'),
                        help='where the PNG and the JSON rows go')
    parser.add_argument('--child', default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f'--repeats must be >= 1, got {args.repeats}')
    unknown = [op for op in args.operators if op in (BASELINE, ADVENTURER)]
    if unknown:
        parser.error(f'--operators lists linear operators only; {unknown} are always included '
                     '(use --no-adventurer to drop Adventurer)')
    return args


def model_keys(args: argparse.Namespace) -> List[str]:
    if args.tiny:
        return ['tiny']
    return ['vit-b16'] + (['vit-l14'] if args.large else [])


def case_operators(args: argparse.Namespace) -> List[str]:
    ops = [BASELINE] + [op for op in args.operators]
    if not args.no_adventurer and os.path.exists(ADVENTURER_FILE):
        ops.append(ADVENTURER)
    return ops


# ---------------------------------------------------------------------------------- building
def build_backbone(model_key: str, operator: str, device: torch.device,
                   dtype: torch.dtype) -> torch.nn.Module:
    """The ViT with ``operator`` (or the Adventurer, with the ViT's patch size), random weights.
    """
    pair = MODELS[model_key]
    model = (pair.build_adventurer(pair.patch_size) if operator == ADVENTURER else
             pair.build_vit(operator))
    return model.to(device=device, dtype=dtype).eval()


def op_callable(model: torch.nn.Module, operator: str, hw: Tuple[int, int],
                device: torch.device, dtype: torch.dtype) -> Callable[[], object]:
    """The token-mixing call of the first block on random inputs for an (h, w) patch grid."""
    if operator == ADVENTURER:
        mixer = model.layers[0].mixer
        tokens = torch.randn(1, hw[0] * hw[1] + 2, model.embed_dims, device=device, dtype=dtype)
        return lambda: mixer(tokens)
    attn = model.blocks[0].attn
    n = hw[0] * hw[1] + model.num_prefix_tokens
    q, k, v = (torch.randn(1, attn.num_heads, n, attn.head_dims, device=device, dtype=dtype)
               for _ in range(3))
    return lambda: attn.mix(q, k, v, hw, model.num_prefix_tokens)


def backbone_callable(model: torch.nn.Module, hw_pixels: Tuple[int, int], device: torch.device,
                      dtype: torch.dtype) -> Callable[[], object]:
    images = torch.randn(1, 3, hw_pixels[0], hw_pixels[1], device=device, dtype=dtype)
    return lambda: model(images)


# ---------------------------------------------------------------------------------- measuring
def measure_compiled(model: torch.nn.Module, hw_pixels: Tuple[int, int], device: torch.device,
                     dtype: torch.dtype, repeats: int, max_seconds: float) -> Dict[str, float]:
    """Backbone time under ``torch.compile`` (inductor, static shapes) and compile time.

    Each case starts from a fresh compiler: in one process (CUDA, ``--cpu-memory inprocess``)
    the shared code objects' compiled variants added up over models and sizes until dynamo's
    recompile limit, after which the cases ran eager and were reported as compiled.  A case
    that still reaches the limit raises instead of timing eager code.
    """
    torch._dynamo.reset()
    compiled = torch.compile(model, dynamic=False)
    fn = backbone_callable(compiled, hw_pixels, device, dtype)
    with torch.no_grad(), torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        t0 = time.perf_counter()
        fn()  # compiles
        synchronize(device)
        compile_s = time.perf_counter() - t0
        times = timed_calls(fn, device, repeats, max_seconds)
    return dict(ms=statistics.median(times), calls=len(times), compile_s=compile_s)


def measure_case(model_key: str, operator: str, hw_pixels: Tuple[int, int], scopes: List[str],
                 device: torch.device, dtype: torch.dtype, repeats: int, max_seconds: float,
                 fresh_process: bool = True, compile_model: bool = False,
                 phases: Sequence[str] = ('memory', 'time')) -> Dict[str, object]:
    """Time, peak memory and counted FLOPs of each scope of one (model, size, operator).

    ``phases`` selects what is measured (the CPU subprocesses measure memory and time in two
    processes, see :func:`run_case_subprocess`).
    """
    patch = MODELS[model_key].patch_size
    grid = patch_grid(hw_pixels, patch)  # the corner-padded grid the model runs on
    model = build_backbone(model_key, operator, device, dtype)
    cpu_memory = CpuPeakMemory(fresh_process) if device.type == 'cpu' else None
    result: Dict[str, object] = dict(
        model=MODELS[model_key].label, operator=operator, size=size_label(hw_pixels),
        tokens=grid[0] * grid[1] + (1 if operator == ADVENTURER else model.num_prefix_tokens))
    with torch.inference_mode():
        # warm-up on a 2 x 2 patch grid, under the counter (whose first use imports modules;
        # the SSD scan takes its chunked form there) and outside it (the forms measured):
        # kernels, thread pools and lazy imports are resident before measuring
        for counted in (True, False, True, False):
            with FlopCounter() if counted else contextlib.nullcontext():
                op_callable(model, operator, (2, 2), device, dtype)()
                backbone_callable(model, (2 * patch, 2 * patch), device, dtype)()
        makers = dict(op=lambda: op_callable(model, operator, grid, device, dtype),
                      backbone=lambda: backbone_callable(model, hw_pixels, device, dtype))
        for scope in scopes:
            fn = makers[scope]()
            result[scope] = {}
            if 'memory' in phases:
                if cpu_memory is not None:
                    mem, out = cpu_memory.measure(fn)
                else:
                    mem, out = cuda_peak_memory(fn, device)
                result[scope]['mib'] = mem
                del out
            if 'time' in phases:  # a counted first call, then the timed calls
                with FlopCounter() as counter:
                    out = fn()
                del out
                times = timed_calls(fn, device, repeats, max_seconds)
                result[scope].update(ms=statistics.median(times), calls=len(times),
                                     gflops=counter.total / 1e9)
            del fn
    if compile_model and 'time' in phases:
        result['compiled'] = measure_compiled(model, hw_pixels, device, dtype, repeats,
                                              max_seconds)
    if cpu_memory is not None:
        result['memory_method'] = cpu_memory.method
    return result


def run_case_subprocess(args: argparse.Namespace, model_key: str, operator: str,
                        hw: Tuple[int, int], repeats: int) -> Dict[str, object]:
    """CPU: one fresh interpreter per case and phase (memory with ``EXACT_RSS_ENV``, then
    time with the default allocator); returns the merged JSON result (or an error row)."""
    def command(phase: str) -> List[str]:
        spec = dict(model=model_key, operator=operator, size=list(hw), scopes=args.scopes,
                    dtype=args.dtype, repeats=repeats, max_seconds=args.max_seconds,
                    threads=args.threads, compile=args.compile, phase=phase)
        return [sys.executable, os.path.abspath(__file__), '--child', json.dumps(spec)]

    try:
        return run_case_phases(command, args.threads, ROOT, args.case_timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        return dict(model=MODELS[model_key].label, operator=operator, size=size_label(hw),
                    error=str(err))


def child_main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    torch.set_num_threads(spec['threads'])
    dtype = DTYPES[spec['dtype'] or 'float32']
    result = measure_case(spec['model'], spec['operator'], tuple(spec['size']), spec['scopes'],
                          torch.device('cpu'), dtype, spec['repeats'], spec['max_seconds'],
                          compile_model=spec['compile'], phases=(spec['phase'], ))
    print(json.dumps(result))


# ---------------------------------------------------------------------------------- reporting
def analytic_ratio(model_key: str, operator: str, hw: Tuple[int, int]) -> Optional[float]:
    """softmax / operator FLOP ratio of the whole ViT in the issue's convention, if closed."""
    if operator not in ANALYTIC_OPERATORS:
        return None
    dims, patch = MODELS[model_key].vit_dims, MODELS[model_key].patch_size

    def total(op: str) -> int:
        return analytic_vit_flops(hw, patch, dims['embed_dims'], dims['num_layers'],
                                  dims['num_heads'], dims['mlp_hidden_dims'], op,
                                  exact=False).reference_total

    return total(BASELINE) / total(operator)


def _fmt(value: Optional[float], spec: str, suffix: str = '') -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '-'
    return format(value, spec) + suffix


def print_rows(rows: List[Dict[str, object]], scopes: List[str]) -> None:
    """The results table: per case, time / memory of each scope and the ratios to softmax."""
    cols = ['model', 'size', 'tokens', 'operator']
    for scope in scopes:
        cols += [f'{scope} ms'] + (['img/s'] if scope == 'backbone' else [])
        cols += [f'{scope} MiB', f'{scope} x', f'{scope} mem x']
    cols += ['FLOP x', 'x / FLOP x']
    if any('compiled' in r for r in rows):
        cols += ['compiled ms', 'eager/compiled', 'compile s']
    table = []
    for r in rows:
        base = next((b for b in rows if b['model'] == r['model'] and b['size'] == r['size']
                     and b['operator'] == BASELINE and 'error' not in b), None)
        line = {'model': r['model'], 'size': r['size'], 'tokens': str(r.get('tokens', '-')),
                'operator': r['operator']}
        if 'error' in r:
            line['op ms'] = r['error']
            table.append(line)
            continue
        for scope in scopes:
            cur = r[scope]
            line[f'{scope} ms'] = _fmt(cur['ms'], '.1f')
            if scope == 'backbone':
                line['img/s'] = _fmt(1e3 / cur['ms'], '.2f')
            line[f'{scope} MiB'] = _fmt(cur['mib'], '.1f')
            if base is not None:
                line[f'{scope} x'] = _fmt(base[scope]['ms'] / cur['ms'], '.2f', 'x')
                line[f'{scope} mem x'] = (_fmt(base[scope]['mib'] / cur['mib'], '.2f', 'x')
                                          if cur['mib'] > 0 else '-')
        if base is not None and 'backbone' in scopes:
            flop_x = base['backbone']['gflops'] / r['backbone']['gflops']
            line['FLOP x'] = _fmt(flop_x, '.2f', 'x')
            line['x / FLOP x'] = _fmt(
                base['backbone']['ms'] / r['backbone']['ms'] / flop_x, '.2f')
        if 'compiled' in r and 'backbone' in r:
            line['compiled ms'] = _fmt(r['compiled']['ms'], '.1f')
            line['eager/compiled'] = _fmt(r['backbone']['ms'] / r['compiled']['ms'], '.2f', 'x')
            line['compile s'] = _fmt(r['compiled']['compile_s'], '.0f')
        table.append(line)
    print_table(cols, table)


def print_flop_comparison(rows: List[Dict[str, object]], key_of_label: Dict[str, str]) -> None:
    """The 'whole backbone at 1024 x 1024 vs analytic FLOP ratio' lines."""
    for r in rows:
        if r['size'] != '1024' or r['operator'] == BASELINE or 'error' in r or \
                'backbone' not in r:
            continue
        base = next((b for b in rows if b['model'] == r['model'] and b['size'] == '1024'
                     and b['operator'] == BASELINE and 'error' not in b), None)
        if base is None:
            continue
        speed = base['backbone']['ms'] / r['backbone']['ms']
        analytic = analytic_ratio(key_of_label[r['model']], r['operator'], (1024, 1024))
        counted = base['backbone']['gflops'] / r['backbone']['gflops']
        flop_ratio, kind = (analytic, 'analytic') if analytic is not None else (counted,
                                                                                'counted')
        verdict = 'within 10%' if abs(speed / flop_ratio - 1) <= 0.10 else 'NOT within 10%'
        print(f'whole backbone at 1024x1024, {r["model"]} {r["operator"]}: measured speed ratio '
              f'{speed:.2f}x / {kind} FLOP ratio {flop_ratio:.2f}x = {speed / flop_ratio:.2f} '
              f'({verdict}; counted FLOP ratio {counted:.2f}x)')


def plot(rows: List[Dict[str, object]], scopes: List[str], path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r['model'] for r in rows))
    ops = list(dict.fromkeys(r['operator'] for r in rows))
    ncols = len(models) * len(scopes)
    fig, axes = plt.subplots(2, ncols, figsize=(4.5 * ncols, 7), squeeze=False)
    for mi, model in enumerate(models):
        for si, scope in enumerate(scopes):
            col = mi * len(scopes) + si
            for op in ops:
                pts = [r for r in rows if r['model'] == model and r['operator'] == op
                       and 'error' not in r and scope in r]
                if not pts:
                    continue
                pts.sort(key=lambda r: r['tokens'])
                tokens = [r['tokens'] for r in pts]
                style = dict(marker='o', linestyle='--' if op == BASELINE else '-', label=op)
                axes[0, col].plot(tokens, [r[scope]['ms'] for r in pts], **style)
                axes[1, col].plot(tokens, [max(r[scope]['mib'], 1e-3) for r in pts], **style)
            ticks = sorted({(r['tokens'], r['size']) for r in rows
                            if r['model'] == model and r['operator'] == BASELINE
                            and 'tokens' in r})
            for row, ylabel in ((0, 'time [ms]'), (1, 'peak memory [MiB]')):
                ax = axes[row, col]
                ax.set_xscale('log')
                ax.set_yscale('log')
                ax.set_xticks([t for t, _ in ticks], [f'{label}\nN={t}' for t, label in ticks],
                              fontsize=7)
                ax.minorticks_off()
                ax.set_xlabel('input size (tokens N)')
                ax.set_ylabel(ylabel)
                ax.grid(True, which='both', alpha=0.3)
                ax.set_title(f'{model} - {"attention op" if scope == "op" else "backbone"}')
            axes[0, col].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------- main
def main(argv: Optional[List[str]] = None) -> List[Dict[str, object]]:
    args = parse_args(argv)
    if args.child is not None:
        child_main(args.child)
        return []
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda requested but torch.cuda.is_available() is False')
    dtype_name = args.dtype or ('bfloat16' if device.type == 'cuda' else 'float32')
    args.dtype = dtype_name
    dtype = DTYPES[dtype_name]
    repeats = args.repeats or (20 if device.type == 'cuda' else 3)
    torch.set_num_threads(args.threads)
    os.makedirs(args.out_dir, exist_ok=True)

    rows: List[Dict[str, object]] = []
    key_of_label = {MODELS[k].label: k for k in MODELS}
    for model_key in model_keys(args):
        for hw in args.sizes:
            for op in case_operators(args):
                t0 = time.perf_counter()
                if device.type == 'cpu' and args.cpu_memory == 'subprocess':
                    row = run_case_subprocess(args, model_key, op, hw, repeats)
                else:
                    row = measure_case(model_key, op, hw, args.scopes, device, dtype, repeats,
                                       args.max_seconds, fresh_process=False,
                                       compile_model=args.compile)
                    if device.type == 'cuda':
                        torch.cuda.empty_cache()
                rows.append(row)
                status = row.get('error', 'ok')
                print(f'[{time.perf_counter() - t0:6.1f} s] {MODELS[model_key].label} '
                      f'{size_label(hw)} {op}: {status}', flush=True)

    print()
    device_name = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'
    print(f'device={device} ({device_name}) '
          f'dtype={dtype_name} batch=1 threads={torch.get_num_threads()} median of <= {repeats} '
          f'calls after the measuring call, torch={torch.__version__}')
    method = next((r['memory_method'] for r in rows if 'memory_method' in r), None)
    print('memory: ' + (method or 'torch.cuda.max_memory_allocated during the call minus the '
                        'allocation before it'))
    print(f'FLOPs: {FLOP_CONVENTION}; counted on the measured call')
    print("x = softmax time / operator time (> 1: faster than softmax); mem x = softmax peak / "
          "operator peak; img/s = 1000 / backbone ms (batch 1); 'op' = token mixing only "
          "(Adventurer: its whole Mamba-2 mixer); FLOP x = softmax / operator counted backbone "
          "FLOPs; x / FLOP x = backbone speed-up over FLOP ratio")
    print_rows(rows, args.scopes)
    print()
    if 'backbone' in args.scopes:
        print_flop_comparison(rows, key_of_label)
    png = os.path.join(args.out_dir, 'benchmark_backbones.png')
    plot(rows, args.scopes, png)
    with open(os.path.join(args.out_dir, 'benchmark_backbones.json'), 'w') as f:
        json.dump(rows, f, indent=2)
    print(f'plot: {png}')
    return rows


if __name__ == '__main__':
    main()
