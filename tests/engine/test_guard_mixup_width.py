"""Mixup one-hot width larger than the head's classes is an error too."""
from mmengine.config import Config
from mmlinvit.engine.config_consistency import _batch_augment_problem


def test_preprocessor_width_smaller_than_the_head_is_reported():
    cfg = Config(dict(
        model=dict(type='ImageClassifier', head=dict(type='LinearClsHead', num_classes=1000),
                   train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8)])),
        data_preprocessor=dict(type='ClsDataPreProcessor', num_classes=10)))
    problem = _batch_augment_problem(cfg)
    assert problem is not None and 'data_preprocessor.num_classes=10' in problem, problem
