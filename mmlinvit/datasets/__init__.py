"""Datasets, transforms and data generators (imported lazily by ``mmlinvit.registry``)."""
from .synthetic_scenes import (SCENE_CLASSES, SCENE_PALETTE, draw_scene, make_ade20k_layout,
                               make_cityscapes_layout)

__all__ = [
    'SCENE_CLASSES', 'SCENE_PALETTE', 'draw_scene', 'make_ade20k_layout', 'make_cityscapes_layout'
]
