"""``tools/test.py`` flags with several processes: ``--out DIR`` of a segmentation config made
its folder on rank 0 only, so another rank's first label map could fail (4 of 4 two-process
runs stopped with FileNotFoundError); ``--show-dir`` paints only rank 0's share of the images
(mmseg / mmpretrain draw on rank 0), which is now said; a list ``test_evaluator`` works."""
import logging
import os.path as osp

import pytest

from mmlinvit.engine.launch import EvaluationFlagError, prepare_test_config

from train_testing import captured_log, make_toy_scenes, toy_config, with_validation

pytestmark = pytest.mark.usefixtures('one_thread')


def seg_test_config(tmp_path):
    root = make_toy_scenes(str(tmp_path / 'toy'))
    cfg = with_validation(toy_config(root, str(tmp_path / 'wd')), root)
    cfg.test_dataloader, cfg.test_evaluator = cfg.val_dataloader, cfg.val_evaluator
    cfg.test_cfg = dict(type='TestLoop')
    return cfg


def test_seg_out_dir_exists_before_any_rank_writes(tmp_path):
    cfg = seg_test_config(tmp_path)
    out = str(tmp_path / 'preds' / 'maps')
    prepare_test_config(cfg, 'cfg.py', 'ckpt.pth', out=out)
    assert osp.isdir(out) and cfg.test_evaluator.output_dir == out


def test_seg_out_with_a_list_of_evaluators(tmp_path):
    cfg = seg_test_config(tmp_path)
    cfg.test_evaluator = [cfg.test_evaluator]
    out = str(tmp_path / 'maps')
    prepare_test_config(cfg, 'cfg.py', 'ckpt.pth', out=out)
    assert cfg.test_evaluator[0].output_dir == out and cfg.test_evaluator[0].keep_results
    # the Cityscapes test-server route (README): CityscapesMetric writes the maps
    cfg = seg_test_config(tmp_path)
    cfg.test_evaluator = dict(type='CityscapesMetric', format_only=True, output_dir='x')
    prepare_test_config(cfg, 'cfg.py', 'ckpt.pth', out=out)
    assert cfg.test_evaluator.output_dir == out
    cfg = seg_test_config(tmp_path)
    cfg.test_evaluator = [dict(type='DepthMetric')]
    with pytest.raises(EvaluationFlagError, match="IoUMetric / CityscapesMetric"):
        prepare_test_config(cfg, 'cfg.py', 'ckpt.pth', out=out)


def test_show_dir_with_several_processes_is_warned(tmp_path):
    for launcher, warned in (('none', False), ('pytorch', True)):
        cfg = seg_test_config(tmp_path)
        with captured_log(logging.WARNING) as messages:
            prepare_test_config(cfg, 'cfg.py', 'ckpt.pth', show_dir=str(tmp_path / 'vis'),
                                launcher=launcher)
        assert any('only rank 0' in m for m in messages) == warned, messages
