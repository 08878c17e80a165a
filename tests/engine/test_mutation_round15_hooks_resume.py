"""Training safeguards and ``--resume`` (mutation round 15): each test below failed on at least
one single change of a module that the rest of the suite let pass.

Guarded here, each against an independent expectation (torch's real ``GradScaler`` on CPU
inside mmengine's real ``AmpOptimWrapper``, mmengine's real ``EMAHook``, ``Config``
and registries, or values worked out by hand in the test):

* :class:`mmlinvit.engine.hooks.CheckFiniteHook`: the documented AMP defaults (a dynamic
  scale of 65536 halved 29 times trains on, the 30th skipped step in a row stops the run and
  names the scale), that only optimizer steps the scaler really skipped count and only in a
  row (a step taken ends the series, an accumulation iteration is none), the advice of the
  message per precision, the gradient-norm name, the iteration of a refused checkpoint, the
  trained weights an earlier ``EMAHook`` moved to ``ema_state_dict``;
* :class:`mmlinvit.engine.hooks.AtomicCheckpointHook`: a rotated-out checkpoint folder (what
  mmengine's rotation hands to ``file_backend.rmtree``) is removed only after the new file is
  in place, ranks other than 0 rename nothing, the accumulation-window warning is about epoch
  checkpoints only;
* :mod:`mmlinvit.engine.resume`: a higher checkpoint with the same file time as the
  ``last_checkpoint`` target is resumed; a kept ``EMAHook`` is no change, one registered in the
  default scope only is one; a work dir whose name holds glob characters (a finding: it found
  no fallback checkpoint before round 15; fixed with ``glob.escape``).
"""
import glob
import logging
import math
import os
import os.path as osp
import types
from pathlib import Path
from typing import Any, Dict, Optional
from unittest import mock

import pytest
import torch
import torch.nn as nn
from mmengine.logging import MessageHub

from mmlinvit.engine.hooks import AtomicCheckpointHook, CheckFiniteHook
from mmlinvit.engine.resume import select_resume_checkpoint

from train_testing import captured_log

pytestmark = pytest.mark.usefixtures('one_thread')


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
                   model: Optional[nn.Module] = None, **state: Any) -> types.SimpleNamespace:
    """A stand-in runner with what ``CheckFiniteHook`` reads."""
    values: Dict[str, Any] = dict(iter=0, epoch=0, max_iters=100, max_epochs=3)
    values.update(state)
    return types.SimpleNamespace(work_dir=str(tmp_path),
                                 message_hub=MessageHub.get_instance(f'round15_{name}'),
                                 model=model if model is not None else nn.Linear(2, 1),
                                 hooks=[], optim_wrapper=optim_wrapper or object(), **values)


@pytest.mark.usefixtures('cpu_amp')
def test_default_amp_thresholds_stop_at_the_30th_skipped_step(tmp_path: Path) -> None:
    """Defaults ``min_loss_scale=1e-4`` / ``max_skipped_steps=30``: with torch's real dynamic
    ``GradScaler`` (init 65536, halved at each skipped step) the scale after 29 skips is
    65536 / 2**29 = 1.22e-4 >= 1e-4, so 29 skipped steps in a row train on; the 30th is the
    ``max_skipped_steps``-th in a row (checked before the scale, 65536 / 2**30 =
    6.103515625e-05 by then, which the message names)."""
    from mmengine.optim import AmpOptimWrapper
    param = nn.Parameter(torch.ones(2))
    wrapper = AmpOptimWrapper(optimizer=torch.optim.SGD([param], lr=0.1))
    runner = _finite_runner(tmp_path, 'amp_defaults', optim_wrapper=wrapper)
    hook = CheckFiniteHook()
    hook.before_train(runner)
    finite = dict(loss=torch.tensor(1.0))
    for step in range(29):
        wrapper.update_params(param.sum() * math.inf)  # infinite gradients: a skipped step
        runner.iter = step
        hook.after_train_iter(runner, step, outputs=finite)
    assert float(wrapper.loss_scaler.get_scale()) == 65536.0 / 2**29
    assert torch.equal(param.detach(), torch.ones(2))  # no step was taken
    wrapper.update_params(param.sum() * math.inf)
    runner.iter = 29
    with pytest.raises(FloatingPointError,
                       match=r'skipped the last 30 optimizer steps in a row \(non-finite '
                             r'gradients; loss scale 6\.103515625e-05\) at iteration 30'):
        hook.after_train_iter(runner, 29, outputs=finite)


def _amp_iterations(hook: CheckFiniteHook, runner: types.SimpleNamespace, param: nn.Parameter,
                    gradients: str) -> None:
    """Runs one training iteration per letter of ``gradients`` through the runner's real
    ``AmpOptimWrapper`` and the hook: ``g`` finite gradients, ``x`` infinite ones (the
    scaler skips the optimizer step)."""
    for kind in gradients:
        loss = param.sum() * (1.0 if kind == 'g' else math.inf)
        runner.optim_wrapper.update_params(loss)
        hook.after_train_iter(runner, runner.iter, outputs=dict(loss=torch.tensor(1.0)))
        runner.iter += 1


@pytest.mark.usefixtures('cpu_amp')
def test_skipped_steps_count_in_a_row_and_only_where_a_step_is_due(tmp_path: Path) -> None:
    """What torch's ``GradScaler`` really skips is counted: a step it takes ends the series
    (skip, skip, step, skip, skip is never 3 in a row), and an iteration of a gradient
    accumulation window (no step due, ``accumulative_counts=2``) is no skipped step."""
    from mmengine.optim import AmpOptimWrapper
    param = nn.Parameter(torch.ones(2))
    runner = _finite_runner(tmp_path, 'amp_series', optim_wrapper=AmpOptimWrapper(
        optimizer=torch.optim.SGD([param], lr=0.1), loss_scale='dynamic'))
    hook = CheckFiniteHook(max_skipped_steps=3)
    hook.before_train(runner)
    _amp_iterations(hook, runner, param, 'xxgxx')
    with pytest.raises(FloatingPointError, match=r'skipped the last 3 optimizer steps in a '
                                                 r'row .* at iteration 6:'):
        _amp_iterations(hook, runner, param, 'x')
    param = nn.Parameter(torch.ones(2))
    runner = _finite_runner(tmp_path, 'amp_accumulated', optim_wrapper=AmpOptimWrapper(
        optimizer=torch.optim.SGD([param], lr=0.1), accumulative_counts=2))
    hook = CheckFiniteHook(max_skipped_steps=1)
    hook.before_train(runner)
    _amp_iterations(hook, runner, param, 'gggg')  # steps at iterations 2 and 4
    assert not torch.equal(param.detach(), torch.ones(2))
    _amp_iterations(hook, runner, param, 'x')  # iteration 5: accumulating, no step due
    with pytest.raises(FloatingPointError, match=r'skipped the last 1 optimizer steps in a '
                                                 r'row .* at iteration 6:'):
        _amp_iterations(hook, runner, param, 'x')


def _amp_wrapper_type_only() -> Any:
    """An ``AmpOptimWrapper`` whose type alone is read (the loss check fails first)."""
    from mmengine.optim import AmpOptimWrapper
    return AmpOptimWrapper.__new__(AmpOptimWrapper)


def test_the_advice_follows_the_precision_and_the_iteration_is_one_based(tmp_path: Path) -> None:
    """fp32 runs are told to try ``--amp`` with a dynamic loss scale; AMP runs to train in
    bf16 or fp32 (not to try the AMP they use).  The failing iteration is named 1-based, as
    mmengine's LoggerHook counts it (``runner.iter + 1``)."""
    nan = dict(loss=torch.tensor(math.nan))
    fp32 = _finite_runner(tmp_path, 'advice_fp32', iter=4)
    hook = CheckFiniteHook()
    hook.before_train(fp32)
    with pytest.raises(FloatingPointError) as fp32_error:
        hook.after_train_iter(fp32, 4, outputs=nan)
    assert 'Non-finite loss (loss=nan) at iteration 5;' in str(fp32_error.value)
    assert 'try --amp with a dynamic loss scale' in str(fp32_error.value)
    assert 'bfloat16' not in str(fp32_error.value)
    amp = _finite_runner(tmp_path, 'advice_amp', optim_wrapper=_amp_wrapper_type_only(), iter=0)
    hook = CheckFiniteHook()
    with pytest.raises(FloatingPointError) as amp_error:
        hook.after_train_iter(amp, 0, outputs=nan)
    assert 'at iteration 1;' in str(amp_error.value)
    assert 'train in bf16 (--amp --cfg-options optim_wrapper.dtype=bfloat16) or fp32' in \
        str(amp_error.value)
    assert 'try --amp' not in str(amp_error.value)


def test_the_gradient_norm_is_named_as_mmengine_logs_it(tmp_path: Path) -> None:
    """mmengine's OptimWrapper logs ``train/grad_norm`` (the LoggerHook shows ``grad_norm``):
    the message names ``grad_norm=nan``."""
    runner = _finite_runner(tmp_path, 'grad_name')
    hook = CheckFiniteHook()
    hook.before_train(runner)
    runner.message_hub.update_scalar('train/grad_norm', math.nan)
    with pytest.raises(FloatingPointError) as error:
        hook.after_train_iter(runner, 0, outputs=dict(loss=torch.tensor(1.0)))
    assert 'Non-finite gradient (grad_norm=nan; the loss was finite' in str(error.value)


def test_a_refused_epoch_checkpoint_names_the_iteration_of_its_meta(tmp_path: Path) -> None:
    """``Runner.save_checkpoint`` of an epoch run stores ``meta['iter'] = runner.iter`` (the
    iterations done, 8 after two epochs of 4) before ``before_save_checkpoint``: the message
    names iteration 8; without a meta, the runner's count."""
    runner = _finite_runner(tmp_path, 'save_meta', iter=8, epoch=1)
    checkpoint = dict(meta=dict(epoch=2, iter=8), state_dict=dict(w=torch.tensor([math.nan])))
    hook = CheckFiniteHook()
    with pytest.raises(FloatingPointError, match=r'being saved \(w\) at iteration 8;'):
        hook.before_save_checkpoint(runner, checkpoint)
    runner.iter = 3
    with pytest.raises(FloatingPointError, match=r'being saved \(w\) at iteration 3;'):
        hook.before_save_checkpoint(runner, dict(state_dict=dict(w=torch.tensor([math.inf]))))


def test_trained_weights_an_earlier_ema_hook_moved_aside_are_checked(tmp_path: Path) -> None:
    """mmengine's ``EMAHook`` at a higher priority (``HIGH``) runs its
    ``before_save_checkpoint`` first: it swaps the averaged weights into ``state_dict`` and
    the trained ones into ``ema_state_dict`` (``module.<name>``).  Trained weights that went
    non-finite while the average is still finite (before ``begin_iter``) are refused too."""
    from mmengine.hooks import EMAHook
    model = nn.Linear(2, 1)
    runner = _finite_runner(tmp_path, 'ema_first', model=model, iter=3)
    ema = EMAHook(momentum=0.5, begin_iter=100)  # called first, as at priority HIGH
    ema.before_run(runner)  # builds the averaged copy (finite)
    with torch.no_grad():
        model.weight[0, 1] = math.nan
    runner.hooks = [ema]
    checkpoint = dict(meta=dict(iter=4), state_dict=model.state_dict())
    ema.before_save_checkpoint(runner, checkpoint)
    assert bool(torch.isfinite(checkpoint['state_dict']['weight']).all())  # the average
    assert bool(torch.isnan(checkpoint['ema_state_dict']['module.weight']).any())
    with pytest.raises(FloatingPointError,
                       match=r'checkpoint being saved \(module\.weight\) at iteration 4;'):
        CheckFiniteHook().before_save_checkpoint(runner, checkpoint)


# ------------------------------------------------------------------ AtomicCheckpointHook
def test_a_rotated_checkpoint_folder_is_removed_after_the_new_one_is_written(
        tmp_path: Path) -> None:
    """A rotated-out checkpoint that is a folder (DeepSpeed / FSDP save folders, which
    mmengine removes with ``file_backend.rmtree``) is removed once the new checkpoint is in
    place, not before."""
    from mmengine.fileio import LocalBackend
    old = tmp_path / 'iter_2.pth'
    old.mkdir()
    (old / 'shard_0.pt').write_bytes(b'0')
    hook = AtomicCheckpointHook(by_epoch=False, interval=2)
    hook.file_backend = LocalBackend()
    seen_during_save = []

    def save_checkpoint(out_dir: str, filename: str, *args: Any, **kwargs: Any) -> None:
        seen_during_save.append(old.is_dir())
        Path(out_dir, filename).write_bytes(b'new')

    runner = types.SimpleNamespace(save_checkpoint=save_checkpoint)
    with hook._atomic_saves(runner):
        hook.file_backend.rmtree(str(old))  # what mmengine's rotation calls for a folder
        assert old.is_dir()
        runner.save_checkpoint(str(tmp_path), 'iter_4.pth')
    assert seen_during_save == [True]
    assert not old.exists() and (tmp_path / 'iter_4.pth').read_bytes() == b'new'


@pytest.mark.parametrize('by_epoch,warned', [(True, True), (False, False)])
def test_only_epoch_checkpoints_are_warned_about_accumulation_windows(by_epoch: bool,
                                                                     warned: bool) -> None:
    """6 iterations per epoch, ``accumulative_counts=4`` (6 % 4 = 2): checkpoints at epoch
    ends fall inside windows, which is warned; iteration checkpoints (``by_epoch=False``,
    warned from the config) in the same epoch loop are not this hook's warning."""
    from mmengine.runner import EpochBasedTrainLoop
    loop = EpochBasedTrainLoop.__new__(EpochBasedTrainLoop)
    loop.dataloader = list(range(6))
    runner = types.SimpleNamespace(train_loop=loop,
                                   optim_wrapper=types.SimpleNamespace(_accumulative_counts=4))
    hook = AtomicCheckpointHook(by_epoch=by_epoch, interval=1)
    with captured_log(logging.WARNING) as warnings:
        hook._warn_epoch_checkpoints_inside_windows(runner)
    assert any('accumulative_counts=4 and 6 iterations per epoch' in message
               for message in warnings) == warned, warnings


def test_only_the_main_process_renames(tmp_path: Path) -> None:
    """mmengine writes checkpoints on rank 0 only (``save_checkpoint`` is ``master_only``):
    on another rank nothing was written, so nothing is renamed and the save succeeds."""
    from mmengine.fileio import LocalBackend
    from mmlinvit.engine.hooks import atomic_checkpoint_hook
    hook = AtomicCheckpointHook(by_epoch=False, interval=2)
    hook.file_backend = LocalBackend()
    calls = []
    runner = types.SimpleNamespace(save_checkpoint=lambda *args, **kwargs: calls.append(args))
    with mock.patch.object(atomic_checkpoint_hook, 'is_main_process', return_value=False):
        with hook._atomic_saves(runner):
            runner.save_checkpoint(str(tmp_path), 'iter_4.pth')
    assert calls == [(str(tmp_path), 'iter_4.pth.part')] and os.listdir(tmp_path) == []


# ------------------------------------------------------------------ --resume
def _save(path: str, iteration: int) -> None:
    torch.save(dict(meta=dict(iter=iteration), state_dict=dict(w=torch.zeros(2))), path)


def test_a_damaged_latest_falls_back_in_a_work_dir_named_with_brackets(tmp_path: Path) -> None:
    """A work dir ``run[1]`` (legal, and what a sweep may name its runs): the damaged
    ``iter_4.pth`` named by ``last_checkpoint`` must fall back to the intact ``iter_2.pth``,
    as it does in a plain folder.  ``glob.glob('run[1]/*.pth')`` reads ``[1]`` as a character
    class and finds nothing, so ``--resume`` failed with "no checkpoint can be loaded" although
    ``iter_2.pth`` is intact (fixed: ``glob.escape(folder)``)."""
    work_dir = tmp_path / 'run[1]'
    work_dir.mkdir()
    for step in (2, 4):
        _save(str(work_dir / f'iter_{step}.pth'), step)
        os.utime(work_dir / f'iter_{step}.pth', (1000.0 + step, 1000.0 + step))
    with open(work_dir / 'iter_4.pth', 'r+b') as f:
        f.truncate(100)  # cut short while written
    (work_dir / 'last_checkpoint').write_text(str(work_dir / 'iter_4.pth'))
    assert glob.glob(str(work_dir / '*.pth')) == []  # the cause: [1] is a glob class
    assert select_resume_checkpoint(str(work_dir)) == osp.normpath(str(work_dir / 'iter_2.pth'))


def test_a_higher_checkpoint_written_in_the_same_second_is_resumed(tmp_path: Path) -> None:
    """Only a checkpoint written *before* ``last_checkpoint``'s target is an earlier run's.
    On a file system with one-second times (or a fast tiny run) ``iter_6.pth``, written right
    after ``iter_4.pth`` by a run killed before it updated ``last_checkpoint``, has the same
    time: it is this run's newest checkpoint and is resumed."""
    for step in (4, 6):
        _save(str(tmp_path / f'iter_{step}.pth'), step)
        os.utime(tmp_path / f'iter_{step}.pth', (5000.0, 5000.0))
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_4.pth'))
    assert select_resume_checkpoint(str(tmp_path)) == osp.normpath(str(tmp_path / 'iter_6.pth'))


# ------------------------------------------------------------------ resume: the config
def test_a_kept_ema_hook_is_not_reported_as_removed(tmp_path: Path) -> None:
    """Only an ``EMAHook`` the resumed config dropped is named; one both runs have is not a
    change."""
    from mmengine.config import Config

    from mmlinvit.engine.resume import warn_changed_resume_config
    text = "custom_hooks = [dict(type='EMAHook', momentum=0.01)]\n"
    path = str(tmp_path / 'iter_4.pth')
    torch.save(dict(meta=dict(cfg=text, iter=4), state_dict={}), path)
    kept = Config(dict(custom_hooks=[dict(type='EMAHook', momentum=0.01)]))
    removed = Config(dict(custom_hooks=[]))
    with captured_log(logging.WARNING) as warnings:
        assert warn_changed_resume_config(kept, path) == []
    assert warnings == []
    assert warn_changed_resume_config(removed, path) == ['custom_hooks.EMAHook']


def test_an_ema_subclass_registered_in_the_default_scope_counts(tmp_path: Path) -> None:
    """``type='<name>'`` without a scope is built by the runner from the config's
    ``default_scope`` registry: an ``EMAHook`` subclass registered only there (a project's
    own) is an EMAHook, and dropping it is named."""
    from mmengine.config import Config
    from mmengine.hooks import EMAHook

    from mmlinvit.engine.resume import warn_changed_resume_config
    from mmlinvit.registry import HOOKS as PROJECT_HOOKS

    class Round15EMAHook(EMAHook):
        """An EMAHook subclass known to the project's scope only."""

    name = Round15EMAHook.__name__
    PROJECT_HOOKS.register_module(module=Round15EMAHook)
    try:
        text = (f"default_scope = 'mmlinvit'\n"
                f"custom_hooks = [dict(type='{name}', momentum=0.01)]\n")
        path = str(tmp_path / 'iter_4.pth')
        torch.save(dict(meta=dict(cfg=text, iter=4), state_dict={}), path)
        removed = Config(dict(default_scope='mmlinvit', custom_hooks=[]))
        assert warn_changed_resume_config(removed, path) == ['custom_hooks.EMAHook']
    finally:
        PROJECT_HOOKS._module_dict.pop(name, None)
