"""DistillLossScheduleHook (switch off / ramp a term) and the NaN stop, inside a Runner."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

from mmlinvit.engine.hooks import DistillLossScheduleHook

from distill_testing import CONFIGS, LossRecorderHook, shrink_config, write_image_folder


def test_factor_switch_and_ramp():
    switch = DistillLossScheduleHook('attn_out', begin=3)
    assert [switch.factor(t) for t in (0, 2, 3, 10)] == [1.0, 1.0, 0.0, 0.0]
    ramp = DistillLossScheduleHook(['a', 'b'], begin=2, end=6, start_factor=0.0, end_factor=1.0)
    assert [ramp.factor(t) for t in (0, 2, 3, 4, 6, 9)] == [0.0, 0.0, 0.25, 0.5, 1.0, 1.0]
    with pytest.raises(ValueError, match='begin <= end'):
        DistillLossScheduleHook('a', begin=5, end=2)


def _stage1_cfg(tmp_path, custom_hooks):
    cfg = Config.fromfile(
        osp.join(CONFIGS, 'adala/vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512.py'))
    data = write_image_folder(str(tmp_path / 'data'), num_per_class=2)
    shrink_config(cfg, data, str(tmp_path / 'work'), max_epochs=2)
    cfg.custom_hooks = custom_hooks
    return cfg


def test_hook_stops_a_term_at_an_iteration(tmp_path):
    cfg = _stage1_cfg(tmp_path, [dict(type='mmlinvit.DistillLossScheduleHook', terms='attn_out',
                                      begin=2, start_factor=1.0, end_factor=0.0)])
    runner = Runner.from_cfg(cfg)
    recorder = LossRecorderHook()
    runner.register_hook(recorder)
    runner.train()
    steps = recorder.history  # 4 images, batch 2, 2 epochs
    assert [s['iter'] for s in steps] == [0, 1, 2, 3]
    for step in steps:
        index = step['iter']
        assert step['distill.gap_attn_out'] > 0
        if index < 2:
            assert step['distill.loss_attn_out'] == pytest.approx(step['distill.gap_attn_out'])
        else:
            assert step['distill.loss_attn_out'] == 0.0 and step['loss'] == 0.0


def test_hook_ramps_by_epoch_and_rejects_unknown_terms(tmp_path):
    cfg = _stage1_cfg(tmp_path, [dict(type='mmlinvit.DistillLossScheduleHook', terms=['attn_out'],
                                      by_epoch=True, begin=0, end=2, start_factor=0.5,
                                      end_factor=1.0)])
    runner = Runner.from_cfg(cfg)
    recorder = LossRecorderHook()
    runner.register_hook(recorder)
    runner.train()
    ratios = [s['distill.loss_attn_out'] / s['distill.gap_attn_out'] for s in recorder.history]
    assert ratios[:2] == pytest.approx([0.5] * 2) and ratios[2:] == pytest.approx([0.75] * 2)

    cfg = _stage1_cfg(tmp_path / 'bad', [dict(type='mmlinvit.DistillLossScheduleHook',
                                              terms='attn', begin=1)])
    runner = Runner.from_cfg(cfg)
    with pytest.raises(KeyError, match=r"Unknown distill term 'attn'.*attn_out"):
        runner.train()


class _PoisonHook(Hook):
    """Writes a NaN into a student attention weight before iteration 1."""

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == 1:
            with torch.no_grad():
                runner.model.student.blocks[0].attn.proj.weight[0, 0] = float('nan')


def test_nan_loss_stops_training_naming_the_term(tmp_path):
    runner = Runner.from_cfg(_stage1_cfg(tmp_path, []))
    recorder = LossRecorderHook()
    runner.register_hook(recorder)
    runner.register_hook(_PoisonHook())
    with pytest.raises(FloatingPointError, match=r"'distill\.loss_attn_out' is not finite"):
        runner.train()
    assert [s['iter'] for s in recorder.history] == [0]


def test_export_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    """A write that dies half-way leaves the previous student_backbone.pth intact."""
    from types import SimpleNamespace

    from mmlinvit.backbones import VisionTransformer
    from mmlinvit.engine.hooks import ExportStudentHook
    student = VisionTransformer(dict(embed_dims=16, num_layers=1, num_heads=2,
                                     mlp_hidden_dims=32), img_size=16, patch_size=8)
    model = SimpleNamespace(student_backbone=lambda: student)
    runner = SimpleNamespace(model=model, work_dir=str(tmp_path))
    hook = ExportStudentHook()
    hook.before_save_checkpoint(runner, dict(meta=dict(epoch=1, iter=10)))
    path = tmp_path / 'student_backbone.pth'
    first = torch.load(path, weights_only=True)
    real_save = torch.save

    def dies_half_way(obj, f, *args, **kwargs):
        with open(f, 'wb') as out:
            out.write(b'PK\x03\x04 truncated')
        raise OSError('disk full')

    with torch.no_grad():
        student.cls_token.add_(1.0)
    monkeypatch.setattr(torch, 'save', dies_half_way)
    with pytest.raises(OSError, match='disk full'):
        hook.before_save_checkpoint(runner, dict(meta=dict(epoch=2, iter=20)))
    monkeypatch.setattr(torch, 'save', real_save)
    kept = torch.load(path, weights_only=True)
    assert kept.keys() == first.keys()
    assert all(torch.equal(kept[k], first[k]) for k in first)
