"""Which layers to linearize: per-layer sensitivity, cost shares and hybrid proposals.

Given a softmax teacher (a config whose ``model.backbone`` is a ``mmlinvit`` ViT, and its
backbone weights) and a linear operator, the tool

1. linearizes ONE layer at a time (``attn_cfg`` list: the operator in layer i, softmax
   elsewhere, every weight from the teacher) and aligns that layer with a short Stage 1 in the
   manner of ViT-AdaLA: teacher forcing (the layer's attention sees the teacher's block input),
   attention-output MSE, only that layer's attention parameters train (``--align-iters``
   AdamW steps on batches of the config's train dataloader, through its data preprocessor;
   the aligned weights are kept only if they lower the layer's gap on those training images,
   else the teacher-initialised layer is kept and the table says "discarded");
2. reports per layer the aligned attention-output gap and the *output-feature gap* of the
   whole single-hybrid backbone on validation images, ``mean((f_s - f_t)^2) / mean(f_t^2)``
   over the final normalised tokens, and the layer's share of the teacher backbone's time and
   FLOPs at ``--resolution`` (time measured per block, fastest of ``--repeats``; FLOPs counted
   with :class:`mmlinvit.analysis.FlopCounter`, convention FLOPs = 2 x MACs);
3. proposes one hybrid per budget k = 0..L (keep the k most sensitive layers softmax,
   linearize the rest): predicted time and FLOPs (teacher minus the per-layer savings),
   measured time of the hybrid, and its measured feature gap.  Teacher forcing makes every
   layer's Stage-1 loss depend on that layer alone, so the hybrid assembled from the
   per-layer aligned attention weights stands in for a Stage 1 of that hybrid; it is not
   that Stage 1 bit for bit (layer i is aligned on its own batch stream, seed + i, and a
   joint Stage 1 averages the block losses, which Adam's epsilon does not see through:
   measured 0.91 and 0.18 of the joint update apart on a tiny model);
4. picks the largest k whose predicted time fits ``--time-budget`` (a fraction of the
   teacher's time) or the given ``--keep k``, and writes a config that inherits CONFIG and
   sets ``model.backbone`` to the hybrid ``LinearVisionTransformer`` (``--out-config``).

With ``--stages-1-3`` (the embedded demo's teacher only) it also runs ViT-AdaLA Stages 1-3 of
the demo pipeline (``tools/demo.py``: Stage 1 attention alignment, Stage 2 feature alignment,
Stage 3 UPerNet fine-tuning) for the hybrids of ``--pareto-ks`` and prints the Pareto table of
backbone time at ``--resolution`` against validation mIoU.  The all-softmax row (k = L) skips
Stages 1-2 (nothing to align) and gets the same Stage-3 fine-tuning from the teacher.

Example (demo teacher; ``configs/demo`` + the backbone exported by the demo,
``DATA=work_dirs/demo/data/toy_ade/ADEChallengeData2016``)::

    python tools/analysis/layer_sensitivity.py \\
        configs/demo/upernet_vit-tiny-softmax_1xb8-300it_toy-64x64.py \\
        work_dirs/demo/teacher/backbone.pth \\
        --operator elu --resolution 512 --time-budget 0.5 \\
        --cfg-options train_dataloader.dataset.data_root=$DATA \\
        val_dataloader.dataset.data_root=$DATA \\
        --out-config work_dirs/sensitivity/hybrid.py --stages-1-3
"""
import argparse
import copy
import json
import os
import os.path as osp
import sys
import time
from typing import List, Optional

import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, REPO)

from mmlinvit.analysis import attention_gap, feature_gap  # noqa: E402
from mmlinvit.analysis.layer_sensitivity import (align_layer, best_seconds,  # noqa: E402
                                                 choose, clone_with_attn, hybrid_attn_cfg,
                                                 layer_costs, pareto_table, propose,
                                                 proposal_table, sensitivity_table,
                                                 timing_warnings)
from mmlinvit.backbones import VisionTransformer  # noqa: E402
from mmlinvit.engine.resume import last_checkpoint_target  # noqa: E402
from mmlinvit.utils.cli import load_script  # noqa: E402

#: Lengths of the demo Stages 1-3 (``--quick``: the smoke test).
STAGE_PLANS = {
    'full': dict(num_train=160, num_val=40, stage1_epochs=4, stage2_epochs=6,
                 student_iters=200, distill_batch=16),
    'quick': dict(num_train=8, num_val=4, stage1_epochs=1, stage2_epochs=1, student_iters=2,
                  distill_batch=4),
}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config', help='config whose model.backbone is the softmax teacher')
    parser.add_argument('checkpoint', help='teacher backbone weights (any layout '
                        'mmlinvit.converters loads; export a runner checkpoint first with '
                        'tools/model_converters/convert_checkpoint.py)')
    parser.add_argument('--operator', default='elu', help='the linear operator (attn_cfg name)')
    parser.add_argument('--resolution', type=int, nargs='+', default=[512],
                        help='H [W] at which time and FLOPs are measured')
    parser.add_argument('--align-iters', type=int, default=100,
                        help='Stage-1 steps per layer (teacher forcing, attention only)')
    parser.add_argument('--align-lr', type=float, default=1e-3)
    parser.add_argument('--eval-images', type=int, default=32,
                        help='validation images for the feature gaps')
    parser.add_argument('--repeats', type=int, default=3,
                        help='timing repeats (the fastest counts)')
    choose = parser.add_mutually_exclusive_group()
    choose.add_argument('--time-budget', type=float, default=None,
                        help='pick the most accurate hybrid whose predicted time is at most '
                        'this fraction of the teacher time (default 0.5)')
    choose.add_argument('--keep', type=int, default=None,
                        help='pick the hybrid that keeps this many softmax layers')
    parser.add_argument('--out-config', default=None,
                        help='where to write the chosen hybrid config (default: '
                        '<work-dir>/hybrid_<operator>_keep<k>.py)')
    parser.add_argument('--work-dir', default='work_dirs/layer_sensitivity')
    parser.add_argument('--stages-1-3', action='store_true',
                        help='demo teacher only: run ViT-AdaLA Stages 1-3 of tools/demo.py '
                        'for the hybrids of --pareto-ks and print the Pareto table')
    parser.add_argument('--pareto-ks', type=int, nargs='+', default=None,
                        help='kept softmax layers of the Pareto runs (default: 0 1 2 L)')
    parser.add_argument('--quick', action='store_true', help='tiny settings (smoke test)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--threads', type=int, default=1, help='torch CPU threads')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default=None,
                        help='override config keys (e.g. the data roots)')
    args = parser.parse_args(argv)
    if args.align_iters < 0:
        parser.error(f'--align-iters must be >= 0 (0: the copied teacher layer, no alignment), '
                     f'got {args.align_iters}')
    if args.repeats < 1:
        parser.error(f'--repeats must be >= 1 (the fastest timed run counts), got '
                     f'{args.repeats}')
    if args.time_budget is None and args.keep is None:
        args.time_budget = 0.5
    if args.time_budget is not None and not 0 < args.time_budget:
        parser.error(f'--time-budget must be a positive fraction of the teacher time, got '
                     f'{args.time_budget}')
    return args


# ----------------------------------------------------------------------------- building
def teacher_backbone_cfg(cfg) -> dict:
    """``model.backbone`` of a task-model config (the teacher), as a plain dict."""
    model = cfg.model
    if 'backbone' not in model:
        raise ValueError(f'{cfg.filename}: the layer sensitivity needs a task-model config with '
                         f'model.backbone (the softmax teacher); got model.type='
                         f'{model.get("type")!r}')
    backbone = copy.deepcopy(model.backbone.to_dict() if hasattr(model.backbone, 'to_dict')
                             else dict(model.backbone))
    return backbone


def build_backbone(backbone_cfg: dict, attn_cfg, checkpoint: Optional[str]) -> VisionTransformer:
    """Builds the backbone with ``attn_cfg`` (one or a per-layer list) and loads ``checkpoint``.

    Raises:
        TypeError: when the config's backbone is not a mmlinvit ``VisionTransformer``.
    """
    from mmlinvit.registry import MODELS
    cfg = dict(backbone_cfg, attn_cfg=attn_cfg, pretrained=checkpoint)
    cfg['type'] = 'mmlinvit.VisionTransformer'
    model = MODELS.build(cfg)
    if not isinstance(model, VisionTransformer):
        raise TypeError(f'model.backbone must be a mmlinvit VisionTransformer, got '
                        f'{type(model).__name__}')
    model.init_weights()
    return model


def check_budgets(args: argparse.Namespace, num_layers: int) -> None:
    """Refuses ``--keep`` / ``--pareto-ks`` outside 0..L before any work: they index the
    L + 1 hybrids (a bare IndexError after the whole analysis, or -1 silently the all-softmax
    hybrid labelled "keep -1", otherwise)."""
    for flag, ks in (('--keep', [] if args.keep is None else [args.keep]),
                     ('--pareto-ks', args.pareto_ks or [])):
        for k in ks:
            if not 0 <= k <= num_layers:
                raise ValueError(f'{flag} {k} is out of range: the model has {num_layers} '
                                 f'layers (k = 0..{num_layers})')


# ----------------------------------------------------------------------------- data
def load_batches(cfg, split: str, count: int, seed: int) -> torch.Tensor:
    """``count`` preprocessed images (B, 3, H, W) from the config's ``<split>_dataloader``,
    normalised by the model's data preprocessor."""
    from mmengine.registry import init_default_scope
    from mmengine.runner import Runner
    from mmlinvit.registry import MODELS
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    loader_cfg = copy.deepcopy(cfg[f'{split}_dataloader'])
    loader_cfg['num_workers'] = 0
    loader_cfg['persistent_workers'] = False
    loader = Runner.build_dataloader(loader_cfg, seed=seed)
    preprocessor_cfg = cfg.model.get('data_preprocessor', cfg.get('data_preprocessor'))
    preprocessor = MODELS.build(preprocessor_cfg)
    images: List[torch.Tensor] = []
    while sum(len(i) for i in images) < count:
        before = len(images)
        for batch in loader:
            images.append(preprocessor(batch, split == 'train')['inputs'].float())
            if sum(len(i) for i in images) >= count:
                break
        if len(images) == before:
            raise ValueError(f'{split}_dataloader yields no images (data root '
                             f'{loader_cfg["dataset"].get("data_root")!r})')
    return torch.cat(images)[:count]


# ----------------------------------------------------------------------------- output
def write_config(path: str, base_config: str, checkpoint: str, chosen: dict,
                 table: str) -> str:
    """A config inheriting ``base_config`` whose backbone is the chosen hybrid."""
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    header = '\n'.join(f'# {line}' if line else '#' for line in table.splitlines())
    text = (f'# Hybrid chosen by tools/analysis/layer_sensitivity.py: keep softmax attention in '
            f'layers {chosen["softmax_layers"]},\n# linearize the others.  Initialised from '
            f'the teacher backbone; point `pretrained` at a Stage-2\n# student checkpoint '
            f'(ViT-AdaLA) when there is one.\n{header}\n'
            f'_base_ = [{osp.abspath(base_config)!r}]\n'
            f'model = dict(\n    backbone=dict(\n        type=\'mmlinvit.LinearVisionTransformer\','
            f'\n        attn_cfg={chosen["attn_cfg"]!r},\n'
            f'        pretrained={osp.abspath(checkpoint)!r}))\n')
    with open(path, 'w') as f:
        f.write(text)
    return path


# ----------------------------------------------------------------------------- Stages 1-3
def run_stages(cfg, checkpoint: str, attn_cfg: List[str], work_dir: str, plan: dict,
               seed: int) -> float:
    """ViT-AdaLA Stages 1-3 of the demo pipeline for one hybrid; returns validation mIoU.

    Stage 1 trains only the linearized layers' attention (teacher forcing); Stage 2 aligns
    the final features; Stage 3 fine-tunes the hybrid with UPerNet (the demo's student
    config, its ``attn_cfg`` replaced by the hybrid list).  Without linearized layers Stages
    1-2 are skipped and Stage 3 starts from the teacher backbone.
    """
    from mmengine.config import Config
    demo = load_script(osp.join(REPO, 'tools', 'demo.py'), 'mmlinvit_demo_tool')
    data_root = cfg.train_dataloader.dataset.data_root
    tb = cfg.model.backbone
    linear = [i for i, op in enumerate(attn_cfg) if op != 'softmax']
    start_ckpt = checkpoint
    if linear:
        backbone = dict(arch=dict(tb.arch), family=tb.family, img_size=tb.img_size,
                        patch_size=tb.patch_size, pretrained=checkpoint)
        cfg1 = demo._distill_stage_config(demo.STAGE1_CFG, backbone, data_root, plan,
                                          plan['stage1_epochs'], lr=1e-3)
        cfg1.model.student.attn_cfg = attn_cfg
        cfg1.model.trainable_params = [f'blocks.{i}.attn.*' for i in linear]
        demo._finish_config(cfg1, demo.STAGE1_CFG, osp.join(work_dir, 'stage1'), 'stage1', seed)
        cfg1.log_level = 'WARNING'
        demo._train(cfg1)
        cfg2 = demo._distill_stage_config(demo.STAGE2_CFG, backbone, data_root, plan,
                                          plan['stage2_epochs'], lr=5e-4)
        cfg2.model.student.attn_cfg = attn_cfg
        cfg2.model.student.pretrained = None
        cfg2.load_from = last_checkpoint_target(cfg1.work_dir)
        demo._finish_config(cfg2, demo.STAGE2_CFG, osp.join(work_dir, 'stage2'), 'stage2', seed)
        cfg2.log_level = 'WARNING'
        demo._train(cfg2)
        start_ckpt = osp.join(cfg2.work_dir, 'student_backbone.pth')
    cfg3 = Config.fromfile(demo.STUDENT_CFG, format_python_code=False)
    demo._set_toy_data(cfg3, data_root)
    cfg3.model.backbone.update(attn_cfg=attn_cfg, pretrained=start_ckpt)
    demo._iters_schedule(cfg3, plan['student_iters'], warmup=max(1, plan['student_iters'] // 10))
    demo._finish_config(cfg3, demo.STUDENT_CFG, osp.join(work_dir, 'stage3'), 'stage3', seed)
    cfg3.log_level = 'WARNING'
    from mmengine.hooks import Hook
    from mmlinvit.engine.launch import build_runner

    class LastMetricsHook(Hook):

        def __init__(self) -> None:
            self.metrics: dict = {}

        def after_val_epoch(self, runner, metrics=None) -> None:
            self.metrics = dict(metrics or {})

    runner = build_runner(cfg3, mode='train')
    hook = LastMetricsHook()
    runner.register_hook(hook, priority='LOWEST')
    runner.train()  # validates after the last iteration
    return float(hook.metrics['mIoU'])


# ----------------------------------------------------------------------------- main
def main(argv: Optional[List[str]] = None) -> dict:
    """Runs the analysis; returns everything that is also written to ``<work-dir>/``."""
    from mmlinvit.engine.launch import load_config
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    work_dir = osp.abspath(args.work_dir)
    os.makedirs(work_dir, exist_ok=True)
    cfg = load_config(args.config, args.cfg_options)
    backbone_cfg = teacher_backbone_cfg(cfg)
    resolution = (tuple(args.resolution) * 2)[:2]
    if args.quick:
        args.align_iters, args.eval_images, args.repeats = 2, 4, 1

    teacher = build_backbone(backbone_cfg, 'softmax', args.checkpoint).eval()
    check_budgets(args, teacher.num_layers)
    for p in teacher.parameters():
        p.requires_grad_(False)
    train_images = load_batches(cfg, 'train', max(16, args.eval_images), args.seed)
    val_images = load_batches(cfg, 'val', args.eval_images, args.seed)

    start = time.time()
    sensitivity, aligned = [], {}
    for i in range(teacher.num_layers):
        attn_cfg = hybrid_attn_cfg(teacher.num_layers, [j for j in range(teacher.num_layers)
                                                        if j != i], args.operator)
        student = clone_with_attn(backbone_cfg, teacher, attn_cfg)
        gap_before = attention_gap(student, teacher, i, val_images)
        initial = copy.deepcopy(student.blocks[i].attn.state_dict())
        train_before = attention_gap(student, teacher, i, train_images)
        losses = align_layer(student, teacher, i, train_images, args.align_iters,
                             args.align_lr, min(16, len(train_images)), args.seed + i)
        # keep the alignment only if it lowered the gap on the training images (a few steps
        # of Adam can overshoot when the teacher-initialised layer is already close)
        kept = attention_gap(student, teacher, i, train_images) <= train_before
        if not kept:
            student.blocks[i].attn.load_state_dict(initial)
        aligned[i] = copy.deepcopy(student.blocks[i].attn.state_dict())
        sensitivity.append(dict(
            layer=i, attn_gap_before=gap_before,
            attn_gap=attention_gap(student, teacher, i, val_images),
            feature_gap=feature_gap(student, teacher, val_images),
            align_loss_first=losses[0] if losses else None,
            align_loss_last=losses[-1] if losses else None, alignment_kept=kept))
        print(f'[sensitivity] layer {i}: attention gap {gap_before:.2e} -> '
              f'{sensitivity[-1]["attn_gap"]:.2e}, feature gap '
              f'{sensitivity[-1]["feature_gap"]:.2e}'
              f'{"" if kept else " (alignment discarded: it raised the training gap)"}',
              flush=True)
    align_s = time.time() - start

    costs = layer_costs(backbone_cfg, teacher, args.operator, resolution, args.repeats)
    proposals = propose(sensitivity, costs, args.operator)
    x = torch.randn(1, 3, *resolution)
    for p in proposals:
        hybrid = clone_with_attn(backbone_cfg, teacher, p['attn_cfg'])
        for i, op in enumerate(p['attn_cfg']):
            if op != 'softmax':
                hybrid.blocks[i].attn.load_state_dict(aligned[i])
        p['feature_gap'] = feature_gap(hybrid, teacher, val_images)
        with torch.no_grad():
            p['measured_s'] = best_seconds(lambda: hybrid(x), args.repeats)
    chosen = choose(proposals, costs['teacher_s'], args.time_budget, args.keep)

    table1 = sensitivity_table(sensitivity, costs)
    table2 = proposal_table(proposals, costs)
    why = (f'--keep {args.keep}' if args.keep is not None else
           f'largest k with predicted time <= {args.time_budget} x teacher')
    noisy = timing_warnings(costs, proposals, chosen,
                            args.time_budget if args.keep is None else None)
    for line in noisy:
        print(f'WARNING: {line}', flush=True)
    summary = (f'operator {args.operator}; Stage 1 per layer: {args.align_iters} steps '
               f'({align_s:.0f} s for all layers)\n\n{table1}\n\n{table2}\n\n'
               f'chosen: keep k = {chosen["keep"]} softmax layers {chosen["softmax_layers"]} '
               f'({why})' + ''.join(f'\n\nWARNING: {line}' for line in noisy))
    out_config = args.out_config or osp.join(
        work_dir, f'hybrid_{args.operator}_keep{chosen["keep"]}.py')
    write_config(out_config, args.config, args.checkpoint, chosen, summary)
    result = dict(operator=args.operator, sensitivity=sensitivity, costs=costs,
                  proposals=proposals, chosen=chosen, config=out_config)

    if args.stages_1_3:
        plan = STAGE_PLANS['quick' if args.quick else 'full']
        ks = args.pareto_ks if args.pareto_ks is not None else sorted(
            {0, 1, 2, teacher.num_layers} & set(range(teacher.num_layers + 1)))
        rows = []
        for k in ks:
            p = proposals[k]
            t0 = time.time()
            miou = run_stages(cfg, args.checkpoint, p['attn_cfg'],
                              osp.join(work_dir, f'stages_keep{k}'), plan, args.seed)
            rows.append(dict(keep=k, softmax_layers=p['softmax_layers'], mIoU=miou,
                             measured_s=p['measured_s'], predicted_flops=p['predicted_flops'],
                             feature_gap=p['feature_gap'], seconds=time.time() - t0))
            print(f'[stages 1-3] keep {k} {p["softmax_layers"]}: mIoU {miou:.2f} '
                  f'({rows[-1]["seconds"]:.0f} s)', flush=True)
        summary += f'\n\nPareto (demo pipeline, Stages 1-3):\n\n{pareto_table(rows, costs)}'
        result['pareto'] = rows
    result['summary'] = summary
    with open(osp.join(work_dir, 'layer_sensitivity.json'), 'w') as f:
        json.dump(result, f, indent=2)
    with open(osp.join(work_dir, 'layer_sensitivity.md'), 'w') as f:
        f.write(summary + '\n')
    print(summary)
    print(f'\nchosen config: {out_config}')
    return result


if __name__ == '__main__':
    main()
