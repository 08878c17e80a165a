"""A checkpoint learned on another position grid loads through mmengine's ``init_weights``.

mmengine builds the optimizer and the DDP wrapper before ``init_weights`` and refuses any
parameter replaced during it, so the backbone must resample the checkpoint, not re-create
``pos_embed``.
"""
import torch
from mmengine.registry import init_default_scope

from mmlinvit.backbones import VisionTransformer

TINY = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)


def test_other_grid_checkpoint_through_encoder_decoder_init_weights(tmp_path):
    src = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8)  # 4 x 4 grid
    ckpt = tmp_path / 'deit_4x4.pth'
    torch.save(src.state_dict(), ckpt)

    init_default_scope('mmseg')
    from mmseg.registry import MODELS
    model = MODELS.build(
        dict(type='EncoderDecoder',
             data_preprocessor=dict(type='SegDataPreProcessor', mean=[0.] * 3, std=[1.] * 3),
             backbone=dict(type='mmlinvit.LinearVisionTransformer', arch=TINY, family='deit',
                           img_size=64, patch_size=8, out_type='featmap', out_indices=[0, 1],
                           pretrained=str(ckpt)),
             decode_head=dict(type='FCNHead', in_channels=32, in_index=1, channels=16,
                              num_convs=1, num_classes=3,
                              norm_cfg=dict(type='BN', requires_grad=True)),
             train_cfg=dict(), test_cfg=dict(mode='whole')))
    pos_param = model.backbone.pos_embed
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # holds the parameter objects
    model.init_weights()
    assert model.backbone.pos_embed is pos_param and pos_param.shape == (1, 1 + 64, 32)
    torch.testing.assert_close(model.backbone.blocks[1].mlp.fc1.weight, src.blocks[1].mlp.fc1.weight)
    loss = model(torch.randn(2, 3, 64, 64), mode='tensor').sum()
    loss.backward()
    optimizer.step()
    assert pos_param.grad is not None
