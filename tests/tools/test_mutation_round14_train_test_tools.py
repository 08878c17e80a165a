"""Mutation round 14: ``tools/train.py`` and ``tools/test.py`` against the official tools.

Guarded here (each broke silently: a flag parsed but ignored, exit status 0):

* train.py hands ``--launcher`` to the config preparation, runs ``--check-data`` on the train
  world only when asked, and closes the process group at the end;
* test.py hands ``--show`` / ``--wait-time`` / ``--work-dir`` / ``--launcher`` /
  ``--out-item`` / ``--no-pin-memory`` / ``--cfg-options`` on, gives the checkpoint to the
  runner, returns the runner's metrics and dumps them for ``--out-item metrics``;
  ``--wait-time``'s default is the official tools' (read from their parsers);
* the config preparation matches the official tools run on the same config:
  mmpretrain's ``merge_args`` (``--amp`` keeps a configured ``loss_scale``, ``--show`` without
  ``--show-dir``, ``--wait-time``) and mmseg's ``trigger_visualization_hook``; ``--amp`` on
  another wrapper type is refused as mmseg's assert does; a config's own ``work_dir`` is kept;
  a config with ``resume = True`` is still evaluated, not resumed, by test.py;
* two processes of a launcher (``WORLD_SIZE=2``) with ``--launcher none`` are refused.

The official scripts are the ones shipped in the installed packages (``mmseg/.mim/tools``,
``mmpretrain/.mim/tools``); a test that needs one is skipped when it is not shipped.
"""
import argparse
import copy
import os.path as osp
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List

import mmengine
import pytest
from mmengine.config import Config

import mmpretrain
import mmseg
from mmlinvit.engine.launch import (EvaluationFlagError, prepare_test_config,
                                    prepare_train_config)
from mmlinvit.utils.cli import load_script

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SEG = osp.join(REPO, 'configs', 'adala_dinov2_ade20k.py')
DEMO = osp.join(REPO, 'configs', 'demo', 'upernet_vit-tiny-softmax_1xb8-300it_toy-64x64.py')
MMSEG_TOOLS = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools')
MMPRETRAIN_TOOLS = osp.join(osp.dirname(mmpretrain.__file__), '.mim', 'tools')


class _Stop(Exception):
    """Raised by a stand-in once it has seen what the tool passed."""


def _tool(name: str) -> ModuleType:
    return load_script(osp.join(REPO, 'tools', f'{name}.py'), f'mmlinvit_r14_{name}_tool')


def _official(folder: str, name: str, module_name: str) -> ModuleType:
    path = osp.join(folder, f'{name}.py')
    if not osp.isfile(path):
        pytest.skip(f'{path} is not shipped')
    return load_script(path, module_name)


def _official_args(monkeypatch: pytest.MonkeyPatch, module: ModuleType,
                   argv: List[str]) -> argparse.Namespace:
    """The official tool's ``parse_args`` on ``argv`` (it reads sys.argv, sets LOCAL_RANK)."""
    monkeypatch.setenv('LOCAL_RANK', '0')
    monkeypatch.setattr(sys, 'argv', ['test.py', *argv])
    return module.parse_args()


def _cls_cfg() -> Config:
    """A minimal mmpretrain test config (nothing is built from it)."""
    pipeline = [dict(type='LoadImageFromFile'), dict(type='ResizeEdge', scale=8),
                dict(type='PackInputs')]
    return Config(dict(
        default_scope='mmpretrain', model=dict(type='ImageClassifier'),
        test_dataloader=dict(batch_size=1, dataset=dict(type='CustomDataset',
                                                         pipeline=pipeline)),
        test_evaluator=dict(type='Accuracy'), test_cfg=dict(),
        default_hooks=dict(visualization=dict(type='VisualizationHook', enable=False)),
        optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1))))


# ----------------------------------------------------------------------------- train.py


class _FakeTrainRunner:
    """Stands for the runner: records that training ran."""

    def __init__(self, calls: List[str]) -> None:
        self.calls = calls

    def train(self) -> None:
        self.calls.append('train')


def _run_train_tool(monkeypatch: pytest.MonkeyPatch, argv: List[str]) -> Dict[str, Any]:
    """Runs train.py's main() with the runner, data check and teardown recorded."""
    tool = _tool('train')
    seen: Dict[str, Any] = dict(calls=[])

    def prepare(cfg: Config, path: str, **kwargs: Any) -> Config:
        seen['prepare'] = kwargs
        return cfg

    def build(cfg: Config, mode: str = 'train', checkpoint: Any = None) -> _FakeTrainRunner:
        seen['calls'].append(f'build:{mode}')
        return _FakeTrainRunner(seen['calls'])

    monkeypatch.setattr(tool, 'prepare_train_config', prepare)
    monkeypatch.setattr(tool, 'build_runner', build)
    monkeypatch.setattr(tool, 'check_data',
                        lambda cfg, mode: seen['calls'].append(f'check_data:{mode}'))
    monkeypatch.setattr(tool, 'finish_distributed', lambda: seen['calls'].append('finish'))
    tool.main(argv)
    return seen


def test_train_tool_hands_the_launcher_on(clean_launch_env: pytest.MonkeyPatch) -> None:
    """``--launcher pytorch`` reaches the preparation (CPU gloo set-up, DDP wrapper)."""
    seen = _run_train_tool(clean_launch_env, [DEMO, '--launcher', 'pytorch'])
    assert seen['prepare']['launcher'] == 'pytorch'


def test_train_tool_checks_the_train_data_only_when_asked(
        clean_launch_env: pytest.MonkeyPatch) -> None:
    """``--check-data`` decodes the train / val sets ('train' mode) before training; without
    it nothing is decoded; the process group is closed after training either way."""
    seen = _run_train_tool(clean_launch_env, [DEMO])
    assert seen['calls'] == ['build:train', 'train', 'finish']
    seen = _run_train_tool(clean_launch_env, [DEMO, '--check-data'])
    assert seen['calls'] == ['build:train', 'check_data:train', 'train', 'finish']


def test_train_tool_resume_flag_forms(clean_launch_env: pytest.MonkeyPatch) -> None:
    """mmpretrain's ``--resume``: absent -> None, bare -> 'auto', with a path -> the path."""
    official = _official(MMPRETRAIN_TOOLS, 'train', 'mmpretrain_official_train_r14')
    for extra in ([], ['--resume'], ['--resume', 'x.pth']):
        ours = _run_train_tool(clean_launch_env, [DEMO, *extra])['prepare']['resume']
        assert ours == _official_args(clean_launch_env, official, ['c.py', *extra]).resume


# ------------------------------------------------------------------------------ test.py


class _FakeTestRunner:
    """Stands for the runner: returns fixed metrics."""

    metrics = {'mIoU': 12.5, 'aAcc': 80.0}

    def test(self) -> Dict[str, float]:
        return dict(self.metrics)


def _run_test_tool(monkeypatch: pytest.MonkeyPatch, argv: List[str],
                   prepare: Any = None) -> Dict[str, Any]:
    """Runs test.py's main() with the runner replaced; returns what it saw."""
    tool = _tool('test')
    seen: Dict[str, Any] = {}

    def record(cfg: Config, path: str, ckpt: str, **kwargs: Any) -> Config:
        seen['cfg'] = cfg
        seen['prepare'] = kwargs
        return cfg

    def build(cfg: Config, mode: str = 'train', checkpoint: Any = None) -> _FakeTestRunner:
        seen['build'] = (mode, checkpoint)
        return _FakeTestRunner()

    monkeypatch.setattr(tool, 'prepare_test_config', prepare or record)
    monkeypatch.setattr(tool, 'build_runner', build)
    monkeypatch.setattr(tool, 'finish_distributed', lambda: None)
    seen['returned'] = tool.main(argv)
    return seen


def test_test_tool_hands_every_flag_on(clean_launch_env: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    seen = _run_test_tool(clean_launch_env, [
        DEMO, 'ckpt.pth', '--show', '--wait-time', '0.5', '--work-dir', str(tmp_path / 'w'),
        '--launcher', 'pytorch', '--out', str(tmp_path / 'p.pkl'), '--out-item', 'pred',
        '--no-pin-memory', '--cfg-options', 'test_cfg.marker=7'])
    kwargs = seen['prepare']
    assert kwargs['show'] is True and kwargs['wait_time'] == 0.5
    assert kwargs['work_dir'] == str(tmp_path / 'w') and kwargs['launcher'] == 'pytorch'
    assert kwargs['out_item'] == 'pred' and kwargs['pin_memory'] is False
    assert seen['cfg'].test_cfg.marker == 7  # --cfg-options merged before the preparation
    assert seen['build'] == ('test', 'ckpt.pth')


def test_wait_time_default_is_the_official_tools(clean_launch_env: pytest.MonkeyPatch) -> None:
    seen = _run_test_tool(clean_launch_env, [DEMO, 'ckpt.pth', '--show'])
    for folder, name in ((MMSEG_TOOLS, 'mmseg_official_test_r14'),
                         (MMPRETRAIN_TOOLS, 'mmpretrain_official_test_r14')):
        official = _official_args(clean_launch_env, _official(folder, 'test', name),
                                  ['c.py', 'ckpt.pth', '--show'])
        assert seen['prepare']['wait_time'] == official.wait_time


def test_test_tool_returns_and_dumps_the_metrics(clean_launch_env: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    """main() returns runner.test()'s metrics; ``--out-item metrics`` dumps them to --out (as
    mmpretrain's tools/test.py), ``--out-item pred`` leaves that to DumpResults."""
    metrics_file = tmp_path / 'metrics.json'
    seen = _run_test_tool(clean_launch_env, [DEMO, 'ckpt.pth', '--out', str(metrics_file),
                                             '--out-item', 'metrics'])
    assert seen['returned'] == _FakeTestRunner.metrics
    assert mmengine.load(str(metrics_file)) == _FakeTestRunner.metrics
    pred_file = tmp_path / 'pred.pkl'
    _run_test_tool(clean_launch_env, [DEMO, 'ckpt.pth', '--out', str(pred_file),
                                      '--out-item', 'pred'])
    assert not pred_file.exists()


# ------------------------------------------------------ config preparation vs the officials


def test_amp_keeps_a_configured_loss_scale_as_mmpretrain(
        monkeypatch: pytest.MonkeyPatch) -> None:
    official = _official(MMPRETRAIN_TOOLS, 'train', 'mmpretrain_official_train_r14')
    cfg = Config.fromfile(DEMO)
    cfg.optim_wrapper.loss_scale = 512.
    reference = official.merge_args(copy.deepcopy(cfg), _official_args(
        monkeypatch, official, [DEMO, '--amp']))
    ours = prepare_train_config(cfg, DEMO, amp=True)
    assert ours.optim_wrapper.type == reference.optim_wrapper.type == 'AmpOptimWrapper'
    assert ours.optim_wrapper.loss_scale == reference.optim_wrapper.loss_scale == 512.


def test_amp_on_another_wrapper_type_is_refused_as_mmseg_asserts() -> None:
    """mmseg: ``assert optim_wrapper == 'OptimWrapper'`` unless it is AmpOptimWrapper."""
    cfg = Config.fromfile(DEMO)
    cfg.optim_wrapper.type = 'mmlinvit.SomeOtherWrapper'
    with pytest.raises(ValueError, match='--amp needs optim_wrapper.type'):
        prepare_train_config(cfg, DEMO, amp=True)


def test_the_configs_own_work_dir_is_kept() -> None:
    """mmseg / mmpretrain: ``--work-dir`` > the config's work_dir > ./work_dirs/<stem>."""
    for prepare in (lambda c: prepare_train_config(c, DEMO),
                    lambda c: prepare_test_config(c, DEMO, 'ckpt.pth')):
        cfg = Config.fromfile(DEMO)
        cfg.work_dir = 'work_dirs/from_config'
        assert prepare(cfg).work_dir == 'work_dirs/from_config'
        cfg = Config.fromfile(DEMO)
        cfg.pop('work_dir', None)
        assert prepare(cfg).work_dir == osp.join('./work_dirs', Path(DEMO).stem)


def test_test_tool_evaluates_rather_than_resumes_a_resume_config() -> None:
    """A config written for resuming (``resume = True``) evaluates CHECKPOINT: mmengine's
    runner with resume=True would load optimizer / iteration state and, with load_from None,
    hunt the work dir instead."""
    cfg = Config.fromfile(DEMO)
    cfg.resume = True
    cfg = prepare_test_config(cfg, DEMO, 'ckpt.pth')
    assert cfg.resume is False and cfg.load_from == 'ckpt.pth'


def test_seg_show_without_show_dir_matches_mmseg(monkeypatch: pytest.MonkeyPatch) -> None:
    """mmseg's trigger_visualization_hook, plus mmlinvit's ``interval`` (1: mmseg's hook
    draws every test sample, whatever its interval)."""
    official = _official(MMSEG_TOOLS, 'test', 'mmseg_official_test_r14')
    for argv in (['--show', '--wait-time', '3.5'], ['--show-dir', 'vis'],
                 ['--show', '--show-dir', 'vis', '--wait-time', '0']):
        args = _official_args(monkeypatch, official, [SEG, 'ckpt.pth', *argv])
        reference = official.trigger_visualization_hook(Config.fromfile(SEG), args)
        ours = prepare_test_config(Config.fromfile(SEG), SEG, 'ckpt.pth', show=args.show,
                                   show_dir=args.show_dir, wait_time=args.wait_time)
        assert ours.default_hooks.visualization.to_dict() == dict(
            reference.default_hooks.visualization.to_dict(), interval=1)
        assert ours.visualizer.get('save_dir') == reference.visualizer.get('save_dir')


def test_cls_show_flags_match_mmpretrain(monkeypatch: pytest.MonkeyPatch) -> None:
    official = _official(MMPRETRAIN_TOOLS, 'test', 'mmpretrain_official_test_r14')
    for argv in (['--show', '--wait-time', '3.5'], ['--show-dir', 'vis', '--interval', '4'],
                 ['--show', '--show-dir', 'vis', '--wait-time', '0']):
        args = _official_args(monkeypatch, official, ['c.py', 'ckpt.pth', *argv])
        reference = official.merge_args(_cls_cfg(), args)
        ours = prepare_test_config(_cls_cfg(), 'c.py', 'ckpt.pth', show=args.show,
                                   show_dir=args.show_dir, wait_time=args.wait_time,
                                   interval=args.interval)
        assert ours.default_hooks.visualization.to_dict() == \
            reference.default_hooks.visualization.to_dict()


def test_cls_tta_pipeline_matches_mmpretrain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without tta settings: the test pipeline with its last step under a TestTimeAug of a
    flipped and an unflipped view, scores averaged by AverageClsScoreTTA."""
    official = _official(MMPRETRAIN_TOOLS, 'test', 'mmpretrain_official_test_r14')
    args = _official_args(monkeypatch, official, ['c.py', 'ckpt.pth', '--tta'])
    reference = official.merge_args(_cls_cfg(), args)
    ours = prepare_test_config(_cls_cfg(), 'c.py', 'ckpt.pth', tta=True)
    assert ours.test_dataloader.dataset.pipeline == \
        reference.test_dataloader.dataset.pipeline
    assert ours.model.type == reference.model.type
    assert ours.model.module == reference.model.module


def test_two_launched_processes_without_launcher_are_refused(
        clean_launch_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    clean_launch_env.setenv('WORLD_SIZE', '2')
    for name, argv in (('train', [DEMO]), ('test', [DEMO, 'ckpt.pth'])):
        with pytest.raises(SystemExit) as info:
            _tool(name).parse_args(argv)
        assert info.value.code == 2
        assert 'WORLD_SIZE=2' in capsys.readouterr().err


@pytest.mark.parametrize('scoped', ['mmengine.OptimWrapper', 'mmengine.AmpOptimWrapper'])
def test_amp_accepts_a_scope_prefixed_wrapper_type(scoped: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding of round 14 (fixed; failed before): ``type='mmengine.OptimWrapper'``
    builds the same wrapper as ``'OptimWrapper'`` (mmengine's registry), and the check just
    after the ``--amp`` branch already strips the scope, but ``--amp`` refuses both scoped
    spellings, for ``'mmengine.AmpOptimWrapper'`` with "--amp needs
    optim_wrapper.type="OptimWrapper"" although AMP is already on.  mmpretrain's
    ``merge_args`` (the reference here) turns on AMP."""
    official = _official(MMPRETRAIN_TOOLS, 'train', 'mmpretrain_official_train_r14')
    cfg = Config.fromfile(DEMO)
    cfg.optim_wrapper.type = scoped
    reference = official.merge_args(copy.deepcopy(cfg), _official_args(
        monkeypatch, official, [DEMO, '--amp']))
    ours = prepare_train_config(cfg, DEMO, amp=True)
    assert ours.optim_wrapper.type.split('.')[-1] == \
        reference.optim_wrapper.type.split('.')[-1] == 'AmpOptimWrapper'
    assert ours.optim_wrapper.get('loss_scale', 'dynamic') == 'dynamic'


def test_auto_scale_lr_without_base_batch_size_is_refused_before_building() -> None:
    """``--auto-scale-lr`` on ``auto_scale_lr = dict(enable=False)`` (no base_batch_size):
    mmengine's ``Runner.scale_lr`` would only assert 'Lack of `base_batch_size`' once model
    and data were built; the tool names the fix first (its documented ValueError)."""
    cfg = Config.fromfile(DEMO)
    cfg.auto_scale_lr = dict(enable=False)
    with pytest.raises(ValueError, match='base_batch_size'):
        prepare_train_config(cfg, DEMO, auto_scale_lr=True)
    cfg = Config.fromfile(DEMO)
    cfg.auto_scale_lr = dict(enable=False, base_batch_size=16)
    assert prepare_train_config(cfg, DEMO, auto_scale_lr=True).auto_scale_lr == dict(
        enable=True, base_batch_size=16)


def test_out_item_metrics_adds_no_prediction_dump() -> None:
    """mmpretrain's tools/test.py appends DumpResults only for ``--out-item pred`` (or none);
    for ``metrics`` the file receives the metrics alone (a DumpResults on a ``.json`` path
    would even refuse to build: it writes pickles only)."""
    cfg = prepare_test_config(_cls_cfg(), 'c.py', 'ckpt.pth', out='m.json', out_item='metrics')
    assert cfg.test_evaluator == dict(type='Accuracy')
    cfg = prepare_test_config(_cls_cfg(), 'c.py', 'ckpt.pth', out='p.pkl', out_item='pred')
    assert [e['type'] for e in cfg.test_evaluator] == ['Accuracy', 'DumpResults']
    assert cfg.test_evaluator[1]['out_file_path'] == 'p.pkl'


def test_tta_keeps_the_top_level_preprocessor_on_the_wrapped_model() -> None:
    """mmengine's Runner gives a model config without ``data_preprocessor`` the top-level one
    (``model.setdefault('data_preprocessor', cfg.data_preprocessor)``); under ``--tta`` the
    wrapped model must still get it, and the wrapper none (it would overwrite the model's)."""
    cfg = _cls_cfg()
    top = dict(type='ClsDataPreprocessor', mean=[1., 2., 3.], std=[4., 5., 6.])
    cfg.data_preprocessor = top
    cfg = prepare_test_config(cfg, 'c.py', 'ckpt.pth', tta=True)
    assert cfg.model.module.data_preprocessor == top
    assert cfg.model.data_preprocessor is None


def test_test_amp_is_mmpretrains_fp16_test_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tools/test.py --amp`` (mmpretrain's flag, refused by argparse before) sets what
    mmpretrain's own tool sets, ``test_cfg.fp16 = True``, and mmengine's Runner builds a
    ``TestLoop`` with ``fp16=True`` from it; another loop type is refused."""
    official = _official(MMPRETRAIN_TOOLS, 'test', 'mmpretrain_official_test_amp_r14')
    args = _official_args(monkeypatch, official, [DEMO, 'ckpt.pth', '--amp'])
    reference = official.merge_args(Config.fromfile(DEMO), args)
    assert reference.test_cfg.fp16 is True
    tool = _tool('test')
    assert tool.parse_args([DEMO, 'ckpt.pth', '--amp']).amp is True
    assert tool.parse_args([DEMO, 'ckpt.pth']).amp is False
    ours = prepare_test_config(Config.fromfile(DEMO), DEMO, 'ckpt.pth', amp=True)
    assert dict(ours.test_cfg) == dict(reference.test_cfg)
    import inspect

    from mmengine.runner import TestLoop
    assert set(ours.test_cfg) - {'type'} <= set(inspect.signature(TestLoop).parameters)
    cfg = Config.fromfile(DEMO)
    cfg.test_cfg = dict(type='mmlinvit.UnknownLoop')
    with pytest.raises(EvaluationFlagError, match='--amp sets fp16=True'):
        prepare_test_config(cfg, DEMO, 'ckpt.pth', amp=True)


def test_train_no_pin_memory_and_no_persistent_workers_as_mmpretrain(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``tools/train.py --no-pin-memory --no-persistent-workers`` (mmpretrain's flags; argparse
    stopped with 'unrecognized arguments' before) switch both off on every data loader, as
    mmpretrain's own ``merge_args`` does; without them the config's loaders are untouched."""
    official = _official(MMPRETRAIN_TOOLS, 'train', 'mmpretrain_official_train_loaders_r14')
    flags = ['--no-pin-memory', '--no-persistent-workers']
    reference = official.merge_args(Config.fromfile(DEMO),
                                    _official_args(monkeypatch, official, [DEMO, *flags]))
    tool = _tool('train')
    args = tool.parse_args([DEMO, *flags])
    assert args.no_pin_memory and args.no_persistent_workers
    ours = prepare_train_config(Config.fromfile(DEMO), DEMO, pin_memory=False,
                                persistent_workers=False)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        for key in ('pin_memory', 'persistent_workers'):
            assert ours[loader][key] is reference[loader][key] is False, (loader, key)
    untouched = prepare_train_config(Config.fromfile(DEMO), DEMO)
    original = Config.fromfile(DEMO)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        for key in ('pin_memory', 'persistent_workers'):
            assert untouched[loader].get(key) == original[loader].get(key), (loader, key)
