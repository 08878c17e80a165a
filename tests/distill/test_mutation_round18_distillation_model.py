"""Mutation round 18: the distillation model, its trainable set and the checkpoint coverage
check, on branches the earlier rounds (8, 11, 13, 14) left open.

Each test fails on a one-line change of ``mmlinvit/models/distill/distillation_model.py``,
``mmlinvit/models/distill/trainable_params.py`` or ``mmlinvit/engine/checkpoint_coverage.py``
that the rest of the suite let through.  Guarded here, each against a hand-written
expectation or the behaviour of mmengine / mmseg / torch run in the test:

* ``checkpoint_coverage``: a model without ``backbone.`` keys is never told that the file is
  "a bare backbone" to load as ``model.backbone.pretrained``;
* ``trainable_params``: a pattern that matches nothing names the student's first eight
  parameter names (in ``named_parameters`` order); a tied parameter follows the name torch
  gives it;
* ``weight_transfer`` refusals: both config paths in a structure error (bare backbones and
  task models), a scoped ``mmengine.Pretrained`` init_cfg (mmengine's own registry resolves it
  to ``Pretrained``), the backbone's own ``pretrained=`` named first, and a ``Pretrained``
  init_cfg inside a custom student backbone;
* segmentor students: the rows the student pads are, for a teacher with its own statistics,
  the student's pad pixel converted by ``(x * std_s + mean_s - mean_t) / std_t``;
  ``out_channels`` is the student's (1 for a sigmoid binary head, as mmseg's
  ``SegTTAModel`` reads it), not ``num_classes``;
* ``set_distill_scale`` of an unknown term: a ``KeyError`` naming it and the terms.

Finding of this round (its test fails on the code before the fix):
mmseg's ``SegTTAModel`` thresholds a one-channel (binary) student with
``module.decode_head.threshold``; ``DistillationModel`` has no ``decode_head``, so
``tools/test.py --tta`` of a binary segmentation student stops with an AttributeError.
"""
import re
from typing import List

import pytest
import torch
import torch.nn as nn
from mmengine.registry import DefaultScope

from mmlinvit.engine.checkpoint_coverage import CheckpointCoverageError, check_checkpoint_covers
from mmlinvit.models.distill import DistillationConfigError, DistillationModel
from mmlinvit.models.distill.trainable_params import freeze_all_but
from mmlinvit.registry import MODELS

from distill_testing import IMG_SIZE, PATCH, tiny_arch
from test_mutation_round11_distill_model import CIFAR, IMAGENET, _mmpretrain_scope  # noqa: F401


# ---------------------------------------------------------------- checkpoint coverage
def test_a_model_without_backbone_keys_gets_no_bare_backbone_hint() -> None:
    """No ``backbone.`` key in the model: "load it as model.backbone.pretrained" would name a
    config path that does not exist; the file is simply not this config's."""
    model = nn.Linear(2, 3)
    with pytest.raises(CheckpointCoverageError) as caught:
        check_checkpoint_covers(model, {'state_dict': {'weight': torch.zeros(3, 2)}}, 'x.pth')
    message = str(caught.value)
    assert message.startswith('x.pth does not hold 1 of the 2 weights'), message
    assert 'Check that CHECKPOINT was written by a run of this config.' in message
    assert 'bare backbone' not in message and 'model.backbone.pretrained' not in message


# ---------------------------------------------------------------- trainable_params
def test_an_unmatched_pattern_names_the_first_eight_parameters() -> None:
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(5)])
    names: List[str] = [f'{i}.{kind}' for i in range(5) for kind in ('weight', 'bias')]
    assert [n for n, _ in model.named_parameters()] == names  # torch's order
    with pytest.raises(DistillationConfigError) as caught:
        freeze_all_but(model, ['blocks.*'])
    assert f"first names: {names[:8]}" in str(caught.value)
    assert re.search(r"'3\.bias'\]$", str(caught.value))
    assert all(p.requires_grad for p in model.parameters())  # nothing frozen on the error


def test_a_tied_parameter_trains_when_its_name_matches() -> None:
    """A module registered under two names holds one parameter; torch names it once (its
    first name), and that name decides, as the typo check saw it."""
    model = nn.Module()
    model.a = nn.Linear(2, 2)
    model.b = model.a  # tied: the same parameters under 'b.*'
    assert [n for n, _ in model.named_parameters()] == ['a.weight', 'a.bias']
    freeze_all_but(model, ['a.*'])
    assert model.a.weight.requires_grad and model.a.bias.requires_grad


# ---------------------------------------------------------------- distillation model
def _vit(attn: str = 'softmax', **kwargs: object) -> dict:
    cfg = dict(type='mmlinvit.VisionTransformer', arch=tiny_arch(), patch_size=PATCH,
               img_size=IMG_SIZE, attn_cfg=attn, out_type='raw')
    cfg.update(kwargs)
    return cfg


def _classifier(attn: str, **kwargs: object) -> dict:
    cfg = dict(type='ImageClassifier', backbone=_vit(attn, out_type='cls_token'),
               head=dict(type='LinearClsHead', num_classes=3, in_channels=16))
    cfg.update(kwargs)
    return cfg


def _transfer_cfg(student: dict, teacher: dict, **kwargs: object) -> dict:
    cfg = dict(type='mmlinvit.DistillationModel', student=student, teacher=teacher,
               weight_transfer=dict(type='mlp_copy'))
    cfg.update(kwargs)
    return cfg


def test_transfer_structure_errors_name_both_config_paths() -> None:
    """The copied MLP of a DeiT-III teacher (LayerScale) into a DeiT student: the message
    names where each backbone sits in the config, for bare backbones and task models."""
    with pytest.raises(DistillationConfigError,
                       match=r'\(config: the student backbone is model\.student, the teacher '
                             r'backbone model\.teacher; strategy options go in '
                             r'model\.weight_transfer\)'):
        MODELS.build(_transfer_cfg(_vit('elu'), _vit(family='deit3')))
    teacher = _classifier('softmax')
    teacher['backbone']['family'] = 'deit3'
    with pytest.raises(DistillationConfigError,
                       match=r'\(config: the student backbone is model\.student\.backbone, the '
                             r'teacher backbone model\.teacher\.backbone; '):
        MODELS.build(_transfer_cfg(_classifier('elu'), teacher))


def test_a_scoped_pretrained_init_cfg_of_the_student_is_refused_with_a_transfer() -> None:
    """mmengine builds ``init_cfg=dict(type='mmengine.Pretrained')`` as its ``Pretrained``
    (a scoped name): it loads the student in ``init_weights()`` like the plain name."""
    from mmengine.registry import WEIGHT_INITIALIZERS
    assert (WEIGHT_INITIALIZERS.get('mmengine.Pretrained')
            is WEIGHT_INITIALIZERS.get('Pretrained'))
    student = _classifier('elu', init_cfg=dict(type='mmengine.Pretrained',
                                               checkpoint='student.pth'))
    with pytest.raises(DistillationConfigError,
                       match=r"^model\.student\.init_cfg \(Pretrained\)='student\.pth' loads the "
                             r"student's weights, and weight_transfer \(strategy 'mlp_copy'\)"):
        MODELS.build(_transfer_cfg(student, _classifier('softmax')))


def test_the_backbones_own_pretrained_is_named_before_a_model_init_cfg() -> None:
    student = _classifier('elu', init_cfg=dict(type='Pretrained', checkpoint='model.pth'))
    student['backbone']['pretrained'] = 'backbone.pth'
    with pytest.raises(DistillationConfigError,
                       match=r"^model\.student\.backbone\.pretrained='backbone\.pth' loads"):
        MODELS.build(_transfer_cfg(student, _classifier('softmax')))


class _StudentWithPretrainedStem(nn.Module):
    """A custom student whose sub-module loads a file in ``init_weights()`` (mmengine
    ``BaseModule`` with a ``Pretrained`` init_cfg)."""

    def __init__(self) -> None:
        from mmengine.model import BaseModule
        super().__init__()
        self.stem = BaseModule(init_cfg=dict(type='Pretrained', checkpoint='stem.pth'))
        self.stem.proj = nn.Linear(2, 2)


def test_a_pretrained_init_cfg_inside_the_student_backbone_is_refused_with_a_transfer(
        ) -> None:
    """mmengine's ``init_weights()`` runs every sub-module's ``Pretrained`` init_cfg before
    the transfer writes the backbone: one inside the backbone is refused too."""
    name = '_Round18StudentWithPretrainedStem'
    MODELS.register_module(name=name, module=_StudentWithPretrainedStem)
    try:
        with pytest.raises(DistillationConfigError,
                           match=r"^model\.student\.stem\.init_cfg \(Pretrained\)='stem\.pth' "
                                 r"loads the student's weights"):
            MODELS.build(_transfer_cfg(dict(type=f'mmlinvit.{name}'), _vit('softmax')))
    finally:
        MODELS._module_dict.pop(name, None)
    assert name not in MODELS._module_dict


# ---------------------------------------------------------------- segmentor students
def _seg_vit() -> dict:
    return _vit(out_type='featmap')


def _seg_student(**head: object) -> dict:
    decode_head = dict(type='mmseg.FCNHead', in_channels=16, channels=8, num_convs=1,
                       num_classes=3)
    decode_head.update(head)
    return dict(type='mmlinvit.EncoderDecoder', backbone=_seg_vit(), decode_head=decode_head)


def test_the_padded_rows_are_the_students_pixels_in_the_teachers_statistics() -> None:
    """The student segmentor pads its normalised batch with 0 (the pixel ``mean_s``); the
    teacher, with its own statistics, sees that same pixel:
    ``(0 * std_s + mean_s - mean_t) / std_t``, not a 0 of its own units (``mean_t``)."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    cfg = dict(
        type='mmlinvit.DistillationModel', student=_seg_student(), teacher=_seg_vit(),
        data_preprocessor=dict(type='mmseg.SegDataPreProcessor', **CIFAR),
        teacher_input_norm=dict(IMAGENET),
        student_recorders=dict(a=dict(type='ModuleOutputs', source='backbone.blocks.{i}.attn')),
        teacher_recorders=dict(a=dict(type='ModuleOutputs', source='blocks.{i}.attn')),
        distill_losses=dict(a=dict(
            loss=dict(type='mmlinvit.AttentionOutputMSELoss', loss_weight=1.0),
            inputs=dict(student_outputs='student.a', teacher_outputs='teacher.a'))))
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(cfg)
    seen: List[torch.Tensor] = []
    handle = model.teacher.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    h, w = 13, 14  # padded at the bottom / right to 16 x 16
    inputs = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(0))
    samples = [SegDataSample(gt_sem_seg=PixelData(data=torch.zeros(1, h, w, dtype=torch.long)),
                             metainfo=dict(img_shape=(h, w), pad_shape=(h, w),
                                           ori_shape=(h, w))) for _ in range(2)]
    with DefaultScope.overwrite_default_scope('mmseg'):
        model.loss(inputs, samples)
    handle.remove()
    mean_s, std_s = (torch.tensor(CIFAR[k]).view(1, 3, 1, 1) for k in ('mean', 'std'))
    mean_t, std_t = (torch.tensor(IMAGENET[k]).view(1, 3, 1, 1) for k in ('mean', 'std'))
    padded = torch.zeros(2, 3, 16, 16)
    padded[..., :h, :w] = inputs
    expected = (padded * std_s + mean_s - mean_t) / std_t
    teacher_in, = seen
    torch.testing.assert_close(teacher_in, expected, rtol=1e-5, atol=1e-5)
    assert teacher_in[0, 0, -1, -1].item() == pytest.approx(
        (CIFAR['mean'][0] - IMAGENET['mean'][0]) / IMAGENET['std'][0], abs=1e-5)


def _seg_logits_samples(logits: torch.Tensor) -> list:
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    return [SegDataSample(seg_logits=PixelData(data=logits.clone()),
                          metainfo=dict(img_path='a.png')) for _ in range(2)]


def test_a_binary_segmentor_student_reports_one_output_channel_as_mmseg_does() -> None:
    """mmseg's ``SegTTAModel`` reads ``out_channels`` of the model it wraps: a sigmoid head
    of two classes has one channel (thresholded), not ``num_classes``."""
    from mmseg.models.segmentors import SegTTAModel
    student = _seg_student(num_classes=2, out_channels=1, threshold=0.5,
                           loss_decode=dict(type='mmseg.CrossEntropyLoss', use_sigmoid=True))
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(dict(type='mmlinvit.DistillationModel', student=student,
                                  data_preprocessor=dict(type='mmseg.SegDataPreProcessor',
                                                         **CIFAR)))
    assert model.out_channels == model.student.out_channels == 1
    assert model.student.num_classes == 2
    with DefaultScope.overwrite_default_scope('mmseg'):
        multi = MODELS.build(dict(type='mmlinvit.DistillationModel', student=_seg_student(),
                                  data_preprocessor=dict(type='mmseg.SegDataPreProcessor',
                                                         **CIFAR)))
    assert multi.out_channels == 3
    logits = torch.tensor([[[2.0, -2.0], [0.1, -0.1]]])
    reference = SegTTAModel(module=model.student).merge_preds([_seg_logits_samples(logits)])
    # sigmoid > 0.5 by hand
    assert torch.equal(reference[0].pred_sem_seg.data, torch.tensor([[[1., 0.], [1., 0.]]]))


def test_tta_of_a_binary_segmentor_student_merges_as_the_student_does() -> None:
    """``tools/test.py --tta`` wraps the ``DistillationModel`` in mmseg's ``SegTTAModel``,
    which thresholds a one-channel student with ``module.decode_head.threshold``: the
    merged prediction must be what ``SegTTAModel`` gives around the student itself.
    Failed before the fix (AttributeError: no ``decode_head``); passes with the
    ``decode_head`` property."""
    from mmseg.models.segmentors import SegTTAModel
    student = _seg_student(num_classes=2, out_channels=1, threshold=0.5,
                           loss_decode=dict(type='mmseg.CrossEntropyLoss', use_sigmoid=True))
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(dict(type='mmlinvit.DistillationModel', student=student,
                                  data_preprocessor=dict(type='mmseg.SegDataPreProcessor',
                                                         **CIFAR)))
    logits = torch.tensor([[[2.0, -2.0], [0.1, -0.1]]])
    reference = SegTTAModel(module=model.student).merge_preds([_seg_logits_samples(logits)])
    merged = SegTTAModel(module=model).merge_preds([_seg_logits_samples(logits)])
    assert torch.equal(merged[0].pred_sem_seg.data, reference[0].pred_sem_seg.data)


# ---------------------------------------------------------------- mmengine API
def _attn_out_model() -> DistillationModel:
    return MODELS.build(dict(
        type='mmlinvit.DistillationModel', student=_vit('elu'), teacher=_vit('softmax'),
        student_recorders=dict(a=dict(type='ModuleOutputs', source='blocks.{i}.attn')),
        teacher_recorders=dict(a=dict(type='ModuleOutputs', source='blocks.{i}.attn')),
        distill_losses=dict(attn_out=dict(
            loss=dict(type='mmlinvit.AttentionOutputMSELoss', loss_weight=1.0),
            inputs=dict(student_outputs='student.a', teacher_outputs='teacher.a')))))


def test_a_bare_backbone_student_names_what_segmentation_tools_miss() -> None:
    """``out_channels`` / ``decode_head`` are the student's; a bare-backbone student has
    neither. ``hasattr`` stays False (mmseg probes with it), and the error names the student
    and the fix instead of torch's generic "object has no attribute" text."""
    model = _attn_out_model()
    for name in ('out_channels', 'decode_head'):
        assert not hasattr(model, name)
        with pytest.raises(AttributeError, match=rf'(?s)student \(VisionTransformer\) has no '
                           rf'{name}.*mmseg segmentor'):
            getattr(model, name)
    with pytest.raises(AttributeError, match="has no attribute 'not_there'"):
        model.not_there


def test_an_unknown_schedule_term_is_named_with_the_existing_ones() -> None:
    model = _attn_out_model()
    with pytest.raises(KeyError, match=r"Unknown distill term 'attn'; terms: \['attn_out'\]"):
        model.set_distill_scale('attn', 0.5)
    assert model.distill_scales == {'attn_out': 1.0}
    model.set_distill_scale('attn_out', 0.5)
    assert model.distill_scales == {'attn_out': 0.5}

