"""Training hooks."""
from .distill_loss_schedule_hook import DistillLossScheduleHook

__all__ = ['DistillLossScheduleHook']
