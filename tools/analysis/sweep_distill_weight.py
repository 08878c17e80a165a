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
there, so an interrupted sweep resumes.  The tables (mean +- std over seeds per init and
setting, and the "regret" of each setting: how far it lands below the best setting of the
same init, averaged over inits) go to ``<work-dir>/tables.md`` and stdout::

    python tools/analysis/sweep_distill_weight.py --tasks digits scenes --seeds 0 1 2 \\
        --work-dir work_dirs/sweep_distill
    python tools/analysis/sweep_distill_weight.py --quick --work-dir /tmp/sweep   # seconds
"""
import argparse
import copy
import json
import math
import os
import os.path as osp
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, REPO)

from mmlinvit.backbones import LinearVisionTransformer, VisionTransformer  # noqa: E402
from mmlinvit.distill import ModuleOutputsRecorder  # noqa: E402
from mmlinvit.distill.losses import (AttentionOutputMSELoss,  # noqa: E402
                                     NormalizedAttentionOutputMSELoss)
from mmlinvit.transfer import transfer_weights  # noqa: E402

#: Loss types of the two kinds of setting (``none`` trains without distillation).
LOSS_TYPES = {'raw': 'mmlinvit.AttentionOutputMSELoss',
              'normalized': 'mmlinvit.NormalizedAttentionOutputMSELoss'}
INITS = ('random', 'copy', 'mlp_copy', 'full_copy')
INIT_LABELS = {'random': 'Random', 'copy': 'Copy', 'mlp_copy': 'MLPCopy',
               'full_copy': 'FullCopy'}
#: The digits ViT: 4 blocks of width 32, 8 px patches on 32 x 32 images (16 patches + cls).
DIGITS_VIT = dict(arch=dict(embed_dims=32, num_layers=4, num_heads=2, mlp_hidden_dims=64),
                  family='deit', patch_size=8, img_size=32, out_type='cls_token')
DIGITS_TRAIN = 1400  # the rest (397) is the held-out set

#: Lengths of the two plans (``--quick``: the smoke test).
PLANS = {
    'full': dict(digits_teacher_epochs=30, digits_iters=150, digits_student_train=200,
                 scenes_teacher_iters=300, scenes_iters=150, num_train=160, num_val=40,
                 batch=32, scenes_batch=8),
    'quick': dict(digits_teacher_epochs=1, digits_iters=3, digits_student_train=64,
                  scenes_teacher_iters=2, scenes_iters=2, num_train=8, num_val=4, batch=32,
                  scenes_batch=4),
}

Setting = Tuple[str, float]


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
                        help='student steps on digits (default: 300; --quick: 3)')
    parser.add_argument('--scenes-iters', type=int, default=None,
                        help='student iterations on the scenes (default: 150; --quick: 2)')
    parser.add_argument('--work-dir', default='work_dirs/sweep_distill_weight')
    parser.add_argument('--quick', action='store_true', help='a few steps (smoke test)')
    parser.add_argument('--threads', type=int, default=1, help='torch CPU threads')
    args = parser.parse_args(argv)
    if not args.raw and not args.normalized and args.no_baseline:
        parser.error('nothing to run: give --raw and/or --normalized lambdas, or drop '
                     '--no-baseline')
    return args


def settings_of(args: argparse.Namespace) -> List[Setting]:
    """The settings in table order: ``('none', 0)``, then raw and normalised lambdas."""
    out: List[Setting] = [] if args.no_baseline else [('none', 0.0)]
    out += [('raw', float(w)) for w in args.raw]
    out += [('normalized', float(w)) for w in args.normalized]
    return out


def setting_label(setting: Setting) -> str:
    """``'w/o distill'``, ``'raw 50'``, ``'norm 1'``."""
    kind, weight = setting
    if kind == 'none':
        return 'w/o distill'
    return f'{"raw" if kind == "raw" else "norm"} {weight:g}'


def build_distill_loss(setting: Setting) -> Optional[nn.Module]:
    """The torch-only loss of a setting (``None`` for ``'none'``)."""
    kind, weight = setting
    if kind == 'none':
        return None
    if kind == 'raw':
        return AttentionOutputMSELoss(loss_weight=weight)
    if kind == 'normalized':
        return NormalizedAttentionOutputMSELoss(loss_weight=weight)
    raise ValueError(f"Unknown setting kind {kind!r}; use 'none', 'raw' or 'normalized'")


# ----------------------------------------------------------------------------- digits
def load_digits() -> Tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn digits as (1797, 3, 32, 32) uint8 and labels, in a fixed random order."""
    from sklearn.datasets import load_digits as sk_load_digits
    digits = sk_load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(32, 32), mode='bilinear', align_corners=False)
    x = (x.clamp(0, 1) * 255).round().to(torch.uint8).repeat(1, 3, 1, 1)
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    return x[order], y[order]


def _normalise(x_uint8: torch.Tensor) -> torch.Tensor:
    return (x_uint8.float() - 127.5) / 127.5


def _cosine_schedule(optimizer: torch.optim.Optimizer, total: int,
                     warmup: int) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 1e-3 + (1 - 1e-3) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@torch.no_grad()
def _accuracy(backbone: nn.Module, head: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    backbone.eval()
    logits = head(backbone(_normalise(x))[0])
    backbone.train()
    return float((logits.argmax(1) == y).float().mean())


def train_digits_teacher(x: torch.Tensor, y: torch.Tensor, epochs: int,
                         batch_size: int) -> Tuple[VisionTransformer, nn.Linear]:
    """The softmax teacher (seed 0), trained from scratch with AdamW + one-cycle."""
    torch.manual_seed(0)
    backbone = VisionTransformer(attn_cfg='softmax', **DIGITS_VIT)
    head = nn.Linear(DIGITS_VIT['arch']['embed_dims'], 10)
    params = list(backbone.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=5e-3, weight_decay=0.01)
    steps = epochs * -(-len(x) // batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=5e-3, total_steps=steps,
                                                   pct_start=0.1)
    generator = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch_size):
            idx = order[start:start + batch_size]
            loss = F.cross_entropy(head(backbone(_normalise(x[idx]))[0]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return backbone.eval(), head.eval()


@torch.no_grad()
def attention_output_stats(student: nn.Module, teacher: nn.Module,
                           x: torch.Tensor) -> Tuple[List[float], List[float]]:
    """Per block: the teacher's attention-output mean square, and the student's relative gap
    ``mean((s-t)^2) / mean(t^2)`` (both run on the same images, each on its own stream)."""
    was_training = student.training
    student.eval()
    with ModuleOutputsRecorder('blocks.{i}.attn').attach(teacher) as t_rec, \
            ModuleOutputsRecorder('blocks.{i}.attn').attach(student) as s_rec:
        teacher(x)
        student(x)
        t_out, s_out = t_rec.get(), s_rec.get()
    student.train(was_training)
    mean_sq = [float(t.pow(2).mean()) for t in t_out]
    gaps = [float((s - t).pow(2).mean() / t.pow(2).mean()) for s, t in zip(s_out, t_out)]
    return mean_sq, gaps


def run_digits(data: dict, init: str, setting: Setting, seed: int, operator: str,
               iters: int, batch_size: int) -> dict:
    """One student run on digits; returns held-out accuracy and attention-output gaps."""
    teacher = data['teacher']
    torch.manual_seed(seed)
    student = LinearVisionTransformer(attn_cfg=operator, **DIGITS_VIT)
    head = nn.Linear(DIGITS_VIT['arch']['embed_dims'], 10)
    report = transfer_weights(student, teacher, strategy=init)
    loss_fn = build_distill_loss(setting)
    params = list(student.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.05)
    schedule = _cosine_schedule(optimizer, iters, warmup=max(1, iters // 10))
    x, y = data['x_student'], data['y_student']
    generator = torch.Generator().manual_seed(1000 + seed)
    order, cursor = torch.randperm(len(x), generator=generator), 0
    student.train()
    s_rec = ModuleOutputsRecorder('blocks.{i}.attn').attach(student)
    t_rec = ModuleOutputsRecorder('blocks.{i}.attn').attach(teacher)
    with s_rec, t_rec:
        for _ in range(iters):
            if cursor + batch_size > len(x):
                order, cursor = torch.randperm(len(x), generator=generator), 0
            idx = order[cursor:cursor + batch_size]
            cursor += batch_size
            images = _normalise(x[idx])
            loss = F.cross_entropy(head(student(images)[0]), y[idx], label_smoothing=0.1)
            if loss_fn is not None:
                with torch.no_grad():
                    teacher(images)
                loss = loss + loss_fn(s_rec.get(), t_rec.get())
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(params, 3.0)
            optimizer.step()
            schedule.step()
    accuracy = _accuracy(student, head, data['x_test'], data['y_test'])
    _, gaps = attention_output_stats(student, teacher, _normalise(data['x_test']))
    return dict(score=100 * accuracy, attn_rel_gap=float(np.mean(gaps)),
                copied=len(report.copied),
                loss=None if loss_fn is None else type(loss_fn).__name__)


def prepare_digits(plan: dict) -> dict:
    """Loads digits, trains the teacher, measures its accuracy and attention scale."""
    x, y = load_digits()
    data = dict(x_train=x[:DIGITS_TRAIN], y_train=y[:DIGITS_TRAIN], x_test=x[DIGITS_TRAIN:],
                y_test=y[DIGITS_TRAIN:])
    # the downstream set: a small labelled subset of the teacher's training images
    data['x_student'] = data['x_train'][:plan['digits_student_train']]
    data['y_student'] = data['y_train'][:plan['digits_student_train']]
    teacher, head = train_digits_teacher(data['x_train'], data['y_train'],
                                         plan['digits_teacher_epochs'], 64)
    for p in teacher.parameters():
        p.requires_grad_(False)
    data['teacher'] = teacher
    data['teacher_score'] = 100 * _accuracy(teacher, head, data['x_test'], data['y_test'])
    teacher.eval()
    mean_sq, _ = attention_output_stats(teacher, teacher, _normalise(data['x_test']))
    data['teacher_attn_mean_square'] = mean_sq
    return data


# ----------------------------------------------------------------------------- scenes
_DEMO = {}


def _demo_module():
    """tools/demo.py as a module (its data, schedule and export helpers are reused)."""
    if 'module' in _DEMO:
        return _DEMO['module']
    import importlib.util
    spec = importlib.util.spec_from_file_location('mmlinvit_demo_tool',
                                                  osp.join(REPO, 'tools', 'demo.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _DEMO['module'] = module
    return module


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
    ckpt = demo._last_checkpoint(runner.work_dir)
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
    model = runner.model.module if hasattr(runner.model, 'module') else runner.model
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
    model = runner.model.module if hasattr(runner.model, 'module') else runner.model
    teacher = model.teacher.eval()
    images = _scene_images(runner, 16)
    _, gaps = attention_output_stats(model.student.backbone, teacher, images)
    losses = getattr(model, 'distill_losses', None) or {}
    return dict(score=float(metrics['mIoU']), attn_rel_gap=float(np.mean(gaps)),
                copied=len(model.transfer_report.copied),
                loss=type(losses['attn_out']).__name__ if 'attn_out' in losses else None)


# ----------------------------------------------------------------------------- tables
def load_results(path: str) -> List[dict]:
    """The runs recorded so far (one JSON object per line), one per run: when two sweeps
    sharing a work dir recorded the same run, the last record counts."""
    if not osp.isfile(path):
        return []
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    unique = {}
    for r in records:
        unique[_key(r['task'], r['init'], (r['kind'], r['weight']), r['seed'], r['iters'],
                    r['operator'])] = r
    return list(unique.values())


def _key(task: str, init: str, setting: Setting, seed: int, iters: int,
         operator: str) -> tuple:
    return (task, init, setting[0], float(setting[1]), int(seed), int(iters), operator)


def summarise(results: Sequence[dict], settings: Sequence[Setting], inits: Sequence[str],
              teachers: Dict[str, dict]) -> str:
    """Markdown: per task a table (init x setting, mean +- std over seeds) and the regret
    table (per setting and task: mean over inits of best-of-init minus this setting)."""
    metric = {'digits': 'held-out accuracy (%)', 'scenes': 'validation mIoU (%)'}
    lines: List[str] = []
    regrets: Dict[str, Dict[Setting, float]] = {}
    tasks = [t for t in ('digits', 'scenes') if any(r['task'] == t for r in results)]
    for task in tasks:
        cell: Dict[Tuple[str, Setting], List[float]] = {}
        for r in results:
            if r['task'] == task:
                cell.setdefault((r['init'], (r['kind'], float(r['weight']))), []).append(
                    r['score'])
        seeds = sorted({r['seed'] for r in results if r['task'] == task})
        iters = sorted({r['iters'] for r in results if r['task'] == task})
        operators = sorted({r['operator'] for r in results if r['task'] == task})
        teacher = teachers.get(task, {})
        lines.append(f'\n### {task}: {metric[task]}, mean +- std over seeds {seeds} '
                     f'({"/".join(operators)} students, {"/".join(map(str, iters))} '
                     f'iterations)')
        if teacher:
            ms = teacher.get('teacher_attn_mean_square', [])
            lines.append(f'softmax teacher: {teacher["teacher_score"]:.2f}; teacher attention-'
                         f'output mean square per block: '
                         f'{", ".join(f"{v:.4g}" for v in ms)}\n')
        lines.append('| init | ' + ' | '.join(setting_label(s) for s in settings) + ' |')
        lines.append('|---' * (len(settings) + 1) + '|')
        best_of_init = {}
        for init in inits:
            means = {s: float(np.mean(cell[(init, s)])) for s in settings if (init, s) in cell}
            best_of_init[init] = max(means.values()) if means else float('nan')
            row = []
            for s in settings:
                values = cell.get((init, s))
                if not values:
                    row.append('-')
                    continue
                text = f'{np.mean(values):.1f} +- {np.std(values):.1f}'
                row.append(f'**{text}**' if means[s] == best_of_init[init] else text)
            lines.append(f'| {INIT_LABELS[init]} | ' + ' | '.join(row) + ' |')
        regrets[task] = {}
        for s in settings:
            gaps = [best_of_init[i] - np.mean(cell[(i, s)]) for i in inits if (i, s) in cell]
            if len(gaps) == len(inits):
                regrets[task][s] = float(np.mean(gaps))
    if regrets:
        lines.append('\n### regret: mean over inits of (best setting of that init - this '
                     'setting), points; lower is better')
        lines.append('| setting | ' + ' | '.join(tasks) + ' | worst task |')
        lines.append('|---' * (len(tasks) + 2) + '|')
        worst = {}
        for s in settings:
            values = [regrets[t].get(s) for t in tasks]
            if any(v is None for v in values):
                continue
            worst[s] = max(values)
            lines.append(f'| {setting_label(s)} | ' + ' | '.join(f'{v:.2f}' for v in values) +
                         f' | {worst[s]:.2f} |')
        if worst:
            best = min(worst, key=worst.get)
            lines.append(f'\nsetting with the smallest worst-task regret: '
                         f'**{setting_label(best)}** ({worst[best]:.2f} points)')
    return '\n'.join(lines) + '\n'


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
    done = {_key(r['task'], r['init'], (r['kind'], r['weight']), r['seed'], r['iters'],
                 r['operator']) for r in load_results(results_file)}
    teachers: Dict[str, dict] = {}
    for task in args.tasks:
        start = time.time()
        if task == 'digits':
            data = prepare_digits(plan)
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
                    if _key(task, init, setting, seed, plan[f'{task}_iters'],
                            args.operator) in done:
                        continue
                    start = time.time()
                    if task == 'digits':
                        out = run_digits(data, init, setting, seed, args.operator,
                                         plan['digits_iters'], plan['batch'])
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
