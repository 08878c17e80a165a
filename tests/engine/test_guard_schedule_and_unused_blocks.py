"""Schedule warnings at their boundaries and the unused-blocks warning one block short."""
from mmengine.config import Config
from mmlinvit.engine.config_consistency import _schedule_warnings, _unused_blocks_warning


def _cfg(**sched):
    return Config(dict(train_cfg=dict(type='IterBasedTrainLoop', max_iters=100),
                       param_scheduler=[dict(type='PolyLR', by_epoch=False, **sched)]))


def test_scheduler_ending_one_iteration_after_the_run_is_warned():
    warnings = _schedule_warnings(_cfg(begin=0, end=101))
    assert any('ends at 101 but train_cfg.max_iters=100' in w for w in warnings), warnings
    assert _schedule_warnings(_cfg(begin=0, end=100)) == []


def test_scheduler_beginning_at_the_last_iteration_is_warned():
    warnings = _schedule_warnings(_cfg(begin=100))
    assert any('begins at 100, at or after train_cfg.max_iters=100' in w
               for w in warnings), warnings


def test_epoch_loop_iterations_follow_drop_last():
    # 10 samples, batch 4: 2 iterations per epoch with drop_last, 3 without
    cfg = Config(dict(train_cfg=dict(type='EpochBasedTrainLoop', max_epochs=1),
                      train_dataloader=dict(batch_size=4, drop_last=True),
                      param_scheduler=[dict(type='LinearLR', by_epoch=False, begin=0, end=3)]))
    warnings = _schedule_warnings(cfg, train_samples=10)
    assert any('ends at 3' in w and '2 iterations' in w for w in warnings), warnings
    cfg.train_dataloader.drop_last = False
    assert _schedule_warnings(cfg, train_samples=10) == []


def test_out_indices_ending_one_block_early_are_warned():
    cfg = Config(dict(model=dict(backbone=dict(type='VisionTransformer', arch='b',
                                               out_indices=[3, 5, 7, 10]))))
    warning = _unused_blocks_warning(cfg)
    assert warning is not None and 'ends at block 10 of a 12-block' in warning, warning
    cfg.model.backbone.out_indices = [3, 5, 7, 11]
    assert _unused_blocks_warning(cfg) is None
