# Copy the MLP, distill the attention (seed 000) on CIFAR-10 (transfer set, upsampled to 224):
# DeiT-T/16 teacher and ELU+1 student, MLPCopy, CE(LS 0.1) + 50 * attention-output MSE,
# AdamW 2e-3 at 512 images per step (8 GPUs x 64), 300 epochs with 50 warm-up.
_base_ = [
    '../_base_/models/copy-mlp-distill-attn_deit-b.py',
    '../_base_/datasets/cifar10_bs64.py',
    '../_base_/schedules/copy_mlp_adamw_300e.py',
    '../_base_/default_runtime_cls.py',
]
model = dict(
    student=dict(
        backbone=dict(arch='t', drop_path_rate=0.0),
        head=dict(num_classes=10, in_channels=192)),
    teacher=dict(arch='t', pretrained='checkpoints/deit_tiny_patch16_224-a1311bcf.pth'),
    # The frozen DeiT teacher was trained on ImageNet statistics; the batch is normalised
    # with the CIFAR-10 ones (cifar10_bs64.py) for the student and converted for the teacher.
    teacher_input_norm=dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]))
missing_path_hints = {
    'model.teacher.pretrained':
    'Download the DeiT-T teacher from '
    'https://dl.fbaipublicfiles.com/deit/deit_tiny_patch16_224-a1311bcf.pth into checkpoints/ '
    '(official DeiT layout, detected automatically).',
}
auto_scale_lr = dict(base_batch_size=512)
