# Cityscapes with 1024 x 1024 crops (the high-resolution setting of ViT-AdaLA: at 1024^2 the
# linear student is ~2.3x faster and uses ~2.4x less memory than its softmax teacher).
# Same layout and label conversion as cityscapes_512x1024.py.
_base_ = './cityscapes_512x1024.py'
crop_size = (1024, 1024)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomResize', scale=(2048, 1024), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(batch_size=1, dataset=dict(pipeline=train_pipeline))
