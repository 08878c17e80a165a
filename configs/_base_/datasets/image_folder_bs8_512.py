# Unlabelled images for feature distillation (ViT-AdaLA Stages 1-2): mmpretrain's
# CustomDataset over an image folder (searched recursively), 512 x 512 crops, 8 per GPU.
# Stage 1 uses COCO train2017 images; Stage 2 points data_root at ImageNet-22K.
dataset_type = 'CustomDataset'
data_root = 'data/coco'
data_prefix = 'train2017'
data_preprocessor = dict(
    type='ClsDataPreprocessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    to_rgb=True,
)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=512, crop_ratio_range=(0.35, 1.0), backend='pillow',
         interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=8,
    num_workers=5,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=data_prefix,
        with_label=False,
        pipeline=train_pipeline))
