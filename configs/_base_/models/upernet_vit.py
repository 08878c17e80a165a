# UPerNet on a plain ViT: the backbone returns 4 block outputs at stride 16 (out_type='featmap'),
# mmseg's Feature2Pyramid rescales them by 4x, 2x, 1x, 0.5x (strides 4, 8, 16, 32) for UPerHead
# (mmlinvit's variant: the same on even patch grids, its 0.5x level also covers odd ones).
# Any mmlinvit ViT backbone fits (softmax teacher or linearized student: change `type` and
# `attn_cfg`); position embeddings are resampled to the input grid on every forward.
norm_cfg = dict(type='SyncBN', requires_grad=True)
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    size=(512, 512))
embed_dims = 768
model = dict(
    # mmseg's EncoderDecoder that pads inputs to a multiple of the patch size and crops the
    # logits back, so predictions stay aligned at any image size (mmlinvit/models/segmentors.py).
    type='mmlinvit.EncoderDecoder',
    data_preprocessor=data_preprocessor,
    backbone=dict(
        type='mmlinvit.VisionTransformer',
        arch='b',
        family='deit',
        img_size=512,
        attn_cfg='softmax',
        out_type='featmap',
        out_indices=[3, 5, 7, 11],
        norm_all_outputs=True,
        drop_path_rate=0.1,
        pretrained=None),
    neck=dict(
        type='mmlinvit.FullGridFeature2Pyramid',
        embed_dim=embed_dims,
        rescales=[4, 2, 1, 0.5],
        norm_cfg=norm_cfg),
    decode_head=dict(
        type='UPerHead',
        in_channels=[embed_dims] * 4,
        in_index=[0, 1, 2, 3],
        pool_scales=(1, 2, 3, 6),
        channels=512,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    auxiliary_head=dict(
        type='FCNHead',
        in_channels=embed_dims,
        in_index=2,
        channels=256,
        num_convs=1,
        concat_input=False,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4)),
    train_cfg=dict(),
    # 'whole' runs the full (resized) image at once; 'slide' tiles it (crop_size, stride).
    test_cfg=dict(mode='whole'))
