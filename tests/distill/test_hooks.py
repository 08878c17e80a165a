"""DistillLossScheduleHook (switch off / ramp a term) and the NaN stop, inside a Runner."""
import logging
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


def test_hook_refuses_epochs_in_an_iteration_loop_and_warns_past_the_end(tmp_path):
    """by_epoch=True in an IterBasedTrainLoop kept the start factor for the whole run (its
    epoch stays 0) with exit 0; a begin past the run's end is warned."""
    from mmengine.logging import MMLogger
    cfg = _stage1_cfg(tmp_path, [dict(type='mmlinvit.DistillLossScheduleHook', terms='attn_out',
                                      by_epoch=True, begin=1)])
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=2)
    with pytest.raises(ValueError, match='iteration-based loop.*by_epoch=False'):
        Runner.from_cfg(cfg).train()
    cfg = _stage1_cfg(tmp_path / 'late', [dict(type='mmlinvit.DistillLossScheduleHook',
                                                terms='attn_out', begin=5)])
    runner = Runner.from_cfg(cfg)
    warned = []
    handler = _ListHandler(warned)
    MMLogger.get_current_instance().addHandler(handler)
    try:
        runner.train()
    finally:
        MMLogger.get_current_instance().removeHandler(handler)
    assert any('begin=5 is not before the run' in m for m in warned), warned


class _ListHandler(logging.Handler):
    def __init__(self, sink):
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record):
        self.sink.append(record.getMessage())


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

    class Holder(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.student = student

        def student_backbone(self):
            return self.student

    model = Holder()
    runner = SimpleNamespace(model=model, work_dir=str(tmp_path))
    hook = ExportStudentHook()

    def checkpoint(epoch):
        return dict(meta=dict(epoch=epoch, iter=10 * epoch), state_dict=model.state_dict())

    hook.before_save_checkpoint(runner, checkpoint(1))
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
        hook.before_save_checkpoint(runner, checkpoint(2))
    monkeypatch.setattr(torch, 'save', real_save)
    kept = torch.load(path, weights_only=True)
    assert kept.keys() == first.keys()
    assert all(torch.equal(kept[k], first[k]) for k in first)


def test_export_holds_the_checkpoint_weights_under_ema(tmp_path):
    """With mmengine's EMAHook the checkpoint, validation and export_student.py hold the
    averaged weights; student_backbone.pth held the live ones (5e-4 apart in the audit).
    Now it equals the tool's export of the same checkpoint and the EMA written out here."""
    import importlib.util
    from mmengine.hooks import Hook as _Hook

    momentum = 0.5  # mmengine: ema = (1 - m) * ema + m * param

    class Snapshots(_Hook):
        priority = 'LOWEST'

        def __init__(self):
            self.states = []

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            self.states.append({k: v.detach().clone()
                                for k, v in runner.model.student.state_dict().items()})

    cfg = _stage1_cfg(tmp_path, [dict(type='mmlinvit.ExportStudentHook'),
                                 dict(type='EMAHook', momentum=momentum)])
    cfg.optim_wrapper.optimizer.lr = 1e-2
    runner = Runner.from_cfg(cfg)
    snapshots = Snapshots()
    runner.register_hook(snapshots)
    runner.train()
    ema = {k: v.clone() for k, v in snapshots.states[0].items()}
    for state in snapshots.states[1:]:
        for key in ema:
            if ema[key].is_floating_point():
                ema[key] = (1 - momentum) * ema[key] + momentum * state[key]
    live = snapshots.states[-1]
    work = tmp_path / 'work'
    exported = torch.load(work / 'student_backbone.pth', weights_only=True)
    spec = importlib.util.spec_from_file_location(
        'export_student_tool', osp.join(osp.dirname(CONFIGS), 'tools', 'model_converters',
                                        'export_student.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    ckpt = torch.load(work / 'epoch_2.pth', map_location='cpu', weights_only=False)
    from_tool, _, _ = tool.select_student_backbone(ckpt['state_dict'])
    assert exported.keys() == from_tool.keys()
    for key in exported:
        assert torch.equal(exported[key], from_tool[key]), key
    key = 'blocks.0.attn.qkv.weight'
    assert (live[key] - ema[key]).abs().max() > 1e-5  # the two differ in this run
    torch.testing.assert_close(exported[key], ema[key], rtol=0, atol=1e-7)
