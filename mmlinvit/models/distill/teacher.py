"""The frozen teacher: built from its config, loaded once, never trained or re-initialised."""
import logging
import os
from typing import Optional

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.model import BaseModel, BaseModule
from mmengine.runner.checkpoint import load_checkpoint

from mmlinvit.converters.checkpoint_file import check_checkpoint_file
from mmlinvit.registry import MODELS
from mmlinvit.utils.config_types import is_pretrained_init
from .errors import DistillationConfigError


def build_frozen_teacher(cfg: dict, ckpt: Optional[str] = None,
                         layout: str = 'auto') -> nn.Module:
    """Builds the teacher, loads its weights and freezes it (eval mode, no gradients).

    The teacher's own ``pretrained=`` / init_cfg is applied here, once; the runner's
    ``init_weights`` then skips the teacher.

    Args:
        cfg: Teacher config: a backbone or a task model.
        ckpt: Checkpoint loaded after the teacher's own initialisation (a task model:
            strict mmengine checkpoint; a backbone: any layout
            :func:`mmlinvit.converters.load_pretrained` handles).
        layout: Layout of ``ckpt`` for a backbone (``'auto'`` detects it).

    Returns:
        The frozen teacher.

    Raises:
        DistillationConfigError: when ``ckpt`` does not fit the teacher (naming both).
    """
    teacher = MODELS.build(cfg)
    if callable(getattr(teacher, 'init_weights', None)):
        teacher.init_weights()  # loads the teacher config's own `pretrained=`
    if ckpt is not None:
        try:
            if isinstance(teacher, BaseModel):
                if os.path.isfile(ckpt):  # truncated / changed bytes, named (CRC-32)
                    check_checkpoint_file(ckpt)
                load_checkpoint(teacher, ckpt, map_location='cpu', strict=True,
                                revise_keys=[(r'^module\.', '')])
            else:
                from mmlinvit.converters import load_pretrained
                load_pretrained(teacher, ckpt, layout=layout)
        except (RuntimeError, ValueError, KeyError, FileNotFoundError) as err:
            raise DistillationConfigError(
                f'teacher_ckpt {ckpt!r} does not fit the teacher '
                f'{type(teacher).__name__}: {err}') from err
        print_log(f'Loaded the teacher weights from {ckpt}', logger='current')
    elif not _loads_weights(teacher):
        print_log('The teacher has no checkpoint (no teacher_ckpt, no pretrained=): it '
                  'keeps its random initialisation', logger='current',
                  level=logging.WARNING)
    # Never (re-)initialised by the runner, never trained.
    if isinstance(teacher, BaseModule):
        teacher._is_init = True
    else:
        teacher.is_init = True
    teacher.eval()
    for param in teacher.parameters():
        param.requires_grad_(False)
    return teacher


def _loads_weights(teacher: nn.Module) -> bool:
    """Whether the teacher or one of its modules (a task model's backbone) read a file in its
    own initialisation: ``pretrained=`` or a ``Pretrained`` init_cfg (another init_cfg, e.g. a
    head's ``Normal``, draws random weights)."""
    for module in teacher.modules():
        if getattr(module, 'pretrained', None) or getattr(module, 'weights_loaded', False):
            return True
        init_cfgs = getattr(module, 'init_cfg', None) or []
        for init_cfg in init_cfgs if isinstance(init_cfgs, (list, tuple)) else [init_cfgs]:
            if is_pretrained_init(init_cfg):
                return True
    return False
