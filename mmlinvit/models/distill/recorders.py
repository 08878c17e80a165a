"""Recorders of the distillation model: the torch-only classes and their attachment by name.

The classes are re-exported from the torch-only :mod:`mmlinvit.distill.recorders` (so that
``from mmlinvit.models.distill.recorders import ...`` goes on working; they are the same
objects); :func:`attach_recorders` builds and attaches the ``student_recorders`` /
``teacher_recorders`` of a :class:`~mmlinvit.models.distill.DistillationModel` config, and
:func:`recording` enables them for one step.
"""
from contextlib import contextmanager
from typing import Dict, Iterator, Optional, Sequence, Union

import torch.nn as nn

from mmlinvit.distill.recorders import (RECORDERS, AttentionMapsRecorder, ModuleInputsRecorder,
                                        ModuleOutputsRecorder, ModuleRecorder, Record,
                                        build_recorder, describe_missing_module, module_exists)
from .errors import DistillationConfigError

__all__ = [
    'RECORDERS', 'Record', 'ModuleRecorder', 'ModuleOutputsRecorder', 'ModuleInputsRecorder',
    'AttentionMapsRecorder', 'attach_recorders', 'build_recorder', 'describe_missing_module',
    'module_exists', 'recording'
]


def attach_recorders(cfgs: Optional[Dict[str, Union[str, dict]]], model: Optional[nn.Module],
                     side: str) -> Dict[str, ModuleRecorder]:
    """Builds ``{name: recorder config}`` and attaches each recorder to ``model``.

    Args:
        cfgs: Recorder configs by name (a string is a ``ModuleOutputs`` source); ``None``
            or ``{}`` for none.
        model: The student or teacher (``None`` when there is none).
        side: ``'student'`` or ``'teacher'`` (for messages).

    Returns:
        The attached recorders by name.

    Raises:
        DistillationConfigError: naming the recorder that cannot be built or attached, or
            recorders set for a missing model.
    """
    recorders = {}
    if cfgs and model is None:
        raise DistillationConfigError(f'{side}_recorders are set but there is no {side}')
    for name, cfg in (cfgs or {}).items():
        where = f'{side} recorder {name!r}'
        try:
            recorder = build_recorder(cfg)
        except (KeyError, TypeError) as err:
            raise DistillationConfigError(f'{where}: cannot build {cfg!r}: {err}') from err
        recorder.attach(model, where)
        recorders[name] = recorder
    return recorders


@contextmanager
def recording(recorders: Sequence[ModuleRecorder]) -> Iterator[None]:
    """Records with ``recorders`` inside the block, starting empty and forgetting on exit.

    Args:
        recorders: Attached recorders (the hooks stay registered, only the recording
            switches on and off).
    """
    for rec in recorders:
        rec.reset()
        rec.enabled = True
    try:
        yield
    finally:
        for rec in recorders:
            rec.enabled = False
            rec.reset()
