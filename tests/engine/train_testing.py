"""Helpers of the training-reliability tests: the demo teacher on generated toy scenes, run
through tools/train.py, with hooks that record losses, stop a run, or poison a weight.

The hooks are registered in mmengine's root HOOKS registry; runs in other processes (torchrun)
import this module through ``custom_imports`` (``tests/engine`` on ``PYTHONPATH``).
"""
import contextlib
import glob
import importlib.util
import json
import logging
import math
import os
import os.path as osp
import zlib
from typing import Dict, Iterator, List, Optional, Sequence

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

HERE = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(osp.dirname(HERE))
#: The demo's softmax teacher: mmseg EncoderDecoder (ViT + UPerNet) with RandomResize /
#: RandomCrop / RandomFlip in its training pipeline.
DEMO_TEACHER = osp.join(REPO, 'configs', 'demo', 'upernet_vit-tiny-softmax_1xb8-300it_toy-64x64.py')


class _Capture(logging.Handler):

    def __init__(self, level: int) -> None:
        super().__init__(level=level)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def captured_log(level: int = logging.NOTSET) -> Iterator[List[str]]:
    """The messages the current MMLogger emits at ``level`` or above inside the block."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    handler = _Capture(level)
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)


def load_tool(name: str):
    """Imports ``tools/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f'mmlinvit_tool_{name}',
                                                  osp.join(REPO, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_toy_scenes(root: str, num_train: int = 8) -> str:
    """Writes the demo's toy scenes (ADE20K layout) under ``root``; returns the data root."""
    from mmlinvit.datasets import make_ade20k_layout
    make_ade20k_layout(root, num_train=num_train, num_val=2, size=(64, 80), seed=0)
    return root


def toy_config(data_root: str, work_dir: str, max_iters: int = 12, interval: int = 4,
               num_workers: int = 0, batch_size: int = 2, max_keep_ckpts: int = -1,
               drop_path_rate: float = 0.1, embed_dims: int = 32) -> Config:
    """The demo teacher shrunk to a CPU test: 4 blocks of width 32, batch 2, no validation.

    ``drop_path_rate > 0`` makes the model draw from the torch stream every iteration.
    """
    cfg = Config.fromfile(DEMO_TEACHER)
    cfg.work_dir = work_dir
    backbone = cfg.model.backbone
    backbone.arch = dict(embed_dims=embed_dims, num_layers=4, num_heads=2,
                         mlp_hidden_dims=2 * embed_dims)
    backbone.drop_path_rate = drop_path_rate
    cfg.model.neck.embed_dim = embed_dims
    cfg.model.decode_head.in_channels = [embed_dims] * 4
    cfg.model.decode_head.channels = 16
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[key].dataset.data_root = data_root
        cfg[key].batch_size = batch_size
        cfg[key].num_workers = 0
        cfg[key].persistent_workers = False
    cfg.train_dataloader.num_workers = num_workers
    cfg.train_dataloader.persistent_workers = num_workers > 0
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=10**6)
    cfg.val_dataloader = cfg.val_cfg = cfg.val_evaluator = None
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=0.5, by_epoch=False, begin=0,
                                end=max_iters)]
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1, log_metric_by_epoch=False)
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', by_epoch=False,
                                        interval=interval, max_keep_ckpts=max_keep_ckpts)
    cfg.default_hooks.visualization = dict(type='SegVisualizationHook')
    cfg.log_level = 'INFO'
    return cfg


def with_validation(cfg: Config, data_root: str, interval: int = 4,
                    save_best: Optional[str] = None, rule: str = 'greater') -> Config:
    """Gives a :func:`toy_config` the demo's validation (2 toy images, mIoU) every
    ``interval`` iterations, and ``save_best`` when given."""
    demo = Config.fromfile(DEMO_TEACHER)
    cfg.val_dataloader = demo.val_dataloader
    cfg.val_dataloader.update(num_workers=0, persistent_workers=False)
    cfg.val_dataloader.dataset.data_root = data_root
    cfg.val_evaluator = demo.val_evaluator
    cfg.val_cfg = dict(type='ValLoop')
    cfg.train_cfg.val_interval = interval
    if save_best:
        cfg.default_hooks.checkpoint.update(save_best=save_best, rule=rule)
    return cfg


def logged_metric(work_dir: str, key: str) -> Dict[int, float]:
    """``{step: value}`` of a validation metric in the run logs of ``work_dir`` (all runs)."""
    values: Dict[int, float] = {}
    for path in sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))):
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                if key in row:
                    values[int(row['step'])] = float(row[key])
    return values


#: ViT-AdaLA Stage 3 classification: mmpretrain ImageClassifier, epoch-based, with
#: RandomResizedCrop / RandomFlip.
CLS_STAGE3 = osp.join(REPO, 'configs', 'adala',
                      'linear-head_adala-dinov2-l-elu_64xb16-30e_in1k-512x512.py')


def make_image_folder(root: str, num_per_class: int = 4, size: int = 40) -> str:
    """Random PNGs in mmpretrain CustomDataset layout ``root/train/<a|b>/*.png``."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for cls in ('a', 'b'):
        folder = osp.join(root, 'train', cls)
        os.makedirs(folder, exist_ok=True)
        for idx in range(num_per_class):
            pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(osp.join(folder, f'{idx:03d}.png'))
    return root


def toy_cls_config(data_root: str, work_dir: str, max_epochs: int = 3,
                   num_workers: int = 0) -> Config:
    """The Stage-3 classification recipe shrunk: tiny ELU student at 32 px, 8 images, batch 2
    (4 iterations per epoch), a checkpoint every epoch, no validation."""
    cfg = Config.fromfile(CLS_STAGE3)
    cfg.work_dir = work_dir
    backbone = cfg.model.backbone
    backbone.update(arch=dict(embed_dims=24, num_layers=2, num_heads=2, mlp_hidden_dims=48),
                    img_size=32, patch_size=8, pretrained=None, drop_path_rate=0.1)
    cfg.model.head.update(num_classes=2, in_channels=24, topk=(1, ))
    cfg.model.data_preprocessor = dict(type='ClsDataPreprocessor', num_classes=2,
                                       mean=[123.675, 116.28, 103.53],
                                       std=[58.395, 57.12, 57.375], to_rgb=True)
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='RandomResizedCrop', scale=32, backend='pillow', interpolation='bicubic'),
        dict(type='RandomFlip', prob=0.5, direction='horizontal'),
        dict(type='PackInputs'),
    ]
    cfg.train_dataloader = dict(
        batch_size=2, num_workers=num_workers, persistent_workers=num_workers > 0,
        sampler=dict(type='DefaultSampler', shuffle=True),
        dataset=dict(type='CustomDataset', data_root=data_root, data_prefix='train',
                     with_label=True, pipeline=pipeline))
    for key in ('val_dataloader', 'val_evaluator', 'val_cfg', 'test_dataloader',
                'test_evaluator', 'test_cfg'):
        cfg[key] = None
    cfg.train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=10**6)
    cfg.auto_scale_lr = None
    cfg.optim_wrapper.optimizer.lr = 1e-3
    cfg.param_scheduler = [dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True,
                                begin=0, end=max_epochs, convert_to_iter_based=True)]
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=1, max_keep_ckpts=-1)
    cfg.log_level = 'INFO'
    cfg.missing_path_hints = {}
    return cfg


def dump(cfg: Config, path: str, hooks: Optional[List[dict]] = None) -> str:
    """Writes ``cfg`` (plus test hooks, imported from this module) to ``path``."""
    cfg = cfg.copy()
    if hooks:
        cfg.custom_hooks = list(cfg.get('custom_hooks', None) or []) + hooks
        cfg.custom_imports = dict(imports=['train_testing'], allow_failed_imports=False)
    cfg.dump(path)
    return path


def train_in_process(cfg: Config, tmp_path, name: str, work_dir: str, *flags: str,
                     hooks: Sequence[dict] = ()) -> Dict[int, Dict[str, float]]:
    """``tools/train.py`` in this process with a loss recorder; a ``RunStopped`` interruption
    ends it quietly.

    Returns:
        {iteration: losses} of rank 0.
    """
    record = str(tmp_path / f'{name}.jsonl')
    path = dump(cfg, str(tmp_path / f'{name}.py'),
                hooks=[dict(type='RecordLossesHook', path=record)] + list(hooks))
    try:
        load_tool('train').main([path, '--work-dir', work_dir, *flags])
    except RunStopped:
        pass
    return read_losses(record).get(0, {})


def read_losses(path: str) -> Dict[int, Dict[int, Dict[str, float]]]:
    """``{rank: {iteration (1-based): {key: value}}}`` written by :class:`RecordLossesHook`."""
    out: Dict[int, Dict[int, Dict[str, float]]] = {}
    if not osp.isfile(path):
        return out
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            out.setdefault(row.pop('rank'), {})[row.pop('iter')] = row
    return out


@HOOKS.register_module(force=True)
class RecordLossesHook(Hook):
    """Appends ``{rank, iter, <loss keys>, torch_stream}`` of every training iteration to a
    JSON-lines file (``torch_stream``: a CRC of the global torch generator's state, read
    without drawing from it)."""

    priority = 'LOWEST'

    def __init__(self, path: str) -> None:
        self.path = path

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        row = dict(rank=runner.rank, iter=runner.iter + 1,
                   torch_stream=zlib.crc32(torch.random.get_rng_state().numpy().tobytes()))
        row.update({k: float(torch.as_tensor(v).detach().float().mean())
                    for k, v in (outputs or {}).items() if 'loss' in k})
        with open(self.path, 'a') as f:
            f.write(json.dumps(row) + '\n')


class RunStopped(RuntimeError):
    """Raised by :class:`StopHook` (in-process runs)."""


@HOOKS.register_module(force=True)
class StopHook(Hook):
    """Stops the run right after iteration ``after_iter`` / epoch ``after_epoch`` (1-based)
    and the checkpoint written there.

    ``hard=True`` ends the process at once with ``os._exit`` (a killed job: no teardown, no
    ``after_train``); otherwise :class:`RunStopped` is raised.
    """

    priority = 'LOWEST'  # after CheckpointHook (VERY_LOW)

    def __init__(self, after_iter: Optional[int] = None, after_epoch: Optional[int] = None,
                 hard: bool = False) -> None:
        self.after_iter = after_iter
        self.after_epoch = after_epoch
        self.hard = hard

    def _stop(self, what: str) -> None:
        if self.hard:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.barrier()  # rank 0 has finished writing the checkpoint
            os._exit(17)
        raise RunStopped(f'stopped after {what}')

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if self.after_iter is not None and runner.iter + 1 == self.after_iter:
            self._stop(f'iteration {self.after_iter}')

    def after_train_epoch(self, runner) -> None:
        if self.after_epoch is not None and runner.epoch + 1 == self.after_epoch:
            self._stop(f'epoch {self.after_epoch}')


@HOOKS.register_module(force=True)
class DumpNormStatsHook(Hook):
    """Appends ``{rank, stats}`` (the BatchNorm running means, flattened) after training."""

    priority = 'LOWEST'

    def __init__(self, path: str) -> None:
        self.path = path

    def after_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        stats = [float(v) for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)
                 for v in m.running_mean.flatten()]
        with open(self.path, 'a') as f:
            f.write(json.dumps(dict(rank=runner.rank, stats=stats)) + '\n')


@HOOKS.register_module(force=True)
class PoisonHook(Hook):
    """Before iteration ``at_iter`` (1-based), makes a weight or its next gradient NaN.

    Args:
        at_iter: The iteration.
        param: Parameter name in the (unwrapped) model.
        what: ``'weight'`` (fill the weight with NaN: the loss turns NaN) or ``'grad'`` (its
            gradient of that iteration is NaN while the loss stays finite).
        every_iter_after: Also poison every later iteration (``what='grad'``).
    """

    priority = 'LOWEST'

    def __init__(self, at_iter: int, param: str, what: str = 'weight',
                 every_iter_after: bool = False) -> None:
        self.at_iter = at_iter
        self.param = param
        self.what = what
        self.every_iter_after = every_iter_after

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        due = (runner.iter + 1 >= self.at_iter if self.every_iter_after else
               runner.iter + 1 == self.at_iter)
        if not due:
            return
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        param = dict(model.named_parameters())[self.param]
        if self.what == 'weight':
            with torch.no_grad():
                param.fill_(math.nan)
        else:
            self._handle = param.register_hook(lambda grad: torch.full_like(grad, math.nan))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        handle = getattr(self, '_handle', None)
        if handle is not None:
            handle.remove()
            self._handle = None


def all_finite(path: str) -> bool:
    """Whether every floating tensor of a runner checkpoint's state dict is finite."""
    ckpt = torch.load(path, map_location='cpu', weights_only=False)
    return all(bool(torch.isfinite(v).all()) for v in ckpt['state_dict'].values()
               if v.is_floating_point())


def env_for_subprocess(**extra: str) -> Dict[str, str]:
    """Environment of torchrun / tools subprocesses: repo and this folder importable."""
    env = dict(os.environ, OMP_NUM_THREADS='1', CUDA_VISIBLE_DEVICES='',
               PYTHONPATH=os.pathsep.join([REPO, HERE, os.environ.get('PYTHONPATH', '')]))
    env.update(extra)
    return env
