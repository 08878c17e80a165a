"""The embedded end-to-end demo: linearize a softmax ViT segmenter on CPU in a few minutes.

One command on a fresh machine (``bash tools/run.sh demo`` installs first)::

    python tools/demo.py [--work-dir work_dirs/demo] [--quick]

1. draws a small data set of outdoor scenes in ADE20K's layout (images/ + annotations/,
   label 0 = unlabelled, ``reduce_zero_label``);
2. trains a tiny softmax ViT teacher with UPerNet on it
   (configs/demo/upernet_vit-tiny-softmax_1xb8-300it_toy-64x64.py);
3. linearizes it with ViT-AdaLA: Stage 1 (teacher-forced attention alignment) and Stage 2
   (feature alignment) with the recipes of configs/adala/ scaled down to the tiny model and
   the demo images, then Stage 3: an ELU+1 linear student initialised from Stage 2 and
   fine-tuned with UPerNet (configs/demo/upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py);
4. evaluates teacher and student on the validation scenes and prints their IoUs side by side;
   ``predictions.png`` shows image | ground truth | teacher | student;
5. shows teacher and student on real photographs (scikit-image's astronaut, chelsea, coffee,
   rocket; ``real_photos.png``): the attention of the centre patch in the last block, the
   student-minus-teacher difference, the first three principal components of both models'
   final patch features in the teacher's basis (as RGB) and the per-patch cosine gap;
6. plots every run's loss terms from the runners' ``vis_data/scalars.json``
   (``loss_curves.png``).

Everything runs through the same code paths as ``tools/train.py`` (config checks, runners,
checkpoints); logs, checkpoints, the PNGs and ``summary.json`` are left under the work
directory.  ``--quick`` shortens every stage (for the test suite).
"""
import argparse
import contextlib
import io
import json
import os
import os.path as osp
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmengine.config import Config
from mmengine.model import is_model_wrapper
from PIL import Image

from mmlinvit.analysis import (compare_teacher_student, load_photo, save_loss_curves,
                               save_teacher_student_figure)
from mmlinvit.datasets import SCENE_CLASSES, SCENE_PALETTE, make_ade20k_layout
from mmlinvit.engine.launch import build_runner, prepare_train_config
from mmlinvit.engine.resume import last_checkpoint_target
from mmlinvit.utils.cli import load_script

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
TEACHER_CFG = osp.join(REPO, 'configs/demo/upernet_vit-tiny-softmax_1xb8-300it_toy-64x64.py')
STUDENT_CFG = osp.join(REPO, 'configs/demo/upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py')
STAGE1_CFG = osp.join(REPO, 'configs', 'adala',
                      'vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512.py')
STAGE2_CFG = osp.join(REPO, 'configs', 'adala',
                      'vit-adala-stage2-feat-align_dinov2-l-elu_8xb8-10e_in22k-512x512.py')

#: The real photographs of step 5 (shipped inside scikit-image) and their size in pixels.
PHOTOS = ('astronaut', 'chelsea', 'coffee', 'rocket')
PHOTO_SIZE = (128, 128)
#: Column titles of predictions.png.
PREDICTION_COLUMNS = ('image', 'ground truth', 'teacher (softmax)', 'student (ELU+1 linear)')

#: Lengths of every step (full demo / --quick).
PLANS = {
    'full': dict(num_train=160, num_val=40, teacher_iters=300, stage1_epochs=4,
                 stage2_epochs=6, student_iters=200, distill_batch=16, timing=True),
    'quick': dict(num_train=16, num_val=4, teacher_iters=6, stage1_epochs=1,
                  stage2_epochs=1, student_iters=4, distill_batch=8, timing=False),
}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description='mmlinvit end-to-end demo (CPU, minutes)')
    parser.add_argument('--work-dir', default='work_dirs/demo',
                        help='where data, logs, checkpoints and the PNG go')
    parser.add_argument('--quick', action='store_true',
                        help='a few iterations per stage (smoke test, meaningless mIoU)')
    parser.add_argument('--seed', type=int, default=0, help='data and training seed')
    parser.add_argument('--threads', type=int, default=1,
                        help='torch CPU threads (the tiny models run fastest on one thread; '
                        'more threads mostly add synchronisation on busy machines)')
    return parser.parse_args(argv)


def _log(msg: str) -> None:
    print(f'[demo] {msg}', flush=True)


def _finish_config(cfg: Config, config_path: str, work_dir: str, name: str,
                   seed: int) -> Config:
    cfg.experiment_name = f'demo_{name}_{int(time.time() * 1000)}'
    cfg.randomness = dict(seed=seed)
    cfg.log_level = 'INFO'
    return prepare_train_config(cfg, config_path, work_dir=work_dir)


def _train(cfg: Config) -> 'object':
    runner = build_runner(cfg, mode='train')
    runner.train()
    return runner


def export_backbone(runner_checkpoint: str, out_file: str) -> str:
    """Keeps the teacher segmentor's backbone weights as plain tensors, as
    ``tools/model_converters/convert_checkpoint.py SRC DST --trust-checkpoint`` does.

    Runner checkpoints also pickle training state (message hub, optimizer), which
    ``pretrained=`` refuses to unpickle; :mod:`mmlinvit.converters` selects the
    ``backbone.*`` keys.
    """
    tool = load_script(osp.join(REPO, 'tools/model_converters/convert_checkpoint.py'),
                       'mmlinvit_convert_checkpoint')
    with contextlib.redirect_stdout(io.StringIO()) as report:
        code = tool.main([runner_checkpoint, out_file, '--trust-checkpoint'])
    if code != 0:
        raise RuntimeError(f'exporting {runner_checkpoint} failed:\n{report.getvalue()}')
    _log(f'exported backbone weights {runner_checkpoint} -> {out_file}')
    return out_file


def _set_toy_data(cfg: Config, data_root: str) -> None:
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = data_root


def _iters_schedule(cfg: Config, iters: int, warmup: int) -> None:
    cfg.train_cfg.update(max_iters=iters, val_interval=iters)
    cfg.param_scheduler = [
        dict(type='LinearLR', start_factor=0.05, by_epoch=False, begin=0, end=warmup),
        dict(type='PolyLR', eta_min=1e-5, power=1.0, begin=warmup, end=iters, by_epoch=False),
    ]
    cfg.default_hooks.checkpoint.interval = iters
    cfg.default_hooks.logger.interval = max(1, min(25, iters // 4))


def train_teacher(plan: dict, data_root: str, work_dir: str, seed: int):
    """Step 2: the tiny softmax teacher with UPerNet."""
    cfg = Config.fromfile(TEACHER_CFG, format_python_code=False)
    _set_toy_data(cfg, data_root)
    _iters_schedule(cfg, plan['teacher_iters'], warmup=max(1, plan['teacher_iters'] // 10))
    _finish_config(cfg, TEACHER_CFG, osp.join(work_dir, 'teacher'), 'teacher', seed)
    return _train(cfg)


def _distill_stage_config(path: str, backbone: dict, data_root: str, plan: dict, epochs: int,
                          lr: float) -> Config:
    """A ViT-AdaLA Stage 1/2 config, scaled down to the demo's backbone and images."""
    cfg = Config.fromfile(path, format_python_code=False)
    for side in ('student', 'teacher'):
        cfg.model[side].update(backbone)  # plain assignment: 'l' -> the demo's arch dict
    cfg.model.student.update(type='mmlinvit.LinearVisionTransformer', attn_cfg='elu')
    cfg.model.teacher.update(type='mmlinvit.VisionTransformer', attn_cfg='softmax')
    dl = cfg.train_dataloader
    dl.update(batch_size=plan['distill_batch'], num_workers=0, persistent_workers=False)
    dl.dataset.update(data_root=data_root, data_prefix='images/training')
    for t in dl.dataset.pipeline:
        if t['type'] == 'RandomResizedCrop':
            t['scale'] = backbone['img_size']
    # The loader keeps the last, partial batch (no drop_last): ceil.
    iters_per_epoch = max(1, -(-plan['num_train'] // plan['distill_batch']))
    cfg.optim_wrapper.optimizer.lr = lr
    cfg.param_scheduler = [
        dict(type='LinearLR', start_factor=0.05, by_epoch=False, begin=0,
             end=max(1, iters_per_epoch // 2)),
        dict(type='CosineAnnealingLR', eta_min=lr * 0.01, by_epoch=True, begin=0, end=epochs,
             convert_to_iter_based=True),
    ]
    cfg.train_cfg = dict(by_epoch=True, max_epochs=epochs)
    cfg.auto_scale_lr = None
    cfg.default_hooks.checkpoint.update(interval=epochs, max_keep_ckpts=1)
    cfg.default_hooks.logger.interval = max(1, iters_per_epoch)
    cfg.env_cfg.cudnn_benchmark = False
    return cfg


def run_adala(plan: dict, data_root: str, work_dir: str, teacher_cfg: Config,
              teacher_ckpt: str, seed: int) -> Tuple[str, str, Dict[str, str]]:
    """Step 3: AdaLA Stages 1 and 2 (the Stage-3 fine-tuning is :func:`train_student`).

    Args:
        teacher_ckpt: The teacher's backbone weights (plain tensors).

    Returns:
        The Stage-1 runner checkpoint, the Stage-2 student backbone weights and the two
        runs' log directories (``{'stage1': ..., 'stage2': ...}``).
    """
    tb = teacher_cfg.model.backbone
    backbone = dict(arch=dict(tb.arch), family=tb.family, img_size=tb.img_size,
                    patch_size=tb.patch_size, pretrained=teacher_ckpt)
    cfg1 = _distill_stage_config(STAGE1_CFG, backbone, data_root, plan,
                                 plan['stage1_epochs'], lr=1e-3)
    _finish_config(cfg1, STAGE1_CFG, osp.join(work_dir, 'stage1'), 'stage1', seed)
    runner1 = _train(cfg1)
    stage1_ckpt = last_checkpoint_target(cfg1.work_dir)

    cfg2 = _distill_stage_config(STAGE2_CFG, backbone, data_root, plan,
                                 plan['stage2_epochs'], lr=5e-4)
    cfg2.model.student.pretrained = None  # the student comes from Stage 1 (load_from)
    cfg2.load_from = stage1_ckpt
    _finish_config(cfg2, STAGE2_CFG, osp.join(work_dir, 'stage2'), 'stage2', seed)
    runner2 = _train(cfg2)
    # The Stage-2 config's ExportStudentHook writes the student backbone next to checkpoints.
    stage2_backbone = osp.join(cfg2.work_dir, 'student_backbone.pth')
    if not osp.isfile(stage2_backbone):
        raise FileNotFoundError(f'Stage 2 did not write {stage2_backbone} (is ExportStudentHook '
                                f'in custom_hooks of {STAGE2_CFG}?)')
    return stage1_ckpt, stage2_backbone, dict(stage1=runner1.log_dir, stage2=runner2.log_dir)


def train_student(plan: dict, data_root: str, work_dir: str, stage2_ckpt: str, seed: int):
    """Step 3, Stage 3: the ELU+1 linear student with UPerNet, from the Stage-2 student."""
    cfg = Config.fromfile(STUDENT_CFG, format_python_code=False)
    _set_toy_data(cfg, data_root)
    cfg.model.backbone.pretrained = stage2_ckpt
    _iters_schedule(cfg, plan['student_iters'], warmup=max(1, plan['student_iters'] // 10))
    _finish_config(cfg, STUDENT_CFG, osp.join(work_dir, 'student'), 'student', seed)
    return _train(cfg)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if is_model_wrapper(model) else model


def predict_and_score(runner, num_classes: int,
                      keep: int) -> Tuple[np.ndarray, np.ndarray, List[dict]]:
    """Runs the runner's model over its test set.

    Returns:
        Per-class intersections and unions, and the first ``keep`` samples (image path,
        ground truth, prediction) for the picture.
    """
    model = _unwrap(runner.model)
    model.eval()
    inter = np.zeros(num_classes, np.int64)
    union = np.zeros(num_classes, np.int64)
    kept = []
    with torch.no_grad():
        for batch in runner.test_dataloader:
            for sample in model.test_step(batch):
                pred = sample.pred_sem_seg.data.squeeze(0).cpu().numpy()
                gt = sample.gt_sem_seg.data.squeeze(0).cpu().numpy()
                valid = gt != 255
                for c in range(num_classes):
                    p, g = (pred == c) & valid, (gt == c) & valid
                    inter[c] += int((p & g).sum())
                    union[c] += int((p | g).sum())
                if len(kept) < keep:
                    kept.append(dict(img_path=sample.img_path, gt=gt, pred=pred))
    return inter, union, kept


def _colour(label: np.ndarray, palette: Sequence[Sequence[int]]) -> np.ndarray:
    out = np.zeros(label.shape + (3, ), np.uint8)  # unlabelled / ignored stay black
    for c, rgb in enumerate(palette):
        out[label == c] = rgb
    return out


def save_prediction_grid(path: str, teacher: List[dict], student: List[dict]) -> None:
    """Columns (titled): image | ground truth | teacher | student, one row per validation
    image, with the class colours as a legend."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(teacher), len(PREDICTION_COLUMNS),
                             figsize=(2.0 * len(PREDICTION_COLUMNS), 2.0 * len(teacher) + 0.8),
                             squeeze=False)
    for r, (t, s) in enumerate(zip(teacher, student)):
        img = np.asarray(Image.open(t['img_path']).convert('RGB'))
        tiles = [img, _colour(t['gt'], SCENE_PALETTE), _colour(t['pred'], SCENE_PALETTE),
                 _colour(s['pred'], SCENE_PALETTE)]
        for ax, tile in zip(axes[r], tiles):
            ax.imshow(tile, interpolation='nearest')
            ax.set_xticks([])
            ax.set_yticks([])
    for ax, title in zip(axes[0], PREDICTION_COLUMNS):
        ax.set_title(title, fontsize=10)
    handles = [Patch(color=np.array(rgb) / 255.0, label=name)
               for name, rgb in zip(SCENE_CLASSES, SCENE_PALETTE)]
    handles.append(Patch(color='black', label='unlabelled'))
    fig.legend(handles=handles, loc='lower center', ncol=len(handles), fontsize=7,
               frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=100, metadata={'Description': ' | '.join(PREDICTION_COLUMNS)})
    plt.close(fig)


def compare_on_photos(teacher_runner, student_runner, path: str) -> Dict[str, float]:
    """Step 5: teacher vs student on real photographs (cheap: a few tiny forwards).

    The photos are normalised with the segmentors' own data preprocessor statistics.

    Returns:
        Mean attention total-variation distance and mean feature cosine gap over the photos.
    """
    teacher_model = _unwrap(teacher_runner.model)
    student_model = _unwrap(student_runner.model)
    preprocessor = teacher_model.data_preprocessor
    pictures = [load_photo(name, PHOTO_SIZE) for name in PHOTOS]
    images = torch.stack([torch.from_numpy(p).permute(2, 0, 1).float() for p in pictures])
    images = (images - preprocessor.mean.cpu()) / preprocessor.std.cpu()
    teacher_model.eval()
    student_model.eval()
    cmp = compare_teacher_student(teacher_model.backbone, student_model.backbone, images)
    save_teacher_student_figure(
        path, pictures, list(PHOTOS), cmp, teacher_model.backbone.patch_size,
        title='demo teacher (softmax) vs student (ELU+1, ViT-AdaLA) on real photos, '
        'trained on drawn scenes only')
    return dict(photo_attention_tv=float(cmp.attention_tv.mean()),
                photo_feature_cosine_gap=float(cmp.feature_cosine_gap.mean()))


def backbone_latency(runner, size: int, repeats: int = 3) -> float:
    """Seconds per forward of the runner's backbone on one size x size image."""
    backbone = _unwrap(runner.model).backbone.eval()
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        backbone(x)
        start = time.perf_counter()
        for _ in range(repeats):
            backbone(x)
    return (time.perf_counter() - start) / repeats


def _iou_table(teacher: Tuple[np.ndarray, np.ndarray], student: Tuple[np.ndarray,
                                                                       np.ndarray]) -> str:
    lines = [f'{"class":<10} {"teacher IoU":>12} {"student IoU":>12}']
    for c, name in enumerate(SCENE_CLASSES):
        cells = []
        for inter, union in (teacher, student):
            cells.append(f'{100 * inter[c] / union[c]:12.2f}' if union[c] else f'{"n/a":>12}')
        lines.append(f'{name:<10} {cells[0]} {cells[1]}')
    return '\n'.join(lines)


def main(argv: Optional[List[str]] = None) -> Dict[str, float]:
    """Runs the demo; returns the summary (also written to ``summary.json``)."""
    args = parse_args(argv)
    plan = PLANS['quick' if args.quick else 'full']
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return run_demo(args, plan)
    finally:
        torch.set_num_threads(previous_threads)


def run_demo(args: argparse.Namespace, plan: dict) -> Dict[str, float]:
    """The six steps of the demo (see the module docstring)."""
    work_dir = osp.abspath(args.work_dir)
    os.makedirs(work_dir, exist_ok=True)
    start = time.time()

    data_root = osp.join(work_dir, 'data', 'toy_ade', 'ADEChallengeData2016')
    _log(f'1/6 drawing {plan["num_train"]} + {plan["num_val"]} scenes in ADE20K layout '
         f'under {data_root}')
    make_ade20k_layout(data_root, plan['num_train'], plan['num_val'], size=(64, 64),
                       seed=args.seed)

    _log('2/6 training the softmax ViT teacher (UPerNet)')
    teacher_runner = train_teacher(plan, data_root, work_dir, args.seed)
    teacher_ckpt = last_checkpoint_target(teacher_runner.work_dir)
    teacher_backbone = export_backbone(teacher_ckpt,
                                       osp.join(teacher_runner.work_dir, 'backbone.pth'))

    _log('3/6 ViT-AdaLA: Stage 1 attention alignment, Stage 2 feature alignment')
    _, stage2_ckpt, adala_logs = run_adala(plan, data_root, work_dir, teacher_runner.cfg,
                               teacher_backbone, args.seed)
    _log('3/6 ViT-AdaLA: Stage 3 fine-tuning of the ELU+1 linear student (UPerNet)')
    student_runner = train_student(plan, data_root, work_dir, stage2_ckpt, args.seed)

    _log('4/6 evaluating teacher and student on the validation scenes')
    num_classes = len(SCENE_CLASSES)
    t_inter, t_union, t_kept = predict_and_score(teacher_runner, num_classes, keep=6)
    s_inter, s_union, s_kept = predict_and_score(student_runner, num_classes, keep=6)
    picture = osp.join(work_dir, 'predictions.png')
    save_prediction_grid(picture, t_kept, s_kept)

    photos_png = osp.join(work_dir, 'real_photos.png')
    _log(f'5/6 teacher vs student on real photos ({", ".join(PHOTOS)}) -> {photos_png}')
    photo_stats = compare_on_photos(teacher_runner, student_runner, photos_png)

    curves_png = osp.join(work_dir, 'loss_curves.png')
    _log(f'6/6 loss curves of every run -> {curves_png}')
    log_dirs = dict(teacher=teacher_runner.log_dir, **adala_logs,
                    student=student_runner.log_dir)
    save_loss_curves(curves_png, {
        f'{name} ({osp.basename(log_dir)})': osp.join(log_dir, 'vis_data', 'scalars.json')
        for name, log_dir in log_dirs.items()
    }, title='demo runs: loss terms logged by LocalVisBackend (vis_data/scalars.json)')

    def miou(inter, union):
        present = union > 0
        return float(100 * (inter[present] / union[present]).mean())

    summary = dict(
        teacher_mIoU=miou(t_inter, t_union),
        student_mIoU=miou(s_inter, s_union),
        teacher_checkpoint=teacher_ckpt,
        stage2_checkpoint=stage2_ckpt,
        student_checkpoint=last_checkpoint_target(student_runner.work_dir),
        predictions_png=picture,
        real_photos_png=photos_png,
        loss_curves_png=curves_png,
        **photo_stats)
    if plan['timing']:
        for size in (64, 512):
            summary[f'teacher_backbone_s_{size}px'] = backbone_latency(teacher_runner, size)
            summary[f'student_backbone_s_{size}px'] = backbone_latency(student_runner, size)
    summary['wall_time_s'] = time.time() - start
    with open(osp.join(work_dir, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=2)

    print('\n' + _iou_table((t_inter, t_union), (s_inter, s_union)))
    print(f'{"mIoU":<10} {summary["teacher_mIoU"]:12.2f} {summary["student_mIoU"]:12.2f}')
    print(f'teacher: softmax attention; student: ELU+1 linear attention (ViT-AdaLA stages 1-3)')
    if plan['timing']:
        for size in (64, 512):
            print(f'backbone forward at {size}x{size}: teacher '
                  f'{1000 * summary[f"teacher_backbone_s_{size}px"]:.1f} ms, student '
                  f'{1000 * summary[f"student_backbone_s_{size}px"]:.1f} ms')
    print(f'predictions (image | ground truth | teacher | student): {picture}')
    print(f'real photos (attention, feature PCA, cosine gap): {photos_png}; mean attention '
          f'TV distance {photo_stats["photo_attention_tv"]:.3f}, mean feature cosine gap '
          f'{photo_stats["photo_feature_cosine_gap"]:.3f}')
    print(f'loss curves: {curves_png}')
    print(f'logs and checkpoints: {work_dir}/{{teacher,stage1,stage2,student}}')
    print(f'wall time: {summary["wall_time_s"]:.0f} s')
    return summary


if __name__ == '__main__':
    main()
    sys.exit(0)
