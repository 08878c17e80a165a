"""Training hooks."""
from .distill_loss_schedule_hook import DistillLossScheduleHook
from .export_student_hook import ExportStudentHook

__all__ = ['DistillLossScheduleHook', 'ExportStudentHook']
