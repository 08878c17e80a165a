"""Sweep the attention-output distillation weight: raw lambda vs the normalised loss.

Seed 000 ("Copy the Same, Distill the Difference") trains a linear student with
``L = L_task + lambda * mean_i MSE(attn_out_i(student), attn_out_i(teacher))``, lambda = 50
everywhere.  That MSE scales with the teacher's attention-output mean square, so the same
lambda weighs distillation differently per teacher.  This tool compares, for the Random /
Copy / MLPCopy / FullCopy inits (:mod:`mmlinvit.transfer`) and several seeds:

* no distillation (``none``),
* the raw loss, ``mmlinvit.AttentionOutputMSELoss`` with lambda in ``--raw`` (5, 50, 500),
* the normalised loss, ``mmlinvit.NormalizedAttentionOutputMSELoss`` (per-block MSE divided
  by the teacher's mean square) with lambda in ``--normalized`` (0.1, 1, 10),

on two tasks:

``digits``
    scikit-learn's 8 x 8 digits (real images, upsampled to 32 x 32), a 4-block softmax ViT
    teacher trained here for real (the set-up of ``tests/distill/test_digits_stage1.py``,
    two blocks deeper), a linear student of the same architecture with a new linear head,
    trained ``--digits-iters`` AdamW steps (seed 000's recipe: lr 2e-3, wd 0.05, clip 3,
    label smoothing 0.1, cosine) in a plain PyTorch loop with the torch-only recorders and
    losses of :mod:`mmlinvit.distill`.  Metric: held-out top-1 accuracy (397 images).
``scenes``
    the embedded demo's drawn outdoor scenes (:mod:`mmlinvit.datasets.synthetic_scenes`):
    the demo's softmax UPerNet teacher (``configs/demo/``, ``TEACHER_CFG`` of ``tools/demo.py``,
    trained here), and a UPerNet student whose backbone is linearized and initialised from
    the teacher backbone, trained through the real mmengine Runner as an
    ``mmlinvit.DistillationModel`` (the layout of
    ``configs/segmentation/upernet_deit-b-relu-fullcopy-distill_*``) for ``--scenes-iters``
    iterations.  Metric: validation mIoU (mmseg ``IoUMetric``).

Every finished run is appended to ``<work-dir>/results.jsonl``; a rerun skips the runs found
there, so an interrupted sweep resumes.  The tables (mean +- sample std over seeds per init and
setting, and the "regret" of each setting: how far it lands below the best setting of the
same init, averaged over inits) go to ``<work-dir>/tables.md`` and stdout::

    python tools/analysis/sweep_distill_weight.py --tasks digits scenes --seeds 0 1 2 \\
        --work-dir work_dirs/sweep_distill
    python tools/analysis/sweep_distill_weight.py --quick --work-dir /tmp/sweep   # ~3 min
"""
import argparse
import copy
import json
import os
import os.path as osp
import sys
import time
from typing import Dict, List, Optional

import numpy as np
import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, REPO)

from mmlinvit.analysis import attention_output_stats  # noqa: E402
from mmlinvit.analysis.digits_distill import prepare_digits, run_digits  # noqa: E402
from mmlinvit.analysis.distill_weight_sweep import (INIT_LABELS, LOSS_TYPES,  # noqa: E402
                                                    Setting, build_distill_loss,
                                                    drop_partial_last_line, load_results,
                                                    record_key, run_key, setting_label,
                                                    summarise, sweep_settings)
from mmlinvit.engine.resume import last_checkpoint_target  # noqa: E402
from mmlinvit.utils.cli import load_script  # noqa: E402

INITS = tuple(INIT_LABELS)

#: Lengths of the two plans (``--quick``: the smoke test).
PLANS = {
    'full': dict(digits_teacher_epochs=30, digits_iters=150, digits_student_train=200,
                 scenes_teacher_iters=300, scenes_iters=150, num_train=160, num_val=40,
                 batch=32, scenes_batch=8),
    'quick': dict(digits_teacher_epochs=1, digits_iters=3, digits_student_train=64,
                  scenes_teacher_iters=2, scenes_iters=2, num_train=8, num_val=4, batch=32,
                  scenes_batch=4),
}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--tasks', nargs='+', default=['digits', 'scenes'],
                        choices=['digits', 'scenes'])
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    parser.add_argument('--inits', nargs='+', default=list(INITS), choices=list(INITS))
    parser.add_argument('--raw', nargs='*', type=float, default=[5.0, 50.0, 500.0],
                        help='lambdas of the raw AttentionOutputMSELoss (seed 000: 50)')
    parser.add_argument('--normalized', nargs='*', type=float, default=[0.1, 1.0, 10.0],
                        help='lambdas of NormalizedAttentionOutputMSELoss')
    parser.add_argument('--no-baseline', action='store_true',
                        help='skip the runs without distillation')
    parser.add_argument('--operator', default='relu',
                        help="student attention operator (attn_cfg), e.g. 'relu' or 'elu'")
    parser.add_argument('--digits-iters', type=int, default=None,
                        help='student steps on digits (default: 150; --quick: 3)')
    parser.add_argument('--scenes-iters', type=int, default=None,
                        help='student iterations on the scenes (default: 150; --quick: 2)')
    parser.add_argument('--work-dir', default='work_dirs/sweep_distill_weight')
    parser.add_argument('--quick', action='store_true', help='a few steps (smoke test)')
    parser.add_argument('--threads', type=int, default=1, help='torch CPU threads')
    args = parser.parse_args(argv)
    if not args.raw and not args.normalized and args.no_baseline:
        parser.error('nothing to run: give --raw and/or --normalized lambdas, or drop '
                     '--no-baseline')
    for name in ('tasks', 'seeds', 'inits'):  # one run per value: a repeat is not run twice
        setattr(args, name, list(dict.fromkeys(getattr(args, name))))
    return args


def settings_of(args: argparse.Namespace) -> List[Setting]:
    """The settings in table order: ``('none', 0)``, then raw and normalised lambdas."""
    return sweep_settings(args.raw, args.normalized, baseline=not args.no_baseline)


# ----------------------------------------------------------------------------- scenes
_DEMO = {}


def _demo_module():
    """tools/demo.py as a module (its data, schedule and export helpers are reused)."""
    if 'module' not in _DEMO:
        _DEMO['module'] = load_script(osp.join(REPO, 'tools', 'demo.py'), 'mmlinvit_demo_tool')
    return _DEMO['module']


def last_metrics_hook():
    """A hook keeping the metrics of the last validation (the end-of-training one)."""
    from mmengine.hooks import Hook

    class LastMetricsHook(Hook):
        priority = 'LOWEST'

        def __init__(self) -> None:
            self.metrics = None

        def after_val_epoch(self, runner, metrics=None) -> None:
            self.metrics = dict(metrics or {})

    return LastMetricsHook()


def prepare_scenes(plan: dict, work_dir: str) -> dict:
    """Draws the scenes, trains (or reuses) the demo teacher, exports its backbone, and
    scores it.  The teacher is reused when ``<work_dir>/scenes/teacher.json`` exists."""
    demo = _demo_module()
    from mmlinvit.datasets import make_ade20k_layout
    root = osp.join(work_dir, 'scenes')
    data_root = osp.join(root, 'data', 'ADEChallengeData2016')
    info_file = osp.join(root, 'teacher.json')
    if osp.isfile(info_file):
        with open(info_file) as f:
            return json.load(f)
    make_ade20k_layout(data_root, plan['num_train'], plan['num_val'], size=(64, 64), seed=0)
    runner = demo.train_teacher(dict(teacher_iters=plan['scenes_teacher_iters']), data_root,
                                root, seed=0)
    ckpt = last_checkpoint_target(runner.work_dir)
    backbone = demo.export_backbone(ckpt, osp.join(runner.work_dir, 'backbone.pth'))
    metrics = runner.val()
    teacher = demo._unwrap(runner.model).backbone.eval()
    images = _scene_images(runner, 16)
    mean_sq, _ = attention_output_stats(teacher, teacher, images)
    info = dict(data_root=data_root, teacher_backbone=backbone,
                teacher_score=float(metrics['mIoU']),
                teacher_attn_mean_square=mean_sq)
    with open(info_file + '.tmp', 'w') as f:
        json.dump(info, f, indent=2)
    os.replace(info_file + '.tmp', info_file)  # a crash never leaves a half-written file
    return info


@torch.no_grad()
def _scene_images(runner, count: int) -> torch.Tensor:
    """The first ``count`` validation images, through the segmentor's data preprocessor."""
    model = _demo_module()._unwrap(runner.model)
    images = []
    for batch in runner.val_dataloader:
        images.append(model.data_preprocessor(batch, False)['inputs'])
        if sum(len(i) for i in images) >= count:
            break
    return torch.cat(images)[:count]


def scenes_config(info: dict, init: str, setting: Setting, seed: int, operator: str,
                  iters: int, batch_size: int, work_dir: str):
    """The student's DistillationModel config (UPerNet student, frozen backbone teacher)."""
    from mmengine.config import Config
    from mmlinvit.engine.launch import prepare_train_config
    demo = _demo_module()
    cfg = Config.fromfile(demo.TEACHER_CFG, format_python_code=False)
    demo._set_toy_data(cfg, info['data_root'])
    cfg.train_dataloader.batch_size = batch_size
    student = cfg.model.to_dict()
    tb = student['backbone']
    teacher = dict(type='mmlinvit.VisionTransformer', arch=dict(tb['arch']), family=tb['family'],
                   img_size=tb['img_size'], patch_size=tb['patch_size'], attn_cfg='softmax',
                   out_type='featmap', pretrained=info['teacher_backbone'])
    student['backbone'].update(type='mmlinvit.LinearVisionTransformer', attn_cfg=operator,
                               pretrained=None)
    # The student's data preprocessor (size=crop_size), named explicitly: without it the
    # Runner would give the DistillationModel the config's top-level `data_preprocessor`,
    # which the demo config inherits from _base_/models/upernet_vit.py with size=(512, 512)
    # and which would pad every 64 x 64 crop to 512 x 512.
    model = dict(type='mmlinvit.DistillationModel', student=student, teacher=teacher,
                 weight_transfer=dict(type=init), check_input_size=(64, 64),
                 data_preprocessor=copy.deepcopy(student['data_preprocessor']))
    kind, weight = setting
    if kind != 'none':
        model.update(
            student_recorders=dict(
                attn_out=dict(type='ModuleOutputs', source='backbone.blocks.{i}.attn')),
            teacher_recorders=dict(attn_out=dict(type='ModuleOutputs', source='blocks.{i}.attn')),
            distill_losses=dict(attn_out=dict(
                loss=dict(type=LOSS_TYPES[kind], loss_weight=weight),
                inputs=dict(student_outputs='student.attn_out',
                            teacher_outputs='teacher.attn_out'))))
    cfg.model = model
    # seed 000's optimiser (AdamW lr 2e-3, wd 0.05, clip 3), the demo's iteration schedule
    cfg.optim_wrapper = dict(type='OptimWrapper',
                             optimizer=dict(type='AdamW', lr=2e-3, betas=(0.9, 0.999),
                                            weight_decay=0.05),
                             clip_grad=dict(max_norm=3.0))
    demo._iters_schedule(cfg, iters, warmup=max(1, iters // 10))
    cfg.default_hooks.checkpoint = None  # nothing of a sweep run is kept but its metric
    cfg.randomness = dict(seed=seed)
    cfg.log_level = 'WARNING'
    name = f'{init}_{kind}-{weight:g}_seed{seed}'
    cfg.experiment_name = f'sweep_{name}_{int(time.time() * 1000)}'
    return prepare_train_config(cfg, demo.TEACHER_CFG, work_dir=osp.join(work_dir, name))


def run_scenes(info: dict, init: str, setting: Setting, seed: int, operator: str, iters: int,
               batch_size: int, work_dir: str) -> dict:
    """One student run on the scenes through the mmengine Runner; returns the mIoU."""
    from mmlinvit.engine.launch import build_runner
    cfg = scenes_config(info, init, setting, seed, operator, iters, batch_size,
                        osp.join(work_dir, 'scenes', 'runs'))
    runner = build_runner(cfg, mode='train')
    hook = last_metrics_hook()
    runner.register_hook(hook)
    runner.train()  # validates after the last iteration
    metrics = hook.metrics
    model = _demo_module()._unwrap(runner.model)
    teacher = model.teacher.eval()
    images = _scene_images(runner, 16)
    _, gaps = attention_output_stats(model.student.backbone, teacher, images)
    losses = getattr(model, 'distill_losses', None) or {}
    return dict(score=float(metrics['mIoU']), attn_rel_gap=float(np.mean(gaps)),
                copied=len(model.transfer_report.copied),
                loss=type(losses['attn_out']).__name__ if 'attn_out' in losses else None)


# ----------------------------------------------------------------------------- main
def main(argv: Optional[List[str]] = None) -> str:
    """Runs the sweep (resuming from ``results.jsonl``); returns the markdown tables."""
    args = parse_args(argv)
    plan = dict(PLANS['quick' if args.quick else 'full'])
    if args.digits_iters is not None:
        plan['digits_iters'] = args.digits_iters
    if args.scenes_iters is not None:
        plan['scenes_iters'] = args.scenes_iters
    torch.set_num_threads(args.threads)
    work_dir = osp.abspath(args.work_dir)
    os.makedirs(work_dir, exist_ok=True)
    results_file = osp.join(work_dir, 'results.jsonl')
    settings = settings_of(args)
    dropped = drop_partial_last_line(results_file)
    if dropped is not None:
        print(f'[sweep] {results_file}: dropped an unfinished last line (its run is redone): '
              f'{dropped[:80]!r}', flush=True)
    done = {record_key(r) for r in load_results(results_file)}
    teachers: Dict[str, dict] = {}
    for task in args.tasks:
        start = time.time()
        if task == 'digits':
            data = prepare_digits(plan['digits_student_train'], plan['digits_teacher_epochs'])
            teachers[task] = dict(teacher_score=data['teacher_score'],
                                  teacher_attn_mean_square=data['teacher_attn_mean_square'])
        else:
            data = prepare_scenes(plan, work_dir)
            teachers[task] = data
        print(f'[sweep] {task}: teacher {teachers[task]["teacher_score"]:.2f}, attention-output '
              f'mean square per block {teachers[task]["teacher_attn_mean_square"]} '
              f'({time.time() - start:.0f} s)', flush=True)
        for seed in args.seeds:
            for init in args.inits:
                for setting in settings:
                    if run_key(task, init, setting, seed, plan[f'{task}_iters'],
                               args.operator) in done:
                        continue
                    start = time.time()
                    if task == 'digits':
                        out = run_digits(data, init, build_distill_loss(setting), seed,
                                         args.operator, plan['digits_iters'], plan['batch'])
                    else:
                        out = run_scenes(data, init, setting, seed, args.operator,
                                         plan['scenes_iters'], plan['scenes_batch'], work_dir)
                    record = dict(task=task, init=init, kind=setting[0],
                                  weight=float(setting[1]), seed=seed, operator=args.operator,
                                  iters=plan[f'{task}_iters'], seconds=time.time() - start,
                                  **out)
                    with open(results_file, 'a') as f:
                        f.write(json.dumps(record) + '\n')
                    print(f'[sweep] {task} seed {seed} {INIT_LABELS[init]:<8} '
                          f'{setting_label(setting):<11} score {out["score"]:6.2f}  attention '
                          f'rel. gap {out["attn_rel_gap"]:.3f}  ({record["seconds"]:.1f} s)',
                          flush=True)
    # only the runs of this invocation's grid and lengths enter the tables
    results = [r for r in load_results(results_file)
               if r['task'] in args.tasks and r['seed'] in args.seeds and r['init'] in args.inits
               and (r['kind'], float(r['weight'])) in settings
               and r['iters'] == plan[f'{r["task"]}_iters'] and r['operator'] == args.operator]
    tables = summarise(results, settings, args.inits, teachers)
    with open(osp.join(work_dir, 'tables.md'), 'w') as f:
        f.write(tables)
    print(tables)
    return tables


if __name__ == '__main__':
    main()
