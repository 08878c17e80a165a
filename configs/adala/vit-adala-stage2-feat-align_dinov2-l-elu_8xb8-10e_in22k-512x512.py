# ViT-AdaLA Stage 2 (feature alignment) on ImageNet-22K images at 512 x 512: the whole student,
# starting from its Stage-1 checkpoint, matches the frozen teacher's final features (MSE).
_base_ = [
    '../_base_/models/adala_dinov2-l_512.py',
    '../_base_/datasets/image_folder_bs8_512.py',
    '../_base_/schedules/distill_adamw_10e.py',
    '../_base_/default_runtime_cls.py',
]
stage1_checkpoint = ('work_dirs/vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512/'
                     'epoch_4.pth')
model = dict(
    # the student weights come from the Stage-1 checkpoint (load_from), not from DINOv2
    student=dict(pretrained=None),
    teacher_recorders=dict(final=dict(type='ModuleOutputs', source='norm')),
    student_recorders=dict(final=dict(type='ModuleOutputs', source='norm')),
    distill_losses=dict(
        feat=dict(
            loss=dict(type='mmlinvit.FeatureMSELoss', loss_weight=1.0),
            inputs=dict(student_feats='student.final', teacher_feats='teacher.final'))))
train_dataloader = dict(dataset=dict(data_root='data/imagenet21k', data_prefix='train'))
load_from = stage1_checkpoint
# student_backbone.pth: the backbone Stage 3 starts from
custom_hooks = [dict(type='mmlinvit.ExportStudentHook')]
missing_path_hints = {
    'load_from': 'Run ViT-AdaLA Stage 1 first: python tools/train.py '
                 'configs/adala/vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512.py'
                 ' (with only its exported student_backbone.pth at hand: --cfg-options '
                 'load_from=None model.student.pretrained=PATH)',
    'train_dataloader.dataset':
    'Stage 2 reads the ImageNet-22K (ImageNet-21K) images; labels are not used. Download the '
    'full release (e.g. winter21_whole.tar.gz, https://image-net.org/download-images.php, '
    'account needed), extract it and the per-class tars inside it so that '
    'data/imagenet21k/train/<wnid>/*.JPEG exist (any sub-folder layout works: the folder is '
    'searched recursively), or point the config at it with --cfg-options '
    'train_dataloader.dataset.data_root=... train_dataloader.dataset.data_prefix=...',
}
