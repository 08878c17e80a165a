"""Gradient accumulation and the options that count iterations (mmlinvit.engine.accumulation):
``auto_scale_lr`` scales by the effective batch, the EMA momentum and mid-window checkpoints
are warned about with the fix, and ``--amp`` without a device fails before anything is built.
"""
import os.path as osp

import pytest
import torch
from mmengine.model import ExponentialMovingAverage

from mmlinvit.engine.accumulation import adapt_to_accumulation, ema_momentum_per_iteration
from mmlinvit.engine.launch import build_runner

from train_testing import (captured_log, dump, load_tool, make_image_folder, make_toy_scenes,
                           toy_cls_config, toy_config, train_in_process)

pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory) -> str:
    return make_toy_scenes(str(tmp_path_factory.mktemp('toy') / 'toy_ade'))


@pytest.fixture
def log_messages():
    with captured_log() as messages:
        yield messages


@pytest.mark.parametrize('counts', [1, 8])
def test_auto_scale_lr_counts_the_accumulated_batch(tmp_path, toy_root, counts):
    """1 process x batch 2 x accumulative_counts k against base_batch_size 64: the linear
    scaling rule (written here) gives lr x 2k / 64; mmengine alone gave lr x 2 / 64."""
    cfg = toy_config(toy_root, str(tmp_path / 'wd'), batch_size=2)
    base_lr = cfg.optim_wrapper.optimizer.lr
    cfg.optim_wrapper.accumulative_counts = counts
    cfg.auto_scale_lr = dict(enable=True, base_batch_size=64)
    runner = build_runner(cfg)
    wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    runner.scale_lr(wrapper, runner.auto_scale_lr)
    lrs = {group['lr'] for group in wrapper.optimizer.param_groups}
    assert len(lrs) == 1 and lrs.pop() == pytest.approx(base_lr * 2 * counts / 64)


def test_accumulation_is_applied_once(tmp_path, toy_root):
    cfg = toy_config(toy_root, str(tmp_path / 'wd'))
    cfg.optim_wrapper.accumulative_counts = 4
    cfg.auto_scale_lr = dict(enable=True, base_batch_size=64)
    adapt_to_accumulation(adapt_to_accumulation(cfg))
    assert cfg.auto_scale_lr.base_batch_size == 16


@pytest.mark.parametrize('counts,expected_base', [(1, 64), (4, 16), (8, 8)])
def test_a_saved_config_rerun_with_another_k_scales_against_the_recipe(tmp_path, toy_root,
                                                                     counts, expected_base):
    """mmengine saves the prepared config in the work dir; run again with another k, it was
    scaled against the first run's base / 8 (k=1: lr 8x too high, k=4: 2x)."""
    from mmengine.config import Config
    cfg = toy_config(toy_root, str(tmp_path / 'wd'))
    cfg.optim_wrapper.accumulative_counts = 8
    cfg.auto_scale_lr = dict(enable=True, base_batch_size=64)
    adapt_to_accumulation(cfg)
    saved = Config.fromfile(dump(cfg, str(tmp_path / 'saved.py')))
    saved.optim_wrapper.accumulative_counts = counts
    adapt_to_accumulation(saved)
    assert saved.auto_scale_lr.base_batch_size == expected_base
    # a base batch edited by hand in the saved config is the new recipe
    saved.auto_scale_lr.base_batch_size = 32
    saved.optim_wrapper.accumulative_counts = 2
    adapt_to_accumulation(saved)
    assert saved.auto_scale_lr.base_batch_size == 16


def test_epoch_checkpoints_inside_accumulation_windows_are_warned(tmp_path, capfd):
    """4 iterations per epoch: k = 3 leaves a window open at each epoch checkpoint (its
    gradients are lost on --resume); k = 2 closes one at each epoch end."""
    data = make_image_folder(str(tmp_path / 'data'))
    for counts in (3, 2):
        cfg = toy_cls_config(data, 'unused', max_epochs=1)
        cfg.optim_wrapper.accumulative_counts = counts
        capfd.readouterr()
        train_in_process(cfg, tmp_path, f'k{counts}', str(tmp_path / f'wd{counts}'))
        output = ' '.join(''.join(capfd.readouterr()).split())
        warned = ('Epoch checkpoints with accumulative_counts=3 and 4 iterations per epoch fall '
                  'inside accumulation windows') in output
        assert warned == (counts == 3), output[-2000:]


def test_ema_and_mid_window_checkpoints_are_warned_with_the_fix(tmp_path, toy_root,
                                                                log_messages):
    cfg = toy_config(toy_root, str(tmp_path / 'wd'), interval=6)
    cfg.optim_wrapper.accumulative_counts = 4
    cfg.custom_hooks = [dict(type='EMAHook', momentum=0.01)]
    adapt_to_accumulation(cfg)
    text = '\n'.join(log_messages)
    fix = ema_momentum_per_iteration(0.01, 4)
    assert f'set the hook\'s momentum to {fix:.6g}' in text
    assert 'Checkpoints every 6 iterations fall inside accumulation windows of 4' in text
    max_iters = cfg.train_cfg.max_iters  # iteration-based: k times fewer optimizer steps
    assert (f'train_cfg.max_iters={max_iters} counts iterations, not optimizer steps: with '
            f'accumulative_counts=4 the run makes {-(-max_iters // 4)} optimizer steps') in text
    # without accumulation: no warning
    log_messages.clear()
    cfg = toy_config(toy_root, str(tmp_path / 'wd2'), interval=6)
    cfg.custom_hooks = [dict(type='EMAHook', momentum=0.01)]
    adapt_to_accumulation(cfg)
    assert not log_messages


def test_the_suggested_ema_momentum_equals_one_update_per_step():
    """Between two optimizer steps the weights stay put: k updates with the suggested
    momentum (mmengine's ExponentialMovingAverage) equal one update with the step momentum."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    momentum, counts = 0.05, 8
    per_step = ExponentialMovingAverage(model, momentum=momentum)
    per_iter = ExponentialMovingAverage(model, momentum=ema_momentum_per_iteration(momentum,
                                                                                   counts))
    for _ in range(3):  # three optimizer steps
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param))
        per_step.update_parameters(model)
        for _ in range(counts):
            per_iter.update_parameters(model)
    for a, b in zip(per_step.module.parameters(), per_iter.module.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_amp_without_a_device_fails_before_building(tmp_path, toy_root, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip('a CUDA device runs AMP')
    work_dir = str(tmp_path / 'wd')
    path = dump(toy_config(toy_root, work_dir), str(tmp_path / 'cfg.py'))
    with pytest.raises(SystemExit, match=r'^error: --amp .*needs a CUDA, NPU, MLU or MUSA '
                                         r'device.*drop --amp'):
        load_tool('train').main([path, '--work-dir', work_dir, '--amp'])
    assert not osp.exists(osp.join(work_dir, 'iter_4.pth'))
