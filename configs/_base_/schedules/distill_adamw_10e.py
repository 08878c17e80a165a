# Feature distillation (ViT-AdaLA Stage 2: 10 epochs on ImageNet-22K); as distill_adamw_4e.py.
_base_ = './distill_adamw_4e.py'
optim_wrapper = dict(optimizer=dict(lr=5e-5))
max_epochs = 10
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=1000),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=0, end=max_epochs,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs)
