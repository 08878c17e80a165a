"""Distillation losses as plain ``torch.nn.Module`` s (torch only).

The OpenMMLab integration layer registers these same classes in the ``mmlinvit`` MODELS
registry (:mod:`mmlinvit.models.register`), so ``type='mmlinvit.AttentionOutputMSELoss'`` in a
config and ``from mmlinvit.distill.losses import AttentionOutputMSELoss`` name one class.
"""
from .activation_matching import ActivationMatchingLoss, cosine_similarity_map
from .attention_map import AttentionMapLoss
from .attention_output_mse import AttentionOutputMSELoss
from .base import DistillLossBase
from .feature_mse import FeatureMSELoss
from .masked_prediction import MaskedPredictionLoss
from .normalized_attention_output_mse import NormalizedAttentionOutputMSELoss, normalized_mse
from .token_mse import token_records_mse
from .token_utils import patch_tokens

__all__ = [
    'ActivationMatchingLoss', 'AttentionMapLoss', 'AttentionOutputMSELoss', 'FeatureMSELoss',
    'MaskedPredictionLoss', 'NormalizedAttentionOutputMSELoss', 'normalized_mse',
    'cosine_similarity_map', 'token_records_mse', 'patch_tokens', 'DistillLossBase'
]
