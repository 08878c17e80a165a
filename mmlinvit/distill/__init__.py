"""Distillation building blocks that need torch alone: losses, recorders, teacher forcing and
patch masking.

Use them in any PyTorch training loop; nothing here imports OpenMMLab.  The mmengine
integration (:class:`~mmlinvit.models.distill.DistillationModel`, the ``mmlinvit`` registry
entries such as ``type='mmlinvit.AttentionOutputMSELoss'``) lives in :mod:`mmlinvit.models`
and uses these same classes.
"""
from .errors import DistillationConfigError
from .losses import (ActivationMatchingLoss, AttentionMapLoss, AttentionOutputMSELoss,
                     FeatureMSELoss, MaskedPredictionLoss, cosine_similarity_map)
from .patch_masking import PatchMasking, sample_patch_mask
from .recorders import (RECORDERS, AttentionMapsRecorder, ModuleInputsRecorder,
                        ModuleOutputsRecorder, ModuleRecorder, build_recorder)
from .teacher_forcing import TeacherForcing

__all__ = [
    'DistillationConfigError', 'ActivationMatchingLoss', 'AttentionMapLoss',
    'AttentionOutputMSELoss', 'FeatureMSELoss', 'MaskedPredictionLoss', 'cosine_similarity_map',
    'RECORDERS', 'ModuleRecorder', 'ModuleOutputsRecorder', 'ModuleInputsRecorder',
    'AttentionMapsRecorder', 'build_recorder', 'PatchMasking', 'sample_patch_mask',
    'TeacherForcing'
]
