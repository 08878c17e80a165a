# 80k iterations (Cityscapes / quicker ADE20K runs); otherwise as schedule_160k.py.
_base_ = './schedule_160k.py'
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=80000, by_epoch=False),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=80000, val_interval=8000)
default_hooks = dict(checkpoint=dict(interval=8000))
# The configured lr belongs to a total batch of 16 (8 GPUs x 2); off by default, as in the
# other schedules: --cfg-options auto_scale_lr.enable=True rescales it to the real batch.
auto_scale_lr = dict(enable=False, base_batch_size=16)
