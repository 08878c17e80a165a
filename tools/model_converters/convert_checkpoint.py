"""Converts a ViT checkpoint from an official layout into mmlinvit's canonical layout.

Usage::

    python tools/model_converters/convert_checkpoint.py SRC DST \
        --layout {auto,dinov2,timm,openai_clip,mmpretrain} [--keep-projection] \
        [--no-embed-class {true,false}] [--trust-checkpoint]

The output is ``dict(state_dict=..., meta=dict(source_layout=..., report=...))`` (plus
``extras=dict(proj=...)`` with ``--keep-projection``), readable with
``torch.load(weights_only=True)``; the conversion report is printed.

The official OpenAI CLIP releases (``ViT-B-16.pt`` ...) are TorchScript archives, which only
``torch.jit.load`` reads (it runs code from the file): convert them once with
``--trust-checkpoint``, e.g. for the ViT-Linearizer teacher::

    python tools/model_converters/convert_checkpoint.py ViT-B-16.pt \
        checkpoints/clip_vit_b16_openai.pt --trust-checkpoint
"""
import argparse
import os
import sys
from typing import List, Optional

import torch

from mmlinvit.converters import UntrustedCheckpointError, layout_names, read_checkpoint
from mmlinvit.utils.cli import add_trust_checkpoint_argument, checkpoint_io_parser


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = checkpoint_io_parser('Convert a ViT checkpoint into the canonical mmlinvit layout.',
                                  ('src', 'source checkpoint (.pth / .pt / .safetensors)'),
                                  ('dst', 'output checkpoint path'))
    parser.add_argument('--layout', default='auto', choices=layout_names(),
                        help='source layout (default: detect it)')
    parser.add_argument('--keep-projection', action='store_true',
                        help='openai_clip: keep the image projection in extras["proj"]')
    parser.add_argument('--no-embed-class', choices=('true', 'false'), default=None,
                        help='timm: whether pos_embed excludes the prefix tokens (default: infer)')
    add_trust_checkpoint_argument(parser)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the conversion; returns the process exit code."""
    args = parse_args(argv)
    options = {}
    if args.keep_projection:
        options['keep_projection'] = True
    if args.no_embed_class is not None:
        options['no_embed_class'] = args.no_embed_class == 'true'
    try:
        state_dict, report, _ = read_checkpoint(args.src, layout=args.layout,
                                                trust_checkpoint=args.trust_checkpoint,
                                                **options)
    except (OSError, UntrustedCheckpointError, KeyError, TypeError, ValueError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 1
    output = dict(state_dict=state_dict,
                  meta=dict(source_layout=report.source_layout, report=report.to_dict()))
    if report.extras:
        output['extras'] = dict(report.extras)
    out_dir = os.path.dirname(os.path.abspath(args.dst))
    os.makedirs(out_dir, exist_ok=True)
    torch.save(output, args.dst)
    print(report.format())
    print(f'wrote {len(state_dict)} tensors to {args.dst}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
