# ImageNet-1k fine-tuning of the ViT-Linearizer-distilled Adventurer-Base (mmpretrain
# ImageClassifier, class token -> linear head), 224 x 224.
# The backbone starts from the distilled student: <distill work_dir>/student_backbone.pth,
# written by ExportStudentHook during
# vit-linearizer_clip-b16_adventurer-b_16xb64-300e_in1k-224x224.py.  A runner checkpoint of
# that run works too, directly as pretrained= (Adventurer.init_weights reads its 'student.*'
# keys; the connector is dropped) or exported once:
#   python tools/model_converters/export_student.py \
#       work_dirs/vit-linearizer_clip-b16_adventurer-b_16xb64-300e_in1k-224x224/epoch_300.pth \
#       OUT.pth
# The backbone is built without a mask token: the distilled one is dropped when loading (it is
# only used by masked distillation).
# Optimiser / schedule: mmlinvit's fine-tuning defaults (finetune_adamw_30e.py), not published
# numbers; the Mamba-2 dt bias, A (A_log) and D skip get no weight decay.
_base_ = [
    '../_base_/datasets/imagenet_bs64.py',
    '../_base_/schedules/finetune_adamw_30e.py',
    '../_base_/default_runtime_cls.py',
]
distilled_checkpoint = ('work_dirs/vit-linearizer_clip-b16_adventurer-b_16xb64-300e_in1k-224x224/'
                        'student_backbone.pth')
missing_path_hints = {
    'model.backbone.pretrained':
    'This is the ViT-Linearizer-distilled Adventurer-B. Produce it with python tools/train.py '
    'configs/linearizer/vit-linearizer_clip-b16_adventurer-b_16xb64-300e_in1k-224x224.py '
    '(ExportStudentHook writes student_backbone.pth into its work dir), or pass one with '
    '--cfg-options '
    'model.backbone.pretrained=PATH.',
}
model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='mmlinvit.Adventurer',
        arch='b',
        img_size=224,
        patch_size=16,
        flip_schedule='paper',  # the distilled student's (checked when its weights load)
        with_mask_token=False,
        drop_path_rate=0.1,
        out_type='cls_token',
        pretrained=distilled_checkpoint),
    neck=None,
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=768,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        topk=(1, 5),
        init_cfg=dict(type='TruncNormal', layer='Linear', std=0.02)))
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={
            '.cls_token': dict(decay_mult=0.0),
            '.pos_embed': dict(decay_mult=0.0),
            'mixer.dt_bias': dict(decay_mult=0.0),
            'mixer.A_log': dict(decay_mult=0.0),
            'mixer.D': dict(decay_mult=0.0),
        }))
