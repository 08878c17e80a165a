"""Mutation round 14: the distillation model and the weight-transfer core, second pass.

Each test fails on a one-line change of ``mmlinvit/models/distill/distillation_model.py`` or
``mmlinvit/transfer/base.py`` that the rest of the suite let through (rounds 8, 10 and 11
covered the record wiring, the strategies' own tensors and the model's terms):

* ``trainable_params=[]`` freezes every student parameter (an empty list is not ``None``);
* patch masking of a task-model student is refused for what it is (not a bare backbone);
* the build-time dry run also runs for a teacher-forcing-only model (no distillation term),
  through the teacher-forced student in dry-run mode;
* a task-model student's loss without data samples stops instead of dropping the task
  loss;
* a teacher position grid that differs from the student's in one direction only (4 x 8 into
  4 x 4) is resampled (bicubic, checked against ``F.interpolate`` written here), not dropped;
* a state-dict teacher without class token keeps its first patch position;
* the report's ``student_only`` and its ``to_dict`` counts follow the pairing;
* Mimetic / Impulse record the options of their copy base in the report;
* the LayerScale opt-out hint names ``include_layer_scale`` only for strategies that have it.
"""
from typing import Any, Dict, List

import pytest
import torch
import torch.nn.functional as F
from mmengine.registry import DefaultScope

from mmlinvit.backbones import VisionTransformer
from mmlinvit.distill.teacher_forcing import TeacherForcing
from mmlinvit.models.distill import DistillationConfigError
from mmlinvit.registry import MODELS
from mmlinvit.transfer import (TransferStructureError, build_transfer_strategy,
                               check_transfer_structure, transfer_weights)

from distill_testing import IMG_SIZE, PATCH, tiny_arch
from test_distillation_model import attn_out_model, vit


@pytest.fixture(autouse=True)
def _mmpretrain_scope():
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


def _backbone(attn: str = 'softmax', **kwargs: Any) -> VisionTransformer:
    """A tiny backbone with every weight drawn at random (a copy is visible)."""
    kwargs.setdefault('img_size', IMG_SIZE)
    model = VisionTransformer(tiny_arch(), patch_size=PATCH, attn_cfg=attn, **kwargs)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator))
    return model


# ---------------------------------------------------------------- trainable set
def test_an_empty_trainable_list_freezes_every_student_parameter():
    """``trainable_params=[]``: no pattern matches, so nothing of the student trains (a
    linear probe with its head elsewhere); only ``None`` trains all."""
    cfg = dict(type='mmlinvit.DistillationModel', student=vit('elu'), teacher=vit('softmax'),
               weight_transfer=dict(type='mlp_copy'), trainable_params=[])
    model = MODELS.build(cfg)
    assert [n for n, p in model.student.named_parameters() if p.requires_grad] == []
    cfg['trainable_params'] = None
    model = MODELS.build(cfg)
    assert all(p.requires_grad for p in model.student.parameters())


def test_patch_masking_of_a_task_model_student_is_refused_as_such():
    """An ImageClassifier student cannot be masked (its forward has no mask argument): the
    error says a bare backbone is needed, not that the classifier lacks forward_tokens."""
    student = dict(type='ImageClassifier', backbone=vit('elu', out_type='cls_token'),
                   head=dict(type='LinearClsHead', num_classes=3, in_channels=16))
    cfg = dict(type='mmlinvit.DistillationModel', student=student, teacher=vit('softmax'),
               weight_transfer=dict(type='mlp_copy'), patch_masking=dict(ratio=0.5))
    with pytest.raises(DistillationConfigError, match='needs a bare backbone student'):
        MODELS.build(cfg)


# ---------------------------------------------------------------- build-time dry run
def test_a_teacher_forcing_only_model_is_dry_run_at_build(monkeypatch: pytest.MonkeyPatch):
    """No distillation term, teacher forcing only (its gap is then read elsewhere): the build
    still runs one batch through the teacher-forced student, with ``dry_run=True`` so a shape
    error names the block at build time."""
    calls: List[Dict[str, Any]] = []
    original = TeacherForcing.forward_student

    def spy(self, student, recorder, inputs, dry_run=False):
        calls.append(dict(shape=tuple(inputs.shape), dry_run=dry_run,
                          grad=torch.is_grad_enabled()))
        return original(self, student, recorder, inputs, dry_run)

    monkeypatch.setattr(TeacherForcing, 'forward_student', spy)
    cfg = dict(type='mmlinvit.DistillationModel', student=vit('elu'), teacher=vit('softmax'),
               teacher_recorders=dict(block_in=dict(type='ModuleInputs', source='blocks.{i}')),
               teacher_forcing=dict(input_recorder='block_in', blocks='blocks'),
               trainable_params=['blocks.*.attn.*'])
    model = MODELS.build(cfg)
    assert calls == [dict(shape=(1, 3, IMG_SIZE, IMG_SIZE), dry_run=True, grad=False)]
    assert model.training and not model.teacher.training


# ---------------------------------------------------------------- task loss
def test_a_task_model_student_without_data_samples_does_not_drop_its_task_loss():
    """A classifier student's loss step needs the labels: without data samples it must stop,
    never return the distillation terms alone (the task loss silently missing from the sum).
    It stops with an error naming what is missing (it was a TypeError inside mmpretrain)."""
    student = dict(type='ImageClassifier', backbone=vit('elu', out_type='cls_token'),
                   head=dict(type='LinearClsHead', num_classes=3, in_channels=16))
    cfg = attn_out_model(student=student)
    cfg['student_recorders']['attn_out']['source'] = 'backbone.blocks.{i}.attn'
    model = MODELS.build(cfg)
    model.train()
    inputs = torch.randn(2, 3, IMG_SIZE, IMG_SIZE, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match='computes its task loss from data_samples'):
        model.loss(inputs, None)


# ---------------------------------------------------------------- transfer: pos grid
def _bicubic(grid_tokens: torch.Tensor, src: tuple, dst: tuple) -> torch.Tensor:
    """(1, Hs*Ws, C) -> (1, Hd*Wd, C) by torch's bicubic interpolation, written here."""
    channels = grid_tokens.shape[-1]
    image = grid_tokens.reshape(1, src[0], src[1], channels).permute(0, 3, 1, 2)
    out = F.interpolate(image, size=dst, mode='bicubic', align_corners=False)
    return out.permute(0, 2, 3, 1).reshape(1, dst[0] * dst[1], channels)


def test_a_grid_differing_in_one_direction_only_is_resampled():
    """A 4 x 8 teacher grid (16 x 32 images) into a 4 x 4 student: the rows agree, the
    columns do not; the patch positions are resampled bicubically, the class position kept."""
    teacher = _backbone('softmax', img_size=(16, 32))
    student = _backbone('elu')
    assert tuple(teacher.pos_grid) == (4, 8) and tuple(student.pos_grid) == (4, 4)
    report = transfer_weights(student, teacher, strategy='full_copy')
    assert 'pos_embed' in report.copied and 'pos_embed' in report.adapted
    expected = torch.cat([teacher.pos_embed[:, :1],
                          _bicubic(teacher.pos_embed[:, 1:].detach(), (4, 8), (4, 4))], dim=1)
    torch.testing.assert_close(student.pos_embed.detach(), expected)


def test_a_state_dict_teacher_without_class_token_keeps_its_first_patch_position():
    """A state dict without ``cls_token`` has no class position: its 8 x 8 grid (32 x 32
    images) is resampled whole into a 4 x 4 student without class token, the first patch
    position included."""
    teacher = _backbone('softmax', img_size=32, with_cls_token=False, out_type='avg_featmap')
    state = {k: v.clone() for k, v in teacher.state_dict().items()}
    assert 'cls_token' not in state and state['pos_embed'].shape[1] == 64
    student = _backbone('elu', with_cls_token=False, out_type='avg_featmap')
    report = transfer_weights(student, state, strategy='full_copy')
    assert 'pos_embed' in report.adapted
    torch.testing.assert_close(student.pos_embed.detach(),
                               _bicubic(state['pos_embed'], (8, 8), (4, 4)))


def test_report_sets_and_counts_follow_the_pairing():
    """Under mlp_copy: ``student_only`` is what the teacher has no tensor for (here the
    class token the teacher lacks, and the grid with its class position), never a skipped ``attn.qkv``; ``skipped`` is the paired
    attention; ``to_dict`` counts are the lengths of its lists."""
    teacher = _backbone('softmax', with_cls_token=False, out_type='avg_featmap')
    student = _backbone('elu')
    report = transfer_weights(student, teacher, strategy='mlp_copy')
    student_keys = {k for k in student.state_dict() if k not in student.TRAINING_RECORDS}
    teacher_keys = {k for k in teacher.state_dict() if k not in teacher.TRAINING_RECORDS}
    # the 17-row student grid (class position) has no counterpart in the 16-row teacher grid
    assert report.student_only == (student_keys - teacher_keys) | {'pos_embed'}
    assert 'cls_token' in report.student_only
    assert 'blocks.0.attn.qkv.weight' in report.skipped
    assert 'blocks.0.attn.qkv.weight' not in report.student_only
    out = report.to_dict()
    for field in ('copied', 'initialized', 'student_only', 'strategy_initialized',
                  'no_counterpart', 'skipped'):
        assert out['counts'][field] == len(out[field]) == len(getattr(report, field)), field
    assert out['counts']['skipped'] > 0


# ---------------------------------------------------------------- transfer: options
@pytest.mark.parametrize('strategy', ['mimetic', 'impulse'])
def test_structured_inits_record_their_base_options(strategy: str):
    """A report must say whether the base copied the LayerScale: the base's own options are
    part of the structured strategy's options."""
    strat = build_transfer_strategy(
        dict(type=strategy, base=dict(type='mlp_copy', include_layer_scale=False)))
    options = strat.options()
    assert options['base'] == 'mlp_copy'
    assert options['base_options'] == {'include_layer_scale': False}


def test_the_layer_scale_opt_out_is_offered_only_where_it_exists():
    """A DeiT-III teacher (LayerScale) into a student without it: under mlp_copy the message
    offers ``include_layer_scale=False``; FullCopy has no such option, so it is not offered."""
    teacher = _backbone('softmax', layer_scale_init=0.1)
    student = _backbone('elu', layer_scale_init=None)
    with pytest.raises(TransferStructureError, match='include_layer_scale=False'):
        check_transfer_structure(student, teacher, 'mlp_copy')
    with pytest.raises(TransferStructureError, match='LayerScale') as err:
        check_transfer_structure(student, teacher, 'full_copy')
    assert 'include_layer_scale' not in str(err.value)
