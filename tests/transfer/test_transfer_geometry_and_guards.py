"""Weight transfer beyond square grids and same-family teachers: position grids of another
shape, the student's position interpolation, teachers without a class token, the MLP
activation guard, LayerScale under MLPCopy, and the Impulse targets on non-square grids."""
import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.layers.pos_embed import resample_pos_grid
from mmlinvit.transfer import transfer_weights
from mmlinvit.transfer.impulse import impulse_targets

TINY = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)


def _randomized(model: VisionTransformer) -> VisionTransformer:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator))
    return model


def test_a_grid_with_as_many_cells_but_another_shape_is_resampled():
    """A 2 x 8 teacher grid into a 4 x 4 student: resampled, not copied row for row."""
    torch.manual_seed(0)
    teacher = VisionTransformer(TINY, img_size=(16, 64), patch_size=8)
    with torch.no_grad():
        teacher.pos_embed.normal_()
    student = VisionTransformer(TINY, attn_cfg='elu', img_size=32, patch_size=8)
    assert tuple(teacher.pos_grid) == (2, 8) and tuple(student.pos_grid) == (4, 4)
    report = transfer_weights(student, teacher, 'full_copy')
    pos = teacher.pos_embed.detach()
    expected = torch.cat([pos[:, :1], resample_pos_grid(pos[:, 1:], (2, 8), (4, 4),
                                                        student.pos_interp)], dim=1)
    assert 'pos_embed' in report.adapted, report.adapted
    torch.testing.assert_close(student.pos_embed.detach(), expected)


@pytest.mark.parametrize('interp', ['bicubic_antialias', 'dinov2', 'dinov2_reg'])
def test_the_grid_is_resampled_with_the_students_pos_interp(interp):
    torch.manual_seed(0)
    teacher = VisionTransformer(TINY, img_size=64, patch_size=8)  # 8 x 8
    with torch.no_grad():
        teacher.pos_embed.normal_()
    student = VisionTransformer(TINY, attn_cfg='elu', img_size=40, patch_size=8,
                                pos_interp=interp)  # 5 x 5: a downsample, antialias matters
    transfer_weights(student, teacher, 'full_copy')
    pos = teacher.pos_embed.detach()
    expected = torch.cat([pos[:, :1], resample_pos_grid(pos[:, 1:], (8, 8), (5, 5), interp)],
                         dim=1)
    plain = torch.cat([pos[:, :1], resample_pos_grid(pos[:, 1:], (8, 8), (5, 5), 'bicubic')],
                      dim=1)
    assert (expected - plain).abs().max() > 1e-3  # the modes differ here
    torch.testing.assert_close(student.pos_embed.detach(), expected)


def test_a_teacher_without_class_position_leaves_the_students_pos_embed():
    """Its first patch position must not become the student's class position."""
    teacher = _randomized(VisionTransformer(TINY, img_size=32, patch_size=8,
                                            with_cls_token=False, out_type='avg_featmap'))
    student = VisionTransformer(TINY, attn_cfg='elu', img_size=32, patch_size=8)
    before = student.pos_embed.detach().clone()
    report = transfer_weights(student, teacher, 'full_copy')
    assert 'pos_embed' in report.no_counterpart and 'pos_embed' not in report.copied
    assert torch.equal(student.pos_embed.detach(), before)


def test_mlp_copy_copies_the_mlp_layer_scale():
    teacher = _randomized(VisionTransformer(TINY, family='deit3', img_size=32, patch_size=8))
    student = VisionTransformer(TINY, family='deit3', attn_cfg='elu', img_size=32,
                                patch_size=8)
    report = transfer_weights(student, teacher, 'mlp_copy')
    for i in range(2):
        assert f'blocks.{i}.ls2.gamma' in report.copied
        assert torch.equal(student.blocks[i].ls2.gamma, teacher.blocks[i].ls2.gamma)


def test_a_teacher_with_another_mlp_activation_is_refused():
    teacher = VisionTransformer(TINY, img_size=32, patch_size=8, act='gelu')
    student = VisionTransformer(TINY, attn_cfg='elu', img_size=32, patch_size=8,
                                act='quick_gelu')
    with pytest.raises(ValueError, match='act='):
        transfer_weights(student, teacher, 'mlp_copy')


def test_impulse_targets_on_a_non_square_grid():
    """Query (r, c) attends to (r + dy, c + dx): raster index (r + dy) * w + (c + dx)."""
    assert impulse_targets((2, 3), (1, 0)).tolist() == [3, 4, 5, -1, -1, -1]
    assert impulse_targets((3, 2), (0, 1)).tolist() == [1, -1, 3, -1, 5, -1]
    assert impulse_targets((2, 3), (-1, -1)).tolist() == [-1, -1, -1, -1, 0, 1]
