"""Mutation round 20: the pyramid neck and ``mmlinvit.EncoderDecoder``.

Each test fails on a single-line change of ``mmlinvit/models/necks.py`` or
``mmlinvit/models/segmentors.py`` that the earlier tests (rounds 10, 16 and 17,
``tests/models/test_segmentors.py``, ``tests/segmentation/test_feature_pyramid.py``) let pass,
and checks the behaviour against a reference run or written in the test:

* on a grid whose sides are multiples of the factor the pooled levels train as mmseg's
  ``MaxPool2d`` does, gradients of tied maxima included (one winner per window, not a gradient
  split over the tie);
* ``CoveringMaxPool2d`` shows its factor in ``print(model)`` as torch's ``MaxPool2d`` shows its
  kernel;
* a segmentor whose backbone has no ``patch_size`` reports no patch grid (``None``) and pads
  nothing, as ``patch_multiple`` documents;
* an edge map (``gt_edge_map``) is padded with the decode head's ``ignore_index`` in training,
  as mmseg's ``stack_batch`` pads it.
"""
from typing import Dict, List

import pytest
import torch
from mmengine.structures import PixelData

from test_mutation_round16_models import _segmentor

BN = dict(type='BN', requires_grad=True)
PATCH = 16


# ---------------------------------------------------------------- neck
@pytest.mark.parametrize('rescales', [[4, 2, 1, 0.5], [2, 1, 0.5, 0.25]])
def test_even_grids_train_as_mmsegs_max_pool_also_on_ties(rescales: List[float]) -> None:
    """On an even grid the neck is documented to be mmseg's (``MaxPool2d``).  With tied maxima
    (constant 4 x 4 blocks, as a ReLU'd or quantised map has) ``MaxPool2d`` routes each window's
    gradient to one position; a gradient split evenly over the tie (``amax``) would train the
    backbone differently from mmseg's neck."""
    from mmseg.models.necks import Feature2Pyramid

    from mmlinvit.models.necks import FullGridFeature2Pyramid
    torch.manual_seed(0)
    ours = FullGridFeature2Pyramid(4, rescales, BN).eval()
    theirs = Feature2Pyramid(4, rescales, BN).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    blocks = torch.randn(1, 4, 3, 4)
    base = blocks.repeat_interleave(4, dim=-2).repeat_interleave(4, dim=-1)  # 12 x 16, tied
    grads = []
    for neck in (ours, theirs):
        inputs = [base.clone().requires_grad_(True) for _ in rescales]
        outs = neck(inputs)
        torch.manual_seed(1)
        loss = sum((out * torch.randn_like(out)).sum() for out in outs)
        grads.append(torch.autograd.grad(loss, inputs))
    for level, (g, w) in enumerate(zip(*grads)):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6, msg=f'level {level}')
    # the reference puts each pooled window's whole gradient on a single position
    pooled = rescales.index(0.5)
    nonzero = (grads[1][pooled] != 0).sum().item()
    assert nonzero == 4 * 6 * 8  # channels x (12 / 2) x (16 / 2) windows


@pytest.mark.parametrize('factor', [2, 4])
def test_covering_pool_repr_names_its_factor(factor: int) -> None:
    """``print(model)`` shows the factor, as torch's ``MaxPool2d`` shows its kernel size."""
    from mmlinvit.models.necks import CoveringMaxPool2d
    assert f'kernel_size={factor}' in repr(torch.nn.MaxPool2d(factor, factor))
    assert f'factor={factor}' in repr(CoveringMaxPool2d(factor))


# ---------------------------------------------------------------- segmentor
def test_a_backbone_without_patch_size_has_no_patch_grid() -> None:
    """``patch_multiple`` is documented to return ``None`` for a backbone without a
    ``patch_size`` (a CNN); ``patch_pads`` then pads nothing."""
    model = _segmentor()
    assert model.patch_multiple() == (PATCH, PATCH)
    model.backbone = torch.nn.Identity()  # this test's own model: no patch_size attribute
    assert model.patch_multiple() is None
    assert model.patch_pads((37, 45)) == (0, 0, 0, 0)


def _sample(labels: Dict[str, torch.Tensor]):
    from mmseg.structures import SegDataSample
    first = next(iter(labels.values()))
    h, w = first.shape[-2:]
    sample = SegDataSample(metainfo=dict(ori_shape=(h, w), img_shape=(h, w), pad_shape=(h, w)))
    for key, value in labels.items():
        setattr(sample, key, PixelData(data=value.clone()))
    return sample


def test_edge_maps_are_padded_as_mmsegs_stack_batch_pads_them() -> None:
    """A sample with a semantic map and an edge map (mmseg's boundary-aware heads): both are
    padded to the patch grid with the head's ``ignore_index``, equal to mmseg's
    ``stack_batch(size_divisor=16, seg_pad_val=255)``."""
    from mmseg.utils import stack_batch
    model = _segmentor().train()
    h, w = 20, 36
    labels = dict(gt_sem_seg=torch.randint(0, 3, (1, h, w)),
                  gt_edge_map=torch.randint(0, 2, (1, h, w)))
    mine = [_sample(labels)]
    model.loss(torch.randn(1, 3, h, w), mine)
    _, theirs = stack_batch([torch.randn(3, h, w)], [_sample(labels)], size_divisor=PATCH,
                            seg_pad_val=model.decode_head.ignore_index)
    assert model.decode_head.ignore_index == 255
    for key in labels:
        assert tuple(getattr(theirs[0], key).shape) == (32, 48)
        torch.testing.assert_close(getattr(mine[0], key).data, getattr(theirs[0], key).data,
                                   rtol=0, atol=0, msg=key)
    # written out: the edge map's padded rows / columns are all ignore_index
    edge = mine[0].gt_edge_map.data
    assert (edge[:, h:, :] == 255).all() and (edge[:, :, w:] == 255).all()
    torch.testing.assert_close(edge[:, :h, :w], labels['gt_edge_map'], rtol=0, atol=0)
