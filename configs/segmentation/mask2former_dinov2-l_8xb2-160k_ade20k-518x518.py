# Mask2Former on the softmax DINOv2-L/14 on ADE20K (150 classes): the teacher of ViT-AdaLA and
# the recipe its Stage-3 student follows
# (configs/adala/mask2former_adala-dinov2-l-elu_8xb2-160k_ade20k-518x518.py inherits this file
# and only swaps the backbone; paper: 56.73 teacher vs 55.55 student mIoU at 512^2).
# The official DINOv2 weights load directly (the hub layout is detected), or converted with
#   python tools/model_converters/convert_checkpoint.py dinov2_vitl14_pretrain.pth \
#       checkpoints/dinov2_vitl14_canonical.pth --layout dinov2
#
# Crops are 518 x 518 (37 x 37 patches of 14 px, DINOv2's native grid) instead of the
# paper's 512: with patch 14, a 512 crop would leave the last 8 pixel rows/columns out of
# the patch grid.  Test images are resized to a short side of 518 and padded to a multiple
# of 14 as DINOv2's segmentation evaluation pads them (``CenterPadding``: the padding split
# between both sides, ``model.patch_padding='center'``; the data preprocessor leaves the
# size alone); predictions are cropped back and resized to the original image.
# Sliding-window inference: --cfg-options model.test_cfg.mode=slide.
_base_ = [
    '../_base_/models/mask2former_vit.py', '../_base_/datasets/ade20k_518x518.py',
    '../_base_/default_runtime_seg.py', '../_base_/schedules/schedule_160k.py'
]
teacher_checkpoint = 'checkpoints/dinov2_vitl14_canonical.pth'
missing_path_hints = {
    'model.backbone.pretrained':
    'Download dinov2_vitl14_pretrain.pth from '
    'https://dl.fbaipublicfiles.com/dinov2/dinov2_vitl14/dinov2_vitl14_pretrain.pth (or pass it '
    'directly: the layout is detected), or convert it with '
    'tools/model_converters/convert_checkpoint.py.',
}
crop_size = (518, 518)
num_classes = 150
embed_dims = 1024
data_preprocessor = dict(size=crop_size, test_cfg=dict(size_divisor=1))
model = dict(
    data_preprocessor=data_preprocessor,
    patch_padding='center',  # DINOv2's CenterPadding (mmlinvit.EncoderDecoder)
    backbone=dict(
        type='mmlinvit.VisionTransformer',
        arch='l',
        family='dinov2',
        img_size=518,
        attn_cfg='softmax',
        out_indices=[7, 11, 15, 23],
        norm_all_outputs=True,
        drop_path_rate=0.3,
        # No DINOv2 mask token (only masked pre-training uses it; a trainable parameter
        # without gradient stops DDP runs): the checkpoint's token is dropped on load.
        with_mask_token=False,
        pretrained=teacher_checkpoint),
    neck=dict(embed_dim=embed_dims),
    decode_head=dict(
        in_channels=[embed_dims] * 4,
        num_classes=num_classes,
        loss_cls=dict(class_weight=[1.0] * num_classes + [0.1])),
    # Sliding window for --cfg-options model.test_cfg.mode=slide: stride 2/3 of the window,
    # as mmseg's recipes.
    test_cfg=dict(mode='whole', crop_size=crop_size, stride=(345, 345)))
# 8 GPUs x 2 images = batch 16 (as ViT-Adapter-L + Mask2Former); AdamW 2e-5, layer decay 0.9.
train_dataloader = dict(batch_size=2)
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
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=0, end=160000, by_epoch=False),
]
