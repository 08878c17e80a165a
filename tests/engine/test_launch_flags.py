"""The command-line flags reach the run: --resume without a path resumes the work dir even
when the config names a load_from; --work-dir and the test checkpoint win over the config's
work_dir / load_from; a config's own model_wrapper_cfg is kept on CPU machines; --show-dir and
--interval switch drawing on (segmentation and classification); tools/train.py and
tools/test.py hand every flag to the config preparation (parsing them alone is not enough).
Each of these, broken, gave a run that exits 0 with lost iterations, another checkpoint's
scores or a flag silently ignored."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from mmlinvit.engine.launch import prepare_test_config, prepare_train_config
from mmlinvit.utils.cli import load_script

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SEG = osp.join(REPO, 'configs', 'adala_dinov2_ade20k.py')


class _Stop(Exception):
    """Raised by the stand-in preparation once it has seen the flags."""


REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def test_resume_auto_clears_a_configured_load_from():
    cfg = Config.fromfile(SEG)
    cfg.load_from = 'work_dirs/stage1/iter_4000.pth'
    cfg = prepare_train_config(cfg, SEG, resume='auto')
    assert cfg.resume is True
    assert cfg.load_from is None  # build_runner then picks the work dir's newest checkpoint


REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def test_work_dir_flag_overrides_the_configs_work_dir(tmp_path):
    cfg = Config.fromfile(SEG)
    cfg.work_dir = 'work_dirs/from_config'
    cfg = prepare_train_config(cfg, SEG, work_dir=str(tmp_path / 'cli'))
    assert cfg.work_dir == str(tmp_path / 'cli')
    cfg = Config.fromfile(SEG)
    cfg.work_dir = 'work_dirs/from_config'
    cfg = prepare_test_config(cfg, SEG, 'ckpt.pth', work_dir=str(tmp_path / 'cli2'))
    assert cfg.work_dir == str(tmp_path / 'cli2')


REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def test_the_command_line_checkpoint_wins_over_load_from():
    cfg = Config.fromfile(SEG)
    cfg.load_from = 'pretrained/start.pth'
    cfg = prepare_test_config(cfg, SEG, 'work_dirs/x/iter_160000.pth')
    assert cfg.load_from == 'work_dirs/x/iter_160000.pth' and cfg.resume is False


REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU adaptation only')
def test_config_model_wrapper_is_kept_on_cpu(tmp_path):
    cfg = Config.fromfile(SEG)
    own = dict(type='MMDistributedDataParallel', device_ids=None, broadcast_buffers=False,
               find_unused_parameters=True, static_graph=False)
    cfg.model_wrapper_cfg = own
    cfg = prepare_train_config(cfg, SEG, work_dir=str(tmp_path), launcher='pytorch')
    assert cfg.model_wrapper_cfg.to_dict() == own
    bare = prepare_train_config(Config.fromfile(SEG), SEG, work_dir=str(tmp_path),
                                launcher='pytorch')
    assert bare.model_wrapper_cfg.device_ids is None


REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def test_seg_show_dir_draws_into_the_directory(tmp_path):
    cfg = prepare_test_config(Config.fromfile(SEG), SEG, 'ckpt.pth', show_dir=str(tmp_path),
                              interval=3)
    hook = cfg.default_hooks.visualization
    assert hook.draw is True and hook.interval == 3
    assert cfg.visualizer.save_dir == str(tmp_path)


def test_cls_show_dir_enables_the_hook_into_the_directory(tmp_path):
    cfg = Config(dict(default_scope='mmpretrain', model=dict(type='ImageClassifier'),
                      test_dataloader=dict(), test_evaluator=dict(type='Accuracy'),
                      default_hooks=dict(visualization=dict(type='VisualizationHook',
                                                            enable=False))))
    cfg = prepare_test_config(cfg, 'x.py', 'c.pth', show_dir=str(tmp_path), interval=2)
    hook = cfg.default_hooks.visualization
    assert hook.enable is True and hook.out_dir == str(tmp_path) and hook.interval == 2




def test_test_tool_passes_interval_and_show_dir(tmp_path, monkeypatch):
    tool = load_script(osp.join(REPO, 'tools', 'test.py'), 'mmlinvit_test_tool_flags')
    seen = {}

    def fake(cfg, path, ckpt, **kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(tool, 'prepare_test_config', fake)
    with pytest.raises(_Stop):
        tool.main([SEG, 'ckpt.pth', '--show-dir', str(tmp_path), '--interval', '5', '--tta',
                   '--out', str(tmp_path / 'o')])
    assert seen['interval'] == 5 and seen['show_dir'] == str(tmp_path)
    assert seen['tta'] is True and seen['out'] == str(tmp_path / 'o')


REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))




def test_train_tool_passes_every_flag(tmp_path, monkeypatch):
    tool = load_script(osp.join(REPO, 'tools', 'train.py'), 'mmlinvit_train_tool_flags')
    seen = {}

    def fake(cfg, path, **kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(tool, 'prepare_train_config', fake)
    with pytest.raises(_Stop):
        tool.main([SEG, '--work-dir', str(tmp_path), '--no-validate', '--auto-scale-lr',
                   '--amp', '--resume', 'ckpt.pth', '--no-pin-memory'])
    assert seen == dict(work_dir=str(tmp_path), resume='ckpt.pth', amp=True, launcher='none',
                        auto_scale_lr=True, no_validate=True, pin_memory=False,
                        persistent_workers=True)
