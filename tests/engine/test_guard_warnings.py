"""Config-check warnings are logged at WARNING; save_best lists are checked whole; the
channel-order warning reads bgr_to_rgb."""
import logging

from mmengine.config import Config
from mmengine.logging import MMLogger
from mmlinvit.engine.config_consistency import (_channel_order_warning, _save_best_problem,
                                                 check_config_consistency)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_config_check_warnings_are_logged_at_warning_level():
    logger = MMLogger.get_instance('guard_warnings_check', log_level='DEBUG')
    handler = _Records()
    logger.addHandler(handler)
    try:
        cfg = Config(dict(model=dict(backbone=dict(type='VisionTransformer', arch='b',
                                                   out_indices=[3, 5, 7, 10]))))
        check_config_consistency(cfg)
    finally:
        logger.removeHandler(handler)
    checks = [r for r in handler.records if 'Config check:' in r.getMessage()]
    assert checks, [r.getMessage() for r in handler.records]
    assert all(r.levelno == logging.WARNING for r in checks), [r.levelname for r in checks]


def test_every_save_best_key_is_checked():
    cfg = Config(dict(default_hooks=dict(checkpoint=dict(save_best=['mIoU', 'mDice'])),
                      val_evaluator=dict(type='IoUMetric', iou_metrics=['mIoU'])))
    problem = _save_best_problem(cfg)
    assert problem is not None and "names ['mDice']" in problem, problem


def test_bgr_to_rgb_false_is_warned():
    cfg = Config(dict(
        model=dict(data_preprocessor=dict(type='SegDataPreProcessor', bgr_to_rgb=False)),
        train_dataloader=dict(dataset=dict(type='ADE20KDataset', data_root='data/none', pipeline=[
            dict(type='LoadImageFromFile')]))))
    warning = _channel_order_warning(cfg)
    assert warning is not None and 'bgr_to_rgb=False' in warning, warning
