"""onnxruntime (CPU) benchmark: softmax teacher vs linearized students, exported to ONNX.

For every input size (default 224, 512, 1024) the softmax ViT-B/16 teacher (SDPA), the
ELU+1 linear ViT-B/16 student and Adventurer-B (random weights; ``--arch l`` for ViT-L/16 vs
Adventurer-L, ``--arch tiny`` for smoke runs) are exported at that fixed size with
:func:`onnx_tools.export_onnx` (backbone, last block as an NCHW feature map), checked against
PyTorch (max abs error) and timed in onnxruntime: median over ``--repeats`` runs after one
warm-up run, the models interleaved round-robin so that they see the same background load.
The table prints each student's time next to the teacher's with the ratio (teacher / student,
> 1: the student is faster).  ``--torch`` adds PyTorch eager times of the same modules.

Example::

    PYTHONPATH=. python tools/deployment/benchmark_onnx.py --sizes 224 512 1024 --threads 2
"""
import argparse
import os
import sys
import tempfile
import time
from typing import Dict, List, Optional

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from onnx_tools import (BackboneExport, export_onnx, max_abs_errors,  # noqa: E402
                        onnxruntime_outputs, onnxruntime_session)

from mmlinvit.backbones import Adventurer, VisionTransformer  # noqa: E402
from mmlinvit.utils.benchmarking import time_round_robin, write_json  # noqa: E402

TEACHER = 'teacher-softmax'
#: ONNX Runtime and the PyTorch reference both run on the CPU here.
CPU = torch.device('cpu')
ARCHS = {
    'b': (dict(vit='b', adventurer='b'), 16),
    'l': (dict(vit='l', adventurer='l'), 16),
    'tiny': (dict(vit=dict(embed_dims=64, num_layers=2, num_heads=4, mlp_hidden_dims=128),
                  adventurer=dict(embed_dims=64, num_layers=2)), 16),
}
TINY_MIXER = dict(d_state=16, headdim=32, chunk_size=64)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--sizes', nargs='+', type=int, default=[224, 512, 1024])
    parser.add_argument('--arch', default='b', choices=sorted(ARCHS))
    parser.add_argument('--students', nargs='+', default=['vit-elu', 'adventurer'],
                        choices=['vit-elu', 'vit-relu', 'adventurer'])
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--max-seconds', type=float, default=60.0,
                        help='stop repeating a size after this many seconds')
    parser.add_argument('--threads', type=int, default=2, help='onnxruntime / torch threads')
    parser.add_argument('--torch', action='store_true', help='also time PyTorch eager')
    parser.add_argument('--work-dir', default=None,
                        help='keep the .onnx files here (default: a temporary directory)')
    parser.add_argument('--json', default=None, help='also write the rows to this JSON file')
    return parser.parse_args(argv)


def build(name: str, arch: str) -> nn.Module:
    """Random-weight backbone returning the last block as an NCHW feature map."""
    archs, patch = ARCHS[arch]
    torch.manual_seed(0)
    common = dict(out_type='featmap', out_indices=[-1])
    if name == 'adventurer':
        mixer = TINY_MIXER if arch == 'tiny' else None
        model = Adventurer(archs['adventurer'], patch_size=patch, mixer_cfg=mixer,
                           with_mask_token=False, **common)
    else:
        operator = 'softmax' if name == TEACHER else name.split('-')[1]
        model = VisionTransformer(archs['vit'], family='deit', patch_size=patch,
                                  attn_cfg=operator, **common)
    return BackboneExport(model).eval()


def main(argv: Optional[List[str]] = None) -> List[Dict[str, object]]:
    args = parse_args(argv)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return run_benchmark(args)
    finally:  # an in-process caller keeps its own thread count
        torch.set_num_threads(previous_threads)


def run_benchmark(args: argparse.Namespace) -> List[Dict[str, object]]:
    """Exports, checks and times every model at every size; prints the table."""
    names = [TEACHER] + args.students
    tmp = None if args.work_dir else tempfile.TemporaryDirectory()
    work_dir = args.work_dir or tmp.name
    rows: List[Dict[str, object]] = []
    try:
        for size in args.sizes:
            images = torch.randn(1, 3, size, size)
            ort_fns, torch_fns, row = {}, {}, {'size': size}
            for name in names:
                module = build(name, args.arch)
                path = os.path.join(work_dir, f'{name}_{args.arch}_{size}.onnx')
                t0 = time.perf_counter()
                export_onnx(module, images, path)
                session = onnxruntime_session(path, args.threads)
                with torch.no_grad():
                    ref = list(module(images))
                err = max(max_abs_errors(onnxruntime_outputs(session, images), ref))
                row[f'{name} export s'] = time.perf_counter() - t0
                row[f'{name} max abs err'] = err
                row[f'{name} max abs ref'] = max(float(r.abs().max()) for r in ref)
                ort_fns[name] = (lambda s=session: onnxruntime_outputs(s, images))
                if args.torch:
                    torch_fns[name] = (lambda m=module: m(images))
                else:
                    del module
            ort_ms = time_round_robin(ort_fns, CPU, args.repeats, max_seconds=args.max_seconds)
            for name in names:
                row[f'{name} ort ms'] = ort_ms[name]
            if args.torch:
                with torch.no_grad():
                    torch_ms = time_round_robin(torch_fns, CPU, args.repeats,
                                                max_seconds=args.max_seconds)
                for name in names:
                    row[f'{name} torch ms'] = torch_ms[name]
            rows.append(row)
            print(f'size {size}: ' + ', '.join(f'{n} {ort_ms[n]:.1f} ms' for n in names),
                  flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()

    print()
    print(f'onnxruntime CPU, threads={args.threads}, batch 1, arch={args.arch}, median of <= '
          f'{args.repeats} runs (round-robin), random weights, torch={torch.__version__}')
    print('ratio = teacher ms / student ms (> 1: student faster); err = max |onnxruntime - '
          'pytorch| (max |pytorch| in brackets)')
    cols = ['size', f'{TEACHER} ms']
    for s in args.students:
        cols += [f'{s} ms', f'{s} ratio']
    if args.torch:
        cols += [f'torch {n} ms' for n in names]
    cols += [f'{n} err' for n in names]
    table = []
    for r in rows:
        line = {'size': str(r['size']), f'{TEACHER} ms': f'{r[f"{TEACHER} ort ms"]:.1f}'}
        for s in args.students:
            line[f'{s} ms'] = f'{r[f"{s} ort ms"]:.1f}'
            line[f'{s} ratio'] = f'{r[f"{TEACHER} ort ms"] / r[f"{s} ort ms"]:.2f}x'
        if args.torch:
            for n in names:
                line[f'torch {n} ms'] = f'{r[f"{n} torch ms"]:.1f}'
        for n in names:
            line[f'{n} err'] = f'{r[f"{n} max abs err"]:.1e} ({r[f"{n} max abs ref"]:.1f})'
        table.append(line)
    widths = {c: max(len(c), *(len(t[c]) for t in table)) for c in cols}
    print('  '.join(c.rjust(widths[c]) for c in cols))
    for t in table:
        print('  '.join(t[c].rjust(widths[c]) for c in cols))
    write_json(rows, args.json)
    return rows


if __name__ == '__main__':
    main()
