# ViT-AdaLA Stage 3 with UPerNet instead of Mask2Former: the linearized DINOv2-L student
# (ELU+1) from the Stage-2 checkpoint, Feature2Pyramid (4x, 2x, 1x, 0.5x) -> UPerHead,
# ADE20K 150 classes, 518 x 518 crops (see configs/segmentation/
# mask2former_dinov2-l_8xb2-160k_ade20k-518x518.py for why 518).  ViT-AdaLA reports
# Mask2Former only: the head width (768), drop-path 0.3 and AdamW 3e-5 with layer decay 0.9
# (mmseg's BEiT-Base UPerNet recipe) are mmlinvit's choices.
_base_ = [
    '../_base_/models/upernet_vit.py', '../_base_/datasets/ade20k_518x518.py',
    '../_base_/default_runtime_seg.py', '../_base_/schedules/schedule_160k.py',
    '../_base_/models/adala-dinov2-l-elu.py'
]
missing_path_hints = _base_.adala_missing_path_hints
crop_size = (518, 518)
embed_dims = 1024
model = dict(
    data_preprocessor=dict(size=crop_size, test_cfg=dict(size_divisor=1)),
    patch_padding='center',  # DINOv2's CenterPadding (mmlinvit.EncoderDecoder)
    backbone=_base_.adala_seg_backbone,
    neck=dict(embed_dim=embed_dims),
    decode_head=dict(in_channels=[embed_dims] * 4, channels=768, num_classes=150),
    auxiliary_head=dict(in_channels=embed_dims, num_classes=150),
    # stride: 2/3 of the window, as mmseg's recipes (used with mode='slide')
    test_cfg=dict(mode='whole', crop_size=crop_size, stride=(345, 345)))
train_dataloader = dict(batch_size=2)
optim_wrapper = dict(optimizer=dict(lr=3e-5), paramwise_cfg=dict(layer_decay_rate=0.9))
