"""Correctness checks of the Triton kernels against the PyTorch paths (torch only).

The checks of ``tools/analysis/gpu_suite.py``: each runs a kernel forward and backward on
random inputs and the PyTorch reference in fp32 on the same (rounded) inputs, and returns a
table row with the relative Frobenius error (:func:`mmlinvit.utils.benchmarking.rel_err`) of
the output and of every input gradient, the tolerance and ``'PASS'`` / ``'FAIL'`` (a
non-finite output or gradient fails too):

* :func:`check_linear_attention`: ``linear_attention_triton`` (kernel feature maps) and
  ``inline_attention_triton`` vs ``linear_attention_torch`` / ``inline_attention_torch``;
* :func:`check_ssd`: ``ssd_scan_triton`` vs the chunked ``ssd_scan_torch``.

The kernel module is passed in (``mmlinvit.ops.linear_attention.triton_kernel`` /
``mmlinvit.ops.ssd.triton_kernel``), so importing this module never imports triton.
"""
from types import ModuleType
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F

from mmlinvit.utils.benchmarking import rel_err

# Relative Frobenius error bounds of the output and every gradient (fp32: IEEE dots; 16-bit:
# the rounding of the 16-bit output / gradients and of the 16-bit upstream gradient).  bf16
# measured on an H200: at most 0.0028 (output ~0.0017, gradients ~0.0025; dA of the SSD scan
# below); in the Triton interpreter (--dry-run, tiny shapes) at most 0.0041.  6e-3 leaves
# ~2x over the hardware and ~1.5x over the interpreter: an error of a few tenths of a percent
# on top of the rounding (a wrong scale, a lost term) fails.
TOL_LA = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 6e-3}
TOL_SSD = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 6e-3}
# dA sums over every token: a larger rounding error (bf16 0.0027-0.0056 in the later H200 runs;
# 0.02-0.05 in the first, before its products were split into hi + lo parts).
TOL_SSD_DA = {torch.float32: 5e-3, torch.float16: 2e-2, torch.bfloat16: 1e-2}
#: The SSD scan's output and gradients, in the order of the check's errors.
SSD_NAMES = ('y', 'dx', 'ddt', 'dA', 'dB', 'dC', 'dD')


def make_qkv(n: int, m: int, heads: int, d: int, e: int, dtype: torch.dtype,
             device: torch.device, requires_grad: bool = True) -> Tuple[torch.Tensor, ...]:
    """Seeded q (1, heads, n, d), k (1, heads, m, d), v (1, heads, m, e) leaves."""
    gen = torch.Generator(device=device).manual_seed(n * 131 + m + d)
    out = []
    for shape in ((1, heads, n, d), (1, heads, m, d), (1, heads, m, e)):
        t = torch.randn(*shape, device=device, generator=gen).to(dtype)
        out.append(t.requires_grad_(requires_grad))
    return tuple(out)


def make_ssd_inputs(batch: int, length: int, heads: int, headdim: int, groups: int,
                    d_state: int, dtype: torch.dtype, device: torch.device) -> List[torch.Tensor]:
    """Mixer-like leaves: x, B, C in ``dtype``; dt = softplus(.), A in -[1, 16], D fp32."""
    gen = torch.Generator(device=device).manual_seed(length * 7 + heads)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=gen)

    x = randn(batch, length, heads, headdim).to(dtype)
    dt = F.softplus(randn(batch, length, heads) - 3.0)
    A = -(torch.rand(heads, device=device, generator=gen) * 15.0 + 1.0)
    B = (randn(batch, length, groups, d_state) * d_state**-0.5).to(dtype)
    C = (randn(batch, length, groups, d_state) * d_state**-0.5).to(dtype)
    D = randn(heads)
    return [t.requires_grad_() for t in (x, dt, A, B, C, D)]


def check_linear_attention(la_kernel: ModuleType, name: str, n: int, m: int, heads: int,
                           d: int, e: int, dtype: torch.dtype, mode: str,
                           device: torch.device) -> Dict[str, object]:
    """One linear-attention check row (errors of out, dq, dk, dv).

    Args:
        la_kernel: Provides ``linear_attention_triton(q, k, v, mode)`` and
            ``inline_attention_triton(q, k, v, scale)``.
        name: The case's name in the table.
        n: Query tokens.
        m: Key / value tokens.
        heads: Heads.
        d: Query / key head dimension.
        e: Value head dimension.
        dtype: Input dtype.
        mode: ``'inline'``, ``'inline trained'`` (InLine on trained-ViT-like activations:
            q / k x10 with a shared mean of 1, v with mean 0.5, where ``s q S`` and
            ``(1 - s q.kbar) vbar`` cancel) or a kernel feature map (``'elu'``, ``'relu'``).
        device: Where the inputs live.
    """
    from mmlinvit.ops.linear_attention import inline_attention_torch, linear_attention_torch
    q, k, v = make_qkv(n, m, heads, d, e, dtype, device)
    if mode == 'inline trained':
        with torch.no_grad():
            q, k = (((t.float() + 1.0) * 10.0).to(dtype) for t in (q, k))
            v = (v.float() + 0.5).to(dtype)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    if mode.startswith('inline'):
        out = la_kernel.inline_attention_triton(q, k, v, d**-0.5)
        ref_fn = lambda a, b, c: inline_attention_torch(a, b, c, d**-0.5)  # noqa: E731
    else:
        out = la_kernel.linear_attention_triton(q, k, v, mode)
        ref_fn = lambda a, b, c: linear_attention_torch(a, b, c, mode)  # noqa: E731
    # fp32 reference on the same rounded inputs
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = ref_fn(q32, k32, v32)
    grad = torch.randn_like(ref)
    got = torch.autograd.grad(out, (q, k, v), grad.to(out.dtype))
    want = torch.autograd.grad(ref, (q32, k32, v32), grad)
    errors = [rel_err(out, ref)] + [rel_err(a, b) for a, b in zip(got, want)]
    finite = all(bool(torch.isfinite(t).all()) for t in (out, *got))
    ok = finite and max(errors) <= TOL_LA[dtype]
    return dict(kernel='linear-attn', case=name, shape=f'N={n} M={m} H={heads} d={d} e={e}',
                dtype=str(dtype).split('.')[-1], out=errors[0], dq=errors[1], dk=errors[2],
                dv=errors[3], tol=TOL_LA[dtype], ok='PASS' if ok else 'FAIL')


def check_ssd(kernel: ModuleType, name: str, batch: int, length: int, heads: int,
              headdim: int, groups: int, d_state: int, chunk: int, dtype: torch.dtype,
              device: torch.device) -> Dict[str, object]:
    """One SSD-scan check row (errors of y and every gradient, :data:`SSD_NAMES`).

    Args:
        kernel: Provides ``ssd_scan_triton(x, dt, A, B, C, D, chunk_size=...)``.
        name: The case's name in the table.
        batch: Batch size.
        length: Sequence length L.
        heads: Heads H.
        headdim: Head dimension P.
        groups: B / C groups G.
        d_state: State size N.
        chunk: Chunk size of both scans.
        dtype: Dtype of x, B and C.
        device: Where the inputs live.
    """
    from mmlinvit.ops.ssd import ssd_scan_torch
    leaves = make_ssd_inputs(batch, length, heads, headdim, groups, d_state, dtype, device)
    grad = torch.randn(batch, length, heads, headdim, device=device).to(dtype)

    def run(fn, args):
        out = fn(*args, chunk_size=chunk)
        return [out] + list(torch.autograd.grad(out, args, grad.to(out.dtype)))

    got = run(kernel.ssd_scan_triton, leaves)
    ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
    want = run(ssd_scan_torch, ref_leaves)
    errors = [rel_err(a, b) for a, b in zip(got, want)]
    finite = all(bool(torch.isfinite(t).all()) for t in got)
    bounds = [TOL_SSD_DA[dtype] if n == 'dA' else TOL_SSD[dtype] for n in SSD_NAMES]
    ok = finite and all(e <= b for e, b in zip(errors, bounds))
    row = dict(kernel='ssd', case=name,
               shape=f'L={length} H={heads} P={headdim} N={d_state} G={groups}',
               dtype=str(dtype).split('.')[-1])
    row.update({n: e for n, e in zip(SSD_NAMES, errors)})
    row.update(tol=TOL_SSD[dtype], ok='PASS' if ok else 'FAIL')
    return row
