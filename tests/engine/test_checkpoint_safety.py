"""Checkpoints and ``--resume`` on the paths where work was lost or a resumed run silently
differed: a job killed (or a disk filling up) while a checkpoint is written with
``max_keep_ckpts``, a work dir that still holds an earlier run's checkpoints, a resumed run
whose config was changed, and an epoch-based run resumed from inside an epoch."""
import os
import os.path as osp

import pytest

from train_testing import (captured_log, logged_metric, make_image_folder, make_toy_scenes,
                           toy_cls_config, toy_config, train_in_process, with_validation)

pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory) -> str:
    return make_toy_scenes(str(tmp_path_factory.mktemp('toy') / 'toy_ade'))


class Killed(RuntimeError):
    """The job ends while a checkpoint is written."""


def test_kill_while_saving_keeps_the_previous_checkpoint(tmp_path, toy_root, monkeypatch):
    """max_keep_ckpts=1 (the ViT-AdaLA Stage-1 config): mmengine removed iter_4.pth before
    writing iter_8.pth under its final name, so a kill mid-write left only a truncated
    iter_8.pth and nothing to resume from."""
    import mmengine.runner.runner as runner_module
    cfg = toy_config(toy_root, 'unused', max_iters=8, interval=4, max_keep_ckpts=1)
    full = train_in_process(cfg, tmp_path, 'full', str(tmp_path / 'full'))
    work_dir = str(tmp_path / 'wd')
    save = runner_module.save_checkpoint

    def killed_at_8(checkpoint, filename, **kwargs):
        if checkpoint['meta']['iter'] == 8:
            with open(filename, 'wb') as f:
                f.write(b'PK\x03\x04 half of a checkpoint')
            raise Killed(filename)
        return save(checkpoint, filename, **kwargs)

    monkeypatch.setattr(runner_module, 'save_checkpoint', killed_at_8)
    with pytest.raises(Killed):
        train_in_process(cfg, tmp_path, 'first', work_dir)
    monkeypatch.setattr(runner_module, 'save_checkpoint', save)
    assert sorted(os.listdir(work_dir)).count('iter_4.pth') == 1
    assert not osp.exists(osp.join(work_dir, 'iter_8.pth'))
    # what a SIGKILL leaves (no clean-up ran): a partial file beside the intact one
    # (and one of a step the resumed run does not save again; a user's .part file stays)
    for name in ('iter_8.pth.part', 'iter_12.pth.part', 'notes.part'):
        with open(osp.join(work_dir, name), 'wb') as f:
            f.write(b'PK\x03\x04 half')
    resumed = train_in_process(cfg, tmp_path, 'resumed', work_dir, '--resume')
    assert sorted(resumed) == [5, 6, 7, 8]
    assert all(resumed[it]['loss'] == full[it]['loss'] for it in resumed)
    # rotation after the write: only the newest is kept; the killed writes are removed
    assert sorted(p for p in os.listdir(work_dir) if p.endswith('.pth')) == ['iter_8.pth']
    assert [p for p in os.listdir(work_dir) if p.endswith('.part')] == ['notes.part']


def test_resume_ignores_an_earlier_runs_checkpoints(tmp_path, toy_root):
    """A fresh run into a work dir that still holds a longer earlier run's iter_8 / iter_12:
    --resume took the earlier run's iter_12.pth (the highest number) over the iter_4.pth that
    last_checkpoint names, trained nothing and exited 0."""
    work_dir = str(tmp_path / 'wd')
    train_in_process(toy_config(toy_root, 'unused', max_iters=12, interval=4), tmp_path,
                     'earlier', work_dir)
    cfg = toy_config(toy_root, 'unused', max_iters=8, interval=4, embed_dims=16)
    with captured_log() as warned:
        train_in_process(cfg, tmp_path, 'first', work_dir,
                         hooks=[dict(type='StopHook', after_iter=4)])
    assert any('already holds checkpoints of an earlier run' in m and 'iter_12.pth' in m
               for m in warned), warned
    with captured_log() as warned:
        resumed = train_in_process(cfg, tmp_path, 'resumed', work_dir, '--resume')
    assert sorted(resumed) == [5, 6, 7, 8]
    assert any('iter_12.pth' in m and 'earlier run' in m and 'not resumed' in m for m in warned)
    # logged before the runner existed, and still in the run's log files
    import glob
    logs = [open(p).read() for p in sorted(glob.glob(osp.join(work_dir, '*', '*.log')))]
    assert any('already holds checkpoints of an earlier run' in text for text in logs)
    assert 'not resumed' in logs[-1]


def test_resume_with_a_changed_lr_and_schedule_is_warned(tmp_path, toy_root):
    """mmengine restores the optimizer and schedulers from the checkpoint: a changed lr /
    schedule length had no effect, with no word."""
    work_dir = str(tmp_path / 'wd')
    cfg = toy_config(toy_root, 'unused', max_iters=8, interval=4)
    train_in_process(cfg, tmp_path, 'first', work_dir, hooks=[dict(type='StopHook', after_iter=4)])
    same = train_in_process(cfg, tmp_path, 'same', str(tmp_path / 'copy'))  # no warning below
    assert same
    changed = toy_config(toy_root, 'unused', max_iters=12, interval=4)
    changed.optim_wrapper.optimizer.lr *= 10
    with captured_log() as warned:
        train_in_process(changed, tmp_path, 'resumed', work_dir, '--resume')
    text = '\n'.join(m for m in warned if 'differs from the interrupted run' in m)
    assert 'optim_wrapper.optimizer.lr: 0.002 -> 0.02' in text
    assert 'param_scheduler: ' in text
    assert 'train_cfg.max_iters: 8 -> 12' in text and 'load_from=' in text
    with captured_log() as warned:
        train_in_process(cfg, tmp_path, 'again', str(tmp_path / 'copy'), '--resume')
    assert not any('differs from the interrupted run' in m for m in warned)


@pytest.mark.parametrize('stop,retrained,told', [
    (6, [7, 8, 9, 10], '2 of the 4 iterations of epoch 2'),  # epoch 2 restarted from its start
    # an iteration checkpoint at epoch 1's last iteration still names epoch 1 (mmengine's
    # meta): the whole epoch is trained again (was not warned)
    (4, [5, 6, 7, 8, 9, 10, 11, 12], '4 of the 4 iterations of epoch 1'),
])
def test_epoch_loop_resumed_inside_an_epoch_is_warned(tmp_path, capfd, stop, retrained, told):
    data = make_image_folder(str(tmp_path / 'data'))
    cfg = toy_cls_config(data, 'unused', max_epochs=2)
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', by_epoch=False, interval=2)
    work_dir = str(tmp_path / 'wd')
    train_in_process(cfg, tmp_path, 'first', work_dir,
                     hooks=[dict(type='StopHook', after_iter=stop)])
    capfd.readouterr()
    resumed = train_in_process(cfg, tmp_path, 'resumed', work_dir, '--resume')
    output = ' '.join(''.join(capfd.readouterr()).split())
    assert sorted(resumed) == retrained
    assert told in output and 'by_epoch=True' in output


def test_kill_while_saving_the_best_checkpoint_keeps_the_previous_best(tmp_path, toy_root,
                                                                      monkeypatch):
    """save_best: mmengine removed the previous best before writing the new one under its
    final name; a kill mid-write left a truncated best and no intact one."""
    import mmengine.runner.runner as runner_module
    probe = str(tmp_path / 'probe')
    train_in_process(with_validation(toy_config(toy_root, 'unused', max_iters=8, interval=4),
                                     toy_root, save_best='mIoU'), tmp_path, 'probe', probe)
    miou = logged_metric(probe, 'mIoU')
    assert sorted(miou) == [4, 8] and miou[4] != miou[8], miou
    rule = 'greater' if miou[8] > miou[4] else 'less'  # the iteration-8 result is the best
    cfg = with_validation(toy_config(toy_root, 'unused', max_iters=8, interval=4), toy_root,
                          save_best='mIoU', rule=rule)
    work_dir = str(tmp_path / 'wd')
    save = runner_module.save_checkpoint

    def killed_writing_the_best(checkpoint, filename, **kwargs):
        if osp.basename(filename).startswith('best_') and checkpoint['meta']['iter'] == 8:
            with open(filename, 'wb') as f:
                f.write(b'PK\x03\x04 half of a checkpoint')
            raise Killed(filename)
        return save(checkpoint, filename, **kwargs)

    monkeypatch.setattr(runner_module, 'save_checkpoint', killed_writing_the_best)
    with pytest.raises(Killed):
        train_in_process(cfg, tmp_path, 'first', work_dir)
    best = sorted(p for p in os.listdir(work_dir) if p.startswith('best_'))
    assert best == ['best_mIoU_iter_4.pth'], best  # intact, no partial file
    from mmlinvit.converters.checkpoint_file import checkpoint_file_problem
    assert checkpoint_file_problem(osp.join(work_dir, best[0])) is None


def test_resume_without_the_runs_ema_hook_is_warned(tmp_path):
    """A checkpoint of an EMA run holds the averaged weights in state_dict (EMAHook swaps the
    trained ones back on resume); resumed by a config without EMAHook, training went on from the
    averaged weights with the trained weights' optimizer state, with no word."""
    import torch
    from mmengine.config import Config

    from mmlinvit.engine.resume import warn_changed_resume_config
    with_ema = Config(dict(custom_hooks=[dict(type='mmengine.EMAHook', momentum=2e-4)]))
    ckpt = str(tmp_path / 'iter_4.pth')
    torch.save(dict(meta=dict(cfg=with_ema.pretty_text), state_dict={}), ckpt)
    with captured_log() as warned:
        changed = warn_changed_resume_config(Config(dict(custom_hooks=[])), ckpt)
    assert changed == ['custom_hooks.EMAHook']
    assert any('EMAHook removed' in m and 'keep the EMAHook' in m for m in warned)
    kept = Config(dict(custom_hooks=[dict(type='EMAHook', momentum=2e-4)]))
    assert warn_changed_resume_config(kept, ckpt) == []
    # a subclass registered in a downstream scope, named without the scope
    from mmengine.hooks import EMAHook
    from mmseg.registry import HOOKS as MMSEG_HOOKS

    @MMSEG_HOOKS.register_module(force=True)
    class ProjectEMAHook(EMAHook):
        pass

    scoped = Config(dict(default_scope='mmseg',
                         custom_hooks=[dict(type='ProjectEMAHook', momentum=2e-4)]))
    assert warn_changed_resume_config(scoped, ckpt) == []
