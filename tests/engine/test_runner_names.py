"""Two Runners of one process with the same config file name in the same second get
distinct experiment names (mmlinvit.engine.launch.build_runner)."""
import time
import types

import pytest
from mmengine.registry import DefaultScope

import mmengine.runner.runner as mmengine_runner
from mmlinvit.engine import launch
from train_testing import dump, make_image_folder, make_toy_scenes, toy_cls_config, toy_config

pytestmark = pytest.mark.usefixtures('one_thread')


def test_same_second_same_file_name_runners_keep_their_own_scope(tmp_path, monkeypatch):
    frozen = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time)
                                      if not k.startswith('_')})
    frozen.time = lambda: 1.7e9  # both Runners get the same timestamp
    monkeypatch.setattr(mmengine_runner, 'time', frozen)
    cls_cfg = toy_cls_config(make_image_folder(str(tmp_path / 'cls')), str(tmp_path / 'a'))
    seg_cfg = toy_config(make_toy_scenes(str(tmp_path / 'seg')), str(tmp_path / 'b'))
    (tmp_path / 'a').mkdir()
    (tmp_path / 'b').mkdir()
    first = launch.build_runner(launch.Config.fromfile(
        dump(cls_cfg, str(tmp_path / 'a' / 'cfg.py'))), mode='train')
    second = launch.build_runner(launch.Config.fromfile(
        dump(seg_cfg, str(tmp_path / 'b' / 'cfg.py'))), mode='train')
    assert first.experiment_name != second.experiment_name
    assert second.experiment_name.startswith('cfg-run')
    assert DefaultScope.get_instance(first.experiment_name).scope_name == 'mmpretrain'
    assert DefaultScope.get_current_instance().scope_name == 'mmseg'
    assert type(second.visualizer).__name__ == 'SegLocalVisualizer'
