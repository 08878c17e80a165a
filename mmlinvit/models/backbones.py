"""Registers mmlinvit's plain-PyTorch backbones in the ``mmlinvit`` MODELS registry."""
from mmlinvit.backbones import Adventurer, LinearVisionTransformer, VisionTransformer
from mmlinvit.registry import MODELS

#: Backbones available as ``type='mmlinvit.<class name>'``.
BACKBONES = (VisionTransformer, LinearVisionTransformer, Adventurer)


def register_backbones() -> None:
    """Registers every backbone once (safe to call repeatedly)."""
    for cls in BACKBONES:
        if cls.__name__ not in MODELS.module_dict:
            MODELS.register_module(module=cls)
