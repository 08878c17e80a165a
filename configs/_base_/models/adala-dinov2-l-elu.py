# The ViT-AdaLA Stage-3 backbone: the linearized DINOv2-L/14 student (ELU+1 kernel linear
# attention in every block) with the weights ViT-AdaLA Stage 2 exported
# (<Stage-2 work_dir>/student_backbone.pth, written by mmlinvit.ExportStudentHook).
# Every Stage-3 config (Mask2Former / UPerNet segmentation, the linear head on ImageNet-1k)
# lists this file among its bases and takes the backbone and the missing-checkpoint hint
# from it (tools/train.py stops before anything is built when the file is missing, with it):
#   model = dict(backbone=_base_.adala_seg_backbone)                          # segmentation
#   model = dict(backbone=dict(_base_.adala_backbone, out_type='cls_token'))  # classification
#   missing_path_hints = _base_.adala_missing_path_hints
# (the hint has its own name so that this file combines with bases that have hints of
# their own).
adala_stage2_checkpoint = ('work_dirs/vit-adala-stage2-feat-align_dinov2-l-elu_8xb8-10e_'
                           'in22k-512x512/student_backbone.pth')
adala_missing_path_hints = {
    'model.backbone.pretrained':
    'This is the ViT-AdaLA Stage-2 student backbone, written by Stage 2 (ExportStudentHook). '
    'Produce it with python tools/train.py '
    'configs/adala/vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512.py && '
    'python tools/train.py '
    'configs/adala/vit-adala-stage2-feat-align_dinov2-l-elu_8xb8-10e_in22k-512x512.py, or '
    'pass an existing one with --cfg-options model.backbone.pretrained=PATH (a Stage-2 runner '
    'checkpoint, epoch_N.pth, loads directly too).',
}
# The student itself.
adala_backbone = dict(
    type='mmlinvit.LinearVisionTransformer',
    arch='l',
    family='dinov2',
    attn_cfg='elu',
    # The DINOv2 mask token is only used by masked pre-training: without it every trainable
    # parameter gets a gradient (DDP's find_unused_parameters=False), and a checkpoint's
    # token is dropped on load (listed in the load report).
    with_mask_token=False,
    pretrained=adala_stage2_checkpoint)
# For segmentation decoders: 518 x 518 crops (37 x 37 patches of 14 px, DINOv2's native
# grid), four normalised NCHW outputs of blocks 8, 12, 16 and 24 (stride 14).
adala_seg_backbone = dict(
    adala_backbone,
    img_size=518,
    out_type='featmap',
    out_indices=[7, 11, 15, 23],
    norm_all_outputs=True,
    drop_path_rate=0.3)
