"""Registers the torch-only ``AttentionOutputMSELoss`` as ``mmlinvit.AttentionOutputMSELoss``."""
from mmlinvit.distill.losses.attention_output_mse import AttentionOutputMSELoss
from mmlinvit.registry import MODELS

MODELS.register_module(module=AttentionOutputMSELoss)

__all__ = ['AttentionOutputMSELoss']
