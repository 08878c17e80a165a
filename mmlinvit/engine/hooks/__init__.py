"""Training hooks."""
from .atomic_checkpoint_hook import AtomicCheckpointHook
from .check_finite_hook import CheckFiniteHook
from .checkpoint_coverage_hook import CheckpointCoverageHook
from .distill_loss_schedule_hook import DistillLossScheduleHook
from .export_student_hook import ExportStudentHook
from .random_state_hook import RandomStateHook
from .seg_visualization_hook import SegVisualizationHook
from .sync_norm_stats_hook import SyncNormStatsHook

__all__ = ['AtomicCheckpointHook', 'CheckFiniteHook', 'CheckpointCoverageHook', 'DistillLossScheduleHook', 'ExportStudentHook', 'RandomStateHook', 'SegVisualizationHook', 'SyncNormStatsHook']
