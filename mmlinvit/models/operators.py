"""Mirrors the torch-only attention-operator registry into the ``mmlinvit`` MODELS registry.

Operators are registered by class name (``type='mmlinvit.KernelLinearAttention'``); inside a
backbone's ``attn_cfg`` they are chosen by their short operator names (``'elu'``, ``'mhla'``...).
"""
from mmlinvit.layers.attention import ATTENTION_OPERATORS
from mmlinvit.registry import MODELS


def register_attention_operators() -> None:
    """Registers every operator class once."""
    for _, cls in ATTENTION_OPERATORS.items():
        if cls.__name__ not in MODELS.module_dict:
            MODELS.register_module(name=cls.__name__, module=cls)
