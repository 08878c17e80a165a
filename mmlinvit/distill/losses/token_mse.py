"""Mean-squared error between student and teacher token records (one or one per block)."""
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from .base import DistillLossBase
from .token_utils import (TensorOrSeq, check_same_shape, patch_tokens, record_pairs,
                          reduce_over_records)


def token_records_mse(student: TensorOrSeq,
                      teacher: TensorOrSeq,
                      patch_tokens_only: bool,
                      student_token_layout: Sequence[int],
                      teacher_token_layout: Sequence[int],
                      reduction: str,
                      what: str,
                      pair_loss: Optional[Callable[[torch.Tensor, torch.Tensor],
                                                   torch.Tensor]] = None) -> torch.Tensor:
    """MSE (mean over all elements) per record pair, reduced over records.

    Args:
        student: Student record(s), (B, N, C) each (any shape if not ``patch_tokens_only``).
        teacher: Teacher record(s), paired by position with ``student``.
        patch_tokens_only: Compare the patch tokens only (drop special tokens on each side).
        student_token_layout: Student ``(prefix, suffix)`` special-token counts.
        teacher_token_layout: Teacher ``(prefix, suffix)`` special-token counts.
        reduction: ``'mean'`` or ``'sum'`` over records.
        what: Loss name, for error messages.
        pair_loss: Loss of one (student, teacher) record pair after token selection and shape
            checks; None for ``F.mse_loss`` in float32 with the teacher detached.

    Returns:
        Scalar loss (float32).
    """
    values = []
    for idx, (s, t) in enumerate(record_pairs(student, teacher, what)):
        if patch_tokens_only:
            s = patch_tokens(s, student_token_layout, f'student record {idx}')
            t = patch_tokens(t, teacher_token_layout, f'teacher record {idx}')
        hint = None
        if s.ndim == 3 and t.ndim == 3 and s.shape[-1] == t.shape[-1] and \
                s.shape[1] != t.shape[1] and not patch_tokens_only:
            hint = ('the token counts differ: set patch_tokens_only=True and map the '
                    'student/teacher token layouts')
        elif s.ndim == t.ndim and s.shape[-1] != t.shape[-1]:
            hint = 'the widths differ: add a connector projecting the student width'
        check_same_shape(s, t, f'{what} record {idx}', hint)
        values.append(pair_loss(s, t) if pair_loss is not None
                      else F.mse_loss(s.float(), t.detach().float()))
    return reduce_over_records(values, reduction)


class TokenMSEBase(DistillLossBase):
    """Base of the losses that compare token records pair by pair (MSE unless overridden).

    Subclasses name the reduction argument after what the records are (``block_reduction``,
    ``reduction``) and define ``forward`` with their record names, calling
    :meth:`records_loss`; :meth:`pair_loss` is the loss of one record pair.

    Args:
        loss_weight: Weight of the term.
        patch_tokens_only: Compare patch tokens only (MHLA / TTT students have no class
            token while the softmax teacher has one); the token layouts tell how many special
            tokens each side carries.
        reduction: ``'mean'`` or ``'sum'`` over the records.
        reduction_arg: The subclass's name of ``reduction``, for the error message.
    """

    def __init__(self, loss_weight: float, patch_tokens_only: bool, reduction: str,
                 reduction_arg: str) -> None:
        super().__init__(loss_weight, reduction, reduction_arg)
        self.patch_tokens_only = patch_tokens_only

    def pair_loss(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """MSE of one record pair in float32, the teacher detached."""
        return F.mse_loss(student.float(), teacher.detach().float())

    def records_loss(self, student: TensorOrSeq, teacher: TensorOrSeq,
                     student_token_layout: Sequence[int],
                     teacher_token_layout: Sequence[int]) -> torch.Tensor:
        """Weighted reduction of :meth:`pair_loss` over the (token-selected) record pairs.

        Args:
            student: Student record(s).
            teacher: Teacher record(s), same blocks.
            student_token_layout: Student ``(prefix, suffix)`` special-token counts.
            teacher_token_layout: Teacher ``(prefix, suffix)`` special-token counts.
        """
        value = token_records_mse(student, teacher, self.patch_tokens_only, student_token_layout,
                                  teacher_token_layout, self.reduction, type(self).__name__,
                                  pair_loss=self.pair_loss)
        return self.loss_weight * value
