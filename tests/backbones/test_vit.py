"""Teacher ViT skeleton: families, resolutions, outputs, hook points, layer depth."""
import pytest
import torch

from mmlinvit.backbones import FAMILY_SIZES, VIT_FAMILIES, VIT_SIZES, VisionTransformer

TINY = dict(embed_dims=32, num_layers=3, num_heads=2, mlp_hidden_dims=64)


@pytest.mark.parametrize('family', sorted(VIT_FAMILIES))
@pytest.mark.parametrize('hw', [(32, 32), (28, 56)])
def test_families_any_resolution(family, hw):
    patch = 14 if family == 'dinov2' else 16
    h, w = hw[0] // 8 * patch // 2, hw[1] // 8 * patch // 2  # a few patches per side
    model = VisionTransformer(TINY, family=family, img_size=2 * patch, out_type='featmap',
                              out_indices=[0, 2]).eval()
    outs = model(torch.randn(2, 3, h, w))
    assert len(outs) == 2
    for out in outs:  # inputs are corner-padded to whole patches
        assert out.shape == (2, 32, -(-h // patch), -(-w // patch))


@pytest.mark.parametrize('out_type,shape', [('raw', (2, 1 + 4 + 16, 32)), ('cls_token', (2, 32)),
                                            ('avg_featmap', (2, 32)), ('featmap', (2, 32, 4, 4))])
def test_out_types_with_registers(out_type, shape):
    model = VisionTransformer(TINY, family='dinov2', img_size=56, num_reg_tokens=4,
                              out_type=out_type).eval()
    assert model.num_prefix_tokens == 5
    assert model(torch.randn(2, 3, 56, 56))[0].shape == shape


def test_avg_featmap_excludes_prefix_tokens():
    model = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8, out_type='raw').eval()
    x = torch.randn(1, 3, 32, 32)
    raw = model(x)[0]
    model.out_type = 'avg_featmap'
    torch.testing.assert_close(model(x)[0], raw[:, 1:].mean(1))


@pytest.mark.parametrize('family,size', [('dinov2', 518), ('dinov2', 512), ('deit', 512),
                                         ('clip', 1024)])
def test_high_resolution_position_grids(family, size):
    # Only the embedding stage: resampling to the big grids the segmentation configs use.
    model = VisionTransformer(TINY, family=family)
    tokens, hw = model.prepare_tokens(torch.randn(1, 3, size, size if size != 1024 else 512))
    patch = model.patch_size
    assert hw == (-(-size // patch), -(-(size if size != 1024 else 512) // patch))
    assert tokens.shape[1] == 1 + hw[0] * hw[1]


def test_dinov2_interpolation_differs_from_plain_bicubic():
    a = VisionTransformer(TINY, family='dinov2', img_size=56)
    b = VisionTransformer(TINY, family='dinov2', img_size=56, pos_interp='bicubic')
    b.load_state_dict(a.state_dict())
    pa = a.patch_pos_embed((6, 5), 'cpu', torch.float32)
    pb = b.patch_pos_embed((6, 5), 'cpu', torch.float32)
    assert pa.shape == pb.shape == (1, 30, 32)
    assert not torch.allclose(pa, pb)
    # Same grid: both return the stored embeddings untouched.
    torch.testing.assert_close(a.patch_pos_embed((4, 4), 'cpu', torch.float32), a.pos_embed[:, 1:])


def test_checkpoint_grid_is_resampled_on_load_keeping_the_parameter():
    from mmlinvit.layers.pos_embed import resample_pos_grid
    src = VisionTransformer(TINY, family='dinov2', img_size=14 * 5)
    dst = VisionTransformer(TINY, family='dinov2', img_size=14 * 3)
    param = dst.pos_embed
    dst.load_state_dict(src.state_dict())
    assert dst.pos_embed is param and dst.pos_grid == (3, 3)
    expected = resample_pos_grid(src.pos_embed[:, 1:], (5, 5), (3, 3), 'dinov2')
    torch.testing.assert_close(dst.pos_embed[:, 1:], expected)
    torch.testing.assert_close(dst.pos_embed[:, :1], src.pos_embed[:, :1])


def test_hook_points_record_block_input_and_attention_output():
    model = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8).eval()
    seen = {}
    model.blocks[1].register_forward_pre_hook(lambda m, args: seen.__setitem__('in', args[0]))
    model.blocks[1].attn.register_forward_hook(lambda m, a, out: seen.__setitem__('attn', out))
    model(torch.randn(2, 3, 32, 32))
    assert seen['in'].shape == seen['attn'].shape == (2, 17, 32)
    recomputed = model.blocks[1].forward_attn(seen['in'], (4, 4), 1)
    torch.testing.assert_close(recomputed, seen['attn'])


def test_get_layer_depth():
    model = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8)
    assert model.get_layer_depth('backbone.cls_token', 'backbone.') == (0, 5)
    assert model.get_layer_depth('backbone.patch_embed.proj.weight', 'backbone.') == (0, 5)
    assert model.get_layer_depth('backbone.blocks.2.mlp.fc1.weight', 'backbone.') == (3, 5)
    assert model.get_layer_depth('backbone.norm.weight', 'backbone.') == (4, 5)
    assert model.get_layer_depth('decode_head.conv_seg.weight', 'backbone.') == (4, 5)


def test_clip_pre_norm_decays_with_the_stem_as_in_timm():
    """CLIP's ``ln_pre`` sits before block 0 and takes the stem's depth, as timm's layer
    decay gives ``norm_pre`` (its group_matcher names it in the stem; mmpretrain's and mmseg's
    ViT depth rules give it the last depth, an accident of their catch-all branch)."""
    timm = pytest.importorskip('timm')
    from timm.optim._param_groups import param_groups_layer_decay
    reference = timm.create_model('vit_base_patch16_clip_224', pretrained=False, img_size=32,
                                  depth=3, embed_dim=64, num_heads=2)
    scales = {}
    for group in param_groups_layer_decay(reference, weight_decay=0.05, layer_decay=0.65):
        for name, param in reference.named_parameters():
            if any(param is other for other in group['params']):
                scales[name] = group['lr_scale']
    assert scales['norm_pre.weight'] == scales['cls_token'] < scales['blocks.0.norm1.weight']
    model = VisionTransformer(TINY, family='clip', img_size=32, patch_size=8)
    assert model.get_layer_depth('backbone.pre_norm.weight', 'backbone.') == \
        model.get_layer_depth('backbone.cls_token', 'backbone.') == (0, 5)


def test_frozen_stages():
    model = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8, frozen_stages=2)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert 'pos_embed' in frozen and 'blocks.1.attn.qkv.weight' in frozen
    assert 'blocks.2.attn.qkv.weight' not in frozen
    model.train()
    assert not model.blocks[0].training and model.blocks[2].training
    assert model.norm.weight.requires_grad  # the final norm trains while a block does
    probe = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8,
                              frozen_stages=TINY['num_layers'])
    assert not any(p.requires_grad for p in probe.parameters())  # final norm included
    probe.train()
    assert not probe.norm.training
    # 0 freezes nothing, as mmpretrain's ViT (it froze the patch embedding and tokens)
    none = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8, frozen_stages=0)
    assert all(p.requires_grad for p in none.parameters())
    # mmpretrain's avg_featmap output norm is frozen with every block
    avg = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8,
                            frozen_stages=TINY['num_layers'], out_type='avg_featmap',
                            avg_featmap_norm=True)
    assert not any(p.requires_grad for p in avg.parameters())


def test_arch_zoo_sizes_build_on_meta_device():
    with torch.device('meta'):
        for family, sizes in FAMILY_SIZES.items():
            for size in sizes:
                model = VisionTransformer(size, family=family)
                assert model.embed_dims == VIT_SIZES[size]['embed_dims']
    with torch.device('meta'):
        giant = VisionTransformer('g', family='dinov2')
    assert giant.blocks[0].mlp.fc1.weight.shape == (2 * 4096, 1536)


def test_bad_configs_fail_clearly():
    with pytest.raises(KeyError, match='available'):
        VisionTransformer('xxl')
    with pytest.raises(KeyError, match='Registered attention operators'):
        VisionTransformer(TINY, attn_cfg='no_such_operator')
    with pytest.raises(ValueError, match='avg_featmap'):
        VisionTransformer(TINY, with_cls_token=False, out_type='cls_token')
    with pytest.raises(IndexError):
        VisionTransformer(TINY, out_indices=[7])


def _hub_register_interpolation(pos: torch.Tensor, src: int, hw) -> torch.Tensor:
    """The DINOv2 hub's interpolate_pos_encoding with interpolate_offset=0.0 and
    interpolate_antialias=True (dinov2_vit*14_reg), on the patch rows."""
    import torch.nn.functional as F
    dim = pos.shape[-1]
    grid = F.interpolate(pos.float().reshape(1, src, src, dim).permute(0, 3, 1, 2), size=hw,
                         mode='bicubic', antialias=True)
    return grid.permute(0, 2, 3, 1).reshape(1, -1, dim)


def test_dinov2_interpolation_follows_the_registers():
    plain = VisionTransformer(TINY, family='dinov2', img_size=56)
    reg = VisionTransformer(TINY, family='dinov2', img_size=56, num_reg_tokens=4)
    assert plain.pos_interp == 'dinov2' and reg.pos_interp == 'dinov2_reg'
    assert reg.pos_interp_source == "family 'dinov2' default with 4 register tokens"
    # Explicit choices win; other families keep theirs with registers.
    forced = VisionTransformer(TINY, family='dinov2', img_size=56, num_reg_tokens=4,
                               pos_interp='dinov2')
    assert forced.pos_interp == 'dinov2' and forced.pos_interp_source == 'explicit'
    assert VisionTransformer(TINY, family='deit', img_size=32, num_reg_tokens=2).pos_interp == \
        'bicubic'
    # The register mode is the hub formula (size=, antialias), not the plain one.
    for hw in ((6, 5), (9, 9), (3, 7)):
        got = reg.patch_pos_embed(hw, 'cpu', torch.float32)
        torch.testing.assert_close(got, _hub_register_interpolation(reg.pos_embed[:, 1:], 4, hw),
                                   atol=1e-6, rtol=0)
        plain.load_state_dict({k: v for k, v in reg.state_dict().items() if k != 'reg_token'})
        assert (plain.patch_pos_embed(hw, 'cpu', torch.float32) - got).abs().max() > 1e-3


def test_dinov2_register_interpolation_is_reported_at_load(tmp_path):
    src = VisionTransformer(TINY, family='dinov2', img_size=56, num_reg_tokens=4)
    path = str(tmp_path / 'reg.pth')
    torch.save(src.state_dict(), path)
    model = VisionTransformer(TINY, family='dinov2', img_size=56, num_reg_tokens=4,
                              pretrained=path)
    model.init_weights()
    assert any("pos_interp='dinov2_reg' (family 'dinov2' default with 4 register tokens"
               in note for note in model.load_report.notes), model.load_report.notes


def test_position_grid_is_the_padded_token_grid():
    """img_size=512 at patch 14 is a 37 x 37 token grid (corner padding), the hub's grid: a
    hub checkpoint is resampled neither at load nor for 512 inputs."""
    hub = VisionTransformer(TINY, family='dinov2')  # 518: 37 x 37
    model = VisionTransformer(TINY, family='dinov2', img_size=512)
    assert model.pos_grid == hub.pos_grid == (37, 37)
    model.load_state_dict(hub.state_dict())
    torch.testing.assert_close(model.pos_embed, hub.pos_embed, atol=0, rtol=0)
    _, hw = model.prepare_tokens(torch.zeros(1, 3, 512, 512))
    assert hw == (37, 37)
    torch.testing.assert_close(model.patch_pos_embed(hw, 'cpu', torch.float32),
                               hub.pos_embed[:, 1:], atol=0, rtol=0)


def test_pretrained_not_loaded_warns_and_transfer_refuses(tmp_path):
    """``pretrained=`` is read by init_weights(); a model built by hand and run (or used as a
    transfer teacher) without it would silently compute with random weights."""
    import warnings

    from mmlinvit.transfer import transfer_weights
    source = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8)
    path = str(tmp_path / 'teacher.pth')
    torch.save(source.state_dict(), path)
    teacher = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8, pretrained=path)
    student = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8, attn_cfg='elu')
    with pytest.raises(ValueError, match=r'never loaded.*teacher.init_weights\(\)'):
        transfer_weights(student, teacher, 'full_copy')
    x = torch.randn(1, 3, 32, 32)
    with pytest.warns(UserWarning, match=r'never loaded.*init_weights'):
        teacher(x)
    teacher.init_weights()
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        torch.testing.assert_close(teacher(x)[0], source(x)[0])
    transfer_weights(student, teacher, 'full_copy')
    # A checkpoint loaded through load_state_dict (mmengine's load_from) counts as loaded.
    again = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8, pretrained=path)
    again.load_state_dict(source.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        again(x)
