"""Where a linearized student differs from its softmax teacher, patch by patch (torch only).

:func:`compare_teacher_student` runs both ViTs on the same images and returns, on the patch
grid: the attention of one query patch in the teacher (softmax) and the student (the linear
operator's implied map), their difference, the first three principal components of both
models' final patch features in the teacher's PCA basis (as RGB), and the per-patch cosine
gap ``1 - cos(f_teacher, f_student)`` of those features.
"""
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention_maps import query_attention_maps
from .feature_pca import patch_features, pca_rgb


@dataclass
class TeacherStudentComparison:
    """Per-image maps on the (h, w) patch grid (B = number of images).

    Attributes:
        query: The query patch (row, col) of the attention maps.
        layer: The block whose attention maps are shown.
        teacher_attention: (B, h, w) attention of the query to every patch (mean over heads).
        student_attention: (B, h, w) the student's implied map for the same query.
        attention_difference: (B, h, w) student minus teacher.
        attention_tv: (B,) total-variation distance ``0.5 * sum |difference|`` over patches.
        teacher_pca: (B, h, w, 3) teacher features on the teacher's first 3 components, RGB.
        student_pca: (B, h, w, 3) student features on the same components and colour range.
        explained_variance: (3,) share of the teacher's feature variance per component.
        feature_cosine_gap: (B, h, w) ``1 - cos(teacher feature, student feature)``.
    """
    query: Tuple[int, int]
    layer: int
    teacher_attention: torch.Tensor
    student_attention: torch.Tensor
    attention_difference: torch.Tensor
    attention_tv: torch.Tensor
    teacher_pca: torch.Tensor
    student_pca: torch.Tensor
    explained_variance: torch.Tensor
    feature_cosine_gap: torch.Tensor


def feature_cosine_gap(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """``1 - cos`` between matching feature vectors (last dimension), in [0, 2].

    Args:
        teacher: (..., C) features.
        student: (..., C) features of the same shape.
    """
    if teacher.shape != student.shape:
        raise ValueError(f'teacher features {tuple(teacher.shape)} and student features '
                         f'{tuple(student.shape)} differ in shape')
    return 1.0 - F.cosine_similarity(teacher.float(), student.float(), dim=-1, eps=1e-8)


def compare_teacher_student(teacher: nn.Module,
                            student: nn.Module,
                            images: torch.Tensor,
                            query: Optional[Tuple[int, int]] = None,
                            layer: int = -1) -> TeacherStudentComparison:
    """Attention maps, feature PCA and feature gaps of a teacher and its student.

    Args:
        teacher: Softmax VisionTransformer.
        student: Linearized VisionTransformer of the same width, patch size and depth.
        images: (B, 3, H, W) normalised images.
        query: Query patch (row, col); ``None`` for the centre of the grid.
        layer: Block of the attention maps (negative allowed).

    Returns:
        The maps (see :class:`TeacherStudentComparison`).
    """
    if teacher.patch_size != student.patch_size:
        raise ValueError(f'teacher patch size {teacher.patch_size} and student patch size '
                         f'{student.patch_size} differ; the maps would not share a grid')
    depth = len(teacher.blocks)
    if len(student.blocks) != depth:
        raise ValueError(f'teacher has {depth} blocks but the student {len(student.blocks)}')
    real_layer = layer + depth if layer < 0 else layer
    if not 0 <= real_layer < depth:
        raise IndexError(f'layer {layer} is out of range for a model with {depth} blocks')
    was_training = teacher.training, student.training
    teacher.eval()
    student.eval()
    try:
        t_feat = patch_features(teacher, images)  # (B, h, w, C): also gives the patch grid
        s_feat = patch_features(student, images)
        if query is None:
            query = (t_feat.shape[1] // 2, t_feat.shape[2] // 2)
        t_attn = query_attention_maps(teacher, images, query, [real_layer])[real_layer]
        s_attn = query_attention_maps(student, images, query, [real_layer])[real_layer]
    finally:
        teacher.train(was_training[0])
        student.train(was_training[1])
    diff = s_attn - t_attn
    t_rgb, (s_rgb, ), ratio = pca_rgb(t_feat, [s_feat])
    return TeacherStudentComparison(
        query=tuple(query),
        layer=real_layer,
        teacher_attention=t_attn,
        student_attention=s_attn,
        attention_difference=diff,
        attention_tv=0.5 * diff.abs().flatten(1).sum(1),
        teacher_pca=t_rgb,
        student_pca=s_rgb,
        explained_variance=ratio,
        feature_cosine_gap=feature_cosine_gap(t_feat, s_feat))
