"""Mutation round 16: the launch path (``tools/dist_train.sh``, ``tools/train.py``,
``tools/test.py``, :mod:`mmlinvit.engine.launch`, :mod:`mmlinvit.engine.preflight`) on branches
that the earlier rounds left open.  Each test failed on at least one single-line change that
the rest of the suite let pass.

Guarded here, each against an independent reference:

* ``tools/dist_train.sh`` / ``tools/dist_launch.sh``: what reaches torchrun, read back with
  torch's own ``torch.distributed.run`` argument parser and compared with mmseg's shipped
  ``tools/dist_train.sh`` (node / address / port variables, ``--launcher pytorch`` ahead of the
  user's flags, arguments with spaces kept whole, ``PORT`` falling back to ``MASTER_PORT``,
  PYTHONPATH, the usage error) - run with a stand-in interpreter that only records its
  arguments;
* ``parse_launch_args``: a process of global rank 1 is quieted too (not only rank > 1);
* ``adapt_to_device``: the CPU DDP wrapper options equal those of mmengine's own
  ``Runner.wrap_model`` (run with a recording wrapper class); a single-process CPU run gets no
  gloo backend / DDP wrapper;
* ``tools/test.py``: ``--out`` reaches a scope-prefixed ``mmseg.IoUMetric`` (built by mmseg),
  ``--show-dir`` under Slurm / MPI is warned about, ``--interval 0`` goes to the hook that
  refuses it, ``--interval``'s default and ``--amp`` / ``--tta`` with the config's own
  ``tta_pipeline`` as mmpretrain's tools (their ``parse_args`` / ``merge_args`` run here),
  ``--tta`` keeps the model's own data preprocessor, an unknown ``--launcher`` is a usage error
  as in mmseg's tools, flag mistakes are ``error:`` lines;
* ``tools/train.py``: ``--no-persistent-workers`` reaches every loader as mmpretrain's
  ``merge_args`` sets it; ``--auto-scale-lr`` mistakes are ``error:`` lines;
* the second runner of a process already gets a distinct experiment name;
* preflight: an empty ``data_prefix`` without ``data_root`` is no missing folder.

Findings (fixed in round 16 in launch.py; the tests marked FINDING fail on the code before):

* ``--amp`` refused ``optim_wrapper.type=OptimWrapper`` given as the class (pure-Python
  configs) with a self-contradicting message, and a ``loss_scale`` on that class passed the
  check that refuses it on ``'OptimWrapper'``;
* an unsupported ``default_scope`` (train.py / test.py) and ``--show-dir`` without a
  visualisation hook ended in a KeyError traceback instead of the tools' ``error:`` line.
"""
import argparse
import logging
import os
import os.path as osp
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, Iterator, List, Optional, Tuple

import mmengine.runner.runner as mmengine_runner_module
import pytest
import torch
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS
from mmengine.runner import Runner
from mmengine.visualization import Visualizer
from torch import nn
from torch.distributed.run import get_args_parser

import mmpretrain
import mmseg
from mmlinvit.engine import launch, preflight
from mmlinvit.engine.hooks.seg_visualization_hook import \
    SegVisualizationHook as MmlinvitSegVisualizationHook
from mmlinvit.engine.launch import (adapt_to_device, add_launch_arguments, enable_tta,
                                    parse_launch_args, prepare_test_config,
                                    prepare_train_config)
from mmlinvit.utils.cli import load_script
from mmseg.registry import METRICS as MMSEG_METRICS

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
try:
    from train_testing import captured_log
finally:
    sys.path.pop(0)

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
MMSEG_TOOLS = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools')

# ------------------------------------------------------------------------- tools/dist_train.sh

#: Launcher variables of the shell that the scripts read (removed unless a test sets them).
_LAUNCH_VARIABLES = ('NNODES', 'NODE_RANK', 'MASTER_ADDR', 'PORT', 'MASTER_PORT', 'PYTHON')

_RECORDER = """#!/usr/bin/env bash
# stands for the Python interpreter: records its arguments (NUL-separated) and PYTHONPATH
printf '%s\\0' "$@" > "$ARGV_RECORD"
printf '%s' "${PYTHONPATH:-}" > "$ARGV_RECORD.pythonpath"
"""


def _recorder(folder: Path, name: str) -> Path:
    """An executable stand-in interpreter under ``folder`` named ``name``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(_RECORDER)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _run_script(script: str, args: List[str], tmp_path: Path, env_update: Dict[str, str],
                python_on_path: bool = False) -> Tuple[subprocess.CompletedProcess,
                                                       Optional[List[str]], str]:
    """Runs ``bash script args`` with the recording interpreter.

    Returns:
        The completed process, the recorded interpreter arguments (None when it did not run)
        and the PYTHONPATH it saw.
    """
    record = tmp_path / 'argv'
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARIABLES}
    env['ARGV_RECORD'] = str(record)
    if python_on_path:  # mmseg's script runs `python` from PATH
        bin_dir = tmp_path / 'bin'
        _recorder(bin_dir, 'python')
        env['PATH'] = f'{bin_dir}{os.pathsep}{env.get("PATH", "")}'
    else:
        env['PYTHON'] = str(_recorder(tmp_path / 'interp', 'fakepython'))
    env.update(env_update)
    proc = subprocess.run(['bash', script, *args], env=env, capture_output=True, text=True,
                          timeout=60)
    if not record.exists():
        return proc, None, ''
    argv = record.read_bytes().decode().split('\0')[:-1]
    return proc, argv, Path(f'{record}.pythonpath').read_text()


def _torchrun(argv: List[str]) -> Tuple[str, object]:
    """(module run with ``-m``, torchrun's parse of the rest) of a recorded interpreter call."""
    assert argv[0] == '-m', argv
    return argv[1], get_args_parser().parse_args(argv[2:])


def _launch(parsed: object) -> Dict[str, str]:
    return {k: str(getattr(parsed, k)) for k in ('nnodes', 'node_rank', 'master_addr',
                                                   'nproc_per_node', 'master_port')}


DIST_TRAIN = osp.join(REPO, 'tools', 'dist_train.sh')


def test_dist_train_hands_torchrun_the_processes_and_the_flags_after_launcher_pytorch(
        tmp_path: Path) -> None:
    """torchrun's own parser reads 1 node of NPROC processes on 127.0.0.1:29500 and
    tools/train.py with CONFIG, ``--launcher pytorch`` and then every further argument,
    each whole (a work dir with a space stays one argument)."""
    proc, argv, pythonpath = _run_script(
        DIST_TRAIN, ['my cfg.py', '3', '--work-dir', 'a b', '--cfg-options', 'x=1', 'y=2'],
        tmp_path, {})
    assert proc.returncode == 0, proc.stderr
    module, parsed = _torchrun(argv)
    assert module == 'torch.distributed.run'
    assert _launch(parsed) == dict(nnodes='1', node_rank='0', master_addr='127.0.0.1',
                                   nproc_per_node='3', master_port='29500')
    assert osp.realpath(parsed.training_script) == osp.realpath(
        osp.join(REPO, 'tools', 'train.py'))
    assert parsed.training_script_args == ['my cfg.py', '--launcher', 'pytorch', '--work-dir',
                                           'a b', '--cfg-options', 'x=1', 'y=2']
    # the repository comes first on the path, an exported PYTHONPATH is kept after it
    assert osp.realpath(pythonpath.split(os.pathsep)[0]) == osp.realpath(REPO)


def test_dist_train_keeps_an_exported_pythonpath_after_the_repository(tmp_path: Path) -> None:
    proc, argv, pythonpath = _run_script(DIST_TRAIN, ['c.py', '2'], tmp_path,
                                         {'PYTHONPATH': '/opt/extra'})
    assert proc.returncode == 0, proc.stderr
    first, *rest = pythonpath.split(os.pathsep)
    assert osp.realpath(first) == osp.realpath(REPO)
    assert rest == ['/opt/extra']


def test_dist_train_node_variables_reach_torchrun_as_in_mmsegs_script(tmp_path: Path) -> None:
    """NNODES / NODE_RANK / MASTER_ADDR / PORT and the script arguments are those mmseg's
    shipped tools/dist_train.sh hands its launcher (read with the same torchrun parser)."""
    official = osp.join(MMSEG_TOOLS, 'dist_train.sh')
    if not osp.isfile(official):
        pytest.skip(f'{official} is not shipped')
    variables = dict(NNODES='2', NODE_RANK='1', MASTER_ADDR='10.1.2.3', PORT='29611')
    args = ['cfg.py', '4', '--work-dir', 'w', '--amp', '--cfg-options', 'a=1']
    proc, ours, _ = _run_script(DIST_TRAIN, args, tmp_path / 'ours', variables)
    assert proc.returncode == 0, proc.stderr
    proc, theirs, _ = _run_script(official, args, tmp_path / 'mmseg', variables,
                                  python_on_path=True)
    assert proc.returncode == 0, proc.stderr
    _, ours_parsed = _torchrun(ours)
    _, theirs_parsed = _torchrun(theirs)
    assert _launch(ours_parsed) == _launch(theirs_parsed) == dict(
        nnodes='2', node_rank='1', master_addr='10.1.2.3', nproc_per_node='4',
        master_port='29611')
    assert osp.basename(ours_parsed.training_script) == \
        osp.basename(theirs_parsed.training_script) == 'train.py'
    assert ours_parsed.training_script_args == theirs_parsed.training_script_args


def test_dist_train_port_falls_back_to_master_port_then_29500(tmp_path: Path) -> None:
    """dist_launch.sh: ``PORT`` wins, else an exported ``MASTER_PORT``, else 29500."""
    cases = [(dict(MASTER_PORT='29633'), '29633'),
             (dict(MASTER_PORT='29633', PORT='29644'), '29644'), ({}, '29500')]
    for i, (variables, port) in enumerate(cases):
        proc, argv, _ = _run_script(DIST_TRAIN, ['c.py', '2'], tmp_path / str(i), variables)
        assert proc.returncode == 0, proc.stderr
        assert _launch(_torchrun(argv)[1])['master_port'] == port, variables


@pytest.mark.parametrize('args', [[], ['only_config.py']])
def test_dist_train_without_nproc_prints_the_usage_and_starts_nothing(
        tmp_path: Path, args: List[str]) -> None:
    proc, argv, _ = _run_script(DIST_TRAIN, args, tmp_path, {})
    assert proc.returncode == 2
    assert 'usage: bash tools/dist_train.sh CONFIG NPROC' in proc.stderr
    assert argv is None


# ------------------------------------------------------------------------- parse_launch_args

#: Variables the launch checks read or export (set to '' first, so that their removal and
#: anything the code under test exports are undone after the test).
_RANK_VARIABLES = ('WORLD_SIZE', 'LOCAL_RANK', 'RANK', 'SLURM_PROCID', 'SLURM_LOCALID',
                   'SLURM_NTASKS', 'SLURM_NNODES', 'SLURM_JOB_NUM_NODES', 'OMPI_COMM_WORLD_RANK',
                   'OMPI_COMM_WORLD_LOCAL_RANK', 'OMPI_COMM_WORLD_SIZE', 'MASTER_ADDR')


@pytest.fixture
def launch_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A launcher environment without any of :data:`_RANK_VARIABLES` (restored after)."""
    for key in _RANK_VARIABLES:
        monkeypatch.setenv(key, '')
        monkeypatch.delenv(key)
    return monkeypatch


@pytest.fixture
def console_levels() -> Iterator[List[logging.Handler]]:
    """The current MMLogger's console handlers at INFO; their levels restored after."""
    handlers = [h for h in MMLogger.get_current_instance().handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    assert handlers
    levels = [h.level for h in handlers]
    for handler in handlers:
        handler.setLevel(logging.INFO)
    yield handlers
    for handler, level in zip(handlers, levels):
        handler.setLevel(level)


def _parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument('config')
    add_launch_arguments(parser, 'x=1')
    return parse_launch_args(parser, argv)


@pytest.mark.parametrize('launcher,variable', [('pytorch', 'RANK'), ('slurm', 'SLURM_PROCID'),
                                               ('mpi', 'OMPI_COMM_WORLD_RANK')])
def test_global_rank_1_is_quieted_like_every_rank_but_0(
        launch_env: pytest.MonkeyPatch, console_levels: List[logging.Handler], launcher: str,
        variable: str) -> None:
    """mmengine's runner logger shows errors only on every rank but 0 (rank 1 included)."""
    launch_env.setenv(variable, '1')
    _parse(['c.py', '--launcher', launcher])
    assert [h.level for h in console_levels] == [logging.ERROR] * len(console_levels)


# ------------------------------------------------------------------------------ adapt_to_device

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(),
                              reason='adapt_to_device changes nothing with CUDA')


@CPU_ONLY
def test_the_cpu_wrapper_has_the_options_of_mmengines_own_wrap_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``model_wrapper_cfg`` (and without ``find_unused_parameters``) the wrapper's
    options are those mmengine's ``Runner.wrap_model`` passes to MMDistributedDataParallel,
    read by running it with the wrapper class replaced by a recorder (all but the module and
    ``device_ids``, which CPU DDP refuses)."""
    recorded: Dict[str, object] = {}

    def record(**kwargs: object) -> nn.Module:
        recorded.update(kwargs)
        return kwargs['module']

    monkeypatch.setattr(mmengine_runner_module, 'MMDistributedDataParallel', record)
    monkeypatch.setenv('LOCAL_RANK', '0')
    stand_in = SimpleNamespace(distributed=True, cfg=Config(dict()),
                               logger=MMLogger.get_current_instance())
    Runner.wrap_model(stand_in, None, nn.Linear(2, 2))
    official = {k: v for k, v in recorded.items() if k not in ('module', 'device_ids')}

    cfg = Config(dict(model=dict(type='M')))
    adapt_to_device(cfg, 'pytorch')
    ours = {k: v for k, v in cfg.model_wrapper_cfg.items() if k not in ('type', 'device_ids')}
    assert official and ours == official
    assert cfg.model_wrapper_cfg['type'] == 'MMDistributedDataParallel'


# ---------------------------------------------------------------------------- tools/test.py --out


def _seg_test_cfg(evaluator: object) -> Config:
    """A minimal mmseg test config (nothing is built from it but the evaluator)."""
    return Config(dict(default_scope='mmseg', model=dict(type='EncoderDecoder'),
                       test_dataloader=dict(batch_size=1, dataset=dict(type='ADE20KDataset')),
                       test_evaluator=evaluator, test_cfg=dict(type='TestLoop'),
                       visualizer=dict(type='SegLocalVisualizer'),
                       default_hooks=dict(visualization=dict(type='SegVisualizationHook'))))


def test_seg_out_reaches_a_scope_prefixed_iou_metric(tmp_path: Path) -> None:
    """``--out DIR`` with ``test_evaluator = dict(type='mmseg.IoUMetric')``: the metric mmseg
    builds from the prepared config writes the label maps into DIR (as mmseg's test.py sets
    ``output_dir`` on the evaluator)."""
    out = str(tmp_path / 'maps')
    cfg = _seg_test_cfg(dict(type='mmseg.IoUMetric', iou_metrics=['mIoU']))
    prepare_test_config(cfg, 'c.py', 'ckpt.pth', work_dir=str(tmp_path), out=out)
    metric = MMSEG_METRICS.build(cfg.test_evaluator)
    assert type(metric).__name__ == 'IoUMetric'
    assert metric.output_dir == out


# ----------------------------------------------------------------------------- experiment names


def test_the_second_runner_of_a_process_already_gets_a_distinct_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collision is between the first and the *second* runner built within one second
    from configs of the same file name: the second one is named ``<stem>-run2``."""
    path = tmp_path / 'my_cfg.py'
    path.write_text("model = dict(type='M')\n")
    monkeypatch.setattr(launch, '_runners_built', 1)
    second = Config.fromfile(str(path))
    launch._distinct_experiment_name(second)
    assert second.experiment_name == 'my_cfg-run2'


@CPU_ONLY
def test_a_single_process_cpu_run_gets_no_distributed_settings() -> None:
    """``--launcher none`` on CPU: only ``cudnn_benchmark`` is switched off.  No gloo backend
    and no CPU DDP wrapper enter the config that the run saves in its work dir (a later
    multi-GPU run of that saved config would otherwise use gloo instead of NCCL)."""
    cfg = Config(dict(model=dict(type='M'), env_cfg=dict(cudnn_benchmark=True)))
    adapt_to_device(cfg, 'none')
    assert cfg.get('model_wrapper_cfg', None) is None
    assert dict(cfg.env_cfg) == dict(cudnn_benchmark=False)


@pytest.mark.parametrize('launcher', ['slurm', 'mpi'])
def test_show_dir_under_slurm_or_mpi_is_warned_as_under_torchrun(tmp_path: Path,
                                                                  launcher: str) -> None:
    """mmseg's visualisation hook draws on rank 0 only, whichever launcher started the
    processes: Slurm and MPI jobs paint only rank 0's share of the images too."""
    cfg = _seg_test_cfg(dict(type='IoUMetric'))
    with captured_log(logging.WARNING) as messages:
        prepare_test_config(cfg, 'c.py', 'ckpt.pth', work_dir=str(tmp_path),
                            show_dir=str(tmp_path / 'vis'), launcher=launcher)
    assert any('only rank 0' in m and launcher in m for m in messages), messages


# ------------------------------------------------------------------ --amp, wrapper type as class
MMPRETRAIN_TOOLS = osp.join(osp.dirname(mmpretrain.__file__), '.mim', 'tools')


def _class_wrapper_cfg(**wrapper: object) -> Config:
    """An mmpretrain config whose wrapper type is the class, as pure-Python configs give it."""
    return Config(dict(default_scope='mmpretrain', model=dict(type='ImageClassifier'),
                       optim_wrapper=dict(type=OptimWrapper,
                                          optimizer=dict(type='SGD', lr=0.1), **wrapper)))


def amp_train_args(work_dir: str) -> argparse.Namespace:
    """The arguments of mmpretrain's ``tools/train.py`` for ``c.py --amp --work-dir DIR``."""
    return argparse.Namespace(no_validate=False, launcher='none', work_dir=work_dir,
                              config='c.py', amp=True, resume=None, auto_scale_lr=False,
                              no_pin_memory=False, no_persistent_workers=False,
                              cfg_options=None)


def _wrapper_class(type_: object) -> type:
    """The class a wrapper ``type`` builds (a class, or a name in mmengine's registry)."""
    return type_ if isinstance(type_, type) else OPTIM_WRAPPERS.get(type_)


def test_amp_turns_an_optim_wrapper_class_into_amp_as_mmpretrains_merge_args(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FINDING (fails on the code before the round-16 fix): ``--amp`` refused
    ``optim_wrapper.type=OptimWrapper`` given as the class with the self-contradicting
    "--amp needs optim_wrapper.type="OptimWrapper", got <class '...OptimWrapper'>".
    mmpretrain's own ``merge_args`` (run here) makes it an ``AmpOptimWrapper`` with a
    dynamic loss scale."""
    path = osp.join(MMPRETRAIN_TOOLS, 'train.py')
    if not osp.isfile(path):
        pytest.skip(f'{path} is not shipped')
    official = load_script(path, 'mmpretrain_r16_train_tool')
    args = amp_train_args(str(tmp_path))
    theirs = official.merge_args(_class_wrapper_cfg(), args)
    ours = prepare_train_config(_class_wrapper_cfg(), 'c.py', work_dir=str(tmp_path), amp=True)
    assert _wrapper_class(ours.optim_wrapper.type) is AmpOptimWrapper
    assert _wrapper_class(theirs.optim_wrapper.type) is AmpOptimWrapper
    assert ours.optim_wrapper.loss_scale == theirs.optim_wrapper.loss_scale == 'dynamic'


def test_a_loss_scale_on_an_optim_wrapper_class_is_refused_before_building(
        tmp_path: Path) -> None:
    """FINDING (fails on the code before the round-16 fix): ``loss_scale`` without ``--amp``
    on the OptimWrapper class passed the check that refuses it on ``'OptimWrapper'``, and
    mmengine's OptimWrapper (built here) rejects the option."""
    with pytest.raises(TypeError, match='loss_scale'):
        OptimWrapper(optimizer=torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1),
                     loss_scale='dynamic')
    with pytest.raises(ValueError, match='loss_scale'):
        prepare_train_config(_class_wrapper_cfg(loss_scale='dynamic'), 'c.py',
                             work_dir=str(tmp_path))


# --------------------------------------------------------------------------------------- --tta


def test_tta_keeps_the_models_own_preprocessor_over_the_top_level_one() -> None:
    """mmengine's Runner gives the model the top-level ``data_preprocessor`` only when it has
    none (``setdefault``): with ``--tta`` the wrapped model keeps its own."""
    own = dict(type='SegDataPreProcessor', size=(64, 64), pad_val=0)
    top = dict(type='SegDataPreProcessor', size=(32, 32), pad_val=7)
    cfg = Config(dict(default_scope='mmseg', model=dict(type='EncoderDecoder',
                                                        data_preprocessor=own),
                      data_preprocessor=top, tta_model=dict(type='SegTTAModel'),
                      tta_pipeline=[dict(type='LoadImageFromFile')],
                      test_dataloader=dict(dataset=dict(pipeline=[]))))
    enable_tta(cfg)
    assert dict(cfg.model.module.data_preprocessor) == own


# ------------------------------------------------------------------------------ --launcher value
MMSEG_TRAIN = osp.join(MMSEG_TOOLS, 'train.py')


@pytest.mark.parametrize('tool', ['train', 'test'])
def test_an_unknown_launcher_is_a_usage_error_as_in_mmsegs_tools(
        launch_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tool: str) -> None:
    """``--launcher gpu`` stops at the parser (exit status 2, the choices named), as mmseg's
    own tools/train.py (run here) does, instead of a KeyError traceback later."""
    if not osp.isfile(MMSEG_TRAIN):
        pytest.skip(f'{MMSEG_TRAIN} is not shipped')
    official = load_script(MMSEG_TRAIN, 'mmseg_r16_train_tool')
    launch_env.setattr(sys, 'argv', ['train.py', 'c.py', '--launcher', 'gpu'])
    with pytest.raises(SystemExit) as theirs:
        official.parse_args()
    ours_tool = load_script(osp.join(REPO, 'tools', f'{tool}.py'), f'mmlinvit_r16_{tool}_tool')
    argv = ['c.py'] + (['ckpt.pth'] if tool == 'test' else []) + ['--launcher', 'gpu']
    with pytest.raises(SystemExit) as ours:
        ours_tool.parse_args(argv)
    assert ours.value.code == theirs.value.code == 2
    assert "invalid choice: 'gpu'" in capsys.readouterr().err


# ------------------------------------------------------------------------- --show-dir --interval


def test_an_interval_of_0_is_refused_by_the_hook_rather_than_drawing_every_sample(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--interval 0`` (not a positive integer) goes to mmlinvit's hook, which refuses it;
    mmseg's hook would silently draw every test sample."""
    # the hook looks up the visualizer instance only; no global instance is created
    monkeypatch.setattr(Visualizer, 'get_current_instance', classmethod(lambda cls: object()))
    cfg = _seg_test_cfg(dict(type='IoUMetric'))
    prepare_test_config(cfg, 'c.py', 'ckpt.pth', work_dir=str(tmp_path),
                        show_dir=str(tmp_path / 'vis'), interval=0)
    hook_cfg = dict(cfg.default_hooks.visualization)
    assert hook_cfg.pop('type') == 'mmlinvit.SegVisualizationHook'
    with pytest.raises(ValueError, match='positive integer'):
        MmlinvitSegVisualizationHook(**hook_cfg)


def test_cls_tta_keeps_the_configs_own_tta_pipeline_as_mmpretrains_merge_args(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A classification config with its own ``tta_pipeline``: ``--tta`` tests through it,
    as mmpretrain's tools/test.py ``merge_args`` (run here) does; the flip default is only
    for configs without one."""
    path = osp.join(MMPRETRAIN_TOOLS, 'test.py')
    if not osp.isfile(path):
        pytest.skip(f'{path} is not shipped')
    official = load_script(path, 'mmpretrain_r16_test_tool')
    own = [dict(type='LoadImageFromFile'),
           dict(type='TestTimeAug', transforms=[[dict(type='ResizeEdge', scale=s)
                                                 for s in (8, 16)], [dict(type='PackInputs')]])]

    def cfg() -> Config:
        return Config(dict(
            default_scope='mmpretrain', model=dict(type='ImageClassifier'),
            tta_pipeline=own, test_cfg=dict(), test_evaluator=dict(type='Accuracy'),
            test_dataloader=dict(batch_size=1, dataset=dict(
                type='CustomDataset', pipeline=[dict(type='LoadImageFromFile'),
                                                dict(type='PackInputs')]))))

    args = argparse.Namespace(launcher='none', work_dir=str(tmp_path), config='c.py',
                              checkpoint='ckpt.pth', amp=False, show=False, show_dir=None,
                              tta=True, no_pin_memory=False, cfg_options=None, wait_time=2,
                              interval=1)
    theirs = official.merge_args(cfg(), args)
    ours = prepare_test_config(cfg(), 'c.py', 'ckpt.pth', work_dir=str(tmp_path), tta=True)
    assert theirs.test_dataloader.dataset.pipeline == own
    assert ours.test_dataloader.dataset.pipeline == theirs.test_dataloader.dataset.pipeline


def test_interval_default_is_mmpretrains(launch_env: pytest.MonkeyPatch) -> None:
    """tools/test.py ``--interval`` defaults to what mmpretrain's own tools/test.py parser
    (run here) gives: every sample is visualised."""
    path = osp.join(MMPRETRAIN_TOOLS, 'test.py')
    if not osp.isfile(path):
        pytest.skip(f'{path} is not shipped')
    official = load_script(path, 'mmpretrain_r16_test_parser')
    launch_env.setattr(sys, 'argv', ['test.py', 'c.py', 'ckpt.pth'])
    theirs = official.parse_args()
    ours = load_script(osp.join(REPO, 'tools', 'test.py'), 'mmlinvit_r16_test_parser')
    assert ours.parse_args(['c.py', 'ckpt.pth']).interval == theirs.interval == 1


# ------------------------------------------------------------------- config mistakes: error lines


def test_an_unsupported_default_scope_is_an_error_line_of_both_tools(
        launch_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """FINDING (fails on the code before the round-16 fix): a config of another library
    (``default_scope='mmdet'``) ended train.py / test.py in a KeyError traceback instead of
    the tools' one ``error:`` line (exit status 1) naming the fix."""
    path = tmp_path / 'det.py'
    path.write_text("default_scope = 'mmdet'\nmodel = dict(type='M')\n")
    for tool, extra in (('train', []), ('test', ['ckpt.pth'])):
        module = load_script(osp.join(REPO, 'tools', f'{tool}.py'), f'mmlinvit_r16_{tool}_err')
        with pytest.raises(SystemExit, match=r"^error: default_scope='mmdet' is not supported"):
            module.main([str(path), *extra, '--work-dir', str(tmp_path / 'wd')])


def test_show_dir_without_a_visualization_hook_is_an_error_line(
        launch_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """FINDING (fails on the code before the round-16 fix): ``--show-dir`` on a config
    without ``default_hooks.visualization`` was a KeyError traceback (mmseg's test.py raises
    a RuntimeError there); now the ``error:`` line, still a KeyError for API callers."""
    path = tmp_path / 'novis.py'
    path.write_text("default_scope = 'mmseg'\nmodel = dict(type='M')\n"
                    "test_dataloader = dict(dataset=dict(type='X'))\n"
                    "test_evaluator = dict(type='IoUMetric')\n")
    module = load_script(osp.join(REPO, 'tools', 'test.py'), 'mmlinvit_r16_test_novis')
    with pytest.raises(SystemExit, match=r'^error: --show/--show-dir need '
                                         r'default_hooks.visualization'):
        module.main([str(path), 'ckpt.pth', '--work-dir', str(tmp_path / 'wd'),
                     '--show-dir', str(tmp_path / 'vis')])
    with pytest.raises(KeyError):
        prepare_test_config(Config.fromfile(str(path)), str(path), 'ckpt.pth',
                            work_dir=str(tmp_path / 'wd'), show_dir=str(tmp_path / 'vis'))


# --------------------------------------------------------------- train.py loader flags end to end


class _Stop(Exception):
    """Raised by the stand-in runner builder once it has the prepared config."""


def test_train_tool_no_persistent_workers_reaches_every_loader_as_mmpretrains_tool(
        launch_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``tools/train.py --no-persistent-workers``: the config handed to the runner has the
    loaders' ``persistent_workers`` as mmpretrain's ``merge_args`` (run here) sets them."""
    path = osp.join(MMPRETRAIN_TOOLS, 'train.py')
    if not osp.isfile(path):
        pytest.skip(f'{path} is not shipped')
    loader = dict(batch_size=2, num_workers=2, persistent_workers=True,
                  dataset=dict(type='CustomDataset', pipeline=[]))
    cfg_path = str(tmp_path / 'cls.py')
    Config(dict(default_scope='mmpretrain', model=dict(type='ImageClassifier'),
                train_dataloader=loader, val_dataloader=loader, test_dataloader=loader,
                optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1)),
                val_cfg=dict(), test_cfg=dict())).dump(cfg_path)
    tool = load_script(osp.join(REPO, 'tools', 'train.py'), 'mmlinvit_r16_train_loaders')
    seen: Dict[str, Config] = {}

    def build(cfg: Config, mode: str = 'train', checkpoint: object = None) -> None:
        seen['cfg'] = cfg
        raise _Stop

    launch_env.setattr(tool, 'build_runner', build)
    with pytest.raises(_Stop):
        tool.main([cfg_path, '--work-dir', str(tmp_path / 'wd'), '--no-persistent-workers'])
    official = load_script(path, 'mmpretrain_r16_train_loaders')
    args = argparse.Namespace(no_validate=False, launcher='none', work_dir=str(tmp_path / 'wd'),
                              config=cfg_path, amp=False, resume=None, auto_scale_lr=False,
                              no_pin_memory=False, no_persistent_workers=True, cfg_options=None)
    theirs = official.merge_args(Config.fromfile(cfg_path), args)
    for name in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        assert seen['cfg'][name]['persistent_workers'] is False
        assert theirs[name]['persistent_workers'] is False


def _cls_config_file(tmp_path: Path) -> str:
    """A minimal mmpretrain config file (nothing is built from it)."""
    path = str(tmp_path / 'cls_cfg.py')
    loader = dict(batch_size=2, dataset=dict(type='CustomDataset', pipeline=[]))
    Config(dict(default_scope='mmpretrain', model=dict(type='ImageClassifier'),
                train_dataloader=loader, test_dataloader=loader,
                test_evaluator=dict(type='Accuracy'), test_cfg=dict(),
                optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1)),
                )).dump(path)
    return path


def test_test_tool_amp_reaches_the_test_loop_as_mmpretrains_tool(
        launch_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``tools/test.py --amp``: the runner gets ``test_cfg.fp16 = True``, as mmpretrain's
    ``merge_args`` (run here) sets it."""
    path = osp.join(MMPRETRAIN_TOOLS, 'test.py')
    if not osp.isfile(path):
        pytest.skip(f'{path} is not shipped')
    cfg_path = _cls_config_file(tmp_path)
    tool = load_script(osp.join(REPO, 'tools', 'test.py'), 'mmlinvit_r16_test_amp')
    seen: Dict[str, Config] = {}

    def build(cfg: Config, mode: str = 'train', checkpoint: object = None) -> None:
        seen['cfg'] = cfg
        raise _Stop

    launch_env.setattr(tool, 'build_runner', build)
    with pytest.raises(_Stop):
        tool.main([cfg_path, 'ckpt.pth', '--work-dir', str(tmp_path / 'wd'), '--amp'])
    official = load_script(path, 'mmpretrain_r16_test_amp')
    args = argparse.Namespace(launcher='none', work_dir=str(tmp_path / 'wd'), config=cfg_path,
                              checkpoint='ckpt.pth', amp=True, show=False, show_dir=None,
                              tta=False, no_pin_memory=False, cfg_options=None, wait_time=2,
                              interval=1)
    theirs = official.merge_args(Config.fromfile(cfg_path), args)
    assert theirs.test_cfg.fp16 is True
    assert seen['cfg'].test_cfg['fp16'] is True


def test_flag_mistakes_are_error_lines_of_the_tools(launch_env: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    """``--out-item`` on a segmentation config (test.py) and ``--auto-scale-lr`` without
    ``auto_scale_lr.base_batch_size`` (train.py) end in one ``error:`` line, not a
    traceback."""
    seg_path = str(tmp_path / 'seg_cfg.py')
    Config(dict(default_scope='mmseg', model=dict(type='EncoderDecoder'),
                test_dataloader=dict(dataset=dict(type='ADE20KDataset')),
                test_evaluator=dict(type='IoUMetric'))).dump(seg_path)
    test_tool = load_script(osp.join(REPO, 'tools', 'test.py'), 'mmlinvit_r16_test_flags')
    with pytest.raises(SystemExit, match=r"^error: --out-item is mmpretrain's flag"):
        test_tool.main([seg_path, 'ckpt.pth', '--work-dir', str(tmp_path / 'wd'),
                        '--out', str(tmp_path / 'out'), '--out-item', 'pred'])
    train_tool = load_script(osp.join(REPO, 'tools', 'train.py'), 'mmlinvit_r16_train_flags')
    with pytest.raises(SystemExit, match=r'^error: --auto-scale-lr needs auto_scale_lr'):
        train_tool.main([_cls_config_file(tmp_path), '--work-dir', str(tmp_path / 'wd'),
                         '--auto-scale-lr'])


# ------------------------------------------------------------------------------------ preflight


def test_an_empty_data_prefix_without_a_data_root_is_not_a_missing_folder(
        tmp_path: Path) -> None:
    """``data_prefix=dict(img_path='')`` without ``data_root``: mmengine joins nothing (the
    annotation file's paths are used as they are), so there is no folder to miss; the
    check must not name a folder ``''``."""
    ann = tmp_path / 'ann.txt'
    ann.write_text('a.jpg 0\n')
    dataset = dict(type='CustomDataset', data_prefix=dict(img_path=''), ann_file=str(ann))
    assert preflight._check_dataset(dataset, 'train_dataloader.dataset', {}) == []
