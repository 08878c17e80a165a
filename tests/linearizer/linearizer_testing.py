"""Helpers of the ViT-Linearizer tests: tiny CLIP teacher + tiny Adventurer student, generated
images, and a shrinker that keeps the structure of the real configs.

The tiny Adventurer has the width / depth / MLP of the segmentation tests' tiny backbone
(``tests/segmentation/seg_helpers.py``: ``TINY_ARCH``) and patch 16 like the real configs, so
the distilled student loads into the shrunk UPerNet configs unchanged.
"""
import importlib.util
import os
import os.path as osp
from typing import Any, Dict, List

import numpy as np
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from PIL import Image

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DISTILL_CONFIG = 'linearizer/vit-linearizer_clip-b16_adventurer-b_16xb64-300e_in1k-224x224.py'
FINETUNE_CONFIG = 'linearizer/linear-head_adventurer-b_16xb64-30e_in1k-224x224.py'
UPERNET_CONFIGS = ('linearizer/upernet_adventurer-b_8xb2-160k_ade20k-512x512.py',
                   'linearizer/upernet_adventurer-b_8xb2-80k_cityscapes-512x1024.py')

IMG_SIZE = 128  # 8 x 8 patches of 16: 48 masked, 16 visible per image
PATCH = 16
TEACHER_ARCH = dict(embed_dims=24, num_layers=4, num_heads=2, mlp_hidden_dims=48)


def load_seg_helpers() -> Any:
    """``tests/segmentation/seg_helpers.py`` as a module (its ``tiny_config`` and ``TINY_ARCH``)."""
    path = osp.join(REPO, 'tests', 'segmentation', 'seg_helpers.py')
    spec = importlib.util.spec_from_file_location('mmlinvit_tests_seg_helpers', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def student_arch() -> dict:
    """Adventurer arch of the tests (the segmentation tests' tiny width, depth and MLP)."""
    tiny = load_seg_helpers().TINY_ARCH
    return dict(embed_dims=tiny['embed_dims'], num_layers=tiny['num_layers'],
                mlp_hidden_dims=tiny['mlp_hidden_dims'])


def config_path(rel: str) -> str:
    """Absolute path of configs/<rel>."""
    return osp.join(REPO, 'configs', rel)


def write_images(root: str, num: int = 2, size: int = IMG_SIZE, seed: int = 0,
                 classes=('a', 'b')) -> str:
    """Writes smooth random RGB images as ``root/train/<class>/*.png`` (CustomDataset layout)."""
    rng = np.random.default_rng(seed)
    for idx in range(num):
        folder = osp.join(root, 'train', classes[idx % len(classes)])
        os.makedirs(folder, exist_ok=True)
        coarse = rng.integers(0, 256, size=(size // 8, size // 8, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((size, size), Image.BILINEAR)
        image.save(osp.join(folder, f'{idx:03d}.png'))
    return root


def save_tiny_clip_teacher(path: str, seed: int = 0) -> str:
    """Saves the canonical state dict of a randomly initialised tiny CLIP-layout ViT."""
    from mmlinvit.backbones import VisionTransformer
    torch.manual_seed(seed)
    model = VisionTransformer(arch=TEACHER_ARCH, family='clip', patch_size=PATCH,
                              img_size=IMG_SIZE)
    torch.save(model.state_dict(), path)
    return path


def _pipeline() -> List[dict]:
    return [dict(type='LoadImageFromFile'), dict(type='Resize', scale=IMG_SIZE),
            dict(type='PackInputs')]


def _loader(data_root: str, with_label: bool, shuffle: bool) -> dict:
    return dict(batch_size=2, num_workers=0, persistent_workers=False,
                sampler=dict(type='DefaultSampler', shuffle=shuffle),
                dataset=dict(type='CustomDataset', data_root=data_root, data_prefix='train',
                             with_label=with_label, pipeline=_pipeline()))


def tiny_distill_config(data_root: str, work_dir: str, teacher_ckpt: str, iters: int,
                        lr: float = 2e-3) -> Config:
    """The Adventurer Linearizer config at tiny size: every iteration sees the same 2 images.

    Args:
        data_root: Root written by :func:`write_images`.
        work_dir: Work dir of the run.
        teacher_ckpt: Tiny CLIP teacher (:func:`save_tiny_clip_teacher`).
        iters: Training iterations (one per epoch; one checkpoint at the end).
        lr: Constant AdamW learning rate (no warm-up / decay).
    """
    cfg = Config.fromfile(config_path(DISTILL_CONFIG))
    model = cfg.model
    model.student.update(arch=student_arch(), img_size=IMG_SIZE, patch_size=PATCH)
    model.teacher.update(arch=dict(TEACHER_ARCH), img_size=IMG_SIZE, patch_size=PATCH,
                         pretrained=teacher_ckpt)
    # K = 4 stages of a 4-block student and a 4-block teacher: every block ends a stage
    model.student_recorders.stages.indices = [0, 1, 2, 3]
    model.teacher_recorders.stages.indices = [0, 1, 2, 3]
    model.connectors.proj.update(in_channels=student_arch()['embed_dims'],
                                 out_channels=TEACHER_ARCH['embed_dims'])
    cfg.train_dataloader = _loader(data_root, with_label=False, shuffle=False)
    cfg.train_cfg.max_epochs = iters
    cfg.optim_wrapper.optimizer.lr = lr
    cfg.param_scheduler = None
    cfg.auto_scale_lr = None
    cfg.default_hooks.logger.interval = 1
    cfg.default_hooks.checkpoint.interval = iters
    cfg.work_dir = work_dir
    cfg.log_level = 'WARNING'
    return cfg


def tiny_finetune_config(data_root: str, work_dir: str, pretrained: str,
                         iters: int = 2) -> Config:
    """The fine-tuning config at tiny size, starting from ``pretrained``."""
    cfg = Config.fromfile(config_path(FINETUNE_CONFIG))
    cfg.model.backbone.update(arch=student_arch(), img_size=IMG_SIZE, patch_size=PATCH,
                              pretrained=pretrained, drop_path_rate=0.0)
    cfg.model.head.update(num_classes=2, in_channels=student_arch()['embed_dims'], topk=(1, ))
    cfg.train_dataloader = _loader(data_root, with_label=True, shuffle=True)
    cfg.val_dataloader = _loader(data_root, with_label=True, shuffle=False)
    cfg.test_dataloader = cfg.val_dataloader
    cfg.val_evaluator = dict(type='Accuracy', topk=(1, ))
    cfg.test_evaluator = cfg.val_evaluator
    cfg.data_preprocessor.num_classes = 2
    cfg.train_cfg.update(max_epochs=iters, val_interval=iters)
    cfg.default_hooks.logger.interval = 1
    cfg.default_hooks.checkpoint.interval = iters
    cfg.work_dir = work_dir
    cfg.log_level = 'WARNING'
    return cfg


class LossRecorderHook(Hook):
    """Collects ``{iter, <log var>: float}`` of every training step."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.history: List[Dict[str, float]] = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        values = {k: float(torch.as_tensor(v).detach()) for k, v in outputs.items()}
        self.history.append(dict(iter=runner.iter, **values))
