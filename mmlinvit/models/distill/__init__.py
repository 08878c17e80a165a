"""Teacher-student distillation inside mmengine runners."""
from .connectors import LinearConnector
from .distillation_model import DistillationModel
from .errors import DistillationConfigError
from .input_specs import CONTEXT_KEYS, SIDES, InputSpec, parse_input_spec
from .recorders import (RECORDERS, AttentionMapsRecorder, ModuleInputsRecorder,
                        ModuleOutputsRecorder, ModuleRecorder, build_recorder)
from .teacher_input_norm import TeacherInputNorm

__all__ = [
    'CONTEXT_KEYS', 'SIDES', 'DistillationModel', 'DistillationConfigError', 'InputSpec',
    'LinearConnector', 'parse_input_spec', 'RECORDERS', 'ModuleRecorder',
    'ModuleOutputsRecorder', 'ModuleInputsRecorder', 'AttentionMapsRecorder', 'build_recorder',
    'TeacherInputNorm'
]
