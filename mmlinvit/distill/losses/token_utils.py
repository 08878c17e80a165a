"""Token bookkeeping shared by the distillation losses.

Records are (B, N, C) token tensors whose sequence holds ``prefix`` special tokens in front
(class / register tokens of a ViT), the patch tokens, then ``suffix`` special tokens at the
end (the class token Adventurer appends).  A *token layout* is the pair ``(prefix, suffix)``;
:class:`~mmlinvit.models.distill.DistillationModel` publishes the student's and the
teacher's layouts as the context entries ``student_token_layout`` / ``teacher_token_layout``.
"""
from typing import List, Optional, Sequence, Tuple, Union

import torch

TensorOrSeq = Union[torch.Tensor, Sequence[torch.Tensor]]
TokenLayout = Tuple[int, int]


def as_tensor_list(value: TensorOrSeq, name: str) -> List[torch.Tensor]:
    """A tensor becomes a one-element list; a sequence of tensors stays a list.

    Args:
        value: One tensor (one record) or a sequence (one record per block / stage).
        name: Argument name, for the error message.
    """
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, torch.Tensor) for v in value):
        return list(value)
    raise TypeError(f'{name} must be a tensor or a non-empty sequence of tensors, got '
                    f'{type(value).__name__}')


def check_same_length(student: Sequence, teacher: Sequence, what: str) -> None:
    """Raises ``ValueError`` when student and teacher provide different numbers of records."""
    if len(student) != len(teacher):
        raise ValueError(f'{what}: the student provides {len(student)} records but the teacher '
                         f'{len(teacher)}; record the same blocks / stages on both sides')


def record_pairs(student: TensorOrSeq, teacher: TensorOrSeq, what: str,
                 names: Tuple[str, str] = ('the student record', 'the teacher record')
                 ) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Pairs student and teacher records by position (one tensor is one record).

    Args:
        student: Student record(s).
        teacher: Teacher record(s), as many as the student's.
        what: Loss name, for the error message.
        names: Argument names of the student and teacher records, for the error message.

    Raises:
        TypeError: for a value that is no tensor or non-empty sequence of tensors.
        ValueError: when the two sides provide different numbers of records.
    """
    s_list = as_tensor_list(student, names[0])
    t_list = as_tensor_list(teacher, names[1])
    check_same_length(s_list, t_list, what)
    return list(zip(s_list, t_list))


def check_layout(layout: Sequence[int], name: str) -> TokenLayout:
    """Validates a ``(prefix, suffix)`` token layout."""
    if len(layout) != 2 or any(int(n) < 0 for n in layout):
        raise ValueError(f'{name} must be (num_prefix_tokens, num_suffix_tokens) with '
                         f'non-negative entries, got {tuple(layout)}')
    return int(layout[0]), int(layout[1])


def patch_tokens(tokens: torch.Tensor, layout: Sequence[int], name: str) -> torch.Tensor:
    """Drops the special tokens of a (B, N, C) record, keeping the patch tokens.

    Args:
        tokens: (B, N, C) record.
        layout: ``(prefix, suffix)`` numbers of special tokens.
        name: Record name, for the error message.
    """
    prefix, suffix = check_layout(layout, f'the token layout of {name}')
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f'{name} must be one (B, N, C) token tensor, got '
                        f'{type(tokens).__name__}')
    if tokens.ndim != 3:
        raise ValueError(f'{name} must be (B, N, C) tokens, got shape {tuple(tokens.shape)}')
    if prefix + suffix >= tokens.shape[1]:
        raise ValueError(f'{name} has {tokens.shape[1]} tokens, not more than its '
                         f'{prefix} prefix + {suffix} suffix special tokens')
    return tokens[:, prefix:tokens.shape[1] - suffix]


def check_same_shape(student: torch.Tensor, teacher: torch.Tensor, what: str,
                     hint: Optional[str] = None) -> None:
    """Raises ``ValueError`` naming both shapes when they differ."""
    if student.shape != teacher.shape:
        msg = (f'{what}: student shape {tuple(student.shape)} does not match teacher shape '
               f'{tuple(teacher.shape)}')
        if hint:
            msg += f'; {hint}'
        raise ValueError(msg)


def reduce_over_records(values: Sequence[torch.Tensor], reduction: str) -> torch.Tensor:
    """Mean or sum of per-block / per-stage scalar losses."""
    stacked = torch.stack(list(values))
    if reduction == 'mean':
        return stacked.mean()
    if reduction == 'sum':
        return stacked.sum()
    raise ValueError(f"Unknown reduction {reduction!r}; use 'mean' or 'sum'")
