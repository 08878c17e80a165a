# CIFAR-10 through mmpretrain's CIFAR10 dataset (the python batches under data/cifar10/
# cifar-10-batches-py), upsampled to 224 x 224 for ImageNet-pretrained ViTs, 64 images per GPU.
# CIFAR-100 / other transfer sets: change dataset_type ('CIFAR100') and num_classes.
dataset_type = 'CIFAR10'
data_root = 'data/cifar10'
num_classes = 10
data_preprocessor = dict(
    type='ClsDataPreprocessor',
    num_classes=num_classes,
    # CIFAR-10 RGB statistics; the dataset yields RGB arrays already
    mean=[125.307, 122.961, 113.8575],
    std=[51.5865, 50.847, 51.255],
    to_rgb=False,
)
train_pipeline = [
    dict(type='RandomResizedCrop', scale=224, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='Resize', scale=224, backend='pillow', interpolation='bicubic'),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=64,
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, split='train', pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=64,
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, split='test', pipeline=test_pipeline))
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator
