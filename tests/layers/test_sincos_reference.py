"""The fixed 2-D sin-cos position embedding against its published definition.

Guards :func:`mmlinvit.layers.pos_embed.sincos_pos_embed_2d`, the position code of every
``pos_embed_type='sincos'`` backbone (the MHLA / TTT students of seed 000).  Its docstring
says it follows MoCo-v3's ``build_2d_sincos_position_embedding`` layout: for the patch token
``t = r * w + c`` of an (h, w) grid (row-major, as the patch embedding flattens its NCHW map) and
``D / 4`` frequencies ``omega_k = 1 / T^(k / (D / 4))`` (T = 10000, k = 0 .. D/4 - 1)::

    pe[t] = [sin(r omega), cos(r omega), sin(c omega), cos(c omega)]

i.e. the first half of the channels encodes the row, the second half the column.  MAE's
``get_2d_sincos_pos_embed`` (facebookresearch/mae ``util/pos_embed.py``) has the same
frequencies and the same [sin, cos] halves, but puts the column half first (its ``grid[0]`` comes
from ``meshgrid(grid_w, grid_h)``, "here w goes first"); the project chose MoCo-v3's order.
Nothing compared the embedding with a formula, and swapping the row and column halves (the MAE
order, or a transposed grid) passed every test (mutation-audit survivor m37) although it
changes every sin-cos model and no longer matches the weights trained with it.

The references below are written from those definitions in fp64 (not copied); non-square grids
pin the orientation, which square grids alone cannot (a transposed square grid is a permutation
of the same rows).
"""
import math

import pytest
import torch

from mmlinvit.backbones.vit import VisionTransformer
from mmlinvit.layers.pos_embed import sincos_pos_embed_2d

TEMPERATURE = 10000.0


def _frequencies(dims: int, temperature: float = TEMPERATURE) -> torch.Tensor:
    """omega_k = temperature^(-k / (dims / 4)), k = 0 .. dims / 4 - 1 (fp64)."""
    quarter = dims // 4
    return torch.tensor([temperature**(-k / quarter) for k in range(quarter)],
                        dtype=torch.float64)


def _reference_rows_first(h: int, w: int, dims: int,
                          temperature: float = TEMPERATURE) -> torch.Tensor:
    """MoCo-v3 order: [sin(r w), cos(r w), sin(c w), cos(c w)] for token t = r * w + c."""
    omega = _frequencies(dims, temperature)
    rows = []
    for r in range(h):
        for c in range(w):
            rows.append(torch.cat([torch.sin(r * omega), torch.cos(r * omega),
                                   torch.sin(c * omega), torch.cos(c * omega)]))
    return torch.stack(rows).unsqueeze(0)


def _reference_mae_order(h: int, w: int, dims: int) -> torch.Tensor:
    """MAE's get_2d_sincos_pos_embed order: the column half first, then the row half."""
    omega = _frequencies(dims)
    out = torch.empty(h * w, dims, dtype=torch.float64)
    for r in range(h):
        for c in range(w):
            out[r * w + c] = torch.cat([torch.sin(c * omega), torch.cos(c * omega),
                                        torch.sin(r * omega), torch.cos(r * omega)])
    return out.unsqueeze(0)


@pytest.mark.parametrize('h,w', [(4, 4), (14, 14), (3, 5), (5, 3), (1, 7), (7, 1), (2, 9)])
@pytest.mark.parametrize('dims', [16, 64])
def test_matches_the_moco_v3_definition(h, w, dims):
    pe = sincos_pos_embed_2d((h, w), dims)
    assert pe.shape == (1, h * w, dims) and pe.dtype == torch.float32
    torch.testing.assert_close(pe.double(), _reference_rows_first(h, w, dims),
                               atol=2e-6, rtol=0)


def test_temperature_and_dtype():
    pe = sincos_pos_embed_2d((3, 5), 32, temperature=100.0, dtype=torch.float64)
    assert pe.dtype == torch.float64
    torch.testing.assert_close(pe, _reference_rows_first(3, 5, 32, temperature=100.0),
                               atol=2e-6, rtol=0)


def test_is_mae_with_the_halves_swapped():
    """The documented relation to MAE: same values, row and column halves exchanged."""
    h, w, dims = 3, 5, 32
    pe = sincos_pos_embed_2d((h, w), dims).double()
    mae = _reference_mae_order(h, w, dims)
    swapped = torch.cat([mae[..., dims // 2:], mae[..., :dims // 2]], dim=-1)
    torch.testing.assert_close(pe, swapped, atol=2e-6, rtol=0)
    assert (pe - mae).abs().max() > 0.5  # MAE's own order is not what is computed


def test_orientation_on_a_non_square_grid():
    """Tokens of one row share the first half; tokens of one column share the second half;
    the first channel is sin(row) (omega_0 = 1)."""
    h, w, dims = 3, 5, 16
    pe = sincos_pos_embed_2d((h, w), dims)[0].reshape(h, w, dims)
    half = dims // 2
    for r in range(h):
        for c in range(1, w):
            assert torch.equal(pe[r, c, :half], pe[r, 0, :half])
        assert pe[r, 0, 0].item() == pytest.approx(math.sin(r), abs=1e-6)
    for c in range(w):
        for r in range(1, h):
            assert torch.equal(pe[r, c, half:], pe[0, c, half:])
        assert pe[0, c, half].item() == pytest.approx(math.sin(c), abs=1e-6)
    assert not torch.equal(pe[0, 1, :half], pe[1, 0, :half])


def test_backbone_adds_it_in_patch_order_on_a_non_square_input():
    """A ``pos_embed_type='sincos'`` ViT on a 48 x 80 image (a 3 x 5 patch grid): the patch
    embedding's grid and token order are the ones the formula indexes."""
    torch.manual_seed(0)
    model = VisionTransformer(arch=dict(embed_dims=32, num_layers=1, num_heads=2,
                                        mlp_hidden_dims=64),
                              img_size=64, patch_size=16, pos_embed_type='sincos',
                              with_cls_token=False, out_type='raw').eval()
    image = torch.randn(1, 3, 48, 80)
    tokens, hw_shape = model.patch_embed(image)
    assert tuple(hw_shape) == (3, 5)
    pos = model.patch_pos_embed(hw_shape, tokens.device, tokens.dtype)
    torch.testing.assert_close(pos.double(), _reference_rows_first(3, 5, 32), atol=2e-6, rtol=0)
    # Patch t = r * 5 + c of the token sequence is the image patch at row r, column c.
    r, c = 2, 1
    patch = image[:, :, 16 * r:16 * (r + 1), 16 * c:16 * (c + 1)]
    one = torch.zeros_like(image)
    one[:, :, 16 * r:16 * (r + 1), 16 * c:16 * (c + 1)] = patch
    with torch.no_grad():
        single, _ = model.patch_embed(one)
        bias_only, _ = model.patch_embed(torch.zeros_like(image))
    changed = (single - bias_only).abs().sum(-1)[0].nonzero().flatten().tolist()
    assert changed == [r * 5 + c]
