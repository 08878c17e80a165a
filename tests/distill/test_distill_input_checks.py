"""Distillation input checks: teacher_input_norm's std count, OpenAI CLIP statistics compared
whole (mean and std, at their tolerance, and only for CLIP-family teachers), and the student
preprocessing checks (type, every key, the augments of a student with its own preprocessor)."""

import pytest
import torch
import torch.nn as nn

from mmlinvit.models.distill import DistillationConfigError
from mmlinvit.models.distill.clip_input_stats import (is_openai_clip_stats,
                                                      warn_clip_stats_for_other_teacher)
from mmlinvit.models.distill.student_preprocessing import check_student_preprocessing
from mmlinvit.models.distill.teacher_input_norm import TeacherInputNorm

IMAGENET_MEAN = [123.675, 116.28, 103.53]
IMAGENET_STD = [58.395, 57.12, 57.375]
CLIP_MEAN = [0.48145466 * 255, 0.4578275 * 255, 0.40821073 * 255]
CLIP_STD = [0.26862954 * 255, 0.26130258 * 255, 0.27577711 * 255]


class Pre(nn.Module):
    """A normalising data preprocessor (mean / std buffers, as mmengine's)."""

    def __init__(self, mean, std):
        super().__init__()
        self._enable_normalize = True
        self.register_buffer('mean', torch.tensor(mean).view(-1, 1, 1))
        self.register_buffer('std', torch.tensor(std).view(-1, 1, 1))


def test_a_single_std_value_for_three_channels_is_refused():
    with pytest.raises(DistillationConfigError, match='1 std'):
        TeacherInputNorm(CLIP_MEAN, [68.5], Pre(IMAGENET_MEAN, IMAGENET_STD))


def test_a_negative_std_in_one_channel_is_refused():
    with pytest.raises(DistillationConfigError, match='positive'):
        TeacherInputNorm(CLIP_MEAN, [68.5, -66.6, 70.3], Pre(IMAGENET_MEAN, IMAGENET_STD))


def test_statistics_in_0_1_units_are_refused_against_a_0_255_preprocessor():
    # a pixel std in 0-1 units above 0.1 (every real one) is still 0-1 units
    with pytest.raises(DistillationConfigError, match='different units'):
        TeacherInputNorm([0.48, 0.46, 0.41], [0.27, 0.26, 0.28],
                         Pre(IMAGENET_MEAN, IMAGENET_STD))
    with pytest.raises(DistillationConfigError, match='different units'):
        TeacherInputNorm(CLIP_MEAN, CLIP_STD, Pre([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]))


def test_unknown_teacher_input_norm_keys_are_refused():
    with pytest.raises(DistillationConfigError, match="'mean' and 'std'"):
        TeacherInputNorm.from_config(dict(mean=CLIP_MEAN, std=CLIP_STD, to_rgb=False),
                                     Pre(IMAGENET_MEAN, IMAGENET_STD))


def test_clip_statistics_need_clip_mean_and_clip_std():
    assert is_openai_clip_stats(CLIP_MEAN, CLIP_STD)
    assert is_openai_clip_stats([v / 255 for v in CLIP_MEAN], [v / 255 for v in CLIP_STD])
    assert not is_openai_clip_stats(CLIP_MEAN, IMAGENET_STD)
    assert not is_openai_clip_stats(IMAGENET_MEAN, IMAGENET_STD)
    # ImageNet mean (within 0.7 % of CLIP's) with CLIP's std is not CLIP's preprocessing
    assert not is_openai_clip_stats(IMAGENET_MEAN, CLIP_STD)



def test_clip_statistics_for_a_backbone_without_family_warn(warnings_logged):
    # e.g. an mmpretrain VisionTransformer teacher: no ``family`` attribute
    assert warn_clip_stats_for_other_teacher(CLIP_MEAN, CLIP_STD, nn.Linear(2, 2)) is True
    assert any('CLIP' in m for m in warnings_logged)
    clip = nn.Linear(2, 2)
    clip.family = 'clip'
    assert warn_clip_stats_for_other_teacher(CLIP_MEAN, CLIP_STD, clip) is False


MODEL_PRE = dict(type='ClsDataPreprocessor', mean=IMAGENET_MEAN, std=IMAGENET_STD, to_rgb=True)


def test_student_train_cfg_augments_beside_its_own_preprocessor_are_refused():
    student = dict(type='ImageClassifier', data_preprocessor=dict(MODEL_PRE),
                   train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8)]))
    with pytest.raises(DistillationConfigError, match='train_cfg'):
        check_student_preprocessing(student, dict(MODEL_PRE))


def test_a_student_preprocessor_of_another_type_is_refused():
    student = dict(type='EncoderDecoder',
                   data_preprocessor=dict(MODEL_PRE, type='mmseg.SegDataPreProcessor'))
    with pytest.raises(DistillationConfigError, match='type: SegDataPreProcessor'):
        check_student_preprocessing(student, dict(MODEL_PRE))
    # the scope alone does not count
    check_student_preprocessing(
        dict(data_preprocessor=dict(MODEL_PRE, type='mmpretrain.ClsDataPreprocessor')),
        dict(MODEL_PRE))


def test_a_setting_only_the_model_preprocessor_has_is_a_difference():
    # the student's preprocessor leaves to_rgb at its default; the model's sets it
    student = dict(data_preprocessor=dict(type='ClsDataPreprocessor', mean=IMAGENET_MEAN,
                                          std=IMAGENET_STD))
    with pytest.raises(DistillationConfigError, match='to_rgb'):
        check_student_preprocessing(student, dict(MODEL_PRE))


def test_caffe_style_preprocessing_is_in_0_255_units():
    """A 0-255 preprocessor that only subtracts the mean (std 1, caffe style) was read as 0-1
    units by its std alone and refused next to 0-255 teacher statistics; its mean tells."""
    caffe = Pre([103.53, 116.28, 123.675], [1.0, 1.0, 1.0])
    norm = TeacherInputNorm(CLIP_MEAN, CLIP_STD, caffe)
    assert norm.stats['std'] == pytest.approx(CLIP_STD)
    with pytest.raises(DistillationConfigError, match='different units'):
        TeacherInputNorm([0.48, 0.46, 0.41], [0.27, 0.26, 0.28], caffe)
    # mean 0 / std 1 does not normalise at all: either units are accepted
    for mean, std in [(CLIP_MEAN, CLIP_STD), ([0.48, 0.46, 0.41], [0.27, 0.26, 0.28])]:
        TeacherInputNorm(mean, std, Pre([0.0, 0.0, 0.0], [1.0, 1.0, 1.0]))
