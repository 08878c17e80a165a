"""GPU check of the Triton linear attention kernels (correctness + speed vs SDPA); < 2 min on H200.

1. Correctness: kernel vs the torch path (fp32 math on the same inputs) for fp32/fp16/bf16 at
   N in {1024, 4096, 16384} (B=1, H=12, d=64, ELU+1), forward and gradients of q, k, v, as
   relative Frobenius errors; plus ReLU at d=e=128, a non-power-of-two head (48 -> 40), InLine
   and a cross-attention shape (N != M) in bf16.
2. Speed: kernel vs ``F.scaled_dot_product_attention`` (flash for 16-bit) forward and
   forward+backward, ratios, and achieved bandwidth as a fraction of ``--peak-bw`` counting the
   minimal traffic (fwd: q, k, v, out; fwd+bwd: + q, k, v, dout, dq, dk, dv).

Exit code 1 when a correctness check fails.  ``--device cpu`` with ``TRITON_INTERPRET=1`` and
tiny ``--tokens`` smoke-tests the script itself in the Triton interpreter (no timings meaning).

Example::

    PYTHONPATH=. python tools/analysis/gpu_check_linear_attention.py
"""
import argparse
import statistics
import sys
import time
from typing import Callable, List, Tuple

import torch
import torch.nn.functional as F

from mmlinvit.ops.feature_maps import get_feature_map
from mmlinvit.ops.linear_attention import (inline_attention_torch, linear_attention_torch,
                                           select_backend, triton_available)

DTYPES = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}
# Relative Frobenius error bounds (kernel: fp32 accumulation, TF32 dots for 16-bit inputs;
# the remaining error is the rounding of outputs/gradients to the input dtype).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--tokens', type=int, nargs='+', default=[1024, 4096, 16384])
    parser.add_argument('--heads', type=int, default=12)
    parser.add_argument('--head-dim', type=int, default=64)
    parser.add_argument('--repeats', type=int, default=20)
    parser.add_argument('--device', default='cuda', help='cuda; cpu only for interpreter smoke')
    parser.add_argument('--peak-bw', type=float, default=4.8e12, help='B/s (H200: 4.8e12)')
    return parser.parse_args()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def bench_ms(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    for _ in range(3):
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


def make_qkv(n: int, m: int, heads: int, d: int, e: int, dtype: torch.dtype,
             device: torch.device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(n * 131 + m + d)
    q = torch.randn(1, heads, n, d, device=device, generator=gen).to(dtype).requires_grad_()
    k = torch.randn(1, heads, m, d, device=device, generator=gen).to(dtype).requires_grad_()
    v = torch.randn(1, heads, m, e, device=device, generator=gen).to(dtype).requires_grad_()
    return q, k, v


def check_case(fused, device: torch.device, name: str, n: int, m: int, heads: int, d: int,
               e: int, dtype: torch.dtype, mode: str) -> bool:
    """Forward + gradient errors of one configuration; prints one line, returns pass/fail."""
    q, k, v = make_qkv(n, m, heads, d, e, dtype, device)
    if mode == 'inline':
        scale = d**-0.5
        out = fused.fused_inline_attention(q, k, v, scale)
        ref = inline_attention_torch(q, k, v, scale)
    else:
        phi = get_feature_map(mode)
        out = fused.fused_linear_attention(q, k, v, mode)
        ref = linear_attention_torch(phi(q.float()), phi(k.float()), v)
    grad = torch.randn_like(ref)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    errors = [rel_err(out, ref)] + [rel_err(a, b) for a, b in zip(got, want)]
    finite = all(torch.isfinite(t).all().item() for t in (out, *got))
    ok = finite and max(errors) <= TOLERANCE[dtype]
    print(f'  {"PASS" if ok else "FAIL"} {name:<28} N={n:<6} M={m:<6} d={d:<4} e={e:<4} '
          f'{str(dtype):<15} rel.err out/dq/dk/dv = ' + ' '.join(f'{x:.1e}' for x in errors))
    return ok


def main() -> int:
    args = parse_args()
    device = torch.device(args.device)
    if not triton_available() or (device.type == 'cuda' and not torch.cuda.is_available()):
        print('needs triton and a CUDA GPU (or --device cpu with TRITON_INTERPRET=1)')
        return 2
    t_start = time.perf_counter()
    # Import the kernels through the dispatcher's rules (CUDA + triton -> kernel).
    probe = torch.zeros(1, 1, 1, 16, device=device)
    if select_backend(probe, probe, probe, backend='triton') != 'triton':
        raise RuntimeError('the dispatcher did not choose the Triton kernel')
    from mmlinvit.ops.linear_attention import fused
    name = torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU (interpreter)'
    print(f'device: {name}  torch {torch.__version__}  '
          f'tf32 matmul allowed: {torch.backends.cuda.matmul.allow_tf32}')

    print('Correctness (kernel vs torch path, relative Frobenius error):')
    ok = True
    h, d = args.heads, args.head_dim
    for dtype in DTYPES.values():
        for n in args.tokens:
            ok &= check_case(fused, device, 'elu', n, n, h, d, d, dtype, 'elu')
    small, mid = min(args.tokens), sorted(args.tokens)[len(args.tokens) // 2]
    extra_cases = [  # (name, N, M, H, d, e, dtype, mode)
        ('relu d=e=128', mid, mid, 4, 128, 128, torch.bfloat16, 'relu'),
        ('relu d=e=128 fp32', small, small, 4, 128, 128, torch.float32, 'relu'),
        ('elu d=48 e=40 ragged', mid + 1, mid + 1, 4, 48, 40, torch.float16, 'elu'),
        ('inline', mid, mid, h, d, d, torch.bfloat16, 'inline'),
        ('inline fp32 ragged', small + 1, small + 1, h, d, d, torch.float32, 'inline'),
        ('elu cross N!=M', max(1, small - 24), mid * 3 // 4 + 7, h, d, d, torch.bfloat16, 'elu'),
    ]
    for case in extra_cases:
        ok &= check_case(fused, device, *case)
    print(f'  correctness {"PASSED" if ok else "FAILED"} ({time.perf_counter() - t_start:.0f} s '
          'incl. compilation)')

    print(f'Speed (B=1, H={h}, d={d}, ELU+1; median of {args.repeats}; '
          f'BW = minimal bytes / time / {args.peak_bw / 1e12:.1f} TB/s):')
    header = (f'  {"dtype":<6}{"N":>7}{"sdpa fwd":>10}{"la fwd":>9}{"ratio":>8}{"BW":>7}'
              f'{"sdpa f+b":>10}{"la f+b":>9}{"ratio":>8}{"BW":>7}   (ms)')
    print(header)
    for dname, dtype in DTYPES.items():
        for n in args.tokens:
            q, k, v = make_qkv(n, n, h, d, d, dtype, device)
            grad = torch.randn_like(q)
            tensor_bytes = q.numel() * q.element_size()
            with torch.no_grad():
                t_sdpa = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v),
                                  args.repeats, device)
                t_la = bench_ms(lambda: fused.fused_linear_attention(q, k, v, 'elu'),
                                args.repeats, device)

            def sdpa_fb():
                out = F.scaled_dot_product_attention(q, k, v)
                torch.autograd.grad(out, (q, k, v), grad)

            def la_fb():
                out = fused.fused_linear_attention(q, k, v, 'elu')
                torch.autograd.grad(out, (q, k, v), grad)

            t_sdpa_fb = bench_ms(sdpa_fb, args.repeats, device)
            t_la_fb = bench_ms(la_fb, args.repeats, device)
            bw = 4 * tensor_bytes / (t_la * 1e-3) / args.peak_bw
            bw_fb = 11 * tensor_bytes / (t_la_fb * 1e-3) / args.peak_bw
            print(f'  {dname:<6}{n:>7}{t_sdpa:>10.3f}{t_la:>9.3f}{t_sdpa / t_la:>7.2f}x'
                  f'{bw:>7.0%}{t_sdpa_fb:>10.3f}{t_la_fb:>9.3f}{t_sdpa_fb / t_la_fb:>7.2f}x'
                  f'{bw_fb:>7.0%}')
    print(f'total {time.perf_counter() - t_start:.0f} s; correctness '
          f'{"PASSED" if ok else "FAILED"}')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
