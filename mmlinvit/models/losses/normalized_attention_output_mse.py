"""Registers the torch-only ``NormalizedAttentionOutputMSELoss`` as
``mmlinvit.NormalizedAttentionOutputMSELoss``."""
from mmlinvit.distill.losses.normalized_attention_output_mse import \
    NormalizedAttentionOutputMSELoss
from mmlinvit.registry import MODELS

MODELS.register_module(module=NormalizedAttentionOutputMSELoss)

__all__ = ['NormalizedAttentionOutputMSELoss']
