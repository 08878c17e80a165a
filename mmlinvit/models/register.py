"""Registers mmlinvit's torch-only classes in the ``mmlinvit`` MODELS registry.

The low layers (``mmlinvit.backbones``, ``mmlinvit.layers.attention``, ``mmlinvit.distill``)
import with torch alone, so their classes cannot carry mmengine decorators.  This module is
the one place that puts them into :data:`mmlinvit.registry.MODELS`, under their class names:
``type='mmlinvit.VisionTransformer'``, ``type='mmlinvit.ELULinearAttention'`` (inside a
backbone's ``attn_cfg`` operators keep their short names, ``'elu'``, ``'mhla'``...),
``type='mmlinvit.AttentionOutputMSELoss'``.  The OpenMMLab classes defined in
:mod:`mmlinvit.models` itself (``DistillationModel``, ``LinearConnector``, ``EncoderDecoder``)
register with the usual ``@MODELS.register_module()`` decorator where they are defined.
"""
from typing import Iterable

from mmlinvit.backbones import Adventurer, LinearVisionTransformer, VisionTransformer
from mmlinvit.distill.losses import (ActivationMatchingLoss, AttentionMapLoss,
                                     AttentionOutputMSELoss, FeatureMSELoss,
                                     MaskedPredictionLoss, NormalizedAttentionOutputMSELoss)
from mmlinvit.layers.attention import ATTENTION_OPERATORS
from mmlinvit.registry import MODELS

#: Backbones, as ``type='mmlinvit.<class name>'``.
BACKBONES = (VisionTransformer, LinearVisionTransformer, Adventurer)
#: Distillation losses (torch-only ``nn.Module`` s of :mod:`mmlinvit.distill.losses`).
LOSSES = (ActivationMatchingLoss, AttentionMapLoss, AttentionOutputMSELoss, FeatureMSELoss,
          MaskedPredictionLoss, NormalizedAttentionOutputMSELoss)


def _register(classes: Iterable[type]) -> None:
    """Registers each class under its name once (safe to call repeatedly)."""
    for cls in classes:
        if MODELS.module_dict.get(cls.__name__) is not cls:
            MODELS.register_module(name=cls.__name__, module=cls)


def register_all() -> None:
    """Registers the backbones, every attention operator and the distillation losses."""
    _register(BACKBONES)
    _register(cls for _, cls in ATTENTION_OPERATORS.items())
    _register(LOSSES)
