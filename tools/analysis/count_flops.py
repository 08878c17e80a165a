"""Counted vs analytic GFLOPs of softmax and linear ViTs (and Adventurer) per resolution.

Counts one batch-1 forward with :class:`mmlinvit.analysis.FlopCounter` (torch's
FlopCounterMode plus handlers for CPU SDPA and the Triton linear-attention Function) on
``torch.device('meta')`` tensors, so nothing is computed and ViT-L/14 at 2048^2 takes seconds.
Next to each count it prints the issue's analytic convention, per layer

    GEMMs 24 N D^2  +  softmax attention 4 N^2 D   or   linear attention 4 N d D

(times depth), the exact closed form of everything counted (adds the patch embedding and the
2 N D normaliser mat-vec of linear attention) and the ratios.  Convention: FLOPs = 2 x MACs.

Example::

    PYTHONPATH=. python tools/analysis/count_flops.py
    PYTHONPATH=. python tools/analysis/count_flops.py --models vit-b16 \\
        --operators softmax elu inline
"""
import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mmlinvit.analysis import (ANALYTIC_OPERATORS, FLOP_CONVENTION, analytic_vit_flops,  # noqa
                               count_flops)
from mmlinvit.backbones import VIT_SIZES, VisionTransformer  # noqa: E402

#: name -> (label, arch, family); patch size and prefix tokens come from the family.
VIT_MODELS = {
    'vit-b16': ('ViT-B/16', 'b', 'deit'),
    'vit-l14': ('ViT-L/14', 'l', 'dinov2'),
}
DEFAULT_SIZES = ['224', '512', '512x1024', '1024x1024', '2048x2048']
ADVENTURER_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'mmlinvit', 'backbones', 'adventurer.py')


def parse_size(text: str) -> Tuple[int, int]:
    """``'512'`` -> (512, 512); ``'512x1024'`` -> (512, 1024) (height x width)."""
    parts = text.lower().split('x')
    if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f'size {text!r} is not N or HxW (e.g. 512x1024)')
    h = int(parts[0])
    return (h, int(parts[-1]))


def size_label(hw: Tuple[int, int]) -> str:
    return f'{hw[0]}' if hw[0] == hw[1] else f'{hw[0]}x{hw[1]}'


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--models', nargs='+', default=list(VIT_MODELS), choices=list(VIT_MODELS))
    parser.add_argument('--operators', nargs='+', default=['softmax', 'elu'],
                        help='attention operators; the first is the baseline of the ratios')
    parser.add_argument('--sizes', nargs='+', type=parse_size,
                        default=[parse_size(s) for s in DEFAULT_SIZES],
                        help='input sizes, N or HxW')
    parser.add_argument('--device', default='meta', choices=['meta', 'cpu'],
                        help="'meta' counts shapes only (fast); 'cpu' runs the forward for real "
                        '(needed for operators with data-dependent shapes, e.g. mhla)')
    parser.add_argument('--no-adventurer', action='store_true',
                        help='skip Adventurer (counted at the ViT-B/16 sizes when present)')
    parser.add_argument('--json-out', default=None, help='also write the rows as JSON')
    return parser.parse_args(argv)


def count_vit(arch: str, family: str, operator: str, hw: Tuple[int, int],
              device: str) -> Tuple[int, Optional[object]]:
    """Counted FLOPs and the analytic breakdown (None without a closed form)."""
    with torch.device(device):
        model = VisionTransformer(arch, family=family, attn_cfg=operator).eval()
        images = torch.zeros(1, 3, hw[0], hw[1])
    counted = count_flops(model, images).total
    analytic = None
    if operator in ANALYTIC_OPERATORS:
        dims = VIT_SIZES[arch]
        analytic = analytic_vit_flops(hw, model.patch_size, dims['embed_dims'],
                                      dims['num_layers'], dims['num_heads'],
                                      dims['mlp_hidden_dims'], operator,
                                      num_prefix_tokens=model.num_prefix_tokens)
    return counted, analytic


def count_adventurer(hw: Tuple[int, int], device: str) -> Tuple[int, int]:
    """Counted FLOPs and token count of Adventurer-B/16."""
    from mmlinvit.backbones.adventurer import Adventurer
    with torch.device(device):
        model = Adventurer('b', patch_size=16).eval()
        images = torch.zeros(1, 3, hw[0], hw[1])
    return count_flops(model, images).total, (hw[0] // 16) * (hw[1] // 16) + 1


def main(argv: Optional[List[str]] = None) -> List[Dict[str, object]]:
    args = parse_args(argv)
    print(f'Convention: {FLOP_CONVENTION}.')
    print('analytic = issue convention per layer: GEMMs 24 N D^2 + attention (softmax 4 N^2 D, '
          'linear 4 N d D); exact = analytic + patch embedding + linear-attention normaliser '
          '(2 N D); counted = FlopCounter on one batch-1 forward '
          f'(device {args.device}).')
    rows: List[Dict[str, object]] = []
    baseline_op = args.operators[0]
    header = (f'{"model":<10}{"size":>10}{"tokens":>8}{"operator":>10}{"counted GF":>13}'
              f'{"analytic GF":>13}{"exact GF":>12}{"cnt/exact":>10}{"cnt/anl":>9}'
              f'{"x vs " + baseline_op + " (cnt)":>20}{"(anl)":>8}')
    print(header)
    print('-' * len(header))
    for name in args.models:
        label, arch, family = VIT_MODELS[name]
        for hw in args.sizes:
            base: Dict[str, float] = {}
            for op in args.operators:
                counted, analytic = count_vit(arch, family, op, hw, args.device)
                row = dict(model=label, size=size_label(hw), operator=op, counted=counted,
                           tokens=None, analytic=None, exact=None)
                if analytic is not None:
                    row.update(tokens=analytic.num_tokens, analytic=analytic.reference_total,
                               exact=analytic.total)
                if op == baseline_op:
                    base = dict(counted=counted, analytic=row['analytic'])
                ratio_cnt = base['counted'] / counted if base else float('nan')
                ratio_anl = (base['analytic'] / row['analytic']
                             if base.get('analytic') and row['analytic'] else float('nan'))
                row.update(ratio_counted=ratio_cnt, ratio_analytic=ratio_anl)
                rows.append(row)

                def gf(v):
                    return f'{v / 1e9:.1f}' if v else '-'

                def rel(a, b):
                    return f'{a / b:.4f}' if b else '-'

                print(f'{label:<10}{size_label(hw):>10}{str(row["tokens"] or "-"):>8}{op:>10}'
                      f'{gf(counted):>13}{gf(row["analytic"]):>13}{gf(row["exact"]):>12}'
                      f'{rel(counted, row["exact"]):>10}{rel(counted, row["analytic"]):>9}'
                      f'{ratio_cnt:>20.2f}{ratio_anl:>8.2f}')
    if not args.no_adventurer and os.path.exists(ADVENTURER_FILE):
        print('\nAdventurer-B/16 (Mamba-2 mixer, SwiGLU 2.5 D; counted only, no closed form):')
        for hw in args.sizes:
            counted, tokens = count_adventurer(hw, args.device)
            rows.append(dict(model='Adventurer-B/16', size=size_label(hw), operator='mamba2',
                             counted=counted, tokens=tokens))
            print(f'{"Adv-B/16":<10}{size_label(hw):>10}{tokens:>8}{"mamba2":>10}'
                  f'{counted / 1e9:>13.1f}')
    if args.json_out:
        with open(args.json_out, 'w') as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == '__main__':
    main()
