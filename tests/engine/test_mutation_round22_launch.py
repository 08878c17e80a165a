"""The launcher set-up of :mod:`mmlinvit.engine.launch` on branches that the rest of the suite
let pass (mutation round 22): each test below failed on at least one single-line change of
the module that no other test caught.

Guarded here, each against mmengine's own code run in the test or a hand-written expectation:

* :func:`_distinct_experiment_name`: the first runner of a *fresh* process keeps mmengine's
  ``<stem>_<timestamp>`` name (a fresh copy of the module stands for a new interpreter);
* the loopback ``MASTER_ADDR`` check: only Slurm jobs on several nodes are refused (mmengine's
  ``_init_dist_slurm`` keeps the exported address; its ``_init_dist_pytorch``, read in the
  test, reads no Slurm variable), and the message says what the other nodes then do; an
  empty rank variable counts as rank 0 (the process keeps its messages); every loopback
  address (127.0.0.0/8, bracketed or IPv4-mapped ``::1``, ``::``) is refused, as Python's
  ``ipaddress`` classifies it (a finding of this round: 127.0.1.1 passed);
* ``tools/train.py --no-validate --no-pin-memory --no-persistent-workers`` on a config
  without a checkpoint hook: the loaders as mmpretrain's own ``merge_args`` (run here) sets
  them, the dropped validation loader left None;
* ``tools/test.py --amp`` refuses a test loop other than mmengine's ``TestLoop``; a
  classification config's hook gets ``--show`` / ``--wait-time`` as mmpretrain's
  ``merge_args`` (run here) sets them (``--show`` without ``--show-dir`` on a segmentation
  config: round 20's wait-time test, against mmseg's ``trigger_visualization_hook``);
* :func:`seed_samples_of_train_loader` answers whether the loader is (now) wrapped, as its
  docstring says, for each kind of loader (none, wrapped, with a ``batch_sampler``, with a
  built dataset, plain);
* :func:`adapt_to_device`: with CUDA the config is left as written; on CPU a model without
  SyncBN gets no warning, one with it a warning that says BN then normalises over each
  process's batch, *not* the global batch;
* :func:`build_runner`: what the checks logged is replayed into the run's log file only, not
  onto its console (which showed it once already); a config with ``runner_type`` gets the
  runner of mmengine's ``RUNNERS`` registry, as mmseg's / mmpretrain's ``tools/train.py``;
* an unknown ``launcher`` and an unknown ``--out-item`` are refused, naming the choices.
"""
import argparse
import copy
import importlib.util
import inspect
import io
import ipaddress
import logging
import os.path as osp
import sys
import types
from pathlib import Path
from typing import List, Optional

import pytest
import torch
from mmengine.config import Config
from mmengine.dist import utils as mmengine_dist_utils
from mmengine.logging import print_log

from mmlinvit.engine import launch
from mmlinvit.engine.launch import (EvaluationFlagError, adapt_to_device, prepare_test_config,
                                    prepare_train_config, seed_samples_of_train_loader)
from mmlinvit.utils.cli import load_script
from test_mutation_round16_launch_preflight import (MMPRETRAIN_TOOLS, MMSEG_TOOLS,  # noqa: F401
                                                    _parse, console_levels, launch_env)
from train_testing import captured_log

pytestmark = pytest.mark.usefixtures('one_thread')


def _fresh_launch_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A second copy of :mod:`mmlinvit.engine.launch` with its module state as in a new
    interpreter (the imported module and its counters are left alone)."""
    name = 'mmlinvit.engine._launch_round22_fresh'
    spec = importlib.util.spec_from_file_location(name, launch.__file__)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- experiment names
def test_the_first_runner_of_a_fresh_process_keeps_mmengines_experiment_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mmengine names a run ``<stem>_<timestamp>`` when ``experiment_name`` is None: the first
    runner a new process builds keeps that name, only the second is ``<stem>-run2``."""
    fresh = _fresh_launch_module(monkeypatch)
    path = tmp_path / 'my_cfg.py'
    path.write_text("model = dict(type='M')\n")
    first = Config.fromfile(str(path))
    fresh._distinct_experiment_name(first)
    assert first.get('experiment_name') is None
    second = Config.fromfile(str(path))
    fresh._distinct_experiment_name(second)
    assert second.experiment_name == 'my_cfg-run2'


# --------------------------------------------------------------------- loopback MASTER_ADDR
def test_a_loopback_master_addr_is_accepted_in_a_single_node_slurm_job(
        launch_env: pytest.MonkeyPatch, console_levels: List[logging.Handler]) -> None:
    """All tasks of a one-node job run on that machine: a rendezvous on 127.0.0.1 reaches
    them all. On several nodes only a loopback address is refused, a host name is not."""
    for key, value in dict(SLURM_NNODES='1', SLURM_NTASKS='8', SLURM_PROCID='0',
                           MASTER_ADDR='127.0.0.1').items():
        launch_env.setenv(key, value)
    assert _parse(['c.py', '--launcher', 'slurm']).launcher == 'slurm'
    launch_env.setenv('SLURM_NNODES', '2')
    launch_env.setenv('MASTER_ADDR', 'node-a')
    assert _parse(['c.py', '--launcher', 'slurm']).launcher == 'slurm'


def test_a_torchrun_process_inside_a_multi_node_allocation_may_use_a_loopback_master_addr(
        launch_env: pytest.MonkeyPatch, console_levels: List[logging.Handler]) -> None:
    """``bash tools/dist_train.sh`` run on one node of a 2-node Slurm allocation: torchrun
    exports its own ``--master_addr`` (127.0.0.1 by default), and mmengine's pytorch set-up
    reads no Slurm variable, so the allocation's node count says nothing about it."""
    assert 'SLURM' not in inspect.getsource(mmengine_dist_utils._init_dist_pytorch)
    for key, value in dict(SLURM_NNODES='2', SLURM_JOB_NUM_NODES='2', RANK='0',
                           WORLD_SIZE='2', MASTER_ADDR='127.0.0.1').items():
        launch_env.setenv(key, value)
    assert _parse(['c.py', '--launcher', 'pytorch']).launcher == 'pytorch'


def test_the_loopback_refusal_says_what_the_other_nodes_do(
        launch_env: pytest.MonkeyPatch, console_levels: List[logging.Handler],
        capsys: pytest.CaptureFixture) -> None:
    for key, value in dict(SLURM_NNODES='2', SLURM_NTASKS='16', SLURM_PROCID='0',
                           MASTER_ADDR='localhost').items():
        launch_env.setenv(key, value)
    with pytest.raises(SystemExit):
        _parse(['c.py', '--launcher', 'slurm'])
    err = ' '.join(capsys.readouterr().err.split())
    assert "instead of the job's first node, and the other nodes would wait for localhost " \
           'on their own machine (the job hangs)' in err, err


@pytest.mark.parametrize('address', ['127.0.1.1', '127.8.9.10', '[::1]', '::ffff:127.0.0.1',
                                     '::', 'node.localhost'])
def test_every_loopback_address_is_refused_in_a_multi_node_slurm_job(
        launch_env: pytest.MonkeyPatch, console_levels: List[logging.Handler],
        capsys: pytest.CaptureFixture, address: str) -> None:
    """FINDING (fails on the code before the round-22 fix): only four spellings were refused.
    Debian and Ubuntu map the machine's name to 127.0.1.1, so ``MASTER_ADDR=$(hostname -i)``
    passed the check and the job hung; every address ``ipaddress`` calls loopback or
    unspecified names the local machine only (``*.localhost``: RFC 6761)."""
    literal = address.strip('[]')
    if not address.endswith('.localhost'):
        ip = ipaddress.ip_address(literal)
        ip = getattr(ip, 'ipv4_mapped', None) or ip
        assert ip.is_loopback or ip.is_unspecified
    for key, value in dict(SLURM_NNODES='2', SLURM_NTASKS='16', SLURM_PROCID='0',
                           MASTER_ADDR=address).items():
        launch_env.setenv(key, value)
    with pytest.raises(SystemExit):
        _parse(['c.py', '--launcher', 'slurm'])
    assert 'unset MASTER_ADDR' in capsys.readouterr().err


# ------------------------------------------------------------------------------- rank quieting
@pytest.mark.parametrize('launcher,variable', [('pytorch', 'RANK'), ('slurm', 'SLURM_PROCID')])
def test_a_rank_variable_that_names_no_number_keeps_every_message(
        launch_env: pytest.MonkeyPatch, console_levels: List[logging.Handler], launcher: str,
        variable: str) -> None:
    """An empty rank variable names no rank: the process counts as rank 0 and keeps its
    console messages (it is not silenced as a rank above 0 would be)."""
    launch_env.setenv(variable, '')
    _parse(['c.py', '--launcher', launcher])
    assert [h.level for h in console_levels] == [logging.INFO] * len(console_levels)


# --------------------------------------------------------------------------- train.py flags
def test_no_validate_with_the_loader_flags_as_mmpretrains_merge_args(tmp_path: Path) -> None:
    """``--no-validate`` with ``--no-pin-memory --no-persistent-workers`` on a config without
    ``default_hooks`` (no checkpoint hook whose ``save_best`` would need clearing): every
    remaining loader is changed as mmpretrain's ``merge_args`` (run here) changes it, and the
    dropped validation loader stays None."""
    path = osp.join(MMPRETRAIN_TOOLS, 'train.py')
    if not osp.isfile(path):
        pytest.skip(f'{path} is not shipped')
    loader = dict(batch_size=2, num_workers=2, dataset=dict(type='CustomDataset', pipeline=[]))
    cfg_path = str(tmp_path / 'cls.py')
    Config(dict(default_scope='mmpretrain', model=dict(type='ImageClassifier'),
                train_dataloader=loader, val_dataloader=loader, test_dataloader=loader,
                val_cfg=dict(), val_evaluator=dict(type='Accuracy'), test_cfg=dict(),
                optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1)),
                )).dump(cfg_path)
    ours = prepare_train_config(Config.fromfile(cfg_path), cfg_path, work_dir=str(tmp_path),
                                no_validate=True, pin_memory=False, persistent_workers=False)
    official = load_script(path, 'mmpretrain_r22_train_no_validate')
    args = argparse.Namespace(no_validate=True, launcher='none', work_dir=str(tmp_path),
                              config=cfg_path, amp=False, resume=None, auto_scale_lr=False,
                              no_pin_memory=True, no_persistent_workers=True, cfg_options=None)
    theirs = official.merge_args(Config.fromfile(cfg_path), args)
    for cfg in (ours, theirs):
        assert cfg.val_cfg is None and cfg.val_dataloader is None and cfg.val_evaluator is None
        for name in ('train_dataloader', 'test_dataloader'):
            assert cfg[name]['pin_memory'] is False
            assert cfg[name]['persistent_workers'] is False
    assert ours.get('default_hooks') is None


# ---------------------------------------------------------------------------- test.py flags
def test_amp_refuses_a_test_loop_other_than_mmengines(tmp_path: Path) -> None:
    """``--amp`` sets ``fp16`` on mmengine's ``TestLoop``; a config's own test loop may not
    take it, so the tool names the loop instead of failing when the runner builds it."""
    cfg = Config(dict(default_scope='mmpretrain', model=dict(type='ImageClassifier'),
                      test_dataloader=dict(dataset=dict(type='CustomDataset')),
                      test_evaluator=dict(type='Accuracy'),
                      test_cfg=dict(type='MyTestLoop', topk=5)))
    with pytest.raises(EvaluationFlagError, match='test_cfg is a MyTestLoop'):
        prepare_test_config(cfg, 'c.py', 'ckpt.pth', work_dir=str(tmp_path), amp=True)


def test_cls_show_and_wait_time_reach_the_hook_as_mmpretrains_test_tool(tmp_path: Path) -> None:
    """``--show --wait-time 5 --show-dir DIR`` on a classification config: the hook's options
    are those mmpretrain's own ``merge_args`` (run here) sets."""
    path = osp.join(MMPRETRAIN_TOOLS, 'test.py')
    if not osp.isfile(path):
        pytest.skip(f'{path} is not shipped')

    def cfg() -> Config:
        return Config(dict(default_scope='mmpretrain', model=dict(type='ImageClassifier'),
                           default_hooks=dict(visualization=dict(type='VisualizationHook',
                                                                 enable=False)),
                           test_cfg=dict()))

    show_dir = str(tmp_path / 'shown')
    official = load_script(path, 'mmpretrain_r22_test_tool')
    args = argparse.Namespace(launcher='none', work_dir=str(tmp_path), config='c.py',
                              checkpoint='ckpt.pth', amp=False, show=True, show_dir=show_dir,
                              tta=False, no_pin_memory=False, cfg_options=None, wait_time=5.0,
                              interval=1)
    theirs = official.merge_args(cfg(), args)
    ours = prepare_test_config(cfg(), 'c.py', 'ckpt.pth', work_dir=str(tmp_path),
                               show_dir=show_dir, show=True, wait_time=5.0)
    hook = theirs.default_hooks.visualization
    assert (hook.show, hook.wait_time, hook.out_dir) == (True, 5.0, show_dir)
    assert ours.default_hooks.visualization.to_dict() == hook.to_dict()


# ---------------------------------------------------------------------- per-sample streams
_PLAIN = dict(dataset=dict(type='CustomDataset'), sampler=dict(type='DefaultSampler'))
_WRAPPED = dict(dataset=dict(type='mmlinvit.SampleSeedDataset', dataset=dict(type='X')),
                sampler=dict(type='mmlinvit.SampleSeedSampler', sampler=dict(type='Y')))
_BATCHED = dict(_PLAIN, batch_sampler=dict(type='AspectRatioBatchSampler'))
_BUILT = dict(dataset=[0, 1, 2, 3], sampler=dict(type='DefaultSampler'))  # a list is a dataset


@pytest.mark.parametrize('loader,wrapped,changed', [
    (None, False, False),  # a config without training (tools/test.py's)
    (_WRAPPED, True, False),  # wrapped once already
    (_BATCHED, False, False),  # left as it is, with a warning
    (_BUILT, False, False),  # a built dataset: left as it is, with a warning
    (_PLAIN, True, True),
])
def test_seeding_the_samples_answers_whether_the_loader_is_wrapped(
        loader: Optional[dict], wrapped: bool, changed: bool) -> None:
    cfg = Config(dict(model=dict(type='M')) if loader is None else
                 dict(model=dict(type='M'), train_dataloader=copy.deepcopy(loader)))
    before = copy.deepcopy(cfg.to_dict())
    assert seed_samples_of_train_loader(cfg) is wrapped
    assert (cfg.to_dict() != before) is changed


# ---------------------------------------------------------------------------- log replay
class _ConsoleAndFileRunner:
    """Stands for ``Runner.from_cfg``: a runner whose logger has a console handler (a
    ``StringIO`` here) and a file handler ``<work_dir>/run.log``, as mmengine's MMLogger."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.console = io.StringIO()
        self.logger = logging.getLogger(f'round22_replay_{id(cfg)}')
        self.logger.propagate = False
        self.logger.handlers = [logging.StreamHandler(self.console),
                                logging.FileHandler(osp.join(cfg.work_dir, 'run.log'))]


def test_the_checks_are_replayed_into_the_log_file_but_not_onto_the_console(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The console showed the checks' messages when they were logged: replaying them into
    every handler of the runner's logger would print each a second time."""

    def check_inputs(cfg: Config, mode: str, checkpoint: object) -> None:
        print_log('round22-check', logger='current', level=logging.WARNING)

    monkeypatch.setattr(launch, 'check_inputs', check_inputs)
    monkeypatch.setattr(launch.Runner, 'from_cfg', staticmethod(_ConsoleAndFileRunner))
    monkeypatch.setattr(launch, '_runners_built', launch._runners_built)
    cfg = Config(dict(work_dir=str(tmp_path), launcher='none', model=dict(type='M'),
                      experiment_name='x'))
    runner = launch.build_runner(cfg, mode='test')
    for handler in runner.logger.handlers:
        handler.close()
    runner.logger.handlers = []
    assert 'round22-check' in (tmp_path / 'run.log').read_text()
    assert runner.console.getvalue() == ''


# ------------------------------------------------------------------------- adapt_to_device
def _sync_bn_cfg(norm: str) -> Config:
    return Config(dict(model=dict(type='M', backbone=dict(norm_cfg=dict(type=norm)))))


def test_with_cuda_the_config_is_left_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """SyncBN, cudnn_benchmark and mmengine's NCCL / GPU wrapper defaults stay for GPUs."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    cfg = _sync_bn_cfg('SyncBN')
    before = copy.deepcopy(cfg.to_dict())
    adapt_to_device(cfg, 'pytorch')
    assert cfg.to_dict() == before


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU adaptation only')
def test_the_cpu_sync_bn_warning_is_given_only_for_sync_bn_and_says_what_bn_then_does() -> None:
    with captured_log(logging.WARNING) as warned:
        adapt_to_device(_sync_bn_cfg('BN'), 'pytorch')
    assert warned == []
    with captured_log(logging.WARNING) as warned:
        adapt_to_device(_sync_bn_cfg('SyncBN'), 'pytorch')
    assert len(warned) == 1 and 'replaced 1 SyncBN layer config(s) by BN' in warned[0]
    assert "those of each process's batch, not of the global batch" in warned[0], warned


class _RegisteredRunner:
    """A runner class registered in mmengine's ``RUNNERS`` for one test."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.logger = logging.getLogger('round22_registered_runner')

    @classmethod
    def from_cfg(cls, cfg: Config) -> '_RegisteredRunner':
        return cls(cfg)


def test_a_runner_type_builds_the_registered_runner(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """mmseg's and mmpretrain's ``tools/train.py``: ``RUNNERS.build(cfg)`` when the config
    names a ``runner_type`` (mmengine's registry calls the class's ``from_cfg``)."""
    from mmengine.registry import RUNNERS
    monkeypatch.setitem(RUNNERS._module_dict, 'Round22Runner', _RegisteredRunner)
    monkeypatch.setattr(launch, 'check_inputs', lambda cfg, mode, checkpoint: None)
    monkeypatch.setattr(launch, '_runners_built', launch._runners_built)
    cfg = Config(dict(work_dir=str(tmp_path), launcher='none', model=dict(type='M'),
                      experiment_name='x', runner_type='Round22Runner'))
    runner = launch.build_runner(cfg, mode='test')
    assert isinstance(runner, _RegisteredRunner) and runner.cfg.runner_type == 'Round22Runner'


def test_an_unknown_launcher_and_an_unknown_out_item_are_refused() -> None:
    cls = dict(default_scope='mmpretrain', model=dict(type='ImageClassifier'),
               optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1)),
               test_dataloader=dict(dataset=dict(type='CustomDataset')),
               test_evaluator=dict(type='Accuracy'), work_dir='w')
    with pytest.raises(KeyError, match="Unknown launcher 'torchrun'"):
        prepare_train_config(Config(copy.deepcopy(cls)), 'c.py', launcher='torchrun')
    with pytest.raises(EvaluationFlagError, match="--out-item 'logits': use one of"):
        prepare_test_config(Config(copy.deepcopy(cls)), 'c.py', 'ckpt.pth', out='o.pkl',
                            out_item='logits')
