"""Speed ratios against the softmax ViT from interleaved calls in one process (CPU or GPU).

``benchmark_backbones.py`` runs every (model, size, operator) in its own subprocess, one after
the other, which is right for memory; on a shared CPU its speed ratios drift with the load
between cases (the same ViT-B/16 ELU ratio at 1024 read 0.87 to 1.17 of its FLOP ratio in
four runs on the 2-core box).  This tool builds the softmax ViT, the linear students and the
Adventurer of one size in one process and times their forwards round-robin (one call of each
per round, ``mmlinvit.utils.benchmarking.time_round_robin``), so that every model sees the
same load; it prints per size the speed ratio softmax / model, the counted FLOP ratio and
their quotient (1.0 = the model is as much faster as its FLOPs say).  The Adventurer's SSD scan
is counted at its configured ``chunk_size`` on every backend (:mod:`mmlinvit.analysis.flops`),
not at the shorter chunks the CPU inference form runs.

Usage::

    python tools/analysis/speed_ratios.py --model vit-b16 --sizes 512x1024 1024 --rounds 5
    python tools/analysis/speed_ratios.py --model vit-l14 --sizes 1022 --no-adventurer
"""
import argparse
import dataclasses
import os
import sys
from typing import Dict, List, Optional

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mmlinvit.analysis import (COMPARED_MODELS, SMOKE_MODEL, ComparedModel,  # noqa: E402
                               FlopCounter)
from mmlinvit.utils.benchmarking import (parse_size, print_table, size_label,  # noqa: E402
                                         time_round_robin)

BASELINE = 'softmax'
ADVENTURER = 'adventurer'
MODELS = dict(COMPARED_MODELS, tiny=SMOKE_MODEL)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='vit-b16', choices=sorted(MODELS))
    parser.add_argument('--sizes', nargs='+', type=parse_size, default=[parse_size('1024')],
                        help='input sizes, N or HxW')
    parser.add_argument('--operators', nargs='*', default=['elu'],
                        help='linear operators of the students (softmax is the baseline)')
    parser.add_argument('--no-adventurer', action='store_true', help='skip the Adventurer')
    parser.add_argument('--adventurer-chunk', type=int, default=None,
                        help='SSD chunk size of the Adventurer (default: the mixer default, 256; '
                        'on CPU the no-autograd scan caps it at INFERENCE_CHUNK = 64)')
    parser.add_argument('--rounds', type=int, default=5, help='timed rounds (one call each)')
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    parser.add_argument('--threads', type=int, default=2, help='torch CPU threads')
    return parser.parse_args(argv)


def build_models(pair: ComparedModel, operators: List[str], adventurer: bool,
                 device: torch.device, chunk: Optional[int] = None) -> Dict[str, torch.nn.Module]:
    """Name -> model in eval mode on ``device`` (random weights)."""
    models = {op: pair.build_vit(op) for op in [BASELINE] + operators}
    if adventurer:
        if chunk is not None:
            pair = dataclasses.replace(pair, adventurer_mixer=dict(pair.adventurer_mixer or {},
                                                                   chunk_size=chunk))
        models[ADVENTURER] = pair.build_adventurer(pair.patch_size)
    return {name: m.to(device).eval() for name, m in models.items()}


def measure_size(models: Dict[str, torch.nn.Module], hw, device: torch.device,
                 rounds: int) -> List[Dict[str, str]]:
    """Table rows of one input size: ms (median of the interleaved rounds), ratios."""
    images = torch.randn(1, 3, *hw, device=device)
    calls = {name: (lambda m=m: m(images)) for name, m in models.items()}
    flops = {}
    with torch.inference_mode():
        for name, call in calls.items():
            with FlopCounter() as counter:
                call()
            flops[name] = counter.total
        times = time_round_robin(calls, device, rounds, warmups=0)
    rows = []
    for name in models:
        speed = times[BASELINE] / times[name]
        flop_ratio = flops[BASELINE] / flops[name]
        rows.append(dict(size=size_label(hw), model=name, ms=f'{times[name]:.1f}',
                         gflops=f'{flops[name] / 1e9:.1f}', speed=f'{speed:.2f}x',
                         flop=f'{flop_ratio:.2f}x', quotient=f'{speed / flop_ratio:.2f}'))
    return rows


def main(argv: Optional[List[str]] = None) -> List[Dict[str, str]]:
    args = parse_args(argv)
    if args.rounds < 1:
        raise SystemExit('--rounds must be >= 1')
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    pair = MODELS[args.model]
    models = build_models(pair, args.operators, not args.no_adventurer, device,
                          args.adventurer_chunk)
    rows = []
    for hw in args.sizes:
        rows.extend(measure_size(models, hw, device, args.rounds))
    print(f'{pair.label}, device={device}, threads={torch.get_num_threads()}, batch 1, fp32, '
          f'median of {args.rounds} interleaved rounds (one call of every model per round, '
          'after one counted call each); speed = softmax ms / model ms; flop = softmax / '
          'model counted FLOPs; quotient = speed / flop'
          + (f'; Adventurer SSD chunk {args.adventurer_chunk}' if args.adventurer_chunk else ''))
    print_table(['size', 'model', 'ms', 'gflops', 'speed', 'flop', 'quotient'], rows)
    return rows


if __name__ == '__main__':
    main()
