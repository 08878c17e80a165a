"""Interrupting a distillation run after its first checkpoint and resuming it reproduces the
uninterrupted run exactly (student, connector, mask token, optimizer, schedule, mask RNG)."""
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.runner import Runner

from distill_testing import (CONFIGS, InterruptHook, LossRecorderHook, TrainingInterrupted,
                             save_tiny_vit_checkpoint, shrink_config, tiny_arch,
                             write_image_folder)

CONFIG = 'linearizer/vit-linearizer_clip-b16_vit-b-elu_16xb64-300e_in1k-224x224.py'


def _cfg(tmp_path, work_dir, resume=False):
    cfg = Config.fromfile(osp.join(CONFIGS, CONFIG))
    shrink_config(cfg, str(tmp_path / 'data'), str(tmp_path / work_dir), max_epochs=3,
                  teacher_ckpt=str(tmp_path / 'clip.pth'), teacher_width=24)
    cfg.resume = resume
    return cfg


def _train(cfg, extra_hooks=()):
    runner = Runner.from_cfg(cfg)
    recorder = LossRecorderHook()
    runner.register_hook(recorder)
    for hook in extra_hooks:
        runner.register_hook(hook)
    return runner, recorder


def test_resume_reproduces_the_uninterrupted_losses(tmp_path):
    write_image_folder(str(tmp_path / 'data'), num_per_class=2)
    save_tiny_vit_checkpoint(str(tmp_path / 'clip.pth'), family='clip',
                             arch=tiny_arch(embed_dims=24))

    runner, full = _train(_cfg(tmp_path, 'full'))
    runner.train()

    runner, first = _train(_cfg(tmp_path, 'interrupted'), [InterruptHook(after_epoch=0)])
    with pytest.raises(TrainingInterrupted):
        runner.train()
    assert osp.isfile(tmp_path / 'interrupted' / 'epoch_1.pth')
    runner, resumed = _train(_cfg(tmp_path, 'interrupted', resume=True))
    runner.train()

    assert [s['iter'] for s in full.history] == list(range(6))
    assert [s['iter'] for s in first.history] == [0, 1]
    assert [s['iter'] for s in resumed.history] == [2, 3, 4, 5]
    keys = ('loss', 'distill.loss_act', 'distill.loss_mask', 'distill.gap_act',
            'distill.gap_mask')
    for got, want in zip(first.history + resumed.history, full.history):
        for key in keys:
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), (got['iter'], key)
    # the learning rate kept following the schedule
    assert runner.optim_wrapper.get_lr()['lr'][0] > 0
