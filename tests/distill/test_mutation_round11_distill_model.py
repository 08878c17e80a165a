"""Mutation round 11: the distillation model's wiring, its teacher, its trainable set, its
build-time checks, its terms and connectors, against hand computations.

Each test here fails on a one-line change of ``mmlinvit/models/distill`` that the rest of the
suite let through (round 8 covered the loss functions, the record wiring and the student
inputs; this round the model around them):

* the attention-output term of recipe 2 is ``50 * mean_i MSE(attn_i(student), attn_i(teacher))``
  computed here from the block outputs captured by the test's own hooks (``'sum'`` over blocks
  when asked), its schedule factor scales the loss and its gradient but not the logged gap;
* the teacher's own ``pretrained=``, a DDP-prefixed task-model ``teacher_ckpt`` (loaded
  strictly), and a runner's later ``init_weights()`` leaving the loaded teacher alone;
* ``trainable_params``: the union of several patterns, every pattern checked, names matched
  case-sensitively, a parameter frozen before never unfrozen;
* configured token layouts per side, a task model's backbone layout, configs that need a
  teacher, the build-time dry run at the configured (non-square) size leaving train mode on;
* the teacher runs only when a term or teacher forcing needs it; the student sees the batch
  as given when the teacher gets its own normalisation; ``check_finite=False`` is honoured;
* a nested model (EMA wrapper) saves and loads without teacher keys;
* terms: unknown keys, keyword-only and ``**kwargs`` losses, unknown context keys and
  connectors refused at build time, the gap without weight or scale, training errors
  propagating unchanged, non-finite task losses and list / non-scalar losses stopping;
* ``LinearConnector``'s init, ``bias=False``, tuple records in order, named width errors;
* ``check_stage_depths`` on other argument names, ``(i + 1) / depth`` fractions, the fix it
  names; input specs and token layouts refused or normalised; one error class.

Two bugs found in this round have tests at the end: a loss that always compares patch tokens
(``ActivationMatchingLoss``) built without the token layouts and counted the class token as a
patch, and a task-model teacher whose backbone loads ``pretrained=`` was warned to keep its
random initialisation.
"""
import math
from typing import Any, Dict, List, Tuple

import pytest
import torch
import torch.nn as nn
from mmengine.registry import DefaultScope

from mmlinvit.distill.recorders import ModuleOutputsRecorder
from mmlinvit.models.distill import DistillationConfigError, DistillationModel, LinearConnector
from mmlinvit.models.distill.input_specs import InputSpec, parse_input_spec, token_layout
from mmlinvit.models.distill.stage_depths import check_stage_depths, matching_indices
from mmlinvit.models.distill.terms import (build_term, check_connectors_used,
                                           check_finite_losses, compute_terms)
from mmlinvit.models.distill.trainable_params import freeze_all_but
from mmlinvit.registry import MODELS

from distill_testing import IMG_SIZE, PATCH, save_tiny_vit_checkpoint, tiny_arch
from test_distillation_model import attn_out_model, linearizer_model, vit

LAMBDA = 50.0  # recipe 2 (Copy the MLP, distill the attention): L = L_task + 50 L_distill
IMAGENET = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])
CIFAR = dict(mean=[125.307, 122.961, 113.8575], std=[51.5865, 50.847, 51.255])


@pytest.fixture(autouse=True)
def _mmpretrain_scope():
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


def _batch(seed: int, batch: int = 2, height: int = IMG_SIZE,
           width: int = IMG_SIZE) -> torch.Tensor:
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))


class _AttnOutputs:
    """The attention outputs of every block of both sides, taken by the test's own hooks."""

    def __init__(self, model: DistillationModel) -> None:
        self.outputs: Dict[str, Dict[int, torch.Tensor]] = dict(student={}, teacher={})
        for side in ('student', 'teacher'):
            for i, block in enumerate(getattr(model, side).blocks):
                block.attn.register_forward_hook(self._keep(side, i))

    def _keep(self, side: str, index: int):

        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            self.outputs[side][index] = output

        return hook

    def block_mses(self) -> List[torch.Tensor]:
        """mean((s_i - t_i)^2) over batch, tokens and channels, per block, in float64."""
        return [(self.outputs['student'][i].double() - self.outputs['teacher'][i].double())
                .pow(2).mean() for i in sorted(self.outputs['student'])]


# ---------------------------------------------------------------- recipe 2's term by hand
def test_attention_output_term_is_lambda_times_the_block_mean_of_the_mse():
    model = MODELS.build(attn_out_model())
    model.train()
    captured = _AttnOutputs(model)
    losses = model.loss(_batch(0))
    mses = captured.block_mses()
    assert len(mses) == 2 and abs(mses[0].item() - mses[1].item()) > 1e-4 * mses[0].item()
    gap = (mses[0] + mses[1]).item() / 2
    assert losses['distill.loss_attn_out'].item() == pytest.approx(LAMBDA * gap, rel=1e-5)
    assert losses['distill.gap_attn_out'].item() == pytest.approx(gap, rel=1e-5)
    total, log_vars = model.parse_losses(losses)
    assert total.item() == pytest.approx(LAMBDA * gap, rel=1e-5)  # the gap is not summed
    assert set(log_vars) == {'loss', 'distill.loss_attn_out', 'distill.gap_attn_out'}


def test_block_reduction_sum_adds_the_block_mses():
    cfg = attn_out_model()
    cfg['distill_losses']['attn_out']['loss']['block_reduction'] = 'sum'
    model = MODELS.build(cfg)
    captured = _AttnOutputs(model)
    losses = model.loss(_batch(1))
    summed = sum(m.item() for m in captured.block_mses())
    assert losses['distill.loss_attn_out'].item() == pytest.approx(LAMBDA * summed, rel=1e-5)
    assert losses['distill.gap_attn_out'].item() == pytest.approx(summed, rel=1e-5)


def test_schedule_factor_scales_loss_and_gradient_but_not_the_gap():
    model = MODELS.build(attn_out_model())
    model.train()
    model.set_distill_scale('attn_out', 0.25)
    captured = _AttnOutputs(model)
    losses = model.loss(_batch(2))
    by_hand = 0.25 * LAMBDA * torch.stack(
        [(captured.outputs['student'][i] - captured.outputs['teacher'][i]).pow(2).mean()
         for i in range(2)]).mean()
    assert losses['distill.loss_attn_out'].item() == pytest.approx(by_hand.item(), rel=1e-5)
    assert losses['distill.gap_attn_out'].item() == pytest.approx(
        by_hand.item() / (0.25 * LAMBDA), rel=1e-5)
    params = [model.student.blocks[0].attn.qkv.weight, model.student.blocks[1].attn.proj.weight]
    expected = torch.autograd.grad(by_hand, params, retain_graph=True)
    total, _ = model.parse_losses(losses)
    total.backward()
    for param, grad in zip(params, expected):
        assert grad.abs().sum() > 0
        torch.testing.assert_close(param.grad, grad, rtol=1e-4, atol=1e-9)
    # a factor of 0 switches the term off (it is not "unset")
    model.set_distill_scale('attn_out', 0.0)
    assert model.loss(_batch(2))['distill.loss_attn_out'].item() == 0.0


# ---------------------------------------------------------------- the teacher's weights
def _teacher_params(model: DistillationModel) -> Dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.teacher.named_parameters()}


def _assert_teacher_holds(model: DistillationModel, state: Dict[str, torch.Tensor],
                          prefix: str = '') -> None:
    for name, param in model.teacher.named_parameters():
        assert torch.equal(param, state[prefix + name]), name


def test_the_teachers_own_pretrained_is_loaded_at_build(tmp_path):
    path = save_tiny_vit_checkpoint(str(tmp_path / 'teacher.pth'), seed=5)
    model = MODELS.build(attn_out_model(teacher=vit('softmax', pretrained=path)))
    _assert_teacher_holds(model, torch.load(path))


def test_a_later_init_weights_keeps_the_teacher_checkpoint(tmp_path):
    """The runner calls init_weights() after the build: a backbone teacher's pretrained=
    must not be read again over teacher_ckpt, nor a task-model teacher's head re-drawn."""
    pretrained = save_tiny_vit_checkpoint(str(tmp_path / 'pretrained.pth'), seed=5)
    ckpt = save_tiny_vit_checkpoint(str(tmp_path / 'ckpt.pth'), seed=6)
    model = MODELS.build(attn_out_model(teacher=vit('softmax', pretrained=pretrained),
                                        teacher_ckpt=ckpt))
    _assert_teacher_holds(model, torch.load(ckpt))
    model.init_weights()
    _assert_teacher_holds(model, torch.load(ckpt))

    teacher_ckpt, state = _classifier_checkpoint(tmp_path)
    model = MODELS.build(_classifier_teacher_model(teacher_ckpt=teacher_ckpt))
    model.init_weights()
    _assert_teacher_holds(model, state, prefix='module.')


def _classifier(num_classes: int = 3, **backbone: Any) -> dict:
    backbone.setdefault('out_type', 'cls_token')
    return dict(type='ImageClassifier', backbone=vit(**backbone),
                head=dict(type='LinearClsHead', num_classes=num_classes, in_channels=16))


def _classifier_teacher_model(**overrides: Any) -> dict:
    cfg = attn_out_model(teacher=_classifier())
    cfg['teacher_recorders']['attn_out']['source'] = 'backbone.blocks.{i}.attn'
    cfg.update(overrides)
    return cfg


def _classifier_checkpoint(tmp_path, drop: Tuple[str, ...] = ()) -> Tuple[str, dict]:
    """A trained-classifier file as a DDP run saves it ('module.' prefix)."""
    torch.manual_seed(11)
    classifier = MODELS.build(_classifier())
    with torch.no_grad():
        classifier.head.fc.weight.normal_()
        classifier.head.fc.bias.uniform_(1, 2)
    state = {f'module.{k}': v for k, v in classifier.state_dict().items() if k not in drop}
    path = str(tmp_path / f'classifier{len(drop)}.pth')
    torch.save(dict(state_dict=state), path)
    return path, state


def test_a_ddp_prefixed_task_model_teacher_checkpoint_loads_strictly(tmp_path):
    path, state = _classifier_checkpoint(tmp_path)
    model = MODELS.build(_classifier_teacher_model(teacher_ckpt=path))
    _assert_teacher_holds(model, state, prefix='module.')
    short, _ = _classifier_checkpoint(tmp_path, drop=('head.fc.weight', ))
    with pytest.raises(DistillationConfigError, match=r'(?s)classifier1\.pth.*head\.fc\.weight'):
        MODELS.build(_classifier_teacher_model(teacher_ckpt=short))


def test_a_missing_teacher_checkpoint_is_a_config_error_naming_it(tmp_path):
    missing = str(tmp_path / 'nope.pth')
    for cfg in (attn_out_model(teacher_ckpt=missing),
                _classifier_teacher_model(teacher_ckpt=missing)):
        with pytest.raises(DistillationConfigError, match='nope.pth'):
            MODELS.build(cfg)


def test_an_explicit_teacher_checkpoint_layout_is_used(tmp_path):
    """An mmpretrain ViT file loads as detected or as 'mmpretrain', and read as a timm file
    it does not fit: the configured layout reaches the loader."""
    from mmpretrain.models import VisionTransformer as MMPretrainViT
    torch.manual_seed(5)
    official = MMPretrainViT(arch=dict(embed_dims=16, num_layers=2, num_heads=2,
                                       feedforward_channels=32), img_size=IMG_SIZE,
                             patch_size=PATCH)
    path = str(tmp_path / 'mmpretrain_vit.pth')
    torch.save(official.state_dict(), path)
    for layout in ('auto', 'mmpretrain'):
        model = MODELS.build(attn_out_model(teacher_ckpt=path, teacher_ckpt_layout=layout))
        assert torch.equal(model.teacher.blocks[1].attn.qkv.weight,
                           official.layers[1].attn.qkv.weight)
    with pytest.raises(DistillationConfigError, match=r"mmpretrain_vit\.pth.*layout 'timm'"):
        MODELS.build(attn_out_model(teacher_ckpt=path, teacher_ckpt_layout='timm'))


def test_a_random_teacher_is_warned_and_a_loaded_one_is_not(tmp_path, warnings_logged):
    MODELS.build(attn_out_model())
    assert [m for m in warnings_logged if 'random initialisation' in m]
    warnings_logged.clear()
    path = save_tiny_vit_checkpoint(str(tmp_path / 'teacher.pth'), seed=5)
    MODELS.build(attn_out_model(teacher_ckpt=path))
    MODELS.build(attn_out_model(teacher=vit('softmax', pretrained=path)))
    assert not [m for m in warnings_logged if 'random initialisation' in m]


def test_a_task_model_teacher_runs_whole_so_its_logits_can_be_recorded():
    cfg = attn_out_model(student=_classifier(attn_cfg='elu'), teacher=_classifier())
    cfg['student_recorders'] = dict(logits='head.fc')
    cfg['teacher_recorders'] = dict(logits='head.fc')
    cfg['distill_losses'] = dict(kd=dict(loss=dict(type='mmlinvit.FeatureMSELoss'),
                                         inputs=dict(student_feats='student.logits',
                                                     teacher_feats='teacher.logits')))
    model = MODELS.build(cfg)
    seen = []
    model.teacher.head.fc.register_forward_hook(lambda m, a, out: seen.append(out))
    model.student.head.fc.register_forward_hook(lambda m, a, out: seen.append(out))
    from mmpretrain.structures import DataSample
    losses = model.loss(_batch(3), [DataSample().set_gt_label(i) for i in range(2)])
    teacher_logits, student_logits = seen
    assert teacher_logits.shape == (2, 3)
    want = (student_logits.double() - teacher_logits.double()).pow(2).mean().item()
    assert losses['distill.loss_kd'].item() == pytest.approx(want, rel=1e-5)


# ---------------------------------------------------------------- trainable_params
def _trainable(model: DistillationModel) -> set:
    return {n for n, p in model.student.named_parameters() if p.requires_grad}


def test_several_patterns_train_their_union():
    model = MODELS.build(attn_out_model(trainable_params=['blocks.0.attn.*', 'norm.*']))
    names = [n for n, _ in model.student.named_parameters()]
    expected = {n for n in names if n.startswith('blocks.0.attn.') or n.startswith('norm.')}
    assert {'norm.weight', 'blocks.0.attn.qkv.weight'} <= expected
    assert _trainable(model) == expected


def test_every_pattern_is_checked_not_only_the_first():
    with pytest.raises(DistillationConfigError, match=r"pattern 'norm\.wieght' matches no"):
        MODELS.build(attn_out_model(trainable_params=['blocks.*', 'norm.wieght']))


def test_patterns_match_case_sensitively_and_the_first_name_counts():
    with pytest.raises(DistillationConfigError, match=r"pattern 'Blocks\.\*' matches no"):
        MODELS.build(attn_out_model(trainable_params=['Blocks.*']))
    module = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    first = next(iter(dict(module.named_parameters())))
    freeze_all_but(module, [first])
    assert {n for n, p in module.named_parameters() if p.requires_grad} == {first}


def test_the_freeze_loop_matches_case_sensitively_too():
    """'scale' passes the typo check on its own name and trains it, not 'Scale' as well."""
    module = nn.Module()
    module.scale = nn.Parameter(torch.ones(1))
    module.Scale = nn.Parameter(torch.ones(1))
    freeze_all_but(module, ['scale'])
    assert {n for n, p in module.named_parameters() if p.requires_grad} == {'scale'}


def test_freezing_never_unfreezes_a_parameter_frozen_before():
    module = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    module[0].weight.requires_grad_(False)
    freeze_all_but(module, ['0.*'])
    assert {n for n, p in module.named_parameters() if p.requires_grad} == {'0.bias'}


# ---------------------------------------------------------------- token layouts
def test_configured_token_layouts_are_each_sides_own():
    model = MODELS.build(attn_out_model(teacher_token_layout=(3, 1)))
    assert model.token_layouts == {'student': (1, 0), 'teacher': (3, 1)}
    model = MODELS.build(attn_out_model(student_token_layout=(2, 0)))
    assert model.token_layouts == {'student': (2, 0), 'teacher': (1, 0)}


def test_task_model_layouts_are_read_from_their_backbones():
    """ImageClassifier has no num_prefix_tokens: its backbone's class token counts."""
    cfg = attn_out_model(student=_classifier(attn_cfg='elu', with_cls_token=False,
                                             pos_embed_type='sincos', out_type='avg_featmap'),
                         teacher=_classifier(num_reg_tokens=2))
    cfg['student_recorders']['attn_out']['source'] = 'backbone.blocks.{i}.attn'
    cfg['teacher_recorders']['attn_out']['source'] = 'backbone.blocks.{i}.attn'
    cfg['distill_losses']['attn_out']['loss']['patch_tokens_only'] = True
    cfg['distill_losses']['attn_out']['inputs'].update(
        student_token_layout='context.student_token_layout',
        teacher_token_layout='context.teacher_token_layout')
    model = MODELS.build(cfg)
    assert model.token_layouts == {'student': (0, 0), 'teacher': (3, 0)}


# ---------------------------------------------------------------- what needs a teacher
def test_every_teacher_user_without_a_teacher_is_refused_by_name():
    with pytest.raises(DistillationConfigError, match='need a teacher'):
        MODELS.build(dict(type='mmlinvit.DistillationModel', student=vit('elu'),
                          weight_transfer=dict(type='mlp_copy')))
    with pytest.raises(DistillationConfigError, match='need a teacher'):
        MODELS.build(dict(type='mmlinvit.DistillationModel', student=vit('elu'),
                          teacher_forcing=dict(input_recorder='block_in'),
                          trainable_params=['blocks.*.attn.*']))
    with pytest.raises(DistillationConfigError, match='teacher_input_norm is set but there is '
                                                      'no teacher'):
        MODELS.build(dict(type='mmlinvit.DistillationModel', student=vit('elu'),
                          teacher_input_norm=dict(IMAGENET),
                          data_preprocessor=dict(type='ClsDataPreprocessor', **CIFAR)))


def test_teacher_forcing_refuses_a_task_model_student_by_name():
    cfg = dict(type='mmlinvit.DistillationModel', student=_classifier(attn_cfg='elu'),
               teacher=vit('softmax'),
               teacher_recorders=dict(block_in=dict(type='ModuleInputs', source='blocks.{i}')),
               teacher_forcing=dict(input_recorder='block_in'),
               trainable_params=['backbone.blocks.*.attn.*'])
    with pytest.raises(DistillationConfigError, match='needs a bare backbone student'):
        MODELS.build(cfg)


def test_a_task_model_students_preprocessor_is_the_models():
    student = _classifier(attn_cfg='elu')
    student['data_preprocessor'] = dict(type='ClsDataPreprocessor', **CIFAR)
    cfg = attn_out_model(student=student)
    cfg['student_recorders']['attn_out']['source'] = 'backbone.blocks.{i}.attn'
    model = MODELS.build(cfg)
    assert model.data_preprocessor is model.student.data_preprocessor
    torch.testing.assert_close(model.data_preprocessor.mean.flatten(),
                               torch.tensor(CIFAR['mean']))


# ---------------------------------------------------------------- the build-time dry run
def _dry_run_inputs(monkeypatch, cfg: dict) -> List[Tuple[int, ...]]:
    shapes = []
    original = DistillationModel._run_teacher

    def spy(self, inputs):
        shapes.append(tuple(inputs.shape))
        return original(self, inputs)

    monkeypatch.setattr(DistillationModel, '_run_teacher', spy)
    MODELS.build(cfg)
    return shapes


def test_the_dry_run_uses_the_configured_size(monkeypatch):
    assert _dry_run_inputs(monkeypatch, attn_out_model(check_input_size=(16, 24))) == [
        (1, 3, 16, 24)]
    assert _dry_run_inputs(monkeypatch, attn_out_model(check_input_size=8))[-1] == (1, 3, 8, 8)
    wide = attn_out_model(student=vit('elu', img_size=(16, 24)),
                          teacher=vit('softmax', img_size=(16, 24)))
    assert _dry_run_inputs(monkeypatch, wide)[-1] == (1, 3, 16, 24)


def test_the_dry_run_leaves_the_model_in_train_mode():
    model = MODELS.build(attn_out_model())
    assert model.training and model.student.training and not model.teacher.training
    assert all(m.training for m in model.student.modules())


# ---------------------------------------------------------------- a training step
def test_a_transfer_only_teacher_does_not_run_in_the_steps():
    cfg = dict(type='mmlinvit.DistillationModel', student=vit('elu'), teacher=vit('softmax'),
               weight_transfer=dict(type='mlp_copy'))
    model = MODELS.build(cfg)
    calls = []
    model.teacher.register_forward_pre_hook(lambda m, a: calls.append(1))
    model.student.register_forward_pre_hook(lambda m, a: calls.append(0))
    assert model.loss(_batch(0)) == {}
    assert calls == [0]


def test_check_finite_false_returns_the_non_finite_loss():
    model = MODELS.build(attn_out_model(check_finite=False))
    with torch.no_grad():
        model.student.blocks[0].attn.proj.weight[0, 0] = float('nan')
    losses = model.loss(_batch(0))
    assert math.isnan(losses['distill.loss_attn_out'].item())


def test_the_student_sees_the_batch_and_the_teacher_its_own_normalisation():
    from test_teacher_input_norm import model_cfg
    model = MODELS.build(model_cfg(dict(IMAGENET)))
    seen = {}
    model.student.register_forward_pre_hook(lambda m, a: seen.setdefault('student', a[0]))
    model.teacher.register_forward_pre_hook(lambda m, a: seen.setdefault('teacher', a[0]))
    batch = _batch(4)
    model.loss(batch)
    assert torch.equal(seen['student'], batch)
    mean_s, std_s = (torch.tensor(CIFAR[k]).view(1, 3, 1, 1) for k in ('mean', 'std'))
    mean_t, std_t = (torch.tensor(IMAGENET[k]).view(1, 3, 1, 1) for k in ('mean', 'std'))
    torch.testing.assert_close(seen['teacher'], (batch * std_s + mean_s - mean_t) / std_t)


def test_the_connector_passes_the_gradient_to_the_student():
    model = MODELS.build(linearizer_model())
    model.train()
    losses = model.loss(_batch(5))
    losses['distill.loss_mask'].backward()
    assert model.student.norm.weight.grad is not None
    assert model.student.norm.weight.grad.abs().sum() > 0


# ---------------------------------------------------------------- nested in a wrapper
def test_a_wrapped_model_saves_and_loads_without_teacher_keys():
    """mmengine's EMA keeps the model as ``module``: its state dict prefixes every key."""
    model = MODELS.build(attn_out_model())
    wrapper = nn.Module()
    wrapper.module = model
    state = wrapper.state_dict()
    assert state and not [k for k in state if k.startswith('module.teacher.')]
    assert {k for k in state} == {f'module.{k}' for k in model.state_dict()}
    fresh = nn.Module()
    fresh.module = MODELS.build(attn_out_model())
    result = fresh.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys


# ---------------------------------------------------------------- terms
class _KeywordOnlyLoss(nn.Module):
    """A loss with a required keyword-only argument."""

    def forward(self, student: torch.Tensor, *, teacher: torch.Tensor) -> torch.Tensor:
        return (student - teacher).pow(2).mean()


class _AnyArgsLoss(nn.Module):
    """A loss taking any keyword arguments."""

    loss_weight = 4.0

    def forward(self, **records: torch.Tensor) -> torch.Tensor:
        return self.loss_weight * sum(v.sum() for v in records.values())


def _no_check(term: str, spec: InputSpec) -> InputSpec:
    return spec


def test_a_term_with_unknown_keys_is_refused():
    """loss_weight beside loss= (not inside it) would be silently ignored."""
    cfg = dict(loss=dict(type=_AnyArgsLoss), inputs=dict(x='student.a'), loss_weight=50.0)
    with pytest.raises(DistillationConfigError, match=r'must be dict\(loss=<loss config>'):
        build_term('attn', cfg, _no_check)


def test_a_term_name_must_be_an_identifier():
    cfg = dict(loss=dict(type=_AnyArgsLoss), inputs=dict(x='student.a'))
    with pytest.raises(DistillationConfigError, match='must be an identifier'):
        build_term('attn-out', cfg, _no_check)


def test_required_keyword_only_arguments_must_be_mapped():
    cfg = dict(loss=dict(type=_KeywordOnlyLoss), inputs=dict(student='student.a'))
    with pytest.raises(DistillationConfigError, match=r"\['teacher'\].*not mapped"):
        build_term('pair', cfg, _no_check)
    cfg['inputs']['teacher'] = 'teacher.a'
    _, specs = build_term('pair', cfg, _no_check)
    assert [(s.arg, s.side, s.name) for s in specs] == [('student', 'student', 'a'),
                                                         ('teacher', 'teacher', 'a')]


def test_a_loss_taking_any_keywords_accepts_any_argument():
    cfg = dict(loss=dict(type=_AnyArgsLoss), inputs=dict(first='student.a', second='teacher.b'))
    loss, specs = build_term('anything', cfg, _no_check)
    assert isinstance(loss, _AnyArgsLoss) and [s.arg for s in specs] == ['first', 'second']


def test_both_token_layouts_are_needed_for_patch_tokens_only():
    cfg = attn_out_model()
    cfg['distill_losses']['attn_out']['loss']['patch_tokens_only'] = True
    cfg['distill_losses']['attn_out']['inputs']['student_token_layout'] = (
        'context.student_token_layout')
    with pytest.raises(DistillationConfigError, match=r"\['teacher_token_layout'\] are not"):
        MODELS.build(cfg)


def test_unknown_context_keys_and_connectors_are_refused_at_build():
    cfg = attn_out_model()
    cfg['distill_losses']['attn_out']['inputs']['student_token_layout'] = 'context.layout'
    with pytest.raises(DistillationConfigError,
                       match=r"unknown context entry 'layout'; available: \('patch_mask'"):
        MODELS.build(cfg)
    cfg = attn_out_model()
    cfg['distill_losses']['attn_out']['inputs']['student_outputs'] = dict(
        source='student.attn_out', connector='proj')
    with pytest.raises(DistillationConfigError,
                       match=r"connector 'proj' does not exist; connectors: \[\]"):
        MODELS.build(cfg)


def test_connectors_used_by_a_later_term_count():
    specs = {'first': [InputSpec('x', 'student', 'a')],
             'second': [InputSpec('y', 'student', 'b', connector='proj')]}
    check_connectors_used(['proj'], specs)
    with pytest.raises(DistillationConfigError, match=r"\['other'\]"):
        check_connectors_used(['proj', 'other'], specs)


class _Constant(nn.Module):
    """A term whose weighted value is given; ``loss_weight`` as set."""

    def __init__(self, value: float, loss_weight: float) -> None:
        super().__init__()
        self.value = nn.Parameter(torch.tensor(value))
        self.loss_weight = loss_weight

    def forward(self) -> torch.Tensor:
        return self.value * 1.0


def test_each_term_is_its_own_scaled_loss_and_its_gap_is_unweighted():
    losses = {'a': _Constant(12.0, 4.0), 'b': _Constant(3.0, 0.0), 'c': _Constant(2.0, 1.0)}
    out = compute_terms(losses, {t: [] for t in losses}, {'a': 0.5, 'b': 1.0, 'c': 2.0},
                        resolve=lambda spec: None)
    values = {k: v.item() for k, v in out.items()}
    assert values == {'distill.loss_a': 6.0, 'distill.gap_a': 3.0,
                      'distill.loss_b': 3.0, 'distill.gap_b': 3.0,
                      'distill.loss_c': 4.0, 'distill.gap_c': 2.0}
    assert out['distill.loss_a'].requires_grad and not out['distill.gap_a'].requires_grad


def test_an_error_while_training_propagates_unchanged():
    raised = ValueError('shapes (2, 3) and (2, 4)')

    class _Failing(nn.Module):

        def forward(self) -> torch.Tensor:
            raise raised

    with pytest.raises(ValueError) as info:
        compute_terms({'a': _Failing()}, {'a': []}, {'a': 1.0}, resolve=lambda spec: None)
    assert info.value is raised
    with pytest.raises(DistillationConfigError, match=r"'a'.*dry run at input size \(8, 8\)"):
        compute_terms({'a': _Failing()}, {'a': []}, {'a': 1.0}, resolve=lambda spec: None,
                      dry_run_size=(8, 8))


def test_non_finite_task_list_and_element_losses_stop():
    nan = float('nan')
    for losses in ({'student.loss_cls': torch.tensor(nan)},
                   {'student.loss_aux': [torch.tensor(1.0), torch.tensor(nan)]},
                   {'distill.loss_x': torch.tensor([1.0, float('inf')])}):
        with pytest.raises(FloatingPointError, match=repr(next(iter(losses)))):
            check_finite_losses(losses)
    check_finite_losses({'student.accuracy': torch.tensor(nan), 'distill.loss_x': torch.ones(2)})


# ---------------------------------------------------------------- connectors
def test_linear_connector_initialisation():
    torch.manual_seed(0)
    connector = LinearConnector(512, 256)
    assert connector.linear.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.equal(connector.linear.bias, torch.zeros(256))
    assert LinearConnector(16, 24, bias=False).linear.bias is None


def test_linear_connector_maps_each_record_in_order():
    connector = LinearConnector(3, 2)
    first, second = torch.randn(2, 5, 3), torch.randn(2, 5, 3)
    weight, bias = connector.linear.weight, connector.linear.bias
    for records in ([first, second], (first, second)):
        mapped = connector(records)
        assert isinstance(mapped, list) and len(mapped) == 2
        torch.testing.assert_close(mapped[0], first @ weight.T + bias)
        torch.testing.assert_close(mapped[1], second @ weight.T + bias)


def test_linear_connector_errors_name_the_widths():
    with pytest.raises(ValueError, match=r'expects width 3, got a record of shape \(2, 5, 4\)'):
        LinearConnector(3, 2)(torch.randn(2, 5, 4))
    with pytest.raises(TypeError, match=r'out_channels \(teacher width\).*24\.0'):
        LinearConnector(16, 24.0)


# ---------------------------------------------------------------- block depths
class _Stack(nn.Module):

    def __init__(self, name: str, depth: int) -> None:
        super().__init__()
        self.add_module(name, nn.ModuleList(nn.Identity() for _ in range(depth)))


def _check_pairs(student: Tuple[List[int], int], teacher: Tuple[List[int], int],
                 args: Tuple[str, str] = ('student_outputs', 'teacher_outputs')) -> None:
    models = {'student': _Stack('layers', student[1]), 'teacher': _Stack('blocks', teacher[1])}
    recorders = {'student': {'rec': ModuleOutputsRecorder('layers.{i}', student[0])},
                 'teacher': {'rec': ModuleOutputsRecorder('blocks.{i}', teacher[0])}}
    for side in ('student', 'teacher'):
        recorders[side]['rec'].resolve(models[side], side)
    specs = {'t': [InputSpec(args[0], 'student', 'rec'), InputSpec(args[1], 'teacher', 'rec')]}
    check_stage_depths(specs, recorders, models)


def test_depths_are_checked_for_any_student_teacher_argument_pair():
    _check_pairs(([1, 3], 4), ([0, 1], 2))
    with pytest.raises(DistillationConfigError, match=r'1/4 vs 1/2'):
        _check_pairs(([0], 4), ([0], 2))
    with pytest.raises(DistillationConfigError, match=r'1/4 vs 1/2'):
        _check_pairs(([0], 4), ([0], 2), args=('student_maps', 'teacher_maps'))


def test_matching_indices_at_equal_depth_fractions():
    assert matching_indices([2, 5, 8, 11], 12, 24) == [5, 11, 17, 23]
    assert matching_indices([1, 3], 4, 2) == [0, 1]
    assert matching_indices([0], 2, 3) is None
    assert matching_indices([1, 0], 2, 3) is None  # 3/3 fits, 1.5/3 does not


def test_the_named_fix_and_its_stage_hint():
    with pytest.raises(DistillationConfigError) as info:
        _check_pairs(([2, 5, 8, 11], 24), ([2, 5, 8, 11], 12))
    assert 'indices=[5, 11, 17, 23]' in str(info.value)
    assert 'stage_block_indices(24, 4)' in str(info.value)
    with pytest.raises(DistillationConfigError) as info:
        _check_pairs(([0, 5], 24), ([0, 5], 12))
    assert 'indices=[1, 11]' in str(info.value) and 'equal stages' not in str(info.value)


def test_the_model_checks_the_depths_of_its_own_student_and_teacher():
    deep = vit('elu', arch=tiny_arch(num_layers=4))
    cfg = attn_out_model(student=deep)
    cfg['student_recorders']['attn_out']['indices'] = [1, 3]
    MODELS.build(cfg)  # 2/4, 4/4 against the teacher's 1/2, 2/2
    cfg['student_recorders']['attn_out']['indices'] = [0, 1]
    with pytest.raises(DistillationConfigError, match=r'1/4 vs 1/2'):
        MODELS.build(cfg)
    MODELS.build(dict(cfg, check_block_depths=False))


# ---------------------------------------------------------------- specs and layouts
def test_input_specs_are_parsed_or_refused():
    spec = parse_input_spec('t', 'x', 'student.a.b')
    assert (spec.arg, spec.side, spec.name, spec.connector) == ('x', 'student', 'a.b', None)
    with pytest.raises(DistillationConfigError, match=r"got keys \['conector', 'source'\]"):
        parse_input_spec('t', 'x', dict(source='student.a', conector='proj'))
    with pytest.raises(DistillationConfigError, match="unknown side 'connector'"):
        parse_input_spec('t', 'x', 'connector.proj')


def test_token_layouts_are_pairs_of_ints():
    backbone = nn.Module()
    assert token_layout([1, 0], backbone) == (1, 0)
    assert isinstance(token_layout([1, 0], backbone), tuple)
    assert all(type(v) is int for v in token_layout((1.0, torch.tensor(2)), backbone))
    for bad in ((1, ), (1, 0, 0)):
        with pytest.raises(DistillationConfigError, match='is \\(prefix, suffix\\)'):
            token_layout(bad, backbone)


def test_one_error_class_under_both_import_paths():
    from mmlinvit.distill.errors import DistillationConfigError as torch_only
    from mmlinvit.models.distill.errors import DistillationConfigError as integrated
    assert torch_only is integrated is DistillationConfigError
    with pytest.raises(integrated):
        ModuleOutputsRecorder('', None)


# ---------------------------------------------------------------- bugs found (round 11)
def _activation_term_model(with_layouts: bool) -> dict:
    """ViT-Linearizer's L_act without patch masking (its 'act only' setting) on class-token
    backbones; the token layouts mapped or not."""
    inputs = dict(student_feats='student.stages', teacher_feats='teacher.stages')
    if with_layouts:
        inputs.update(student_token_layout='context.student_token_layout',
                      teacher_token_layout='context.teacher_token_layout')
    return dict(type='mmlinvit.DistillationModel', student=vit('elu'),
                teacher=vit('softmax', width=24),
                student_recorders=dict(stages=dict(type='ModuleOutputs', source='blocks.{i}')),
                teacher_recorders=dict(stages=dict(type='ModuleOutputs', source='blocks.{i}')),
                distill_losses=dict(act=dict(loss=dict(type='mmlinvit.ActivationMatchingLoss'),
                                             inputs=inputs)))


def test_an_always_patch_token_loss_without_the_token_layouts_is_refused():
    MODELS.build(_activation_term_model(with_layouts=True))
    with pytest.raises(DistillationConfigError,
                       match=r"(?s)ActivationMatchingLoss.*\['student_token_layout', "
                             r"'teacher_token_layout'\] are not mapped"):
        MODELS.build(_activation_term_model(with_layouts=False))


def test_a_task_model_teacher_with_a_pretrained_backbone_is_not_called_random(
        tmp_path, warnings_logged):
    path = save_tiny_vit_checkpoint(str(tmp_path / 'backbone.pth'), seed=5)
    cfg = _classifier_teacher_model()
    cfg['teacher']['backbone']['pretrained'] = path
    model = MODELS.build(cfg)
    assert torch.equal(model.teacher.backbone.blocks[0].attn.qkv.weight,
                       torch.load(path)['blocks.0.attn.qkv.weight'])
    assert not [m for m in warnings_logged if 'random initialisation' in m]
    # a task-model teacher without any file is still warned
    MODELS.build(_classifier_teacher_model())
    assert [m for m in warnings_logged if 'random initialisation' in m]
