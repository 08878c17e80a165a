"""Mutation round 12: the pixels the frozen teacher sees and the distillation-weight schedule.

Oracles: timm's ``OPENAI_CLIP_*`` / ``IMAGENET_DEFAULT_*`` constants (the values of openai/CLIP's
``_transform`` and torchvision's ImageNet ``Normalize``), mmpretrain's ``ClsDataPreprocessor``
for the student batch, and the hand-computed renormalisation
``x_teacher = ((x_student * std_s + mean_s) - mean_t) / std_t`` == ``(raw / 255 - mean_t01) /
std_t01``.
"""
import re
from types import SimpleNamespace
from typing import List, Sequence

import pytest
import torch
import torch.nn as nn
from mmengine.config import ConfigDict
from mmengine.logging import MessageHub
from timm.data import (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, OPENAI_CLIP_MEAN,
                       OPENAI_CLIP_STD)

from mmlinvit.engine.hooks import DistillLossScheduleHook
from mmlinvit.models.distill import DistillationConfigError
from mmlinvit.models.distill import clip_input_stats as cis
from mmlinvit.models.distill.student_preprocessing import (check_student_preprocessing,
                                                           refuse_student_settings)
from mmlinvit.models.distill.teacher_input_norm import (TeacherInputNorm, _pixel_units,
                                                        student_input_stats)

CLIP_MEAN_255 = [v * 255 for v in OPENAI_CLIP_MEAN]
CLIP_STD_255 = [v * 255 for v in OPENAI_CLIP_STD]
IMAGENET_MEAN_255 = [v * 255 for v in IMAGENET_DEFAULT_MEAN]
IMAGENET_STD_255 = [v * 255 for v in IMAGENET_DEFAULT_STD]


class NormalisingPreprocessor(nn.Module):
    """A data preprocessor stand-in with mmengine's ``mean`` / ``std`` buffers.

    Args:
        mean: Per-channel mean.
        std: Per-channel std.
        enabled: Value of ``_enable_normalize``.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], enabled: bool = True) -> None:
        super().__init__()
        self._enable_normalize = enabled
        self.register_buffer('mean', torch.tensor(mean).view(-1, 1, 1))
        self.register_buffer('std', torch.tensor(std).view(-1, 1, 1))


def _imagenet_cls_preprocessor() -> nn.Module:
    """mmpretrain's ClsDataPreprocessor with the ImageNet statistics (0-255 units)."""
    from mmpretrain.models import ClsDataPreprocessor
    return ClsDataPreprocessor(mean=IMAGENET_MEAN_255, std=IMAGENET_STD_255)


# --------------------------------------------------------------------- clip_input_stats


def test_clip_constants_are_openai_clips_and_the_option_is_them_times_255():
    assert cis.OPENAI_CLIP_MEAN == tuple(OPENAI_CLIP_MEAN)
    assert cis.OPENAI_CLIP_STD == tuple(OPENAI_CLIP_STD)
    option = dict(re.findall(r'model\.teacher_input_norm\.(mean|std)=\[([^\]]*)\]',
                             cis.CLIP_TEACHER_INPUT_NORM_OPTION))
    for key, ref in (('mean', CLIP_MEAN_255), ('std', CLIP_STD_255)):
        values = [float(v) for v in option[key].split(',')]
        assert values == pytest.approx(ref, rel=1e-8)
        assert cis.is_openai_clip_stats(*((values, CLIP_STD_255) if key == 'mean'
                                          else (CLIP_MEAN_255, values)))


@pytest.mark.parametrize('mean, std', [
    (OPENAI_CLIP_MEAN, OPENAI_CLIP_STD),
    (CLIP_MEAN_255, CLIP_STD_255),
    (torch.tensor(CLIP_MEAN_255).view(3, 1, 1), torch.tensor(CLIP_STD_255).view(1, 3, 1, 1)),
    (torch.tensor(CLIP_MEAN_255, dtype=torch.float32), torch.tensor(CLIP_STD_255,
                                                                    dtype=torch.float32)),
])
def test_clip_statistics_are_recognised_in_either_unit_and_shape(mean, std):
    assert cis.is_openai_clip_stats(mean, std)


@pytest.mark.parametrize('mean, std', [
    (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
    (IMAGENET_MEAN_255, IMAGENET_STD_255),
    (CLIP_MEAN_255[::-1], CLIP_STD_255[::-1]),  # BGR order
    (CLIP_MEAN_255, CLIP_STD_255[:2] + [CLIP_STD_255[2] * (1 + 1e-4)]),
    ([CLIP_MEAN_255[0] * (1 + 1e-4)] + CLIP_MEAN_255[1:], CLIP_STD_255),
    (OPENAI_CLIP_MEAN, CLIP_STD_255),  # mixed units
    (CLIP_MEAN_255 + [0.0], CLIP_STD_255 + [1.0]),
    (CLIP_MEAN_255, CLIP_STD_255 + [1.0]),
])
def test_other_statistics_are_not_clips(mean, std):
    assert not cis.is_openai_clip_stats(mean, std)


@pytest.mark.parametrize('family, mean, std, warned', [
    ('deit3', CLIP_MEAN_255, CLIP_STD_255, True),
    (None, CLIP_MEAN_255, CLIP_STD_255, True),
    ('clip', CLIP_MEAN_255, CLIP_STD_255, False),
    ('deit3', IMAGENET_MEAN_255, IMAGENET_STD_255, False),
])
def test_clip_statistics_warn_only_for_a_non_clip_teacher(warnings_logged, family, mean, std,
                                                         warned):
    backbone = nn.Identity()
    if family is not None:
        backbone.family = family
    assert cis.warn_clip_stats_for_other_teacher(mean, std, backbone) is warned
    assert bool(warnings_logged) is warned
    if warned:
        assert 'model.teacher_input_norm=None' in warnings_logged[0]
        assert f'family={family!r}' in warnings_logged[0]


def test_no_teacher_backbone_never_warns(warnings_logged):
    assert not cis.warn_clip_stats_for_other_teacher(CLIP_MEAN_255, CLIP_STD_255, None)
    assert not cis.warn_clip_teacher_without_clip_stats(None, None, _imagenet_cls_preprocessor())
    assert warnings_logged == []


def _clip_backbone(family: str = 'clip') -> nn.Module:
    backbone = nn.Identity()
    backbone.family = family
    return backbone


@pytest.mark.parametrize('teacher_stats, pre_stats, warned', [
    # teacher_input_norm decides when given, whatever the preprocessor has
    (dict(mean=CLIP_MEAN_255, std=CLIP_STD_255), (IMAGENET_MEAN_255, IMAGENET_STD_255), False),
    (dict(mean=IMAGENET_MEAN_255, std=IMAGENET_STD_255), (CLIP_MEAN_255, CLIP_STD_255), True),
    # else the preprocessor's statistics are what the teacher sees
    (None, (IMAGENET_MEAN_255, IMAGENET_STD_255), True),
    (None, (CLIP_MEAN_255, CLIP_STD_255), False),
    (None, (list(OPENAI_CLIP_MEAN), list(OPENAI_CLIP_STD)), False),
])
def test_a_clip_teacher_warns_for_the_statistics_it_would_see(warnings_logged, teacher_stats,
                                                             pre_stats, warned):
    pre = NormalisingPreprocessor(*pre_stats)
    assert cis.warn_clip_teacher_without_clip_stats(_clip_backbone(), teacher_stats,
                                                    pre) is warned
    assert bool(warnings_logged) is warned
    if warned:
        message = warnings_logged[0]
        shown_mean = (teacher_stats or dict(mean=pre_stats[0]))['mean']
        assert str([round(v, 4) for v in shown_mean]) in message
        assert cis.CLIP_TEACHER_INPUT_NORM_OPTION in message
        assert ('data preprocessor (there is no teacher_input_norm' in message) is (
            teacher_stats is None)


def test_a_clip_teacher_is_silent_without_known_statistics_and_others_never_warn(
        warnings_logged):
    disabled = NormalisingPreprocessor(IMAGENET_MEAN_255, IMAGENET_STD_255, enabled=False)
    assert not cis.warn_clip_teacher_without_clip_stats(_clip_backbone(), None, disabled)
    assert not cis.warn_clip_teacher_without_clip_stats(_clip_backbone(), None, nn.Identity())
    assert not cis.warn_clip_teacher_without_clip_stats(
        _clip_backbone('deit3'), None, NormalisingPreprocessor(IMAGENET_MEAN_255,
                                                               IMAGENET_STD_255))
    assert warnings_logged == []


# --------------------------------------------------------------------- teacher_input_norm


def test_the_clip_teacher_sees_raw_pixels_normalised_with_clips_statistics():
    """mmpretrain ImageNet preprocessing, then teacher_input_norm, == CLIP's own Normalize."""
    generator = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (2, 3, 8, 8), generator=generator, dtype=torch.uint8)
    pre = _imagenet_cls_preprocessor()
    student_batch = pre(dict(inputs=list(raw)), training=False)['inputs']
    expected_student = (raw.float() / 255 - torch.tensor(IMAGENET_DEFAULT_MEAN).view(
        1, 3, 1, 1)) / torch.tensor(IMAGENET_DEFAULT_STD).view(1, 3, 1, 1)
    torch.testing.assert_close(student_batch, expected_student, rtol=0, atol=1e-5)

    norm = TeacherInputNorm(CLIP_MEAN_255, CLIP_STD_255, pre)
    teacher_batch = norm(student_batch, pre)
    expected = (raw.double() / 255 - torch.tensor(OPENAI_CLIP_MEAN, dtype=torch.float64).view(
        1, 3, 1, 1)) / torch.tensor(OPENAI_CLIP_STD, dtype=torch.float64).view(1, 3, 1, 1)
    assert teacher_batch.dtype == torch.float32
    torch.testing.assert_close(teacher_batch.double(), expected, rtol=0, atol=1e-5)
    assert norm.stats == dict(mean=pytest.approx(CLIP_MEAN_255, rel=1e-6),
                              std=pytest.approx(CLIP_STD_255, rel=1e-6))
    assert norm.state_dict() == {}


def test_the_conversion_is_per_channel_and_keeps_a_half_dtype():
    """Distinct per-channel statistics: a swapped channel or a misplaced term shows."""
    pre = NormalisingPreprocessor([10.0, 100.0, 200.0], [2.0, 20.0, 50.0])
    norm = TeacherInputNorm([30.0, 60.0, 90.0], [5.0, 10.0, 40.0], pre)
    inputs = torch.tensor([1.0, -0.5, 0.25]).view(1, 3, 1, 1).expand(2, 3, 2, 2).contiguous()
    # hand: pixels 12, 90, 212.5 -> (12-30)/5, (90-60)/10, (212.5-90)/40
    expected = torch.tensor([-3.6, 3.0, 3.0625]).view(1, 3, 1, 1).expand(2, 3, 2, 2)
    torch.testing.assert_close(norm(inputs, pre), expected, rtol=0, atol=1e-6)
    half = norm(inputs.half(), pre)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), expected, rtol=0, atol=2e-3)
    # student statistics read at each call, not frozen at build time
    pre.mean.fill_(0.0)
    pre.std.fill_(1.0)
    torch.testing.assert_close(norm(inputs, pre)[0, :, 0, 0],
                               (torch.tensor([1.0, -0.5, 0.25]) -
                                torch.tensor([30.0, 60.0, 90.0])) /
                               torch.tensor([5.0, 10.0, 40.0]))


def test_fp16_inputs_are_converted_in_fp32():
    """An fp16 pixel 3000.25 (spacing 2 there) minus a mean of 3000 loses the 0.25 in half."""
    pre = NormalisingPreprocessor([3000.0], [1.0])
    norm = TeacherInputNorm([3000.0], [1.0 / 1024], pre)
    inputs = torch.full((1, 1, 1, 1), 0.25, dtype=torch.float16)
    assert float(norm(inputs, pre)) == 256.0


def test_student_statistics_are_flat_fp32_and_a_non_normalising_preprocessor_is_named():
    pre = NormalisingPreprocessor([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    pre.mean.data = pre.mean.double()
    mean, std = student_input_stats(pre)
    assert mean.dtype == std.dtype == torch.float32
    assert mean.tolist() == [1.0, 2.0, 3.0] and std.tolist() == [4.0, 5.0, 6.0]
    disabled = NormalisingPreprocessor([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], enabled=False)
    with pytest.raises(DistillationConfigError, match='does not normalise'):
        student_input_stats(disabled)
    with pytest.raises(DistillationConfigError, match='NormalisingPreprocessor'):
        TeacherInputNorm(CLIP_MEAN_255, CLIP_STD_255, disabled)


@pytest.mark.parametrize('mean, std, units', [
    ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], '0-1'),
    (IMAGENET_MEAN_255, IMAGENET_STD_255, '0-255'),
    ([103.53, 116.28, 123.675], [1.0, 1.0, 1.0], '0-255'),  # caffe style
    ([-2.0, 0.0, 0.0], [0.5, 0.5, 0.5], '0-255'),  # |mean| above 1
    ([0.5, 0.5, 0.5], [1.0, 1.0, 1.0], '0-1'),
    ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], None),
    ([0.0, 0.0, 0.0], [1.0, 1.0, 0.5], '0-1'),
    ([0.0, 0.5, 0.0], [1.0, 1.0, 1.0], '0-1'),
])
def test_pixel_units(mean, std, units):
    assert _pixel_units(torch.tensor(mean), torch.tensor(std)) == units


def test_identity_statistics_pair_with_either_unit_and_mismatches_are_refused():
    TeacherInputNorm([0.0, 0.0, 0.0], [1.0, 1.0, 1.0],
                     NormalisingPreprocessor([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]))
    TeacherInputNorm([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], _imagenet_cls_preprocessor())
    TeacherInputNorm(IMAGENET_MEAN_255, IMAGENET_STD_255,
                     NormalisingPreprocessor([0.0] * 3, [1.0] * 3))
    TeacherInputNorm(OPENAI_CLIP_MEAN, OPENAI_CLIP_STD,
                     NormalisingPreprocessor(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD))
    with pytest.raises(DistillationConfigError, match='different units'):
        TeacherInputNorm(CLIP_MEAN_255, CLIP_STD_255,
                         NormalisingPreprocessor(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD))


@pytest.mark.parametrize('mean, std, match', [
    ([0.0] * 3, [1.0, 1.0, 0.0], 'positive'),
    ([0.0] * 4, [1.0] * 4, '4 mean and 4 std values, the data preprocessor normalises 3'),
    ([0.0] * 3, [1.0] * 4, '3 mean and 4 std'),
])
def test_bad_statistics_are_refused(mean, std, match):
    with pytest.raises(DistillationConfigError, match=match):
        TeacherInputNorm(mean, std, _imagenet_cls_preprocessor())


def test_from_config_takes_a_config_dict_and_needs_both_keys():
    pre = _imagenet_cls_preprocessor()
    norm = TeacherInputNorm.from_config(ConfigDict(mean=CLIP_MEAN_255, std=CLIP_STD_255), pre)
    assert norm.stats['std'] == pytest.approx(CLIP_STD_255, rel=1e-6)
    for cfg in (dict(mean=CLIP_MEAN_255), dict(mean=CLIP_MEAN_255, std=CLIP_STD_255, to_rgb=1)):
        with pytest.raises(DistillationConfigError, match="'mean' and 'std'"):
            TeacherInputNorm.from_config(cfg, pre)


# --------------------------------------------------------------------- student_preprocessing


def test_scoped_and_plain_type_names_are_the_same_preprocessor():
    settings = dict(mean=IMAGENET_MEAN_255, std=IMAGENET_STD_255, to_rgb=True)
    student = ConfigDict(type='ImageClassifier',
                         data_preprocessor=dict(type='mmpretrain.ClsDataPreprocessor',
                                                **settings))
    check_student_preprocessing(student, dict(type='ClsDataPreprocessor', **settings))
    check_student_preprocessing(student, dict(settings))  # no type on the model: not compared
    with pytest.raises(DistillationConfigError, match=r'type: ClsDataPreprocessor != '
                                                      r'SegDataPreProcessor'):
        check_student_preprocessing(student, dict(type='mmseg.SegDataPreProcessor', **settings))


def test_a_differing_value_is_named_with_both_sides():
    student = dict(data_preprocessor=dict(mean=IMAGENET_MEAN_255, std=IMAGENET_STD_255))
    model = dict(mean=CLIP_MEAN_255, std=IMAGENET_STD_255)
    with pytest.raises(DistillationConfigError) as error:
        check_student_preprocessing(student, model)
    message = str(error.value)
    assert f'data_preprocessor.mean: {IMAGENET_MEAN_255!r} != {CLIP_MEAN_255!r}' in message
    assert 'data_preprocessor.std' not in message


def test_train_cfg_augments_are_checked_against_the_model_batch_augments():
    augments = dict(augments=[dict(type='Mixup', alpha=0.8)])
    student = dict(type='ImageClassifier', train_cfg=augments)
    check_student_preprocessing(student, dict(mean=[0.0], batch_augments=augments))
    with pytest.raises(DistillationConfigError, match='train_cfg'):
        check_student_preprocessing(student, dict(mean=[0.0]))
    # a student preprocessor with its own batch_augments overrides train_cfg in mmpretrain
    own = dict(mean=[0.0], batch_augments=dict(augments=[dict(type='CutMix', alpha=1.0)]))
    check_student_preprocessing(dict(student, data_preprocessor=own), dict(own))
    # a train_cfg without augments is no preprocessing
    check_student_preprocessing(dict(type='ImageClassifier', train_cfg=dict(x=1)), dict())
    # no model preprocessor: the student's own runs
    check_student_preprocessing(dict(student, data_preprocessor=own), None)


def test_a_module_preprocessor_refuses_any_student_preprocessing():
    with pytest.raises(DistillationConfigError, match=r'\(train_cfg\.augments\).*'
                                                      r'NormalisingPreprocessor'):
        check_student_preprocessing(dict(train_cfg=dict(augments=[])),
                                    NormalisingPreprocessor([0.0], [1.0]))
    check_student_preprocessing(dict(type='ImageClassifier'), NormalisingPreprocessor([0.0],
                                                                                       [1.0]))


def test_student_settings_are_named_with_where_they_go():
    refuse_student_settings({})
    with pytest.raises(DistillationConfigError,
                       match=r"\['decode_head', 'test_cfg'\].*model\.decode_head -> "
                             r'model\.student\.decode_head, model\.test_cfg -> '
                             r'model\.student\.test_cfg'):
        refuse_student_settings(dict(test_cfg=1, decode_head=2))


# --------------------------------------------------------------------- DistillLossScheduleHook


@pytest.mark.parametrize('kwargs, expected', [
    (dict(begin=2, end=6, start_factor=0.0, end_factor=1.0),
     [0.0, 0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]),
    (dict(begin=2, end=6, start_factor=1.0, end_factor=0.2),
     [1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2]),
    (dict(begin=3), [1.0, 1.0, 1.0, 0.0, 0.0]),
    (dict(begin=3, end=3, start_factor=0.5, end_factor=2.0), [0.5, 0.5, 0.5, 2.0, 2.0]),
    (dict(begin=0, end=4, start_factor=2.0, end_factor=0.0), [2.0, 1.5, 1.0, 0.5, 0.0, 0.0]),
])
def test_factor_by_hand(kwargs, expected):
    hook = DistillLossScheduleHook(terms='attn', **kwargs)
    assert [hook.factor(t) for t in range(len(expected))] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize('kwargs', [dict(begin=-1), dict(begin=4, end=3), dict(begin=0,
                                                                                terms=[])])
def test_bad_schedules_are_refused(kwargs):
    with pytest.raises(ValueError):
        DistillLossScheduleHook(**dict(dict(terms='attn'), **kwargs))


class _ScaledModel(nn.Module):
    """Records ``set_distill_scale`` calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: List[tuple] = []

    def set_distill_scale(self, term: str, value: float) -> None:
        self.calls.append((term, value))


def _runner(iteration: int, epoch: int, model: nn.Module) -> SimpleNamespace:
    return SimpleNamespace(model=model, iter=iteration, epoch=epoch, max_iters=100, max_epochs=10,
                           train_loop=object(),
                           message_hub=MessageHub.get_instance('round12_schedule_hook'))


def test_the_hook_sets_every_term_from_the_right_position():
    model = _ScaledModel()
    hook = DistillLossScheduleHook(terms=['attn', 'mask'], begin=10, end=20, start_factor=0.0,
                                   end_factor=1.0)
    runner = _runner(iteration=15, epoch=7, model=model)
    hook.before_train(runner)
    assert model.calls == [('attn', 0.5), ('mask', 0.5)]
    assert runner.message_hub.get_scalar('train/distill.scale_mask').current() == 0.5
    model.calls.clear()
    hook.before_train_epoch(runner)
    assert model.calls == []
    runner.iter = 18
    hook.before_train_iter(runner, batch_idx=0)
    assert model.calls == [('attn', 0.8), ('mask', 0.8)]

    by_epoch = DistillLossScheduleHook(terms='attn', begin=5, end=9, start_factor=1.0,
                                       end_factor=0.0, by_epoch=True)
    model.calls.clear()
    by_epoch.before_train(runner)  # epoch 7 (iteration 18 would give 0.0)
    by_epoch.before_train_iter(runner, batch_idx=0)
    runner.epoch = 8
    by_epoch.before_train_epoch(runner)
    assert model.calls == [('attn', 0.5), ('attn', 0.25)]


def test_a_model_without_distill_scales_is_named():
    hook = DistillLossScheduleHook(terms='attn', begin=0)
    with pytest.raises(TypeError, match='trains a Linear'):
        hook.before_train(_runner(0, 0, nn.Linear(1, 1)))
