"""Distillation inputs (mutation round 8): the teacher statistics folded into a copied patch
projection, student settings given at the model's top level, and a data preprocessor config
without ``type``.

Guarded here:

* ``fold_into_patch_embedding``: the teacher's patch projection applied to pixels normalised
  with the teacher's statistics equals the folded projection applied to the same pixels
  normalised with the student's statistics.  The reference is computed by hand in float64
  (non-overlapping patches, a sum over channel and kernel positions), for a float64 and a
  float32 projection; a projection without bias is refused and left unchanged.
* ``refuse_student_settings``: one key is refused as well as many, and each key is named with
  where it goes.
* ``build_untyped_preprocessor``: the preprocessor takes the type of the student's own
  (segmentation as well as classification), with the given settings, and refuses a
  bare-backbone student and mmengine's ``BaseDataPreprocessor``.
"""
from typing import Dict

import pytest
import torch
import torch.nn as nn
from mmengine.config import ConfigDict
from mmengine.registry import DefaultScope

from mmlinvit.models.distill import DistillationConfigError
from mmlinvit.models.distill.student_preprocessing import (build_untyped_preprocessor,
                                                           refuse_student_settings)
from mmlinvit.models.distill.teacher_input_norm import fold_into_patch_embedding

#: Student (CIFAR-10) and teacher (OpenAI CLIP, 0-255) statistics: every channel differs.
MEAN_S = [125.307, 122.961, 113.8575]
STD_S = [51.5865, 50.847, 51.255]
MEAN_T = [122.7709, 116.7460, 104.0937]
STD_T = [68.5005, 66.6322, 70.3232]
PATCH = 2


def _patch_embedding(pixels: torch.Tensor, mean, std, weight: torch.Tensor,
                     bias: torch.Tensor) -> torch.Tensor:
    """(B, O, H/p, W/p) tokens of a stride-p, p x p convolution of ``(pixels - mean) / std``,
    written out in float64: ``bias[o] + sum_{c, i, j} weight[o, c, i, j] * x[c, p*h + i,
    p*w + j]``."""
    x = (pixels.double() - torch.tensor(mean, dtype=torch.float64).view(1, -1, 1, 1)) / \
        torch.tensor(std, dtype=torch.float64).view(1, -1, 1, 1)
    b, c, height, width = x.shape
    patches = x.view(b, c, height // PATCH, PATCH, width // PATCH, PATCH)
    tokens = torch.einsum('bchiwj,ocij->bohw', patches, weight.double())
    return tokens + bias.double().view(1, -1, 1, 1)


def _projection(dtype: torch.dtype, bias: bool = True) -> nn.Conv2d:
    """A seeded 3 -> 5 channel patch projection (stride = kernel = :data:`PATCH`)."""
    torch.manual_seed(3)
    proj = nn.Conv2d(3, 5, kernel_size=PATCH, stride=PATCH, bias=bias).to(dtype)
    with torch.no_grad():
        proj.weight.normal_(0, 0.1)
        if bias:
            proj.bias.normal_(0, 0.1)
    return proj


@pytest.mark.parametrize('dtype, atol', [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_folded_projection_reads_student_normalised_pixels_as_the_teacher(dtype, atol):
    proj = _projection(dtype)
    weight, bias = proj.weight.detach().clone(), proj.bias.detach().clone()
    torch.manual_seed(0)
    pixels = torch.rand(2, 3, 3 * PATCH, 4 * PATCH, dtype=torch.float64) * 255
    teacher = _patch_embedding(pixels, MEAN_T, STD_T, weight, bias)

    fold_into_patch_embedding(proj, *(torch.tensor(v, dtype=torch.float64)
                                      for v in (MEAN_S, STD_S, MEAN_T, STD_T)))
    assert proj.weight.dtype == dtype and proj.bias.dtype == dtype
    student_batch = (pixels - torch.tensor(MEAN_S, dtype=torch.float64).view(1, 3, 1, 1)) / \
        torch.tensor(STD_S, dtype=torch.float64).view(1, 3, 1, 1)
    with torch.no_grad():
        folded = proj(student_batch.to(dtype)).double()
    err = (folded - teacher).abs().max().item()
    print(f'\nfolded projection vs teacher projection on the same pixels ({dtype}): '
          f'max abs {err:.2e}')
    assert err < atol
    # the folded parameters themselves, per input channel
    ratio = torch.tensor(STD_S, dtype=torch.float64) / torch.tensor(STD_T, dtype=torch.float64)
    for c in range(3):
        torch.testing.assert_close(proj.weight[:, c].double(), weight[:, c].double() * ratio[c],
                                   rtol=1e-6, atol=0)


def test_folding_the_same_statistics_changes_nothing():
    proj = _projection(torch.float64)
    weight, bias = proj.weight.detach().clone(), proj.bias.detach().clone()
    fold_into_patch_embedding(proj, torch.tensor(MEAN_T), torch.tensor(STD_T),
                              torch.tensor(MEAN_T), torch.tensor(STD_T))
    torch.testing.assert_close(proj.weight.detach(), weight, rtol=1e-15, atol=0)
    torch.testing.assert_close(proj.bias.detach(), bias, rtol=0, atol=1e-15)


def test_a_projection_without_bias_is_refused_and_left_unchanged():
    proj = _projection(torch.float32, bias=False)
    weight = proj.weight.detach().clone()
    with pytest.raises(DistillationConfigError, match='no bias'):
        fold_into_patch_embedding(proj, torch.tensor(MEAN_S), torch.tensor(STD_S),
                                  torch.tensor(MEAN_T), torch.tensor(STD_T))
    assert torch.equal(proj.weight.detach(), weight)


# ---------------------------------------------------------------- student settings
def test_no_student_setting_passes():
    refuse_student_settings({})


def test_a_single_student_setting_is_refused():
    with pytest.raises(DistillationConfigError,
                       match=r"\['test_cfg'\].*model\.test_cfg -> model\.student\.test_cfg"):
        refuse_student_settings(dict(test_cfg=dict(mode='slide')))


def test_every_student_setting_is_named_with_where_it_goes():
    settings: Dict[str, object] = dict(train_cfg=dict(), decode_head=dict(num_classes=5),
                                       auxiliary_head=None)
    with pytest.raises(DistillationConfigError) as exc:
        refuse_student_settings(settings)
    msg = str(exc.value)
    assert "['auxiliary_head', 'decode_head', 'train_cfg']" in msg, msg
    for name in settings:
        assert f'model.{name} -> model.student.{name}' in msg, msg


# ---------------------------------------------------------------- preprocessor without type
class _Student(nn.Module):
    """A task-model student: only its ``data_preprocessor`` is read."""

    def __init__(self, data_preprocessor: nn.Module) -> None:
        super().__init__()
        self.data_preprocessor = data_preprocessor


SETTINGS = dict(mean=MEAN_S, std=STD_S)


def _assert_stats(pre: nn.Module) -> None:
    """The preprocessor normalises with :data:`SETTINGS`."""
    torch.testing.assert_close(pre.mean.flatten(), torch.tensor(SETTINGS['mean']))
    torch.testing.assert_close(pre.std.flatten(), torch.tensor(SETTINGS['std']))


def test_the_type_is_taken_from_a_classification_student():
    from mmpretrain.models import ClsDataPreprocessor
    student = _Student(ClsDataPreprocessor(mean=[0., 0., 0.], std=[1., 1., 1.]))
    cfg = dict(SETTINGS, num_classes=10, to_rgb=True)
    pre = build_untyped_preprocessor(cfg, student)
    assert type(pre) is ClsDataPreprocessor and pre is not student.data_preprocessor
    _assert_stats(pre)
    assert pre.to_rgb is True and pre.num_classes == 10
    assert 'type' not in cfg  # the caller's config is not changed


def test_the_type_is_taken_from_a_segmentation_student():
    """An mmseg student's ``SegDataPreProcessor`` (a ``ConfigDict`` as the Runner gives it)."""
    from mmseg.models import SegDataPreProcessor
    student = _Student(SegDataPreProcessor())
    with DefaultScope.overwrite_default_scope('mmseg'):
        pre = build_untyped_preprocessor(ConfigDict(SETTINGS, size=(8, 8), pad_val=0,
                                                    seg_pad_val=255), student)
    assert type(pre) is SegDataPreProcessor
    _assert_stats(pre)
    assert tuple(pre.size) == (8, 8)


def test_a_bare_backbone_student_and_a_base_preprocessor_are_refused():
    from mmengine.model import BaseDataPreprocessor
    with pytest.raises(DistillationConfigError, match=r'bare backbone.*data_preprocessor\.type'):
        build_untyped_preprocessor(dict(SETTINGS), None)
    with pytest.raises(DistillationConfigError,
                       match=r"mmengine's BaseDataPreprocessor.*data_preprocessor\.type"):
        build_untyped_preprocessor(dict(SETTINGS), _Student(BaseDataPreprocessor()))
