"""Evaluate a checkpoint of a segmentation (mmseg) or classification (mmpretrain) config.

Same flags as mmseg's ``tools/test.py``; the config's ``default_scope`` picks the world.

CHECKPOINT supplies every weight evaluated: the config's own checkpoint paths (``pretrained=``,
``Pretrained`` init_cfg, a distillation teacher's ``pretrained=`` / ``teacher_ckpt``) are not
read and need not exist, and a CHECKPOINT that misses weights of the model is refused
(``--cfg-options check_checkpoint_coverage=False`` evaluates it anyway, the missing weights at
their random initialisation).

Examples::

    python tools/test.py configs/adala_dinov2_ade20k.py work_dirs/x/iter_160000.pth
    python tools/test.py CONFIG CKPT --show-dir work_dirs/x/vis
    python tools/test.py CONFIG CKPT --cfg-options model.test_cfg.mode=slide
    python tools/test.py CONFIG CKPT --tta   # multi-scale + flip (segmentation), flip (classification)
    bash tools/dist_test.sh CONFIG CKPT 8
"""
import argparse
import sys
from typing import List, Optional

import mmengine
from mmengine.dist import is_main_process

from mmlinvit.config_scopes import ConfigsNotInstalledError
from mmlinvit.engine.launch import (OUT_ITEMS, EvaluationFlagError, add_launch_arguments,
                                     build_runner, finish_distributed, load_config,
                                     parse_launch_args, prepare_test_config, user_errors)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Parses the command line (mmseg's test flags)."""
    parser = argparse.ArgumentParser(description='Evaluate a checkpoint of an mmlinvit config')
    parser.add_argument('config', help='config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='directory for the evaluation logs')
    parser.add_argument('--out', help='directory where raw predictions are dumped (mmseg) or '
                        'a pickle file of results (mmpretrain)')
    parser.add_argument('--out-item', choices=OUT_ITEMS,
                        help='classification (mmpretrain\'s flag): dump the predictions '
                             '(pred, the default) or the metrics to --out')
    parser.add_argument('--no-pin-memory', action='store_true',
                        help='do not pin memory in the test data loader')
    parser.add_argument('--show', action='store_true', help='display predictions')
    parser.add_argument('--show-dir', help='directory where painted predictions are saved')
    parser.add_argument('--wait-time', type=float, default=2, help='seconds per shown image')
    parser.add_argument('--interval', type=int, default=1, help='visualise every N-th sample')
    parser.add_argument('--amp', action='store_true',
                        help='mixed-precision evaluation (mmpretrain\'s flag): mmengine\'s '
                             'TestLoop with fp16=True')
    parser.add_argument('--tta', action='store_true',
                        help='test-time augmentation: the config\'s tta_pipeline (segmentation '
                             'bases: 6 scales x horizontal flip) through its tta_model; '
                             'classification configs without them: scores averaged with and '
                             'without a horizontal flip (mmpretrain\'s default)')
    add_launch_arguments(parser, 'model.test_cfg.mode=slide')
    return parse_launch_args(parser, argv)


def main(argv: Optional[List[str]] = None) -> dict:
    """Loads the config, applies the flags, checks inputs and evaluates; returns the metrics."""
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.cfg_options)
    except ConfigsNotInstalledError as err:
        raise SystemExit(f'error: {err}') from None
    try:
        prepare_test_config(cfg, args.config, args.checkpoint, work_dir=args.work_dir,
                            show_dir=args.show_dir, show=args.show, wait_time=args.wait_time,
                            interval=args.interval, out=args.out, launcher=args.launcher,
                            tta=args.tta, out_item=args.out_item,
                            pin_memory=not args.no_pin_memory, amp=args.amp)
    except EvaluationFlagError as err:
        raise SystemExit(f'error: {err}') from None
    try:
        runner = build_runner(cfg, mode='test', checkpoint=args.checkpoint)
        metrics = runner.test()  # the checkpoint is read here
    except user_errors() as err:
        raise SystemExit(f'error: {err}') from None
    if args.out_item == 'metrics' and is_main_process():
        mmengine.dump(metrics, args.out)  # as mmpretrain's tools/test.py
    finish_distributed()
    return metrics


if __name__ == '__main__':
    main()
    sys.exit(0)
