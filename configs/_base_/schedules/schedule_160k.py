# 160k iterations: AdamW with layer-wise lr decay (driven by the backbone's get_layer_depth),
# linear warm-up for 1.5k iterations, then poly decay.  Checkpoints / validation every 16k.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    constructor='mmlinvit.LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.65))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000, by_epoch=False),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=160000, val_interval=16000)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    # Prints loss, lr, time per iteration and the ETA of the whole run every 50 iterations.
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=16000, max_keep_ckpts=3,
                    save_best='mIoU'),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
# The configured lr belongs to a total batch of 16 (8 GPUs x 2); off by default, as in the
# other schedules: --cfg-options auto_scale_lr.enable=True rescales it to the real batch.
auto_scale_lr = dict(enable=False, base_batch_size=16)
