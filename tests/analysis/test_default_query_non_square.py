"""``compare_teacher_student``'s default query is the middle patch (h // 2, w // 2) of a
non-square grid, in (row, column) order."""
import torch

from mmlinvit.analysis import compare_teacher_student
from mmlinvit.backbones import VisionTransformer

TINY = dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32)


def test_default_query_is_row_then_column_of_the_centre():
    torch.manual_seed(0)
    teacher = VisionTransformer(TINY, attn_cfg='softmax', img_size=(48, 32), patch_size=8).eval()
    student = VisionTransformer(TINY, attn_cfg='elu', img_size=(48, 32), patch_size=8).eval()
    student.load_state_dict(teacher.state_dict())
    images = torch.randn(1, 3, 48, 32)  # grid (h, w) = (6, 4)
    cmp = compare_teacher_student(teacher, student, images)
    assert cmp.teacher_attention.shape[1:] == (6, 4)
    assert cmp.query == (3, 2)
    explicit = compare_teacher_student(teacher, student, images, query=(3, 2))
    torch.testing.assert_close(cmp.teacher_attention, explicit.teacher_attention)
