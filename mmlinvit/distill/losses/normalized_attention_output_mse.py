"""Per-block attention-output MSE normalised by the teacher's mean square (scale-free lambda).

Seed 000 ("Copy the Same, Distill the Difference") adds ``50 * mean_i MSE(s_i, t_i)`` to the
task loss for every model and data set.  The size of that MSE is set by the teacher's
attention-output scale, which differs between models (a 4-block ViT trained on scikit-learn
digits has ``mean(t_i^2)`` of 0.001-0.0075, DeiT-B blocks are far larger), so one raw lambda
weighs distillation very differently from one teacher to the next.  This loss divides each
block's MSE by that block's teacher mean square::

    L = loss_weight * reduce_i [ mean((s_i - t_i)^2) / (mean(t_i^2).detach() + eps) ]

i.e. a per-block relative squared error (0 = exact match, 1 = as far off as predicting zeros).
It is invariant to a common rescaling of student and teacher outputs, so one ``loss_weight``
means the same thing for every teacher.  The denominator is computed from the teacher record
(after the same token selection as the numerator), in float32, and never receives gradients.
"""
import torch

from .attention_output_mse import AttentionOutputMSELoss


def normalized_mse(student: torch.Tensor, teacher: torch.Tensor, eps: float) -> torch.Tensor:
    """``mean((s - t)^2) / (mean(t^2) + eps)`` in float32, the denominator detached.

    Args:
        student: Student record.
        teacher: Teacher record of the same shape.
        eps: Added to the teacher mean square (guards all-zero teacher records).
    """
    s, t = student.float(), teacher.detach().float()
    return (s - t).pow(2).mean() / (t.pow(2).mean() + eps)


class NormalizedAttentionOutputMSELoss(AttentionOutputMSELoss):
    """Attention-output MSE per block divided by the teacher's mean square, then reduced.

    The denominator is the teacher mean square of each process's batch: under DDP the term
    (and its gradient) is not that of the global batch.

    Same records, token handling, block reduction and ``forward`` as
    :class:`~mmlinvit.distill.losses.AttentionOutputMSELoss`; only each block's MSE is divided
    by ``mean(t_i^2) + eps`` (teacher, detached).  With ``loss_weight = 1`` a student that
    outputs zeros in every block costs 1, like a cross-entropy of one nat.  The README section
    "Choosing lambda and which layers to linearize" compares it with the raw loss
    (``tools/analysis/sweep_distill_weight.py``).

    Args:
        loss_weight: Weight lambda of the normalised term (scale-free).
        patch_tokens_only: Compare patch tokens only (see ``AttentionOutputMSELoss``).
        block_reduction: ``'mean'`` or ``'sum'`` over blocks.
        eps: Added to each teacher mean square before dividing.  Keep it far below the
            teacher's mean square (1e-8 by default; the smallest we met is ~1e-3).
    """

    def __init__(self, loss_weight: float = 1.0, patch_tokens_only: bool = False,
                 block_reduction: str = 'mean', eps: float = 1e-8) -> None:
        super().__init__(loss_weight, patch_tokens_only, block_reduction)
        if not eps > 0:
            raise ValueError(f'eps must be positive (it guards all-zero teacher records), got '
                             f'{eps}')
        self.eps = eps

    def pair_loss(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """:func:`normalized_mse` of one block's record pair."""
        return normalized_mse(student, teacher, self.eps)
