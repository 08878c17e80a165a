"""OpenAI CLIP's input statistics, and the warning when they reach a teacher that is not CLIP.

The ViT-Linearizer configs give their CLIP teacher ``teacher_input_norm`` = CLIP's own
``Normalize`` statistics.  A user who swaps the teacher (``--cfg-options
model.teacher.family=deit3``) and keeps them would feed a teacher trained on ImageNet
statistics CLIP-normalised images without a word; :func:`warn_clip_stats_for_other_teacher`
says so at build time, naming ``model.teacher_input_norm=None``.
"""
import logging
from typing import Optional, Sequence

import torch
import torch.nn as nn
from mmengine.logging import print_log

#: ``Normalize`` mean of OpenAI CLIP's preprocessing (openai/CLIP ``clip/clip.py``
#: ``_transform``), for 0-1 pixels.
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
#: ``Normalize`` std of OpenAI CLIP's preprocessing, for 0-1 pixels.
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def is_openai_clip_stats(mean: Sequence[float], std: Sequence[float]) -> bool:
    """Whether ``mean`` / ``std`` are OpenAI CLIP's, in 0-1 or 0-255 units (to fp32 precision).

    Args:
        mean: Per-channel mean.
        std: Per-channel std.
    """
    mean_t = torch.as_tensor(mean, dtype=torch.float64).flatten()
    std_t = torch.as_tensor(std, dtype=torch.float64).flatten()
    if mean_t.numel() != len(OPENAI_CLIP_MEAN) or std_t.numel() != len(OPENAI_CLIP_STD):
        return False
    scale = 255.0 if float(std_t.max()) > 1.0 else 1.0
    ref_mean = torch.tensor(OPENAI_CLIP_MEAN, dtype=torch.float64) * scale
    ref_std = torch.tensor(OPENAI_CLIP_STD, dtype=torch.float64) * scale
    return bool(torch.allclose(mean_t, ref_mean, rtol=1e-6, atol=0)
                and torch.allclose(std_t, ref_std, rtol=1e-6, atol=0))


def warn_clip_stats_for_other_teacher(mean: Sequence[float], std: Sequence[float],
                                      teacher_backbone: Optional[nn.Module]) -> bool:
    """Warns when ``teacher_input_norm`` holds CLIP's statistics and the teacher is no CLIP ViT.

    A teacher counts as CLIP when its backbone has ``family == 'clip'`` (mmlinvit's
    ``VisionTransformer``); any other family, or a backbone without one, gets the warning
    (logged at WARNING through mmengine's current logger).

    Args:
        mean: ``teacher_input_norm.mean``.
        std: ``teacher_input_norm.std``.
        teacher_backbone: The teacher's backbone.

    Returns:
        Whether it warned.
    """
    if teacher_backbone is None or not is_openai_clip_stats(mean, std):
        return False
    family = getattr(teacher_backbone, 'family', None)
    if family == 'clip':
        return False
    print_log(
        f"teacher_input_norm holds OpenAI CLIP's input statistics (mean "
        f'{list(OPENAI_CLIP_MEAN)}, std {list(OPENAI_CLIP_STD)} x 255), but the teacher '
        f'{type(teacher_backbone).__name__} has family={family!r}, not \'clip\': it would see '
        f'CLIP-normalised images instead of the statistics it was trained with. For a teacher '
        f'trained on the data preprocessor\'s statistics (DeiT, DeiT-III, MAE, DINOv2, ...) '
        f'set --cfg-options model.teacher_input_norm=None; otherwise give its own '
        f'model.teacher_input_norm=dict(mean=[...], std=[...]).',
        logger='current', level=logging.WARNING)
    return True
