# Copy the MLP, distill the attention (seed 000) on ImageNet-1k: DeiT-B/16 softmax teacher,
# ELU+1 linear-attention student initialised by MLPCopy, trained with
# LabelSmooth CE + 50 * per-block attention-output MSE, the paper's schedule (300 epochs,
# AdamW 2e-3 at 4096 images per step = 64 GPUs x 64).
# Other operators / inits / no distillation: see
# configs/_base_/models/copy-mlp-distill-attn_deit-b.py
_base_ = [
    '../_base_/models/copy-mlp-distill-attn_deit-b.py',
    '../_base_/datasets/imagenet_bs64.py',
    '../_base_/schedules/copy_mlp_adamw_300e.py',
    '../_base_/default_runtime_cls.py',
]
