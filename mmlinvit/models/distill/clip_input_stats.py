"""OpenAI CLIP's input statistics, and the warnings when a teacher gets the wrong ones.

The ViT-Linearizer configs give their CLIP teacher ``teacher_input_norm`` = CLIP's own
``Normalize`` statistics.  A user who swaps the teacher (``--cfg-options
model.teacher.family=deit3``) and keeps them would feed a teacher trained on ImageNet
statistics CLIP-normalised images without a word; :func:`warn_clip_stats_for_other_teacher`
says so at build time, naming ``model.teacher_input_norm=None``.  The reverse swap (a CLIP
teacher, ``family='clip'``, put into a config without ``teacher_input_norm``, whose data
preprocessor normalises with ImageNet statistics) is warned by
:func:`warn_clip_teacher_without_clip_stats`, naming the ``model.teacher_input_norm=dict(...)``
that gives it CLIP's.
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


#: ``teacher_input_norm`` with OpenAI CLIP's statistics in the 0-255 units of the mmpretrain /
#: mmseg data preprocessors, as ``--cfg-options`` arguments (the fix the warning below names;
#: for a config without a ``teacher_input_norm`` entry, e.g. the Copy-MLP ones).
CLIP_TEACHER_INPUT_NORM_OPTION = (
    'model.teacher_input_norm.mean=[122.77093830,116.74601250,104.09373615] '
    'model.teacher_input_norm.std=[68.50053270,66.63215790,70.32316305]')


def _preprocessor_stats(data_preprocessor: Optional[nn.Module]):
    """(mean, std) the data preprocessor normalises with, or ``None`` when it does not."""
    mean = getattr(data_preprocessor, 'mean', None)
    std = getattr(data_preprocessor, 'std', None)
    enabled = getattr(data_preprocessor, '_enable_normalize', mean is not None)
    if not (enabled and isinstance(mean, torch.Tensor) and isinstance(std, torch.Tensor)):
        return None
    return mean.detach().flatten().tolist(), std.detach().flatten().tolist()


def warn_clip_teacher_without_clip_stats(teacher_backbone: Optional[nn.Module],
                                         teacher_stats: Optional[dict],
                                         data_preprocessor: Optional[nn.Module]) -> bool:
    """Warns when a CLIP teacher (``family == 'clip'``) would see other input statistics than
    OpenAI CLIP's.

    The teacher sees ``teacher_stats`` (``teacher_input_norm``'s mean / std) when given, else
    the data preprocessor's statistics.  When neither is known (a preprocessor that does not
    normalise and no ``teacher_input_norm``) nothing is said.

    Args:
        teacher_backbone: The teacher's backbone.
        teacher_stats: ``dict(mean=..., std=...)`` of ``teacher_input_norm``, or ``None``.
        data_preprocessor: The distillation model's data preprocessor.

    Returns:
        Whether it warned.
    """
    if teacher_backbone is None or getattr(teacher_backbone, 'family', None) != 'clip':
        return False
    if teacher_stats is not None:
        mean, std = teacher_stats['mean'], teacher_stats['std']
        where = 'teacher_input_norm'
    else:
        stats = _preprocessor_stats(data_preprocessor)
        if stats is None:
            return False
        mean, std = stats
        where = ('the data preprocessor (there is no teacher_input_norm, so the teacher sees '
                 'the student\'s batch)')
    if is_openai_clip_stats(mean, std):
        return False
    shown = ', '.join(f'{name} {[round(float(v), 4) for v in values]}'
                      for name, values in (('mean', mean), ('std', std)))
    print_log(
        f'The teacher {type(teacher_backbone).__name__} has family=\'clip\', but its input '
        f'statistics come from {where}: {shown}, not OpenAI CLIP\'s (mean '
        f'{list(OPENAI_CLIP_MEAN)}, std {list(OPENAI_CLIP_STD)} for 0-1 pixels): it would see '
        f'images normalised otherwise than it was trained with. Give it CLIP\'s statistics in '
        f'the data preprocessor\'s units (0-255 for the mmpretrain / mmseg preprocessors), '
        f'i.e. model.teacher_input_norm=dict(mean=[0.48145466 * 255, 0.4578275 * 255, '
        f'0.40821073 * 255], std=[0.26862954 * 255, 0.26130258 * 255, 0.27577711 * 255]) in '
        f'the config (as the ViT-Linearizer configs do), or --cfg-options '
        f'{CLIP_TEACHER_INPUT_NORM_OPTION}; a CLIP-family teacher trained with other '
        f'statistics takes its own model.teacher_input_norm=dict(mean=[...], std=[...]).',
        logger='current', level=logging.WARNING)
    return True
