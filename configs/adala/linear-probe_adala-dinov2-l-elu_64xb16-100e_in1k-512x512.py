# ViT-AdaLA Stage 3, linear probe: the Stage-2 backbone stays frozen (blocks frozen, zero
# learning rate and weight decay for every backbone parameter); only the linear head trains,
# with SGD (lr 0.1, momentum 0.9, no weight decay) and a cosine schedule over 100 epochs, set
# below (replacing the fine-tuning schedule of the parent,
# linear-head_adala-dinov2-l-elu_64xb16-30e_in1k-512x512.py).
_base_ = './linear-head_adala-dinov2-l-elu_64xb16-30e_in1k-512x512.py'
model = dict(
    backbone=dict(frozen_stages=24, drop_path_rate=0.0),
    head=dict(loss=dict(_delete_=True, type='CrossEntropyLoss', loss_weight=1.0)))
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=0.0),
    paramwise_cfg=dict(custom_keys={'backbone': dict(lr_mult=0.0, decay_mult=0.0)}))
max_epochs = 100
param_scheduler = [
    dict(type='CosineAnnealingLR', eta_min=0.0, by_epoch=True, begin=0, end=max_epochs,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=5)
