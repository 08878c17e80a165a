"""Procedural data generators and dataset checks (no registered classes)."""
from .synthetic_scenes import (SCENE_CLASSES, SCENE_PALETTE, draw_scene, make_ade20k_layout,
                               make_cityscapes_layout)

__all__ = [
    'SCENE_CLASSES', 'SCENE_PALETTE', 'draw_scene', 'make_ade20k_layout', 'make_cityscapes_layout'
]
