# ViT-AdaLA, Stage 3 on ADE20K: the linearized DINOv2-L student (ELU+1 kernel linear attention
# in every block) fine-tuned with Mask2Former on ADE20K's 150 classes.
#
# How the three stages chain (see README, "ViT-AdaLA"); each stage reads the previous one's
# last checkpoint from its default work dir:
#   Stage 1  python tools/train.py configs/adala/vit-adala_stage1_attn-align_dinov2-l_coco-512.py
#            (attention alignment, teacher forcing; COCO images; from DINOv2-L)
#   Stage 2  python tools/train.py configs/adala/vit-adala_stage2_feat-align_dinov2-l_in22k-512.py
#            (feature alignment; ImageNet-22K images; load_from = Stage 1)
#            (writes student_backbone.pth, the student's weights only, via ExportStudentHook)
#   Stage 3  python tools/train.py configs/adala_dinov2_ade20k.py          (this file)
# Multi-GPU: bash tools/dist_train.sh CONFIG 8 for each stage.  Stage 3 starts from
# `stage2_checkpoint` below; a missing file stops tools/train.py before anything is built.
#
# Crops are 518 x 518 (37 x 37 patches of 14 px, DINOv2's native grid) instead of the
# paper's 512: with patch 14, a 512 crop would leave the last 8 pixel rows/columns out of
# the patch grid.  Test images are resized to a short side of 518 and padded to a multiple
# of 14; predictions are cropped back and resized to the original image.
#
# Variants by overriding a few keys: Cityscapes -> configs/segmentation/
# mask2former_adala-dinov2-l-elu_8xb2-80k_cityscapes-512x1024.py; UPerNet -> configs/
# segmentation/upernet_adala-dinov2-l-elu_8xb2-160k_ade20k-518x518.py; sliding-window
# inference -> --cfg-options model.test_cfg.mode=slide.
_base_ = [
    './_base_/models/mask2former_vit.py', './_base_/datasets/ade20k_518x518.py',
    './_base_/default_runtime_seg.py', './_base_/schedules/schedule_160k.py'
]
stage2_checkpoint = 'work_dirs/vit-adala_stage2_feat-align_dinov2-l_in22k-512/student_backbone.pth'
missing_path_hints = {
    'model.backbone.pretrained':
    'This is the ViT-AdaLA Stage-2 student backbone, written by Stage 2 (ExportStudentHook). '
    'Produce it with python tools/train.py '
    'configs/adala/vit-adala_stage1_attn-align_dinov2-l_coco-512.py && python tools/train.py '
    'configs/adala/vit-adala_stage2_feat-align_dinov2-l_in22k-512.py, or pass an existing one '
    'with --cfg-options model.backbone.pretrained=PATH (a Stage-2 runner checkpoint also loads '
    'once re-saved with tools/model_converters/export_student.py).',
}
crop_size = (518, 518)
num_classes = 150
embed_dims = 1024
data_preprocessor = dict(size=crop_size, test_cfg=dict(size_divisor=14))
model = dict(
    data_preprocessor=data_preprocessor,
    backbone=dict(
        type='mmlinvit.LinearVisionTransformer',
        arch='l',
        family='dinov2',
        img_size=518,
        attn_cfg='elu',
        out_indices=[7, 11, 15, 23],
        norm_all_outputs=True,
        drop_path_rate=0.3,
        pretrained=stage2_checkpoint),
    neck=dict(embed_dim=embed_dims),
    decode_head=dict(
        in_channels=[embed_dims] * 4,
        num_classes=num_classes,
        loss_cls=dict(class_weight=[1.0] * num_classes + [0.1])),
    # Sliding window for --cfg-options model.test_cfg.mode=slide.
    test_cfg=dict(mode='whole', crop_size=crop_size, stride=(341, 341)))
# 8 GPUs x 2 images = batch 16 (as ViT-Adapter-L + Mask2Former); AdamW 2e-5, layer decay 0.9.
train_dataloader = dict(batch_size=2)
optim_wrapper = dict(
    optimizer=dict(lr=2e-5, weight_decay=0.05),
    paramwise_cfg=dict(layer_decay_rate=0.9),
    clip_grad=dict(max_norm=0.01, norm_type=2))
