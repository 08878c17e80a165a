# ViT-Linearizer distillation (activation matching + masked prediction, CLIP ViT-B/16 teacher)
# into an ELU+1 linear-attention ViT-B/16 student, on ImageNet-1k images.  Adventurer students
# reuse configs/_base_/models/linearizer_clip-b16.py the same way with their own
# student / student_recorders / connector width.
_base_ = [
    '../_base_/models/linearizer_clip-b16.py',
    '../_base_/datasets/imagenet_bs64.py',
    '../_base_/schedules/distill_adamw_300e.py',
    '../_base_/default_runtime_cls.py',
]
missing_path_hints = _base_.linearizer_missing_path_hints
model = dict(
    student=dict(
        type='mmlinvit.LinearVisionTransformer',
        arch='b',
        family='deit',
        img_size=224,
        attn_cfg='elu',
        out_type='raw'),
    student_recorders=dict(
        stages=dict(type='ModuleOutputs', source='blocks.{i}', indices=[2, 5, 8, 11]),
        final=dict(type='ModuleOutputs', source='norm')),
    connectors=dict(proj=dict(in_channels=768)))
# ImageNet images without labels: no validation of the bare student
val_dataloader = None
val_evaluator = None
test_dataloader = None
test_evaluator = None
# student_backbone.pth: the distilled student alone (no connector, no mask token)
custom_hooks = [dict(type='mmlinvit.ExportStudentHook')]
