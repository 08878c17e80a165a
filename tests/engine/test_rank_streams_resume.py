"""RandomStateHook's per-rank process streams (audit s11 seeding F3, F4, F5).

* F3: a run resumed with another number of processes, or from a checkpoint without random
  states, left every rank on mmengine's shared seed: all ranks drew the same dropout /
  drop-path / Mixup numbers, replaying the run's iteration-1 stream.  Each rank is now seeded
  from (run seed, rank, resumed iteration).
* F4: ``RandomStateHook(save_states=False)`` seeds the rank streams without saving or
  restoring states (for ``exact_resume = False`` configs).
* F5: ``rank_stream_seed(seed, r)`` equalled ``sample_seed(seed, epoch=r, position=0)``.
"""
import logging
import os
import os.path as osp
import shutil
import socket
import sys
import types
from unittest import mock

import pytest
import torch

from mmlinvit.engine.hooks import random_state_hook
from mmlinvit.engine.hooks.random_state_hook import (CHECKPOINT_KEY, RandomStateHook,
                                                     capture_random_state, rank_stream_seed)
from mmlinvit.engine.sample_seeding import sample_seed

from torchrun_retry import run_multiprocess
from train_testing import (REPO, captured_log, dump, env_for_subprocess, make_toy_scenes,
                           read_losses, toy_config, train_in_process)

pytestmark = pytest.mark.usefixtures('one_thread')

SEED = 5


def _stream_after_first_iter(rank, world_size, checkpoint, at_iter=4, **hook_options):
    """This rank's torch stream state after the hook's first ``before_train_iter`` of a run
    resumed from ``checkpoint`` (``None``: a fresh run at ``at_iter``), and the warnings."""
    torch.manual_seed(SEED)  # mmengine re-seeds every rank with the run seed on resume
    runner = types.SimpleNamespace(seed=SEED, iter=at_iter)
    hook = RandomStateHook(**hook_options)
    with mock.patch.object(random_state_hook, 'get_dist_info', return_value=(rank, world_size)):
        if checkpoint is not None:
            hook.after_load_checkpoint(runner, checkpoint)
        with captured_log(logging.WARNING) as warnings:
            hook.before_train_iter(runner, 0)
    return torch.random.get_rng_state(), warnings


def _one_process_checkpoint(at_iter=4):
    torch.manual_seed(123)
    return {CHECKPOINT_KEY: dict(world_size=1, states=[capture_random_state()]),
            'meta': dict(iter=at_iter)}


def _replayed_stream():
    torch.manual_seed(SEED)
    return torch.random.get_rng_state()


@pytest.mark.parametrize('checkpoint', ['other_world_size', 'no_states'])
def test_resumed_ranks_without_their_states_draw_their_own_streams(checkpoint):
    ckpt = (_one_process_checkpoint() if checkpoint == 'other_world_size'
            else {'meta': dict(iter=4)})
    streams, warned = zip(*[_stream_after_first_iter(rank, 2, ckpt) for rank in (0, 1)])
    assert not torch.equal(streams[0], streams[1])  # every rank drew the same before
    for rank, warnings in enumerate(warned):
        assert len(warnings) == 1 and 'seeded with' in warnings[0], warnings
        assert f'rank {rank}, iteration 4' in warnings[0], warnings
    fresh = [_stream_after_first_iter(r, 2, None, at_iter=0)[0] for r in (0, 1)]
    for rank in (0, 1):  # neither the shared seed's stream nor the fresh run's iteration 1
        assert not torch.equal(streams[rank], _replayed_stream())
        assert not torch.equal(streams[rank], fresh[0]) and not torch.equal(streams[rank],
                                                                            fresh[1])
    torch.manual_seed(rank_stream_seed(SEED, 1, 4))
    assert torch.equal(streams[1], torch.random.get_rng_state())


def test_one_process_resume_without_states_does_not_replay_iteration_one():
    state, warnings = _stream_after_first_iter(0, 1, {'meta': dict(iter=4)})
    assert not torch.equal(state, _replayed_stream())
    assert warnings and 'no random states' in warnings[0]


def test_states_of_a_save_best_checkpoint():
    """Only rank 0's state is in it: rank 0 restores it, rank 1 seeds its own."""
    torch.manual_seed(77)
    state0 = capture_random_state()
    ckpt = {CHECKPOINT_KEY: dict(world_size=2, states=[state0, None]), 'meta': dict(iter=4)}
    restored, warnings = _stream_after_first_iter(0, 2, ckpt)
    assert torch.equal(restored, state0['torch']) and not warnings
    seeded, warnings = _stream_after_first_iter(1, 2, ckpt)
    assert not torch.equal(seeded, restored) and warnings


def test_rank_streams_false_keeps_the_shared_stream():
    ckpt = _one_process_checkpoint()
    streams = [_stream_after_first_iter(r, 2, ckpt, rank_streams=False)[0] for r in (0, 1)]
    assert torch.equal(streams[0], streams[1]) and torch.equal(streams[0], _replayed_stream())


def test_without_saved_states_the_ranks_are_still_seeded():
    """``save_states=False`` (``exact_resume = False``): no states in checkpoints, none
    restored, but each rank's streams are seeded at the first iteration, fresh or resumed."""
    hook = RandomStateHook(save_states=False)
    checkpoint = {}
    with mock.patch.object(random_state_hook, 'get_dist_info', return_value=(0, 2)):
        hook.before_save_checkpoint(types.SimpleNamespace(epoch=0, iter=4), checkpoint)
    assert CHECKPOINT_KEY not in checkpoint
    for at_iter in (0, 4):
        streams = [_stream_after_first_iter(r, 2, _one_process_checkpoint(), at_iter=at_iter,
                                            save_states=False)[0] for r in (0, 1)]
        assert not torch.equal(streams[0], streams[1])
        torch.manual_seed(rank_stream_seed(SEED, 0, at_iter))
        assert torch.equal(streams[0], torch.random.get_rng_state())


def test_rank_stream_seeds_are_not_sample_seeds():
    for seed in (0, 1, 5):
        samples = {sample_seed(seed, e, p) for e in range(8) for p in range(16)}
        # rank r's seed was the seed of sample 0 of epoch r
        assert not {rank_stream_seed(seed, r) for r in range(8)} & samples
        ranks = {rank_stream_seed(seed, r, it) for r in range(8) for it in (0, 4, 100)}
        assert len(ranks) == 24 and not ranks & samples
    assert rank_stream_seed(1, 0) != rank_stream_seed(1 + 2**32, 0)


# ---------------------------------------------------------------------- 2 processes
def test_two_process_resume_of_a_one_process_checkpoint(tmp_path):
    """tools/dist_train.sh with 2 processes resumes a 1-process run's iteration-4 checkpoint:
    the ranks' process streams differ (they were identical), and the resumed part does not
    replay the fresh run's streams."""
    root = make_toy_scenes(str(tmp_path / 'toy_ade'))
    cfg = toy_config(root, 'unused', max_iters=6, interval=4)
    work_dir = str(tmp_path / 'run')
    single = train_in_process(cfg, tmp_path, 'single', work_dir)
    assert osp.isfile(osp.join(work_dir, 'iter_4.pth'))
    resumed_dir = str(tmp_path / 'resumed')
    shutil.copytree(work_dir, resumed_dir)
    os.remove(osp.join(resumed_dir, 'iter_6.pth'))
    with open(osp.join(resumed_dir, 'last_checkpoint'), 'w') as f:
        f.write(osp.join(resumed_dir, 'iter_4.pth'))

    record = str(tmp_path / 'resumed.jsonl')
    path = dump(cfg, str(tmp_path / 'resumed.py'),
                hooks=[dict(type='RecordLossesHook', path=record)])
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    env = env_for_subprocess(PYTHON=sys.executable, PORT=str(port), NNODES='1',
                             NODE_RANK='0', MASTER_ADDR='127.0.0.1')
    proc = run_multiprocess(['bash', osp.join(REPO, 'tools', 'dist_train.sh'), path, '2',
                             '--work-dir', resumed_dir, '--resume'],
                            env=env, cwd=str(tmp_path), timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    resumed = read_losses(record)
    assert sorted(resumed) == [0, 1] and sorted(resumed[0]) == [5, 6], resumed
    for it in (5, 6):
        assert resumed[0][it]['torch_stream'] != resumed[1][it]['torch_stream'], it
    fresh_streams = {row['torch_stream'] for row in single.values()}
    assert not {resumed[r][it]['torch_stream'] for r in (0, 1) for it in (5, 6)} & fresh_streams
    assert 'seeded with' in proc.stdout + proc.stderr


@pytest.mark.parametrize('exact', [True, False])
def test_exact_resume_false_keeps_the_rank_streams(tmp_path, exact):
    """exact_resume = False dropped RandomStateHook altogether, and with it the per-rank
    seeding (2 processes: identical streams at 4 of 4 iterations)."""
    from mmlinvit.engine.launch import add_training_safeguards
    cfg = toy_config(make_toy_scenes(str(tmp_path / 'toy')), str(tmp_path / 'wd'))
    cfg.exact_resume = exact
    add_training_safeguards(cfg)
    hooks = [h for h in cfg.custom_hooks if h['type'] == 'mmlinvit.RandomStateHook']
    assert len(hooks) == 1 and hooks[0]['rank_streams'] and hooks[0]['save_states'] == exact
    assert (cfg.train_dataloader.sampler['type'] == 'mmlinvit.SampleSeedSampler') == exact
