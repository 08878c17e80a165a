"""Section 5 of the GPU suite: launch-parameter sweeps of the Triton kernels.

Tile sizes / warps / stages / programs of the linear attention and SSD kernels
(``_LaunchConfig`` fields overridden one variant at a time, :func:`launch_config`), each
timed by CUDA-graph replay and checked against the default launch's outputs: the data the
defaults are chosen from.
"""
import contextlib
import time
from types import ModuleType
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch

from mmlinvit.analysis.kernel_checks import make_qkv, make_ssd_inputs
from mmlinvit.ops.linear_attention import linear_attention_torch
from mmlinvit.utils.benchmarking import rel_err

from .op_sections import triton_kernels
from .run import SuiteRun
from .sizes import Sizes
from .timing import bench_ms, graph_ms, no_grad

#: One sweep case: (name, the call, its outputs as a list of tensors).
SweepCase = Tuple[str, Callable[[], object], Callable[[object], List[torch.Tensor]]]


@contextlib.contextmanager
def launch_config(module: ModuleType, **overrides: object) -> Iterator[None]:
    """Within the block, ``module``'s kernels launch with ``overrides`` set on the default
    ``_LaunchConfig`` (tile sizes, warps, stages): one variant of a launch-parameter sweep.

    Args:
        module: A Triton kernel module with a ``_LaunchConfig`` class.
        **overrides: ``_LaunchConfig`` attribute -> value.

    Raises:
        AttributeError: ``_LaunchConfig`` has no such attribute (at the first launch).
    """
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


def sweep(module: ModuleType, variants: List[Dict[str, object]], cases: List[SweepCase],
          deadline: float, device: torch.device,
          exact: Optional[Dict[str, List[torch.Tensor]]] = None,
          exact_names: Optional[Dict[str, Tuple[str, ...]]] = None) -> List[Dict[str, object]]:
    """Times each launch variant on each case (graph replays on CUDA) and checks its outputs
    against the default configuration's (relative error; a variant that errs is reported).

    Args:
        module: The kernel module whose ``_LaunchConfig`` the variants override.
        variants: One dict of overrides per variant.
        cases: The calls each variant runs.
        deadline: ``time.perf_counter()`` after which no variant starts.
        device: Where the calls run.
        exact: Case -> fp32 reference outputs: adds each variant's error against them, one
            column per output named in ``exact_names`` (else the largest).
        exact_names: Case -> the names of its outputs.
    """
    reference = {name: [t.float() for t in outputs(call())] for name, call, outputs in cases}
    rows = []
    for overrides in variants:
        if time.perf_counter() > deadline:
            rows.append({'variant': 'deadline reached: rest skipped'})
            break
        row: Dict[str, object] = {'variant': ' '.join(f'{k}={v}' for k, v in overrides.items())}
        try:
            with launch_config(module, **overrides):
                err = 0.0
                for name, call, outputs in cases:
                    got = outputs(call())
                    err = max([err] + [rel_err(g, w) for g, w in zip(got, reference[name])])
                    if exact and name in exact:
                        errs = [rel_err(g, w) for g, w in zip(got, exact[name])]
                        names = (exact_names or {}).get(name)
                        if names:
                            row.update({f'{n} err': e for n, e in zip(names, errs)})
                        else:
                            row[name + ' err vs fp32'] = max(errs)
                    row[name + ' ms'] = (graph_ms(call, device) if device.type == 'cuda'
                                         else bench_ms(call, device, 1))
                row['max rel err vs default'] = err
        except Exception as exc:  # a variant the compiler or the device refuses
            row['error'] = f'{type(exc).__name__}: {str(exc)[:120]}'
        rows.append(row)
    return rows


def section_sweeps(run: SuiteRun, sizes: Sizes, deadline: float,
                   kernels: Tuple[str, ...] = ('la', 'ssd')) -> Dict[str, List[Dict[str, object]]]:
    """Launch-parameter sweeps of the linear attention and (``'ssd'`` in ``kernels``) the SSD
    kernels, forward and f+b.

    Args:
        run: The suite run.
        sizes: The run's sizes.
        deadline: ``time.perf_counter()`` after which no variant starts.
        kernels: The kernels swept (``'la'``, ``'ssd'``; the linear attention is always swept).
    """
    device = run.device
    la_kernel, ssd_kernel = triton_kernels(device)
    dtype = torch.bfloat16 if not run.dry else torch.float32
    out: Dict[str, List[Dict[str, object]]] = {}
    n_small, n_big = sizes.sweep_tokens
    cases, la_exact = [], {}
    for n in (n_small, n_big):
        q, k, v = make_qkv(n, n, sizes.la_heads, sizes.la_head_dim, sizes.la_head_dim, dtype,
                           device)
        cases.append((f'fwd N={n}', no_grad(
            lambda q=q, k=k, v=v: la_kernel.linear_attention_triton(q, k, v, 'elu')),
            lambda o: [o]))
        with torch.no_grad():  # fp32 math on the same inputs: each variant's own error
            la_exact[f'fwd N={n}'] = [linear_attention_torch(q.float(), k.float(), v.float(),
                                                             'elu')]
    q, k, v = make_qkv(n_small, n_small, sizes.la_heads, sizes.la_head_dim, sizes.la_head_dim,
                       dtype, device)
    grad = torch.randn_like(q)
    cases.append((f'f+b N={n_small}', lambda: torch.autograd.grad(
        la_kernel.linear_attention_triton(q, k, v, 'elu'), (q, k, v), grad), list))
    lim = sizes.sweep_limit
    # First (before any deadline): the forward dots on 16-bit operands, which sm_90 SASS
    # shows halve the wgmma count and drop the fp32 operand round trip (sass_report.py).
    variants = [dict(dot_16bit=True), dict(dot_16bit=True, num_warps=8),
                dict(dot_16bit=True, block_state=128, block_out=128),
                dict(dot_16bit=True, target_programs_out=1056)][:lim]
    variants += [dict(block_state=bs, block_out=bo, num_warps=w, num_stages=st)
                for bs in (64, 128) for bo in (64, 128) for w in (4, 8) for st in (2, 3)][:lim]
    variants += [dict(block_bwd_q=bq, block_bwd_kv=bkv, num_warps_bwd=w)
                 for bq in (32, 64) for bkv in (32, 64, 128) for w in (4, 8)][:lim]
    variants += [dict(target_programs=tp) for tp in sizes.sweep_programs]
    variants += [dict(target_programs_out=tp, num_stages=st)
                 for tp in sizes.sweep_programs_out for st in (2, 3)][:lim]
    out['linear_attention'] = sweep(la_kernel, variants, cases, deadline, device,
                                    exact=la_exact)
    if 'ssd' not in kernels:
        return out

    s = sizes.ssd_shape
    length = sizes.sweep_ssd_length
    leaves = make_ssd_inputs(1, length, s['heads'], s['headdim'], s['groups'], s['d_state'],
                             dtype, device)
    grad_y = torch.randn(1, length, s['heads'], s['headdim'], device=device).to(dtype)
    ssd_cases = [
        (f'fwd L={length}', no_grad(
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
    out['ssd'] = sweep(ssd_kernel, variants, ssd_cases, deadline, device, exact=exact,
                       exact_names={f'f+b L={length}': ('dx', 'ddt', 'dA', 'dB', 'dC', 'dD')})
    return out
