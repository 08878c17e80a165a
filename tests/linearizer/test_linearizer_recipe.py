"""The Adventurer ViT-Linearizer recipe end to end through mmengine runners (CPU, tiny sizes):

distillation (tiny CLIP-layout teacher -> tiny Adventurer, the real config's losses, masking
and connector) overfitting one fixed batch -> the exported student -> ImageNet-style
fine-tuning and UPerNet on ADE20K / Cityscapes layouts, each loading the distilled weights.
"""
import math
import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner

from mmlinvit.backbones import Adventurer
from linearizer_testing import (IMG_SIZE, PATCH, REPO, UPERNET_CONFIGS, LossRecorderHook,
                                load_seg_helpers, save_tiny_clip_teacher, student_arch,
                                tiny_distill_config, tiny_finetune_config, write_images)

DISTILL_ITERS = 20


class BackboneSnapshotHook(Hook):
    """Keeps a copy of the backbone weights right after the runner initialised them."""

    priority = 'VERY_HIGH'

    def __init__(self, path: str) -> None:
        self.path = path
        self.state = None

    def before_train(self, runner) -> None:
        backbone = runner.model.get_submodule(self.path)
        self.state = {k: v.detach().clone() for k, v in backbone.state_dict().items()}


@pytest.fixture(scope='module')
def distilled(tmp_path_factory):
    root = tmp_path_factory.mktemp('linearizer')
    data = write_images(str(root / 'data'))
    teacher = save_tiny_clip_teacher(str(root / 'clip_tiny.pth'))
    work_dir = str(root / 'distill')
    cfg = tiny_distill_config(data, work_dir, teacher, iters=DISTILL_ITERS)
    runner = Runner.from_cfg(cfg)
    init_mask_token = runner.model.student.mask_token.detach().clone()
    recorder = LossRecorderHook()
    runner.register_hook(recorder)
    runner.train()
    return dict(root=root, data=data, work_dir=work_dir, history=recorder.history,
                runner=runner, init_mask_token=init_mask_token,
                ckpt=osp.join(work_dir, f'epoch_{DISTILL_ITERS}.pth'),
                exported=osp.join(work_dir, 'student_backbone.pth'))


def _mean(values):
    return sum(values) / len(values)


def test_distillation_both_terms_decrease_on_a_fixed_batch(distilled):
    history = distilled['history']
    assert len(history) == DISTILL_ITERS
    act = [h['distill.loss_act'] for h in history]
    mask = [h['distill.loss_mask'] for h in history]
    for step in history:
        assert all(math.isfinite(v) for v in step.values()), step
    assert min(act) > 1e-4 and min(mask) > 1e-3  # both terms are non-zero throughout
    # L = L_act + 1 * L_mask: the total is the sum of the two weighted terms
    for step in history:
        assert step['loss'] == pytest.approx(step['distill.loss_act'] + step['distill.loss_mask'],
                                             rel=1e-5)
    print(f'\nL_act  {act[0]:.4f} -> {act[-1]:.4f}\nL_mask {mask[0]:.4f} -> {mask[-1]:.4f}')
    assert _mean(act[-5:]) < 0.7 * _mean(act[:5])
    assert _mean(mask[-5:]) < 0.95 * _mean(mask[:5])
    assert act[-1] < act[0] and mask[-1] < mask[0]


def test_distillation_checkpoint_and_export(distilled):
    state = torch.load(distilled['ckpt'], map_location='cpu', weights_only=False)['state_dict']
    assert not any(k.startswith('teacher.') for k in state)
    width = student_arch()['embed_dims']
    assert state['connectors.proj.linear.weight'].shape == (24, width)  # student -> teacher
    # the student's own mask token trained; the wrapper holds none
    assert 'mask_token' not in state and 'student.mask_token' in state
    assert not torch.equal(state['student.mask_token'], distilled['init_mask_token'])
    assert int(state['mask_step']) == DISTILL_ITERS

    exported = torch.load(distilled['exported'], weights_only=True)
    assert set(exported) == {k[len('student.'):] for k in state if k.startswith('student.')}
    assert not any(k.startswith(('connectors', 'teacher')) for k in exported)
    for key, value in exported.items():
        assert torch.equal(value, state['student.' + key]), key


def test_export_tool_and_distillation_checkpoints_load_into_adventurer(distilled, tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'mmlinvit_tool_export_student',
        osp.join(REPO, 'tools', 'model_converters', 'export_student.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = str(tmp_path / 'student.pth')
    # a runner checkpoint reads safely (training state as inert stand-ins): no flag needed
    assert tool.main([distilled['ckpt'], out]) == 0
    exported = torch.load(distilled['exported'], weights_only=True)
    from_tool = torch.load(out, weights_only=True)
    assert set(from_tool) == set(exported)
    assert all(torch.equal(from_tool[k], exported[k]) for k in exported)

    def adventurer(pretrained, **kwargs):
        return Adventurer(arch=student_arch(), img_size=IMG_SIZE, patch_size=PATCH,
                          pretrained=pretrained, **kwargs)

    # the runner checkpoint itself as pretrained= (what the linear-head config's comment
    # offers): its training state is read as inert stand-ins, the student loads
    direct = adventurer(distilled['ckpt'], with_mask_token=False)
    direct.init_weights()
    for key, value in direct.state_dict().items():
        assert torch.equal(value, exported[key]), key
    # its weights ('student.*', connector, mask_step) load directly, with a report
    weights = str(tmp_path / 'weights.pth')
    torch.save(torch.load(distilled['ckpt'], map_location='cpu',
                          weights_only=False)['state_dict'], weights)
    model = adventurer(weights, with_mask_token=False)
    model.init_weights()
    report = model.load_report
    assert report.prefix == 'student.' and report.loaded == len(exported) - 1
    assert {'connectors.proj.linear.weight', 'connectors.proj.linear.bias', 'mask_step',
            'student.mask_token'} <= set(report.dropped)
    assert 'connectors' in report.summary()
    for key, value in model.state_dict().items():
        assert torch.equal(value, exported[key]), key
    # the exported student records the flips it was distilled with ('paper', the config's);
    # a model built with other flips refuses it
    from mmlinvit.backbones.adventurer import FlipScheduleMismatchError
    assert exported['flipped_blocks'].tolist() == [i % 2 == 1 for i in range(len(model.layers))]
    with pytest.raises(FlipScheduleMismatchError, match="flip_schedule='paper'"):
        adventurer(distilled['exported'], flip_schedule='official').init_weights()


def test_finetune_config_starts_from_the_distilled_student(distilled, tmp_path):
    cfg = tiny_finetune_config(distilled['data'], str(tmp_path), distilled['exported'])
    runner = Runner.from_cfg(cfg)
    snapshot = BackboneSnapshotHook('backbone')
    runner.register_hook(snapshot)
    recorder = LossRecorderHook()
    runner.register_hook(recorder)
    runner.train()
    assert len(recorder.history) == 2 and all(math.isfinite(h['loss']) for h in recorder.history)
    exported = torch.load(distilled['exported'], weights_only=True)
    assert set(snapshot.state) == set(exported) - {'mask_token'}
    for key, value in snapshot.state.items():
        assert torch.equal(value, exported[key]), key
    assert 'accuracy/top1' in runner.message_hub.log_scalars or any(
        k.startswith('val/accuracy') for k in runner.message_hub.log_scalars)
    # no weight decay on the Mamba-2 dt bias, A_log and D skip; decay on the projections
    names = {id(p): n for n, p in runner.model.named_parameters()}
    decay = {names[id(p)]: g['weight_decay'] for g in runner.optim_wrapper.param_groups
             for p in g['params'] if id(p) in names}
    for suffix in ('mixer.dt_bias', 'mixer.A_log', 'mixer.D'):
        assert decay[f'backbone.layers.0.{suffix}'] == 0.0, suffix
    assert decay['backbone.layers.0.mixer.in_proj.weight'] > 0.0


@pytest.mark.parametrize('rel', UPERNET_CONFIGS)
def test_upernet_configs_load_the_distilled_student(distilled, rel, tmp_path):
    from mmlinvit.datasets import make_ade20k_layout, make_cityscapes_layout
    from mmlinvit.engine.launch import build_runner, prepare_train_config
    seg_helpers = load_seg_helpers()
    if 'cityscapes' in rel:
        root = str(tmp_path / 'cityscapes')
        make_cityscapes_layout(root, num_train=2, num_val=1, size=(64, 128), seed=0)
    else:
        root = str(tmp_path / 'ade' / 'ADEChallengeData2016')
        make_ade20k_layout(root, num_train=2, num_val=1, size=(64, 64), seed=0)
    cfg = seg_helpers.tiny_config(rel, root, str(tmp_path / 'work'))
    assert cfg.model.backbone.arch['embed_dims'] == student_arch()['embed_dims']
    cfg.model.backbone.pretrained = distilled['exported']
    cfg.train_cfg['val_begin'] = 2
    cfg.experiment_name = f'test_linearizer_{osp.basename(rel)}_{tmp_path.name}'
    prepare_train_config(cfg, rel, work_dir=str(tmp_path / 'work'))
    runner = build_runner(cfg, mode='train')
    snapshot = BackboneSnapshotHook('backbone')
    runner.register_hook(snapshot)
    runner.train()
    assert runner.iter == 1
    exported = torch.load(distilled['exported'], weights_only=True)
    assert set(snapshot.state) == set(exported) - {'mask_token'}
    for key, value in snapshot.state.items():
        if key not in ('pos_embed', 'pos_embed_grid'):
            assert torch.equal(value, exported[key]), key
    backbone = runner.model.backbone
    # the grid record says the model's grid, not the file's
    assert exported['pos_embed_grid'].tolist() == [IMG_SIZE // PATCH] * 2
    assert snapshot.state['pos_embed_grid'].tolist() == list(backbone.pos_grid)
    report = backbone.load_report
    assert report.prefix == '' and 'mask_token' in report.dropped
    # the distilled 8 x 8 position grid was resampled to the model's grid, in place: the
    # optimizer (built before init_weights) holds the backbone's pos_embed
    grid = backbone.pos_grid
    assert grid != (IMG_SIZE // PATCH, ) * 2 and 'pos_embed resampled' in report.summary()
    assert snapshot.state['pos_embed'].shape == (1, grid[0] * grid[1] + 1, exported[
        'pos_embed'].shape[-1])
    torch.testing.assert_close(snapshot.state['pos_embed'][:, -1], exported['pos_embed'][:, -1])
    optimised = {id(p) for g in runner.optim_wrapper.param_groups for p in g['params']}
    assert id(backbone.pos_embed) in optimised
    metrics = runner.val_loop.run()
    assert 0.0 <= metrics['mIoU'] <= 100.0
