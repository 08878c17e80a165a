"""The mmengine hooks of :mod:`mmlinvit.engine.hooks` on branches that no other test reached
(mutation round 9): each test below failed on at least one single-line change of a hook that
the rest of the suite let pass.

Guarded here, each against a hand-written expectation:

* ``checkpoint_due`` (what ``CheckFiniteHook``, ``SyncNormStatsHook`` and ``RandomStateHook``
  act on) agrees with the iterations / epochs at which a tiny real ``Runner`` writes
  checkpoints (``save_begin``, ``save_last``, iteration and epoch loops);
* ``AtomicCheckpointHook``: only its own ``*.pth.part`` files are cleared (never a folder, and
  the removal is named), the mid-epoch resume warning and the accumulation-window warning with
  several optimizer wrappers;
* ``SyncNormStatsHook``: which buffers are reduced (floating BN buffers of the live and the
  EMA model, no SyncBN, no counters), that they are averaged, and when;
* ``ExportStudentHook``: the file name of its ``{}`` template, a wrapped model, the key set;
* ``CheckFiniteHook``: the name limit, buffers, a full gradient-norm history, a stale gradient
  norm of a resumed message hub, the epoch check, several optimizer wrappers;
* ``RandomStateHook``: the loaders' private generators, the gathered states of every rank,
  the once-only rank seeding, the state restored per rank, ``load_from``, the seed formula;
* ``SegVisualizationHook``: which test samples are drawn.
"""
import logging
import math
import os
import os.path as osp
import random
import types
from typing import Dict, List, Tuple
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn as nn
from mmengine.hooks import CheckpointHook, EMAHook, Hook
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.model import BaseModel, ExponentialMovingAverage
from mmengine.optim import AmpOptimWrapper, OptimWrapper, OptimWrapperDict
from mmengine.runner import EpochBasedTrainLoop

from mmlinvit.engine.hooks import (AtomicCheckpointHook, CheckFiniteHook, ExportStudentHook,
                                   RandomStateHook, SegVisualizationHook, SyncNormStatsHook)
from mmlinvit.engine.hooks import random_state_hook, sync_norm_stats_hook
from mmlinvit.engine.hooks.check_finite_hook import non_finite_tensors
from mmlinvit.engine.hooks.checkpoint_schedule import checkpoint_due
from mmlinvit.engine.hooks.random_state_hook import (CHECKPOINT_KEY, capture_random_state,
                                                     rank_stream_seed)

from train_testing import captured_log

pytestmark = pytest.mark.usefixtures('one_thread')


# ------------------------------------------------------------------ a tiny real Runner
class _Points(torch.utils.data.Dataset):
    """``length`` two-dimensional points."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        return dict(inputs=torch.tensor([float(index), 1.0]))


class _ToyModel(BaseModel):
    """One linear layer; the loss is its squared output."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, inputs, data_samples=None, mode: str = 'tensor'):
        out = self.linear(inputs)
        return dict(loss=out.pow(2).mean()) if mode == 'loss' else out


class _DueRecorder(Hook):
    """Records ``checkpoint_due`` where the project's hooks ask it (before CheckpointHook)."""

    priority = 'ABOVE_NORMAL'

    def __init__(self) -> None:
        self.due: List[Tuple[str, int]] = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if checkpoint_due(runner, 'iter'):
            self.due.append(('iter', runner.iter + 1))

    def after_train_epoch(self, runner) -> None:
        if checkpoint_due(runner, 'epoch'):
            self.due.append(('epoch', runner.epoch + 1))


class _WrittenRecorder(Hook):
    """Records the stage and step at which a new checkpoint file appeared (after
    CheckpointHook)."""

    priority = 'LOWEST'

    def __init__(self, work_dir: str) -> None:
        self.work_dir = work_dir
        self.seen: set = set()
        self.written: List[Tuple[str, int]] = []

    def _look(self, stage: str, step: int) -> None:
        files = {name for name in os.listdir(self.work_dir) if name.endswith('.pth')}
        if files - self.seen:
            self.written.append((stage, step))
        self.seen |= files

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self._look('iter', runner.iter + 1)

    def after_train_epoch(self, runner) -> None:
        self._look('epoch', runner.epoch + 1)


def _train_toy(work_dir: str, by_epoch: bool, length: int, checkpoint: dict,
               hooks: List[Hook]) -> None:
    """Trains :class:`_ToyModel` with a real Runner and ``AtomicCheckpointHook(**checkpoint)``.

    Args:
        work_dir: The run's work dir.
        by_epoch: Epoch loop (``length``: epochs of 2 iterations) or iteration loop
            (``length``: iterations).
        length: ``max_epochs`` / ``max_iters``.
        checkpoint: The checkpoint hook's arguments (``by_epoch`` set to the loop's).
        hooks: Custom hooks.
    """
    from mmengine.runner import Runner
    train_cfg = (dict(by_epoch=True, max_epochs=length) if by_epoch else
                 dict(by_epoch=False, max_iters=length))
    runner = Runner(
        model=_ToyModel(), work_dir=work_dir,
        train_dataloader=dict(dataset=_Points(2), batch_size=1, num_workers=0,
                              sampler=dict(type='DefaultSampler' if by_epoch else
                                           'InfiniteSampler', shuffle=False),
                              collate_fn=dict(type='default_collate')),
        train_cfg=train_cfg, optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        default_hooks=dict(checkpoint=AtomicCheckpointHook(by_epoch=by_epoch, **checkpoint)),
        custom_hooks=hooks, default_scope='mmengine', log_level='WARNING',
        experiment_name=f'round9_{osp.basename(osp.dirname(work_dir))}')
    runner.train()


@pytest.mark.parametrize('by_epoch,length,checkpoint,expected', [
    # iteration loop: mmengine saves where (iter + 1 - save_begin) % interval == 0, >= 0
    (False, 9, dict(interval=3, save_begin=4, save_last=False), [4, 7]),
    (False, 8, dict(interval=3, save_begin=0, save_last=True), [3, 6, 8]),
    # epoch loop (2 iterations per epoch)
    (True, 4, dict(interval=2, save_begin=3, save_last=False), [3]),
    (True, 3, dict(interval=2, save_begin=0, save_last=True), [2, 3]),
])
def test_checkpoint_due_matches_the_checkpoints_a_runner_writes(tmp_path, by_epoch, length,
                                                                checkpoint, expected):
    work_dir = str(tmp_path / 'wd')
    os.makedirs(work_dir)
    due, written = _DueRecorder(), _WrittenRecorder(work_dir)
    _train_toy(work_dir, by_epoch, length, checkpoint, [due, written])
    stage = 'epoch' if by_epoch else 'iter'
    assert written.written == [(stage, step) for step in expected]
    assert due.due == written.written


# ------------------------------------------------------------------ AtomicCheckpointHook
def _atomic_hook(out_dir: str) -> AtomicCheckpointHook:
    from mmengine.fileio import LocalBackend
    hook = AtomicCheckpointHook(interval=1)
    hook.out_dir, hook.file_backend = out_dir, LocalBackend()
    return hook


def test_only_unfinished_checkpoint_files_are_removed_and_named(tmp_path):
    """A folder named like an unfinished write (a deepspeed checkpoint folder being written)
    made the clean-up crash; the removed files are named in a warning."""
    for name in ('iter_8.pth.part', 'iter_12.pth.part', 'notes.part', 'iter_4.pth'):
        (tmp_path / name).write_bytes(b'x')
    (tmp_path / 'iter_16.pth.part').mkdir()
    with captured_log(logging.WARNING) as warned:
        _atomic_hook(str(tmp_path))._remove_stale_parts()
    assert sorted(os.listdir(tmp_path)) == ['iter_16.pth.part', 'iter_4.pth', 'notes.part']
    assert len(warned) == 1 and "['iter_12.pth.part', 'iter_8.pth.part']" in warned[0], warned
    with captured_log(logging.WARNING) as warned:  # nothing left to remove: no warning
        _atomic_hook(str(tmp_path))._remove_stale_parts()
    assert warned == []


def _epoch_loop(per_epoch: int) -> EpochBasedTrainLoop:
    loop = EpochBasedTrainLoop.__new__(EpochBasedTrainLoop)  # only its data loader is read
    loop.dataloader = list(range(per_epoch))
    return loop


@pytest.mark.parametrize('iteration,epoch,done', [
    (1, 0, 1),  # one iteration into the first epoch
    (6, 1, 2),  # two into the second
    (4, 0, 4),  # an iteration checkpoint at the first epoch's last iteration (still epoch 0)
    (4, 1, None),  # an epoch checkpoint: nothing is trained twice
    (8, 2, None),
])
def test_mid_epoch_resume_warning(iteration, epoch, done):
    runner = types.SimpleNamespace(train_loop=_epoch_loop(4), iter=iteration, epoch=epoch)
    with captured_log(logging.WARNING) as warned:
        AtomicCheckpointHook._warn_mid_epoch_resume(runner)
    if done is None:
        assert warned == []
    else:
        assert len(warned) == 1 and f'{done} of the 4 iterations of epoch {epoch + 1}' in \
            warned[0], warned


def test_accumulation_warning_takes_the_largest_count_of_several_wrappers():
    """With an OptimWrapperDict the window that an epoch end cuts is the longest one."""
    def wrapper(counts: int) -> OptimWrapper:
        return OptimWrapper(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1),
                            accumulative_counts=counts)

    hook = AtomicCheckpointHook(interval=1, by_epoch=True)
    # 4 iterations per epoch: windows of 3 are cut, windows of 2 or 4 close at the end
    for counts, warned_counts in (((1, 3), 3), ((3, 1), 3), ((1, 2), None), ((2, 4), None)):
        runner = types.SimpleNamespace(
            train_loop=_epoch_loop(4),
            optim_wrapper=OptimWrapperDict(a=wrapper(counts[0]), b=wrapper(counts[1])))
        with captured_log(logging.WARNING) as warned:
            hook._warn_epoch_checkpoints_inside_windows(runner)
        if warned_counts is None:
            assert warned == [], counts
        else:
            assert len(warned) == 1 and f'accumulative_counts={warned_counts} and 4' in \
                warned[0], (counts, warned)


# ------------------------------------------------------------------ SyncNormStatsHook
class _NormNet(nn.Module):
    """Plain BN of two kinds, a SyncBN and a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.bn2d = nn.BatchNorm2d(2)
        self.bn1d = nn.BatchNorm1d(3)
        self.sync = nn.SyncBatchNorm(2)
        self.fc = nn.Linear(2, 2)


class _TwoProcessMean:
    """Stands in for ``all_reduce_params`` of a 2-process run: the other rank holds
    ``value + 2`` in every floating tensor it is asked about."""

    def __init__(self) -> None:
        self.calls: List[List[torch.Tensor]] = []

    def __call__(self, params, op: str = 'sum', **kwargs) -> None:
        params = list(params)
        self.calls.append(params)
        for tensor in params:
            other = tensor + 2
            tensor.copy_((tensor + other) / 2 if op == 'mean' else tensor + other)


def _sync_setup(monkeypatch, checkpoint: CheckpointHook):
    model = _NormNet()
    ema_hook = EMAHook()
    ema_hook.ema_model = ExponentialMovingAverage(model)
    reduce = _TwoProcessMean()
    monkeypatch.setattr(sync_norm_stats_hook, 'is_distributed', lambda: True)
    monkeypatch.setattr(sync_norm_stats_hook, 'all_reduce_params', reduce)
    runner = types.SimpleNamespace(model=nn.DataParallel(model), hooks=[checkpoint, ema_hook],
                                   iter=0, epoch=0, max_iters=10, max_epochs=3)
    hook = SyncNormStatsHook()
    hook.before_train(runner)
    return hook, runner, model, ema_hook.ema_model.module, reduce


def test_sync_averages_the_plain_bn_buffers_of_the_live_and_ema_models(monkeypatch):
    hook, runner, model, ema, reduce = _sync_setup(
        monkeypatch, CheckpointHook(interval=2, by_epoch=False))
    for net in (model, ema):
        for bn in (net.bn2d, net.bn1d, net.sync):
            bn.running_mean.fill_(1.0)
            bn.running_var.fill_(5.0)
    hook.before_val_epoch(runner)
    assert len(reduce.calls) == 1
    expected = [b for net in (model, ema) for bn in (net.bn2d, net.bn1d)
                for b in (bn.running_mean, bn.running_var)]
    assert sorted(map(id, reduce.calls[0])) == sorted(map(id, expected))
    for net in (model, ema):
        for bn in (net.bn2d, net.bn1d):  # the mean of 1 and 3, of 5 and 7
            assert bn.running_mean.tolist() == [2.0] * bn.num_features
            assert bn.running_var.tolist() == [6.0] * bn.num_features
            assert bn.num_batches_tracked.item() == 0
        assert net.sync.running_mean.tolist() == [1.0, 1.0]  # already the same on every rank


def test_sync_runs_before_iteration_and_epoch_checkpoints_only(monkeypatch):
    hook, runner, *_, reduce = _sync_setup(monkeypatch, CheckpointHook(interval=2,
                                                                       by_epoch=False))
    for iteration, calls in ((0, 0), (1, 1), (2, 1), (3, 2)):  # due at iterations 2 and 4
        runner.iter = iteration
        hook.after_train_iter(runner, iteration)
        assert len(reduce.calls) == calls, iteration
    hook.after_train_epoch(runner)  # the iteration hook saves no epoch checkpoint
    assert len(reduce.calls) == 2
    hook, runner, *_, reduce = _sync_setup(monkeypatch, CheckpointHook(interval=2,
                                                                       by_epoch=True))
    hook.after_train_iter(runner, 1)
    runner.iter = 1
    hook.after_train_iter(runner, 1)
    assert reduce.calls == []
    hook.after_train_epoch(runner)  # epoch 1 of 3: not due
    assert reduce.calls == []
    runner.epoch = 1
    hook.after_train_epoch(runner)  # epoch 2: due
    assert len(reduce.calls) == 1


# ------------------------------------------------------------------ ExportStudentHook
class _Holder(nn.Module):
    """A distillation model: ``student`` (the backbone), a teacher that also holds a module
    named ``student``."""

    def __init__(self) -> None:
        super().__init__()
        self.student = nn.Linear(2, 3)
        self.teacher = nn.ModuleDict(dict(student=nn.Linear(2, 2)))

    def student_backbone(self) -> nn.Module:
        return self.student


@pytest.mark.parametrize('by_epoch,name', [(True, 'student_epoch_3.pth'),
                                           (False, 'student_iter_12.pth')])
def test_export_names_the_file_after_the_checkpoint(tmp_path, by_epoch, name):
    model = _Holder()
    runner = types.SimpleNamespace(model=nn.DataParallel(model), work_dir=str(tmp_path))
    checkpoint = dict(meta=dict(epoch=3, iter=12), state_dict=model.state_dict())
    ExportStudentHook('student_{}.pth', by_epoch=by_epoch).before_save_checkpoint(runner,
                                                                                   checkpoint)
    assert sorted(os.listdir(tmp_path)) == [name]
    exported = torch.load(tmp_path / name, weights_only=True)
    assert sorted(exported) == ['bias', 'weight']  # not the teacher's 'teacher.student.*'
    assert torch.equal(exported['weight'], model.student.weight)


def test_export_refuses_a_checkpoint_without_the_student_weights(tmp_path):
    model = _Holder()
    state = model.state_dict()
    del state['student.bias']
    runner = types.SimpleNamespace(model=model, work_dir=str(tmp_path))
    with pytest.raises(KeyError, match=r"lacks student backbone keys under 'student\.': "
                                       r"\['bias'\]"):
        ExportStudentHook().before_save_checkpoint(
            runner, dict(meta=dict(epoch=1, iter=1), state_dict=state))
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ CheckFiniteHook
def _finite_runner(tmp_path, model: nn.Module, hooks=(), optim_wrapper=None, **state):
    hub = MessageHub.get_instance(f'round9_finite_{id(model)}')
    values = dict(iter=0, epoch=0, max_iters=10, max_epochs=3)
    values.update(state)
    return types.SimpleNamespace(work_dir=str(tmp_path), message_hub=hub, model=model,
                                 hooks=list(hooks), optim_wrapper=optim_wrapper or object(),
                                 **values)


def test_non_finite_tensors_names_at_most_the_limit():
    named = {f't{i}': torch.tensor([math.nan if i % 2 else 1.0]) for i in range(30)}
    assert non_finite_tensors(named) == [f't{i}' for i in range(1, 21, 2)]
    assert non_finite_tensors(named, limit=3) == ['t1', 't3', 't5']


def test_a_non_finite_buffer_stops_the_run(tmp_path):
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    model[1].running_var[1] = math.inf
    runner = _finite_runner(tmp_path, model)
    hook = CheckFiniteHook(check_params_every_iter=True)
    hook.before_train(runner)
    with pytest.raises(FloatingPointError, match=r'Non-finite model weights \(1\.running_var\)'):
        hook.after_train_iter(runner, 0, outputs=dict(loss=torch.tensor(1.0)))


def test_weights_are_checked_before_iteration_checkpoints_only(tmp_path):
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[0, 0] = math.nan
    runner = _finite_runner(tmp_path, model, hooks=[CheckpointHook(interval=2, by_epoch=False)])
    hook = CheckFiniteHook()
    hook.before_train(runner)
    hook.after_train_iter(runner, 0, outputs=dict(loss=torch.tensor(1.0)))  # iteration 1
    hook.after_train_epoch(runner)  # no epoch checkpoints
    runner.iter = 1
    with pytest.raises(FloatingPointError, match=r'weights \(weight\) at iteration 2'):
        hook.after_train_iter(runner, 1, outputs=dict(loss=torch.tensor(1.0)))


def test_weights_are_checked_before_epoch_checkpoints(tmp_path):
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.bias[1] = -math.inf
    runner = _finite_runner(tmp_path, model, hooks=[CheckpointHook(interval=2, by_epoch=True)],
                            iter=1)
    hook = CheckFiniteHook()
    hook.before_train(runner)
    hook.after_train_iter(runner, 1, outputs=dict(loss=torch.tensor(1.0)))  # no iteration ckpt
    hook.after_train_epoch(runner)  # epoch 1: no checkpoint
    runner.epoch = 1
    with pytest.raises(FloatingPointError, match=r'weights \(bias\) at the end of epoch 2;'):
        hook.after_train_epoch(runner)


def test_a_nan_gradient_norm_is_seen_when_the_history_is_full(tmp_path):
    """Once the message hub's history buffer is full its length stops growing; a new
    gradient norm must still count as new."""
    runner = _finite_runner(tmp_path, nn.Linear(2, 2))
    runner.message_hub.log_scalars['train/grad_norm'] = buffer = HistoryBuffer(max_length=3)
    for value in (1.0, 2.0, 3.0):
        buffer.update(value)
    hook = CheckFiniteHook()
    hook.before_train(runner)
    buffer.update(4.0)
    hook.after_train_iter(runner, 0, outputs=dict(loss=torch.tensor(1.0)))
    buffer.update(math.nan)
    with pytest.raises(FloatingPointError, match=r'grad_norm=nan'):
        hook.after_train_iter(runner, 1, outputs=dict(loss=torch.tensor(1.0)))


def test_a_resumed_hubs_old_gradient_norm_is_not_checked_again(tmp_path):
    """An AMP run logs the inf gradient norm of a skipped step; resumed without AMP (no
    clip_grad: no new norm is logged) that old value is not this run's gradient."""
    runner = _finite_runner(tmp_path, nn.Linear(2, 2))
    runner.message_hub.update_scalar('train/grad_norm', math.inf)
    hook = CheckFiniteHook()
    hook.before_train(runner)
    hook.after_train_iter(runner, 0, outputs=dict(loss=torch.tensor(1.0)))
    runner.message_hub.update_scalar('train/grad_norm', math.inf)  # a new one is checked
    with pytest.raises(FloatingPointError, match='grad_norm=inf'):
        hook.after_train_iter(runner, 1, outputs=dict(loss=torch.tensor(1.0)))


def test_one_amp_wrapper_of_several_allows_a_skipped_step(tmp_path):
    """With an OptimWrapperDict holding an AmpOptimWrapper a non-finite gradient norm is a
    step the loss scaler skips, as with a single AmpOptimWrapper."""
    def plain() -> OptimWrapper:
        return OptimWrapper(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1))

    amp = AmpOptimWrapper.__new__(AmpOptimWrapper)  # the type is what is read
    for wrappers, allowed in ((dict(a=amp, b=plain()), True), (dict(a=plain()), False)):
        runner = _finite_runner(tmp_path, nn.Linear(2, 2),
                                optim_wrapper=OptimWrapperDict(**wrappers))
        hook = CheckFiniteHook()
        hook.before_train(runner)
        runner.message_hub.update_scalar('train/grad_norm', math.inf)
        if allowed:
            hook.after_train_iter(runner, 0, outputs=dict(loss=torch.tensor(1.0)))
        else:
            with pytest.raises(FloatingPointError, match='Non-finite gradient'):
                hook.after_train_iter(runner, 0, outputs=dict(loss=torch.tensor(1.0)))


# ------------------------------------------------------------------ RandomStateHook
def test_loaders_get_private_generators_seeded_from_the_run_seed():
    def loader() -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(list(range(4)))

    own = torch.Generator().manual_seed(99)
    train, val, third = loader(), loader(), loader()
    third.generator = own
    runner = types.SimpleNamespace(seed=7, train_dataloader=train,
                                   val_loop=types.SimpleNamespace(dataloader=val))
    RandomStateHook().before_train(runner)
    assert (train.generator.initial_seed(), val.generator.initial_seed()) == (7, 8)
    runner.train_dataloader = third
    RandomStateHook().before_train(runner)
    assert third.generator is own and own.initial_seed() == 99
    untouched = loader()
    runner.train_dataloader, runner.val_loop = untouched, None
    RandomStateHook(save_states=False).before_train(runner)
    assert untouched.generator is None


def _states(seed: int) -> Dict:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    return capture_random_state()


@pytest.mark.parametrize('by_epoch', [False, True])
def test_every_ranks_gathered_state_is_saved(by_epoch):
    """2 processes: the states gathered when a checkpoint is due are the ones saved; a
    checkpoint at another step (save_best after validation) holds rank 0's current state."""
    gathered = [_states(1), _states(2)]
    hook = RandomStateHook()
    runner = types.SimpleNamespace(hooks=[CheckpointHook(interval=2, by_epoch=by_epoch)],
                                   iter=0, epoch=0, max_iters=10, max_epochs=3)
    with mock.patch.object(random_state_hook, 'get_dist_info', return_value=(0, 2)), \
            mock.patch.object(random_state_hook, 'all_gather_object',
                              return_value=gathered) as gather:
        stage = hook.after_train_epoch if by_epoch else (lambda r: hook.after_train_iter(r, 0))
        stage(runner)  # iteration / epoch 1: not due
        assert gather.call_count == 0
        runner.iter = runner.epoch = 1
        stage(runner)
        assert gather.call_count == 1
        checkpoint = {}
        hook.before_save_checkpoint(runner, checkpoint)
        saved = checkpoint[CHECKPOINT_KEY]
        assert saved['world_size'] == 2 and saved['states'][0] is gathered[0] and \
            saved['states'][1] is gathered[1]
        runner.iter += 1
        runner.epoch += 1
        now = _states(3)
        best = {}
        hook.before_save_checkpoint(runner, best)
    states = best[CHECKPOINT_KEY]['states']
    assert len(states) == 2 and states[1] is None
    assert torch.equal(states[0]['torch'], now['torch'])


def test_one_process_checkpoint_holds_the_current_state():
    hook = RandomStateHook()
    now = _states(4)
    checkpoint = {}
    with mock.patch.object(random_state_hook, 'get_dist_info', return_value=(0, 1)):
        hook.before_save_checkpoint(types.SimpleNamespace(epoch=0, iter=3), checkpoint)
    saved = checkpoint[CHECKPOINT_KEY]
    assert saved['world_size'] == 1 and len(saved['states']) == 1
    assert torch.equal(saved['states'][0]['torch'], now['torch'])
    assert saved['states'][0]['python'] == now['python']


def test_rank_streams_are_seeded_once_per_run():
    hook = RandomStateHook()
    runner = types.SimpleNamespace(seed=5, iter=0)
    torch.manual_seed(0)
    with mock.patch.object(random_state_hook, 'get_dist_info', return_value=(1, 2)):
        hook.before_train_iter(runner, 0)
        seeded = torch.random.get_rng_state()
        torch.rand(3)  # the model draws
        drawn = torch.random.get_rng_state()
        runner.iter = 1
        hook.before_train_iter(runner, 1)
        assert torch.equal(torch.random.get_rng_state(), drawn)  # the stream goes on
    torch.manual_seed(rank_stream_seed(5, 1, 0))
    assert torch.equal(torch.random.get_rng_state(), seeded)


def test_each_rank_restores_its_own_state():
    states = [_states(10), _states(11)]
    checkpoint = {CHECKPOINT_KEY: dict(world_size=2, states=states), 'meta': dict(iter=6)}
    for rank in (0, 1):
        hook = RandomStateHook()
        runner = types.SimpleNamespace(seed=5, iter=6)
        _states(0)
        with mock.patch.object(random_state_hook, 'get_dist_info', return_value=(rank, 2)):
            hook.after_load_checkpoint(runner, checkpoint)
            hook.before_train_iter(runner, 0)
        assert torch.equal(torch.random.get_rng_state(), states[rank]['torch']), rank
        assert random.getstate() == states[rank]['python']


@pytest.mark.parametrize('save_states,runner_iter', [
    # load_from (fine-tuning, iteration 0) of a checkpoint of iteration 6: its random states
    # belong to the other run
    (True, 0),
    # save_states=False (exact_resume = False): a resumed checkpoint that holds states (one of
    # an exact-resume run) is not restored either; one process is not re-seeded
    (False, 6),
])
def test_states_of_another_run_are_not_restored(save_states: bool, runner_iter: int):
    checkpoint = {CHECKPOINT_KEY: dict(world_size=1, states=[_states(12)]),
                  'meta': dict(iter=6)}
    hook = RandomStateHook(save_states=save_states)
    runner = types.SimpleNamespace(seed=5, iter=runner_iter)
    before = _states(0)
    with mock.patch.object(random_state_hook, 'get_dist_info', return_value=(0, 1)):
        hook.after_load_checkpoint(runner, checkpoint)
        hook.before_train_iter(runner, 0)
    assert torch.equal(torch.random.get_rng_state(), before['torch'])


def test_rank_stream_seed_is_the_documented_seed_sequence():
    """SeedSequence(seed, spawn_key=(0x72616E6B, rank, iteration)): a changed formula changes
    every multi-process run's dropout draws."""
    for seed, rank, iteration in ((5, 1, 4), (0, 3, 0), (2**40 + 3, 0, 100)):
        sequence = np.random.SeedSequence(seed, spawn_key=(0x72616E6B, rank, iteration))
        assert rank_stream_seed(seed, rank, iteration) == int(sequence.generate_state(1)[0])
    assert rank_stream_seed(5, 1, 4) != rank_stream_seed(5, 4, 1)


# ------------------------------------------------------------------ SegVisualizationHook
def test_test_time_drawing_keeps_every_interval_th_sample(monkeypatch):
    from mmengine.visualization import Visualizer
    from mmseg.engine.hooks import SegVisualizationHook as MMSegVisualizationHook
    Visualizer.get_instance('round9_seg_visualization')
    drawn: List[list] = []
    monkeypatch.setattr(MMSegVisualizationHook, 'after_test_iter',
                        lambda self, runner, batch_idx, data_batch, outputs:
                        drawn.append(list(outputs)))
    hook = SegVisualizationHook(draw=True, interval=3)
    batches = [[0, 1], [2], [3, 4, 5], [6, 7]]
    for index, batch in enumerate(batches):
        hook.after_test_iter(None, index, {}, batch)
    assert drawn == [[0], [3], [6]]  # samples 0, 3, 6; nothing drawn for the batch [2]


# ------------------------------------------------------------------ CheckpointCoverageHook
def test_coverage_is_checked_against_the_model_inside_a_tta_wrapper():
    """``tools/test.py --tta`` wraps the model in a test-time-augmentation model: the
    checkpoint is checked against the wrapped model's weights (names without ``module.``)."""
    from mmengine.model import BaseTTAModel

    from mmlinvit.engine.checkpoint_coverage import CheckpointCoverageError
    from mmlinvit.engine.hooks import CheckpointCoverageHook

    class TTA(BaseTTAModel):

        def merge_preds(self, data_samples_list):
            return data_samples_list[0]

    model = _ToyModel()
    runner = types.SimpleNamespace(model=TTA(module=model))
    hook = CheckpointCoverageHook('ckpt.pth')
    hook.after_load_checkpoint(runner, dict(state_dict=model.state_dict()))
    partial = {'linear.weight': model.linear.weight.detach()}
    with pytest.raises(CheckpointCoverageError, match=r'ckpt\.pth does not hold 1 of the 2'):
        hook.after_load_checkpoint(runner, dict(state_dict=partial))
