"""Op-level benchmark: softmax SDPA vs non-causal linear attention (torch path, Triton kernel).

One run prints one table.  Per token count N (ViT-B head shape by default: B=1, H=12, d=64):

* time of ``F.scaled_dot_product_attention`` (softmax) and of the O(N) torch linear attention
  (``linear_attention(..., backend='torch')``, ELU+1 map) and their ratio (> 1: linear faster);
* peak extra memory of each call (see below);
* on CUDA additionally the Triton kernel (forward, forward+backward; SDPA forward+backward for
  the ratio) and its achieved memory bandwidth as a fraction of ``--peak-bw`` (H200: 4.8 TB/s),
  counting the minimal traffic: read q, k, v + write out (forward), plus read q, k, v, dout +
  write dq, dk, dv (backward).

Timing: median (``--stat``) over ``--repeats`` calls after one warm-up call (CUDA: events after
3 warm-ups); the compared functions are called round-robin so that both see the same background
load; a row stops repeating once it has used ``--max-seconds`` (softmax at 16k tokens on 2
cores takes seconds per call).

Memory: CPU: peak of live bytes allocated through the torch CPU allocator during the call,
from ``torch.profiler`` memory events (op self-allocations and frees, in time order), inputs
excluded, output included; measured in a separate, untimed call.  CUDA:
``torch.cuda.max_memory_allocated`` minus the allocation before the call.

Example::

    PYTHONPATH=. python tools/analysis/benchmark_attention_op.py --device cpu --threads 2
"""
import argparse
import statistics
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from mmlinvit.ops.linear_attention import linear_attention, triton_available

DTYPES = {'float32': torch.float32, 'float16': torch.float16, 'bfloat16': torch.bfloat16}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--dtype', choices=sorted(DTYPES), default=None,
                        help='default: float32 on CPU, bfloat16 on CUDA')
    parser.add_argument('--tokens', type=int, nargs='+', default=[197, 257, 1025, 4097, 16385])
    parser.add_argument('--repeats', type=int, default=None,
                        help='timed calls per cell (default 5 on CPU, 30 on CUDA)')
    parser.add_argument('--max-seconds', type=float, default=60.0,
                        help='stop repeating a row after this many seconds')
    parser.add_argument('--stat', choices=['median', 'min'], default='median',
                        help='statistic over the timed calls')
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--heads', type=int, default=12)
    parser.add_argument('--head-dim', type=int, default=64)
    parser.add_argument('--feature-map', default='elu', choices=['elu', 'relu', 'identity'])
    parser.add_argument('--threads', type=int, default=2, help='torch CPU threads (both sides)')
    parser.add_argument('--peak-bw', type=float, default=4.8e12,
                        help='peak memory bandwidth in B/s (H200: 4.8e12)')
    parser.add_argument('--no-memory', action='store_true', help='skip the memory columns')
    return parser.parse_args()


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def time_ms(fns: Dict[str, Callable[[], object]], device: torch.device, repeats: int,
            max_seconds: float, stat: str) -> Dict[str, float]:
    """Median (or min) wall time in ms of each function, calls interleaved round-robin.

    Interleaving exposes all candidates to the same background load (shared CPU boxes).
    """
    warmups = 3 if device.type == 'cuda' else 1
    for fn in fns.values():
        for _ in range(warmups):
            fn()
    _sync(device)
    times: Dict[str, List[float]] = {name: [] for name in fns}
    budget_start = time.perf_counter()
    for _ in range(repeats):
        for name, fn in fns.items():
            if device.type == 'cuda':
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end))
            else:
                start_s = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start_s) * 1e3)
        if time.perf_counter() - budget_start > max_seconds:
            break
    reduce = statistics.median if stat == 'median' else min
    return {name: reduce(values) for name, values in times.items()}


def cpu_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak live bytes the torch CPU allocator handed out during ``fn`` (profiler events)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    deltas = []
    for event in prof.events():
        if event.name == '[memory]':
            delta = event.cpu_memory_usage  # allocations/frees outside a recorded op
        else:
            delta = event.self_cpu_memory_usage  # allocations of the op itself, not children
        if delta:
            deltas.append((event.time_range.start, delta))
    deltas.sort(key=lambda item: item[0])
    live = peak = 0
    for _, delta in deltas:
        live += delta
        peak = max(peak, live)
    return peak


def cuda_peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def fwd_bwd(fn: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            grad: torch.Tensor) -> Callable[[], None]:
    """A closure running forward + backward (grads w.r.t. q, k, v)."""

    def run() -> None:
        out = fn(q, k, v)
        torch.autograd.grad(out, (q, k, v), grad)

    return run


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype or ('bfloat16' if device.type == 'cuda' else 'float32')]
    repeats = args.repeats or (30 if device.type == 'cuda' else 5)
    torch.set_num_threads(args.threads)
    on_cuda = device.type == 'cuda'
    use_triton = on_cuda and triton_available()
    fm = args.feature_map

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    def la_torch(q, k, v):
        return linear_attention(q, k, v, fm, backend='torch')

    def la_triton(q, k, v):
        return linear_attention(q, k, v, fm, backend='triton')

    rows: List[Dict[str, str]] = []
    for n in args.tokens:
        shape = (args.batch, args.heads, n, args.head_dim)
        q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
        row: Dict[str, str] = {'N': str(n)}
        with torch.no_grad():
            times = time_ms({'sdpa': lambda: sdpa(q, k, v), 'torch': lambda: la_torch(q, k, v)},
                            device, repeats, args.max_seconds, args.stat)
        t_sdpa, t_torch = times['sdpa'], times['torch']
        row['sdpa ms'] = f'{t_sdpa:.3f}'
        row['la-torch ms'] = f'{t_torch:.3f}'
        row['sdpa/la-torch'] = f'{t_sdpa / t_torch:.2f}x'
        if not args.no_memory:
            with torch.no_grad():
                if on_cuda:
                    m_sdpa = cuda_peak_bytes(lambda: sdpa(q, k, v), device)
                    m_torch = cuda_peak_bytes(lambda: la_torch(q, k, v), device)
                else:
                    m_sdpa = cpu_peak_bytes(lambda: sdpa(q, k, v))
                    m_torch = cpu_peak_bytes(lambda: la_torch(q, k, v))
            row['sdpa MiB'] = f'{m_sdpa / 2**20:.1f}'
            row['la-torch MiB'] = f'{m_torch / 2**20:.1f}'
        if use_triton:
            elem = torch.finfo(dtype).bits // 8
            tensor_bytes = q.numel() * elem
            with torch.no_grad():
                t_tri = time_ms({'triton': lambda: la_triton(q, k, v)}, device, repeats,
                                args.max_seconds, args.stat)['triton']
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            grad = torch.randn_like(q)
            times = time_ms({'sdpa': fwd_bwd(sdpa, qg, kg, vg, grad),
                             'triton': fwd_bwd(la_triton, qg, kg, vg, grad)}, device, repeats,
                            args.max_seconds, args.stat)
            t_sdpa_fb, t_tri_fb = times['sdpa'], times['triton']
            row['triton ms'] = f'{t_tri:.3f}'
            row['sdpa/triton'] = f'{t_sdpa / t_tri:.2f}x'
            row['sdpa f+b ms'] = f'{t_sdpa_fb:.3f}'
            row['triton f+b ms'] = f'{t_tri_fb:.3f}'
            row['f+b ratio'] = f'{t_sdpa_fb / t_tri_fb:.2f}x'
            row['triton BW'] = f'{4 * tensor_bytes / (t_tri * 1e-3) / args.peak_bw:.1%}'
            row['f+b BW'] = f'{11 * tensor_bytes / (t_tri_fb * 1e-3) / args.peak_bw:.1%}'
            if not args.no_memory:
                with torch.no_grad():
                    row['triton MiB'] = \
                        f'{cuda_peak_bytes(lambda: la_triton(q, k, v), device) / 2**20:.1f}'
        rows.append(row)
        del q, k, v

    header = list(rows[0].keys())
    widths = [max(len(h), *(len(r.get(h, '')) for r in rows)) for h in header]
    print(f'device={device} dtype={dtype} B={args.batch} H={args.heads} d={args.head_dim} '
          f'feature_map={fm} threads={torch.get_num_threads()} {args.stat} of <={repeats} '
          f'torch={torch.__version__}')
    if not args.no_memory:
        print('memory: ' + ('cuda max_memory_allocated delta' if on_cuda else
                            'peak live torch-allocator bytes during the call (torch.profiler), '
                            'inputs excluded'))
    print('  '.join(h.rjust(w) for h, w in zip(header, widths)))
    for r in rows:
        print('  '.join(r.get(h, '').rjust(w) for h, w in zip(header, widths)))


if __name__ == '__main__':
    main()
