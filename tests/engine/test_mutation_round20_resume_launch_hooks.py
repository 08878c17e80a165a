"""``--resume`` and the launcher set-up on branches that no earlier test reached (mutation
round 20): each test below failed on at least one single change of the module that the rest
of the suite let pass.

Guarded here, each against a hand-written expectation or the official code run in the test:

* :mod:`mmlinvit.engine.resume`: only ``CheckpointHook``'s exact names (``iter_<n>.pth`` /
  ``epoch_<n>.pth``) are numbered checkpoints; the checkpoint ``last_checkpoint`` names is
  never left out as an earlier run's, nor is an older file of the *same* number; every
  damaged checkpoint skipped on the way to an intact one is named; an interrupted run's
  config that no longer parses is reported, not raised; a key added inside a compared
  entry is named with both values.
* :mod:`mmlinvit.engine.launch`: a torchrun process with ``--launcher pytorch`` is accepted;
  ``WORLD_SIZE`` under ``--launcher mpi`` as mmengine's ``_init_dist_mpi`` sets it; ``--amp``
  keeps a configured ``loss_scale`` as mmpretrain's ``merge_args``; a ``load_from``
  (fine-tuning) run is not compared with the pretrained run's config and may opt out of the
  coverage check; ``--out-item`` and ``--show --wait-time`` as mmpretrain's / mmseg's own
  ``tools/test.py``; a safeguard hook the config gives as the class is not added a second
  time (a finding, fixed in this round).

Checkpoints are written with ``torch.save`` in the layout of mmengine's ``Runner``; their
age is set with ``os.utime`` where the choice depends on it.
"""
import logging
import os
import os.path as osp
from pathlib import Path
from typing import Optional

import mmpretrain
import mmseg
import pytest
import torch

from mmlinvit.engine.hooks import CheckFiniteHook
from mmlinvit.engine.resume import (numbered_checkpoints, resume_candidates,
                                     select_resume_checkpoint, warn_changed_resume_config)

from checkpoint_damage import truncate_to_half
from test_mutation_round16_launch_preflight import amp_train_args
from train_testing import captured_log

pytestmark = pytest.mark.usefixtures('one_thread')


# ------------------------------------------------------------------------------ helpers
def _save(path: Path, iteration: int, mtime: float, cfg_text: Optional[str] = None) -> str:
    """Writes a runner-like checkpoint of ``iteration`` with modification time ``mtime``.

    Args:
        path: Where to write it.
        iteration: ``meta['iter']``.
        mtime: Its modification time (seconds since the epoch).
        cfg_text: ``meta['cfg']``, the config text mmengine stores (left out when None).

    Returns:
        The path as a string.
    """
    meta = dict(iter=iteration, epoch=0, seed=1)
    if cfg_text is not None:
        meta['cfg'] = cfg_text
    torch.save(dict(meta=meta, state_dict=dict(w=torch.full((2, ), float(iteration)))),
               str(path))
    os.utime(path, (mtime, mtime))
    return str(path)


# ------------------------------------------------------------------------------ resume
def test_only_checkpoint_hooks_exact_names_are_numbered(tmp_path: Path) -> None:
    """mmengine's ``CheckpointHook`` names checkpoints ``iter_<n>.pth`` / ``epoch_<n>.pth``
    exactly; a copy such as ``iter_12.pth.bak.pth`` is no checkpoint of step 12 and must not
    be resumed over the real newest one."""
    for step in (2, 4):
        _save(tmp_path / f'iter_{step}.pth', step, 1000.0 + step)
    _save(tmp_path / 'iter_12.pth.bak.pth', 12, 1010.0)
    assert [osp.basename(p) for p in numbered_checkpoints(str(tmp_path))] == [
        'iter_2.pth', 'iter_4.pth']
    assert select_resume_checkpoint(str(tmp_path)) == osp.normpath(str(tmp_path / 'iter_4.pth'))


def test_the_named_checkpoint_is_never_left_out_as_an_earlier_runs(tmp_path: Path) -> None:
    """``last_checkpoint`` names iter_4; an iter_2 written after it (a later run killed before
    it rewrote ``last_checkpoint``) makes *it* no earlier-run leftover: "the target itself is
    never left out" (the docstring of ``resume_candidates``), so iter_4 is resumed and nothing
    is called an earlier run's."""
    named = _save(tmp_path / 'iter_4.pth', 4, 1000.0)
    _save(tmp_path / 'iter_2.pth', 2, 2000.0)
    (tmp_path / 'last_checkpoint').write_text(named)
    latest, ordered, stale = resume_candidates(str(tmp_path))
    assert stale == []
    assert [osp.basename(p) for p in ordered] == ['iter_4.pth', 'iter_2.pth']
    with captured_log(logging.WARNING) as warned:
        assert select_resume_checkpoint(str(tmp_path)) == osp.normpath(named)
    assert not any('earlier run' in m for m in warned), warned


def test_every_damaged_checkpoint_skipped_is_named(tmp_path: Path) -> None:
    """iter_6 (named) and iter_4 are both cut short: iter_2 is resumed, and the warning names
    iter_6 first and iter_4 under "Also skipped"."""
    paths = {step: _save(tmp_path / f'iter_{step}.pth', step, 1000.0 + step)
             for step in (2, 4, 6)}
    for step in (4, 6):
        truncate_to_half(paths[step])
    (tmp_path / 'last_checkpoint').write_text(paths[6])
    with captured_log(logging.WARNING) as warned:
        assert select_resume_checkpoint(str(tmp_path)) == osp.normpath(paths[2])
    text = '\n'.join(warned)
    assert f'cannot be loaded: {paths[6]} is truncated' in text, text
    assert f'Also skipped: {paths[4]} is truncated' in text, text


def test_a_stored_config_that_no_longer_parses_is_reported_not_raised(tmp_path: Path) -> None:
    """``meta['cfg']`` that is no valid Python any more (a config from another version):
    nothing is compared, an INFO line says so, and the resume goes on."""
    from mmengine.config import Config
    path = _save(tmp_path / 'iter_4.pth', 4, 1000.0, cfg_text='max_iters = (\n')
    with captured_log(logging.INFO) as logged:
        assert warn_changed_resume_config(Config(dict(train_cfg=dict(max_iters=8))), path) == []
    assert any('cannot be read' in m and 'not compared' in m for m in logged), logged


def test_a_same_numbered_older_file_in_the_work_dir_is_no_earlier_runs(tmp_path: Path) -> None:
    """Only a *higher* number written before the target is an earlier run's: the work dir's
    own iter_4.pth, older than the out_dir's iter_4.pth that ``last_checkpoint`` names, stays a
    candidate (after the target, "the target first among equals") and is not warned about."""
    work_dir, out_dir = tmp_path / 'wd', tmp_path / 'out'
    work_dir.mkdir()
    out_dir.mkdir()
    own = _save(work_dir / 'iter_4.pth', 4, 1000.0)
    named = _save(out_dir / 'iter_4.pth', 4, 2000.0)
    (work_dir / 'last_checkpoint').write_text(named)
    _, ordered, stale = resume_candidates(str(work_dir))
    assert stale == []
    assert ordered == [osp.normpath(named), osp.normpath(own)]
    with captured_log(logging.WARNING) as warned:
        assert select_resume_checkpoint(str(work_dir)) == osp.normpath(named)
    assert warned == []



def test_a_key_added_to_the_optimizer_is_named_with_its_values(tmp_path: Path) -> None:
    """``momentum=0.9`` added to the resumed run's SGD (the restored optimizer state keeps the
    interrupted run's none): the warning names the added leaf with both values, ``None ->
    0.9``, not just the entry."""
    from mmengine.config import Config

    def cfg(**optimizer: float) -> Config:
        return Config(dict(optim_wrapper=dict(
            type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1, **optimizer))))

    path = _save(tmp_path / 'iter_4.pth', 4, 1000.0, cfg_text=cfg().pretty_text)
    with captured_log(logging.WARNING) as warned:
        assert warn_changed_resume_config(cfg(momentum=0.9), path) == ['optim_wrapper.optimizer']
    assert len(warned) == 1 and 'optim_wrapper.optimizer.momentum: None -> 0.9' in warned[0], \
        warned


# ------------------------------------------------------------------------------ launch
MMSEG_TOOLS = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools')
MMPRETRAIN_TOOLS = osp.join(osp.dirname(mmpretrain.__file__), '.mim', 'tools')


@pytest.fixture
def clean_launch_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A launcher environment without any rank / world / rendezvous variable; each one is
    recorded first (``setenv`` then ``delenv``), so whatever the code under test exports is
    removed after the test."""
    for key in ('WORLD_SIZE', 'LOCAL_RANK', 'RANK', 'MASTER_ADDR', 'MASTER_PORT',
                'SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NNODES', 'SLURM_JOB_NUM_NODES',
                'OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_LOCAL_RANK', 'OMPI_COMM_WORLD_SIZE'):
        monkeypatch.setenv(key, '')
        monkeypatch.delenv(key)
    return monkeypatch



def test_a_process_torchrun_started_with_launcher_pytorch_is_accepted(
        clean_launch_env: pytest.MonkeyPatch) -> None:
    """What ``bash tools/dist_train.sh CONFIG 2`` runs: torchrun exports ``WORLD_SIZE=2`` /
    ``RANK`` / ``LOCAL_RANK`` and the tool gets ``--launcher pytorch``.  Only ``--launcher
    none`` in such a process is refused; rank 0 of a launched run parses normally."""
    import argparse

    from mmlinvit.engine.launch import add_launch_arguments, parse_launch_args
    for key, value in dict(WORLD_SIZE='2', RANK='0', LOCAL_RANK='0').items():
        clean_launch_env.setenv(key, value)
    parser = argparse.ArgumentParser()
    parser.add_argument('config')
    add_launch_arguments(parser, 'x=1')
    args = parse_launch_args(parser, ['c.py', '--launcher', 'pytorch'])
    assert args.launcher == 'pytorch' and os.environ['WORLD_SIZE'] == '2'
    with pytest.raises(SystemExit):
        parse_launch_args(parser, ['c.py'])

def test_the_mpi_world_size_replaces_a_stale_one_as_mmengines_init_does(
        clean_launch_env: pytest.MonkeyPatch) -> None:
    """``mpirun`` passes the shell's ``WORLD_SIZE=1`` on; mmengine's ``_init_dist_mpi`` (run
    here, without its GPU and process-group calls) replaces it by ``OMPI_COMM_WORLD_SIZE``,
    and the checks before it must count the same 4 processes."""
    import argparse

    import mmengine.dist.utils as dist_utils

    from mmlinvit.engine.launch import add_launch_arguments, parse_launch_args
    env = clean_launch_env
    for key, value in dict(WORLD_SIZE='1', OMPI_COMM_WORLD_SIZE='4', OMPI_COMM_WORLD_RANK='0',
                           OMPI_COMM_WORLD_LOCAL_RANK='0', MASTER_ADDR='10.0.0.1',
                           MASTER_PORT='29500').items():
        env.setenv(key, value)
    parser = argparse.ArgumentParser()
    parser.add_argument('config')
    add_launch_arguments(parser, 'x=1')
    parse_launch_args(parser, ['c.py', '--launcher', 'mpi'])
    ours = os.environ['WORLD_SIZE']
    env.setenv('WORLD_SIZE', '1')
    env.setattr(dist_utils.torch.cuda, 'set_device', lambda device: None)
    env.setattr(dist_utils.torch_dist, 'init_process_group', lambda **kwargs: None)
    dist_utils._init_dist_mpi('gloo')
    assert ours == os.environ['WORLD_SIZE'] == '4'


def test_amp_keeps_a_configured_loss_scale_as_mmpretrains_merge_args(tmp_path: Path) -> None:
    """``--amp`` on ``OptimWrapper`` with ``loss_scale=512`` (a static scale the config asks
    for): mmpretrain's ``merge_args`` (run here) keeps it (``setdefault``); only a config
    without one gets ``'dynamic'``."""
    from mmengine.config import Config

    from mmlinvit.engine.launch import prepare_train_config
    from mmlinvit.utils.cli import load_script
    path = osp.join(MMPRETRAIN_TOOLS, 'train.py')
    if not osp.isfile(path):
        pytest.skip(f'{path} is not shipped')
    official = load_script(path, 'mmpretrain_r20_train_tool')

    def cfg() -> Config:
        return Config(dict(default_scope='mmpretrain', model=dict(type='ImageClassifier'),
                           optim_wrapper=dict(type='OptimWrapper', loss_scale=512.0,
                                              optimizer=dict(type='SGD', lr=0.1))))

    args = amp_train_args(str(tmp_path))
    theirs = official.merge_args(cfg(), args)
    ours = prepare_train_config(cfg(), 'c.py', work_dir=str(tmp_path), amp=True)
    assert theirs.optim_wrapper.type == ours.optim_wrapper.type == 'AmpOptimWrapper'
    assert theirs.optim_wrapper.loss_scale == ours.optim_wrapper.loss_scale == 512.0


def test_a_load_from_run_is_not_compared_with_the_pretrained_runs_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fine-tuning from a checkpoint (``load_from`` without ``--resume``) restores no
    optimizer or schedule, so another lr / ``max_iters`` than the pretrained run's is what the
    user wants: no "differs from the interrupted run's" warning; a resume of the same file is
    warned about.  Its coverage check is added unless ``check_checkpoint_coverage = False``."""
    from mmengine.config import Config
    from mmengine.logging import MMLogger

    from mmlinvit.engine import launch

    class StubRunner:
        """Stands in for ``Runner.from_cfg``: keeps the config."""

        def __init__(self, cfg: Config) -> None:
            self.cfg = cfg
            self.logger = MMLogger.get_current_instance()

    monkeypatch.setattr(launch, 'check_inputs', lambda cfg, mode, checkpoint: None)
    monkeypatch.setattr(launch.Runner, 'from_cfg', staticmethod(StubRunner))
    monkeypatch.setattr(launch, '_runners_built', 0)

    def cfg(max_iters: int, **entries: object) -> Config:
        return Config(dict(work_dir=str(tmp_path / 'wd'), launcher='none', model=dict(type='M'),
                           train_cfg=dict(type='IterBasedTrainLoop', max_iters=max_iters),
                           optim_wrapper=dict(type='OptimWrapper',
                                              optimizer=dict(type='SGD', lr=0.1)),
                           train_dataloader=dict(dataset=dict(type='X'),
                                                 sampler=dict(type='DefaultSampler')),
                           default_hooks=dict(checkpoint=dict(type='CheckpointHook',
                                                              interval=2)),
                           **entries))

    ckpt = _save(tmp_path / 'pretrained.pth', 8, 1000.0, cfg_text=cfg(8).pretty_text)
    with captured_log(logging.WARNING) as warned:
        runner = launch.build_runner(cfg(12, load_from=ckpt))
    assert not any('differs from the interrupted run' in m for m in warned), warned
    coverage = 'mmlinvit.CheckpointCoverageHook'
    assert coverage in [h['type'] for h in runner.cfg.custom_hooks]
    # check_checkpoint_coverage = False opts a load_from run out of the coverage check
    runner = launch.build_runner(cfg(12, load_from=ckpt, check_checkpoint_coverage=False))
    assert coverage not in [h['type'] for h in runner.cfg.custom_hooks]
    with captured_log(logging.WARNING) as warned:
        launch.build_runner(cfg(12, load_from=ckpt, resume=True))
    assert any('train_cfg.max_iters: 8 -> 12' in m for m in warned), warned


def test_a_safeguard_hook_given_as_the_class_is_not_added_again() -> None:
    """FINDING (fails on the code before the round-20 fix in ``launch._add_custom_hook``): a
    pure-Python config (``type=CheckFiniteHook``, the class, as mmengine's new-style configs
    write it, and as ``AtomicCheckpointHook`` already accepts for ``CheckpointHook``) that
    sets ``max_skipped_steps=100`` and ``rank_streams=False`` got a second, default
    ``CheckFiniteHook`` (stopping at 30 skipped steps) and a second ``RandomStateHook``
    (re-seeding the rank streams the config turned off).  The hooks are built here through
    the registry the runner uses: one of each, with the config's arguments."""
    from mmengine.config import Config

    from mmlinvit.engine.hooks import RandomStateHook
    from mmlinvit.engine.launch import add_training_safeguards
    from mmlinvit.registry import HOOKS
    cfg = Config(dict(
        custom_hooks=[dict(type=CheckFiniteHook, max_skipped_steps=100),
                      dict(type=RandomStateHook, rank_streams=False)],
        train_dataloader=dict(dataset=dict(type='X'), sampler=dict(type='DefaultSampler')),
        optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1))))
    add_training_safeguards(cfg)
    built = [HOOKS.build(dict(hook)) for hook in cfg.custom_hooks]
    finite = [h for h in built if isinstance(h, CheckFiniteHook)]
    streams = [h for h in built if isinstance(h, RandomStateHook)]
    assert [h.max_skipped_steps for h in finite] == [100]
    assert [h.rank_streams for h in streams] == [False]


@pytest.mark.parametrize('out_item', ['metrics', 'pred'])
def test_out_item_dumps_predictions_only_as_mmpretrains_test_tool(
        tmp_path: Path, clean_launch_env: pytest.MonkeyPatch, out_item: str) -> None:
    """``--out FILE --out-item metrics`` writes the metrics, not the predictions, to FILE:
    mmpretrain's own ``tools/test.py`` (its ``main`` run here with a stand-in runner) adds a
    ``DumpResults`` metric for ``pred`` only, and so must the prepared config."""
    import sys
    import types

    from mmengine.config import Config

    from mmlinvit.engine.launch import prepare_test_config
    from mmlinvit.utils.cli import load_script
    path = osp.join(MMPRETRAIN_TOOLS, 'test.py')
    if not osp.isfile(path):
        pytest.skip(f'{path} is not shipped')
    cfg_path = str(tmp_path / 'cls_cfg.py')
    loader = dict(batch_size=2, dataset=dict(type='CustomDataset', pipeline=[]))
    Config(dict(default_scope='mmpretrain', model=dict(type='ImageClassifier'),
                test_dataloader=loader, test_evaluator=dict(type='Accuracy'),
                test_cfg=dict())).dump(cfg_path)
    out = str(tmp_path / 'out.pkl')
    official = load_script(path, f'mmpretrain_r20_test_tool_{out_item}')
    built = types.SimpleNamespace(test_evaluator=types.SimpleNamespace(metrics=[]),
                                  test=lambda: {'accuracy/top1': 50.0})
    clean_launch_env.setattr(official.Runner, 'from_cfg', staticmethod(lambda cfg: built))
    clean_launch_env.setattr(sys, 'argv', ['test.py', cfg_path, 'ckpt.pth', '--work-dir',
                                           str(tmp_path / 'wd'), '--out', out,
                                           '--out-item', out_item])
    official.main()
    theirs = [type(m).__name__ for m in built.test_evaluator.metrics]
    cfg = prepare_test_config(Config.fromfile(cfg_path), cfg_path, 'ckpt.pth',
                              work_dir=str(tmp_path / 'wd'), out=out, out_item=out_item)
    evaluators = cfg.test_evaluator
    evaluators = evaluators if isinstance(evaluators, list) else [evaluators]
    ours = [e['type'] for e in evaluators if e['type'] == 'DumpResults']
    assert theirs == ours == ([] if out_item == 'metrics' else ['DumpResults'])


def test_seg_show_sets_the_wait_time_as_mmsegs_test_tool(tmp_path: Path) -> None:
    """``--show --wait-time 5`` on a segmentation config: the visualisation hook draws, shows
    and waits 5 s, as mmseg's own ``trigger_visualization_hook`` (run here) sets it.  Without
    ``--show-dir`` the visualizer keeps no ``save_dir`` entry (mmengine's runner then gives
    it the run's log folder for its backends; a ``save_dir=None`` entry would keep them
    off)."""
    import argparse

    from mmengine.config import Config

    from mmlinvit.engine.launch import prepare_test_config
    from mmlinvit.utils.cli import load_script
    path = osp.join(MMSEG_TOOLS, 'test.py')
    if not osp.isfile(path):
        pytest.skip(f'{path} is not shipped')

    def cfg() -> Config:
        return Config(dict(default_scope='mmseg', model=dict(type='EncoderDecoder'),
                           default_hooks=dict(visualization=dict(type='SegVisualizationHook')),
                           visualizer=dict(type='SegLocalVisualizer',
                                           vis_backends=[dict(type='LocalVisBackend')])))

    official = load_script(path, 'mmseg_r20_test_tool')
    theirs = official.trigger_visualization_hook(
        cfg(), argparse.Namespace(show=True, wait_time=5.0, show_dir=None))
    ours = prepare_test_config(cfg(), 'seg.py', 'ckpt.pth', work_dir=str(tmp_path),
                               show=True, wait_time=5.0)
    for prepared in (theirs, ours):
        hook = prepared.default_hooks.visualization
        assert (hook['draw'], hook['show'], hook['wait_time']) == (True, True, 5.0)
    assert 'save_dir' not in theirs.visualizer
    assert ours.visualizer.to_dict() == theirs.visualizer.to_dict()


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU-only refusal')
@pytest.mark.usefixtures('clean_launch_env')
def test_launcher_mpi_on_a_cpu_only_machine_is_refused_naming_torchrun() -> None:
    """mmengine's MPI set-up calls ``torch.cuda.set_device`` (no GPU here) like its Slurm one:
    ``--launcher mpi`` is refused as ``slurm`` is, naming the launcher and torchrun (not
    asking for torchrun's variables, which an MPI job does not have)."""
    from mmlinvit.engine.launch import LaunchError, init_cpu_distributed
    with pytest.raises(LaunchError, match=r'--launcher mpi initialises NCCL .* torchrun'):
        init_cpu_distributed('mpi')
