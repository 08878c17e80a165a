"""Inputs whose side is not a multiple of the patch size are padded, not cropped.

References: mmseg's own ``VisionTransformer`` (``PatchEmbed`` with ``AdaptivePadding``,
``padding='corner'``) for the grid size, and timm's ``dynamic_img_pad=True`` for the values
(zero padding at the bottom / right before the patch projection).  On the old code the last
``H % p`` rows / ``W % p`` columns were dropped: their gradient was exactly zero.
"""
import math

import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.backbones.adventurer import Adventurer
from mmlinvit.layers.patch_embed import patch_grid

TINY = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)


def _border_gradients(model: torch.nn.Module, h: int, w: int, patch: int):
    """|d out / d x| summed over the last h % p rows and the last w % p columns, and the grid."""
    x = torch.randn(1, 3, h, w, requires_grad=True)
    feat = model(x)[-1]
    weights = torch.randn(feat.shape, generator=torch.Generator().manual_seed(1))
    (feat * weights).sum().backward()
    rows = x.grad[:, :, h - h % patch:, :].abs().sum().item()
    cols = x.grad[:, :, :, w - w % patch:].abs().sum().item()
    return rows, cols, tuple(feat.shape[-2:])


@pytest.mark.parametrize('family,patch,hw', [('deit', 16, (500, 500)), ('dinov2', 14, (60, 45))])
def test_vit_border_pixels_influence_the_output(family, patch, hw):
    model = VisionTransformer(TINY, family=family, img_size=64 if patch == 16 else 56,
                              out_type='featmap', out_indices=[1]).eval()
    rows, cols, grid = _border_gradients(model, *hw, patch)
    assert grid == (math.ceil(hw[0] / patch), math.ceil(hw[1] / patch))  # 500 / 16 -> 32, not 31
    assert rows > 0 and cols > 0, (rows, cols)


def test_adventurer_border_pixels_influence_the_output():
    torch.manual_seed(0)
    model = Adventurer(dict(embed_dims=32, num_layers=2), img_size=64,
                       mixer_cfg=dict(d_state=8, headdim=16, chunk_size=16),
                       out_type='featmap', out_indices=[-1]).eval()
    rows, cols, grid = _border_gradients(model, 500, 500, 16)
    assert grid == (32, 32)
    assert rows > 0 and cols > 0, (rows, cols)


def test_divisible_inputs_unchanged_and_padding_is_zeros():
    """A 40 x 44 input gives exactly the tokens of the same input zero-padded to 48 x 48."""
    model = VisionTransformer(TINY, family='deit', img_size=48, out_type='raw').eval()
    x = torch.randn(2, 3, 40, 44)
    padded = torch.zeros(2, 3, 48, 48)
    padded[..., :40, :44] = x
    with torch.no_grad():
        got, hw = model.forward_tokens(x)
        ref, ref_hw = model.forward_tokens(padded)
    assert hw == ref_hw == (3, 3) == patch_grid((40, 44), 16)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize('patch', [16, 14])
def test_grid_matches_mmseg_vit(patch):
    """The official mmseg ViT and mmlinvit agree on the padded grid for odd sizes."""
    from mmseg.models.backbones import VisionTransformer as MMSegViT
    theirs = MMSegViT(img_size=(4 * patch, 4 * patch), patch_size=patch, embed_dims=32,
                      num_layers=1, num_heads=2, mlp_ratio=2, out_indices=(0, ),
                      with_cls_token=True, output_cls_token=False)
    theirs.eval()  # mmseg's ViT.train() returns None
    ours = VisionTransformer(TINY, family='deit', patch_size=patch, img_size=4 * patch,
                             out_type='featmap', out_indices=[0]).eval()
    sizes = [(500, 500), (33, 47), (4 * patch + 1, 4 * patch - 1), (patch + 1, 2 * patch)]
    for h, w in sizes:
        x = torch.randn(1, 3, h, w)
        with torch.no_grad():
            ref = theirs(x)[0].shape[-2:]
            got = ours(x)[0].shape[-2:]
        assert tuple(got) == tuple(ref) == patch_grid((h, w), patch), (h, w, got, ref)


TIMM_CASES = {
    # name: (timm model, timm kwargs, our family, our kwargs, input sizes)
    'deit': ('deit_small_patch16_224', dict(img_size=64, depth=2), 'deit',
             dict(img_size=64), [(50, 60), (90, 41)]),
    'dinov2': ('vit_small_patch14_dinov2', dict(img_size=98, depth=2), 'dinov2',
               dict(img_size=98), [(95, 90), (60, 100)]),
}


@pytest.mark.parametrize('case', sorted(TIMM_CASES))
def test_padding_matches_timm_dynamic_img_pad(case):
    """Values at odd sizes equal timm's ``dynamic_img_size=True, dynamic_img_pad=True``."""
    timm = pytest.importorskip('timm')
    from mmlinvit.converters import load_pretrained
    name, timm_kw, family, ours_kw, sizes = TIMM_CASES[case]
    ref = timm.create_model(name, pretrained=False, dynamic_img_size=True, dynamic_img_pad=True,
                            **timm_kw).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, p in ref.named_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    ours = VisionTransformer(dict(embed_dims=384, num_layers=2, num_heads=6,
                                  mlp_hidden_dims=1536), family=family, out_type='raw',
                             pos_interp='bicubic_antialias', **ours_kw).eval()
    load_pretrained(ours, ref.state_dict(), layout='auto')
    for h, w in sizes:
        x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h * w))
        with torch.no_grad():
            expected = ref.forward_features(x)
            got = ours.forward_tokens(x)[0]
        assert got.shape == expected.shape, (case, h, w)
        err = (got - expected).abs().max().item()
        assert err <= 1e-5, f'{case} at {h}x{w}: max abs diff {err:.3g}'
