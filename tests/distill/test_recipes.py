"""Every recipe config builds and trains a few iterations through ``Runner.from_cfg``.

The AdaLA stages are chained as in real use: Stage 2 starts from the Stage-1 checkpoint
(``load_from``), Stage 3 loads the ``student.*`` keys of the Stage-2 checkpoint.  The earlier
stages are module fixtures, so every test stands alone (``-k``, any order): a Stage-3 test run
by itself trains Stages 1 and 2 first.
"""
import math
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

from mmlinvit.layers.attention import ATTENTION_OPERATORS
from distill_testing import (CONFIGS, COPY_MLP_CONFIGS, RECIPE_CONFIGS, LossRecorderHook,
                             save_tiny_vit_checkpoint, shrink_config, tiny_arch,
                             write_image_folder)


@pytest.fixture(scope='module')
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp('distill_recipes')
    data = write_image_folder(str(root / 'data'), num_per_class=2)
    ckpts = dict(
        dinov2=save_tiny_vit_checkpoint(str(root / 'dinov2_tiny.pth'), family='dinov2'),
        deit=save_tiny_vit_checkpoint(str(root / 'deit_tiny.pth'), family='deit', seed=1),
        clip=save_tiny_vit_checkpoint(str(root / 'clip_tiny.pth'), family='clip', seed=2,
                                      arch=tiny_arch(embed_dims=24)),
    )
    return dict(root=root, data=data, ckpts=ckpts)


def run_recipe(name, assets, **shrink_kwargs):
    cfg = Config.fromfile(osp.join(CONFIGS, name))
    work_dir = str(assets['root'] / osp.splitext(osp.basename(name))[0])
    shrink_config(cfg, assets['data'], work_dir, **shrink_kwargs)
    runner = Runner.from_cfg(cfg)
    recorder = LossRecorderHook()
    runner.register_hook(recorder)
    runner.train()
    assert recorder.history, 'no training iteration ran'
    for step in recorder.history:
        assert all(math.isfinite(v) for v in step.values()), step
    ckpt = torch.load(osp.join(work_dir, 'epoch_1.pth'), map_location='cpu', weights_only=False)
    assert not any(k.startswith('teacher.') for k in ckpt['state_dict'])
    return runner, recorder.history, ckpt


@pytest.fixture(scope='module')
def stage1(assets):
    """AdaLA Stage 1 on the tiny DINOv2 pair: dict(work_dir, history, ckpt)."""
    ckpts = assets['ckpts']
    _, history, ckpt = run_recipe(RECIPE_CONFIGS[0], assets, student_ckpt=ckpts['dinov2'],
                                  teacher_ckpt=ckpts['dinov2'])
    work_dir = str(assets['root'] / osp.splitext(osp.basename(RECIPE_CONFIGS[0]))[0])
    return dict(work_dir=work_dir, history=history, ckpt=ckpt)


@pytest.fixture(scope='module')
def stage2(assets, stage1):
    """AdaLA Stage 2 started from the Stage-1 checkpoint: dict(work_dir, history)."""
    stage1_ckpt = osp.join(stage1['work_dir'], 'epoch_1.pth')
    cfg = Config.fromfile(osp.join(CONFIGS, RECIPE_CONFIGS[1]))
    assert cfg.load_from.endswith('epoch_4.pth')
    # re-run with the tiny Stage-1 checkpoint as load_from
    work_dir = str(assets['root'] / 'stage2')
    shrink_config(cfg, assets['data'], work_dir, teacher_ckpt=assets['ckpts']['dinov2'])
    cfg.load_from = stage1_ckpt
    runner = Runner.from_cfg(cfg)
    recorder = LossRecorderHook()
    runner.register_hook(recorder)
    runner.train()
    return dict(work_dir=work_dir, history=recorder.history, stage1_ckpt=stage1_ckpt)


@pytest.mark.parametrize('load', ['student_backbone.pth', 'epoch_1.pth'])
def test_stage2_load_from_must_give_the_student_its_weights(assets, stage1, load, tmp_path):
    """The exported Stage-1 backbone given as Stage 2's load_from (keys without 'student.')
    loaded nothing with strict=False: Stage 2 trained a random student (34 of 63 tensors at
    their initialisation in the audit) and exited 0. tools/train.py's runner now refuses it
    with the fix; the runner checkpoint still trains."""
    from mmlinvit.engine.checkpoint_coverage import CheckpointCoverageError
    from mmlinvit.engine.launch import build_runner
    cfg = Config.fromfile(osp.join(CONFIGS, RECIPE_CONFIGS[1]))
    shrink_config(cfg, assets['data'], str(tmp_path / 'work'),
                  teacher_ckpt=assets['ckpts']['dinov2'])
    cfg.load_from = osp.join(stage1['work_dir'], load)
    runner = build_runner(cfg)
    if load == 'epoch_1.pth':
        runner.train()
        return
    with pytest.raises(CheckpointCoverageError,
                       match=r"holds 0 of the \d+ weights of the trainable backbone 'student'"
                             r".*bare backbone.*model\.student\.pretrained=PATH"):
        runner.train()


def test_adala_stage1(assets, stage1):
    ckpts = assets['ckpts']
    history, ckpt = stage1['history'], stage1['ckpt']
    assert {'distill.loss_attn_out', 'distill.gap_attn_out'} <= set(history[0])
    # only the attention weights moved away from the DINOv2 initialisation
    init = torch.load(ckpts['dinov2'])
    state = ckpt['state_dict']
    assert not torch.equal(state['student.blocks.0.attn.qkv.weight'],
                           init['blocks.0.attn.qkv.weight'])
    assert torch.equal(state['student.blocks.0.mlp.fc1.weight'], init['blocks.0.mlp.fc1.weight'])
    assert torch.equal(state['student.patch_embed.proj.weight'], init['patch_embed.proj.weight'])


def test_adala_stage2_starts_from_stage1(stage2):
    work_dir = stage2['work_dir']
    history = stage2['history']
    stage1_state = torch.load(stage2['stage1_ckpt'], map_location='cpu',
                              weights_only=False)['state_dict']
    assert {'distill.loss_feat', 'distill.gap_feat'} <= set(history[0])
    # the first step's student is the Stage-1 student: its final features differ from the
    # teacher's (no longer identical weights), and everything trains in Stage 2
    state = torch.load(osp.join(work_dir, 'epoch_1.pth'), map_location='cpu',
                       weights_only=False)['state_dict']
    moved = [k for k in state if not torch.equal(state[k], stage1_state[k])]
    assert any('mlp' in k for k in moved) and any('attn' in k for k in moved)


@pytest.mark.parametrize('name', RECIPE_CONFIGS[2:4])
def test_adala_stage3_loads_the_stage2_student(assets, stage2, name):
    stage2_dir = stage2['work_dir']
    exported = osp.join(stage2_dir, 'student_backbone.pth')
    runner, history, ckpt = run_recipe(name, assets, student_ckpt=exported)
    stage2_state = torch.load(osp.join(stage2_dir, 'epoch_1.pth'), map_location='cpu',
                              weights_only=False)['state_dict']
    state = ckpt['state_dict']
    assert 'student.loss' not in history[0] and 'loss' in history[0]
    frozen = 'linear-probe' in name  # the frozen-backbone Stage-3 variant
    same = torch.equal(state['backbone.blocks.1.attn.qkv.weight'],
                       stage2_state['student.blocks.1.attn.qkv.weight'])
    assert same == frozen
    if frozen:
        for key, value in state.items():
            if key.startswith('backbone.'):
                assert torch.equal(value, stage2_state['student.' + key[len('backbone.'):]]), key


@pytest.mark.parametrize('name', COPY_MLP_CONFIGS)
def test_copy_mlp_distill_attn(assets, name):
    runner, history, ckpt = run_recipe(name, assets, teacher_ckpt=assets['ckpts']['deit'])
    with_distill = 'distill-attn' in osp.basename(name)
    assert 'student.loss' in history[0]
    assert ('distill.loss_attn_out' in history[0]) == with_distill
    if with_distill:
        assert history[0]['loss'] == pytest.approx(
            history[0]['student.loss'] + history[0]['distill.loss_attn_out'], rel=1e-5)
    # MLPCopy: the MLP of the (never trained) teacher checkpoint was the starting point
    report = runner.model.transfer_report
    assert 'blocks.0.mlp.fc1.weight' in report.copied
    assert 'blocks.0.attn.qkv.weight' not in report.copied
    operator = osp.basename(name).split('_')[1].split('-')[-1]  # ..._deit-b-mhla_...
    backbone = runner.model.student_backbone()
    assert isinstance(backbone.blocks[0].attn, ATTENTION_OPERATORS.get(operator))
    if operator in ('mhla', 'ttt'):  # the paper's setting, distilled on patch tokens
        assert not backbone.with_cls_token and backbone.num_prefix_tokens == 0
        assert backbone.pos_embed_type == 'sincos' and backbone.pos_embed is None
        assert backbone.out_type == 'avg_featmap'
        assert runner.model.distill_losses['attn_out'].patch_tokens_only
    assert 'student.head.fc.weight' in ckpt['state_dict']
    # validation ran through the student (predict delegation)
    assert any(k.startswith('val/accuracy') for k in runner.message_hub.log_scalars)


def test_linearizer(assets):
    runner, history, ckpt = run_recipe(RECIPE_CONFIGS[8], assets,
                                       teacher_ckpt=assets['ckpts']['clip'],
                                       teacher_width=24)
    assert {'distill.loss_act', 'distill.loss_mask', 'distill.gap_act',
            'distill.gap_mask'} <= set(history[0])
    state = ckpt['state_dict']
    assert state['connectors.proj.linear.weight'].shape == (24, 16)
    assert 'mask_token' in state and int(state['mask_step']) == len(history)


def test_stage2_exports_the_student_and_its_checkpoint_keys_strip(assets, stage2):
    from mmlinvit.backbones import LinearVisionTransformer
    from mmlinvit.converters import load_pretrained
    stage2_dir = stage2['work_dir']
    runner_state = torch.load(osp.join(stage2_dir, 'epoch_1.pth'), map_location='cpu',
                              weights_only=False)['state_dict']
    exported = torch.load(osp.join(stage2_dir, 'student_backbone.pth'), weights_only=True)
    assert set(exported) == {k[len('student.'):] for k in runner_state if k.startswith('student.')}
    # a runner checkpoint's weights, re-saved without training state, load with 'student.'
    # stripped by mmlinvit.converters
    weights_only = str(assets['root'] / 'stage2_weights.pth')
    torch.save(runner_state, weights_only)
    # as the Stage-3 configs build it: no mask token (Stage 2 trained without one)
    backbone = LinearVisionTransformer(arch=tiny_arch(), family='dinov2', patch_size=4,
                                       img_size=16, with_mask_token=False)
    assert 'mask_token' not in exported
    report = load_pretrained(backbone, weights_only)
    assert report.loaded == len(exported)
    for key, value in backbone.state_dict().items():
        assert torch.equal(value, exported[key]), key
    # the exported ELU student says so; a softmax ViT refuses it instead of computing softmax
    # attention with ELU-trained weights
    from mmlinvit.backbones import VisionTransformer
    from mmlinvit.backbones.training_record import decode_names
    from mmlinvit.backbones.vit import AttentionOperatorMismatchError
    assert set(decode_names(exported['block_operators'])) == {'elu'}
    softmax = VisionTransformer(arch=tiny_arch(), family='dinov2', patch_size=4, img_size=16,
                                pretrained=osp.join(stage2_dir, 'student_backbone.pth'))
    with pytest.raises(AttentionOperatorMismatchError, match="attn_cfg='elu'"):
        softmax.init_weights()
