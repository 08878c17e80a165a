"""Issue 11 item 2: a run stopped right after its iteration-8 checkpoint and resumed with
``--resume`` reproduces the uninterrupted run's losses exactly, with random augmentation
(RandomResize / RandomCrop / RandomFlip; RandomResizedCrop / RandomFlip) and a model that draws
random numbers (drop-path), for ``num_workers`` 0 and 2, in one process and in a 2-process
gloo run (tools/dist_train.sh).

The data pipeline runs on per-sample streams (mmlinvit.engine.sample_seeding), so the losses
are also the same for every ``num_workers``: the runs below mix 0 and 2 across the checkpoint.
"""
import json
import os.path as osp
import shutil
import socket
import sys

import pytest

from torchrun_retry import run_multiprocess
from train_testing import (REPO, dump, env_for_subprocess, logged_metric, make_image_folder,
                           make_toy_scenes, read_losses, toy_cls_config, toy_config,
                           train_in_process, with_validation)


pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory) -> str:
    return make_toy_scenes(str(tmp_path_factory.mktemp('toy') / 'toy_ade'))


def _assert_same(resumed, full, first, last, what):
    for it in range(first, last + 1):
        assert it in resumed, (what, it, sorted(resumed))
        for key, value in full[it].items():
            assert resumed[it][key] == value, (what, it, key, resumed[it][key], value)


def test_resume_is_exact_in_one_process(tmp_path, toy_root):
    def cfg(num_workers):
        return toy_config(toy_root, 'unused', max_iters=10, interval=4, num_workers=num_workers)

    full0 = train_in_process(cfg(0), tmp_path, 'full0', str(tmp_path / 'full0'))
    full2 = train_in_process(cfg(2), tmp_path, 'full2', str(tmp_path / 'full2'))
    assert sorted(full0) == list(range(1, 11))
    _assert_same(full2, full0, 1, 10, 'num_workers 2 vs 0')

    stopped = str(tmp_path / 'stopped')
    first = train_in_process(cfg(2), tmp_path, 'first', stopped,
                   hooks=[dict(type='StopHook', after_iter=8)])
    assert sorted(first) == list(range(1, 9))
    assert osp.isfile(osp.join(stopped, 'iter_8.pth'))
    for num_workers in (0, 2):
        work_dir = str(tmp_path / f'resumed{num_workers}')
        shutil.copytree(stopped, work_dir)
        with open(osp.join(work_dir, 'last_checkpoint'), 'w') as f:
            f.write(osp.join(work_dir, 'iter_8.pth'))
        resumed = train_in_process(cfg(num_workers), tmp_path, f'resumed{num_workers}', work_dir,
                         '--resume')
        assert sorted(resumed) == [9, 10], resumed
        _assert_same(resumed, full0, 9, 10, f'resumed, num_workers={num_workers}')


def test_epoch_based_mmpretrain_resume_is_exact(tmp_path):
    data = make_image_folder(str(tmp_path / 'data'))

    def cfg(num_workers):
        return toy_cls_config(data, 'unused', max_epochs=2, num_workers=num_workers)

    full = train_in_process(cfg(0), tmp_path, 'full', str(tmp_path / 'full'))
    assert sorted(full) == list(range(1, 9))  # 8 images, batch 2: 4 iterations per epoch
    work_dir = str(tmp_path / 'run')
    train_in_process(cfg(2), tmp_path, 'first', work_dir, hooks=[dict(type='StopHook', after_epoch=1)])
    resumed = train_in_process(cfg(2), tmp_path, 'resumed', work_dir, '--resume')
    assert sorted(resumed) == [5, 6, 7, 8]
    _assert_same(resumed, full, 5, 8, 'epoch 2 after resume')


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _dist_train(cfg, tmp_path, name, work_dir, *flags, hooks=()):
    record = str(tmp_path / f'{name}.jsonl')
    path = dump(cfg, str(tmp_path / f'{name}.py'),
                hooks=[dict(type='RecordLossesHook', path=record)] + list(hooks))
    env = env_for_subprocess(PYTHON=sys.executable, PORT=str(_free_port()), NNODES='1',
                             NODE_RANK='0', MASTER_ADDR='127.0.0.1')
    proc = run_multiprocess(['bash', osp.join(REPO, 'tools', 'dist_train.sh'), path, '2',
                             '--work-dir', work_dir, *flags],
                            env=env, cwd=str(tmp_path), timeout=400)
    return proc, read_losses(record)


def test_resume_is_exact_in_a_two_process_gloo_run(tmp_path, toy_root):
    # Three launches: uninterrupted with 2 workers per rank, stopped hard after the
    # iteration-8 checkpoint with num_workers=0, resumed with 2 workers per rank.
    # validation at 4, 8 and 10: plain BN keeps per-process running statistics, which are
    # averaged before checkpoints and validation (SyncNormStatsHook), so the resumed run
    # validates as the uninterrupted one (it differed: every rank loaded rank 0's)
    def cfg(num_workers):
        return with_validation(toy_config(toy_root, 'unused', max_iters=10, interval=4,
                                          num_workers=num_workers), toy_root)

    stats = str(tmp_path / 'norm_stats.jsonl')
    proc, full = _dist_train(cfg(2), tmp_path, 'full', str(tmp_path / 'full'),
                             hooks=[dict(type='DumpNormStatsHook', path=stats)])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    with open(stats) as f:
        per_rank = {row['rank']: row['stats'] for row in map(json.loads, f)}
    assert per_rank[0] and per_rank[0] == per_rank[1]  # what was validated and saved
    assert sorted(full) == [0, 1] and all(sorted(full[r]) == list(range(1, 11)) for r in (0, 1))
    assert full[0][1]['loss'] != full[1][1]['loss']  # the ranks see different samples
    # each rank draws its own dropout / drop-path masks (seed + rank, as DeiT / DINOv2)
    assert full[0][1]['torch_stream'] != full[1][1]['torch_stream']

    work_dir = str(tmp_path / 'run')
    proc, first = _dist_train(cfg(0), tmp_path, 'first', work_dir,
                              hooks=[dict(type='StopHook', after_iter=8, hard=True)])
    assert proc.returncode != 0  # killed right after the iteration-8 checkpoint
    assert osp.isfile(osp.join(work_dir, 'iter_8.pth'))
    for rank in (0, 1):  # per-sample streams: the same losses without workers
        _assert_same(first[rank], full[rank], 1, 8, f'rank {rank}, num_workers 0 vs 2')

    proc, resumed = _dist_train(cfg(2), tmp_path, 'resumed', work_dir, '--resume')
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    for rank in (0, 1):
        assert sorted(resumed[rank]) == [9, 10]
        _assert_same(resumed[rank], full[rank], 9, 10, f'rank {rank} after resume')
    full_miou, resumed_miou = (logged_metric(str(tmp_path / 'full'), 'mIoU'),
                               logged_metric(work_dir, 'mIoU'))
    assert sorted(full_miou) == [4, 8, 10] and resumed_miou[10] == full_miou[10], (
        full_miou, resumed_miou)


def test_two_process_ema_checkpoints_hold_the_validated_norm_stats(tmp_path, toy_root):
    """With EMAHook, checkpoints hold the averaged model, whose BN buffers EMAHook copied from
    each process's live model before they were averaged over the processes: the saved (and
    best) checkpoints held rank 0's statistics while validation had used the averaged ones."""
    import torch
    cfg = with_validation(toy_config(toy_root, 'unused', max_iters=8, interval=4), toy_root)
    stats = str(tmp_path / 'norm_stats.jsonl')
    work_dir = str(tmp_path / 'ema')
    proc, _ = _dist_train(cfg, tmp_path, 'ema', work_dir,
                          hooks=[dict(type='EMAHook', momentum=0.2),
                                 dict(type='DumpNormStatsHook', path=stats)])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    with open(stats) as f:
        per_rank = {row['rank']: row['stats'] for row in map(json.loads, f)}
    assert per_rank[0] and per_rank[0] == per_rank[1]  # the live (validated) statistics
    saved = torch.load(osp.join(work_dir, 'iter_8.pth'), map_location='cpu',
                       weights_only=False)
    means = [v for k, v in saved['state_dict'].items() if k.endswith('running_mean')]
    assert means and 'ema_state_dict' in saved
    flat = torch.cat([m.flatten() for m in means]).tolist()
    assert flat == pytest.approx(per_rank[0], rel=0, abs=1e-6)
