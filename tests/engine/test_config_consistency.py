"""Inherited configs whose parts disagree are refused (or warned about) before the runner is
built (mmlinvit.engine.config_consistency)."""
import logging

import pytest
from mmengine.config import Config

from mmlinvit.engine.config_consistency import (ConfigConsistencyError,
                                                check_config_consistency)
from mmlinvit.engine.launch import build_runner

from train_testing import captured_log, make_toy_scenes, toy_config

pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory) -> str:
    return make_toy_scenes(str(tmp_path_factory.mktemp('toy') / 'toy_ade'))


@pytest.fixture
def warnings_logged():
    with captured_log(logging.WARNING) as messages:
        yield messages


def classes(cfg: Config) -> int:
    return len(cfg.train_dataloader.dataset.metainfo['classes'])


def test_the_toy_recipe_passes(tmp_path, toy_root, warnings_logged):
    check_config_consistency(toy_config(toy_root, str(tmp_path)))
    assert not [m for m in warnings_logged if m.startswith('Config check')]


def test_head_classes_must_be_the_data_sets(tmp_path, toy_root):
    cfg = toy_config(toy_root, str(tmp_path))
    n = classes(cfg)
    cfg.model.decode_head.num_classes = 150  # the ADE20K base's head kept
    with pytest.raises(ConfigConsistencyError) as info:
        build_runner(cfg)
    message = str(info.value)
    assert 'model.decode_head.num_classes=150' in message and f'has {n} classes' in message
    assert f'model.decode_head.num_classes={n}' in message  # the fix
    cfg.check_config_consistency = False  # the opt-out
    build_runner(cfg)


def test_mask2former_class_weight_and_save_best(tmp_path, toy_root):
    cfg = toy_config(toy_root, str(tmp_path))
    n = classes(cfg)
    cfg.model.decode_head = dict(type='Mask2FormerHead', num_classes=n,
                                 loss_cls=dict(class_weight=[1.0] * 150 + [0.1]))
    cfg.default_hooks.checkpoint.save_best = 'mIoU'
    cfg.val_evaluator = dict(type='IoUMetric', iou_metrics=['mDice'])
    with pytest.raises(ConfigConsistencyError) as info:
        check_config_consistency(cfg)
    message = str(info.value)
    assert f'class_weight has 151 entries but num_classes={n} needs {n + 1}' in message
    assert "save_best='mIoU' names ['mIoU']" in message and 'mDice' in message
    cfg.model.decode_head.loss_cls.class_weight = [1.0] * n + [0.1]
    cfg.default_hooks.checkpoint.save_best = 'mDice'
    check_config_consistency(cfg)


def test_inherited_settings_that_look_changed_are_warned(tmp_path, toy_root, warnings_logged):
    cfg = toy_config(toy_root, str(tmp_path))
    dataset = cfg.train_dataloader.dataset
    # a custom data set under the ADE20K base, whose labels never reach its class count
    # (the toy labels run 1..N; with N + 3 classes they read as 0-based)
    n = classes(cfg) + 3
    dataset.type = 'BaseSegDataset'
    dataset.metainfo = dict(classes=tuple(f'class{i}' for i in range(n)))
    dataset.reduce_zero_label = True
    cfg.model.decode_head.num_classes = n
    cfg.model.data_preprocessor.bgr_to_rgb = False
    cfg.crop_size = (640, 640)
    cfg.param_scheduler = [dict(type='PolyLR', by_epoch=False, begin=0, end=160000)]
    cfg.model.backbone.out_indices = [0, 1]  # a 4-block backbone
    check_config_consistency(cfg)
    text = '\n'.join(warnings_logged)
    assert 'reduce_zero_label=True on a BaseSegDataset' in text
    assert 'bgr_to_rgb=False while' in text
    assert 'top-level crop_size=(640, 640) is not the training crop' in text
    assert 'ends at 160000 but train_cfg.max_iters=12' in text
    assert 'blocks 2-3 run at every step' in text


def test_mmpretrain_classes_argument_counts(tmp_path):
    """An ImageNet subset the mmpretrain way (dataset classes=[...]) with a head of that many
    classes is right (it was refused against ImageNet's 1000)."""
    cfg = Config(dict(
        model=dict(type='ImageClassifier', head=dict(type='LinearClsHead', num_classes=3)),
        train_dataloader=dict(dataset=dict(type='ImageNet', data_root=str(tmp_path),
                                           classes=['a', 'b', 'c']))))
    check_config_consistency(cfg)
    cfg.model.head.num_classes = 1000
    with pytest.raises(ConfigConsistencyError, match="has 3 classes \\(classes\\)"):
        check_config_consistency(cfg)



@pytest.mark.parametrize('where', ['train_cfg', 'batch_augments'])
def test_mixup_width_must_be_the_heads(tmp_path, where):
    """A 10-class fine-tune of a 1000-class config with Mixup / CutMix: mmpretrain stopped at
    step 1 on "[16, 10] vs [16, 1000]" without naming data_preprocessor.num_classes."""
    augments = [dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]
    cfg = Config(dict(
        model=dict(type='ImageClassifier', head=dict(type='LinearClsHead', num_classes=10)),
        data_preprocessor=dict(type='ClsDataPreProcessor', num_classes=1000),
        train_dataloader=dict(dataset=dict(type='CustomDataset', data_root=str(tmp_path)))))
    if where == 'train_cfg':
        cfg.model.train_cfg = dict(augments=augments)
    else:
        cfg.data_preprocessor.batch_augments = dict(augments=augments)
    with pytest.raises(ConfigConsistencyError,
                       match=r'data_preprocessor.num_classes=1000 .*Fix: '
                             r'data_preprocessor.num_classes=10'):
        check_config_consistency(cfg)
    cfg.data_preprocessor.num_classes = 10
    check_config_consistency(cfg)


def test_save_best_keys_follow_the_metrics():
    """mmseg's IoUMetric adds mAcc with mIoU / mDice only; mFscore adds mPrecision / mRecall."""
    from mmlinvit.engine.config_consistency import _save_best_problem
    cfg = Config(dict(default_hooks=dict(checkpoint=dict(save_best='mAcc')),
                      val_evaluator=dict(type='IoUMetric', iou_metrics=['mFscore'])))
    assert "names ['mAcc']" in _save_best_problem(cfg)
    cfg.default_hooks.checkpoint.save_best = 'mRecall'
    assert _save_best_problem(cfg) is None
    cfg.val_evaluator.iou_metrics = ['mDice']
    cfg.default_hooks.checkpoint.save_best = 'mAcc'
    assert _save_best_problem(cfg) is None


def test_a_top_level_crop_size_differing_in_width_only_is_warned():
    """The child-config trap: the base's RandomCrop keeps its own crop."""
    from mmlinvit.engine.config_consistency import _crop_size_warning

    def config(top, crop):
        return Config(dict(crop_size=top, train_dataloader=dict(dataset=dict(
            type='ADE20KDataset', data_root='data/ade',
            pipeline=[dict(type='RandomCrop', crop_size=crop)]))))

    text = _crop_size_warning(config((512, 1024), (512, 512)))
    assert text is not None and 'top-level crop_size=(512, 1024) is not the training crop' in text
    assert _crop_size_warning(config((512, 512), (512, 512))) is None
