"""What :mod:`mmlinvit.engine.launch` does before ``Runner.from_cfg`` (mutation round 14;
the ``--resume`` selection is round 11's: tests/engine/test_mutation_round11_launch_resume.py).

Guarded here:

* :func:`load_config`: ``--cfg-options`` are merged as mmengine's ``Config.merge_from_dict``
  merges them (nested keys, the rest of the dict kept);
* :func:`adapt_to_device` on CPU: ``cudnn_benchmark`` off even when the config switches it on,
  the other ``dist_cfg`` entries kept next to the gloo backend, the multi-process note of the
  SyncBN warning only with a launcher;
* :func:`init_cpu_distributed`: a missing ``RANK`` is named, the group is a gloo group (a real
  one-process group, destroyed after each test); :func:`finish_distributed` waits for the
  other ranks before destroying it;
* :func:`add_training_safeguards`: a hook the config names without scope is not added again,
  the ``RandomStateHook`` options (``rank_random_streams`` / ``exact_resume``), the per-sample
  data streams (and not twice, and not with a ``batch_sampler``), a ``CheckpointHook`` given
  as the class;
* :func:`_distinct_experiment_name`: the first runner keeps mmengine's own name, later ones are
  named after the config file's stem;
* :func:`build_runner`: what the checks logged before the run's log file existed is replayed
  into it, at the file handler's level (INFO records included, DEBUG ones not).
"""
import argparse
import logging
import os
import socket
from pathlib import Path
from typing import Iterator, List

import pytest
import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.hooks import CheckpointHook
from mmengine.logging import MMLogger, print_log

from mmlinvit.engine import launch
from mmlinvit.engine.launch import (LaunchError, adapt_to_device, add_training_safeguards,
                                     finish_distributed, init_cpu_distributed, load_config)
from train_testing import captured_log

pytestmark = pytest.mark.usefixtures('one_thread', 'no_new_global_loggers')

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU adaptation only')



# ------------------------------------------------------------------------------------ load_config
def test_cfg_options_are_merged_as_mmengine_merges_them(tmp_path: Path) -> None:
    """``--cfg-options model.depth=4`` changes that key and keeps the rest of ``model``."""
    path = tmp_path / 'my_cfg.py'
    path.write_text("model = dict(type='M', depth=2, width=8)\nwork_dir = 'a'\n")
    cfg = load_config(str(path), {'model.depth': 4, 'work_dir': 'b'})
    assert dict(cfg.model) == dict(type='M', depth=4, width=8)
    assert cfg.work_dir == 'b'
    assert load_config(str(path)).model.depth == 2


# ------------------------------------------------------------------------------ CPU adaptation
@CPU_ONLY
def test_cpu_turns_a_configured_cudnn_benchmark_off_and_keeps_other_dist_options() -> None:
    """cudnn has no CPU use; a ``dist_cfg`` timeout is the user's and stays next to gloo."""
    cfg = Config(dict(model=dict(type='M'),
                      env_cfg=dict(cudnn_benchmark=True,
                                   dist_cfg=dict(backend='nccl', timeout=1800))))
    adapt_to_device(cfg, 'pytorch')
    assert cfg.env_cfg.cudnn_benchmark is False
    assert dict(cfg.env_cfg.dist_cfg) == dict(backend='gloo', timeout=1800)


@CPU_ONLY
@pytest.mark.parametrize('launcher,several', [('none', False), ('pytorch', True)])
def test_the_sync_bn_warning_mentions_processes_only_with_a_launcher(launcher: str,
                                                                     several: bool) -> None:
    """One process: BN over its batch is what SyncBN computes; several: the note says not."""
    cfg = Config(dict(model=dict(type='M', norm_cfg=dict(type='SyncBN'))))
    with captured_log(logging.WARNING) as warned:
        adapt_to_device(cfg, launcher)
    assert len(warned) == 1 and 'replaced 1 SyncBN' in warned[0]
    assert ('averaged over the processes' in warned[0]) is several


# ------------------------------------------------------------------------------- process group
def _free_port() -> str:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return str(s.getsockname()[1])


@pytest.fixture
def torchrun_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What torchrun exports for one process (a free port); any group is destroyed after."""
    for key, value in dict(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0', MASTER_ADDR='127.0.0.1',
                           MASTER_PORT=_free_port()).items():
        monkeypatch.setenv(key, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@CPU_ONLY
def test_a_missing_rank_is_named(torchrun_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without RANK the error names it before torch waits for a rendezvous."""
    monkeypatch.delenv('RANK')
    with pytest.raises(LaunchError, match="'RANK'"):
        init_cpu_distributed('pytorch')
    assert not dist.is_initialized()


@CPU_ONLY
def test_the_cpu_group_is_gloo_and_finishing_waits_for_the_other_ranks(
        torchrun_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real one-process group: gloo (torch's default without a backend is none it names),
    and ``finish_distributed`` meets the other ranks in a barrier before destroying it."""
    init_cpu_distributed('pytorch')
    assert dist.is_initialized() and dist.get_backend() == 'gloo'
    assert dist.get_rank() == 0 and dist.get_world_size() == 1
    calls: List[bool] = []
    real_barrier = dist.barrier

    def barrier(*args, **kwargs):
        calls.append(dist.is_initialized())  # the group still exists at the barrier
        return real_barrier(*args, **kwargs)

    monkeypatch.setattr(dist, 'barrier', barrier)
    finish_distributed()
    assert calls == [True]
    assert not dist.is_initialized()
    finish_distributed()  # no group: nothing to do
    assert calls == [True]


# -------------------------------------------------------------------------- training safeguards
def _train_cfg(**entries: object) -> Config:
    cfg = Config(dict(model=dict(type='M'),
                      train_dataloader=dict(dataset=dict(type='X'),
                                            sampler=dict(type='DefaultSampler')),
                      optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1)),
                      default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2))))
    cfg.merge_from_dict(entries)
    return cfg


def _hooks(cfg: Config, hook_type: str) -> List[dict]:
    return [h for h in cfg.custom_hooks if h['type'] in (hook_type, hook_type.split('.')[-1])]


def test_a_hook_named_without_scope_is_not_added_again() -> None:
    """``type='CheckFiniteHook'`` (resolved in the mmlinvit scope) is the same hook."""
    cfg = _train_cfg(custom_hooks=[dict(type='CheckFiniteHook', priority='HIGH')])
    add_training_safeguards(cfg)
    assert _hooks(cfg, 'mmlinvit.CheckFiniteHook') == [dict(type='CheckFiniteHook',
                                                            priority='HIGH')]


@pytest.mark.parametrize('entries,rank_streams,save_states', [
    (dict(), True, True),
    (dict(exact_resume=False), True, False),
    (dict(rank_random_streams=False), False, True),
])
def test_random_state_hook_options_follow_the_config(entries: dict, rank_streams: bool,
                                                     save_states: bool) -> None:
    """Per-rank streams unless ``rank_random_streams = False``; states saved unless
    ``exact_resume = False``."""
    cfg = add_training_safeguards(_train_cfg(**entries))
    assert _hooks(cfg, 'mmlinvit.RandomStateHook') == [dict(
        type='mmlinvit.RandomStateHook', rank_streams=rank_streams, save_states=save_states)]


def test_the_data_pipeline_gets_sample_streams_once_and_only_with_exact_resume() -> None:
    """Wrapped by default, not wrapped twice by a second call, left as is with
    ``exact_resume = False`` or a ``batch_sampler``."""
    cfg = add_training_safeguards(_train_cfg())
    loader = cfg.train_dataloader
    assert loader.dataset == dict(type='mmlinvit.SampleSeedDataset', dataset=dict(type='X'))
    assert loader.sampler == dict(type='mmlinvit.SampleSeedSampler',
                                  sampler=dict(type='DefaultSampler'))
    add_training_safeguards(cfg)
    assert cfg.train_dataloader.dataset.dataset == dict(type='X')
    assert cfg.train_dataloader.sampler.sampler == dict(type='DefaultSampler')
    plain = add_training_safeguards(_train_cfg(exact_resume=False))
    assert plain.train_dataloader.dataset == dict(type='X')
    batched = _train_cfg(train_dataloader=dict(batch_sampler=dict(type='AspectRatioBatchSampler')))
    with captured_log(logging.WARNING) as warned:
        add_training_safeguards(batched)
    assert batched.train_dataloader.dataset == dict(type='X')
    assert any('batch_sampler' in m for m in warned), warned


def test_a_checkpoint_hook_given_as_the_class_becomes_atomic() -> None:
    """mmengine's Config accepts a class as ``type``; ``CheckpointHook`` itself is replaced."""
    cfg = _train_cfg()
    cfg.default_hooks.checkpoint.type = CheckpointHook
    add_training_safeguards(cfg)
    assert cfg.default_hooks.checkpoint.type == 'mmlinvit.AtomicCheckpointHook'


# ----------------------------------------------------------------------------- experiment names
def test_the_first_runner_keeps_mmengines_name_later_ones_use_the_config_stem(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mmengine names a run ``<stem>_<timestamp>`` when ``experiment_name`` is None: the first
    runner of the process keeps that; the third is ``<stem>-run3``."""
    path = tmp_path / 'my_cfg.py'
    path.write_text("model = dict(type='M')\n")
    monkeypatch.setattr(launch, '_runners_built', 0)
    first = Config.fromfile(str(path))
    launch._distinct_experiment_name(first)
    assert first.get('experiment_name') is None
    monkeypatch.setattr(launch, '_runners_built', 2)
    third = Config.fromfile(str(path))
    launch._distinct_experiment_name(third)
    assert third.experiment_name == 'my_cfg-run3'


# ----------------------------------------------------------------------------- log-file replay
class _FileLoggedRunner:
    """Stands for ``Runner.from_cfg``: a runner whose own logger writes ``<work_dir>/run.log``
    at ``cfg.log_level``, as mmengine's (``MMLogger.get_instance(log_file=...)``)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.logger = MMLogger.get_instance(f'round14_replay_{id(cfg)}',
                                            log_file=os.path.join(cfg.work_dir, 'run.log'),
                                            log_level=cfg.log_level)


@pytest.mark.parametrize('file_level', ['INFO', 'WARNING'])
def test_what_the_checks_logged_is_replayed_into_the_log_file_at_its_level(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_level: str) -> None:
    """Records of the checks at or above the file's level are in the file, the others not."""

    def check_inputs(cfg: Config, mode: str, checkpoint: object) -> None:
        for level in (logging.DEBUG, logging.INFO, logging.WARNING):
            print_log(f'check-{logging.getLevelName(level)}', logger='current', level=level)

    monkeypatch.setattr(launch, 'check_inputs', check_inputs)
    monkeypatch.setattr(launch.Runner, 'from_cfg', staticmethod(_FileLoggedRunner))
    cfg = Config(dict(work_dir=str(tmp_path), launcher='none', log_level=file_level,
                      model=dict(type='M'), experiment_name='x'))
    runner = launch.build_runner(cfg, mode='test')
    for handler in runner.logger.handlers:
        handler.flush()
    text = (tmp_path / 'run.log').read_text()
    assert 'check-WARNING' in text
    assert ('check-INFO' in text) is (file_level == 'INFO')
    assert 'check-DEBUG' not in text


# ---------------------------------------------------------------------------------- launch flags
@pytest.fixture
def launch_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A clean launcher environment; what ``parse_launch_args`` exports is undone after."""
    for key in ('WORLD_SIZE', 'LOCAL_RANK', 'RANK', 'SLURM_PROCID', 'SLURM_NTASKS',
                'SLURM_NNODES', 'SLURM_JOB_NUM_NODES', 'MASTER_ADDR'):
        monkeypatch.setenv(key, '0')  # recorded, then removed
        monkeypatch.delenv(key)
    yield


def _parse(argv: List[str]):
    parser = argparse.ArgumentParser()
    parser.add_argument('config')
    launch.add_launch_arguments(parser, 'x=1')
    return launch.parse_launch_args(parser, argv)


def test_two_launched_processes_with_launcher_none_are_refused(
        launch_env: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    """``torchrun --nproc-per-node 2`` (WORLD_SIZE=2) without ``--launcher pytorch``."""
    monkeypatch.setenv('WORLD_SIZE', '2')
    with pytest.raises(SystemExit):
        _parse(['c.py'])
    assert '--launcher pytorch' in capsys.readouterr().err
    monkeypatch.setenv('WORLD_SIZE', '1')
    assert _parse(['c.py']).launcher == 'none'


def test_slurm_ntasks_replaces_a_stale_world_size(launch_env: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """mmengine's ``_init_dist_slurm`` sets WORLD_SIZE = SLURM_NTASKS; the checks before it
    must count the same processes."""
    monkeypatch.setenv('WORLD_SIZE', '1')
    monkeypatch.setenv('SLURM_NTASKS', '8')
    monkeypatch.setenv('SLURM_PROCID', '0')
    _parse(['c.py', '--launcher', 'slurm'])
    assert os.environ['WORLD_SIZE'] == '8'


def test_a_scoped_default_constructor_becomes_frozen_aware() -> None:
    """``mmengine.DefaultOptimWrapperConstructor`` is the default one, spelled with scope."""
    cfg = _train_cfg(optim_wrapper=dict(constructor='mmengine.DefaultOptimWrapperConstructor'))
    add_training_safeguards(cfg)
    assert cfg.optim_wrapper.constructor == 'mmlinvit.FrozenAwareOptimWrapperConstructor'


# ------------------------------------------------------------------------------- prepare_*_config
def test_train_flags_work_dir_no_validate_and_amp() -> None:
    """The config's own ``work_dir`` is kept, else mmseg's ``./work_dirs/<stem>``;
    ``--no-validate`` drops ``save_best`` (it needs a validation loop); ``--amp`` gets
    ``AmpOptimWrapper``'s dynamic loss scale."""
    def cfg(**entries: object) -> Config:
        base = Config(dict(default_scope='mmseg', model=dict(type='M'),
                           optim_wrapper=dict(type='OptimWrapper',
                                              optimizer=dict(type='SGD', lr=0.1)),
                           default_hooks=dict(checkpoint=dict(type='CheckpointHook',
                                                              save_best='mIoU'))))
        base.merge_from_dict(entries)
        return base

    own = launch.prepare_train_config(cfg(work_dir='mine'), 'configs/a/my_cfg.py')
    assert own.work_dir == 'mine'
    default = launch.prepare_train_config(cfg(), 'configs/a/my_cfg.py', no_validate=True,
                                          amp=True)
    assert os.path.normpath(default.work_dir) == os.path.normpath('work_dirs/my_cfg')
    assert default.default_hooks.checkpoint.save_best is None
    assert default.val_cfg is None and default.val_dataloader is None
    assert default.optim_wrapper.type == 'AmpOptimWrapper'
    assert default.optim_wrapper.loss_scale == 'dynamic'


def test_test_flags_pin_memory_and_coverage_hook() -> None:
    """``--no-pin-memory`` reaches the test loader; the coverage hook is added unless the
    config sets ``check_checkpoint_coverage = False``."""
    def cfg(**entries: object) -> Config:
        base = Config(dict(default_scope='mmseg', model=dict(type='M'), work_dir='w',
                           test_dataloader=dict(dataset=dict(type='X'))))
        base.merge_from_dict(entries)
        return base

    tested = launch.prepare_test_config(cfg(), 'c.py', 'ckpt.pth', pin_memory=False)
    assert tested.test_dataloader.pin_memory is False
    assert _hooks(tested, 'mmlinvit.CheckpointCoverageHook') == [
        dict(type='mmlinvit.CheckpointCoverageHook', source=repr('ckpt.pth'))]
    unchecked = launch.prepare_test_config(cfg(check_checkpoint_coverage=False), 'c.py',
                                           'ckpt.pth')
    assert not (unchecked.get('custom_hooks') or [])
    assert 'pin_memory' not in unchecked.test_dataloader


@pytest.mark.parametrize('interval,hook_type', [(1, 'SegVisualizationHook'),
                                                 (5, 'mmlinvit.SegVisualizationHook')])
def test_seg_show_interval_uses_the_hook_that_honours_it(interval: int, hook_type: str) -> None:
    """mmseg's hook draws every test sample whatever ``interval``: another interval needs
    mmlinvit's."""
    cfg = Config(dict(default_scope='mmseg', model=dict(type='M'), work_dir='w',
                      test_dataloader=dict(dataset=dict(type='X')), visualizer=dict(type='V'),
                      default_hooks=dict(visualization=dict(type='SegVisualizationHook'))))
    launch.prepare_test_config(cfg, 'c.py', 'ckpt.pth', show_dir='shown', interval=interval)
    assert cfg.default_hooks.visualization.type == hook_type
    assert cfg.default_hooks.visualization.interval == interval
    assert cfg.visualizer.save_dir == 'shown'


def test_tta_gives_the_wrapped_model_the_top_level_preprocessor() -> None:
    """What mmengine's runner would give the model without TTA goes to the wrapped model,
    and the wrapper gets none."""
    top = dict(type='SegDataPreProcessor', size=(8, 8))
    cfg = Config(dict(default_scope='mmseg', model=dict(type='M'), data_preprocessor=top,
                      tta_model=dict(type='SegTTAModel'), tta_pipeline=[dict(type='T')],
                      test_dataloader=dict(dataset=dict(type='X', pipeline=[]))))
    launch.enable_tta(cfg)
    assert cfg.model.type == 'SegTTAModel' and cfg.model.data_preprocessor is None
    assert dict(cfg.model.module) == dict(type='M', data_preprocessor=top)
    assert cfg.test_dataloader.dataset.pipeline == [dict(type='T')]


def test_quieting_rank_3_leaves_file_handlers_alone(launch_env: None, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the console is quieted on a rank > 0; a log file keeps every record."""
    logger = MMLogger.get_current_instance()
    console = [h for h in logger.handlers if type(h) is logging.StreamHandler]
    levels = [h.level for h in console]
    file_handler = logging.FileHandler(str(tmp_path / 'f.log'))
    file_handler.setLevel(logging.INFO)
    logger.addHandler(file_handler)
    try:
        monkeypatch.setenv('RANK', '3')
        _parse(['c.py', '--launcher', 'pytorch'])
        assert file_handler.level == logging.INFO
    finally:
        logger.removeHandler(file_handler)
        file_handler.close()
        for handler, level in zip(console, levels):
            handler.setLevel(level)
