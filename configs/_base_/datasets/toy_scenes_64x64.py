# The embedded demo's data: procedurally drawn outdoor scenes (tools/demo.py writes them with
# mmlinvit.datasets.make_ade20k_layout) in ADE20K's layout and label convention:
#   <data_root>/images/{training,validation}/*.jpg
#   <data_root>/annotations/{training,validation}/*.png   0 = unlabelled, 1..6 = classes
dataset_type = 'BaseSegDataset'
data_root = 'work_dirs/demo/data/toy_ade/ADEChallengeData2016'  # written by tools/demo.py
crop_size = (64, 64)
metainfo = dict(
    classes=('sky', 'ground', 'building', 'tree', 'mountain', 'lake'),
    palette=[[70, 130, 180], [152, 251, 152], [70, 70, 70], [107, 142, 35], [120, 90, 60],
             [0, 60, 100]])
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),  # reduce_zero_label comes from the dataset
    dict(type='RandomResize', scale=(64, 64), ratio_range=(0.8, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.9),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),  # reduce_zero_label comes from the dataset
    dict(type='PackSegInputs'),
]
# Multi-scale + flip evaluation (tools/test.py --tta), as the ADE20K / Cityscapes bases: the
# 64 x 64 scenes at each ratio, with and without a horizontal flip.
img_ratios = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(
        type='TestTimeAug',
        transforms=[
            [dict(type='Resize', scale=(int(64 * r), int(64 * r)), keep_ratio=True)
             for r in img_ratios],
            [dict(type='RandomFlip', prob=0., direction='horizontal'),
             dict(type='RandomFlip', prob=1., direction='horizontal')],
            [dict(type='LoadAnnotations')],
            [dict(type='PackSegInputs')],
        ])
]
train_dataloader = dict(
    batch_size=8,
    num_workers=0,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        metainfo=metainfo,
        img_suffix='.jpg',
        seg_map_suffix='.png',
        reduce_zero_label=True,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        metainfo=metainfo,
        img_suffix='.jpg',
        seg_map_suffix='.png',
        reduce_zero_label=True,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator
