"""Sign-preserving normaliser for linear attention with signed scores (torch only)."""
import torch


def signed_safe_denominator(den: torch.Tensor, eps: float) -> torch.Tensor:
    """``den + eps * sign(den)`` with ``sign(0) = +1``.

    Equals ``den + eps`` for ``den >= 0`` and never has magnitude below ``eps``, whatever the
    sign of ``den``, so a division by it is always finite.

    Args:
        den: Normaliser values.
        eps: Minimum magnitude.

    Returns:
        Tensor of the shape and dtype of ``den``.
    """
    return torch.where(den >= 0, den + eps, den - eps)
