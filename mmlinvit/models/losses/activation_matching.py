"""Registers the torch-only ``ActivationMatchingLoss`` as ``mmlinvit.ActivationMatchingLoss``."""
from mmlinvit.distill.losses.activation_matching import (ActivationMatchingLoss,
                                                         cosine_similarity_map)
from mmlinvit.registry import MODELS

MODELS.register_module(module=ActivationMatchingLoss)

__all__ = ['ActivationMatchingLoss', 'cosine_similarity_map']
