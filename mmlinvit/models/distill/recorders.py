"""Recorders, re-exported from the torch-only :mod:`mmlinvit.distill.recorders`.

Kept so that ``from mmlinvit.models.distill.recorders import ...`` goes on working; the
classes are the same objects.
"""
from mmlinvit.distill.recorders import (RECORDERS, AttentionMapsRecorder, ModuleInputsRecorder,
                                        ModuleOutputsRecorder, ModuleRecorder, Record,
                                        build_recorder, describe_missing_module, module_exists)

__all__ = [
    'RECORDERS', 'Record', 'ModuleRecorder', 'ModuleOutputsRecorder', 'ModuleInputsRecorder',
    'AttentionMapsRecorder', 'build_recorder', 'describe_missing_module', 'module_exists'
]
