# "Copy the Same, Distill the Difference" (seed 000), segmentation setting WITH distillation:
# the same ReLU / FullCopy UPerNet student as
# upernet_deit-b-relu-fullcopy_8xb2-160k_ade20k-512x512.py, trained with
#   L = L_seg + 50 * mean_i MSE(attn_out_i(student), attn_out_i(teacher))
# where attn_out_i is the output of block i's attention (after the output projection, before
# the residual), for every block, against the frozen softmax DeiT-B teacher seeing the same
# 512 x 512 crops.  Nothing of the student is frozen.  Validation, checkpoints and
# tools/test.py use the student (the teacher is never saved).
_base_ = ['./upernet_deit-b-relu-fullcopy_8xb2-160k_ade20k-512x512.py']
teacher_checkpoint = 'checkpoints/deit_base_patch16_224-b5f2ef4d.pth'
missing_path_hints = {
    'model.teacher.pretrained':
    'Download the DeiT-B teacher from '
    'https://dl.fbaipublicfiles.com/deit/deit_base_patch16_224-b5f2ef4d.pth into checkpoints/ '
    '(timm layout, detected automatically).',
    'model.student.backbone.pretrained':
    'Download the DeiT-B teacher (FullCopy source) from '
    'https://dl.fbaipublicfiles.com/deit/deit_base_patch16_224-b5f2ef4d.pth into checkpoints/.',
}
model = dict(
    _delete_=True,
    type='mmlinvit.DistillationModel',
    student={{_base_.model}},
    teacher=dict(
        type='mmlinvit.VisionTransformer',
        arch='b',
        family='deit',
        img_size=512,
        attn_cfg='softmax',
        out_type='featmap',
        pretrained=teacher_checkpoint),
    student_recorders=dict(
        attn_out=dict(type='ModuleOutputs', source='backbone.blocks.{i}.attn')),
    teacher_recorders=dict(attn_out=dict(type='ModuleOutputs', source='blocks.{i}.attn')),
    distill_losses=dict(
        attn_out=dict(
            loss=dict(type='mmlinvit.AttentionOutputMSELoss', loss_weight=50.0),
            inputs=dict(student_outputs='student.attn_out', teacher_outputs='teacher.attn_out'))),
    # Build-time dry run of teacher, student and loss at a small size (any size works).
    check_input_size=(64, 64),
    # None: the student's preprocessor (model.student.data_preprocessor) prepares each batch
    # for teacher and student, so crop / pad changes go there (mmengine would otherwise fill
    # this key from the top-level data_preprocessor, and a differing student one is refused).
    data_preprocessor=None)
# Layer-wise decay over the student's backbone inside the distillation model.
optim_wrapper = dict(paramwise_cfg=dict(backbone='student.backbone'))
