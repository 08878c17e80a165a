"""Distillation losses (registered in the ``mmlinvit`` MODELS registry)."""
from .activation_matching import ActivationMatchingLoss, cosine_similarity_map
from .attention_map import AttentionMapLoss
from .attention_output_mse import AttentionOutputMSELoss
from .feature_mse import FeatureMSELoss
from .masked_prediction import MaskedPredictionLoss

__all__ = [
    'ActivationMatchingLoss', 'AttentionMapLoss', 'AttentionOutputMSELoss', 'FeatureMSELoss',
    'MaskedPredictionLoss', 'cosine_similarity_map'
]
