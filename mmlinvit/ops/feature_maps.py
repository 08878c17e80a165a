"""Positive feature maps phi(x) for kernel linear attention (functional, torch only)."""
from typing import Callable, Dict

import torch
import torch.nn.functional as F

from .precision import autocast_disabled


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = ELU(x) + 1 (ViT-AdaLA, Katharopoulos et al.). Always > 0."""
    return F.elu(x) + 1.0


def relu_feature(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = ReLU(x).  Can be exactly zero: the normaliser's eps protects the division."""
    return F.relu(x)


def identity_feature(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = x (used by InLine, and for maps computed outside the kernel, e.g. Hedgehog)."""
    return x


FEATURE_MAPS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    'elu': elu_plus_one,
    'relu': relu_feature,
    'identity': identity_feature,
}


def get_feature_map(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Returns the feature map registered as ``name`` (``elu``, ``relu`` or ``identity``).

    Raises:
        ValueError: listing the registered names.
    """
    if name not in FEATURE_MAPS:
        raise ValueError(f'Unknown feature map {name!r}; available: {sorted(FEATURE_MAPS)}')
    return FEATURE_MAPS[name]


def hedgehog_feature(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Hedgehog's learnable map phi(x) = [softmax(x W), softmax(-x W)] in fp32.

    Args:
        x: Per-head tokens (B, H, N, d).
        weight: Per-head projections W (H, d, F); broadcast over B.

    Returns:
        (B, H, N, 2F) positive features; each row sums to 2.
    """
    with autocast_disabled(x.device):  # fp32 logits under AMP too (autocast would round them)
        logits = torch.matmul(x.float(), weight.float())
        return torch.cat([logits.softmax(-1), (-logits).softmax(-1)], dim=-1)
