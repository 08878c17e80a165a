# ViT-AdaLA pair at 512 x 512: a frozen DINOv2-L/14 softmax teacher and a linear-attention
# (ELU + 1) student with the same weights.  Stage configs add recorders and losses.
# Official DINOv2 hub checkpoints load directly (layout detected by mmlinvit.converters).
dinov2_checkpoint = 'checkpoints/dinov2_vitl14_pretrain.pth'
dinov2_checkpoint_hint = (
    'Download dinov2_vitl14_pretrain.pth (the official DINOv2 ViT-L/14 release, used as is: '
    'its layout is detected) from '
    'https://dl.fbaipublicfiles.com/dinov2/dinov2_vitl14/dinov2_vitl14_pretrain.pth into '
    'checkpoints/.')
# (merged with the stage configs' own hints)
missing_path_hints = {
    'model.student.pretrained': dinov2_checkpoint_hint,
    'model.teacher.pretrained': dinov2_checkpoint_hint,
}
model = dict(
    type='mmlinvit.DistillationModel',
    student=dict(
        type='mmlinvit.LinearVisionTransformer',
        arch='l',
        family='dinov2',
        img_size=512,
        attn_cfg='elu',
        out_type='raw',
        # The student trains without masking (Stage 2 trains all of it): no DINOv2 mask
        # token, which would get no gradient and stop DDP (find_unused_parameters=False); the
        # checkpoint's token is dropped on load.  The frozen teacher keeps it.
        with_mask_token=False,
        pretrained=dinov2_checkpoint),
    teacher=dict(
        type='mmlinvit.VisionTransformer',
        arch='l',
        family='dinov2',
        img_size=512,
        attn_cfg='softmax',
        out_type='raw',
        pretrained=dinov2_checkpoint),
    # the build-time dry run checks shapes only: a 16 x 16 grid is enough and much cheaper
    check_input_size=(224, 224))
