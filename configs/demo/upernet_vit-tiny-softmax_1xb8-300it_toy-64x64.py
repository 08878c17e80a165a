# The demo's softmax teacher: a tiny ViT (4 blocks, width 64, 8 px patches) with
# Feature2Pyramid + UPerNet, trained from scratch on the toy scenes (tools/demo.py, step 2).
_base_ = [
    '../_base_/models/upernet_vit.py', '../_base_/datasets/toy_scenes_64x64.py',
    '../_base_/default_runtime_seg.py'
]
crop_size = (64, 64)
embed_dims = 64
norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        type='mmlinvit.VisionTransformer',
        # _delete_: a dict replaces the base's size name 'b'
        arch=dict(_delete_=True, embed_dims=embed_dims, num_layers=4, num_heads=4,
                  mlp_hidden_dims=128),
        family='deit',
        img_size=64,
        patch_size=8,
        attn_cfg='softmax',
        out_indices=[0, 1, 2, 3],
        drop_path_rate=0.0),
    neck=dict(embed_dim=embed_dims, norm_cfg=norm_cfg),
    decode_head=dict(
        in_channels=[embed_dims] * 4,
        pool_scales=(1, 2),
        channels=64,
        dropout_ratio=0.0,
        num_classes=6,
        norm_cfg=norm_cfg),
    auxiliary_head=None,
    test_cfg=dict(mode='whole', crop_size=(48, 48), stride=(32, 32)))
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-3, betas=(0.9, 0.999), weight_decay=0.01),
    # no weight decay on norms, biases, tokens and the position embedding
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        flat_decay_mult=0.0,
        custom_keys={key: dict(decay_mult=0.0)
                     for key in ('cls_token', 'reg_token', 'pos_embed', 'mask_token')}),
    clip_grad=dict(max_norm=1.0))
max_iters = 300
param_scheduler = [
    dict(type='LinearLR', start_factor=0.05, by_epoch=False, begin=0, end=30),
    dict(type='PolyLR', eta_min=1e-5, power=1.0, begin=30, end=max_iters, by_epoch=False),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=25, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
randomness = dict(seed=0)
env_cfg = dict(cudnn_benchmark=False)
auto_scale_lr = dict(enable=False, base_batch_size=8)  # 1 GPU x 8 images
