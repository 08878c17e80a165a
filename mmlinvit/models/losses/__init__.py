"""Distillation losses registered in the ``mmlinvit`` MODELS registry.

The classes are defined, torch only, in :mod:`mmlinvit.distill.losses`; each module here
registers one of them, so config names (``type='mmlinvit.AttentionOutputMSELoss'``) and these
import paths keep working and name the same classes.
"""
from .activation_matching import ActivationMatchingLoss, cosine_similarity_map
from .attention_map import AttentionMapLoss
from .attention_output_mse import AttentionOutputMSELoss
from .feature_mse import FeatureMSELoss
from .masked_prediction import MaskedPredictionLoss
from .normalized_attention_output_mse import NormalizedAttentionOutputMSELoss

__all__ = [
    'ActivationMatchingLoss', 'AttentionMapLoss', 'AttentionOutputMSELoss', 'FeatureMSELoss',
    'MaskedPredictionLoss', 'NormalizedAttentionOutputMSELoss', 'cosine_similarity_map'
]
