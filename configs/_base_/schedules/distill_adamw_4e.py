# Feature distillation (ViT-AdaLA Stage 1: 4 epochs on COCO images).  The papers do not
# publish these optimiser settings; AdamW 1e-4, 0.05 weight decay, 500 warm-up iterations and
# a cosine decay are mmlinvit's defaults.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05, betas=(0.9, 0.999)),
    # No weight decay on norms, biases, tokens and position embeddings (as mmpretrain's ViT
    # recipes, DeiT and the public Adventurer code; DINOv2's pre-training decays the tokens).
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        flat_decay_mult=0.0,
        custom_keys={
            key: dict(decay_mult=0.0)
            for key in ('cls_token', 'reg_token', 'pos_embed', 'mask_token')
        }),
    clip_grad=dict(max_norm=3.0),
)
max_epochs = 4
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=500),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=0, end=max_epochs,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs)
auto_scale_lr = dict(base_batch_size=64)
