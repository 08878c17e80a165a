# ADE20K (SceneParse150) in mmseg's layout, 512 x 512 crops, for patch-16 backbones.
#   data/ade/ADEChallengeData2016/images/{training,validation}/*.jpg
#   data/ade/ADEChallengeData2016/annotations/{training,validation}/*.png
# Label 0 ("other") is ignored: reduce_zero_label maps 0 -> 255 and 1..150 -> 0..149.
dataset_type = 'ADE20KDataset'
data_root = 'data/ade/ADEChallengeData2016'
crop_size = (512, 512)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),  # reduce_zero_label comes from the dataset
    dict(type='RandomResize', scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(2048, 512), keep_ratio=True),
    # Annotations are loaded after resizing: metrics are computed at the original size.
    dict(type='LoadAnnotations'),  # reduce_zero_label comes from the dataset
    dict(type='PackSegInputs'),
]
# Multi-scale + flip evaluation (tools/test.py --tta): the test scale (2048, 512) times each
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
            [dict(type='Resize', scale=(int(2048 * r), int(512 * r)), keep_ratio=True)
             for r in img_ratios],
            [dict(type='RandomFlip', prob=0., direction='horizontal'),
             dict(type='RandomFlip', prob=1., direction='horizontal')],
            [dict(type='LoadAnnotations')],
            [dict(type='PackSegInputs')],
        ])
]
train_dataloader = dict(
    batch_size=4,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        reduce_zero_label=True,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        reduce_zero_label=True,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator
