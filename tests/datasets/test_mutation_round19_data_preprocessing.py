"""Toy scenes, data integrity checks and distillation preprocessing (mutation round 19).

Each test checks behaviour against an independent reference: Pillow's own JPEG encoder,
mmcv's ``LoadImageFromFile`` / mmseg's ``LoadAnnotations`` run on the file, mmpretrain's
``ImageClassifier`` / ``ClsDataPreprocessor`` built here, or a value worked out by hand.
Guarded:

* ``synthetic_scenes``: a one-pixel object is its own outline (unlabelled); ADE20K images are
  JPEGs of quality 95 (Pillow's quantisation tables); every pixel carries the drawn noise
  (std 4); the default Cityscapes layout is twice as wide as high (64x128);
* ``integrity``: a ``color_type='grayscale'`` pipeline turns a tagged JPEG like ``'color'``
  (mmcv's loader, both backends), so a label map of its stored pixels is reported; a truncated
  JPEG, whose header still reads, is reported as undecodable (the pixels are decoded in full);
* ``student_preprocessing``: a student given as an mmengine ``Config`` (not a ``dict``) is
  checked; the whole ``train_cfg`` is the student's ``batch_augments`` (``probs`` included,
  as mmpretrain's ``ImageClassifier`` builds it), not only its ``augments``.
"""
import io
import os.path as osp

import numpy as np
import pytest
from PIL import Image

from mmlinvit.models.distill import DistillationConfigError


# ---------------------------------------------------------------------- synthetic_scenes
def test_a_one_pixel_object_is_its_own_outline():
    """The band is every pixel within one pixel of the mask border, inside or outside: a lone
    mask pixel (no 4-neighbour in the mask) lies on its own border, so the band is the pixel
    and its four neighbours (a plus sign), worked out by hand on a 5x5 grid."""
    from mmlinvit.datasets.synthetic_scenes import _outline
    mask = np.zeros((5, 5), bool)
    mask[2, 2] = True
    expected = np.zeros((5, 5), bool)
    expected[1:4, 2] = True
    expected[2, 1:4] = True
    np.testing.assert_array_equal(_outline(mask), expected)


def test_ade20k_images_are_jpegs_of_quality_95(tmp_path):
    """The images are written with JPEG quality 95 (near-lossless, so object edges stay on
    their labels): the file's quantisation tables are those Pillow writes for quality 95."""
    from mmlinvit.datasets import make_ade20k_layout
    stems = make_ade20k_layout(str(tmp_path), num_train=1, num_val=0, size=(16, 16), seed=0)
    with Image.open(osp.join(str(tmp_path), 'images', 'training',
                             stems['training'][0] + '.jpg')) as img:
        tables = img.quantization
    reference = io.BytesIO()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(reference, 'JPEG', quality=95)
    reference.seek(0)
    with Image.open(reference) as ref:
        assert tables == ref.quantization


@pytest.mark.parametrize('seed', [1, 2])
def test_every_pixel_carries_gaussian_noise_of_std_4(seed: int):
    """The top sky row is one colour (the gradient varies down the image only) plus per-pixel
    noise of std 4: across 256 columns the red channel's std is 4 (3..5; uint8 rounding adds
    1/12 to the variance)."""
    from mmlinvit.datasets.synthetic_scenes import draw_scene
    image, label = draw_scene(np.random.default_rng(seed), 16, 256, max_objects=1)
    assert (label[0] == 0).all()  # the top row is all sky in these scenes
    assert 3.0 < float(image[0, :, 0].astype(np.float64).std()) < 5.0


def test_cityscapes_default_size_has_cityscapes_aspect_ratio(tmp_path):
    """By default the Cityscapes layout is 64x128 (HxW): twice as wide as high, like
    Cityscapes' 2048x1024 frames; mmseg reads both files at that size."""
    from mmlinvit.datasets import make_cityscapes_layout
    stems = make_cityscapes_layout(str(tmp_path), num_train=1, num_val=0)
    stem = stems['train'][0]
    img = osp.join(str(tmp_path), 'leftImg8bit', 'train', 'toytown', stem + '_leftImg8bit.png')
    seg = osp.join(str(tmp_path), 'gtFine', 'train', 'toytown',
                   stem + '_gtFine_labelTrainIds.png')
    with Image.open(img) as a, Image.open(seg) as b:
        assert a.size == b.size == (128, 64)
        assert a.size[0] * 1024 == a.size[1] * 2048


# ---------------------------------------------------------------------- integrity
def _tagged_jpeg_and_stored_label_map(folder: str, orientation: int) -> tuple:
    """A 40x24 (WxH) JPEG tagged with ``orientation``, left half red, and a label map of its
    stored pixels (class 1 on the left half, 2 on the right)."""
    img = np.zeros((24, 40, 3), np.uint8)
    img[:, :20] = (255, 0, 0)
    image = Image.fromarray(img)
    exif = image.getexif()
    exif[0x0112] = orientation
    img_path = osp.join(folder, 'scene.jpg')
    image.save(img_path, exif=exif.tobytes(), quality=100)
    label = np.full((24, 40), 2, np.uint8)
    label[:, :20] = 1
    seg_path = osp.join(folder, 'scene.png')
    Image.fromarray(label).save(seg_path)
    return img_path, seg_path


def _pipeline_shapes(img_path: str, seg_path: str, color_type: str, backend: str) -> tuple:
    """(image HxW, label map HxW) as mmcv's LoadImageFromFile and mmseg's LoadAnnotations load
    them."""
    from mmcv.transforms import LoadImageFromFile
    from mmseg.datasets.transforms import LoadAnnotations
    results = LoadImageFromFile(color_type=color_type, imdecode_backend=backend)(
        dict(img_path=img_path))
    results = LoadAnnotations()(dict(results, seg_map_path=seg_path, reduce_zero_label=False,
                                     seg_fields=[]))
    return results['img'].shape[:2], results['gt_seg_map'].shape


@pytest.mark.parametrize('backend', ['cv2', 'pillow'])
def test_a_grayscale_pipeline_turns_a_tagged_jpeg_too(tmp_path, backend: str):
    """``color_type='grayscale'`` applies the EXIF orientation like ``'color'`` (mmcv's
    LoadImageFromFile, run here, hands over a 24x40 image turned to 40x24), so a label map of
    the stored pixels is reported."""
    from mmlinvit.datasets.integrity import ImageDecoding, check_sample
    img_path, seg_path = _tagged_jpeg_and_stored_label_map(str(tmp_path), 6)
    img_shape, seg_shape = _pipeline_shapes(img_path, seg_path, 'grayscale', backend)
    assert img_shape == (40, 24) and seg_shape == (24, 40)  # the reference: they differ
    problems = check_sample(img_path, seg_path, ImageDecoding('grayscale', backend))
    assert [path for path, _ in problems] == [seg_path]
    assert 'EXIF Orientation=6' in problems[0][1]


@pytest.mark.parametrize('backend', ['cv2', 'pillow'])
def test_a_truncated_jpeg_is_reported(tmp_path, backend: str):
    """A JPEG cut short has an intact header (its size reads fine, and Pillow reads its EXIF
    without decoding) but mmcv's ``LoadImageFromFile`` (run here, either backend) fails on its
    pixels: the check must decode the pixels in full and report the image."""
    from mmcv.transforms import LoadImageFromFile

    from mmlinvit.datasets.integrity import check_sample
    pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3)).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, 'JPEG', quality=95)
    img_path = str(tmp_path / 'scene.jpg')
    with open(img_path, 'wb') as f:
        f.write(buffer.getvalue()[:len(buffer.getvalue()) // 2])
    seg_path = str(tmp_path / 'scene.png')
    Image.fromarray(np.ones((64, 64), np.uint8)).save(seg_path)
    with Image.open(img_path) as header_only:
        assert header_only.size == (64, 64)
    with pytest.raises(Exception):  # the reference: the pipeline cannot read it
        LoadImageFromFile(imdecode_backend=backend)(dict(img_path=img_path))
    problems = check_sample(img_path, seg_path)
    assert len(problems) == 1 and problems[0][0] == img_path
    assert problems[0][1].startswith('image cannot be decoded')


# ---------------------------------------------------------------------- student_preprocessing
def test_a_student_config_given_as_an_mmengine_config_is_checked():
    """An mmengine ``Config`` (not a ``dict`` subclass, unlike ``ConfigDict``) holding a student
    whose own ``data_preprocessor`` has other statistics than the model's is refused like the
    same plain dict; the differing mean is named with both values."""
    from mmengine.config import Config

    from mmlinvit.models.distill.student_preprocessing import check_student_preprocessing
    student = dict(type='mmpretrain.ImageClassifier',
                   data_preprocessor=dict(type='ClsDataPreprocessor', mean=[0., 0., 0.],
                                          std=[1., 1., 1.]))
    model = dict(type='mmpretrain.ClsDataPreprocessor', mean=[1., 2., 3.], std=[1., 1., 1.])
    for cfg in (student, Config(student)):
        with pytest.raises(DistillationConfigError,
                           match=r'data_preprocessor\.mean: \[0\.0, 0\.0, 0\.0\] != '
                                 r'\[1\.0, 2\.0, 3\.0\]'):
            check_student_preprocessing(cfg, model)


def test_train_cfg_batch_augment_probabilities_are_compared_too():
    """mmpretrain's ``ImageClassifier`` hands its whole ``train_cfg`` to its preprocessor as
    ``batch_augments``, ``probs`` included (run here: Mixup 0.3 / CutMix 0.7 / none 0.0),
    while a model preprocessor with the same augments and no ``probs`` picks one uniformly:
    the student's setting would be dropped, so it is refused and ``probs`` is named."""
    from mmengine.registry import DefaultScope
    from mmpretrain.models import ClsDataPreprocessor, ImageClassifier

    from mmlinvit.models.distill.student_preprocessing import check_student_preprocessing
    augments = [dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]
    train_cfg = dict(augments=augments, probs=[0.3, 0.7])
    model = dict(type='ClsDataPreprocessor', batch_augments=dict(augments=augments))
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        student = ImageClassifier(backbone=dict(type='ResNet', depth=18, base_channels=8),
                                  train_cfg=dict(train_cfg))
        reference = ClsDataPreprocessor(batch_augments=dict(augments=augments))
    assert student.data_preprocessor.batch_augments.probs == [0.3, 0.7, 0.0]
    assert reference.batch_augments.probs is None  # the reference: the two differ
    with pytest.raises(DistillationConfigError, match=r'train_cfg \(batch augments\).*probs'):
        check_student_preprocessing(
            dict(type='ImageClassifier', backbone=dict(type='ResNet', depth=18),
                 train_cfg=train_cfg), model)
    check_student_preprocessing(  # the same settings on both sides pass
        dict(type='ImageClassifier', train_cfg=train_cfg),
        dict(model, batch_augments=train_cfg))
