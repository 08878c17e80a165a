# "Copy the Same, Distill the Difference" (seed 000), segmentation setting WITHOUT
# distillation: UPerNet, 160k iterations, ADE20K 512 x 512.
#   operator        ReLU kernel linear attention (phi = ReLU) in every block
#   initialisation  FullCopy: every weight of the softmax DeiT-B teacher (IN-1k, 81.8 top-1)
#                   - patch embedding, class token, position embedding, norms, QKV, output
#                   projection, MLPs - loaded into the linear student (`pretrained=`; the
#                   operators keep softmax attention's qkv / proj names and shapes).
# The paper's best ImageNet pair (ReLU FullCopy: 80.8 without / 82.0 with distillation).
# The distilled twin is upernet_deit-b-relu-fullcopy-distill_8xb2-160k_ade20k-512x512.py.
_base_ = [
    '../_base_/models/upernet_vit.py', '../_base_/datasets/ade20k_512x512.py',
    '../_base_/default_runtime_seg.py', '../_base_/schedules/schedule_160k.py'
]
teacher_checkpoint = 'checkpoints/deit_base_patch16_224-b5f2ef4d.pth'
missing_path_hints = {
    'model.backbone.pretrained':
    'Download the DeiT-B teacher from '
    'https://dl.fbaipublicfiles.com/deit/deit_base_patch16_224-b5f2ef4d.pth into checkpoints/ '
    '(timm layout, detected automatically).',
}
model = dict(
    backbone=dict(
        type='mmlinvit.LinearVisionTransformer',
        arch='b',
        family='deit',
        img_size=512,
        attn_cfg='relu',
        out_indices=[3, 5, 7, 11],
        drop_path_rate=0.1,
        pretrained=teacher_checkpoint),
    test_cfg=dict(mode='whole', crop_size=(512, 512), stride=(341, 341)))
train_dataloader = dict(batch_size=2)
# mmseg MAE-B UPerNet recipe: AdamW 1e-4, wd 0.05, layer decay 0.65, batch 16.
optim_wrapper = dict(optimizer=dict(lr=1e-4), paramwise_cfg=dict(layer_decay_rate=0.65))
