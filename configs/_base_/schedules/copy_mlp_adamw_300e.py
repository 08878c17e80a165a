# The recipe of "Copy the Same, Distill the Difference" (seed 000): AdamW lr 2e-3 at a total
# batch of 4096 (ImageNet; 512 for the transfer sets), weight decay 0.05, 50 warm-up epochs,
# cosine to 1e-6, 300 epochs, gradient clipping at 3.0 (label smoothing 0.1 is in the head).
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-3, weight_decay=0.05, betas=(0.9, 0.999), eps=1e-8),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        flat_decay_mult=0.0,
        custom_keys={
            '.cls_token': dict(decay_mult=0.0),
            '.pos_embed': dict(decay_mult=0.0),
        }),
    clip_grad=dict(max_norm=3.0),
)
warmup_epochs = 50
max_epochs = 300
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=warmup_epochs,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=warmup_epochs,
         end=max_epochs, convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=10)
val_cfg = dict()
test_cfg = dict()
# lr 2e-3 is for 4096 images per step; `--cfg-options auto_scale_lr.enable=True` rescales it to
# the real batch (off by default: the rate is NOT rescaled on fewer GPUs).
auto_scale_lr = dict(base_batch_size=4096)
