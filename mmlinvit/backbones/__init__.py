"""Backbones in plain PyTorch; registered with OpenMMLab in :mod:`mmlinvit.models`."""
from .adventurer import ADVENTURER_SIZES, Adventurer
from .arch_zoo import FAMILY_SIZES, VIT_FAMILIES, VIT_SIZES
from .vit import LinearVisionTransformer, VisionTransformer

__all__ = [
    'VisionTransformer', 'LinearVisionTransformer', 'Adventurer', 'VIT_SIZES', 'VIT_FAMILIES',
    'FAMILY_SIZES', 'ADVENTURER_SIZES'
]
