# ADE20K at 518 x 518 crops for patch-14 backbones (DINOv2): 518 = 37 x 14, the native grid
# of DINOv2 checkpoints, so no pixel is dropped by the patch embedding.  Same layout and
# label convention as ade20k_512x512.py; test images are resized to a short side of 518.
_base_ = './ade20k_512x512.py'
crop_size = (518, 518)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),  # reduce_zero_label comes from the dataset
    dict(type='RandomResize', scale=(2072, 518), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(2072, 518), keep_ratio=True),
    dict(type='LoadAnnotations'),  # reduce_zero_label comes from the dataset
    dict(type='PackSegInputs'),
]
# Multi-scale + flip evaluation (tools/test.py --tta): the test scale (2072, 518) times each
# ratio, keep_ratio, each scale with and without a horizontal flip; SegTTAModel averages the
# softmax of the 12 predictions. The ratios scale the test scale, as mmseg 0.x's
# MultiScaleFlipAug(img_scale, img_ratios) did for the ViT-Adapter / BEiT multi-scale numbers
# (ratio 1.0 is the single-scale test); mmseg 1.x's configs scale the original image instead
# (Resize(scale_factor=r)), which differs when its short side is not the test one.
img_ratios = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(
        type='TestTimeAug',
        transforms=[
            [dict(type='Resize', scale=(int(2072 * r), int(518 * r)), keep_ratio=True)
             for r in img_ratios],
            [dict(type='RandomFlip', prob=0., direction='horizontal'),
             dict(type='RandomFlip', prob=1., direction='horizontal')],
            [dict(type='LoadAnnotations')],
            [dict(type='PackSegInputs')],
        ])
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
