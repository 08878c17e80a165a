"""OpenMMLab engine parts of mmlinvit (imported lazily by ``mmlinvit.registry``)."""
from .hooks import DistillLossScheduleHook, ExportStudentHook  # noqa: F401
from .optimizers import LayerDecayOptimWrapperConstructor  # noqa: F401
