# High-resolution variant: 1024 x 1024 Cityscapes crops (the paper's Cityscapes 1024^2
# setting: student 78.73 vs teacher 80.98 mIoU, 15.95 vs 7.07 img/s, 1.38 vs 3.28 GB at
# batch 1).  Linearized DINOv2-L student (ELU+1) from the Stage-2 checkpoint, Mask2Former.
# Training inputs are padded to 1036 x 1036 (a multiple of 14); sliding-window inference
# with 1022 x 1022 windows (73 x 73 patches) over the 1024 x 2048 test images.
_base_ = [
    '../_base_/models/mask2former_vit.py', '../_base_/datasets/cityscapes_1024x1024.py',
    '../_base_/default_runtime_seg.py', '../_base_/schedules/schedule_80k.py'
]
stage2_checkpoint = 'work_dirs/vit-adala_stage2_feat-align_dinov2-l_in22k-512/student_backbone.pth'
missing_path_hints = {
    'model.backbone.pretrained':
    'This is the ViT-AdaLA Stage-2 student backbone. Produce it with Stage 1, Stage 2 and an '
    'export of the student weights: python tools/train.py '
    'configs/adala/vit-adala_stage1_attn-align_dinov2-l_coco-512.py && python tools/train.py '
    'configs/adala/vit-adala_stage2_feat-align_dinov2-l_in22k-512.py && python '
    'tools/model_converters/convert_checkpoint.py '
    'work_dirs/vit-adala_stage2_feat-align_dinov2-l_in22k-512/epoch_10.pth '
    'work_dirs/vit-adala_stage2_feat-align_dinov2-l_in22k-512/student_backbone.pth '
    '--trust-checkpoint ; or pass an existing one with --cfg-options '
    'model.backbone.pretrained=PATH.',
}
num_classes = 19
embed_dims = 1024
model = dict(
    data_preprocessor=dict(size=None, size_divisor=14, test_cfg=None),
    backbone=dict(
        type='mmlinvit.LinearVisionTransformer',
        arch='l',
        family='dinov2',
        img_size=518,
        attn_cfg='elu',
        out_indices=[7, 11, 15, 23],
        drop_path_rate=0.3,
        pretrained=stage2_checkpoint),
    neck=dict(embed_dim=embed_dims),
    decode_head=dict(
        in_channels=[embed_dims] * 4,
        num_classes=num_classes,
        loss_cls=dict(class_weight=[1.0] * num_classes + [0.1])),
    test_cfg=dict(mode='slide', crop_size=(1022, 1022), stride=(682, 682)))
optim_wrapper = dict(
    optimizer=dict(lr=2e-5, weight_decay=0.05),
    paramwise_cfg=dict(layer_decay_rate=0.9),
    clip_grad=dict(max_norm=0.01, norm_type=2))
