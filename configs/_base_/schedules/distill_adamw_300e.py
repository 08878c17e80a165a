# Long pre-distillation (ViT-Linearizer on ImageNet-1k images).  The optimiser settings are
# mmlinvit's defaults (AdamW 5e-4 at 1024 images per step, 0.05 weight decay, 20 warm-up
# epochs, cosine), not published numbers.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=5e-4, weight_decay=0.05, betas=(0.9, 0.999)),
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
max_epochs = 300
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=20,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=20, end=max_epochs,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs)
auto_scale_lr = dict(base_batch_size=1024)
