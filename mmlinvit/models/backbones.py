"""Registers mmlinvit's plain-PyTorch backbones in the ``mmlinvit`` MODELS registry."""
from mmlinvit import backbones
from mmlinvit.registry import MODELS

#: Registered backbone names (``type='mmlinvit.<name>'``).
BACKBONE_NAMES = ('VisionTransformer', 'LinearVisionTransformer', 'Adventurer')


def register_backbones() -> None:
    """Registers every backbone of :mod:`mmlinvit.backbones` that exists."""
    for name in BACKBONE_NAMES:
        cls = getattr(backbones, name, None)
        if cls is not None and name not in MODELS.module_dict:
            MODELS.register_module(name=name, module=cls)
