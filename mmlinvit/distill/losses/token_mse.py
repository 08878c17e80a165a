"""Mean-squared error between student and teacher token records (one or one per block)."""
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from .token_utils import (TensorOrSeq, as_tensor_list, check_same_length, check_same_shape,
                          patch_tokens, reduce_over_records)


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
    s_list = as_tensor_list(student, 'the student record')
    t_list = as_tensor_list(teacher, 'the teacher record')
    check_same_length(s_list, t_list, what)
    values = []
    for idx, (s, t) in enumerate(zip(s_list, t_list)):
        if patch_tokens_only:
            s = patch_tokens(s, student_token_layout, f'student record {idx}')
            t = patch_tokens(t, teacher_token_layout, f'teacher record {idx}')
        hint = None
        if s.ndim == 3 and t.ndim == 3 and s.shape[-1] == t.shape[-1] and not patch_tokens_only:
            hint = ('the token counts differ: set patch_tokens_only=True and map the '
                    'student/teacher token layouts')
        elif s.ndim == t.ndim and s.shape[-1] != t.shape[-1]:
            hint = 'the widths differ: add a connector projecting the student width'
        check_same_shape(s, t, f'{what} record {idx}', hint)
        values.append(pair_loss(s, t) if pair_loss is not None
                      else F.mse_loss(s.float(), t.detach().float()))
    return reduce_over_records(values, reduction)
