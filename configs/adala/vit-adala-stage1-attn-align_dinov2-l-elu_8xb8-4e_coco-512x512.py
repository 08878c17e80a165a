# ViT-AdaLA Stage 1 (attention alignment) on COCO train2017 images at 512 x 512.
# Teacher forcing: every student block's attention receives the frozen teacher's input of the
# same block, and its output is matched to the teacher's attention output (MSE).  Only the
# student attention parameters (blocks.*.attn.*: Q, K, V, output projection and any
# linear-attention parameters) train; everything else stays at the DINOv2 weights.
_base_ = [
    '../_base_/models/adala_dinov2-l_512.py',
    '../_base_/datasets/image_folder_bs8_512.py',
    '../_base_/schedules/distill_adamw_4e.py',
    '../_base_/default_runtime_cls.py',
]
model = dict(
    teacher_recorders=dict(
        block_in=dict(type='ModuleInputs', source='blocks.{i}'),
        attn_out=dict(type='ModuleOutputs', source='blocks.{i}.attn')),
    student_recorders=dict(attn_out=dict(type='ModuleOutputs', source='blocks.{i}.attn')),
    teacher_forcing=dict(input_recorder='block_in', blocks='blocks'),
    trainable_params=['blocks.*.attn.*'],
    distill_losses=dict(
        attn_out=dict(
            loss=dict(type='mmlinvit.AttentionOutputMSELoss', loss_weight=1.0),
            inputs=dict(student_outputs='student.attn_out', teacher_outputs='teacher.attn_out'))))
default_hooks = dict(checkpoint=dict(interval=1, max_keep_ckpts=1))
# student_backbone.pth: the student weights alone, for any backbone's pretrained=
custom_hooks = [dict(type='mmlinvit.ExportStudentHook')]
# How to get the images when data/coco/train2017 is missing (tools/train.py stops before
# anything is built and prints this); the key is the dataset's config location.
missing_path_hints = {
    'train_dataloader.dataset':
    'Stage 1 reads the COCO train2017 images (118k JPEGs; no annotations are used): download '
    'http://images.cocodataset.org/zips/train2017.zip (18 GB, https://cocodataset.org/#download) '
    'and unzip it into data/coco so that data/coco/train2017/*.jpg exist, or point the config '
    'at another folder of images with --cfg-options train_dataloader.dataset.data_root=... '
    'train_dataloader.dataset.data_prefix=... (searched recursively, labels not needed).',
}
