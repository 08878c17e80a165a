"""Peak CPU memory of a ViT forward: softmax teacher vs linearized student.

Each model runs in fresh subprocesses (so allocator caches and earlier peaks do not leak
between models), batch 1, ``torch.inference_mode``, random weights (memory does not depend on
their values), one per phase as the other benchmark tools do
(:func:`mmlinvit.utils.benchmarking.run_case_phases`):

* ``memory``: started with glibc's mmap threshold fixed at 1 MiB
  (:data:`~mmlinvit.utils.benchmarking.EXACT_RSS_ENV`: every allocation of 1 MiB or more is
  mapped and unmapped on its own, so RSS tracks the live tensors), measured with
  :class:`~mmlinvit.utils.benchmarking.CpuPeakMemory`: freed heap memory is handed back
  (``malloc_trim``) and the kernel's peak-RSS mark reset right before the forward, so what
  was allocated and freed before it (building the model, loading weights, the warm-up) is not
  counted.  Reported: ``forward_mb``, the peak RSS during the forward minus the RSS just
  before it (model and input built; the output included), i.e. what the forward itself
  added at its peak; ``peak_rss_mb``, the peak RSS during the forward (weights included); and
  ``memory_method``, how it was measured (says when the peak mark could not be reset);
* ``time``: the default allocator (fresh mappings cost page faults), ``forward_s``, the
  wall time of one forward.

A warm-up forward on a 2 x 2 patch grid runs first in both phases, so lazily loaded kernels
and thread pools are resident before measuring.  ``num_tokens`` counts the patches of the
corner-padded input (``ceil(size / patch)`` per side, as the model pads) plus the prefix
tokens.  (The PyTorch profiler's CPU memory events attribute allocations to nested ops and
give no reliable running peak, so they are not used.)

Example (the ViT-AdaLA 1024^2 setting, ViT-B/16, 4097 tokens)::

    python tools/analysis/peak_memory_vit.py --img-size 1024 --attn softmax elu \
        --softmax-backends default math
"""
import argparse
import contextlib
import json
import os
import sys
import time
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mmlinvit.layers.patch_embed import patch_grid  # noqa: E402
from mmlinvit.utils.benchmarking import (CpuPeakMemory, proc_status_mib,  # noqa: E402
                                         run_case_phases, write_json)

SOFTMAX_BACKENDS = ('default', 'math')
PHASES = ('memory', 'time')


def run_child(args: argparse.Namespace) -> Dict[str, object]:
    """Builds one model and measures one forward in this process (phase ``args.child_phase``:
    ``'memory'`` or ``'time'``)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from mmlinvit.backbones import VisionTransformer

    torch.set_num_threads(args.threads)
    model = VisionTransformer(args.arch, family='deit', attn_cfg=args.child_attn,
                              img_size=args.img_size, patch_size=args.patch_size).eval()
    x = torch.randn(1, 3, args.img_size, args.img_size)
    grid = patch_grid((args.img_size, args.img_size), args.patch_size)
    result: Dict[str, object] = dict(
        attn=args.child_attn,
        softmax_backend=args.child_backend if args.child_attn == 'softmax' else None,
        arch=args.arch,
        img_size=args.img_size,
        num_tokens=grid[0] * grid[1] + model.num_prefix_tokens,
        params_mb=sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20)
    backend_ctx = (sdpa_kernel([SDPBackend.MATH])
                   if args.child_backend == 'math' else contextlib.nullcontext())
    with torch.inference_mode(), backend_ctx:
        model(torch.randn(1, 3, 2 * args.patch_size, 2 * args.patch_size))  # warm-up
        if args.child_phase == 'memory':
            memory = CpuPeakMemory()
            forward_mb, out = memory.measure(lambda: model(x)[0])
            result.update(forward_mb=forward_mb, peak_rss_mb=proc_status_mib('VmHWM'),
                          memory_method=memory.method)
        else:
            start = time.perf_counter()
            out = model(x)[0]
            result.update(forward_s=time.perf_counter() - start)
        result.update(output_finite=bool(torch.isfinite(out).all()))
    return result


def run_parent(args: argparse.Namespace) -> List[Dict[str, object]]:
    """Runs every requested model in its own subprocess and prints a table."""
    jobs = []
    for attn in args.attn:
        for backend in (args.softmax_backends if attn == 'softmax' else ['default']):
            jobs.append((attn, backend))
    results = []
    for attn, backend in jobs:
        def command(phase: str, attn: str = attn, backend: str = backend) -> List[str]:
            return [sys.executable, os.path.abspath(__file__), '--child-attn', attn,
                    '--child-backend', backend, '--child-phase', phase, '--arch', args.arch,
                    '--img-size', str(args.img_size), '--patch-size', str(args.patch_size),
                    '--threads', str(args.threads)]
        try:
            results.append(run_case_phases(command, args.threads, ROOT))
        except RuntimeError as err:
            raise RuntimeError(f'{attn} ({backend}) failed: {err}') from err
    header = (f'{"operator":<18}{"tokens":>7}{"weights MiB":>13}{"peak RSS MiB":>14}'
              f'{"fwd MiB":>10}{"fwd s":>8}')
    print(header)
    print('-' * len(header))
    for r in results:
        name = r['attn'] + (f' ({r["softmax_backend"]})' if r['softmax_backend'] else '')
        print(f'{name:<18}{r["num_tokens"]:>7}{r["params_mb"]:>13.1f}{r["peak_rss_mb"]:>14.1f}'
              f'{r["forward_mb"]:>10.1f}{r["forward_s"]:>8.2f}')
    if results:
        print(f'memory: {results[0]["memory_method"]}')
    write_json(results, args.json_out)
    return results


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--arch', default='b', help='ViT size (VIT_SIZES key)')
    parser.add_argument('--img-size', type=int, default=1024)
    parser.add_argument('--patch-size', type=int, default=16)
    parser.add_argument('--attn', nargs='+', default=['softmax', 'elu'],
                        help='attention operators to compare (one subprocess each)')
    parser.add_argument('--softmax-backends', nargs='+', default=['default'],
                        choices=SOFTMAX_BACKENDS,
                        help="SDPA backends for softmax: 'default' lets PyTorch pick "
                        "(flash / memory-efficient where available), 'math' forces the "
                        'explicit N x N map')
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--json-out', default=None, help='also write the results as JSON')
    parser.add_argument('--child-attn', default=None, help=argparse.SUPPRESS)
    parser.add_argument('--child-backend', default='default', choices=SOFTMAX_BACKENDS,
                        help=argparse.SUPPRESS)
    parser.add_argument('--child-phase', default='memory', choices=PHASES,
                        help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    if args.child_attn is not None:
        print(json.dumps(run_child(args)))
    else:
        run_parent(args)


if __name__ == '__main__':
    main()
