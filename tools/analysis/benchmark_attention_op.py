"""Op-level benchmark: softmax SDPA vs non-causal linear attention (torch path, Triton kernel).

One run prints one table.  Per token count N (ViT-B head shape by default: B=1, H=12, d=64):

* time of ``F.scaled_dot_product_attention`` (softmax) and of the O(N) torch linear attention
  (``linear_attention(..., backend='torch')``: the chunked path with the feature map fused, ELU+1
  map) and their ratio (> 1: linear faster); with ``--graph-path`` also the whole-tensor form
  used under graph capture (:func:`~mmlinvit.ops.linear_attention.linear_attention_graph`);
* peak memory of each call and the ratio linear / SDPA (< 1: linear smaller), side by side;
* with ``--backward`` the same for forward + backward (grads of q, k, v);
* on CUDA additionally the Triton kernel (forward, forward+backward; SDPA forward+backward for
  the ratio) and its achieved memory bandwidth as a fraction of ``--peak-bw`` (H200: 4.8 TB/s),
  counting the minimal traffic: read q, k, v + write out (forward), plus read q, k, v, dout +
  write dq, dk, dv (backward).

Timing: median (``--stat``) over ``--repeats`` calls after one warm-up call (CUDA: events after
3 warm-ups); the compared functions are called round-robin so that both see the same background
load; a row stops repeating once it has used ``--max-seconds`` (softmax at 16k tokens on 2
cores takes seconds per call).

Memory: CPU: peak of live bytes allocated through the torch CPU allocator during the call,
replayed from every allocation and free the profiler records (``torch.profiler`` with
``profile_memory=True``, kineto ``[memory]`` events in time order), so buffers an op allocates
and frees internally (SDPA's per-thread blocks, the linear path's chunk buffers) count too;
inputs excluded, output (and gradients) included; measured in a separate, untimed call.
CUDA: ``torch.cuda.max_memory_allocated`` minus the allocation before the call.

Example::

    PYTHONPATH=. python tools/analysis/benchmark_attention_op.py --device cpu --threads 2
"""
import argparse
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from mmlinvit.ops.linear_attention import (linear_attention, linear_attention_graph,
                                           triton_available)
from mmlinvit.utils.benchmarking import time_round_robin

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
    parser.add_argument('--graph-path', action='store_true',
                        help='also time the whole-tensor torch form (used under graph capture)')
    parser.add_argument('--backward', action='store_true',
                        help='also forward + backward time and memory (CPU and CUDA)')
    args = parser.parse_args()
    if args.repeats is not None and args.repeats < 1:
        parser.error(f'--repeats must be >= 1, got {args.repeats}')
    return args


def time_ms(fns: Dict[str, Callable[[], object]], device: torch.device, repeats: int,
            max_seconds: float, stat: str) -> Dict[str, float]:
    """Median (or min) ms of each function, interleaved round-robin after 3 (GPU) / 1 (CPU)
    warm-up calls (:func:`mmlinvit.utils.benchmarking.time_round_robin`)."""
    warmups = 3 if device.type == 'cuda' else 1
    return time_round_robin(fns, device, repeats, warmups=warmups, max_seconds=max_seconds,
                            stat=stat)


def cpu_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak live bytes the torch CPU allocator handed out during ``fn``.

    Replays every allocation / free the profiler recorded (kineto ``[memory]`` events carry
    the signed byte count), including those made and released inside one op.
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    deltas = sorted((event.start_ns(), event.nbytes())
                    for event in prof.profiler.kineto_results.events()
                    if event.name() == '[memory]' and event.device_type() ==
                    torch.autograd.DeviceType.CPU)
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


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak memory of one call (see the module docstring)."""
    return cuda_peak_bytes(fn, device) if device.type == 'cuda' else cpu_peak_bytes(fn)


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

    def la_graph(q, k, v):
        return linear_attention_graph(q, k, v, fm)

    def la_triton(q, k, v):
        return linear_attention(q, k, v, fm, backend='triton')

    rows: List[Dict[str, str]] = []
    for n in args.tokens:
        shape = (args.batch, args.heads, n, args.head_dim)
        q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
        row: Dict[str, str] = {'N': str(n)}
        fns = {'sdpa': lambda: sdpa(q, k, v), 'torch': lambda: la_torch(q, k, v)}
        if args.graph_path:
            fns['graph'] = lambda: la_graph(q, k, v)
        with torch.no_grad():
            times = time_ms(fns, device, repeats, args.max_seconds, args.stat)
        t_sdpa, t_torch = times['sdpa'], times['torch']
        row['sdpa ms'] = f'{t_sdpa:.3f}'
        row['la-torch ms'] = f'{t_torch:.3f}'
        if args.graph_path:
            row['la-graph ms'] = f'{times["graph"]:.3f}'
        if not args.no_memory:
            with torch.no_grad():
                mem = {name: peak_bytes(fn, device) for name, fn in fns.items()}
            row['sdpa MiB'] = f'{mem["sdpa"] / 2**20:.2f}'
            row['la-torch MiB'] = f'{mem["torch"] / 2**20:.2f}'
            if args.graph_path:
                row['la-graph MiB'] = f'{mem["graph"] / 2**20:.2f}'
        # Ratios side by side: speed (> 1: linear faster), memory (< 1: linear smaller).
        row['speed sdpa/la'] = f'{t_sdpa / t_torch:.2f}x'
        if not args.no_memory:
            row['mem la/sdpa'] = f'{mem["torch"] / max(mem["sdpa"], 1):.2f}x'
        if args.backward:
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            grad = torch.randn_like(q)
            fb = {'sdpa': fwd_bwd(sdpa, qg, kg, vg, grad), 'torch': fwd_bwd(la_torch, qg, kg, vg,
                                                                             grad)}
            times = time_ms(fb, device, repeats, args.max_seconds, args.stat)
            row['f+b sdpa ms'] = f'{times["sdpa"]:.3f}'
            row['f+b la ms'] = f'{times["torch"]:.3f}'
            row['f+b speed'] = f'{times["sdpa"] / times["torch"]:.2f}x'
            if not args.no_memory:
                mem_fb = {name: peak_bytes(fn, device) for name, fn in fb.items()}
                row['f+b sdpa MiB'] = f'{mem_fb["sdpa"] / 2**20:.2f}'
                row['f+b la MiB'] = f'{mem_fb["torch"] / 2**20:.2f}'
                row['f+b mem'] = f'{mem_fb["torch"] / max(mem_fb["sdpa"], 1):.2f}x'
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
                            'peak live torch-allocator bytes during the call (every profiler '
                            'alloc/free event), inputs excluded'))
    print('  '.join(h.rjust(w) for h, w in zip(header, widths)))
    for r in rows:
        print('  '.join(r.get(h, '').rjust(w) for h, w in zip(header, widths)))


if __name__ == '__main__':
    main()
