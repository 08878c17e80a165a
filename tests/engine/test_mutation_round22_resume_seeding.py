"""``--resume``, the saved random streams and the per-sample seeds on branches that the rest
of the suite let pass (mutation round 22): each test below failed on at least one
single-line change of the module that no other test caught.

Guarded here, each against torch's / numpy's / mmengine's own behaviour run in the test
(``find_latest_checkpoint``, ``DistSamplerSeedHook``, ``Runner.register_hook``,
``SeedSequence``) or a value worked out by hand:

* :mod:`mmlinvit.engine.hooks.random_state_hook`: the CUDA generator of a process that uses
  CUDA is saved and put back (dropout / drop-path of a GPU run draw from it), and
  ``torch.cuda.get_rng_state`` is not called where CUDA was never initialised (it would
  initialise it); a CPU run's states resume on a CUDA machine and a GPU run's on a CPU-only
  one; a run without validation gets its train loader's generator; the warning of a
  resume without states names the seed each rank now uses
  (``SeedSequence(seed, spawn_key=(0x72616E6B, rank, iteration))``, computed here); the
  documented default iteration 0 and seed modulo 2**64; the hook runs before the NORMAL
  priority hooks in mmengine's own hook order;
* :mod:`mmlinvit.engine.sample_seeding`: a data set given as a config is built and seeded;
  mmengine's ``DistSamplerSeedHook`` sets the epoch of a wrapped sampler that has no
  ``set_epoch`` (as torch's samplers), and the epoch reaches every sample seed;
* :mod:`mmlinvit.engine.resume`: one damaged latest checkpoint (the one mmengine would load)
  is named without an empty "Also skipped" list; "nothing to resume" lists the first ten
  entries of the work dir; a fresh run into a work dir without numbered checkpoints is not
  warned; a checkpoint without ``meta['cfg']`` is not compared and nothing is logged; an
  earlier run's checkpoints are named in numeric order; a config seed is kept silently when
  the checkpoint records none; an ``EMAHook`` given as the class, and a hook type no
  registry knows, in ``custom_hooks``; the changed-config warning names the checkpoint.
"""
import logging
import os
import os.path as osp
import random
import types
from pathlib import Path
from typing import Any, List
from unittest import mock

import numpy as np
import pytest
import torch

from mmlinvit.engine import resume
from mmlinvit.engine.hooks import random_state_hook
from mmlinvit.engine.hooks.random_state_hook import (RandomStateHook, capture_random_state,
                                                     rank_stream_seed, restore_random_state)
from mmlinvit.engine.sample_seeding import (SampleSeedDataset, build_sample_seed_sampler,
                                            sample_seed)

from checkpoint_damage import truncate_to_half
from test_mutation_round11_launch_resume import _point, _save
from test_mutation_round17_hooks import keep_random_state  # noqa: F401 (a fixture)
from train_testing import captured_log

pytestmark = pytest.mark.usefixtures('one_thread')

#: A CUDA generator state as ``torch.cuda.get_rng_state`` returns it (a uint8 CPU tensor).
CUDA_STATE = torch.arange(16, dtype=torch.uint8)


# ------------------------------------------------------------------ RandomStateHook: CUDA
def test_capture_holds_the_cuda_stream_only_of_a_process_that_uses_cuda(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.cuda.get_rng_state`` initialises CUDA: a process that never used it (a CPU
    run on a GPU machine) has no CUDA stream to save; one that did must save it."""
    read: List[int] = []

    def get_rng_state(device: Any = 'cuda') -> torch.Tensor:
        read.append(1)
        return CUDA_STATE.clone()

    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'get_rng_state', get_rng_state)
    monkeypatch.setattr(torch.cuda, 'is_initialized', lambda: False)
    assert 'cuda' not in capture_random_state() and read == []
    monkeypatch.setattr(torch.cuda, 'is_initialized', lambda: True)
    state = capture_random_state()
    assert torch.equal(state['cuda'], CUDA_STATE) and read == [1]


def test_restore_puts_back_the_cuda_stream_where_one_was_saved_and_cuda_exists(
        monkeypatch: pytest.MonkeyPatch, keep_random_state: None) -> None:
    written: List[torch.Tensor] = []
    monkeypatch.setattr(torch.cuda, 'set_rng_state',
                        lambda state, device='cuda': written.append(state))
    cpu_run = dict(python=random.getstate(), numpy=np.random.get_state(),
                   torch=torch.random.get_rng_state())
    gpu_run = dict(cpu_run, cuda=CUDA_STATE.clone())

    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    restore_random_state(cpu_run)  # a CPU run resumed on a GPU machine
    assert written == []
    restore_random_state(gpu_run)
    assert len(written) == 1 and torch.equal(written[0], CUDA_STATE)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    restore_random_state(gpu_run)  # a GPU run resumed on a CPU-only machine
    assert len(written) == 1


# ------------------------------------------------------------------ RandomStateHook: runs
def test_a_run_without_validation_gets_its_private_train_generator() -> None:
    """``runner.val_loop`` is None without ``val_cfg`` (mmengine builds no loop)."""
    train = torch.utils.data.DataLoader(list(range(4)))
    runner = types.SimpleNamespace(seed=7, train_dataloader=train, val_loop=None)
    RandomStateHook().before_train(runner)
    assert train.generator is not None and train.generator.initial_seed() == 7


@pytest.mark.parametrize('rank', [0, 1])
def test_the_warning_of_a_resume_without_states_names_the_seed_of_the_rank(
        rank: int, keep_random_state: None) -> None:
    seed, at_iter = 5, 4
    expected = int(np.random.SeedSequence(
        seed, spawn_key=(0x72616E6B, rank, at_iter)).generate_state(1)[0])
    runner = types.SimpleNamespace(seed=seed, iter=at_iter)
    hook = RandomStateHook()
    with mock.patch.object(random_state_hook, 'get_dist_info', return_value=(rank, 2)), \
            captured_log(logging.WARNING) as warned:
        hook.after_load_checkpoint(runner, {'meta': dict(iter=at_iter)})
        hook.before_train_iter(runner, 0)
    after = torch.random.get_rng_state()
    assert len(warned) == 1 and f'seeded with {expected} from (run seed {seed}, rank {rank}, ' \
        f'iteration {at_iter})' in warned[0], warned
    torch.manual_seed(expected)
    assert torch.equal(after, torch.random.get_rng_state())


def test_rank_stream_seed_defaults_to_iteration_0_and_takes_the_seed_modulo_2_64() -> None:
    """The documented signature: ``iteration`` 0 (a fresh run) unless given, the run seed
    taken modulo 2**64 (``SeedSequence`` computed here)."""
    for seed, rank in ((5, 1), (0, 3)):
        fresh = np.random.SeedSequence(seed, spawn_key=(0x72616E6B, rank, 0))
        assert rank_stream_seed(seed, rank) == int(fresh.generate_state(1)[0])
    for seed in (-1, -2**40, 2**64 + 5):
        wrapped = np.random.SeedSequence(seed % 2**64, spawn_key=(0x72616E6B, 2, 3))
        assert rank_stream_seed(seed, 2, 3) == int(wrapped.generate_state(1)[0]), seed


def test_streams_are_put_back_before_normal_priority_hooks_run() -> None:
    """In mmengine's own hook order (``Runner.register_hook``), the hook's
    ``before_train_iter`` comes before any NORMAL hook's (one that draws random numbers, e.g.
    a masking or mixing hook, must draw from the restored streams)."""
    from mmengine.hooks import Hook
    from mmengine.runner import Runner

    class Drawing(Hook):
        priority = 'NORMAL'

    stub = types.SimpleNamespace(_hooks=[])
    drawing, streams = Drawing(), RandomStateHook()
    Runner.register_hook(stub, drawing)
    Runner.register_hook(stub, streams)
    assert stub._hooks == [streams, drawing]


# ------------------------------------------------------------------ sample seeding
class _InOrder(torch.utils.data.Sampler):
    """A sampler with no ``set_epoch`` (as torch's own), built as mmengine builds samplers."""

    def __init__(self, dataset: Any, seed: Any = None) -> None:
        self.size = len(dataset)

    def __iter__(self):
        return iter(range(self.size))

    def __len__(self) -> int:
        return self.size


def test_mmengines_seed_hook_sets_the_epoch_of_a_sampler_without_set_epoch() -> None:
    """The wrapper always has ``set_epoch``, so mmengine's ``DistSamplerSeedHook`` calls it
    every epoch, whatever it wraps: it must not fail on a sampler without one, and the epoch
    must reach every sample seed."""
    from mmengine.hooks import DistSamplerSeedHook
    sampler = build_sample_seed_sampler(list(range(5)), dict(type=_InOrder), seed=3)
    assert isinstance(sampler.sampler, _InOrder)
    runner = types.SimpleNamespace(
        epoch=2, train_loop=types.SimpleNamespace(
            dataloader=types.SimpleNamespace(sampler=sampler)))
    DistSamplerSeedHook().before_train_epoch(runner)
    assert list(sampler) == [(i, sample_seed(3, 2, i)) for i in range(5)]


class _Draws:
    """A data set whose samples are draws from the global python stream."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> float:
        return random.random()


def test_a_dataset_given_as_a_config_is_built_and_seeded(keep_random_state: None) -> None:
    """``tools/train.py`` wraps the loader's dataset *config*: the wrapper builds it (as
    mmengine's ``DATASETS.build``) and seeds each sample."""
    wrapper = SampleSeedDataset(dict(type=_Draws, size=4))
    assert isinstance(wrapper.dataset, _Draws) and len(wrapper) == 4
    random.seed(11)
    assert wrapper[(2, 11)] == random.random()


# ------------------------------------------------------------------ --resume
def test_one_damaged_latest_is_named_without_an_empty_also_skipped_list(tmp_path: Path) -> None:
    """mmengine would load ``iter_8.pth`` (its ``find_latest_checkpoint``); it was cut short, so
    ``iter_4.pth`` is resumed: the warning names the one skipped file and lists no others."""
    from mmengine.runner import find_latest_checkpoint
    work_dir = str(tmp_path)
    previous = _save(osp.join(work_dir, 'iter_4.pth'), 4, age_s=10)
    latest = _save(osp.join(work_dir, 'iter_8.pth'), 8)
    truncate_to_half(latest)
    _point(work_dir, latest)
    assert find_latest_checkpoint(work_dir) == latest
    with captured_log(logging.WARNING) as warned:
        assert resume.select_resume_checkpoint(work_dir) == previous
    assert len(warned) == 1 and f'{latest} is truncated' in warned[0], warned
    assert 'Also skipped' not in warned[0], warned


def test_nothing_to_resume_lists_the_first_ten_entries_of_the_work_dir(tmp_path: Path) -> None:
    names = [f'log_{i:02d}.txt' for i in range(12)]
    for name in names:
        (tmp_path / name).write_text('x')
    with pytest.raises(resume.ResumeError) as info:
        resume.select_resume_checkpoint(str(tmp_path))
    assert f'the folder holds {names[:10]}' in str(info.value), str(info.value)


def test_a_fresh_run_in_a_work_dir_without_checkpoints_is_not_warned(tmp_path: Path) -> None:
    """Only numbered checkpoints of an earlier run are worth a warning; logs are not."""
    (tmp_path / '20261203_101010').mkdir()
    (tmp_path / 'best_mIoU_iter_4.pth').write_bytes(b'x')
    with captured_log(logging.WARNING) as warned:
        assert resume.check_resume_or_load_from(False, None, str(tmp_path)) is None
    assert warned == []


def test_a_checkpoint_without_a_stored_config_is_not_compared_and_nothing_is_logged(
        tmp_path: Path) -> None:
    """mmengine stores ``meta['cfg']`` only when the runner has a config: without it there is
    nothing to compare, and nothing to report."""
    from mmengine.config import Config
    path = _save(str(tmp_path / 'iter_4.pth'), 4)
    with captured_log(logging.DEBUG) as logged:
        assert resume.warn_changed_resume_config(Config(dict(train_cfg=dict(max_iters=8))),
                                                 path) == []
    assert logged == [], logged


def _aged(path: str, mtime: float) -> str:
    os.utime(path, (mtime, mtime))
    return path


def test_earlier_runs_checkpoints_are_listed_by_number(tmp_path: Path) -> None:
    """``last_checkpoint`` names iter_8 (written at t=5000); iter_9 ... iter_100 were written
    before it, by an earlier run into the same work dir: left out, and named in numeric
    order (not the order of a set, nor '100' < '20')."""
    work_dir = str(tmp_path)
    named = _aged(_save(osp.join(work_dir, 'iter_8.pth'), 8), 5000.0)
    steps = (100, 20, 9, 60, 30)
    for step in steps:
        _aged(_save(osp.join(work_dir, f'iter_{step}.pth'), step), 1000.0 + step)
    _point(work_dir, named)
    _, _, stale = resume.resume_candidates(work_dir)
    expected = [f'iter_{step}.pth' for step in sorted(steps)]
    assert [osp.basename(p) for p in stale] == expected
    with captured_log(logging.WARNING) as warned:
        assert resume.select_resume_checkpoint(work_dir) == osp.normpath(named)
    assert len(warned) == 1 and f'also holds {", ".join(expected)}, written before' in warned[0]


def test_a_config_seed_is_kept_silently_when_the_checkpoint_records_none(tmp_path: Path) -> None:
    """Nothing to compare it with: the config's seed is used and nothing is warned (the
    warning says "sets no randomness.seed", which would be false)."""
    path = _save(str(tmp_path / 'iter_4.pth'), 4, seed=None)
    with captured_log(logging.WARNING) as warned:
        assert resume.resume_randomness(dict(seed=7), path) == dict(seed=7)
    assert warned == []


def test_ema_hooks_given_as_a_class_or_of_an_unknown_type_are_told_apart(tmp_path: Path) -> None:
    """``custom_hooks`` entries as mmengine builds them: ``type`` may be the class itself (a
    pure-Python config), or a name no registry knows (a project's hook, imported later by
    ``custom_imports``); neither breaks the comparison."""
    from mmengine.config import Config
    from mmengine.hooks import EMAHook
    text = "custom_hooks = [dict(type='EMAHook', momentum=0.01)]\n"
    path = str(tmp_path / 'iter_4.pth')
    torch.save(dict(meta=dict(cfg=text, iter=4), state_dict={}), path)
    kept = Config(dict(custom_hooks=[dict(type=EMAHook, momentum=0.01)]))
    assert resume.warn_changed_resume_config(kept, path) == []
    unknown = Config(dict(custom_hooks=[dict(type='MyProjectHookNotRegistered')]))
    assert resume.warn_changed_resume_config(unknown, path) == ['custom_hooks.EMAHook']


def test_the_changed_config_warning_names_where_the_old_config_is_stored(
        tmp_path: Path) -> None:
    from mmengine.config import Config
    path = _save(str(tmp_path / 'iter_4.pth'), 4,
                 cfg_text=Config(dict(train_cfg=dict(max_iters=8))).pretty_text)
    with captured_log(logging.WARNING) as warned:
        assert resume.warn_changed_resume_config(
            Config(dict(train_cfg=dict(max_iters=12))), path) == ['train_cfg.max_iters']
    assert len(warned) == 1 and warned[0].startswith(
        f"--resume: this config differs from the interrupted run's (stored in {path}):"), warned
