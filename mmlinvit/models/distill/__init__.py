"""Teacher-student distillation inside mmengine runners."""
from .connectors import LinearConnector
from .distillation_model import CONTEXT_KEYS, DistillationModel, InputSpec, parse_input_spec
from .errors import DistillationConfigError
from .recorders import (RECORDERS, AttentionMapsRecorder, ModuleInputsRecorder,
                        ModuleOutputsRecorder, ModuleRecorder, build_recorder)

__all__ = [
    'CONTEXT_KEYS', 'DistillationModel', 'DistillationConfigError', 'InputSpec',
    'LinearConnector', 'parse_input_spec', 'RECORDERS', 'ModuleRecorder',
    'ModuleOutputsRecorder', 'ModuleInputsRecorder', 'AttentionMapsRecorder', 'build_recorder'
]
