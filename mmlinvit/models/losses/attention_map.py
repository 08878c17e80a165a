"""Registers :class:`mmlinvit.distill.losses.AttentionMapLoss` (torch only) in the registry."""
from mmlinvit.distill.losses.attention_map import MAP_MODES, AttentionMapLoss
from mmlinvit.registry import MODELS

MODELS.register_module(module=AttentionMapLoss)

__all__ = ['AttentionMapLoss', 'MAP_MODES']
