"""Checkpoint hooks on branches no other test reached (second mutation audit): a NaN in the
live weights while an ``EMAHook`` of higher priority swaps in the averaged ones is still
refused before the save, and a fixed checkpoint name with rotation keeps the file just
written."""
import math
import os
import os.path as osp

import pytest
import torch

from train_testing import dump, load_tool, make_toy_scenes, toy_config

pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory):
    return make_toy_scenes(str(tmp_path_factory.mktemp('toy') / 'toy_ade'))


def test_live_nan_with_ema_hook_running_first_is_never_saved(tmp_path, toy_root):
    from mmengine.hooks import Hook
    from mmengine.registry import HOOKS

    @HOOKS.register_module(force=True)
    class PoisonLiveHook(Hook):
        priority = 'LOW'  # after CheckFiniteHook's per-iteration check, before CheckpointHook

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if runner.iter + 1 == 4:
                with torch.no_grad():
                    runner.model.backbone.patch_embed.proj.weight.fill_(math.nan)

    work_dir = str(tmp_path / 'wd')
    cfg = toy_config(toy_root, work_dir, max_iters=4, interval=4)
    path = dump(cfg, str(tmp_path / 'cfg.py'),
                hooks=[dict(type='EMAHook', momentum=0.2, priority='HIGH'),
                       dict(type='PoisonLiveHook')])
    with pytest.raises(FloatingPointError, match='checkpoint being saved'):
        load_tool('train').main([path, '--work-dir', work_dir])
    assert not osp.exists(osp.join(work_dir, 'iter_4.pth'))


def test_fixed_filename_with_rotation_keeps_the_new_file(tmp_path, toy_root):
    work_dir = str(tmp_path / 'wd')
    cfg = toy_config(toy_root, work_dir, max_iters=4, interval=2, max_keep_ckpts=1)
    cfg.default_hooks.checkpoint['filename_tmpl'] = 'latest.pth'
    path = dump(cfg, str(tmp_path / 'cfg.py'))
    load_tool('train').main([path, '--work-dir', work_dir])
    assert osp.isfile(osp.join(work_dir, 'latest.pth')), os.listdir(work_dir)
    assert torch.load(osp.join(work_dir, 'latest.pth'), map_location='cpu',
                      weights_only=False)['meta']['iter'] == 4


def test_the_last_iteration_is_due_with_save_last():
    """checkpoint_due mirrors CheckpointHook.after_train_iter, save_last included, so that
    CheckFiniteHook checks the weights before the final checkpoint is written."""
    from types import SimpleNamespace

    from mmengine.hooks import CheckpointHook

    from mmlinvit.engine.hooks.checkpoint_schedule import checkpoint_due
    hook = CheckpointHook(interval=3, by_epoch=False, save_last=True)
    assert checkpoint_due(SimpleNamespace(hooks=[hook], iter=4, max_iters=5), 'iter')
    assert not checkpoint_due(SimpleNamespace(hooks=[hook], iter=3, max_iters=5), 'iter')
    no_last = CheckpointHook(interval=3, by_epoch=False, save_last=False)
    assert not checkpoint_due(SimpleNamespace(hooks=[no_last], iter=4, max_iters=5), 'iter')
