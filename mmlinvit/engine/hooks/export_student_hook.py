"""Exports the distilled student backbone as a plain weights file next to each checkpoint."""
import os
import os.path as osp
from typing import Dict

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

    The file holds the student backbone's weights as the checkpoint being saved holds them
    (with mmengine's ``EMAHook``: the averaged weights, which are validated, saved and exported
    by ``tools/model_converters/export_student.py`` too); the student backbone's state dict only (canonical keys, tensors only; no
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

    #: After every other hook's ``before_save_checkpoint``: ``EMAHook`` swaps the averaged
    #: weights into the checkpoint there, and the export holds what the checkpoint holds.
    priority = 'VERY_LOW'

    def __init__(self, filename_tmpl: str = 'student_backbone.pth', by_epoch: bool = True) -> None:
        try:  # at build time, not at the first checkpoint (after an epoch of training)
            filename_tmpl.format('epoch_1')
        except (IndexError, KeyError, ValueError) as exc:
            raise ValueError(f"ExportStudentHook: filename_tmpl {filename_tmpl!r} may only "
                             f"hold one '{{}}' (filled with epoch_<n> / iter_<n>): "
                             f'{type(exc).__name__}: {exc}') from None
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
            state = student_backbone_state(model, checkpoint['state_dict'])
            # written beside and renamed: an interrupted write never leaves a truncated file
            # where the last complete export was
            tmp = f'{path}.tmp'
            torch.save(state, tmp)
            os.replace(tmp, path)
            print_log(f'Exported the student backbone ({tag}) to {path}', logger='current')


def student_backbone_state(model: torch.nn.Module,
                           state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The student backbone's entries of a distillation model's checkpoint state dict.

    Args:
        model: The (unwrapped) ``DistillationModel``.
        state_dict: The checkpoint's ``state_dict`` (mmengine's ``EMAHook`` has put the
            averaged weights there).

    Returns:
        Backbone keys -> CPU copies of the checkpoint's tensors.

    Raises:
        KeyError: The checkpoint lacks some of the backbone's keys (named).
    """
    backbone = model.student_backbone()
    name = next(name for name, module in model.named_modules() if module is backbone)
    prefix = f'{name}.' if name else ''
    state = {key[len(prefix):]: value.detach().cpu().clone()
             for key, value in state_dict.items() if key.startswith(prefix)}
    missing = sorted(set(backbone.state_dict()) - set(state))
    if missing:
        raise KeyError(f'The checkpoint being saved lacks student backbone keys under '
                       f'{prefix!r}: {missing[:8]}')
    return state
