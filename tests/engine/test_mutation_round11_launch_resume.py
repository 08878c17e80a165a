"""Launcher set-up and ``--resume`` (mutation round 11): the checks that keep an interrupted
run resuming from its own last checkpoint and a launched process knowing its rank and world.

Guarded here, on single-process, file-level scenarios:

* :mod:`mmlinvit.engine.resume`: the checkpoint ``--resume`` continues from, against
  mmengine's own choice (``find_latest_checkpoint`` reading the ``last_checkpoint`` file that
  mmengine's ``CheckpointHook`` writes in a real run), and the documented deviations from it
  (the newest *intact* checkpoint, numbers compared as numbers, ``epoch_*`` checkpoints, an
  ``out_dir`` outside the work dir, an earlier run's leftovers, a file newer than
  ``last_checkpoint``); an explicit ``--resume PATH`` / ``load_from`` is kept; remote paths
  are left to mmengine; the config entries a resume would silently not apply are named.
* :mod:`mmlinvit.engine.launch`: ``LOCAL_RANK`` / ``--local_rank`` / ``--local-rank``, which
  rank is quieted before the runner (the launcher's *global* rank variable), the loopback
  ``MASTER_ADDR`` refusal in a multi-node Slurm job, the CPU adaptation (``SyncBN`` / ``MMSyncBN``
  anywhere in the model, gloo over a configured backend, mmengine's default DDP wrapper
  options), the launcher flag over the config's, the CPU process group (one process, gloo over
  a file store), and what ``build_runner`` hands to the runner (the selected checkpoint, the
  seed only for a resume, the coverage hook only for ``load_from``).

Checkpoints are written with mmengine's ``save_checkpoint`` in the layout of ``Runner``'s
(``meta`` / ``state_dict`` / ``message_hub`` / ``optimizer``); their age is set with
``os.utime`` where the choice depends on it.
"""
import argparse
import logging
import os
import os.path as osp
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import pytest
import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.runner.checkpoint import find_latest_checkpoint, save_checkpoint

from mmlinvit.converters.checkpoint_file import CheckpointFileError
from mmlinvit.engine import launch
from mmlinvit.engine.launch import (LaunchError, add_launch_arguments, add_training_safeguards,
                                     adapt_to_device, finish_distributed, init_cpu_distributed,
                                     parse_launch_args, prepare_train_config, replace_sync_bn,
                                     user_errors)
from mmlinvit.engine.resume import (ResumeError, check_resume_or_load_from,
                                     last_checkpoint_target, resume_candidates,
                                     resume_randomness, select_resume_checkpoint,
                                     warn_changed_resume_config)

from checkpoint_damage import truncate_to_half
from train_testing import captured_log

pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture(scope='module', autouse=True)
def _no_global_instances_left() -> Iterator[None]:
    """Removes the mmengine global instances (logger, message hub, scope, visualizer) this
    module creates: a logger made here writes to this module's captured output, and later
    tests that read ``capfd`` (tests/engine/test_resume_seed.py) would see nothing."""
    from mmengine.logging import MessageHub
    from mmengine.registry import DefaultScope
    from mmengine.visualization import Visualizer
    kinds = (MMLogger, MessageHub, DefaultScope, Visualizer)
    before = {kind: set(kind._instance_dict) for kind in kinds}
    yield
    for kind in kinds:
        for name in set(kind._instance_dict) - before[kind]:
            instance = kind._instance_dict.pop(name)
            for handler in getattr(instance, 'handlers', []):
                handler.close()

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU adaptation only')

#: A remote checkpoint location mmengine reads through a file backend.
REMOTE = 's3://bucket/runs/iter_8.pth'


# ----------------------------------------------------------------------------------------- helpers
def _save(path: str, iteration: int, seed: Optional[int] = 42, cfg_text: Optional[str] = None,
          age_s: float = 0.0) -> str:
    """Writes a runner checkpoint of ``iteration`` with mmengine's ``save_checkpoint``.

    Args:
        path: Where to write it (its folder is created).
        iteration: ``meta['iter']``.
        seed: ``meta['seed']`` (left out when None).
        cfg_text: ``meta['cfg']``, the config text mmengine stores (left out when None).
        age_s: How many seconds before now its modification time is set.

    Returns:
        ``path``.
    """
    os.makedirs(osp.dirname(path), exist_ok=True)
    meta: Dict[str, object] = dict(iter=iteration, epoch=0)
    if seed is not None:
        meta['seed'] = seed
    if cfg_text is not None:
        meta['cfg'] = cfg_text
    save_checkpoint(dict(meta=meta, state_dict={'w': torch.full((2, ), float(iteration))},
                         message_hub={}, optimizer={}), path)
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path


def _point(work_dir: str, target: str, newline: bool = False) -> None:
    """Writes ``<work_dir>/last_checkpoint`` as mmengine's ``CheckpointHook`` does (the path
    alone, no newline), or as ``echo PATH > last_checkpoint`` does."""
    with open(osp.join(work_dir, 'last_checkpoint'), 'w') as f:
        f.write(target + ('\n' if newline else ''))


def _same(a: str, b: str) -> bool:
    """Whether two paths name the same location."""
    return osp.normpath(osp.abspath(a)) == osp.normpath(osp.abspath(b))


# ------------------------------------------------------------------------------ mmengine's own run
def _toy_model() -> torch.nn.Module:
    """A one-layer regression model for mmengine's ``Runner`` (``BaseModel``)."""
    from mmengine.model import BaseModel

    class ToyLine(BaseModel):

        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def forward(self, inputs, labels=None, mode='tensor'):
            inputs = torch.stack(list(inputs)) if isinstance(inputs, (list, tuple)) else inputs
            labels = torch.stack(list(labels)) if isinstance(labels, (list, tuple)) else labels
            out = self.linear(inputs).squeeze(-1)
            if mode == 'loss':
                return dict(loss=((out - labels) ** 2).mean())
            return out

    return ToyLine()


class _Pairs(torch.utils.data.Dataset):
    """8 fixed (inputs, label) pairs."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict:
        g = torch.Generator().manual_seed(index)
        return dict(inputs=torch.randn(2, generator=g), labels=torch.randn((), generator=g))


@pytest.fixture(scope='module')
def mmengine_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The work dir of a plain mmengine ``Runner`` (6 iterations, a checkpoint every 2),
    interrupted by nothing: its ``CheckpointHook`` wrote iter_2/4/6 and ``last_checkpoint``."""
    from mmengine.runner import Runner
    work_dir = str(tmp_path_factory.mktemp('mmengine_run'))
    runner = Runner(
        model=_toy_model(), work_dir=work_dir, experiment_name='round11_mmengine_run',
        train_dataloader=dict(dataset=_Pairs(), sampler=dict(type='DefaultSampler', shuffle=True),
                              batch_size=2, num_workers=0,
                              collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=6),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False),
                           logger=dict(type='LoggerHook', interval=100)),
        randomness=dict(seed=5), log_level='WARNING')
    runner.train()
    return work_dir


def test_resume_selects_what_mmengine_resumes_from_a_real_run(mmengine_run: str) -> None:
    """A run that ended normally: ``--resume`` takes the file mmengine's ``CheckpointHook``
    named in ``last_checkpoint`` (``find_latest_checkpoint``, what ``Runner.load_or_resume``
    resumes), the run's newest one, and it carries the run's seed and iteration."""
    expected = find_latest_checkpoint(mmengine_run)
    assert expected is not None and osp.basename(expected) == 'iter_6.pth'
    assert _same(last_checkpoint_target(mmengine_run), expected)
    with captured_log(logging.WARNING) as warned:
        chosen = select_resume_checkpoint(mmengine_run)
    assert _same(chosen, expected)
    assert warned == []  # nothing to explain: the same choice as mmengine
    assert check_resume_or_load_from(True, None, mmengine_run) == chosen
    stored = torch.load(chosen, map_location='cpu', weights_only=False)['meta']
    assert stored['iter'] == 6
    assert resume_randomness(None, chosen)['seed'] == stored['seed'] == 5


# -------------------------------------------------------------------------------------- which file
def test_last_checkpoint_file_is_read_as_mmengine_reads_it(tmp_path: Path) -> None:
    """Surrounding whitespace (``echo PATH > last_checkpoint``) is not part of the path, and
    an empty file names nothing; mmengine's ``find_latest_checkpoint`` is the reference."""
    work_dir = str(tmp_path)
    target = _save(osp.join(work_dir, 'iter_4.pth'), 4)
    _save(osp.join(work_dir, 'iter_2.pth'), 2, age_s=50)
    _point(work_dir, target, newline=True)
    assert last_checkpoint_target(work_dir) == find_latest_checkpoint(work_dir) == target
    with captured_log(logging.WARNING) as warned:
        assert _same(select_resume_checkpoint(work_dir), target)
    assert warned == []
    _point(work_dir, '')
    assert find_latest_checkpoint(work_dir) == ''  # mmengine: nothing (falsy)
    assert last_checkpoint_target(work_dir) is None
    with captured_log(logging.WARNING) as warned:
        assert _same(select_resume_checkpoint(work_dir), target)  # the highest number
    assert warned == []


def test_checkpoint_numbers_compare_as_numbers(tmp_path: Path) -> None:
    """iter_12 is newer than iter_8 (not '12' < '8'), also past one digit; with the latest
    damaged the next-highest intact number is taken, not the highest single-digit one."""
    work_dir = str(tmp_path)
    for it, age in ((8, 40), (10, 30), (12, 20)):
        _save(osp.join(work_dir, f'iter_{it}.pth'), it, age_s=age)
    # no last_checkpoint (e.g. deleted): the numbered files alone
    assert osp.basename(select_resume_checkpoint(work_dir)) == 'iter_12.pth'
    latest = osp.join(work_dir, 'iter_12.pth')
    truncate_to_half(latest)
    _point(work_dir, latest)
    with captured_log(logging.WARNING) as warned:
        assert osp.basename(select_resume_checkpoint(work_dir)) == 'iter_10.pth'
    assert any(f'{latest} is truncated' in m and 'iter_10.pth' in m for m in warned), warned
    _, ordered, stale = resume_candidates(work_dir)
    assert [osp.basename(p) for p in ordered] == ['iter_12.pth', 'iter_10.pth', 'iter_8.pth']
    assert stale == []


def test_epoch_checkpoints_are_candidates(tmp_path: Path) -> None:
    """An epoch-based run (``epoch_<n>.pth``): a damaged latest falls back to the previous
    epoch's checkpoint."""
    work_dir = str(tmp_path)
    for epoch, age in ((1, 30), (2, 20), (3, 10)):
        _save(osp.join(work_dir, f'epoch_{epoch}.pth'), 4 * epoch, age_s=age)
    latest = osp.join(work_dir, 'epoch_3.pth')
    truncate_to_half(latest)
    _point(work_dir, latest)
    assert osp.basename(select_resume_checkpoint(work_dir)) == 'epoch_2.pth'


def test_checkpoints_in_an_out_dir_outside_the_work_dir(tmp_path: Path) -> None:
    """``CheckpointHook(out_dir=...)``: the checkpoints live next to the file
    ``last_checkpoint`` names, not in the work dir; a damaged latest falls back there."""
    work_dir, out_dir = str(tmp_path / 'wd'), str(tmp_path / 'out' / 'wd')
    os.makedirs(work_dir)
    previous = _save(osp.join(out_dir, 'iter_4.pth'), 4, age_s=20)
    latest = _save(osp.join(out_dir, 'iter_8.pth'), 8, age_s=10)
    _point(work_dir, latest)
    assert _same(select_resume_checkpoint(work_dir), latest)
    truncate_to_half(latest)
    assert _same(select_resume_checkpoint(work_dir), previous)


def test_the_target_wins_among_checkpoints_of_the_same_number(tmp_path: Path) -> None:
    """Two files of the same step (one in the work dir, one in the out_dir that
    ``last_checkpoint`` names): the named one is taken, even if the other is newer."""
    work_dir, out_dir = str(tmp_path / 'wd'), str(tmp_path / 'out')
    os.makedirs(work_dir)
    named = _save(osp.join(out_dir, 'iter_4.pth'), 4, age_s=30)
    _save(osp.join(work_dir, 'iter_4.pth'), 4, age_s=5)
    _point(work_dir, named)
    with captured_log(logging.WARNING) as warned:
        assert _same(select_resume_checkpoint(work_dir), named)
    assert warned == []


def test_a_damaged_unnumbered_latest_falls_back_to_an_older_numbered_one(tmp_path: Path) -> None:
    """A fixed ``filename_tmpl`` (latest.pth) cut short: the older iter_4.pth is the newest
    intact checkpoint, not a leftover of an earlier run."""
    work_dir = str(tmp_path)
    older = _save(osp.join(work_dir, 'iter_4.pth'), 4, age_s=60)
    latest = _save(osp.join(work_dir, 'latest.pth'), 8, age_s=10)
    truncate_to_half(latest)
    _point(work_dir, latest)
    latest_named, ordered, stale = resume_candidates(work_dir)
    assert stale == [] and [osp.basename(p) for p in ordered] == ['latest.pth', 'iter_4.pth']
    assert _same(select_resume_checkpoint(work_dir), older)


def test_an_earlier_runs_higher_numbers_are_not_resumed(tmp_path: Path) -> None:
    """iter_8 / iter_12 written before the iter_4 that last_checkpoint names come from an
    earlier run into the same work dir: iter_4 is resumed, with a warning naming them."""
    work_dir = str(tmp_path)
    for it, age in ((8, 300), (12, 200)):
        _save(osp.join(work_dir, f'iter_{it}.pth'), it, age_s=age)
    current = _save(osp.join(work_dir, 'iter_4.pth'), 4, age_s=10)
    _point(work_dir, current)
    _, ordered, stale = resume_candidates(work_dir)
    assert [osp.basename(p) for p in stale] == ['iter_8.pth', 'iter_12.pth']
    assert [osp.basename(p) for p in ordered] == ['iter_4.pth']
    with captured_log(logging.WARNING) as warned:
        assert _same(select_resume_checkpoint(work_dir), current)
    assert any('iter_8.pth, iter_12.pth' in m and 'not resumed' in m for m in warned), warned


def test_a_checkpoint_written_after_last_checkpoint_was_updated_is_resumed(tmp_path: Path) -> None:
    """Stopped between writing iter_8.pth and rewriting last_checkpoint (still iter_4): the
    newer iter_8 is resumed, with a warning naming both."""
    work_dir = str(tmp_path)
    named = _save(osp.join(work_dir, 'iter_4.pth'), 4, age_s=60)
    newer = _save(osp.join(work_dir, 'iter_8.pth'), 8, age_s=5)
    _point(work_dir, named)
    with captured_log(logging.WARNING) as warned:
        assert _same(select_resume_checkpoint(work_dir), newer)
    assert any(f'{newer} is newer than {named}' in m for m in warned), warned


def test_a_remote_checkpoint_named_by_last_checkpoint_is_resumed_as_mmengine_does(
        tmp_path: Path) -> None:
    """``CheckpointHook(out_dir='s3://...')`` (kept as mmengine's by AtomicCheckpointHook) writes
    the remote path into the local ``last_checkpoint``; mmengine's auto-resume loads it through
    its file backend, so ``--resume`` must hand over that path unchanged."""
    work_dir = str(tmp_path)
    _point(work_dir, REMOTE)
    assert find_latest_checkpoint(work_dir) == REMOTE
    assert select_resume_checkpoint(work_dir) == REMOTE


def test_a_damaged_latest_does_not_fall_back_to_an_earlier_runs_checkpoint(tmp_path: Path) -> None:
    """An earlier run (interval 2) left iter_2 / iter_4; this run (interval 3) wrote iter_3,
    then iter_6, which is damaged. iter_4 was written before iter_3, so it is not this run's:
    the newest intact checkpoint of this run is iter_3."""
    work_dir = str(tmp_path)
    _save(osp.join(work_dir, 'iter_2.pth'), 2, age_s=500)
    _save(osp.join(work_dir, 'iter_4.pth'), 4, age_s=400)
    own = _save(osp.join(work_dir, 'iter_3.pth'), 3, age_s=60)
    latest = _save(osp.join(work_dir, 'iter_6.pth'), 6, age_s=30)
    truncate_to_half(latest)
    _point(work_dir, latest)
    assert _same(select_resume_checkpoint(work_dir), own)


def test_without_last_checkpoint_file_times_do_not_pick_the_checkpoint(tmp_path: Path) -> None:
    """Checkpoints copied without their times (``cp -r``: times in copy order) and no
    ``last_checkpoint``: the highest number is resumed, whatever order the times say, and
    nothing is called an earlier run's."""
    work_dir = str(tmp_path)
    newest = _save(osp.join(work_dir, 'iter_6.pth'), 6, age_s=500)
    _save(osp.join(work_dir, 'iter_3.pth'), 3, age_s=60)
    with captured_log(logging.WARNING) as warned:
        assert _same(select_resume_checkpoint(work_dir), newest)
    assert not any('earlier run' in m for m in warned), warned


def test_nothing_to_resume_names_what_the_folder_holds(tmp_path: Path) -> None:
    """A work dir without checkpoints: the error lists what it holds."""
    (tmp_path / 'notes.txt').write_text('x')
    with pytest.raises(ResumeError, match=r'no checkpoint found .*notes\.txt'):
        select_resume_checkpoint(str(tmp_path))


# ----------------------------------------------------------------------- --resume PATH / load_from
def test_an_explicit_resume_path_is_kept_over_the_work_dirs_newest(tmp_path: Path) -> None:
    """``--resume work_dirs/x/iter_4.pth`` resumes iter_4 even though the work dir holds a
    newer iter_8 (mmengine: ``load_from`` given, resume from it)."""
    work_dir = str(tmp_path)
    chosen = _save(osp.join(work_dir, 'iter_4.pth'), 4, age_s=60)
    newest = _save(osp.join(work_dir, 'iter_8.pth'), 8, age_s=5)
    _point(work_dir, newest)
    with captured_log(logging.WARNING) as warned:
        assert check_resume_or_load_from(True, chosen, work_dir) == chosen
    assert not any('earlier run' in m for m in warned), warned


def test_a_fresh_run_does_not_resume_and_names_the_newest_leftovers(tmp_path: Path) -> None:
    """No ``--resume`` and no ``load_from``: nothing is loaded (a fresh run), even though the
    work dir holds checkpoints; the warning names the three newest."""
    work_dir = str(tmp_path)
    for it in (4, 8, 12, 16):
        _save(osp.join(work_dir, f'iter_{it}.pth'), it)
    with captured_log(logging.WARNING) as warned:
        assert check_resume_or_load_from(False, None, work_dir) is None
    text = '\n'.join(m for m in warned if 'already holds checkpoints' in m)
    assert 'iter_8.pth, iter_12.pth, iter_16.pth' in text, warned
    assert 'iter_4.pth' not in text


def test_a_remote_load_from_is_left_to_mmengine(tmp_path: Path) -> None:
    """A URL ``load_from`` / ``--resume URL`` is not looked up on the disk."""
    assert check_resume_or_load_from(False, REMOTE, str(tmp_path)) == REMOTE
    assert check_resume_or_load_from(True, REMOTE, str(tmp_path)) == REMOTE


@pytest.mark.parametrize('resume,flag', [(True, '--resume'), (False, 'load_from')])
def test_a_damaged_explicit_checkpoint_names_the_flag(
        tmp_path: Path, resume: bool, flag: str) -> None:
    """The error says which flag named the damaged file."""
    path = _save(str(tmp_path / 'ckpt.pth'), 4)
    truncate_to_half(path)
    with pytest.raises(CheckpointFileError) as info:
        check_resume_or_load_from(resume, path, str(tmp_path / 'wd'))
    assert str(info.value).startswith(f'{flag}: ') and 'is truncated' in str(info.value)


# --------------------------------------------------------------------- seed and config of a resume
def test_a_remote_resume_keeps_the_configs_seed_without_reading_the_file() -> None:
    """A remote checkpoint is not opened before the runner: the config's seed stays, with a
    warning, and no config comparison is attempted."""
    with captured_log(logging.WARNING) as warned:
        assert resume_randomness(None, REMOTE) == dict(seed=None)
    assert any('remote checkpoint' in m for m in warned), warned
    assert resume_randomness(dict(seed=3, deterministic=True), REMOTE) == dict(
        seed=3, deterministic=True)
    assert warn_changed_resume_config(Config(dict()), REMOTE) == []


def _train_cfg(max_iters: int = 8, batch_size: int = 2, lr: float = 0.01,
               accumulative_counts: Optional[int] = None, end: int = 8,
               betas: Sequence[float] = (0.9, 0.999)) -> Config:
    """A training config holding every entry :func:`warn_changed_resume_config` compares."""
    wrapper = dict(type='OptimWrapper',
                   optimizer=dict(type='AdamW', lr=lr, betas=betas, weight_decay=0.01))
    if accumulative_counts is not None:
        wrapper['accumulative_counts'] = accumulative_counts
    return Config(dict(
        optim_wrapper=wrapper,
        param_scheduler=[dict(type='LinearLR', start_factor=0.5, by_epoch=False, begin=0,
                              end=end)],
        train_cfg=dict(type='IterBasedTrainLoop', max_iters=max_iters),
        train_dataloader=dict(batch_size=batch_size, dataset=dict(type='X'))))


@pytest.mark.parametrize('changes,names', [
    (dict(max_iters=12), ['train_cfg.max_iters']),
    (dict(batch_size=4), ['train_dataloader.batch_size']),
    (dict(accumulative_counts=2), ['optim_wrapper.accumulative_counts']),
    (dict(end=16), ['param_scheduler']),
    (dict(lr=0.1), ['optim_wrapper.optimizer']),
])
def test_each_entry_a_resume_would_not_apply_is_named(
        tmp_path: Path, changes: Dict[str, object], names: List[str]) -> None:
    """The interrupted run's config is the text mmengine stores in ``meta['cfg']``."""
    before = _train_cfg()
    ckpt = _save(str(tmp_path / 'iter_4.pth'), 4, cfg_text=before.pretty_text)
    assert warn_changed_resume_config(_train_cfg(), ckpt) == []
    with captured_log(logging.WARNING) as warned:
        assert warn_changed_resume_config(_train_cfg(**changes), ckpt) == names
    assert len(warned) == 1 and 'load_from=' in warned[0]


def test_only_the_changed_keys_are_listed_and_a_removed_one_counts(tmp_path: Path) -> None:
    """The warning lists the changed leaves only; a key the new config drops is a change."""
    before = _train_cfg(accumulative_counts=2)
    ckpt = _save(str(tmp_path / 'iter_4.pth'), 4, cfg_text=before.pretty_text)
    with captured_log(logging.WARNING) as warned:
        changed = warn_changed_resume_config(_train_cfg(lr=0.1), ckpt)
    assert changed == ['optim_wrapper.optimizer', 'optim_wrapper.accumulative_counts']
    text = warned[0]
    assert 'optim_wrapper.optimizer.lr: 0.01 -> 0.1' in text
    assert 'optim_wrapper.accumulative_counts: 2 -> None' in text
    assert 'weight_decay' not in text and 'betas' not in text  # unchanged keys are not listed


def test_a_tuple_and_a_list_of_the_same_values_are_not_a_change(tmp_path: Path) -> None:
    """``betas=(0.9, 0.999)`` in the file, ``[0.9, 0.999]`` from ``--cfg-options``: the same
    optimizer."""
    ckpt = _save(str(tmp_path / 'iter_4.pth'), 4, cfg_text=_train_cfg().pretty_text)
    assert warn_changed_resume_config(_train_cfg(betas=[0.9, 0.999]), ckpt) == []


# ---------------------------------------------------------------------------------- launcher flags
@pytest.fixture
def launch_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A clean launcher environment; what ``parse_launch_args`` exports is undone after."""
    for key in ('WORLD_SIZE', 'LOCAL_RANK', 'RANK', 'SLURM_PROCID', 'SLURM_LOCALID',
                'SLURM_NTASKS', 'SLURM_NNODES', 'SLURM_JOB_NUM_NODES', 'OMPI_COMM_WORLD_RANK',
                'OMPI_COMM_WORLD_LOCAL_RANK', 'OMPI_COMM_WORLD_SIZE', 'MASTER_ADDR'):
        monkeypatch.setenv(key, '0')  # recorded, then removed
        monkeypatch.delenv(key)
    yield


def _parse(argv: List[str]) -> argparse.Namespace:
    """``parse_launch_args`` of a parser with the tools' launch flags."""
    parser = argparse.ArgumentParser()
    parser.add_argument('config')
    add_launch_arguments(parser, 'x=1')
    return parse_launch_args(parser, argv)


@pytest.fixture
def stream_levels() -> Iterator[List[logging.Handler]]:
    """The current MMLogger's console handlers, their levels restored after the test."""
    handlers = [h for h in MMLogger.get_current_instance().handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    assert handlers
    levels = [h.level for h in handlers]
    for handler in handlers:
        handler.setLevel(logging.INFO)
    yield handlers
    for handler, level in zip(handlers, levels):
        handler.setLevel(level)


def test_local_rank_comes_from_the_launcher_or_either_flag_spelling(
        launch_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun exports LOCAL_RANK (kept: it picks the GPU); torch.distributed.launch passes
    ``--local_rank=N`` (older torch) or ``--local-rank=N``, exported as LOCAL_RANK."""
    monkeypatch.setenv('LOCAL_RANK', '3')
    assert _parse(['c.py', '--launcher', 'pytorch']).local_rank == 0
    assert os.environ['LOCAL_RANK'] == '3'
    for flag in ('--local_rank=2', '--local-rank=2'):
        monkeypatch.delenv('LOCAL_RANK')
        assert _parse(['c.py', '--launcher', 'pytorch', flag]).local_rank == 2
        assert os.environ['LOCAL_RANK'] == '2'


@pytest.mark.parametrize('launcher,variables,quiet', [
    ('pytorch', dict(RANK='0', LOCAL_RANK='0'), False),
    ('pytorch', dict(RANK='3', LOCAL_RANK='0'), True),  # second node's first GPU
    ('slurm', dict(SLURM_PROCID='5', SLURM_LOCALID='0', SLURM_NTASKS='8'), True),
    ('slurm', dict(SLURM_PROCID='0', SLURM_LOCALID='0', SLURM_NTASKS='8'), False),
    ('mpi', dict(OMPI_COMM_WORLD_RANK='6', OMPI_COMM_WORLD_LOCAL_RANK='0',
                 OMPI_COMM_WORLD_SIZE='8'), True),
    ('none', dict(RANK='3'), False),  # a stale RANK in a single-process run
])
def test_only_processes_of_global_rank_above_0_are_quieted(
        launch_env: None, monkeypatch: pytest.MonkeyPatch, stream_levels: List[logging.Handler],
        launcher: str, variables: Dict[str, str], quiet: bool) -> None:
    """Before the runner exists, a process whose *global* rank (the launcher's variable) is
    not 0 shows errors only; rank 0, and a single process, show every check."""
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    _parse(['c.py', '--launcher', launcher])
    expected = logging.ERROR if quiet else logging.INFO
    assert [h.level for h in stream_levels] == [expected] * len(stream_levels)


@pytest.mark.parametrize('address', ['localhost', '127.0.0.1', '::1', '0.0.0.0', 'LOCALHOST',
                                     ' localhost '])
@pytest.mark.parametrize('nodes_variable', ['SLURM_NNODES', 'SLURM_JOB_NUM_NODES'])
def test_every_loopback_master_addr_is_refused_in_a_multi_node_slurm_job(
        launch_env: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        address: str, nodes_variable: str) -> None:
    """Every loopback spelling (any case, padded) and either Slurm node-count variable."""
    monkeypatch.setenv('SLURM_NTASKS', '16')
    monkeypatch.setenv('SLURM_PROCID', '0')
    monkeypatch.setenv(nodes_variable, '2')
    monkeypatch.setenv('MASTER_ADDR', address)
    with pytest.raises(SystemExit):
        _parse(['c.py', '--launcher', 'slurm'])
    assert 'unset MASTER_ADDR' in capsys.readouterr().err


# ---------------------------------------------------------------------------------- CPU adaptation
def test_every_sync_bn_spelling_and_nesting_is_counted() -> None:
    """``SyncBN`` and mmcv's ``MMSyncBN`` inside dicts, lists and tuples become ``BN``."""
    model = dict(backbone=dict(norm_cfg=dict(type='MMSyncBN')),
                 heads=[dict(norm_cfg=dict(type='SyncBN')), [dict(type='SyncBN')]],
                 neck=(dict(norm=dict(type='SyncBN')), ))
    assert replace_sync_bn(model) == 4
    assert 'SyncBN' not in repr(model)


@CPU_ONLY
def test_cpu_runs_use_gloo_and_mmengines_default_wrapper_options() -> None:
    """A configured backend (nccl) cannot run on CPU; without a model_wrapper_cfg the wrapper
    has mmengine's defaults (``Runner.wrap_model``: ``broadcast_buffers=False``,
    ``find_unused_parameters`` from the config) except ``device_ids``."""
    cfg = Config(dict(model=dict(type='M'), find_unused_parameters=True,
                      env_cfg=dict(dist_cfg=dict(backend='nccl'))))
    adapt_to_device(cfg, 'pytorch')
    assert cfg.env_cfg.dist_cfg.backend == 'gloo'
    assert dict(cfg.model_wrapper_cfg) == dict(type='MMDistributedDataParallel', device_ids=None,
                                               broadcast_buffers=False,
                                               find_unused_parameters=True)


def test_the_launcher_flag_wins_over_the_configs(tmp_path: Path) -> None:
    """A config that says ``launcher = 'none'`` started with ``--launcher pytorch``: the runner
    must initialise the process group (else each process trains alone)."""
    cfg = Config(dict(default_scope='mmseg', launcher='none', model=dict(type='M'),
                      work_dir=str(tmp_path)))
    assert prepare_train_config(cfg, 'c.py', launcher='pytorch').launcher == 'pytorch'


# ----------------------------------------------------------------------------------- process group
@pytest.fixture
def one_process_group_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """What torchrun exports for one process; yields a file-store init method. Any group
    left behind is destroyed after the test."""
    for key, value in dict(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0',
                           MASTER_ADDR='127.0.0.1').items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv('MASTER_PORT', raising=False)
    yield f'file://{tmp_path / "store"}'
    if dist.is_initialized():
        dist.destroy_process_group()


@CPU_ONLY
def test_a_missing_rendezvous_variable_is_named(one_process_group_env: str) -> None:
    """Without MASTER_PORT the error names it (gloo's own error does not say what to do)."""
    with pytest.raises(LaunchError, match='MASTER_PORT'):
        init_cpu_distributed('pytorch')
    assert not dist.is_initialized()


@CPU_ONLY
def test_an_existing_group_is_kept_and_destroyed_at_the_end(one_process_group_env: str) -> None:
    """A group that already exists is used as it is, and the tools destroy it at the end."""
    dist.init_process_group('gloo', init_method=one_process_group_env, rank=0, world_size=1)
    init_cpu_distributed('pytorch')  # the runner's group exists: nothing to do
    assert dist.is_initialized() and dist.get_world_size() == 1
    finish_distributed()
    assert not dist.is_initialized()


def test_launch_and_resume_errors_are_user_errors() -> None:
    """tools/*.py print these as one ``error:`` line (exit status 1)."""
    errors = user_errors()
    assert ResumeError in errors and LaunchError in errors


# ----------------------------------------------------------------------------- training safeguards
def test_safeguards_are_added_once_and_scoped_checkpoint_hooks_become_atomic() -> None:
    """A hook the config already has is not added twice; ``mmengine.CheckpointHook`` is
    replaced like ``CheckpointHook``."""
    cfg = Config(dict(custom_hooks=[dict(type='mmlinvit.CheckFiniteHook')],
                      default_hooks=dict(checkpoint=dict(type='mmengine.CheckpointHook',
                                                         interval=2))))
    add_training_safeguards(cfg)
    assert [h['type'] for h in cfg.custom_hooks].count('mmlinvit.CheckFiniteHook') == 1
    assert cfg.default_hooks.checkpoint.type == 'mmlinvit.AtomicCheckpointHook'


# ------------------------------------------------------------------------------------ build_runner
class _StubRunner:
    """What ``Runner.from_cfg`` is replaced by: keeps the config it was given."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.logger = MMLogger.get_current_instance()


@pytest.fixture
def stub_runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``build_runner`` without the input checks of data roots and without a real Runner."""
    monkeypatch.setattr(launch, 'check_inputs', lambda cfg, mode, checkpoint: None)
    monkeypatch.setattr(launch.Runner, 'from_cfg', staticmethod(_StubRunner))
    yield


def _run_cfg(work_dir: str, **entries: object) -> Config:
    """A minimal training config for :func:`launch.build_runner` with ``entries`` merged."""
    cfg = Config(dict(work_dir=work_dir, launcher='none', model=dict(type='M'),
                      train_dataloader=dict(dataset=dict(type='X'),
                                            sampler=dict(type='DefaultSampler')),
                      optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1)),
                      default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2))))
    cfg.merge_from_dict(entries)
    return cfg


def test_build_runner_hands_the_selected_checkpoint_to_the_runner(
        tmp_path: Path, stub_runner: None) -> None:
    """``--resume`` with a damaged last checkpoint: the runner gets the intact previous one as
    ``load_from`` (left None, mmengine would resume the damaged file ``last_checkpoint``
    names) and the interrupted run's seed."""
    work_dir = str(tmp_path)
    previous = _save(osp.join(work_dir, 'iter_2.pth'), 2, seed=77, age_s=30)
    latest = _save(osp.join(work_dir, 'iter_4.pth'), 4, seed=77, age_s=10)
    truncate_to_half(latest)
    _point(work_dir, latest)
    runner = launch.build_runner(_run_cfg(work_dir, resume=True, load_from=None))
    assert _same(runner.cfg.load_from, previous)
    assert runner.cfg.randomness['seed'] == 77


def test_build_runner_keeps_the_seed_and_checks_coverage_for_load_from(
        tmp_path: Path, stub_runner: None) -> None:
    """``load_from`` without ``--resume`` (fine-tuning): the run keeps its own seed (not the
    pretrained run's) and gets the coverage check."""
    ckpt = _save(str(tmp_path / 'pretrained.pth'), 100, seed=1234)
    runner = launch.build_runner(_run_cfg(str(tmp_path / 'wd'), load_from=ckpt))
    assert (runner.cfg.get('randomness', None) or {}).get('seed') is None
    assert 'mmlinvit.CheckpointCoverageHook' in [h['type'] for h in runner.cfg.custom_hooks]
    resumed = launch.build_runner(_run_cfg(str(tmp_path / 'wd'), load_from=ckpt, resume=True))
    assert resumed.cfg.randomness['seed'] == 1234
    assert 'mmlinvit.CheckpointCoverageHook' not in [h['type'] for h in resumed.cfg.custom_hooks]


def test_build_runner_warns_about_a_changed_resumed_config(
        tmp_path: Path, stub_runner: None) -> None:
    """A resumed run whose ``max_iters`` changed is warned about before the runner is built."""
    before = _run_cfg(str(tmp_path), train_cfg=dict(type='IterBasedTrainLoop', max_iters=8))
    ckpt = _save(str(tmp_path / 'iter_4.pth'), 4, cfg_text=before.pretty_text)
    with captured_log(logging.WARNING) as warned:
        launch.build_runner(_run_cfg(str(tmp_path), resume=True, load_from=ckpt,
                                     train_cfg=dict(type='IterBasedTrainLoop', max_iters=12)))
    assert any('train_cfg.max_iters: 8 -> 12' in m for m in warned), warned


@CPU_ONLY
def test_build_runner_refuses_a_gpu_launcher_on_cpu(tmp_path: Path, stub_runner: None) -> None:
    """``--launcher slurm`` without a GPU stops before the runner, naming torchrun."""
    with pytest.raises(LaunchError, match='torchrun'):
        launch.build_runner(_run_cfg(str(tmp_path), launcher='slurm'))


def test_a_configured_experiment_name_is_kept(
        tmp_path: Path, stub_runner: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a run without ``experiment_name`` gets a distinct one from its second runner on."""
    monkeypatch.setattr(launch, '_runners_built', 5)
    runner = launch.build_runner(_run_cfg(str(tmp_path), experiment_name='mine'))
    assert runner.cfg.experiment_name == 'mine'
    runner = launch.build_runner(_run_cfg(str(tmp_path)))
    assert runner.cfg.experiment_name == 'run-run7'
