"""The training hooks of :mod:`mmlinvit.engine.hooks` on branches that the rest of the suite
let pass (mutation round 17): each test below failed on at least one single-line change of a
hook that no other test caught.

Guarded here, each against mmengine's own classes (a real ``Runner`` with mmengine's
``CheckpointHook`` as the reference, ``AmpOptimWrapper`` / ``GradScaler``, ``DataParallel``) or
a hand-written expectation:

* ``AtomicCheckpointHook``: a real run saves every checkpoint (not only the first) through a
  ``.part`` file, rotates only after the new file is in place and ends with what mmengine's
  ``CheckpointHook`` leaves (kept file, ``last_checkpoint``, weights); a failed write leaves no
  ``.part`` file and restores the backend's methods; a rotated file that vanished during the
  write is no error; a file re-saved under its name in an out_dir spelled with ``./`` is kept;
  only rank 0 clears unfinished writes; no epoch-window warning in an iteration loop;
* ``CheckFiniteHook``: python-number losses, non-loss keys, empty tensors, a disabled loss
  scaler and the ``min_loss_scale`` boundary, the weight names of a wrapped model;
* ``RandomStateHook``: python and numpy streams are seeded per rank too; ``rank_streams=False``
  leaves the streams to mmengine (fresh and resumed);
* ``DistillLossScheduleHook``: the argument checks, the end-of-run warning in epochs and at
  its boundary, the factor set and logged in ``before_train``, the model check.
"""
import logging
import os
import os.path as osp
import random
import types
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn as nn
from mmengine.fileio import LocalBackend
from mmengine.hooks import Hook
from mmengine.logging import MessageHub
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

from mmlinvit.engine.hooks import (AtomicCheckpointHook, CheckFiniteHook, DistillLossScheduleHook,
                                   RandomStateHook)
from mmlinvit.engine.hooks import atomic_checkpoint_hook, random_state_hook
from mmlinvit.engine.hooks.check_finite_hook import _as_float

from test_mutation_round9_hooks import _Points, _ToyModel
from train_testing import captured_log

pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture
def keep_random_state() -> Iterator[None]:
    """Restores the python / numpy / torch streams the test re-seeds."""
    python, numpy_state, torch_state = (random.getstate(), np.random.get_state(),
                                        torch.random.get_rng_state())
    yield
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.random.set_rng_state(torch_state)


@pytest.fixture
def runner_globals() -> Iterator[None]:
    """Restores what building a real ``Runner`` changes globally: mmengine's current
    logger / message hub / default scope / visualizer (new instances are removed, their log
    files closed), the random streams it seeds, OpenCV's thread count and the
    multiprocessing start method it sets."""
    import multiprocessing as mp

    import cv2
    from mmengine.logging import MMLogger
    from mmengine.registry import DefaultScope
    from mmengine.visualization import Visualizer
    kinds = (MMLogger, MessageHub, DefaultScope, Visualizer)
    before = {kind: set(kind._instance_dict) for kind in kinds}
    python, numpy_state, torch_state = (random.getstate(), np.random.get_state(),
                                        torch.random.get_rng_state())
    threads, method = cv2.getNumThreads(), mp.get_start_method(allow_none=True)
    yield
    for kind in kinds:
        for name in set(kind._instance_dict) - before[kind]:
            instance = kind._instance_dict.pop(name)
            for handler in list(getattr(instance, 'handlers', [])):
                handler.close()
                instance.removeHandler(handler)
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.random.set_rng_state(torch_state)
    cv2.setNumThreads(threads)
    if mp.get_start_method(allow_none=True) != method:
        mp.set_start_method(method, force=True)


# ------------------------------------------------------------------ AtomicCheckpointHook
def _atomic_hook(out_dir: str) -> AtomicCheckpointHook:
    hook = AtomicCheckpointHook(by_epoch=False, interval=1)
    hook.out_dir, hook.file_backend = out_dir, LocalBackend()
    return hook


def _train_toy(work_dir: str, checkpoint_hook: Hook) -> None:
    """Trains :class:`_ToyModel` 3 iterations (seed 0) with a real ``Runner``."""
    from mmengine.runner import Runner
    torch.manual_seed(0)  # the same initial weights
    Runner(model=_ToyModel(), work_dir=work_dir,
           train_dataloader=dict(dataset=_Points(2), batch_size=1, num_workers=0,
                                 sampler=dict(type='InfiniteSampler', shuffle=False),
                                 collate_fn=dict(type='default_collate')),
           train_cfg=dict(by_epoch=False, max_iters=3),
           optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
           default_hooks=dict(checkpoint=checkpoint_hook), randomness=dict(seed=0),
           default_scope='mmengine', log_level='WARNING',
           experiment_name=f'round17_{osp.basename(work_dir)}').train()


@pytest.mark.usefixtures('runner_globals')
def test_every_save_of_a_real_run_is_written_then_renamed_then_rotated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real ``Runner`` with ``interval=1, max_keep_ckpts=1``: mmengine's hook deletes
    ``iter_{n-1}.pth`` before writing ``iter_n.pth``; this one writes ``iter_n.pth.part``
    while the previous checkpoint is still there, for the 2nd and 3rd save as for the 1st,
    and ends as mmengine's ``CheckpointHook`` ends the same run: the same kept file, the same
    ``last_checkpoint`` pointer, the same weights and meta.  The unfinished write an earlier
    (killed) run left is removed when training starts."""
    from mmengine.hooks import CheckpointHook
    from mmengine.runner import Runner
    reference = str(tmp_path / 'mmengine')
    _train_toy(reference, CheckpointHook(by_epoch=False, interval=1, max_keep_ckpts=1))
    work_dir = str(tmp_path / 'atomic')
    calls: List[tuple] = []
    original = Runner.save_checkpoint

    def recording_save(self, out_dir: str, filename: str, *args: Any, **kwargs: Any) -> None:
        calls.append((filename, sorted(n for n in os.listdir(out_dir) if n.endswith('.pth'))))
        assert 'save_checkpoint' in vars(self)  # called through the hook's wrapper
        return original(self, out_dir, filename, *args, **kwargs)

    monkeypatch.setattr(Runner, 'save_checkpoint', recording_save)
    os.makedirs(work_dir)
    Path(work_dir, 'iter_9.pth.part').write_bytes(b'killed')  # an earlier run's unfinished write
    _train_toy(work_dir, AtomicCheckpointHook(by_epoch=False, interval=1, max_keep_ckpts=1))
    assert calls == [('iter_1.pth.part', []), ('iter_2.pth.part', ['iter_1.pth']),
                     ('iter_3.pth.part', ['iter_2.pth'])]
    kept = {folder: sorted(n for n in os.listdir(folder) if 'pth' in n)
            for folder in (reference, work_dir)}
    assert kept[work_dir] == kept[reference] == ['iter_3.pth']
    for folder in (reference, work_dir):
        with open(osp.join(folder, 'last_checkpoint')) as f:
            assert f.read() == osp.join(folder, 'iter_3.pth')
    ours, theirs = (torch.load(osp.join(folder, 'iter_3.pth'), map_location='cpu',
                               weights_only=False) for folder in (work_dir, reference))
    assert ours['meta']['iter'] == theirs['meta']['iter'] == 3
    assert ours['state_dict'].keys() == theirs['state_dict'].keys()
    for key, value in theirs['state_dict'].items():
        assert torch.equal(ours['state_dict'][key], value), key


def test_a_failed_write_leaves_no_part_file_and_keeps_the_rotated_checkpoint(
        tmp_path: Path) -> None:
    """A write that fails (a full disk) removes its ``.part`` file, re-raises, and the
    checkpoint that rotation would have removed stays."""
    old = tmp_path / 'iter_2.pth'
    old.write_bytes(b'old')
    hook = _atomic_hook(str(tmp_path))

    def save_checkpoint(out_dir: str, filename: str, *args: Any, **kwargs: Any) -> None:
        Path(out_dir, filename).write_bytes(b'trunc')
        raise OSError(28, 'No space left on device')

    runner = types.SimpleNamespace(save_checkpoint=save_checkpoint)
    with pytest.raises(OSError, match='No space left'):
        with hook._atomic_saves(runner):
            hook.file_backend.remove(str(old))  # mmengine's max_keep_ckpts rotation
            runner.save_checkpoint(str(tmp_path), 'iter_4.pth')
    assert os.listdir(tmp_path) == ['iter_2.pth'] and old.read_bytes() == b'old'
    assert not {'remove', 'rmtree'} & set(vars(hook.file_backend))  # the class's methods


def test_a_rotated_file_that_vanished_during_the_write_is_no_error(tmp_path: Path) -> None:
    """The removal is deferred until after the write (minutes for a large model): a file
    removed meanwhile (by hand, by another job) does not fail the save."""
    old = tmp_path / 'iter_2.pth'
    old.write_bytes(b'old')
    hook = _atomic_hook(str(tmp_path))

    def save_checkpoint(out_dir: str, filename: str, *args: Any, **kwargs: Any) -> None:
        Path(out_dir, filename).write_bytes(b'new')
        old.unlink()

    runner = types.SimpleNamespace(save_checkpoint=save_checkpoint)
    with hook._atomic_saves(runner):
        hook.file_backend.remove(str(old))
        runner.save_checkpoint(str(tmp_path), 'iter_4.pth')
    assert os.listdir(tmp_path) == ['iter_4.pth']


def test_a_file_resaved_under_its_name_is_kept_in_an_out_dir_spelled_with_dots(
        tmp_path: Path) -> None:
    """``filename_tmpl`` without ``{}`` plus rotation: mmengine removes the previous file of
    the same name, which here is the new file. ``out_dir='<dir>/./ckpt'`` (as a user may
    write it; ``CheckpointHook`` keeps it unnormalised) must not make the two paths differ."""
    (tmp_path / 'ckpt').mkdir()
    out_dir = str(tmp_path) + '/./ckpt'
    (tmp_path / 'ckpt' / 'latest.pth').write_bytes(b'old')
    hook = _atomic_hook(out_dir)

    def save_checkpoint(out_dir: str, filename: str, *args: Any, **kwargs: Any) -> None:
        Path(out_dir, filename).write_bytes(b'new')

    runner = types.SimpleNamespace(save_checkpoint=save_checkpoint)
    with hook._atomic_saves(runner):
        hook.file_backend.remove(hook.file_backend.join_path(out_dir, 'latest.pth'))
        runner.save_checkpoint(out_dir, 'latest.pth')
    assert (tmp_path / 'ckpt' / 'latest.pth').read_bytes() == b'new'


def test_only_the_main_process_clears_unfinished_writes(tmp_path: Path) -> None:
    """Ranks sharing a work dir: rank > 0 does not list and remove ``*.pth.part`` files
    (rank 0 does; two processes removing the same file would crash one of them)."""
    (tmp_path / 'iter_8.pth.part').write_bytes(b'x')
    with mock.patch.object(atomic_checkpoint_hook, 'is_main_process', return_value=False), \
            captured_log(logging.WARNING) as warned:
        _atomic_hook(str(tmp_path))._remove_stale_parts()
    assert os.listdir(tmp_path) == ['iter_8.pth.part'] and warned == []
    _atomic_hook(str(tmp_path))._remove_stale_parts()
    assert os.listdir(tmp_path) == []


def test_an_iteration_loop_is_not_warned_about_epoch_windows() -> None:
    """``IterBasedTrainLoop`` has no epoch ends inside training (``by_epoch=True`` only saves
    at the run's end, which is never resumed): no accumulation-window warning."""
    loop = IterBasedTrainLoop.__new__(IterBasedTrainLoop)
    loop.dataloader = list(range(6))
    runner = types.SimpleNamespace(train_loop=loop,
                                   optim_wrapper=types.SimpleNamespace(_accumulative_counts=4))
    with captured_log(logging.WARNING) as warned:
        AtomicCheckpointHook(by_epoch=True, interval=1)._warn_epoch_checkpoints_inside_windows(
            runner)
    assert warned == []


# ------------------------------------------------------------------ CheckFiniteHook
@pytest.fixture
def cpu_amp(monkeypatch: pytest.MonkeyPatch) -> None:
    """AmpOptimWrapper refuses CPU-only machines; give it torch's CPU GradScaler."""
    import functools

    import mmengine.optim.optimizer.amp_optimizer_wrapper as amp
    if not torch.cuda.is_available():
        monkeypatch.setattr(amp, 'is_cuda_available', lambda: True)
        monkeypatch.setattr(amp, 'GradScaler', functools.partial(torch.amp.GradScaler,
                                                                 device='cpu'))


def _finite_runner(tmp_path: Path, name: str, optim_wrapper: Any = None,
                   model: Optional[nn.Module] = None) -> types.SimpleNamespace:
    """A stand-in runner with what ``CheckFiniteHook`` reads."""
    return types.SimpleNamespace(work_dir=str(tmp_path), iter=0, epoch=0, max_iters=100,
                                 max_epochs=3, hooks=[],
                                 message_hub=MessageHub(f'round17_{name}'),
                                 model=model if model is not None else nn.Linear(2, 1),
                                 optim_wrapper=optim_wrapper or object())


@pytest.mark.parametrize('outputs,stops', [
    (dict(loss=float('nan')), True),  # a model whose log_vars hold python numbers
    (dict(loss=float('-inf')), True),
    (dict(loss=3), False),
    (dict(loss=torch.tensor(1.0), acc=float('nan'), top1=torch.tensor(float('inf'))), False),
])
def test_python_number_losses_are_checked_and_other_keys_are_not(tmp_path: Path,
                                                                 outputs: Dict[str, Any],
                                                                 stops: bool) -> None:
    """Loss terms are the keys containing ``loss`` (as mmengine's ``parse_losses`` sums
    them), whether tensors or python numbers; an accuracy of NaN stops nothing."""
    hook = CheckFiniteHook()
    runner = _finite_runner(tmp_path, f'numbers_{len(outputs)}_{stops}')
    if stops:
        with pytest.raises(FloatingPointError, match=r"Non-finite loss \(loss=-?(nan|inf)\)"):
            hook.after_train_iter(runner, 0, outputs=outputs)
    else:
        hook.after_train_iter(runner, 0, outputs=outputs)


def test_an_empty_logged_tensor_is_no_number() -> None:
    """``_as_float``: an empty tensor has no value (its mean would be a NaN nobody made)."""
    assert _as_float(torch.empty(0)) is None
    assert _as_float(torch.tensor([1.0, 3.0])) == 2.0
    assert _as_float('nan') is None


@pytest.mark.usefixtures('cpu_amp')
@pytest.mark.parametrize('loss_scale,min_loss_scale,stops', [
    (dict(init_scale=0.5), 0.5, False),  # at the threshold: not below it
    (dict(init_scale=0.5), 0.75, True),
    # a disabled scaler (AMP without loss scaling) reports scale 1.0 but scales nothing
    (dict(init_scale=0.5, enabled=False), 2.0, False),
])
def test_only_an_enabled_scale_below_the_threshold_stops(tmp_path: Path, loss_scale: dict,
                                                         min_loss_scale: float,
                                                         stops: bool) -> None:
    from mmengine.optim import AmpOptimWrapper
    wrapper = AmpOptimWrapper(optimizer=torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1),
                              loss_scale=loss_scale)
    assert float(wrapper.loss_scaler.get_scale()) == (0.5 if loss_scale.get('enabled', True)
                                                      else 1.0)
    hook = CheckFiniteHook(min_loss_scale=min_loss_scale)
    runner = _finite_runner(tmp_path, f'scale_{min_loss_scale}', optim_wrapper=wrapper)
    hook.before_train(runner)
    if stops:
        with pytest.raises(FloatingPointError, match='loss scale 0.5 fell below min_loss_scale '
                                                     '0.75 at iteration 1'):
            hook.after_train_iter(runner, 0, outputs=dict(loss=torch.tensor(1.0)))
    else:
        hook.after_train_iter(runner, 0, outputs=dict(loss=torch.tensor(1.0)))


def test_weights_of_a_wrapped_model_are_named_as_its_checkpoint_names_them(
        tmp_path: Path) -> None:
    """A model wrapper (``DataParallel`` here, ``MMDistributedDataParallel`` in a launched
    run) is looked through: the names are the model's own, as mmengine's checkpoints store
    them (without ``module.``)."""
    inner = nn.Sequential(nn.Linear(2, 2))
    with torch.no_grad():
        inner[0].bias[1] = float('nan')
    runner = _finite_runner(tmp_path, 'wrapped', model=nn.DataParallel(inner))
    with pytest.raises(FloatingPointError, match=r'Non-finite model weights \(0\.bias\) at '
                                                 r'iteration 1'):
        CheckFiniteHook(check_params_every_iter=True).after_train_iter(
            runner, 0, outputs=dict(loss=torch.tensor(1.0)))


# ------------------------------------------------------------------ RandomStateHook
@pytest.mark.usefixtures('keep_random_state')
def test_a_fresh_multi_process_run_seeds_all_three_streams_of_its_rank() -> None:
    """Rank 1 of 2 at the first iteration: python ``random``, numpy and torch all restart
    from SeedSequence(run seed, spawn_key=('rank', rank, 0)) (DeiT / timm seed all three with
    ``seed + rank``; dropout and Mixup draw from them)."""
    hook = RandomStateHook()
    with mock.patch.object(random_state_hook, 'get_dist_info', return_value=(1, 2)):
        hook.before_train_iter(types.SimpleNamespace(seed=5, iter=0), 0)
    drawn = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    seed = int(np.random.SeedSequence(5, spawn_key=(0x72616E6B, 1, 0)).generate_state(1)[0])
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    assert drawn == (random.random(), float(np.random.rand()), float(torch.rand(1)))


@pytest.mark.usefixtures('keep_random_state')
@pytest.mark.parametrize('resumed', [False, True])
def test_without_rank_streams_the_streams_are_left_to_mmengine(resumed: bool) -> None:
    """``rank_random_streams = False``: rank 1 of 2 keeps mmengine's shared stream at the
    first iteration of a fresh run, and of a run resumed from a checkpoint without states
    (then with a warning saying so)."""
    hook = RandomStateHook(rank_streams=False)
    runner = types.SimpleNamespace(seed=5, iter=6 if resumed else 0)
    torch.manual_seed(77)
    before = torch.random.get_rng_state()
    with mock.patch.object(random_state_hook, 'get_dist_info', return_value=(1, 2)), \
            captured_log(logging.INFO) as logged:
        if resumed:
            hook.after_load_checkpoint(runner, dict(meta=dict(iter=6)))
        hook.before_train_iter(runner, 0)
    assert torch.equal(torch.random.get_rng_state(), before)
    if resumed:
        assert len(logged) == 1 and 'its random draws restart from the run seed ' \
            '(rank_random_streams = False)' in logged[0], logged
    else:
        assert logged == []


# ------------------------------------------------------------------ DistillLossScheduleHook
class _Scaled(nn.Module):
    """What the hook needs of a ``DistillationModel``: ``set_distill_scale``."""

    def __init__(self) -> None:
        super().__init__()
        self.scales: Dict[str, float] = {}

    def set_distill_scale(self, term: str, value: float) -> None:
        self.scales[term] = value


def _schedule_runner(name: str, by_epoch: bool, model: Optional[nn.Module] = None,
                     **state: Any) -> types.SimpleNamespace:
    loop_type = EpochBasedTrainLoop if by_epoch else IterBasedTrainLoop
    values: Dict[str, Any] = dict(epoch=0, iter=0, max_epochs=3, max_iters=300)
    values.update(state)
    return types.SimpleNamespace(train_loop=loop_type.__new__(loop_type),
                                 model=model if model is not None else _Scaled(),
                                 message_hub=MessageHub(f'round17_{name}'),
                                 **values)


@pytest.mark.parametrize('kwargs,match', [
    (dict(terms=[], begin=0), 'at least one term'),
    (dict(terms='attn_out', begin=-1), r'0 <= begin <= end, got begin=-1, end=-1'),
    (dict(terms='attn_out', begin=-2, end=4), r'got begin=-2, end=4'),
])
def test_schedule_arguments_are_checked(kwargs: Dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DistillLossScheduleHook(**kwargs)


@pytest.mark.parametrize('by_epoch,begin,warned', [
    (True, 3, True),  # epochs 0, 1, 2 are trained: epoch 3 never comes
    (True, 2, False),
    (False, 300, True),  # iterations 0 .. 299
    (False, 299, False),
])
def test_a_begin_past_the_last_position_is_warned_in_the_schedules_unit(
        by_epoch: bool, begin: int, warned: bool) -> None:
    """3 epochs or 300 iterations: the factor changes at ``begin``, which the run reaches
    only when it is below ``max_epochs`` / ``max_iters``."""
    hook = DistillLossScheduleHook('attn_out', begin=begin, by_epoch=by_epoch)
    runner = _schedule_runner(f'late_{by_epoch}_{begin}', by_epoch)
    with captured_log(logging.WARNING) as messages:
        hook.before_train(runner)
    unit = 'epochs' if by_epoch else 'iterations'
    if warned:
        assert len(messages) == 1 and (f"begin={begin} is not before the run's end "
                                       f"({3 if by_epoch else 300} {unit})") in messages[0], \
            messages
    else:
        assert messages == []


def test_the_factor_is_set_and_logged_per_term() -> None:
    """Each term gets the factor of the runner's position, and the message hub logs it as
    ``train/distill.scale_<term>`` (resume at iteration 5 of a 0 -> 1 ramp over 10)."""
    hook = DistillLossScheduleHook(['attn_out', 'mask'], begin=0, end=10, start_factor=0.0,
                                   end_factor=1.0)
    runner = _schedule_runner('logged', False, iter=5)
    hook.before_train(runner)
    assert runner.model.scales == {'attn_out': 0.5, 'mask': 0.5}
    scalars = runner.message_hub.log_scalars
    assert [scalars[f'train/distill.scale_{t}'].current() for t in ('attn_out', 'mask')] == \
        [0.5, 0.5]


def test_a_model_without_distillation_terms_is_named() -> None:
    runner = _schedule_runner('plain', False, model=nn.Linear(2, 1))
    with pytest.raises(TypeError, match='needs a mmlinvit.DistillationModel, the runner trains '
                                        'a Linear'):
        DistillLossScheduleHook('attn_out', begin=1).before_train(runner)
