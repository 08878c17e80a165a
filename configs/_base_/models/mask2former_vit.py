# Mask2Former on a plain ViT: mmseg's Feature2Pyramid (4x, 2x, 1x, 0.5x; mmlinvit's variant, whose
# 0.5x level also covers odd patch grids such as 518 / 14 = 37) -> mmseg's Mask2FormerHead,
# whose pixel decoder is mmdet's MSDeformAttnPixelDecoder and whose losses, assigner and
# sampler come from mmdet (the `mmdet.` prefixes import mmdet; mmseg's head subclasses
# mmdet's Mask2FormerHead when mmdet is importable - tests check that it is).
# Evaluated here: a child that changes the class count re-states decode_head.num_classes and
# decode_head.loss_cls.class_weight ([1.0] * N + [0.1]), as the Cityscapes configs do.
num_classes = 150
norm_cfg = dict(type='SyncBN', requires_grad=True)
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    size=(512, 512),
    test_cfg=dict(size_divisor=32))
embed_dims = 768
model = dict(
    # mmseg's EncoderDecoder plus correct window metas, so sliding-window inference works
    # with Mask2FormerHead on padded test images (see mmlinvit/models/segmentors.py).
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
        type='Mask2FormerHead',
        in_channels=[embed_dims] * 4,
        strides=[4, 8, 16, 32],
        feat_channels=256,
        out_channels=256,
        num_classes=num_classes,
        num_queries=100,
        num_transformer_feat_level=3,
        align_corners=False,
        pixel_decoder=dict(
            type='mmdet.MSDeformAttnPixelDecoder',
            num_outs=3,
            norm_cfg=dict(type='GN', num_groups=32),
            act_cfg=dict(type='ReLU'),
            encoder=dict(
                num_layers=6,
                layer_cfg=dict(
                    self_attn_cfg=dict(
                        embed_dims=256,
                        num_heads=8,
                        num_levels=3,
                        num_points=4,
                        im2col_step=64,
                        dropout=0.0,
                        batch_first=True,
                        norm_cfg=None,
                        init_cfg=None),
                    ffn_cfg=dict(
                        embed_dims=256,
                        feedforward_channels=1024,
                        num_fcs=2,
                        ffn_drop=0.0,
                        act_cfg=dict(type='ReLU', inplace=True))),
                init_cfg=None),
            positional_encoding=dict(num_feats=128, normalize=True),
            init_cfg=None),
        enforce_decoder_input_project=False,
        positional_encoding=dict(num_feats=128, normalize=True),
        transformer_decoder=dict(
            return_intermediate=True,
            num_layers=9,
            layer_cfg=dict(
                self_attn_cfg=dict(
                    embed_dims=256,
                    num_heads=8,
                    attn_drop=0.0,
                    proj_drop=0.0,
                    dropout_layer=None,
                    batch_first=True),
                cross_attn_cfg=dict(
                    embed_dims=256,
                    num_heads=8,
                    attn_drop=0.0,
                    proj_drop=0.0,
                    dropout_layer=None,
                    batch_first=True),
                ffn_cfg=dict(
                    embed_dims=256,
                    feedforward_channels=2048,
                    num_fcs=2,
                    act_cfg=dict(type='ReLU', inplace=True),
                    ffn_drop=0.0,
                    dropout_layer=None,
                    add_identity=True)),
            init_cfg=None),
        loss_cls=dict(
            type='mmdet.CrossEntropyLoss',
            use_sigmoid=False,
            loss_weight=2.0,
            reduction='mean',
            class_weight=[1.0] * num_classes + [0.1]),
        loss_mask=dict(
            type='mmdet.CrossEntropyLoss', use_sigmoid=True, reduction='mean', loss_weight=5.0),
        loss_dice=dict(
            type='mmdet.DiceLoss',
            use_sigmoid=True,
            activate=True,
            reduction='mean',
            naive_dice=True,
            eps=1.0,
            loss_weight=5.0),
        train_cfg=dict(
            num_points=12544,
            oversample_ratio=3.0,
            importance_sample_ratio=0.75,
            assigner=dict(
                type='mmdet.HungarianAssigner',
                match_costs=[
                    dict(type='mmdet.ClassificationCost', weight=2.0),
                    dict(type='mmdet.CrossEntropyLossCost', weight=5.0, use_sigmoid=True),
                    dict(type='mmdet.DiceCost', weight=5.0, pred_act=True, eps=1.0),
                ]),
            sampler=dict(type='mmdet.MaskPseudoSampler'))),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))
