# ViT-AdaLA Stage 3 on Cityscapes (19 classes), 512 x 1024 crops: the linearized DINOv2-L
# student (ELU+1) from the Stage-2 checkpoint with Mask2Former, 80k iterations.
# Patch-14 models: training crops are padded to a multiple of 14 (518 x 1036, padding
# labelled 255 = ignored) as DINOv2's CenterPadding pads (split between both sides,
# model.patch_padding='center'); sliding-window inference uses 518 x 1036 windows (multiples
# of 14) over the 1024 x 2048 test images, so no test-time padding is needed.
# Data: leftImg8bit + gtFine, labels converted with mmseg's
#   python tools/dataset_converters/cityscapes.py data/cityscapes --nproc 8
_base_ = [
    '../_base_/models/mask2former_vit.py', '../_base_/datasets/cityscapes_512x1024.py',
    '../_base_/default_runtime_seg.py', '../_base_/schedules/schedule_80k.py',
    '../_base_/models/adala-dinov2-l-elu.py'
]
missing_path_hints = _base_.adala_missing_path_hints
num_classes = 19
embed_dims = 1024
model = dict(
    data_preprocessor=dict(size=None, size_divisor=1, test_cfg=None),
    patch_padding='center',  # DINOv2's CenterPadding (mmlinvit.EncoderDecoder)
    backbone=_base_.adala_seg_backbone,
    neck=dict(embed_dim=embed_dims),
    decode_head=dict(
        in_channels=[embed_dims] * 4,
        num_classes=num_classes,
        loss_cls=dict(class_weight=[1.0] * num_classes + [0.1])),
    test_cfg=dict(mode='slide', crop_size=(518, 1036), stride=(345, 690)))
optim_wrapper = dict(
    optimizer=dict(lr=2e-5, weight_decay=0.05),
    # Mask2Former's query / level embeddings and output embeddings at the embeddings' lr,
    # as ViT-Adapter's layer-decay constructor places them.
    paramwise_cfg=dict(
        layer_decay_rate=0.9,
        first_depth_names=[
            'decode_head.query_embed', 'decode_head.query_feat', 'decode_head.level_embed',
            'decode_head.cls_embed', 'decode_head.mask_embed'
        ]),
    clip_grad=dict(max_norm=0.01, norm_type=2))
# ViT-Adapter's schedule (mmcv poly with a linear warm-up): the poly decay counts from
# iteration 0 and the warm-up multiplies it (mmseg's UPerNet schedule starts the poly after the
# warm-up, ~1-2 % higher lr throughout).
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=0, end=80000, by_epoch=False),
]
