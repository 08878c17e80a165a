"""The neck of the UPerNet / Mask2Former configs: mmseg's Feature2Pyramid, whose 0.5x level
covers the whole patch grid also when its sides are odd (518 px at patch 14: 37 patches)."""
import math

import pytest
import torch
from mmseg.models.necks import Feature2Pyramid

from mmlinvit.models.necks import CoveringMaxPool2d, FullGridFeature2Pyramid
from seg_helpers import tiny_config

BN = dict(type='BN', requires_grad=True)


@pytest.mark.parametrize('factor', [2, 4])
@pytest.mark.parametrize('size', [(37, 37), (37, 74), (36, 37), (73, 50), (5, 3), (16, 24)])
def test_covering_pool_is_adaptive_max_pooling(factor, size):
    x = torch.randn(2, 3, *size, requires_grad=True)
    got = CoveringMaxPool2d(factor)(x)
    want = torch.nn.functional.adaptive_max_pool2d(
        x, (math.ceil(size[0] / factor), math.ceil(size[1] / factor)))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    grad = torch.randn_like(got)
    # overlapping windows: a position's gradients are summed in another order
    torch.testing.assert_close(torch.autograd.grad(got, x, grad)[0],
                               torch.autograd.grad(want, x, grad)[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize('rescales', [[4, 2, 1, 0.5], [2, 1, 0.5, 0.25]])
def test_even_grids_give_mmseg_values_with_the_same_keys(rescales):
    torch.manual_seed(0)
    ours = FullGridFeature2Pyramid(8, rescales, BN).eval()
    theirs = Feature2Pyramid(8, rescales, BN).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    inputs = [torch.randn(2, 8, 12, 20) for _ in rescales]
    for got, want in zip(ours(inputs), theirs(inputs)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def _patches_read(pool: torch.nn.Module, height: int, width: int):
    """For each output cell, the (row, col) input positions whose spike reaches it."""
    spikes = torch.eye(height * width).view(height * width, 1, height, width)
    out = pool(spikes)  # (positions, 1, oh, ow)
    reads = out[:, 0].flatten(1).T > 0  # (cells, positions)
    rows = torch.arange(height).repeat_interleave(width).float()
    cols = torch.arange(width).repeat(height).float()
    return out.shape[-2:], reads, rows, cols


@pytest.mark.parametrize('factor,size', [(2, (37, 37)), (2, (37, 74)), (2, (73, 73)),
                                         (4, (37, 50)), (2, (36, 36))])
def test_downsampled_levels_cover_odd_grids_where_the_decoder_puts_them(factor, size):
    """Every patch is read, and each cell reads patches centred within half a patch of the
    centre that mmdet's pixel decoder / UPerNet's resize give it ((i + 0.5) * H / h cells
    spanning the whole map).  MaxPool2d dropped the last row / column of odd grids (the 18
    cells of a 37-patch side sat up to 0.97 patch = 13.6 px at patch 14 off)."""
    height, width = size
    shape, reads, rows, cols = _patches_read(CoveringMaxPool2d(factor), height, width)
    assert tuple(shape) == (math.ceil(height / factor), math.ceil(width / factor))
    assert reads.any(dim=0).all(), 'a patch no cell reads'
    oh, ow = shape
    for cell in range(oh * ow):
        i, j = divmod(cell, ow)
        read = reads[cell]
        centre = (rows[read].mean() + 0.5, cols[read].mean() + 0.5)  # in patch units
        assumed = ((i + 0.5) * height / oh, (j + 0.5) * width / ow)
        assert abs(centre[0] - assumed[0]) <= 0.5 and abs(centre[1] - assumed[1]) <= 0.5, (
            cell, centre, assumed)


@pytest.mark.parametrize('rel', [
    'segmentation/mask2former_dinov2-l_8xb2-160k_ade20k-518x518.py',
    'segmentation/upernet_adala-dinov2-l-elu_8xb2-160k_ade20k-518x518.py'])
def test_shipped_518_configs_give_a_full_pyramid(rel, tmp_path):
    """The configs' own crop (518 = 37 patches of 14) and a 518 x 1036 Cityscapes window."""
    from mmengine.registry import init_default_scope

    from mmlinvit.registry import MODELS
    init_default_scope('mmseg')
    cfg = tiny_config(rel, str(tmp_path / 'data'), str(tmp_path / 'wd'))
    model = cfg.model.get('student', cfg.model)
    assert model['neck']['type'] == 'mmlinvit.FullGridFeature2Pyramid'
    segmentor = MODELS.build(model).eval()
    segmentor.init_weights()
    for size in ((518, 518), (518, 1036)):
        with torch.no_grad():
            levels = segmentor.extract_feat(torch.zeros(1, 3, *size))
        grid = (size[0] // 14, size[1] // 14)
        want = [(grid[0] * 4, grid[1] * 4), (grid[0] * 2, grid[1] * 2), grid,
                (math.ceil(grid[0] / 2), math.ceil(grid[1] / 2))]
        assert [tuple(level.shape[-2:]) for level in levels] == want
