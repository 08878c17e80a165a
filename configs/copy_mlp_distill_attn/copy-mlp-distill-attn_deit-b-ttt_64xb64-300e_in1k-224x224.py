# Copy the MLP, distill the attention (seed 000) on ImageNet-1k with a TTT student (ViT^3
# test-time-training block; Mimetic / Impulse do not apply to it):
# DeiT-B/16 softmax teacher, MLPCopy, LabelSmooth CE + 50 * per-block attention-output MSE.
# As in the paper the student has no class token (fixed sin-cos positions, average pooling),
# so the attention outputs are compared on the patch tokens only.
_base_ = './copy-mlp-distill-attn_deit-b-elu_64xb64-300e_in1k-224x224.py'
model = dict(
    student=dict(
        backbone=dict(
            attn_cfg=dict(_delete_=True, type='ttt'),
            with_cls_token=False,
            pos_embed_type='sincos',
            out_type='avg_featmap')),
    distill_losses=dict(attn_out=dict(loss=dict(patch_tokens_only=True))))
