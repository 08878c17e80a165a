"""Position grids learned at non-square image sizes survive saving and loading.

A checkpoint's ``pos_embed`` row count does not say its grid: 16 x 64 = 1024 rows is also
the 32 x 32 grid's count, and 32 x 64 = 2048 (the Cityscapes crop at patch 16) is no square
at all.  The backbones record the grid (``pos_embed_grid``) with the weights; every loading
path resamples from the recorded grid.  The reference is a bicubic resampling of the true grid,
written out here with ``F.interpolate`` (mmseg / mmpretrain's convention, ``pos_interp=
'bicubic'``).
"""
import pytest
import torch
import torch.nn.functional as F

from mmlinvit.backbones import Adventurer, VisionTransformer
from mmlinvit.converters import load_pretrained
from mmlinvit.transfer import transfer_weights

ARCH = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
PATCH = 8


def vit(img_size, **kwargs) -> VisionTransformer:
    return VisionTransformer(arch=ARCH, family='deit', img_size=img_size, patch_size=PATCH,
                             pos_interp='bicubic', **kwargs)


def coordinate_grid(model) -> torch.Tensor:
    """Writes (row index, column index, noise...) into the model's patch positions."""
    rows, cols = model.pos_grid
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        pos = torch.randn(model.pos_embed.shape, generator=gen)
        grid = torch.stack(torch.meshgrid(torch.arange(rows, dtype=torch.float32),
                                          torch.arange(cols, dtype=torch.float32),
                                          indexing='ij'), dim=-1).reshape(1, rows * cols, 2)
        start = int(getattr(model, 'with_cls_token', False))
        pos[:, start:start + rows * cols, :2] = grid
        model.pos_embed.copy_(pos)
    return pos


def expected(patches: torch.Tensor, src, dst) -> torch.Tensor:
    """(1, src_h * src_w, C) -> (1, dst_h * dst_w, C), bicubic, align_corners=False."""
    c = patches.shape[-1]
    grid = patches.reshape(1, src[0], src[1], c).permute(0, 3, 1, 2)
    out = F.interpolate(grid, size=dst, mode='bicubic', align_corners=False)
    return out.permute(0, 2, 3, 1).reshape(1, dst[0] * dst[1], c)


def test_non_square_grid_with_a_square_count_is_resampled_from_its_true_shape(tmp_path):
    source = vit((16 * PATCH, 64 * PATCH))  # 16 x 64 = 1024 = 32 x 32
    pos = coordinate_grid(source)
    assert source.pos_embed_grid.tolist() == [16, 64]
    target_grid = (24, 48)
    want = expected(pos[:, 1:], (16, 64), target_grid)

    # load_state_dict (runner checkpoints, load_from, resume)
    model = vit((24 * PATCH, 48 * PATCH))
    model.load_state_dict(source.state_dict())
    assert torch.allclose(model.pos_embed[:, 1:], want, atol=1e-5)
    assert torch.equal(model.pos_embed[:, :1], pos[:, :1])
    assert model.pos_embed_grid.tolist() == list(target_grid)  # the model's own grid

    # pretrained= (the converters)
    path = str(tmp_path / 'wide.pth')
    torch.save(source.state_dict(), path)
    model = vit((24 * PATCH, 48 * PATCH))
    report = load_pretrained(model, path)
    assert torch.allclose(model.pos_embed[:, 1:], want, atol=1e-5)
    assert 'from a 16x64 grid to the model grid 24x48' in report.summary()
    assert model.pos_embed_grid.tolist() == list(target_grid)

    # weight transfer from a teacher backbone
    student = vit((24 * PATCH, 48 * PATCH), attn_cfg='elu')
    transfer_weights(student, source, 'full_copy')
    assert torch.allclose(student.pos_embed[:, 1:], want, atol=1e-5)


def test_same_count_other_shape_is_resampled():
    """A 32 x 64 grid into a 64 x 32 model: same row count, transposed grid."""
    source = vit((32 * PATCH, 64 * PATCH))
    pos = coordinate_grid(source)
    model = vit((64 * PATCH, 32 * PATCH))
    model.load_state_dict(source.state_dict())
    assert torch.allclose(model.pos_embed[:, 1:], expected(pos[:, 1:], (32, 64), (64, 32)),
                          atol=1e-5)


def test_adventurer_cityscapes_grid_loads_into_a_square_model():
    """The Cityscapes Adventurer's 32 x 64 grid (2048 rows, no square) into a 512 model."""
    kwargs = dict(arch=dict(embed_dims=32, num_layers=2), patch_size=PATCH,
                  mixer_cfg=dict(d_state=8, headdim=16, chunk_size=16))
    source = Adventurer(img_size=(4 * PATCH, 8 * PATCH), **kwargs)
    pos = coordinate_grid(source)  # Adventurer's class position is last
    model = Adventurer(img_size=6 * PATCH, **kwargs)
    model.load_state_dict(source.state_dict())
    assert torch.allclose(model.pos_embed[:, :-1], expected(pos[:, :-1], (4, 8), (6, 6)),
                          atol=1e-5)
    assert torch.equal(model.pos_embed[:, -1:], pos[:, -1:])


def test_unrecorded_non_square_grid_is_refused_with_the_fix():
    source = vit((4 * PATCH, 8 * PATCH))
    state = {k: v for k, v in source.state_dict().items() if k != 'pos_embed_grid'}
    with pytest.raises(ValueError, match=r'no square grid.*img_size=\(512, 1024\)'):
        vit(6 * PATCH).load_state_dict(state)
    # the same file with the grid of the model that wrote it loads as it is
    same = vit((4 * PATCH, 8 * PATCH))
    same.load_state_dict(state)
    assert torch.equal(same.pos_embed, source.pos_embed)


def test_official_square_checkpoints_load_as_before():
    """Files without the record (official releases) are read as square grids."""
    source = vit(4 * PATCH)
    pos = coordinate_grid(source)
    state = {k: v for k, v in source.state_dict().items() if k != 'pos_embed_grid'}
    model = vit((6 * PATCH, 3 * PATCH))
    model.load_state_dict(state)
    assert torch.allclose(model.pos_embed[:, 1:], expected(pos[:, 1:], (4, 4), (6, 3)),
                          atol=1e-5)


def test_an_inconsistent_record_is_named(tmp_path):
    """pos_embed resampled by hand to another row count, the record left as it was."""
    source = vit((4 * PATCH, 8 * PATCH))
    state = source.state_dict()
    state['pos_embed'] = state['pos_embed'][:, :1 + 24]  # 24 rows, the record says 4x8
    path = str(tmp_path / 'edited.pth')
    torch.save(state, path)
    with pytest.raises(ValueError, match='records a 4x8 position grid.*inconsistent'):
        load_pretrained(vit(6 * PATCH), path)
    with pytest.raises(ValueError, match='inconsistent'):
        vit(6 * PATCH).load_state_dict(state)
