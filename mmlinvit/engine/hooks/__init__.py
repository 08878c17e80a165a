"""Training hooks."""
from .check_finite_hook import CheckFiniteHook
from .checkpoint_coverage_hook import CheckpointCoverageHook
from .distill_loss_schedule_hook import DistillLossScheduleHook
from .export_student_hook import ExportStudentHook
from .random_state_hook import RandomStateHook

__all__ = ['CheckFiniteHook', 'CheckpointCoverageHook', 'DistillLossScheduleHook', 'ExportStudentHook', 'RandomStateHook']
