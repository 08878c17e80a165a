"""Exports the student backbone of a ``mmlinvit.DistillationModel`` checkpoint.

Usage::

    python tools/model_converters/export_student.py SRC DST [--whole-student]
        [--trust-checkpoint]

SRC is a checkpoint of a distillation run (``epoch_N.pth`` / ``iter_N.pth`` of the runner, or
any state dict with ``student.*`` keys).  A runner checkpoint is read safely
(``weights_only=True``, its training state read as inert stand-ins); ``--trust-checkpoint``
is only needed for files holding other Python objects.  DST receives
the student backbone's weights alone: the keys under ``student.backbone.`` (task-model student) or ``student.`` (bare-backbone
student, e.g. the ViT-Linearizer Adventurer) with the prefix removed, as a plain
``{name: tensor}`` dict readable with ``torch.load(weights_only=True)`` -- the same file
``mmlinvit.ExportStudentHook`` writes.  Connectors, the wrapper's mask token and masking
step, and everything else outside the student backbone are left out and listed.  No layout
conversion happens: backbone configs load DST with ``pretrained=DST``.

``--whole-student`` keeps the whole student task model instead (``student.*`` without the
prefix: the backbone with the trained head / neck / decode heads), the checkpoint of a plain
student config: ``tools/test.py STUDENT_CONFIG DST`` and ``tools/infer.py`` evaluate and run the
distilled classifier or segmentor without the teacher.
"""
import argparse
import os
import sys
from typing import Dict, List, Optional, Tuple

import torch

from mmlinvit.converters import (STUDENT_PREFIXES, UntrustedCheckpointError,
                                 load_checkpoint_file, select_backbone)
from mmlinvit.utils.cli import checkpoint_io_parser


def select_student_backbone(
        state_dict: Dict[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], str, List[str]]:
    """Keeps the student backbone's keys of a distillation checkpoint.

    The student prefixes (``mmlinvit.converters.STUDENT_PREFIXES``) come from the one prefix
    table that backbones use to read ``pretrained`` files.

    Args:
        state_dict: Flat checkpoint state dict (``module.`` already stripped or not).

    Returns:
        (student backbone state dict, the prefix used, the dropped keys).

    Raises:
        KeyError: when no key carries a student prefix.
    """
    kept, report = select_backbone(state_dict, STUDENT_PREFIXES)
    if report.prefix:
        return kept, report.prefix, sorted(report.dropped)
    raise KeyError(f'No key starts with {STUDENT_PREFIXES}: this is not a '
                   f'mmlinvit.DistillationModel checkpoint (first keys: '
                   f'{sorted(state_dict)[:8]}); a plain backbone file needs no export')


def select_whole_student(
        state_dict: Dict[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """Keeps the whole student of a distillation checkpoint (``student.*``, prefix removed).

    Args:
        state_dict: Flat checkpoint state dict (``module.`` already stripped or not).

    Returns:
        (student state dict, the dropped keys).

    Raises:
        KeyError: when no key starts with ``student.``.
    """
    kept, report = select_backbone(state_dict, ('student.', ))
    if report.prefix:
        return kept, sorted(report.dropped)
    raise KeyError(f'No key starts with \'student.\': this is not a '
                   f'mmlinvit.DistillationModel checkpoint (first keys: '
                   f'{sorted(state_dict)[:8]})')


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = checkpoint_io_parser(
        'Export the student backbone of a distillation checkpoint.',
        ('src', 'distillation checkpoint (runner epoch_N.pth / iter_N.pth)'),
        ('dst', 'output weights file'),
        trust='a file holding Python objects besides tensors and mmengine\'s training state '
              '(runner checkpoints of this project read without it)')
    parser.add_argument('--whole-student', action='store_true',
                        help='keep the whole student task model (backbone and trained head / '
                             'neck / decode heads, keys without "student."), the checkpoint of '
                             'a plain student config for tools/test.py and tools/infer.py')
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the export; returns the process exit code."""
    args = parse_args(argv)
    try:
        raw = load_checkpoint_file(args.src, trust_checkpoint=args.trust_checkpoint)
        if args.whole_student:
            state, dropped = select_whole_student(raw)
            prefix = 'student.'
        else:
            state, prefix, dropped = select_student_backbone(raw)
    except (OSError, UntrustedCheckpointError, KeyError, TypeError, ValueError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(os.path.abspath(args.dst)), exist_ok=True)
    torch.save({k: v.detach().cpu().clone() for k, v in state.items()}, args.dst)
    print(f'kept the {len(state)} tensors under {prefix!r}; dropped {len(dropped)}: '
          f'{", ".join(dropped[:12])}{" ..." if len(dropped) > 12 else ""}')
    print(f'wrote {args.dst}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
