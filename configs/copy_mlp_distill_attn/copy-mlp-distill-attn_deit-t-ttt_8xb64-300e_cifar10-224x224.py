# Copy the MLP, distill the attention with a TTT student (ViT^3 test-time-training block:
# inner SwiGLU trained by one clipped gradient step per sample, 3x3 depth-wise inner-conv
# branch, 3x3 depth-wise positional conv before each block's attention).  As in the paper,
# the TTT student has no class token (fixed sin-cos positions, average pooling), so the
# attention outputs are compared on the patch tokens only.  The TTT parameters softmax
# attention lacks keep the operator's own init (MLPCopy copies the MLPs; Mimetic / Impulse
# do not apply to TTT, which has no q.k^T form).
_base_ = './copy-mlp-distill-attn_deit-t-elu_8xb64-300e_cifar10-224x224.py'
model = dict(
    student=dict(
        backbone=dict(
            attn_cfg=dict(_delete_=True, type='ttt'),
            with_cls_token=False,
            pos_embed_type='sincos',
            out_type='avg_featmap')),
    distill_losses=dict(attn_out=dict(loss=dict(patch_tokens_only=True))))
