"""``--resume`` of a config without ``randomness.seed`` (every segmentation config) continues
with the interrupted run's seed.

mmengine draws a new seed per run when the config sets none, builds the train sampler with it
(``BaseLoop.__init__``) and adopts the checkpoint's ``meta['seed']`` only in
``Runner.resume``, after the sampler exists: the data order and the per-sample augmentation
seeds of the resumed part came from a fresh seed.  ``build_runner`` now reads the seed from the
checkpoint first (:func:`mmlinvit.engine.resume.resume_randomness`).

The reference is an uninterrupted run of the same config with ``randomness.seed`` set to the
seed read here, independently, from the interrupted run's checkpoint with ``torch.load``.
"""
import logging
import os.path as osp

import pytest
import torch

from mmlinvit.engine.resume import resume_randomness
from train_testing import captured_log, dump, load_tool, make_toy_scenes, toy_config, train_in_process


pytestmark = pytest.mark.usefixtures('one_thread', 'cheap_config_dump')


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory) -> str:
    return make_toy_scenes(str(tmp_path_factory.mktemp('toy') / 'toy_ade'))


def _stored_seed(path: str) -> int:
    return torch.load(path, map_location='cpu', weights_only=False)['meta']['seed']


def test_resume_without_a_config_seed_continues_with_the_interrupted_runs_seed(
        tmp_path, toy_root, capfd):
    # 8 scenes, batch 2: 4 iterations per epoch; stopped mid-epoch, resumed across the epoch
    # boundary (iteration 5 is the first of epoch 2: new shuffle, new sample seeds).
    cfg = toy_config(toy_root, 'unused', max_iters=6, interval=3)
    cfg.pop('randomness', None)  # as configs/_base_/default_runtime_seg.py
    work_dir = str(tmp_path / 'run')
    first = train_in_process(cfg, tmp_path, 'first', work_dir, hooks=[dict(type='StopHook', after_iter=3)])
    assert sorted(first) == [1, 2, 3]
    checkpoint = osp.join(work_dir, 'iter_3.pth')
    seed = _stored_seed(checkpoint)

    capfd.readouterr()
    resumed = train_in_process(cfg, tmp_path, 'resumed', work_dir, '--resume')
    output = ''.join(capfd.readouterr())
    assert sorted(resumed) == [4, 5, 6], resumed

    twin_cfg = cfg.copy()
    twin_cfg.randomness = dict(seed=seed)
    twin = train_in_process(twin_cfg, tmp_path, 'twin', str(tmp_path / 'twin'))
    assert sorted(twin) == list(range(1, 7))
    for it in range(1, 7):  # the twin is the interrupted run, and the resumed run continues it
        got = first[it] if it <= 3 else resumed[it]
        for key, value in twin[it].items():
            assert got[key] == value, (it, key, got[key], value)
    assert _stored_seed(osp.join(work_dir, 'iter_6.pth')) == seed
    assert (f"using seed {seed} of the interrupted run (meta['seed'] of {checkpoint})"
            in output), output[-3000:]

    # A config seed that differs from the checkpoint's is kept, with a warning naming both.
    other = seed + 1
    mismatched = cfg.copy()
    mismatched.randomness = dict(seed=other)
    train = load_tool('train')
    path = dump(mismatched, str(tmp_path / 'mismatched.py'))
    loaded = train.load_config(path)
    train.prepare_train_config(loaded, path, work_dir=work_dir, resume=checkpoint)
    capfd.readouterr()
    runner = train.build_runner(loaded, mode='train')
    output = ''.join(capfd.readouterr())
    assert runner.seed == other
    assert (f'the config sets randomness.seed={other} but the interrupted run used seed {seed}'
            in output and 'the resume is not exact' in output), output[-3000:]


def _checkpoint(path: str, seed, legacy: bool = False, extra=None) -> str:
    meta = dict(epoch=0, iter=3, seed=seed)
    torch.save(dict(meta=meta, state_dict={'w': torch.zeros(4)}, **(extra or {})), path,
               _use_new_zipfile_serialization=not legacy)
    return path


class _NotAllowlisted:
    """An object ``torch.load(weights_only=True)`` refuses."""


@pytest.mark.parametrize('kind', ['zip', 'legacy', 'other-objects'])
def test_resume_randomness_reads_the_seed_and_keeps_the_other_keys(tmp_path, kind):
    path = _checkpoint(str(tmp_path / 'ckpt.pth'), 1234, legacy=kind == 'legacy',
                       extra=dict(x=_NotAllowlisted()) if kind == 'other-objects' else None)
    assert resume_randomness(None, path) == dict(seed=1234)
    assert resume_randomness(dict(seed=None, diff_rank_seed=True, deterministic=True),
                             path) == dict(seed=1234, diff_rank_seed=True, deterministic=True)
    with captured_log(logging.WARNING) as warned:
        assert resume_randomness(dict(seed=1234, diff_rank_seed=True), path) == dict(
            seed=1234, diff_rank_seed=True)
    assert not warned
    with captured_log(logging.WARNING) as warned:
        assert resume_randomness(dict(seed=7), path) == dict(seed=7)
    output = '\n'.join(warned)
    assert 'randomness.seed=7 but the interrupted run used seed 1234' in output
    assert 'Set randomness.seed=1234' in output


def test_resume_randomness_without_a_stored_seed_warns(tmp_path):
    path = _checkpoint(str(tmp_path / 'ckpt.pth'), None)
    with captured_log(logging.WARNING) as warned:
        assert resume_randomness(None, path) == dict(seed=None)
    assert "records no seed (meta['seed'])" in '\n'.join(warned)


def test_diff_rank_seed_warns_that_resume_is_not_exact():
    """mmengine builds the sampler without the run seed under diff_rank_seed=True."""
    from mmengine.config import Config

    from mmlinvit.engine.launch import seed_samples_of_train_loader
    loader = dict(dataset=dict(type='ToyDataset'), sampler=dict(type='DefaultSampler'))
    for diff, warned in ((False, False), (True, True)):
        cfg = Config(dict(train_dataloader=dict(loader), randomness=dict(diff_rank_seed=diff)))
        with captured_log(logging.WARNING) as messages:
            assert seed_samples_of_train_loader(cfg)
        assert ('diff_rank_seed' in '\n'.join(messages)) is warned
