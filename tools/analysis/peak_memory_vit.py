"""Peak CPU memory of a ViT forward: softmax teacher vs linearized student.

Each model runs in a fresh subprocess (so allocator caches and earlier peaks do not leak
between models), batch 1, ``torch.inference_mode``, random weights (memory does not depend on
their values).  Reported per model:

* ``max_rss_mb``: the process's peak resident set size (``ru_maxrss``), weights included;
* ``forward_rss_mb``: peak RSS minus the RSS just before the forward (model and input built),
  i.e. what the forward itself added at its peak;
* ``forward_s``: wall time of the measured forward.

A warm-up forward on a 2 x 2 patch grid runs first, so lazily loaded kernels and thread pools
are resident before the baseline is taken.  Large tensors are mmap-backed by glibc malloc and
returned to the OS when freed, so the RSS peak tracks the live-tensor peak closely.  (The
PyTorch profiler's CPU memory events attribute allocations to nested ops and give no reliable
running peak, so they are not used.)

Example (the ViT-AdaLA 1024^2 setting, ViT-B/16, 4097 tokens)::

    python tools/analysis/peak_memory_vit.py --img-size 1024 --attn softmax elu \
        --softmax-backends default math
"""
import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from typing import Dict, List

from mmlinvit.utils.benchmarking import write_json

SOFTMAX_BACKENDS = ('default', 'math')


def current_rss_mb() -> float:
    """Resident set size of this process now, in MiB (Linux ``/proc/self/statm``)."""
    with open('/proc/self/statm') as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf('SC_PAGE_SIZE') / 2**20


def run_child(args: argparse.Namespace) -> Dict[str, object]:
    """Builds one model, runs one forward and measures memory (in this process)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))))
    from mmlinvit.backbones import VisionTransformer

    torch.set_num_threads(args.threads)
    model = VisionTransformer(args.arch, family='deit', attn_cfg=args.child_attn,
                              img_size=args.img_size, patch_size=args.patch_size).eval()
    x = torch.randn(1, 3, args.img_size, args.img_size)
    num_tokens = (args.img_size // args.patch_size)**2 + 1
    backend_ctx = (sdpa_kernel([SDPBackend.MATH])
                   if args.child_backend == 'math' else contextlib.nullcontext())
    with torch.inference_mode(), backend_ctx:
        model(torch.randn(1, 3, 2 * args.patch_size, 2 * args.patch_size))  # warm-up
        rss_before = current_rss_mb()
        start = time.perf_counter()
        out = model(x)[0]
        elapsed = time.perf_counter() - start
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    return dict(
        attn=args.child_attn,
        softmax_backend=args.child_backend if args.child_attn == 'softmax' else None,
        arch=args.arch,
        img_size=args.img_size,
        num_tokens=num_tokens,
        params_mb=sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20,
        rss_before_forward_mb=rss_before,
        max_rss_mb=max_rss,
        forward_rss_mb=max_rss - rss_before,
        forward_s=elapsed,
        output_finite=bool(torch.isfinite(out).all()),
    )


def run_parent(args: argparse.Namespace) -> List[Dict[str, object]]:
    """Runs every requested model in its own subprocess and prints a table."""
    jobs = []
    for attn in args.attn:
        for backend in (args.softmax_backends if attn == 'softmax' else ['default']):
            jobs.append((attn, backend))
    results = []
    for attn, backend in jobs:
        cmd = [
            sys.executable, os.path.abspath(__file__), '--child-attn', attn, '--child-backend',
            backend, '--arch', args.arch, '--img-size', str(args.img_size), '--patch-size',
            str(args.patch_size), '--threads', str(args.threads)
        ]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f'{attn} ({backend}) failed:\n{proc.stderr}')
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    header = (f'{"operator":<18}{"tokens":>7}{"weights MiB":>13}{"max RSS MiB":>13}'
              f'{"fwd RSS MiB":>13}{"fwd s":>8}')
    print(header)
    print('-' * len(header))
    for r in results:
        name = r['attn'] + (f' ({r["softmax_backend"]})' if r['softmax_backend'] else '')
        print(f'{name:<18}{r["num_tokens"]:>7}{r["params_mb"]:>13.1f}{r["max_rss_mb"]:>13.1f}'
              f'{r["forward_rss_mb"]:>13.1f}{r["forward_s"]:>8.1f}')
    write_json(results, args.json_out)
    return results


def parse_args() -> argparse.Namespace:
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
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.child_attn is not None:
        print(json.dumps(run_child(args)))
    else:
        run_parent(args)


if __name__ == '__main__':
    main()
