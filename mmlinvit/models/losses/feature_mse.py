"""Registers :class:`mmlinvit.distill.losses.FeatureMSELoss` (torch only) in the registry."""
from mmlinvit.distill.losses.feature_mse import FeatureMSELoss
from mmlinvit.registry import MODELS

MODELS.register_module(module=FeatureMSELoss)

__all__ = ['FeatureMSELoss']
