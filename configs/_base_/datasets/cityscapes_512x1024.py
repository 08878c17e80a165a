# Cityscapes in mmseg's layout, 512 x 1024 crops:
#   data/cityscapes/leftImg8bit/{train,val}/<city>/*_leftImg8bit.png
#   data/cityscapes/gtFine/{train,val}/<city>/*_gtFine_labelTrainIds.png
# The *_labelTrainIds.png maps come from mmseg's converter:
#   python tools/dataset_converters/cityscapes.py data/cityscapes --nproc 8
dataset_type = 'CityscapesDataset'
data_root = 'data/cityscapes'
crop_size = (512, 1024)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomResize', scale=(2048, 1024), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(2048, 1024), keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
# Multi-scale + flip evaluation (tools/test.py --tta): the test scale (2048, 1024) times each
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
            [dict(type='Resize', scale=(int(2048 * r), int(1024 * r)), keep_ratio=True)
             for r in img_ratios],
            [dict(type='RandomFlip', prob=0., direction='horizontal'),
             dict(type='RandomFlip', prob=1., direction='horizontal')],
            [dict(type='LoadAnnotations')],
            [dict(type='PackSegInputs')],
        ])
]
train_dataloader = dict(
    batch_size=2,
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        img_suffix='_leftImg8bit.png',
        seg_map_suffix='_gtFine_labelTrainIds.png',
        data_prefix=dict(img_path='leftImg8bit/train', seg_map_path='gtFine/train'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        img_suffix='_leftImg8bit.png',
        seg_map_suffix='_gtFine_labelTrainIds.png',
        data_prefix=dict(img_path='leftImg8bit/val', seg_map_path='gtFine/val'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator
