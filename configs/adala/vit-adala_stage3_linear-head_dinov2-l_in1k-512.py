# ViT-AdaLA Stage 3 (classification): an mmpretrain ImageClassifier with a linear head on the
# Stage-2 backbone, fine-tuned on ImageNet-1k at 512 x 512.  The backbone loads the student
# weights Stage 2 exported (ExportStudentHook); a Stage-2 runner checkpoint works too (its
# 'student.' prefix is stripped by mmlinvit.converters) once re-saved without training state.
_base_ = [
    '../_base_/datasets/imagenet_bs64.py',
    '../_base_/schedules/finetune_adamw_30e.py',
    '../_base_/default_runtime_cls.py',
]
stage2_checkpoint = ('work_dirs/vit-adala_stage2_feat-align_dinov2-l_in22k-512/'
                     'student_backbone.pth')
model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='mmlinvit.LinearVisionTransformer',
        arch='l',
        family='dinov2',
        img_size=512,
        attn_cfg='elu',
        drop_path_rate=0.2,
        out_type='cls_token',
        pretrained=stage2_checkpoint),
    neck=None,
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=1024,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        topk=(1, 5),
        init_cfg=dict(type='TruncNormal', layer='Linear', std=0.02)))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=512, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=585, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=512),
    dict(type='PackInputs'),
]
train_dataloader = dict(batch_size=16, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(batch_size=16, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
missing_path_hints = {
    'model.backbone.pretrained': 'Run ViT-AdaLA Stage 2 first: python tools/train.py '
                                 'configs/adala/vit-adala_stage2_feat-align_dinov2-l_in22k-512.py',
}
