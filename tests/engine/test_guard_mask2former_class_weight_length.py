"""Mask2Former class_weight with fewer than num_classes + 1 entries is an error."""
from mmengine.config import Config
from mmlinvit.engine.config_consistency import _class_count_problems


def test_short_class_weight_is_reported():
    cfg = Config(dict(model=dict(type='EncoderDecoder', decode_head=dict(
        type='Mask2FormerHead', num_classes=150,
        loss_cls=dict(type='mmdet.CrossEntropyLoss', class_weight=[1.0] * 150)))))
    problems = _class_count_problems(cfg)
    assert any('class_weight has 150 entries but num_classes=150 needs 151' in p
               for p in problems), problems
