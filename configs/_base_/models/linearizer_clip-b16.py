# ViT-Linearizer distillation, usable by any student backbone: a frozen OpenAI CLIP ViT-B/16
# teacher sees the full image; the student sees it with 75% of its patch tokens replaced by a
# learnable mask token (sampled per image).
#   L = L_act + lambda * L_mask, lambda = 1
#   L_act : cosine-similarity maps of the visible patch tokens at K = 4 stage boundaries
#   L_mask: Smooth L1 between the projected student and the teacher final features at the
#           masked patches (the LinearConnector 'proj' is dropped after distillation).
# A student config sets model.student, model.student_recorders (records 'stages', a template
# over its K stage-end blocks, and 'final', its final normalised tokens) and the width of
# model.connectors.proj; backbones without num_prefix_tokens also set student_token_layout.
teacher_checkpoint = 'checkpoints/clip_vit_b16_openai.pt'
# How to get the teacher when the file is missing (tools/train.py stops before anything is
# built, with this hint).  A distillation config takes it with
#   missing_path_hints = _base_.linearizer_missing_path_hints
# (its own name, so that this file combines with bases that have hints of their own).
linearizer_missing_path_hints = {
    'model.teacher.pretrained':
    'This is the official OpenAI CLIP ViT-B/16 image encoder. Download ViT-B-16.pt from '
    'https://openaipublic.azureedge.net/clip/models/'
    '5806e77cd80f8b59890b7e101eabd078d9fb84e6937f9e85e4ecb61988df416f/ViT-B-16.pt (the '
    'ViT-B/16 entry of _MODELS in openai/CLIP clip/clip.py); it is a '
    'TorchScript archive, so convert it once: python '
    'tools/model_converters/convert_checkpoint.py ViT-B-16.pt '
    'checkpoints/clip_vit_b16_openai.pt --trust-checkpoint',
}
model = dict(
    type='mmlinvit.DistillationModel',
    teacher=dict(
        type='mmlinvit.VisionTransformer',
        arch='b',
        # act: QuickGELU, which the converted OpenAI file records (mlp_act). Another CLIP
        # file (open_clip LAION-2B / DataComp: GELU) is refused until act= is given here.
        family='clip',
        img_size=224,
        attn_cfg='softmax',
        out_type='raw',
        pretrained=teacher_checkpoint),
    teacher_recorders=dict(
        stages=dict(type='ModuleOutputs', source='blocks.{i}', indices=[2, 5, 8, 11]),
        final=dict(type='ModuleOutputs', source='norm')),
    # The teacher sees OpenAI CLIP's own input statistics (CLIP's preprocess normalises 0-1
    # pixels with mean (0.48145466, 0.4578275, 0.40821073), std (0.26862954, 0.26130258,
    # 0.27577711)), here in the data preprocessor's 0-255 units; the student keeps the data
    # preprocessor's statistics and the teacher's batch is converted from them on the fly.
    teacher_input_norm=dict(
        mean=[0.48145466 * 255, 0.4578275 * 255, 0.40821073 * 255],
        std=[0.26862954 * 255, 0.26130258 * 255, 0.27577711 * 255]),
    # masks follow the run's randomness.seed (seed=None); seed=N fixes them for every run seed
    patch_masking=dict(ratio=0.75),
    connectors=dict(proj=dict(type='mmlinvit.LinearConnector', in_channels=None,
                              out_channels=768)),
    distill_losses=dict(
        act=dict(
            loss=dict(type='mmlinvit.ActivationMatchingLoss', loss_weight=1.0),
            inputs=dict(
                student_feats='student.stages',
                teacher_feats='teacher.stages',
                patch_mask='context.patch_mask',
                student_token_layout='context.student_token_layout',
                teacher_token_layout='context.teacher_token_layout')),
        mask=dict(
            loss=dict(type='mmlinvit.MaskedPredictionLoss', loss_weight=1.0),
            inputs=dict(
                student_feats=dict(source='student.final', connector='proj'),
                teacher_feats='teacher.final',
                patch_mask='context.patch_mask',
                student_token_layout='context.student_token_layout',
                teacher_token_layout='context.teacher_token_layout'))))
