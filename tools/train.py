"""Train a segmentation (mmseg) or classification (mmpretrain) model from an mmlinvit config.

Same flags as mmseg's ``tools/train.py``; the config's ``default_scope`` picks the world.
Every data root and checkpoint the config names is checked before anything is built.

Examples::

    python tools/train.py configs/adala_dinov2_ade20k.py
    python tools/train.py CONFIG --work-dir work_dirs/x --amp --cfg-options train_cfg.max_iters=100
    python tools/train.py CONFIG --resume             # latest checkpoint of the work dir
    python tools/train.py CONFIG --check-data         # decode every image / label map first
    bash tools/dist_train.sh CONFIG 8                 # torchrun, --launcher pytorch
"""
import argparse
import sys
from typing import List, Optional

from mmlinvit.config_scopes import ConfigsNotInstalledError
from mmlinvit.engine.launch import (add_launch_arguments, build_runner, finish_distributed,
                                     load_config, parse_launch_args, prepare_train_config,
                                     user_errors)
from mmlinvit.engine.preflight import check_data


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Parses the command line (mmseg's train flags, plus ``--resume [CKPT]``)."""
    parser = argparse.ArgumentParser(description='Train a model from an mmlinvit config')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--work-dir', help='directory for logs and checkpoints')
    parser.add_argument(
        '--resume',
        nargs='?',
        const='auto',
        default=None,
        help='resume from CKPT, or from the latest checkpoint of the work dir if no CKPT is given')
    parser.add_argument('--amp', action='store_true', help='mixed-precision training')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the lr by the real batch (world size x batch size x '
                             'accumulative_counts) against auto_scale_lr.base_batch_size')
    parser.add_argument('--no-validate', action='store_true',
                        help='train without validation (mmpretrain\'s flag)')
    parser.add_argument('--no-pin-memory', action='store_true',
                        help='no data loader pins memory (mmpretrain\'s flag)')
    parser.add_argument('--no-persistent-workers', action='store_true',
                        help='no data loader keeps its workers between epochs (mmpretrain\'s '
                             'flag)')
    parser.add_argument('--check-data', action='store_true',
                        help='decode every image and label map of the train / val sets before '
                             'training; stop, naming the bad files, if any cannot be used')
    add_launch_arguments(parser, 'train_cfg.max_iters=1000 model.backbone.pretrained=x')
    return parse_launch_args(parser, argv)


def main(argv: Optional[List[str]] = None) -> None:
    """Loads the config, applies the flags, checks inputs and trains."""
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.cfg_options)
    except ConfigsNotInstalledError as err:
        raise SystemExit(f'error: {err}') from None
    try:
        prepare_train_config(cfg, args.config, work_dir=args.work_dir, resume=args.resume,
                             amp=args.amp, launcher=args.launcher,
                             auto_scale_lr=args.auto_scale_lr, no_validate=args.no_validate,
                             pin_memory=not args.no_pin_memory,
                             persistent_workers=not args.no_persistent_workers)
    except ValueError as err:
        raise SystemExit(f'error: {err}') from None
    try:
        runner = build_runner(cfg, mode='train')
        if args.check_data:
            check_data(cfg, mode='train')
        runner.train()  # checkpoints (load_from, pretrained=) are read here
    except user_errors() as err:
        raise SystemExit(f'error: {err}') from None
    finish_distributed()


if __name__ == '__main__':
    sys.exit(main())
