"""Shared helpers of the distillation tests: tiny models, generated image folders, configs."""
import os
import os.path as osp
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from mmengine.hooks import Hook
from PIL import Image

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = osp.join(REPO, 'configs')

#: Every recipe config of issue 4, relative to configs/.
RECIPE_CONFIGS = (
    'adala/vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512.py',
    'adala/vit-adala-stage2-feat-align_dinov2-l-elu_8xb8-10e_in22k-512x512.py',
    'adala/linear-head_adala-dinov2-l-elu_64xb16-30e_in1k-512x512.py',
    'adala/linear-probe_adala-dinov2-l-elu_64xb16-100e_in1k-512x512.py',
    'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-b-elu_64xb64-300e_in1k-224x224.py',
    'copy_mlp_distill_attn/copy-mlp_deit-b-elu_64xb64-300e_in1k-224x224.py',
    'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-t-elu_8xb64-300e_cifar10-224x224.py',
    'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-t-mhla_8xb64-300e_cifar10-224x224.py',
    'linearizer/vit-linearizer_clip-b16_vit-b-elu_16xb64-300e_in1k-224x224.py',
    'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-t-ttt_8xb64-300e_cifar10-224x224.py',
    'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-b-mhla_64xb64-300e_in1k-224x224.py',
    'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-b-ttt_64xb64-300e_in1k-224x224.py',
)
#: The "Copy the MLP, distill the attention" configs among them.
COPY_MLP_CONFIGS = tuple(c for c in RECIPE_CONFIGS if c.startswith('copy_mlp_distill_attn/'))

IMG_SIZE = 16
PATCH = 4


def tiny_arch(embed_dims: int = 16, num_layers: int = 2, num_heads: int = 2) -> dict:
    """A custom ViT arch dict small enough for CPU tests."""
    return dict(embed_dims=embed_dims, num_layers=num_layers, num_heads=num_heads,
                mlp_hidden_dims=2 * embed_dims)


def write_image_folder(root: str, num_per_class: int = 4, classes: Sequence[str] = ('a', 'b'),
                       size: int = 20, seed: int = 0, prefix: str = 'train') -> str:
    """Writes random PNGs in mmpretrain CustomDataset layout ``root/prefix/<class>/*.png``."""
    rng = np.random.default_rng(seed)
    for cls in classes:
        folder = osp.join(root, prefix, cls)
        os.makedirs(folder, exist_ok=True)
        for idx in range(num_per_class):
            pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(osp.join(folder, f'{idx:03d}.png'))
    return root


def save_tiny_vit_checkpoint(path: str, seed: int = 0, **vit_kwargs: Any) -> str:
    """Saves the canonical state dict of a randomly initialised tiny ViT."""
    from mmlinvit.backbones import VisionTransformer
    torch.manual_seed(seed)
    kwargs = dict(arch=tiny_arch(), patch_size=PATCH, img_size=IMG_SIZE)
    kwargs.update(vit_kwargs)
    model = VisionTransformer(**kwargs)
    torch.save(model.state_dict(), path)
    return path


def _shrink_backbone(cfg: dict, arch: dict, pretrained: Optional[str]) -> None:
    cfg['arch'] = dict(arch)
    cfg['patch_size'] = PATCH
    cfg['img_size'] = IMG_SIZE
    cfg['pretrained'] = pretrained
    if 'frozen_stages' in cfg and cfg['frozen_stages'] > arch['num_layers']:
        cfg['frozen_stages'] = arch['num_layers']


def _pipeline() -> List[dict]:
    return [
        dict(type='LoadImageFromFile'),
        dict(type='Resize', scale=IMG_SIZE),
        dict(type='PackInputs'),
    ]


def _dataset(data_root: str, with_label: bool) -> dict:
    return dict(type='CustomDataset', data_root=data_root, data_prefix='train',
                with_label=with_label, pipeline=_pipeline())


def shrink_config(cfg, data_root: str, work_dir: str, max_epochs: int = 1,
                  student_ckpt: Optional[str] = None, teacher_ckpt: Optional[str] = None,
                  teacher_width: int = 16) -> Any:
    """Turns a recipe config into a tiny CPU run on a generated image folder (in place).

    Args:
        cfg: Loaded mmengine Config.
        data_root: Root written by :func:`write_image_folder`.
        work_dir: Work dir of the run.
        max_epochs: Epochs to train (each is num_images / 2 iterations).
        student_ckpt: Checkpoint for student backbones that name one.
        teacher_ckpt: Checkpoint for teacher backbones that name one.
        teacher_width: Teacher width (the Linearizer connector maps the student width to it).
    """
    cfg.work_dir = work_dir
    model = cfg.model
    is_distill = model.get('type') == 'mmlinvit.DistillationModel'
    if is_distill:
        student = model.student
        backbone = student.backbone if 'backbone' in student else student
        _shrink_backbone(backbone, tiny_arch(),
                         student_ckpt if backbone.get('pretrained') else None)
        _shrink_backbone(model.teacher, tiny_arch(embed_dims=teacher_width),
                         teacher_ckpt if model.teacher.get('pretrained') else None)
        if 'head' in student:
            student.head.in_channels = 16
        if model.get('connectors'):
            for connector in model.connectors.values():
                connector.in_channels = 16
                connector.out_channels = teacher_width
        model.check_input_size = None  # dry run at the tiny img_size
        for side in ('student_recorders', 'teacher_recorders'):
            for rec in (model.get(side) or {}).values():
                if rec.get('indices') is not None:
                    rec.indices = [0, 1]
    else:
        _shrink_backbone(model.backbone, tiny_arch(), student_ckpt)
        model.head.in_channels = 16
    with_label = 'head' in model or ('student' in model and 'head' in model.student)
    folder = osp.join(data_root, 'train')
    if with_label and osp.isdir(folder):  # the head classifies the folder's classes
        num_classes = len(os.listdir(folder))
        task = model.student if 'student' in model and 'head' in model.student else model
        task.head.num_classes = num_classes
        for owner in (model, task):
            pre = owner.get('data_preprocessor', None)
            if isinstance(pre, dict) and 'num_classes' in pre:
                pre.num_classes = num_classes
    cfg.train_dataloader.batch_size = 2
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_dataloader.dataset = _dataset(data_root, with_label)
    if cfg.get('val_dataloader'):
        for key in ('val_dataloader', 'test_dataloader'):
            cfg[key].batch_size = 2
            cfg[key].num_workers = 0
            cfg[key].persistent_workers = False
            cfg[key].dataset = _dataset(data_root, True)
        cfg.train_cfg.val_interval = 1
        cfg.val_evaluator = dict(type='Accuracy', topk=(1, ))
        cfg.test_evaluator = dict(type='Accuracy', topk=(1, ))
    cfg.train_cfg.max_epochs = max_epochs
    cfg.default_hooks.logger.interval = 1
    cfg.default_hooks.checkpoint.interval = 1
    cfg.log_level = 'WARNING'
    return cfg


class LossRecorderHook(Hook):
    """Collects ``{iter, <log var>: float}`` of every training step (test hook)."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.history: List[Dict[str, Any]] = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        values = {k: float(torch.as_tensor(v).detach()) for k, v in outputs.items()}
        self.history.append(dict(iter=runner.iter, **values))


class TrainingInterrupted(RuntimeError):
    """Raised by :class:`InterruptHook` to simulate a killed job."""


class InterruptHook(Hook):
    """Raises :class:`TrainingInterrupted` after a (0-based) epoch, once it is checkpointed."""

    priority = 'LOWEST'  # after CheckpointHook (VERY_LOW)

    def __init__(self, after_epoch: int) -> None:
        self.after_epoch = after_epoch

    def after_train_epoch(self, runner) -> None:
        if runner.epoch == self.after_epoch:
            raise TrainingInterrupted(f'interrupted after epoch {self.after_epoch}')
