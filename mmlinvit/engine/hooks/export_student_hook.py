"""Exports the distilled student backbone as a plain weights file next to each checkpoint."""
import os.path as osp

import torch
from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper

from mmlinvit.registry import HOOKS


@HOOKS.register_module()
class ExportStudentHook(Hook):
    """Writes ``<work_dir>/student_backbone_epoch_<n>.pth`` whenever a checkpoint is saved.

    The file holds the student backbone's state dict only (canonical keys, tensors only; no
    teacher, connectors, mask token or training state), so any backbone config loads it with
    ``pretrained=<file>`` under ``torch.load(weights_only=True)``.  Runner checkpoints also
    work through their ``student.`` keys, but they pickle training state (message hub,
    optimizer) that the safe loader refuses unless trusted.

    Args:
        by_epoch: Name files after the epoch (``True``) or the iteration of the checkpoint;
            match the ``CheckpointHook``.
        filename_tmpl: File name template, formatted with ``'epoch_<n>'`` / ``'iter_<n>'``.
    """

    priority = 'NORMAL'

    def __init__(self, by_epoch: bool = True,
                 filename_tmpl: str = 'student_backbone_{}.pth') -> None:
        self.by_epoch = by_epoch
        self.filename_tmpl = filename_tmpl

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        if not callable(getattr(model, 'student_backbone', None)):
            raise TypeError(f'ExportStudentHook needs a mmlinvit.DistillationModel, the runner '
                            f'trains a {type(model).__name__}')
        meta = checkpoint['meta']
        tag = f'epoch_{meta["epoch"]}' if self.by_epoch else f'iter_{meta["iter"]}'
        path = osp.join(runner.work_dir, self.filename_tmpl.format(tag))
        if is_main_process():
            state = {k: v.detach().cpu().clone()
                     for k, v in model.student_backbone().state_dict().items()}
            torch.save(state, path)
            print_log(f'Exported the student backbone to {path}', logger='current')
