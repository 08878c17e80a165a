"""Exports the distilled student backbone as a plain weights file next to each checkpoint."""
import os
import os.path as osp

import torch
from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper

from mmlinvit.registry import HOOKS


@HOOKS.register_module()
class ExportStudentHook(Hook):
    """Writes the student backbone's weights to ``<work_dir>/student_backbone.pth`` whenever a
    checkpoint is saved.

    The file holds the student backbone's state dict only (canonical keys, tensors only; no
    teacher, connectors, distillation-model mask token or training state; a backbone's own
    mask token and training records are part of it), so any backbone config loads it with
    ``pretrained=<file>`` under ``torch.load(weights_only=True)``.  Runner checkpoints also
    carry the student (``student.`` keys, stripped by :mod:`mmlinvit.converters`), but they
    pickle training state (message hub, optimizer) that the safe loader refuses unless trusted.

    Args:
        filename_tmpl: File name in the work dir.  A ``{}`` in it is replaced by
            ``epoch_<n>`` / ``iter_<n>`` to keep one file per checkpoint; without it (default)
            the file always holds the latest student.
        by_epoch: Whether ``{}`` is filled with the epoch (``True``) or the iteration of the
            checkpoint; match the ``CheckpointHook``.
    """

    priority = 'NORMAL'

    def __init__(self, filename_tmpl: str = 'student_backbone.pth', by_epoch: bool = True) -> None:
        self.filename_tmpl = filename_tmpl
        self.by_epoch = by_epoch

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
            # written beside and renamed: an interrupted write never leaves a truncated file
            # where the last complete export was
            tmp = f'{path}.tmp'
            torch.save(state, tmp)
            os.replace(tmp, path)
            print_log(f'Exported the student backbone ({tag}) to {path}', logger='current')
