"""BatchNorm running statistics averaged over the processes before checkpoints and validation.

With several processes and plain BN (a CPU run, where SyncBN is replaced by BN, or any
config with ``BN``), each process keeps the running statistics of its own batches; mmengine's
DDP wrapper does not broadcast buffers.  Checkpoints then held rank 0's statistics while
validation ran each process's share of the images with its own, so the logged metrics (and
``save_best``) were not those of the saved model, and a resumed run (every process loading
rank 0's) validated differently from the uninterrupted one.  This hook averages the floating
BN buffers over the processes (as mmengine's ``SyncBuffersHook``) right before a checkpoint is
written and before each validation, so every process and the checkpoint hold the same
statistics.  It does nothing in single-process runs or when the model has no plain BN.

With mmengine's ``EMAHook`` the averaged model's BN buffers are averaged too: its checkpoints
hold the averaged model, whose buffers EMAHook copies from the live model at every update
(``update_buffers=False``) or averages itself (``True``), i.e. from each process's own
statistics.  Without this, the checkpoints (also ``save_best``'s) held rank 0's statistics
while validation had run with the averaged ones (``tools/test.py`` on the best checkpoint
gave 46.96 mIoU where 46.98 had been logged).
"""
from typing import List

import torch
from mmengine.dist import all_reduce_params, is_distributed
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from torch.nn.modules.batchnorm import SyncBatchNorm, _BatchNorm

from mmlinvit.registry import HOOKS

from .checkpoint_schedule import checkpoint_due
from .ema_models import ema_modules


@HOOKS.register_module()
class SyncNormStatsHook(Hook):
    """Averages plain BatchNorm running statistics over the processes (see the module doc)."""

    priority = 'LOW'  # after the optimizer step, before CheckpointHook (VERY_LOW)

    def __init__(self) -> None:
        self._buffers: List[torch.Tensor] = []

    def before_train(self, runner) -> None:
        self._buffers = []
        if not is_distributed():
            return
        models = [runner.model.module if is_model_wrapper(runner.model) else runner.model]
        models += ema_modules(runner)
        for model in models:
            for module in model.modules():
                if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
                    self._buffers += [b for b in module.buffers() if b.is_floating_point()]

    def _sync(self) -> None:
        if self._buffers:
            all_reduce_params(self._buffers, op='mean')

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if checkpoint_due(runner, 'iter'):
            self._sync()

    def after_train_epoch(self, runner) -> None:
        if checkpoint_due(runner, 'epoch'):
            self._sync()

    def before_val_epoch(self, runner) -> None:
        self._sync()
