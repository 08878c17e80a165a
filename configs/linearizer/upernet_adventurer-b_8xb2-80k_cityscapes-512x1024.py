# ViT-Linearizer downstream segmentation: UPerNet on the distilled Adventurer-Base, Cityscapes
# 512 x 1024 crops (19 classes), 80k iterations (8 GPUs x 2 images).  Same model as
# upernet_adventurer-b_8xb2-160k_ade20k-512x512.py; inference slides 512 x 1024 windows over
# the 1024 x 2048 test images (the Adventurer runs in O(N) memory, any window works).
# The paper publishes no Cityscapes recipe (only its 82.0 mIoU): optimiser and schedule are
# the ADE20K config's (mmseg's MAE-B UPerNet) at 80k iterations, an mmlinvit choice (README,
# "Deviations from the papers").
# Data: leftImg8bit + gtFine, labels converted with mmseg's
#   python tools/dataset_converters/cityscapes.py data/cityscapes --nproc 8
_base_ = [
    '../_base_/models/upernet_vit.py', '../_base_/datasets/cityscapes_512x1024.py',
    '../_base_/default_runtime_seg.py', '../_base_/schedules/schedule_80k.py'
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
num_classes = 19
model = dict(
    data_preprocessor=dict(size=(512, 1024)),
    backbone=dict(
        _delete_=True,
        type='mmlinvit.Adventurer',
        arch='b',
        img_size=(512, 1024),
        patch_size=16,
        flip_schedule='paper',  # the distilled student's (checked when its weights load)
        with_mask_token=False,
        out_type='featmap',
        out_indices=[2, 5, 8, 11],
        norm_all_outputs=True,
        drop_path_rate=0.1,
        pretrained=distilled_checkpoint),
    decode_head=dict(num_classes=num_classes),
    auxiliary_head=dict(num_classes=num_classes),
    test_cfg=dict(mode='slide', crop_size=(512, 1024), stride=(341, 683)))
optim_wrapper = dict(
    paramwise_cfg=dict(
        layer_decay_rate=0.65,
        no_weight_decay_names=('pos_embed', 'cls_token', 'mask_token', 'mixer.dt_bias',
                               'mixer.A_log', 'mixer.D')))
