# ViT-AdaLA Stage 3 with UPerNet instead of Mask2Former: the linearized DINOv2-L student
# (ELU+1) from the Stage-2 checkpoint, Feature2Pyramid (4x, 2x, 1x, 0.5x) -> UPerHead,
# ADE20K 150 classes, 518 x 518 crops (see configs/adala_dinov2_ade20k.py for why 518).
_base_ = [
    '../_base_/models/upernet_vit.py', '../_base_/datasets/ade20k_518x518.py',
    '../_base_/default_runtime_seg.py', '../_base_/schedules/schedule_160k.py'
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
embed_dims = 1024
model = dict(
    data_preprocessor=dict(size=crop_size, test_cfg=dict(size_divisor=14)),
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
    decode_head=dict(in_channels=[embed_dims] * 4, channels=768, num_classes=150),
    auxiliary_head=dict(in_channels=embed_dims, num_classes=150),
    test_cfg=dict(mode='whole', crop_size=crop_size, stride=(341, 341)))
train_dataloader = dict(batch_size=2)
optim_wrapper = dict(optimizer=dict(lr=3e-5), paramwise_cfg=dict(layer_decay_rate=0.9))
