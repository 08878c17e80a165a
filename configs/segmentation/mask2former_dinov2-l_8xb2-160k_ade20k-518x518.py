# The softmax teacher of ViT-AdaLA on ADE20K: DINOv2-L (softmax attention) with Mask2Former,
# the reference the linearized student of configs/adala_dinov2_ade20k.py is compared to
# (paper: 56.73 teacher vs 55.55 student mIoU at 512^2).  Same recipe, only the backbone
# differs: the official DINOv2 weights, converted with
#   python tools/model_converters/convert_checkpoint.py dinov2_vitl14_pretrain.pth \
#       checkpoints/dinov2_vitl14_canonical.pth --layout dinov2
_base_ = ['../adala_dinov2_ade20k.py']
teacher_checkpoint = 'checkpoints/dinov2_vitl14_canonical.pth'
missing_path_hints = {
    'model.backbone.pretrained':
    'Download dinov2_vitl14_pretrain.pth from '
    'https://dl.fbaipublicfiles.com/dinov2/dinov2_vitl14/dinov2_vitl14_pretrain.pth (or pass it '
    'directly: the layout is detected), or convert it with '
    'tools/model_converters/convert_checkpoint.py.',
}
model = dict(
    backbone=dict(
        type='mmlinvit.VisionTransformer', attn_cfg='softmax', pretrained=teacher_checkpoint))
