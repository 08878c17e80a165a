# ViT-Linearizer downstream segmentation: UPerNet on the distilled Adventurer-Base, ADE20K
# 512 x 512, 160k iterations (8 GPUs x 2 images).
# The backbone returns the outputs of its 4 stage-end blocks (2, 5, 8, 11: the same stage
# boundaries as the distillation) as stride-16 NCHW maps (out_type='featmap', patch tokens
# only, class token dropped, every output through norm_f); mmseg's Feature2Pyramid of
# configs/_base_/models/upernet_vit.py rescales them to strides 4, 8, 16, 32 for UPerHead.
# It loads the distilled student (<distill work_dir>/student_backbone.pth, written by
# ExportStudentHook; a 'student.*' checkpoint also loads, its connector dropped); the learned
# 14 x 14 position grid is resampled to the input grid on every forward.
# Optimiser: the base schedule's AdamW 1e-4 with layer-wise decay 0.65 over the Adventurer's
# get_layer_depth; 1-D parameters (norms, biases, Mamba-2 dt bias / A_log / D) and the tokens
# get no weight decay.
_base_ = [
    '../_base_/models/upernet_vit.py', '../_base_/datasets/ade20k_512x512.py',
    '../_base_/default_runtime_seg.py', '../_base_/schedules/schedule_160k.py'
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
    backbone=dict(
        _delete_=True,
        type='mmlinvit.Adventurer',
        arch='b',
        img_size=512,
        patch_size=16,
        flip_schedule='paper',  # the distilled student's (checked when its weights load)
        with_mask_token=False,
        out_type='featmap',
        out_indices=[2, 5, 8, 11],
        norm_all_outputs=True,
        drop_path_rate=0.1,
        pretrained=distilled_checkpoint),
    test_cfg=dict(mode='whole', crop_size=(512, 512), stride=(341, 341)))
train_dataloader = dict(batch_size=2)
optim_wrapper = dict(
    paramwise_cfg=dict(
        layer_decay_rate=0.65,
        no_weight_decay_names=('pos_embed', 'cls_token', 'mask_token', 'mixer.dt_bias',
                               'mixer.A_log', 'mixer.D')))
