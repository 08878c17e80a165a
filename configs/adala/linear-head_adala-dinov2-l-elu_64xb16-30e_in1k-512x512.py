# ViT-AdaLA Stage 3 (classification): an mmpretrain ImageClassifier with a linear head on the
# Stage-2 backbone (configs/_base_/models/adala-dinov2-l-elu.py), fine-tuned on ImageNet-1k at
# 512 x 512, 64 GPUs x 16 images (the 1024 images per step of finetune_adamw_30e.py).  The
# backbone loads the student weights Stage 2 exported (ExportStudentHook); a Stage-2 runner
# checkpoint works too (its 'student.' prefix is stripped by mmlinvit.converters).
_base_ = [
    '../_base_/datasets/imagenet_bs64.py',
    '../_base_/schedules/finetune_adamw_30e.py',
    '../_base_/default_runtime_cls.py',
    '../_base_/models/adala-dinov2-l-elu.py',
]
missing_path_hints = _base_.adala_missing_path_hints
model = dict(
    type='ImageClassifier',
    backbone=dict(
        _base_.adala_backbone, img_size=512, drop_path_rate=0.2, out_type='cls_token'),
    neck=None,
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=1024,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        topk=(1, 5),
        init_cfg=dict(type='TruncNormal', layer='Linear', std=0.02)))
# EXIF orientation ignored, as the official evaluations decode (PIL / torchvision, timm).
train_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='RandomResizedCrop', scale=512, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='ResizeEdge', scale=585, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=512),
    dict(type='PackInputs'),
]
train_dataloader = dict(batch_size=16, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(batch_size=16, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
