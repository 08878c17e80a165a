# ViT-AdaLA, Stage 3 on ADE20K: the linearized DINOv2-L student (ELU+1 kernel linear attention
# in every block) fine-tuned with Mask2Former on ADE20K's 150 classes.  The recipe is the
# softmax teacher's (configs/segmentation/mask2former_dinov2-l_8xb2-160k_ade20k-518x518.py:
# 518 x 518 crops, 160k iterations, 8 GPUs x 2 images, AdamW 2e-5 with layer decay 0.9); only
# the backbone differs (configs/_base_/models/adala-dinov2-l-elu.py).
# configs/adala_dinov2_ade20k.py is this config under its short name.
#
# How the three stages chain (see README, "ViT-AdaLA"); each stage reads the previous one's
# last checkpoint from its default work dir:
#   Stage 1  python tools/train.py \
#                configs/adala/vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512.py
#            (attention alignment, teacher forcing; COCO images; from DINOv2-L)
#   Stage 2  python tools/train.py \
#                configs/adala/vit-adala-stage2-feat-align_dinov2-l-elu_8xb8-10e_in22k-512x512.py
#            (feature alignment; ImageNet-22K images; load_from = Stage 1)
#            (writes student_backbone.pth, the student's weights only, via ExportStudentHook)
#   Stage 3  python tools/train.py configs/adala_dinov2_ade20k.py   (this config)
# Multi-GPU: bash tools/dist_train.sh CONFIG 8 for each stage.  A missing Stage-2 file stops
# tools/train.py before anything is built.
#
# Variants by overriding a few keys: Cityscapes -> configs/segmentation/
# mask2former_adala-dinov2-l-elu_8xb2-80k_cityscapes-512x1024.py; UPerNet -> configs/
# segmentation/upernet_adala-dinov2-l-elu_8xb2-160k_ade20k-518x518.py; sliding-window
# inference -> --cfg-options model.test_cfg.mode=slide.
_base_ = [
    '../segmentation/mask2former_dinov2-l_8xb2-160k_ade20k-518x518.py',
    '../_base_/models/adala-dinov2-l-elu.py',
]
missing_path_hints = _base_.adala_missing_path_hints
model = dict(backbone=_base_.adala_seg_backbone)
