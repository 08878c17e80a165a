"""The part every record-matching distillation loss shares: weight, reduction, record pairs.

A distillation loss compares student records with the teacher's, one record per recorded
block / stage (a single tensor is one record).  It computes one scalar per (student, teacher)
pair, reduces them with ``'mean'`` or ``'sum'`` and returns the weighted term: as in mmrazor,
``loss_weight`` is applied inside the module.  Subclasses keep their own ``forward`` with
named arguments, because a distillation term maps its inputs to those names and
:func:`mmlinvit.models.distill.terms.build_term` checks the mapping against that signature at
build time.
"""
from typing import List, Sequence, Tuple

import torch
import torch.nn as nn

from .token_utils import TensorOrSeq, record_pairs, reduce_over_records

#: Reductions over the records of a loss (blocks / stages).
RECORD_REDUCTIONS = ('mean', 'sum')


class DistillLossBase(nn.Module):
    """``loss_weight * reduce_i loss(student_i, teacher_i)`` over paired records.

    Args:
        loss_weight: Weight of the term.
        reduction: ``'mean'`` or ``'sum'`` over the records, checked here (build time).
        reduction_arg: The subclass's name of the reduction argument (``block_reduction``,
            ``stage_reduction``...), for the error message.
    """

    def __init__(self,
                 loss_weight: float = 1.0,
                 reduction: str = 'mean',
                 reduction_arg: str = 'reduction') -> None:
        super().__init__()
        if reduction not in RECORD_REDUCTIONS:
            raise ValueError(f"{reduction_arg} must be 'mean' or 'sum', got {reduction!r}")
        self.loss_weight = loss_weight
        self.reduction = reduction

    def record_pairs(self, student: TensorOrSeq, teacher: TensorOrSeq,
                     names: Tuple[str, str]) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Student and teacher records paired by position (same number on both sides).

        Args:
            student: Student record(s).
            teacher: Teacher record(s).
            names: The ``forward`` argument names of the two, for error messages.
        """
        return record_pairs(student, teacher, type(self).__name__, names)

    def weighted(self, values: Sequence[torch.Tensor]) -> torch.Tensor:
        """``loss_weight`` times the reduction of the per-record losses."""
        return self.loss_weight * reduce_over_records(values, self.reduction)
