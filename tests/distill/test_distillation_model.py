"""DistillationModel: build-time checks, teacher forcing, checkpoints, masking, NaN stop."""
import copy
import fnmatch
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmengine.runner.checkpoint import get_state_dict

from mmlinvit.models.distill import DistillationConfigError, DistillationModel
from mmlinvit.registry import MODELS

from distill_testing import CONFIGS, IMG_SIZE, PATCH, save_tiny_vit_checkpoint, tiny_arch


@pytest.fixture(autouse=True)
def _mmpretrain_scope():
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


def vit(attn='softmax', width=16, **kwargs):
    cfg = dict(type='mmlinvit.VisionTransformer', arch=tiny_arch(embed_dims=width),
               patch_size=PATCH, img_size=IMG_SIZE, attn_cfg=attn, out_type='raw')
    cfg.update(kwargs)
    return cfg


def attn_out_model(**overrides):
    cfg = dict(
        type='mmlinvit.DistillationModel',
        student=vit('elu'),
        teacher=vit('softmax'),
        student_recorders=dict(attn_out=dict(type='ModuleOutputs', source='blocks.{i}.attn')),
        teacher_recorders=dict(attn_out=dict(type='ModuleOutputs', source='blocks.{i}.attn')),
        distill_losses=dict(
            attn_out=dict(
                loss=dict(type='mmlinvit.AttentionOutputMSELoss', loss_weight=50.0),
                inputs=dict(student_outputs='student.attn_out',
                            teacher_outputs='teacher.attn_out'))))
    cfg.update(overrides)
    return cfg


def stage1_model_cfg():
    cfg = Config.fromfile(
        osp.join(CONFIGS, 'adala/vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512.py'))
    model = copy.deepcopy(cfg.model.to_dict())
    for side in ('student', 'teacher'):
        model[side].update(arch=tiny_arch(), patch_size=PATCH, img_size=IMG_SIZE, pretrained=None)
    model['data_preprocessor'] = dict(type='ClsDataPreprocessor')
    model['check_input_size'] = None
    return model


def images(batch=2):
    return torch.randn(batch, 3, IMG_SIZE, IMG_SIZE)


# ---------------------------------------------------------------- teacher forcing (Stage 1)
def test_stage1_only_student_attention_params_get_gradients():
    model = MODELS.build(stage1_model_cfg())
    assert isinstance(model, DistillationModel)
    model.train()
    losses = model.loss(images())
    total, log_vars = model.parse_losses(losses)
    total.backward()
    names = [n for n, _ in model.named_parameters()]
    expected = {n for n in names if fnmatch.fnmatchcase(n, 'student.blocks.*.attn.*')}
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert expected and with_grad == expected and trainable == expected
    assert all(model.get_parameter(n).grad.abs().sum() > 0 for n in expected
               if n.endswith('qkv.weight'))
    assert not model.teacher.training
    assert set(log_vars) == {'loss', 'distill.loss_attn_out', 'distill.gap_attn_out'}
    # the gap is the unweighted MSE and is not summed into the total
    assert log_vars['loss'].item() == pytest.approx(log_vars['distill.loss_attn_out'].item())


def test_stage1_student_attention_sees_the_teacher_block_inputs():
    model = MODELS.build(stage1_model_cfg())
    recorded, teacher_in = {}, {}
    model.student.blocks[1].attn.register_forward_pre_hook(
        lambda m, args: recorded.setdefault('x', args[0]))
    model.teacher.blocks[1].register_forward_pre_hook(
        lambda m, args: teacher_in.setdefault('x', args[0]))
    model.loss(images(1))
    # the student's attention of block 1 ran on norm1(teacher's input of block 1)
    expected = model.student.blocks[1].norm1(teacher_in['x'])
    assert torch.allclose(recorded['x'], expected)


# ---------------------------------------------------------------- checkpoints
def test_checkpoint_has_no_teacher_and_reloads_strictly():
    model = MODELS.build(stage1_model_cfg())
    for state in (model.state_dict(), get_state_dict(model)):
        assert not any(k.startswith('teacher.') for k in state)
        assert all(k.startswith('student.') for k in state)
        assert set(state) == {f'student.{k}' for k in model.student.state_dict()}
    fresh = MODELS.build(stage1_model_cfg())
    result = fresh.load_state_dict(model.state_dict(), strict=True)
    assert not result.missing_keys
    assert torch.equal(fresh.student.blocks[0].attn.qkv.weight,
                       model.student.blocks[0].attn.qkv.weight)


def test_teacher_stays_frozen_in_train_mode():
    model = MODELS.build(attn_out_model())
    model.train()
    assert model.student.training and not model.teacher.training
    assert not any(p.requires_grad for p in model.teacher.parameters())


# ---------------------------------------------------------------- build-time errors
def test_missing_recorder_module_is_named():
    cfg = attn_out_model(student_recorders=dict(
        attn_out=dict(type='ModuleOutputs', source='blocks.{i}.atn')))
    with pytest.raises(DistillationConfigError, match=r"student recorder 'attn_out'.*"
                       r"blocks\.0\.atn.*'blocks\.0'.*children.*'attn'"):
        MODELS.build(cfg)
    cfg = attn_out_model(teacher_recorders=dict(attn_out='norm_x'))
    with pytest.raises(DistillationConfigError, match="module 'norm_x' does not exist"):
        MODELS.build(cfg)
    cfg = attn_out_model(teacher_recorders=dict(
        attn_out=dict(type='ModuleOutputs', source='blocks.{i}.attn', indices=[0, 5])))
    with pytest.raises(DistillationConfigError, match='index 5 is out of range'):
        MODELS.build(cfg)


def test_unknown_loss_argument_and_recorder_are_named():
    cfg = attn_out_model()
    cfg['distill_losses']['attn_out']['inputs']['student_outs'] = 'student.attn_out'
    with pytest.raises(DistillationConfigError,
                       match=r"AttentionOutputMSELoss.forward has no argument 'student_outs'"):
        MODELS.build(cfg)
    cfg = attn_out_model()
    cfg['distill_losses']['attn_out']['inputs']['teacher_outputs'] = 'teacher.nope'
    with pytest.raises(DistillationConfigError, match=r"teacher recorder 'nope' does not exist"):
        MODELS.build(cfg)
    cfg = attn_out_model()
    del cfg['distill_losses']['attn_out']['inputs']['teacher_outputs']
    with pytest.raises(DistillationConfigError, match=r"\['teacher_outputs'\].*not mapped"):
        MODELS.build(cfg)
    cfg = attn_out_model()
    cfg['distill_losses']['attn_out']['loss']['type'] = 'mmlinvit.NoSuchLoss'
    with pytest.raises(KeyError, match='NoSuchLoss'):
        MODELS.build(cfg)


def test_token_count_mismatch_fails_at_build_with_both_shapes():
    cfg = attn_out_model(student=vit('elu', with_cls_token=False, pos_embed_type='sincos'))
    with pytest.raises(DistillationConfigError,
                       match=r"'attn_out'.*\(1, 16, 16\).*\(1, 17, 16\).*patch_tokens_only"):
        MODELS.build(cfg)
    # patch-token matching with the layouts from the context builds and runs
    cfg['distill_losses']['attn_out']['loss']['patch_tokens_only'] = True
    cfg['distill_losses']['attn_out']['inputs'].update(
        student_token_layout='context.student_token_layout',
        teacher_token_layout='context.teacher_token_layout')
    model = MODELS.build(cfg)
    assert model.token_layouts == {'student': (0, 0), 'teacher': (1, 0)}
    assert torch.isfinite(model.loss(images())['distill.loss_attn_out'])


def test_width_mismatch_fails_at_build_with_both_shapes():
    with pytest.raises(DistillationConfigError, match=r'\(1, 17, 16\).*\(1, 17, 24\)'):
        MODELS.build(attn_out_model(teacher=vit('softmax', width=24)))
    cfg = stage1_model_cfg()
    cfg['teacher']['arch'] = tiny_arch(embed_dims=24)
    with pytest.raises(DistillationConfigError,
                       match=r'teacher forcing.*blocks\.0.*\(1, 17, 24\).*embed_dims=16'):
        MODELS.build(cfg)


def test_bad_teacher_checkpoint_is_named(tmp_path):
    ckpt = save_tiny_vit_checkpoint(str(tmp_path / 'wide_teacher.pth'),
                                    arch=tiny_arch(embed_dims=24))
    with pytest.raises(DistillationConfigError,
                       match=r'(?s)wide_teacher\.pth.*patch_embed\.proj\.weight'):
        MODELS.build(attn_out_model(teacher_ckpt=ckpt))
    good = save_tiny_vit_checkpoint(str(tmp_path / 'teacher.pth'), seed=3)
    model = MODELS.build(attn_out_model(teacher_ckpt=good))
    assert torch.equal(model.teacher.blocks[1].mlp.fc1.weight,
                       torch.load(good)['blocks.1.mlp.fc1.weight'])


def test_other_config_errors():
    with pytest.raises(DistillationConfigError, match="pattern 'blocks.*.atn.*' matches no"):
        MODELS.build(attn_out_model(trainable_params=['blocks.*.atn.*']))
    with pytest.raises(DistillationConfigError, match=r"connector\(s\) \['proj'\]"):
        MODELS.build(attn_out_model(connectors=dict(
            proj=dict(type='mmlinvit.LinearConnector', in_channels=16, out_channels=16))))
    with pytest.raises(DistillationConfigError, match='need a teacher'):
        MODELS.build(attn_out_model(teacher=None, teacher_recorders=None))
    cfg = stage1_model_cfg()
    cfg['trainable_params'] = None
    with pytest.raises(DistillationConfigError, match='set trainable_params'):
        MODELS.build(cfg)
    with pytest.raises(DistillationConfigError, match="without 'loss'"):
        MODELS.build(attn_out_model(distill_losses=dict(my_loss=dict(loss=dict(
            type='mmlinvit.FeatureMSELoss'), inputs=dict(
                student_feats='student.attn_out', teacher_feats='teacher.attn_out')))))


# ---------------------------------------------------------------- NaN / inf
def test_nan_loss_names_the_term():
    model = MODELS.build(attn_out_model())
    with torch.no_grad():
        model.student.blocks[0].attn.proj.weight[0, 0] = float('nan')
    with pytest.raises(FloatingPointError, match=r"'distill\.loss_attn_out' is not finite"):
        model.loss(images())


# ---------------------------------------------------------------- masking / connectors
def linearizer_model(**overrides):
    cfg = dict(
        type='mmlinvit.DistillationModel',
        student=vit('elu'),
        teacher=vit('softmax', width=24),
        student_recorders=dict(stages=dict(type='ModuleOutputs', source='blocks.{i}'),
                               final='norm'),
        teacher_recorders=dict(stages=dict(type='ModuleOutputs', source='blocks.{i}'),
                               final='norm'),
        patch_masking=dict(ratio=0.75, seed=1),
        connectors=dict(proj=dict(type='mmlinvit.LinearConnector', in_channels=16,
                                  out_channels=24)),
        distill_losses=dict(
            act=dict(loss=dict(type='mmlinvit.ActivationMatchingLoss'),
                     inputs=dict(student_feats='student.stages', teacher_feats='teacher.stages',
                                 patch_mask='context.patch_mask',
                                 student_token_layout='context.student_token_layout',
                                 teacher_token_layout='context.teacher_token_layout')),
            mask=dict(loss=dict(type='mmlinvit.MaskedPredictionLoss'),
                      inputs=dict(student_feats=dict(source='student.final', connector='proj'),
                                  teacher_feats='teacher.final',
                                  patch_mask='context.patch_mask',
                                  student_token_layout='context.student_token_layout',
                                  teacher_token_layout='context.teacher_token_layout'))))
    cfg.update(overrides)
    return cfg


def test_patch_masking_ratio_per_image_and_reproducible():
    model = MODELS.build(linearizer_model())
    model.train()
    x = images(4)
    first = model._sample_patch_mask(x, advance=True)
    second = model._sample_patch_mask(x, advance=True)
    assert first.shape == (4, (IMG_SIZE // PATCH)**2)
    assert (first.sum(1) == 12).all()  # round(0.75 * 16)
    assert len({tuple(m.tolist()) for m in first}) > 1  # sampled per image
    assert not torch.equal(first, second)
    model.mask_step.fill_(0)
    assert torch.equal(model._sample_patch_mask(x, advance=False), first)
    assert 'mask_step' in model.state_dict()


def test_masked_student_gets_mask_token_and_connector_gradients():
    model = MODELS.build(linearizer_model())
    model.train()
    losses = model.loss(images())
    assert set(losses) == {'distill.loss_act', 'distill.gap_act', 'distill.loss_mask',
                           'distill.gap_mask'}
    total, _ = model.parse_losses(losses)
    total.backward()
    assert model.mask_token.grad is not None and model.mask_token.grad.abs().sum() > 0
    assert model.connectors.proj.linear.weight.grad is not None
    keys = model.state_dict()
    assert 'mask_token' in keys and 'connectors.proj.linear.weight' in keys
    assert not any(k.startswith('teacher.') for k in keys)


def test_masking_needs_mask_aware_forward_tokens():
    cfg = linearizer_model()
    cfg['distill_losses']['mask']['inputs'].pop('patch_mask')
    with pytest.raises(DistillationConfigError, match=r"\['patch_mask'\].*not mapped"):
        MODELS.build(cfg)
    cfg = linearizer_model(patch_masking=None)
    with pytest.raises(DistillationConfigError, match='context.patch_mask needs patch_masking'):
        MODELS.build(cfg)


# ---------------------------------------------------------------- attention maps
def test_attention_map_matching_through_the_model():
    cfg = attn_out_model(
        student_recorders=dict(maps=dict(type='AttentionMaps', source='blocks.{i}.attn')),
        teacher_recorders=dict(maps=dict(type='AttentionMaps', source='blocks.{i}.attn')),
        distill_losses=dict(maps=dict(
            loss=dict(type='mmlinvit.AttentionMapLoss', loss_weight=3e3),
            inputs=dict(student_maps='student.maps', teacher_maps='teacher.maps'))))
    model = MODELS.build(cfg)
    losses = model.loss(images())
    assert losses['distill.gap_maps'] > 0
    assert losses['distill.loss_maps'].item() == pytest.approx(
        3e3 * losses['distill.gap_maps'].item(), rel=1e-5)


def _loss_and_grads(cfg, seed=0):
    torch.manual_seed(seed)
    model = MODELS.build(cfg)
    model.train()
    torch.manual_seed(1)
    losses = model.loss(images())
    total, _ = model.parse_losses(losses)
    total.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.item() for k, v in losses.items()}, grads, model


@pytest.mark.parametrize('attn', ['elu', 'softmax'])
def test_attention_maps_of_a_with_cp_student(attn):
    """An AttentionMaps recorder on a student under activation checkpointing: the maps are
    computed when read, outside the checkpointed blocks (computed in the hook, the backward's
    recomputation saved other tensors: CheckpointError)."""
    results = []
    for with_cp in (False, True):
        cfg = attn_out_model(
            student=vit(attn, with_cp=with_cp, drop_path_rate=0.1),
            student_recorders=dict(maps=dict(type='AttentionMaps', source='blocks.{i}.attn')),
            teacher_recorders=dict(maps=dict(type='AttentionMaps', source='blocks.{i}.attn')),
            distill_losses=dict(maps=dict(
                loss=dict(type='mmlinvit.AttentionMapLoss', loss_weight=3e3),
                inputs=dict(student_maps='student.maps', teacher_maps='teacher.maps'))))
        results.append(_loss_and_grads(cfg))
    (loss_off, grads_off, _), (loss_on, grads_on, _) = results
    assert loss_on == loss_off and loss_off['distill.loss_maps'] > 0
    assert sorted(grads_on) == sorted(grads_off) and grads_off
    for name, grad in grads_off.items():
        assert torch.allclose(grads_on[name], grad, rtol=1e-5, atol=1e-8), name


def test_stage1_student_without_the_teachers_tokens_is_refused():
    """An MHLA student takes its paper's setting (no class token); teacher forcing would feed
    it the DINOv2 teacher's class token (a bare shape error at the first step)."""
    cfg = stage1_model_cfg()
    cfg['student']['attn_cfg'] = 'mhla'
    with pytest.raises(DistillationConfigError, match='with_cls_token=True'):
        MODELS.build(cfg)


def test_stage1_student_of_another_patch_size_is_refused():
    """Each student block runs on the teacher's tokens: an ELU student of patch 8 under a
    patch-16 teacher built and trained Stage 1 on the teacher's grid, no word (InLine / MHLA
    students stopped with a bare token-count ValueError)."""
    cfg = stage1_model_cfg()
    cfg['student']['patch_size'] = PATCH // 2
    with pytest.raises(DistillationConfigError,
                       match=rf"patch size is {PATCH} and the student's {PATCH // 2}.*"
                             rf"model.student.patch_size={PATCH}"):
        MODELS.build(cfg)


def test_stage1_teacher_forcing_checkpoints_with_cp_blocks(monkeypatch):
    """ViT-AdaLA Stage 1 with student with_cp=True: the teacher-forced attention of each
    block runs under activation checkpointing (it ran plainly: with_cp was a no-op there), with
    the same loss and gradients."""
    import mmlinvit.distill.teacher_forcing as teacher_forcing
    calls = []
    real = teacher_forcing.checkpoint

    def counting(*args, **kwargs):
        calls.append(kwargs.get('use_reentrant'))
        return real(*args, **kwargs)

    monkeypatch.setattr(teacher_forcing, 'checkpoint', counting)
    results = []
    for with_cp in (False, True):
        cfg = stage1_model_cfg()
        cfg['student']['with_cp'] = with_cp
        results.append(_loss_and_grads(cfg))
    depth = tiny_arch()['num_layers']
    assert calls == [False] * depth  # only with with_cp, one per block, non-reentrant
    (loss_off, grads_off, _), (loss_on, grads_on, _) = results
    assert loss_on == loss_off
    assert sorted(grads_on) == sorted(grads_off) and grads_off
    for name, grad in grads_off.items():
        assert torch.allclose(grads_on[name], grad, rtol=1e-5, atol=1e-8), name


# ---------------------------------------------------------------- task-model student
def test_task_model_student_adds_task_loss_and_predicts():
    from mmpretrain.structures import DataSample
    cfg = attn_out_model(
        student=dict(type='ImageClassifier',
                     backbone=vit('elu', out_type='cls_token'),
                     head=dict(type='LinearClsHead', num_classes=3, in_channels=16)),
        weight_transfer=dict(type='mlp_copy'))
    cfg['student_recorders']['attn_out']['source'] = 'backbone.blocks.{i}.attn'
    model = MODELS.build(cfg)
    model.init_weights()
    assert torch.equal(model.student.backbone.blocks[0].mlp.fc1.weight,
                       model.teacher.blocks[0].mlp.fc1.weight)
    assert 'blocks.0.mlp.fc1.weight' in model.transfer_report.copied
    samples = [DataSample().set_gt_label(i) for i in range(2)]
    losses = model.loss(images(), samples)
    assert {'student.loss', 'distill.loss_attn_out', 'distill.gap_attn_out'} <= set(losses)
    preds = model(images(), samples, mode='predict')
    assert len(preds) == 2 and preds[0].pred_score.shape == (3, )
    keys = model.state_dict()
    assert 'student.backbone.blocks.0.attn.qkv.weight' in keys and 'student.head.fc.weight' in keys


# ---------------------------------------------------------------- student preprocessing
def classifier_student(**kwargs):
    cfg = dict(type='ImageClassifier', backbone=vit('elu', out_type='cls_token'),
               head=dict(type='LinearClsHead', num_classes=3, in_channels=16))
    cfg.update(kwargs)
    return cfg


MIXUP = dict(augments=[dict(type='Mixup', alpha=0.8)])


def task_distill_model(student, data_preprocessor):
    cfg = attn_out_model(student=student, data_preprocessor=data_preprocessor)
    cfg['student_recorders']['attn_out']['source'] = 'backbone.blocks.{i}.attn'
    return cfg


def test_student_batch_augments_are_refused_not_dropped():
    # mmengine's Runner puts the top-level data_preprocessor into model.data_preprocessor:
    # the student's train_cfg Mixup would never run.
    cfg = task_distill_model(classifier_student(train_cfg=MIXUP),
                             dict(type='ClsDataPreprocessor', num_classes=3))
    with pytest.raises(DistillationConfigError, match=r'(?s)train_cfg.*Mixup.*batch_augments'):
        MODELS.build(cfg)


def test_student_settings_at_the_top_level_are_refused_with_the_fix():
    # `--cfg-options model.test_cfg.mode=slide` on a *-distill config: a bare TypeError from
    # the registry before; now the key and where it goes.
    cfg = task_distill_model(classifier_student(), None)
    cfg['test_cfg'] = dict(mode='slide')
    cfg['head'] = dict(num_classes=5)
    with pytest.raises(DistillationConfigError,
                       match=r"\['head', 'test_cfg'\].*model\.test_cfg -> model\.student\.test_cfg"):
        MODELS.build(cfg)


def test_student_data_preprocessor_that_differs_is_refused():
    student = classifier_student(
        data_preprocessor=dict(type='ClsDataPreprocessor', mean=[1., 2., 3.], std=[4., 5., 6.]))
    cfg = task_distill_model(student, dict(type='mmpretrain.ClsDataPreprocessor'))
    with pytest.raises(DistillationConfigError, match=r'data_preprocessor\.mean'):
        MODELS.build(cfg)
    # The same settings in both places (mmseg configs) are fine.
    cfg = task_distill_model(copy.deepcopy(student),
                             dict(type='ClsDataPreprocessor', mean=[1., 2., 3.],
                                  std=[4., 5., 6.]))
    MODELS.build(cfg)


def test_a_data_preprocessor_without_type_takes_the_students():
    """mmpretrain's data set bases (cifar10_bs16, cub_bs8_448, ...) give data_preprocessor
    without a type, which its ImageClassifier completes: a distillation recipe on such a base
    stopped with a bare registry KeyError."""
    from mmpretrain.models import ClsDataPreprocessor
    settings = dict(num_classes=3, mean=[125.307, 122.961, 113.8575],
                    std=[51.5865, 50.847, 51.255], to_rgb=False)  # CIFAR's
    model = MODELS.build(task_distill_model(classifier_student(), dict(settings)))
    assert type(model.data_preprocessor) is ClsDataPreprocessor
    assert torch.allclose(model.data_preprocessor.mean.flatten(), torch.tensor(settings['mean']))
    assert torch.allclose(model.data_preprocessor.std.flatten(), torch.tensor(settings['std']))
    # a bare-backbone student has no preprocessor to take the type from
    with pytest.raises(DistillationConfigError, match=r'data_preprocessor\.type'):
        MODELS.build(attn_out_model(data_preprocessor=dict(settings)))
    # an mmseg segmentor student without a preprocessor has mmengine's BaseDataPreprocessor,
    # which takes none of these settings
    student = dict(type='mmseg.EncoderDecoder', backbone=vit('elu', out_type='featmap'),
                   decode_head=dict(type='mmseg.FCNHead', in_channels=16, channels=8,
                                    num_convs=1, num_classes=3))
    with pytest.raises(DistillationConfigError, match=r'BaseDataPreprocessor.*data_preprocessor'
                                                      r'\.type'):
        MODELS.build(task_distill_model(student, dict(settings)))


def test_batch_augments_of_the_model_preprocessor_run_for_the_student():
    from mmpretrain.structures import DataSample
    cfg = task_distill_model(
        classifier_student(),
        dict(type='ClsDataPreprocessor', num_classes=3, batch_augments=MIXUP))
    model = MODELS.build(cfg)
    samples = [DataSample().set_gt_label(i % 3) for i in range(6)]
    torch.manual_seed(0)  # Mixup's permutation
    np.random.seed(0)  # Mixup's lambda
    data = model.data_preprocessor(
        dict(inputs=[torch.rand(3, IMG_SIZE, IMG_SIZE) * 255 for _ in range(6)],
             data_samples=samples), training=True)
    # Mixup replaced the hard labels by mixed scores, so the student's loss sees them.
    assert all(s.gt_score.shape == (3, ) for s in data['data_samples'])
    assert any(0 < s.gt_score.max() < 1 for s in data['data_samples'])
    assert torch.isfinite(model.loss(**data)['student.loss'])


def test_patch_tokens_only_needs_the_token_layouts():
    """Without the layouts the loss would treat the class token as a patch (silently)."""
    cfg = attn_out_model()
    cfg['distill_losses']['attn_out']['loss']['patch_tokens_only'] = True
    with pytest.raises(DistillationConfigError,
                       match=r"(?s)patch_tokens_only=True.*student_token_layout="
                             r"'context.student_token_layout'"):
        MODELS.build(cfg)
    cfg['distill_losses']['attn_out']['inputs'].update(
        student_token_layout='context.student_token_layout',
        teacher_token_layout='context.teacher_token_layout')
    model = MODELS.build(cfg)
    assert model.token_layouts['student'] == (1, 0)  # the class token is left out


def test_build_time_dry_run_does_not_claim_pretrained_was_never_loaded(tmp_path):
    """The dry run at build time runs before the runner's init_weights(): it used to warn
    that the student's pretrained= weights were never loaded (every Copy-MLP -distill run)
    and so used up the one warning; a forward without init_weights() still warns."""
    import warnings

    from mmlinvit.backbones import VisionTransformer
    path = str(tmp_path / 'student.pth')
    torch.save(VisionTransformer(tiny_arch(), patch_size=PATCH, img_size=IMG_SIZE,
                                 attn_cfg='elu').state_dict(), path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        model = MODELS.build(attn_out_model(student=vit('elu', pretrained=path)))
    assert not [w for w in caught if 'never loaded' in str(w.message)]
    with pytest.warns(UserWarning, match='never loaded'):
        model.student(images())
