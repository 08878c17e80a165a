"""Mutation round 17: ``mmlinvit.EncoderDecoder`` and the copy strategies.

Each test fails on a single-line change of ``mmlinvit/models/segmentors.py`` or
``mmlinvit/transfer/copy_strategies.py`` that the earlier tests (rounds 10 and 16 and
``tests/models/test_segmentors.py`` / ``tests/transfer/``) let pass, and checks the behaviour
against a reference run or written in the test:

* a backbone without a ``patch_size`` (an mmseg ``ResNetV1c``) is not padded: logits and loss
  equal those of mmseg's own ``EncoderDecoder`` with the same weights;
* training pads the labels with the decode head's ``ignore_index`` (here 4, not mmseg's
  default 255): the labels equal mmseg's ``stack_batch`` with ``seg_pad_val=4``, the loss
  equals mmseg's ``EncoderDecoder`` on the batch and labels padded by hand;
* a sample with a semantic and a depth map but no edge map gets both padded
  (``stack_batch``); ``img_shape`` stays the image size in training (mmseg's
  ``SegDataPreProcessor`` with ``size_divisor``);
* ``patch_padding='center'`` pads as DINOv2's official ``CenterPadding`` (copied in the test)
  also at its patch size 14;
* the decode head receives one meta per image whose ``img_shape`` / ``pad_shape`` are the size
  of the tensor decoded (the patch-padded window in ``'slide'`` mode), the documented "window
  metas" that mmseg's ``Mask2FormerHead.predict`` upsamples to; in ``'slide'`` mode mmseg puts
  the window's ``torch.Size`` in ``img_shape``, which its ``BaseDecodeHead.predict_by_feat``
  prefers to ``pad_shape``;
* the copy strategies select the tensors of every block, also from block 10 on (a ``\\d``
  instead of ``\\d+`` in a key pattern only reached blocks 0-9).
"""
import itertools
import math
from typing import Callable, Dict, List, Tuple

import pytest
import torch
import torch.nn.functional as F
from mmengine.config import ConfigDict
from mmengine.registry import DefaultScope
from mmengine.structures import PixelData

NUM_CLASSES = 5
PATCH = 16
TINY = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)


def _head(in_channels: int, in_index: int, ignore_index: int = 255) -> dict:
    return dict(type='FCNHead', in_channels=in_channels, in_index=in_index, channels=16,
                num_convs=1, num_classes=NUM_CLASSES, norm_cfg=dict(type='GN', num_groups=4),
                dropout_ratio=0.0, align_corners=False, ignore_index=ignore_index)


def _vit_backbone() -> dict:
    return dict(type='mmlinvit.VisionTransformer', arch=TINY, family='deit', img_size=48,
                out_type='featmap', out_indices=[0, 1])


def _cnn_backbone() -> dict:
    """An mmseg ResNet-18 (v1c) with 8 base channels: no ``patch_size`` attribute."""
    return dict(type='ResNetV1c', depth=18, stem_channels=8, base_channels=8,
                out_indices=(3, ), norm_cfg=dict(type='GN', num_groups=4))


def _build_pair(backbone: dict, head: dict, test_cfg: dict, patch_padding: str = 'corner'
                ) -> Tuple[torch.nn.Module, torch.nn.Module]:
    """(mmlinvit.EncoderDecoder, mmseg EncoderDecoder) with the same random weights."""
    from mmseg.registry import MODELS

    def cfg(segmentor: str, mode_cfg: dict) -> dict:
        return dict(type=segmentor,
                    data_preprocessor=dict(type='SegDataPreProcessor', mean=[0.] * 3,
                                           std=[1.] * 3),
                    backbone=backbone, decode_head=head, train_cfg=dict(),
                    test_cfg=ConfigDict(mode_cfg))

    with DefaultScope.overwrite_default_scope('mmseg'):  # restored on exit
        torch.manual_seed(0)
        ours = MODELS.build(dict(cfg('mmlinvit.EncoderDecoder', test_cfg),
                                 patch_padding=patch_padding)).eval()
        ref = MODELS.build(cfg('EncoderDecoder', dict(mode='whole'))).eval()
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def _metas(h: int, w: int, batch: int = 1) -> List[dict]:
    return [dict(ori_shape=(h, w), img_shape=(h, w), pad_shape=(h, w)) for _ in range(batch)]


def _samples(labels: Dict[str, torch.Tensor]) -> list:
    """One ``SegDataSample`` per image of (B, 1, H, W) label maps, keyed by field name."""
    from mmseg.structures import SegDataSample
    first = next(iter(labels.values()))
    out = []
    for i in range(first.shape[0]):
        sample = SegDataSample(metainfo=_metas(*first.shape[-2:])[0])
        for key, value in labels.items():
            setattr(sample, key, PixelData(data=value[i].clone()))
        out.append(sample)
    return out


def _corner_pad(x: torch.Tensor, value: float = 0.0) -> torch.Tensor:
    """Bottom / right padding to the next multiple of 16 (mmseg's ``PatchEmbed`` corner)."""
    h, w = x.shape[-2:]
    return F.pad(x, (0, -w % PATCH, 0, -h % PATCH), value=value)


# ------------------------------------------------------------ backbones without a patch grid
def test_a_backbone_without_patch_size_is_not_padded() -> None:
    """A CNN has no patch grid: inference and loss are mmseg's own on the raw 40 x 44 batch
    (padding it to 48 x 48 would change every logit of a ResNet)."""
    ours, ref = _build_pair(_cnn_backbone(), _head(64, 0), dict(mode='whole'))
    assert not hasattr(ours.backbone, 'patch_size')
    x = torch.randn(2, 3, 40, 44)
    with torch.no_grad():
        got = ours.inference(x, _metas(40, 44, 2))
        expected = ref.inference(x, _metas(40, 44, 2))
    assert got.shape == (2, NUM_CLASSES, 40, 44)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)

    labels = torch.randint(0, NUM_CLASSES, (2, 1, 40, 44))
    ours_samples = _samples(dict(gt_sem_seg=labels))
    got_loss = ours.train().loss(x, ours_samples)['decode.loss_ce']
    expected_loss = ref.train().loss(x, _samples(dict(gt_sem_seg=labels)))['decode.loss_ce']
    torch.testing.assert_close(got_loss, expected_loss, rtol=1e-5, atol=1e-6)
    assert tuple(ours_samples[0].gt_sem_seg.shape) == (40, 44)  # labels left as they are


# ------------------------------------------------------------ DINOv2's CenterPadding
class _DINOv2CenterPadding(torch.nn.Module):
    """DINOv2's ``CenterPadding`` (``dinov2/hub/utils.py``), copied verbatim but for the
    ``inference_mode`` decorator."""

    def __init__(self, multiple: int) -> None:
        super().__init__()
        self.multiple = multiple

    def _get_pad(self, size: int) -> Tuple[int, int]:
        new_size = math.ceil(size / self.multiple) * self.multiple
        pad_size = new_size - size
        pad_size_left = pad_size // 2
        pad_size_right = pad_size - pad_size_left
        return pad_size_left, pad_size_right

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = list(itertools.chain.from_iterable(self._get_pad(m) for m in x.shape[:1:-1]))
        return F.pad(x, pads)


@pytest.mark.parametrize('hw', [(37, 45), (28, 31), (14, 14), (1, 27)])
def test_center_padding_equals_dinov2s_official_module_at_patch_14(hw: Tuple[int, int]) -> None:
    """``patch_padding='center'`` with DINOv2's patch 14: the padded input equals the
    official ``CenterPadding(14)`` output (odd and even paddings, a multiple, a 1-pixel side)."""
    ours, _ = _build_pair(_vit_backbone(), _head(32, 1), dict(mode='whole'), 'center')
    ours.backbone.patch_size = 14
    x = torch.randn(1, 3, *hw)
    got = F.pad(x, ours.patch_pads(hw))
    torch.testing.assert_close(got, _DINOv2CenterPadding(14)(x), rtol=0, atol=0)


# ------------------------------------------------------------ training labels
@pytest.mark.parametrize('patch_padding', ['corner', 'center'])
def test_labels_are_padded_with_the_decode_heads_ignore_index(patch_padding: str) -> None:
    """With ``ignore_index=4`` the padded label pixels are 4: as mmseg's ``stack_batch`` with
    ``seg_pad_val=4`` for corner padding (by hand for center), and the loss is mmseg's on the
    batch and labels padded by hand (so the padded pixels are ignored, not class 4 and not an
    out-of-range 255)."""
    from mmseg.utils import stack_batch
    ignore = 4
    ours, ref = _build_pair(_vit_backbone(), _head(32, 1, ignore_index=ignore),
                            dict(mode='whole'), patch_padding)
    torch.manual_seed(1)
    x = torch.randn(2, 3, 37, 44)
    labels = torch.randint(0, ignore, (2, 1, 37, 44))  # 0..3: no real pixel is ignored
    if patch_padding == 'corner':
        pad: Callable[..., torch.Tensor] = _corner_pad
        _, theirs = stack_batch(list(x), _samples(dict(gt_sem_seg=labels)), size_divisor=PATCH,
                                seg_pad_val=ignore)
        want_labels = torch.stack([s.gt_sem_seg.data for s in theirs])
    else:
        def pad(t: torch.Tensor, value: float = 0.0) -> torch.Tensor:
            # DINOv2's CenterPadding: 37 -> 48 pads 5 above, 6 below; 44 -> 48 pads 2 / 2.
            return F.pad(t, (2, 2, 5, 6), value=value)
        want_labels = pad(labels, value=ignore)
    assert want_labels.shape[-2:] == (48, 48)

    ours_samples = _samples(dict(gt_sem_seg=labels))
    got = ours.train().loss(x, ours_samples)['decode.loss_ce']
    got_labels = torch.stack([s.gt_sem_seg.data for s in ours_samples])
    torch.testing.assert_close(got_labels, want_labels, rtol=0, atol=0)
    expected = ref.train().loss(pad(x), _samples(dict(gt_sem_seg=pad(labels, value=ignore))))
    torch.testing.assert_close(got, expected['decode.loss_ce'])


def test_a_sample_without_edge_map_still_gets_its_depth_map_padded() -> None:
    """Label fields are skipped one by one: a sample with ``gt_sem_seg`` and ``gt_depth_map``
    but no ``gt_edge_map`` gets both padded, as mmseg's ``stack_batch`` pads them."""
    from mmseg.utils import stack_batch
    ours, _ = _build_pair(_vit_backbone(), _head(32, 1), dict(mode='whole'))
    h, w = 20, 36
    labels = dict(gt_sem_seg=torch.randint(0, NUM_CLASSES, (1, 1, h, w)),
                  gt_depth_map=torch.rand(1, 1, h, w))
    mine = _samples(labels)
    ours.train().loss(torch.randn(1, 3, h, w), mine)
    _, theirs = stack_batch([torch.randn(3, h, w)], _samples(labels), size_divisor=PATCH,
                            seg_pad_val=255)
    assert 'gt_edge_map' not in mine[0]
    for key in labels:
        assert tuple(getattr(theirs[0], key).shape) == (32, 48)
        torch.testing.assert_close(getattr(mine[0], key).data, getattr(theirs[0], key).data,
                                   rtol=0, atol=0, msg=key)


def test_training_keeps_img_shape_as_mmsegs_preprocessor_keeps_it() -> None:
    """Padding the batch to whole patches changes ``pad_shape`` only: ``img_shape`` stays the
    image's size, as after mmseg's ``SegDataPreProcessor`` with ``size_divisor=16``."""
    from mmseg.models.data_preprocessor import SegDataPreProcessor
    ours, _ = _build_pair(_vit_backbone(), _head(32, 1), dict(mode='whole'))
    h, w = 20, 36
    labels = torch.randint(0, NUM_CLASSES, (1, 1, h, w))
    mine = _samples(dict(gt_sem_seg=labels))
    ours.train().loss(torch.randn(1, 3, h, w), mine)
    pre = SegDataPreProcessor(mean=[0.] * 3, std=[1.] * 3, size_divisor=PATCH, seg_pad_val=255)
    theirs = pre(dict(inputs=[torch.randint(0, 256, (3, h, w), dtype=torch.uint8)],
                      data_samples=_samples(dict(gt_sem_seg=labels))),
                 training=True)['data_samples']
    assert tuple(theirs[0].metainfo['img_shape']) == (h, w)
    assert tuple(mine[0].metainfo['img_shape']) == tuple(theirs[0].metainfo['img_shape'])
    assert tuple(mine[0].metainfo['pad_shape']) == tuple(theirs[0].metainfo['pad_shape'])


# ------------------------------------------------------------ window metas
def _spy_decode_metas(model: torch.nn.Module) -> List[List[dict]]:
    """Records the ``batch_img_metas`` each ``decode_head.predict`` call receives."""
    seen: List[List[dict]] = []
    original = model.decode_head.predict

    def predict(inputs, batch_img_metas, test_cfg):
        seen.append([dict(meta) for meta in batch_img_metas])
        return original(inputs, batch_img_metas, test_cfg)

    model.decode_head.predict = predict  # instance attribute of this test's own model
    return seen


@pytest.mark.parametrize('mode', ['whole', 'slide'])
def test_the_decode_head_gets_the_decoded_size_in_every_meta(mode: str) -> None:
    """Every image's meta handed to the head says the decoded (patch-padded) size, in
    ``img_shape`` and ``pad_shape`` alike: 40 x 44 -> 48 x 48 (whole); 40 x 68 in 40 x 40
    windows, stride 24 -> three 40 x 40 windows, each decoded at 48 x 48 (slide)."""
    test_cfg = dict(mode='whole') if mode == 'whole' else dict(
        mode='slide', crop_size=(40, 40), stride=(24, 24))
    ours, _ = _build_pair(_vit_backbone(), _head(32, 1), test_cfg)
    seen = _spy_decode_metas(ours)
    h, w = (40, 44) if mode == 'whole' else (40, 68)
    with torch.no_grad():
        ours.inference(torch.randn(2, 3, h, w), _metas(h, w, 2))
    assert len(seen) == (1 if mode == 'whole' else 3)
    for metas in seen:
        assert len(metas) == 2  # one per image, as mmseg passes them
        for meta in metas:
            assert tuple(meta['img_shape']) == (48, 48)
            assert tuple(meta['pad_shape']) == (48, 48)
            assert meta['ori_shape'] == (h, w)  # the rest of the meta is kept


# ------------------------------------------------------------ copy strategies
def _eleven_block_models(family: str) -> Tuple[torch.nn.Module, torch.nn.Module]:
    from mmlinvit.backbones import VisionTransformer
    arch = dict(embed_dims=8, num_layers=11, num_heads=1, mlp_hidden_dims=16)
    torch.manual_seed(0)
    teacher = VisionTransformer(arch, family=family, img_size=16, patch_size=8)
    student = VisionTransformer(arch, family=family, attn_cfg='elu', img_size=16,
                                patch_size=8)
    return student, teacher


def _per_block(*names: str, blocks: int = 11) -> set:
    return {f'blocks.{i}.{name}' for i in range(blocks) for name in names}


COPIED: Dict[str, set] = {
    'copy': _per_block('attn.qkv.weight', 'attn.qkv.bias'),
    'mlp_copy': _per_block('norm2.weight', 'norm2.bias', 'mlp.fc1.weight', 'mlp.fc1.bias',
                           'mlp.fc2.weight', 'mlp.fc2.bias', 'ls2.gamma'),
}


@pytest.mark.parametrize('strategy', ['copy', 'mlp_copy'])
def test_copy_strategies_reach_blocks_from_ten_on(strategy: str) -> None:
    """An 11-block DeiT-III teacher (LayerScale): the strategy copies its tensors in every
    block, ``blocks.10`` included (the set written out by hand), and they are the teacher's."""
    from mmlinvit.transfer import transfer_weights
    student, teacher = _eleven_block_models('deit3')
    report = transfer_weights(student, teacher, strategy)
    assert report.copied == COPIED[strategy]
    teacher_sd = teacher.state_dict()
    for key in sorted(COPIED[strategy]):
        torch.testing.assert_close(student.state_dict()[key], teacher_sd[key], rtol=0, atol=0)


def test_mlp_copy_without_layer_scale_reaches_block_ten_too() -> None:
    """``include_layer_scale=False``: every block's MLP and ``norm2``, no ``ls2.gamma``."""
    from mmlinvit.transfer import transfer_weights
    student, teacher = _eleven_block_models('deit3')
    report = transfer_weights(student, teacher, 'mlp_copy', include_layer_scale=False)
    assert report.copied == COPIED['mlp_copy'] - _per_block('ls2.gamma')
