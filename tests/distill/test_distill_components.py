"""The distillation model's components and their build-time checks: teacher forcing
(:mod:`mmlinvit.distill.teacher_forcing`), patch masking (:mod:`mmlinvit.distill.patch_masking`)
and the per-teacher input normalisation (:mod:`mmlinvit.models.distill.teacher_input_norm`).

The model-level behaviour (gradients, records, losses) is in ``test_distillation_model.py``;
here each component is checked on its own (the torch-only ones without OpenMMLab) and through
the model config keys users write.
"""
import numpy as np
import pytest
import torch
import torch.nn as nn
from mmengine.registry import DefaultScope

from mmlinvit.backbones import VisionTransformer
from mmlinvit.distill import (DistillationConfigError, ModuleInputsRecorder,
                              ModuleOutputsRecorder, PatchMasking, TeacherForcing,
                              sample_patch_mask)
from mmlinvit.registry import MODELS

from distill_testing import IMG_SIZE, PATCH, tiny_arch
from test_distillation_model import linearizer_model
from test_distillation_model import stage1_model_cfg as tiny_stage1_model_cfg

GRID = IMG_SIZE // PATCH


@pytest.fixture(autouse=True)
def _mmpretrain_scope():
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


def stage1_model_cfg(student_layers=2, teacher_layers=2):
    """The real AdaLA Stage-1 config (teacher forcing) at tiny size, with these depths."""
    model = tiny_stage1_model_cfg()
    for side, layers in (('student', student_layers), ('teacher', teacher_layers)):
        model[side]['arch'] = tiny_arch(num_layers=layers)
    return model


def tiny_vit(layers=2, **kwargs):
    torch.manual_seed(0)
    return VisionTransformer(arch=tiny_arch(num_layers=layers), patch_size=PATCH,
                             img_size=IMG_SIZE, out_type='raw', **kwargs)


# ---------------------------------------------------------------- teacher forcing
@pytest.mark.parametrize('student_layers, teacher_layers', [(3, 2), (2, 3)])
def test_teacher_forcing_needs_the_same_depth(student_layers, teacher_layers):
    """A deeper student would have blocks that never run (and silently never train); a
    shallower one has no block for the teacher's deepest inputs.  Both fail at build time
    naming both counts."""
    cfg = stage1_model_cfg(student_layers, teacher_layers)
    # the student records only the blocks the teacher has: without the depth check the
    # deeper student would build and its last block would never run
    cfg['student_recorders']['attn_out']['indices'] = list(range(min(student_layers,
                                                                     teacher_layers)))
    with pytest.raises(DistillationConfigError,
                       match=rf"student has {student_layers} blocks \('blocks'\) and the "
                             rf"teacher {teacher_layers} \('blocks\.\{{i\}}'\)"):
        MODELS.build(cfg)
    # control: the same config at equal depth builds
    assert MODELS.build(stage1_model_cfg(3, 3)).teacher_forcing.blocks == 'blocks'


def test_teacher_forcing_config_and_recorder_errors():
    cfg = stage1_model_cfg()
    cfg['teacher_forcing'] = dict(input_recorder='block_in', block='blocks')
    with pytest.raises(DistillationConfigError, match=r"takes 'input_recorder' \(required\)"):
        MODELS.build(cfg)
    cfg['teacher_forcing'] = dict(blocks='blocks')
    with pytest.raises(DistillationConfigError, match=r"got keys \['blocks'\]"):
        MODELS.build(cfg)
    # the input recorder must record block inputs
    cfg['teacher_forcing'] = dict(input_recorder='attn_out')
    with pytest.raises(DistillationConfigError,
                       match=r"'attn_out' must name a teacher recorder of type 'ModuleInputs'"
                             r".*\['attn_out', 'block_in'\]"):
        MODELS.build(cfg)
    # the student's block container must hold blocks with forward_attn
    cfg['teacher_forcing'] = dict(input_recorder='block_in', blocks='patch_embed')
    with pytest.raises(DistillationConfigError, match=r"student has 0 blocks \('patch_embed'\)"):
        MODELS.build(cfg)


def test_teacher_forcing_component_without_openmmlab():
    """The torch-only component on plain backbones: the check names what is missing, and
    the forced run feeds each student block's attention the teacher's block input."""
    student, teacher = tiny_vit(attn_cfg='elu'), tiny_vit()
    forcing = TeacherForcing.from_config(dict(input_recorder='block_in'))
    outputs = ModuleOutputsRecorder('blocks.{i}.attn').attach(student)
    with ModuleInputsRecorder('blocks.{i}').attach(teacher) as block_in:
        recorders = dict(block_in=block_in, attn_out=outputs)
        forcing.check(student, teacher, recorders)
        with pytest.raises(DistillationConfigError, match='needs a bare backbone student'):
            forcing.check(student, teacher, recorders, bare_backbone=False)
        with pytest.raises(DistillationConfigError,
                           match=r"student module 'blocks.0' \(Identity\) has no forward_attn"):
            forcing.check(_blocks_without_forward_attn(), teacher, recorders)
        images = torch.randn(2, 3, IMG_SIZE, IMG_SIZE)
        outputs.enabled = True
        with torch.no_grad():
            teacher(images)
            teacher_inputs = block_in.get()
            forcing.forward_student(student, block_in, images)
        recorded = outputs.get()
    outputs.detach()
    for i, x in enumerate(teacher_inputs):
        blk = student.blocks[i]
        # independent: the attention of block i on norm1 of the teacher's input of block i
        expected = blk.attn(blk.norm1(x), (GRID, GRID), student.num_prefix_tokens)
        torch.testing.assert_close(recorded[i], expected, rtol=0, atol=0)


def test_teacher_forcing_refuses_a_single_module_input_recorder():
    """A plain ``'blocks.1'`` recorder holds teacher block 1's input at index 0: student block
    0 would run on it (the index the recorder resolves to), so it is refused at the check,
    with the template that forces block 1 alone; that template passes."""
    student, teacher = tiny_vit(attn_cfg='elu'), tiny_vit()
    forcing = TeacherForcing.from_config(dict(input_recorder='block_in'))
    outputs = ModuleOutputsRecorder('blocks.{i}.attn').attach(student)
    with ModuleInputsRecorder('blocks.1').attach(teacher) as block_in:
        assert block_in.indices == [0]  # what forward_student would pair with student block 0
        with pytest.raises(DistillationConfigError,
                           match=r"records 'blocks.1', a single module.*needs a \{i\} template"):
            forcing.check(student, teacher, dict(block_in=block_in, attn_out=outputs))
    with ModuleInputsRecorder('blocks.{i}', indices=[1]).attach(teacher) as block_in:
        assert block_in.indices == [1]
        forcing.check(student, teacher, dict(block_in=block_in, attn_out=outputs))
    outputs.detach()


def test_stage1_with_layer_scale_matches_the_scaled_branch():
    """The README's restore option for AdaLA Stage 1 on a LayerScale teacher (DINOv2): the
    matched quantity becomes ls1(attn(norm1(x_i))), the branch the residual adds, instead of
    the attention output (the two weightings differ by gamma^2)."""
    cfg = stage1_model_cfg()
    cfg['teacher_forcing']['with_layer_scale'] = True
    cfg['teacher_recorders']['attn_out']['source'] = 'blocks.{i}.ls1'
    cfg['student_recorders']['attn_out']['source'] = 'blocks.{i}.ls1'
    model = MODELS.build(cfg)
    model.init_weights()
    torch.manual_seed(1)
    for side in (model.student, model.teacher):
        for blk in side.blocks:
            assert blk.ls1.gamma.shape == (16, )  # the tiny DINOv2 keeps its LayerScale
            blk.ls1.gamma.data.uniform_(0.1, 2.0)
    images = torch.randn(2, 3, IMG_SIZE, IMG_SIZE)
    model.train()
    loss = model.loss(images)['distill.loss_attn_out']
    # independent: teacher block inputs by hooks written here, the MSE of the scaled branches
    inputs = []
    hooks = [blk.register_forward_pre_hook(lambda m, a: inputs.append(a[0]))
             for blk in model.teacher.blocks]
    with torch.no_grad():
        model.teacher(images)
    for hook in hooks:
        hook.remove()
    grid, prefix = (GRID, GRID), model.student.num_prefix_tokens
    with torch.no_grad():
        per_block = []
        for x, s_blk, t_blk in zip(inputs, model.student.blocks, model.teacher.blocks):
            s_out = s_blk.ls1.gamma * s_blk.attn(s_blk.norm1(x), grid, prefix)
            t_out = t_blk.ls1.gamma * t_blk.attn(t_blk.norm1(x), grid, prefix)
            per_block.append(((s_out - t_out)**2).mean())
    expected = torch.stack(per_block).mean()
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=0)
    # the default (no layer scale) differs on these gammas
    assert model.teacher_forcing.with_layer_scale
    model_default = MODELS.build(stage1_model_cfg())
    model_default.load_state_dict(model.state_dict(), strict=False)
    model_default.teacher.load_state_dict(model.teacher.state_dict())
    model_default.train()
    other = model_default.loss(images)['distill.loss_attn_out'].detach()
    assert not torch.allclose(other, expected, rtol=1e-3)


def _blocks_without_forward_attn() -> nn.Module:
    """A 'student' with two blocks (matching the tiny teacher's depth) and no forward_attn."""
    student = nn.Module()
    student.blocks = nn.ModuleList([nn.Identity(), nn.Identity()])
    student.patch_size, student.num_prefix_tokens = PATCH, 1
    return student


# ---------------------------------------------------------------- patch masking
def reference_masks(batch, num_patches, ratio, seed, step, rank):
    """The mask stream of the Linearizer runs, written out here: resumed runs must draw
    exactly the masks their first part would have drawn.  (Since the audit s11 seeding F1 fix:
    SeedSequence(seed, spawn_key=('mask' tag, step, rank)); the former linear formula
    ``seed * 1_000_003 + step * 1_009 + rank`` aliased (step, rank + 1009) with (step + 1, rank).)"""
    generator = torch.Generator()
    generator.manual_seed(int(np.random.SeedSequence(
        seed, spawn_key=(0x6D61736B, step, rank)).generate_state(1, np.uint64)[0]))
    order = torch.rand(batch, num_patches, generator=generator).argsort(dim=1)
    num_masked = num_patches - int(num_patches * (1 - ratio))  # MAE's count (kept: the int)
    mask = torch.zeros(batch, num_patches, dtype=torch.bool)
    for b in range(batch):
        mask[b, order[b, :num_masked]] = True
    return mask


@pytest.mark.parametrize('ratio, seed, step, rank', [(0.75, 0, 0, 0), (0.5, 3, 17, 1),
                                                     (0.0, 1, 2, 0)])
def test_mask_stream_is_unchanged(ratio, seed, step, rank):
    mask = sample_patch_mask(3, 49, ratio, seed, step, rank)
    assert torch.equal(mask, reference_masks(3, 49, ratio, seed, step, rank))
    assert (mask.sum(1) == 49 - int(49 * (1 - ratio))).all()  # 0.5: 25 masked, 24 kept
    # the component: corner-padded grid of a 26 x 27 input with 4-pixel patches is 7 x 7
    masking = PatchMasking(ratio=ratio, seed=seed)
    inputs = torch.zeros(3, 3, 26, 27)
    assert torch.equal(masking.sample(inputs, 4, step, rank), mask)
    if ratio > 0:  # control: another step or rank draws other masks
        assert not torch.equal(masking.sample(inputs, 4, step + 1, rank), mask)
        assert not torch.equal(masking.sample(inputs, 4, step, rank + 1), mask)


def test_model_masks_follow_its_step_counter():
    """The model draws from (seed, mask_step, rank) and advances the step in training."""
    model = MODELS.build(linearizer_model(patch_masking=dict(ratio=0.75, seed=5)))
    x = torch.randn(2, 3, IMG_SIZE, IMG_SIZE)
    model.mask_step.fill_(4)
    for step in (4, 5):
        expected = reference_masks(2, GRID * GRID, 0.75, 5, step, 0)
        assert torch.equal(model._sample_patch_mask(x, advance=True), expected)
    assert int(model.mask_step) == 6


def test_patch_masking_checks():
    with pytest.raises(DistillationConfigError, match=r'ratio must be in \[0, 1\), got 1.0'):
        PatchMasking.from_config(dict(ratio=1.0))
    with pytest.raises(DistillationConfigError, match=r"unknown keys \['mask_ratio'\]"):
        PatchMasking.from_config(dict(mask_ratio=0.5))
    masking = PatchMasking()
    with pytest.raises(DistillationConfigError, match=r'forward_tokens\(x, patch_mask, '
                       r'mask_token\); Linear does not'):
        masking.check(nn.Linear(2, 2))
    with pytest.raises(DistillationConfigError, match='no teacher forcing'):
        masking.check(tiny_vit(), teacher_forcing=True)
    with pytest.raises(DistillationConfigError, match='needs a bare backbone'):
        masking.check(tiny_vit(), bare_backbone=False)
    masking.check(tiny_vit())
    token = masking.make_mask_token(tiny_vit())
    assert isinstance(token, nn.Parameter) and token.shape == (1, 16)
    assert PatchMasking(use_student_mask_token=True).make_mask_token(tiny_vit()) is None
    # through the model: teacher forcing and masking exclude each other
    cfg = stage1_model_cfg()
    cfg['patch_masking'] = dict(ratio=0.5)
    with pytest.raises(DistillationConfigError, match='no teacher forcing'):
        MODELS.build(cfg)


# ---------------------------------------------------------------- teacher input norm
def test_teacher_input_norm_module_matches_a_plain_normalisation():
    from mmlinvit.models.distill import TeacherInputNorm
    pre = MODELS.build(dict(type='ClsDataPreprocessor', mean=[10.0, 20.0, 30.0],
                            std=[2.0, 4.0, 8.0]))
    norm = TeacherInputNorm.from_config(dict(mean=[1.0, 2.0, 3.0], std=[5.0, 6.0, 7.0]), pre)
    pixels = torch.rand(2, 3, 5, 5) * 255
    student_batch = (pixels - torch.tensor([10.0, 20.0, 30.0]).view(1, 3, 1, 1)) / torch.tensor(
        [2.0, 4.0, 8.0]).view(1, 3, 1, 1)
    expected = (pixels - torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1)) / torch.tensor(
        [5.0, 6.0, 7.0]).view(1, 3, 1, 1)
    torch.testing.assert_close(norm(student_batch, pre), expected, rtol=1e-5, atol=1e-5)
    assert norm(student_batch.half(), pre).dtype == torch.half
    assert norm.stats == dict(mean=[1.0, 2.0, 3.0], std=[5.0, 6.0, 7.0])
    assert not norm.state_dict()  # rebuilt from the config, never saved
    with pytest.raises(DistillationConfigError, match="'mean' and 'std'"):
        TeacherInputNorm.from_config(dict(mean=[1.0, 2.0, 3.0], std=[5.0, 6.0, 7.0], eps=1),
                                     pre)
