"""GPU check of the Triton SSD scan (correctness + speed vs the chunked torch scan), < 1 min.

Adventurer-B mixer shapes by default: H=24 heads, P=64 head dim, N=64 state, G=1 group,
chunk 256, batch 1, L in {1024, 4096, 16384}.  Inputs as the mixer passes them: x, B, C in
the compute dtype, dt / A / D in fp32.

1. Correctness: kernel vs :func:`mmlinvit.ops.ssd.ssd_scan_chunked` (fp32 math on the same
   inputs) for fp32 and bf16, forward and the gradients of x, dt, A, B, C, D, as relative
   Frobenius errors; plus a ragged length with groups and non-power-of-two P / N in fp16.
2. Speed: torch chunked scan vs the kernel, forward and forward+backward, median ms and the
   ratios (torch / triton).

Exit code 1 when a correctness check fails.  ``--device cpu`` with ``TRITON_INTERPRET=1`` and
tiny sizes smoke-tests the script itself in the Triton interpreter (timings meaningless)::

    TRITON_INTERPRET=1 PYTHONPATH=. python tools/analysis/gpu_check_ssd.py --device cpu \
        --lengths 40 --heads 2 --head-dim 16 --d-state 16 --chunk 16 --repeats 1

Example::

    PYTHONPATH=. python tools/analysis/gpu_check_ssd.py
"""
import argparse
import statistics
import sys
import time
from typing import Callable, List, Optional, Sequence

import torch
import torch.nn.functional as F

from mmlinvit.ops.ssd import select_ssd_backend, ssd_scan_chunked, triton_kernel_available

DTYPES = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}
# Relative Frobenius error bounds (fp32: IEEE dots; 16-bit: TF32 dots + output rounding).
# dA sums O(L) cancelling terms: the fp32 torch path itself is ~1e-4 off an fp64 reference.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
TOLERANCE_DA = {torch.float32: 5e-3, torch.float16: 2e-2, torch.bfloat16: 5e-2}
NAMES = ('y', 'dx', 'ddt', 'dA', 'dB', 'dC', 'dD')


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--lengths', type=int, nargs='+', default=[1024, 4096, 16384])
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--heads', type=int, default=24)
    parser.add_argument('--head-dim', type=int, default=64)
    parser.add_argument('--d-state', type=int, default=64)
    parser.add_argument('--groups', type=int, default=1)
    parser.add_argument('--chunk', type=int, default=256)
    parser.add_argument('--repeats', type=int, default=20)
    parser.add_argument('--dtypes', nargs='+', default=['fp32', 'bf16'], choices=list(DTYPES))
    parser.add_argument('--device', default='cuda', help='cuda; cpu only for interpreter smoke')
    return parser.parse_args()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def bench_ms(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median wall time of ``fn`` in ms (CUDA events; a single timed call on CPU)."""
    for _ in range(2):
        fn()
    if device.type != 'cuda':  # interpreter smoke run
        start_s = time.perf_counter()
        fn()
        return (time.perf_counter() - start_s) * 1e3
    torch.cuda.synchronize()
    times: List[float] = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def make_inputs(batch: int, length: int, heads: int, headdim: int, groups: int, d_state: int,
                dtype: torch.dtype, device: torch.device) -> List[torch.Tensor]:
    """Mixer-like leaves: x, B, C in ``dtype``; dt = softplus(.), A in -[1, 16], D in fp32."""
    gen = torch.Generator(device=device).manual_seed(length * 7 + heads)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=gen)

    x = randn(batch, length, heads, headdim).to(dtype)
    dt = F.softplus(randn(batch, length, heads) - 3.0)  # ~0.05, the Mamba-2 dt init range
    A = -(torch.rand(heads, device=device, generator=gen) * 15.0 + 1.0)
    B = (randn(batch, length, groups, d_state) * d_state**-0.5).to(dtype)
    C = (randn(batch, length, groups, d_state) * d_state**-0.5).to(dtype)
    D = randn(heads)
    return [t.requires_grad_() for t in (x, dt, A, B, C, D)]


def run_scan(fn: Callable[..., torch.Tensor], leaves: Sequence[torch.Tensor], chunk: int,
             grad: Optional[torch.Tensor]) -> List[torch.Tensor]:
    out = fn(*leaves, chunk_size=chunk)
    if grad is None:
        return [out]
    return [out] + list(torch.autograd.grad(out, leaves, grad))


def check_case(kernel, device: torch.device, name: str, batch: int, length: int, heads: int,
               headdim: int, groups: int, d_state: int, chunk: int, dtype: torch.dtype) -> bool:
    """Forward + gradient errors of one configuration; prints one line, returns pass/fail."""
    leaves = make_inputs(batch, length, heads, headdim, groups, d_state, dtype, device)
    grad = torch.randn(batch, length, heads, headdim, device=device).to(dtype)
    got = run_scan(kernel.ssd_scan_triton, leaves, chunk, grad)
    want = run_scan(ssd_scan_chunked, leaves, chunk, grad)
    errors = [rel_err(a, b) for a, b in zip(got, want)]
    finite = all(torch.isfinite(t).all().item() for t in got)
    bounds = [TOLERANCE_DA[dtype] if n == 'dA' else TOLERANCE[dtype] for n in NAMES]
    ok = finite and all(e <= b for e, b in zip(errors, bounds))
    print(f'  {"PASS" if ok else "FAIL"} {name:<22} L={length:<6} H={heads:<3} P={headdim:<4} '
          f'N={d_state:<4} G={groups:<2} {str(dtype):<15} rel.err ' +
          ' '.join(f'{n}={e:.1e}' for n, e in zip(NAMES, errors)))
    return ok


def main() -> int:
    args = parse_args()
    device = torch.device(args.device)
    if not triton_kernel_available() or (device.type == 'cuda'
                                         and not torch.cuda.is_available()):
        print('needs triton and a CUDA GPU (or --device cpu with TRITON_INTERPRET=1)')
        return 2
    t_start = time.perf_counter()
    probe = make_inputs(1, 1, args.heads, args.head_dim, args.groups, args.d_state,
                        torch.float32, device)
    if select_ssd_backend(*probe, backend='triton') != 'triton':
        raise RuntimeError('the dispatcher did not choose the Triton kernel')
    if device.type == 'cuda' and select_ssd_backend(*probe) != 'triton':
        raise RuntimeError('auto dispatch does not choose the Triton kernel on CUDA')
    from mmlinvit.ops.ssd import triton_kernel as kernel
    name = torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU (interpreter)'
    print(f'device: {name}  torch {torch.__version__}  '
          f'tf32 matmul allowed: {torch.backends.cuda.matmul.allow_tf32}')

    b, h, p, n, g, q = (args.batch, args.heads, args.head_dim, args.d_state, args.groups,
                        args.chunk)
    dtypes = [DTYPES[d] for d in args.dtypes]
    print('Correctness (kernel vs torch chunked scan, relative Frobenius error):')
    ok = True
    for dtype in dtypes:
        for length in args.lengths:
            ok &= check_case(kernel, device, 'adventurer', b, length, h, p, g, n, q, dtype)
    small = min(args.lengths)
    ok &= check_case(kernel, device, 'ragged groups P48 N40', 2, small + 37, 8, 48, 2, 40, q,
                     torch.float16)
    print(f'  correctness {"PASSED" if ok else "FAILED"} ({time.perf_counter() - t_start:.0f} s '
          'incl. compilation)')

    print(f'Speed (B={b}, H={h}, P={p}, N={n}, G={g}, chunk {q}; median of {args.repeats} ms; '
          'ratio = torch / triton):')
    print(f'  {"dtype":<6}{"L":>7}{"torch fwd":>11}{"triton":>9}{"ratio":>8}'
          f'{"torch f+b":>11}{"triton":>9}{"ratio":>8}')
    for dtype in dtypes:
        for length in args.lengths:
            leaves = make_inputs(b, length, h, p, g, n, dtype, device)
            grad = torch.randn(b, length, h, p, device=device).to(dtype)
            with torch.no_grad():
                t_torch = bench_ms(lambda: ssd_scan_chunked(*leaves, chunk_size=q), args.repeats,
                                   device)
                t_triton = bench_ms(lambda: kernel.ssd_scan_triton(*leaves, chunk_size=q),
                                    args.repeats, device)
            t_torch_fb = bench_ms(lambda: run_scan(ssd_scan_chunked, leaves, q, grad),
                                  args.repeats, device)
            t_triton_fb = bench_ms(lambda: run_scan(kernel.ssd_scan_triton, leaves, q, grad),
                                   args.repeats, device)
            print(f'  {str(dtype).split(".")[-1]:<6}{length:>7}{t_torch:>11.3f}{t_triton:>9.3f}'
                  f'{t_torch / t_triton:>7.2f}x{t_torch_fb:>11.3f}{t_triton_fb:>9.3f}'
                  f'{t_torch_fb / t_triton_fb:>7.2f}x')
    print(f'total {time.perf_counter() - t_start:.0f} s; correctness '
          f'{"PASSED" if ok else "FAILED"}')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
