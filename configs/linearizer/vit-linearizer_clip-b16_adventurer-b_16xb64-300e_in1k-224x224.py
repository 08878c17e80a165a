# ViT-Linearizer pre-distillation: a frozen OpenAI CLIP ViT-B/16 teacher -> Adventurer-Base
# (Mamba-2 SSD mixer, causal scan, class token LAST), on ImageNet-1k images at 224 x 224.
#   L = L_act + lambda * L_mask, lambda = 1  (configs/_base_/models/linearizer_clip-b16.py)
#   * the student sees 75% of its patch tokens (per image) replaced by ITS OWN learnable
#     mask token (Adventurer.mask_token, use_student_mask_token=True); the teacher sees the
#     full image;
#   * L_act: cosine-similarity maps of the VISIBLE patch tokens at K = 4 stage boundaries, at
#     matching depth fractions: the residual stream after Adventurer blocks 2, 5, 8, 11 (its
#     `layers.{i}` outputs are in raster patch order, flips undone) vs the CLIP blocks
#     2, 5, 8, 11.  Special tokens are excluded by the token layouts: the student records are
#     [patches, cls] (student_token_layout=(0, 1)), the CLIP ones [cls, patches] (read from
#     the teacher backbone).  For Adventurer-L (24 blocks) use indices 5, 11, 17, 23 (the
#     build refuses indices at other depth fractions than the teacher's, naming these);
#   * L_mask: Smooth L1 between the final student features (norm_f) projected 768 -> 768 by
#     the LinearConnector 'proj' and the teacher's final features, at the masked patches.
# Other softmax teachers (DeiT-III, MAE, ...): set model.teacher.family / arch and
# teacher_checkpoint (any layout mmlinvit.converters reads), and model.teacher_input_norm=None
# (they were trained on the data preprocessor's ImageNet statistics, CLIP on its own; the
# build warns when CLIP's statistics reach a teacher of another family); the
# teacher's token layout comes from its backbone, the connector's out_channels must be the
# teacher width.
# The connector and the teacher are not part of the result: ExportStudentHook writes the
# Adventurer alone to <work_dir>/student_backbone.pth, which the fine-tuning configs load
# (linear-head_adventurer-b_16xb64-30e_in1k-224x224.py, upernet_adventurer-b_*.py).
# Optimiser / schedule: mmlinvit's distillation defaults (distill_adamw_300e.py), not published
# numbers.
_base_ = [
    '../_base_/models/linearizer_clip-b16.py',
    '../_base_/datasets/imagenet_bs64.py',
    '../_base_/schedules/distill_adamw_300e.py',
    '../_base_/default_runtime_cls.py',
]
missing_path_hints = _base_.linearizer_missing_path_hints
model = dict(
    student=dict(
        type='mmlinvit.Adventurer',
        arch='b',
        img_size=224,
        patch_size=16,
        flip_schedule='paper',
        with_mask_token=True,
        drop_path_rate=0.0,
        out_type='raw'),
    patch_masking=dict(use_student_mask_token=True),
    student_token_layout=(0, 1),
    student_recorders=dict(
        stages=dict(type='ModuleOutputs', source='layers.{i}', indices=[2, 5, 8, 11]),
        final=dict(type='ModuleOutputs', source='norm_f')),
    connectors=dict(proj=dict(in_channels=768)))
# Mamba-2 parameters (dt bias, A, D skip) are 1-D: no weight decay (flat_decay_mult=0 in the
# schedule); the tokens, position embedding and mask token neither (the schedule's custom_keys).
# ImageNet images without labels: no validation of the bare student
val_dataloader = None
val_evaluator = None
test_dataloader = None
test_evaluator = None
# student_backbone.pth: the distilled Adventurer alone (no connector, no teacher)
custom_hooks = [dict(type='mmlinvit.ExportStudentHook')]
