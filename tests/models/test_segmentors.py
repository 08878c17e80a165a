"""mmlinvit.EncoderDecoder keeps logits aligned when the image side is not a multiple of the
patch size, in whole and sliding-window inference and in the training loss.

Reference (independent of the code under test): the image zero-padded by hand to a multiple of
the patch size, run through mmseg's own ``EncoderDecoder`` (same weights), whose logits then
cover the padded image exactly, cropped back to the image.  A pixel's logit must not depend on
whether the image was padded beforehand.  On the old code the backbone dropped the last rows /
columns and mmseg stretched the logits of the smaller grid over the image; mmseg's plain
``EncoderDecoder`` with a padding backbone squeezes the larger grid onto it instead.
"""
import copy

import pytest
import torch
import torch.nn.functional as F
from mmengine.config import ConfigDict
from mmengine.registry import init_default_scope
from mmengine.structures import PixelData

TINY = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
PATCH = 16


def _cfg(segmentor: str, test_cfg: dict) -> dict:
    return dict(
        type=segmentor,
        data_preprocessor=dict(type='SegDataPreProcessor', mean=[0.] * 3, std=[1.] * 3),
        backbone=dict(type='mmlinvit.VisionTransformer', arch=TINY, family='deit',
                      img_size=48, out_type='featmap', out_indices=[0, 1]),
        decode_head=dict(type='FCNHead', in_channels=32, in_index=1, channels=16, num_convs=1,
                         num_classes=5, norm_cfg=dict(type='GN', num_groups=4),
                         dropout_ratio=0.0, align_corners=False),
        train_cfg=dict(), test_cfg=ConfigDict(test_cfg))


def _models(test_cfg: dict):
    """(mmlinvit.EncoderDecoder, mmseg EncoderDecoder) with the same random weights."""
    init_default_scope('mmseg')
    from mmseg.registry import MODELS
    torch.manual_seed(0)
    ours = MODELS.build(_cfg('mmlinvit.EncoderDecoder', test_cfg)).eval()
    ref = MODELS.build(_cfg('EncoderDecoder', dict(mode='whole'))).eval()
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def _pad(x: torch.Tensor, value: float = 0.0) -> torch.Tensor:
    h, w = x.shape[-2:]
    return F.pad(x, (0, -w % PATCH, 0, -h % PATCH), value=value)


def _metas(h: int, w: int) -> list:
    return [dict(ori_shape=(h, w), img_shape=(h, w), pad_shape=(h, w))]


def _ref_whole(ref, x: torch.Tensor) -> torch.Tensor:
    """Logits of the hand-padded image from mmseg's EncoderDecoder, cropped to x's size."""
    h, w = x.shape[-2:]
    padded = _pad(x)
    logits = ref.inference(padded, _metas(*padded.shape[-2:]))
    return logits[..., :h, :w]


def _samples(labels: torch.Tensor) -> list:
    """One SegDataSample per image of (B, 1, H, W) labels."""
    from mmseg.structures import SegDataSample
    out = []
    for label in labels:
        sample = SegDataSample(metainfo=_metas(*labels.shape[-2:])[0])
        sample.gt_sem_seg = PixelData(data=label.clone())
        out.append(sample)
    return out


def test_whole_inference_aligned():
    ours, ref = _models(dict(mode='whole'))
    x = torch.randn(1, 3, 40, 44)  # 40 = 2 * 16 + 8, 44 = 2 * 16 + 12
    with torch.no_grad():
        got = ours.inference(x, _metas(40, 44))
        expected = _ref_whole(ref, x)
        squeezed = ref.inference(x, _metas(40, 44))  # mmseg: 3 x 3 grid resized onto 40 x 44
    assert got.shape == expected.shape == (1, 5, 40, 44)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert (squeezed - expected).abs().max() > 1e-3  # the misalignment this avoids


def test_slide_inference_aligned():
    crop, stride = (40, 40), (24, 24)
    ours, ref = _models(dict(mode='slide', crop_size=crop, stride=stride))
    h, w = 40, 68
    x = torch.randn(1, 3, h, w)
    with torch.no_grad():
        got = ours.inference(x, _metas(h, w))
        # Windows as mmseg places them: x1 in 0, 24, then the last one flush right (28).
        expected = torch.zeros(1, 5, h, w)
        count = torch.zeros(1, 1, h, w)
        for x1 in (0, 24, 28):
            window = x[..., :, x1:x1 + crop[1]]
            expected[..., :, x1:x1 + crop[1]] += _ref_whole(ref, window)
            count[..., :, x1:x1 + crop[1]] += 1
        expected = expected / count
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_predict_crops_to_the_original_image():
    """Through ``predict`` (data samples, postprocess_result) the map has the image size."""
    from mmseg.structures import SegDataSample
    ours, ref = _models(dict(mode='whole'))
    x = torch.randn(1, 3, 40, 44)
    sample = SegDataSample(metainfo=_metas(40, 44)[0])
    with torch.no_grad():
        out = ours.predict(x, [sample])[0].seg_logits.data
        expected = _ref_whole(ref, x)[0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def _training_losses(ours, ref, pad):
    """Decode losses of one 40 x 44 batch: ours on the raw batch, mmseg's ``ref`` on the batch
    and labels padded by hand with ``pad`` (labels with 255), and the raw batch and labels."""
    ours.train()
    ref.train()
    x = torch.randn(2, 3, 40, 44)
    labels = torch.randint(0, 5, (2, 1, 40, 44))
    got = ours.loss(x, _samples(labels))
    expected = ref.loss(pad(x), _samples(pad(labels, value=255)))
    return got, expected, x, labels


def test_training_loss_pads_labels_with_ignore_index():
    ours, ref = _models(dict(mode='whole'))
    got, expected, x, labels = _training_losses(ours, ref, _pad)
    torch.testing.assert_close(got['decode.loss_ce'], expected['decode.loss_ce'])
    stretched = ref.loss(x, _samples(labels))  # mmseg alone: logits of 48 x 48 resized to 40 x 44
    assert not torch.allclose(stretched['decode.loss_ce'], expected['decode.loss_ce'])


@pytest.mark.parametrize('hw', [(48, 48), (64, 32)])
def test_divisible_sizes_unchanged(hw):
    ours, ref = _models(dict(mode='whole'))
    x = torch.randn(1, 3, *hw)
    with torch.no_grad():
        torch.testing.assert_close(ours.inference(x, _metas(*hw)),
                                   ref.inference(x, copy.deepcopy(_metas(*hw))))


def _center_pad(x: torch.Tensor, value: float = 0.0) -> torch.Tensor:
    """DINOv2's CenterPadding, from its formula: per side, the padding to the next multiple
    split with the smaller half first (left / top)."""
    def split(size):
        total = -(-size // PATCH) * PATCH - size
        return total // 2, total - total // 2
    (left, right), (top, bottom) = split(x.shape[-1]), split(x.shape[-2])
    return F.pad(x, (left, right, top, bottom), value=value)


def _center_models(test_cfg: dict):
    init_default_scope('mmseg')
    from mmseg.registry import MODELS
    torch.manual_seed(0)
    ours = MODELS.build(dict(_cfg('mmlinvit.EncoderDecoder', test_cfg),
                             patch_padding='center')).eval()
    ref = MODELS.build(_cfg('EncoderDecoder', dict(mode='whole'))).eval()
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def test_center_padding_is_dinov2s_and_crops_from_the_same_offsets():
    """patch_padding='center': the backbone receives the image padded as DINOv2's
    CenterPadding pads it, and the logits are those of the padded image at the image's
    place (40 = 48 - 8: 4 rows above and below; 44 = 48 - 4: 2 columns each side; 37 -> 11:
    5 above, 6 below)."""
    for h, w in ((40, 44), (37, 44)):
        ours, ref = _center_models(dict(mode='whole'))
        x = torch.randn(1, 3, h, w)
        seen = []
        ours.backbone.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
        with torch.no_grad():
            got = ours.inference(x, _metas(h, w))
            padded = _center_pad(x)
            full = ref.inference(padded, _metas(*padded.shape[-2:]))
        torch.testing.assert_close(seen[0], padded, rtol=0, atol=0)
        top, left = (padded.shape[-2] - h) // 2, (padded.shape[-1] - w) // 2
        torch.testing.assert_close(got, full[..., top:top + h, left:left + w], rtol=1e-5,
                                   atol=1e-5)
        corner = _models(dict(mode='whole'))[0]
        with torch.no_grad():
            assert (corner.inference(x, _metas(h, w)) - got).abs().max() > 1e-3


def test_center_padding_in_training_pads_labels_around_the_image():
    ours, ref = _center_models(dict(mode='whole'))
    got, expected, _, _ = _training_losses(ours, ref, _center_pad)
    torch.testing.assert_close(got['decode.loss_ce'], expected['decode.loss_ce'])


def test_unknown_patch_padding_names_the_choices():
    init_default_scope('mmseg')
    from mmseg.registry import MODELS
    with pytest.raises(ValueError, match=r"unknown patch_padding 'centre'.*'corner', 'center'"):
        MODELS.build(dict(_cfg('mmlinvit.EncoderDecoder', dict(mode='whole')),
                          patch_padding='centre'))
