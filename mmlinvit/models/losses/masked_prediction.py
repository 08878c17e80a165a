"""Registers :class:`mmlinvit.distill.losses.MaskedPredictionLoss` (torch only) in the registry."""
from mmlinvit.distill.losses.masked_prediction import MaskedPredictionLoss
from mmlinvit.registry import MODELS

MODELS.register_module(module=MaskedPredictionLoss)

__all__ = ['MaskedPredictionLoss']
