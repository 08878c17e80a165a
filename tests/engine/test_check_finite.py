"""Issue 11 item 1: every tools/train.py run stops at the first non-finite loss or gradient
norm, names it, never writes a non-finite checkpoint and never rotates a good one away for it.

Plain runs of the demo teacher (mmseg EncoderDecoder) and of the Stage-3 classifier
(mmpretrain ImageClassifier), through tools/train.py, with a weight or a gradient made NaN
part-way (:class:`train_testing.PoisonHook`).
"""
import functools
import math
import os
import os.path as osp

import pytest
import torch

from train_testing import (all_finite, dump, load_tool, make_image_folder, make_toy_scenes,
                           read_losses, toy_cls_config, toy_config)

PATCH_WEIGHT = 'backbone.patch_embed.proj.weight'


pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory) -> str:
    return make_toy_scenes(str(tmp_path_factory.mktemp('toy') / 'toy_ade'))


def _last_checkpoint(work_dir: str) -> str:
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        return f.read().strip()


def test_nan_weight_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, toy_root):
    work_dir = str(tmp_path / 'wd')
    cfg = toy_config(toy_root, work_dir, max_iters=12, interval=4, max_keep_ckpts=1)
    path = dump(cfg, str(tmp_path / 'cfg.py'),
                hooks=[dict(type='PoisonHook', at_iter=6, param=PATCH_WEIGHT, what='weight')])
    with pytest.raises(FloatingPointError) as info:
        load_tool('train').main([path, '--work-dir', work_dir])
    message = str(info.value)
    assert 'iteration 6' in message and 'loss' in message and 'nan' in message
    assert 'iter_4.pth' in message  # where to resume from
    # the good checkpoint survives max_keep_ckpts=1; no NaN checkpoint was written
    assert osp.isfile(osp.join(work_dir, 'iter_4.pth'))
    assert all_finite(osp.join(work_dir, 'iter_4.pth'))
    assert not osp.exists(osp.join(work_dir, 'iter_8.pth'))
    assert _last_checkpoint(work_dir).endswith('iter_4.pth')


def test_nan_gradient_with_finite_loss_names_the_gradient_norm(tmp_path, toy_root):
    # The demo clips gradients (clip_grad max_norm=1.0): mmengine logs grad_norm.
    work_dir = str(tmp_path / 'wd')
    cfg = toy_config(toy_root, work_dir, max_iters=12, interval=4)
    path = dump(cfg, str(tmp_path / 'cfg.py'),
                hooks=[dict(type='PoisonHook', at_iter=6, param=PATCH_WEIGHT, what='grad')])
    with pytest.raises(FloatingPointError, match=r'grad_norm=nan.*iteration 6'):
        load_tool('train').main([path, '--work-dir', work_dir])
    assert sorted(p for p in os.listdir(work_dir) if p.endswith('.pth')) == \
        ['iter_4.pth']


def test_nan_weights_without_clipping_are_never_saved(tmp_path, toy_root):
    # No clip_grad: no gradient norm is computed, the NaN gradient of iteration 4 turns the
    # weights NaN in that step; the check before the iteration-4 checkpoint catches them.
    work_dir = str(tmp_path / 'wd')
    cfg = toy_config(toy_root, work_dir, max_iters=8, interval=4)
    cfg.optim_wrapper.clip_grad = None
    path = dump(cfg, str(tmp_path / 'cfg.py'),
                hooks=[dict(type='PoisonHook', at_iter=4, param=PATCH_WEIGHT, what='grad')])
    with pytest.raises(FloatingPointError, match=r'Non-finite model weights \(' +
                       PATCH_WEIGHT.replace('.', r'\.')):
        load_tool('train').main([path, '--work-dir', work_dir])
    assert not osp.exists(osp.join(work_dir, 'iter_4.pth'))


def test_mmpretrain_epoch_run_stops_at_a_nan_weight(tmp_path):
    data = make_image_folder(str(tmp_path / 'data'))
    work_dir = str(tmp_path / 'wd')
    cfg = toy_cls_config(data, work_dir, max_epochs=3)
    cfg.default_hooks.checkpoint.max_keep_ckpts = 1
    # epoch 2 starts at iteration 5
    path = dump(cfg, str(tmp_path / 'cfg.py'),
                hooks=[dict(type='PoisonHook', at_iter=6, param=PATCH_WEIGHT, what='weight')])
    with pytest.raises(FloatingPointError, match=r'Non-finite loss \(loss=nan.*iteration 6'):
        load_tool('train').main([path, '--work-dir', work_dir])
    assert osp.isfile(osp.join(work_dir, 'epoch_1.pth'))
    assert all_finite(osp.join(work_dir, 'epoch_1.pth'))
    assert not osp.exists(osp.join(work_dir, 'epoch_2.pth'))


@pytest.fixture
def cpu_amp(monkeypatch):
    """AmpOptimWrapper refuses CPU-only machines; give it torch's CPU GradScaler."""
    import mmengine.optim.optimizer.amp_optimizer_wrapper as amp
    if not torch.cuda.is_available():
        monkeypatch.setattr(amp, 'is_cuda_available', lambda: True)
        monkeypatch.setattr(amp, 'GradScaler', functools.partial(torch.amp.GradScaler,
                                                                 device='cpu'))


@pytest.mark.usefixtures('cpu_amp')
def test_amp_skipped_steps_stay_allowed(tmp_path, toy_root):
    # With --amp, a non-finite gradient makes the loss scaler skip the step and halve its
    # scale: training goes on with finite weights.
    work_dir = str(tmp_path / 'wd')
    cfg = toy_config(toy_root, work_dir, max_iters=6, interval=3)
    cfg.optim_wrapper.loss_scale = dict(init_scale=1024.0, growth_interval=1000)
    record = str(tmp_path / 'losses.jsonl')
    path = dump(cfg, str(tmp_path / 'cfg.py'),
                hooks=[dict(type='PoisonHook', at_iter=2, param=PATCH_WEIGHT, what='grad'),
                       dict(type='RecordLossesHook', path=record)])
    load_tool('train').main([path, '--work-dir', work_dir, '--amp'])
    losses = read_losses(record)[0]
    assert sorted(losses) == list(range(1, 7))
    assert all(math.isfinite(v['loss']) for v in losses.values())
    ckpt = torch.load(osp.join(work_dir, 'iter_6.pth'), map_location='cpu', weights_only=False)
    assert ckpt['optimizer']['loss_scaler']['scale'] == 512.0  # one skipped step
    assert all_finite(osp.join(work_dir, 'iter_6.pth'))


@pytest.mark.usefixtures('cpu_amp')
def test_amp_run_whose_every_step_is_skipped_stops(tmp_path, toy_root):
    # NaN gradients from iteration 3 on, the loss finite: the scaler skips every step and
    # halves its scale, the weights never change. The run used to finish (exit 0) writing
    # checkpoints of frozen weights; now it stops once the scale is below min_loss_scale.
    work_dir = str(tmp_path / 'wd')
    cfg = toy_config(toy_root, work_dir, max_iters=16, interval=4)
    cfg.optim_wrapper.loss_scale = dict(init_scale=1024.0, growth_interval=1000)
    cfg.custom_hooks = [dict(type='mmlinvit.CheckFiniteHook', min_loss_scale=1.0)]
    path = dump(cfg, str(tmp_path / 'cfg.py'),
                hooks=[dict(type='PoisonHook', at_iter=3, param=PATCH_WEIGHT, what='grad',
                            every_iter_after=True)])
    # 1024 halves at iterations 3, 4, ...: 0.5 < 1 after the 11th skip, iteration 13
    with pytest.raises(FloatingPointError,
                       match=r'loss scale 0\.5 fell below min_loss_scale 1 at iteration 13.*'
                             r'iter_12\.pth.*bfloat16'):
        load_tool('train').main([path, '--work-dir', work_dir, '--amp'])
    assert not osp.exists(osp.join(work_dir, 'iter_16.pth'))




@pytest.mark.usefixtures('cpu_amp')
def test_amp_with_a_static_loss_scale_whose_every_step_is_skipped_stops(tmp_path, toy_root):
    """loss_scale=512.0 (mmdet / mmseg fp16 configs): the scale never falls, so the run went on
    to the end writing checkpoints of weights that had stopped changing, exit 0."""
    work_dir = str(tmp_path / 'wd')
    cfg = toy_config(toy_root, work_dir, max_iters=16, interval=4)
    cfg.optim_wrapper.loss_scale = 512.0
    cfg.custom_hooks = [dict(type='mmlinvit.CheckFiniteHook', max_skipped_steps=5)]
    path = dump(cfg, str(tmp_path / 'cfg.py'),
                hooks=[dict(type='PoisonHook', at_iter=3, param=PATCH_WEIGHT, what='grad',
                            every_iter_after=True)])
    with pytest.raises(FloatingPointError,
                       match=r'skipped the last 5 optimizer steps in a row .*loss scale 512.*'
                             r'at iteration 7.*iter_4\.pth.*loss_scale=.dynamic'):
        load_tool('train').main([path, '--work-dir', work_dir, '--amp'])
    assert not osp.exists(osp.join(work_dir, 'iter_8.pth'))


def test_the_message_names_the_checkpoint_on_disk(tmp_path):
    """In before_save_checkpoint, mmengine's message hub already names the checkpoint being
    refused (iter_8.pth, never written); the message must name last_checkpoint's target."""
    from types import SimpleNamespace

    from mmengine.logging import MessageHub

    from mmlinvit.engine.hooks import CheckFiniteHook
    hub = MessageHub.get_instance('check_finite_message_test')
    hub.update_info('last_ckpt', str(tmp_path / 'iter_8.pth'))
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_4.pth'))
    runner = SimpleNamespace(work_dir=str(tmp_path), message_hub=hub)
    assert CheckFiniteHook._last_checkpoint(runner) == \
        f'the last checkpoint, {tmp_path / "iter_4.pth"}, was written before this'
    (tmp_path / 'last_checkpoint').unlink()
    assert CheckFiniteHook._last_checkpoint(runner) == 'no checkpoint was written yet'


def test_non_finite_ema_weights_are_never_saved(tmp_path, toy_root):
    """With EMAHook at its default priority (NORMAL) the check ran before EMAHook put the
    averaged weights into the file's state_dict, so NaN in them was written unchecked."""
    from mmengine.hooks import EMAHook, Hook
    from mmengine.registry import HOOKS

    @HOOKS.register_module(force=True)
    class PoisonEMAHook(Hook):
        """Makes the averaged patch projection NaN after the EMA update of iteration 4."""

        priority = 'LOW'

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if runner.iter + 1 == 4:
                ema = next(h for h in runner.hooks if isinstance(h, EMAHook))
                with torch.no_grad():
                    ema.ema_model.module.backbone.patch_embed.proj.weight.fill_(math.nan)

    work_dir = str(tmp_path / 'wd')
    cfg = toy_config(toy_root, work_dir, max_iters=4, interval=4)
    path = dump(cfg, str(tmp_path / 'cfg.py'),
                hooks=[dict(type='EMAHook', momentum=0.2), dict(type='PoisonEMAHook')])
    with pytest.raises(FloatingPointError, match=r'checkpoint being saved \(' +
                       PATCH_WEIGHT.replace('.', r'\.') + r' \(EMA\)'):
        load_tool('train').main([path, '--work-dir', work_dir])
    assert not osp.exists(osp.join(work_dir, 'iter_4.pth'))
