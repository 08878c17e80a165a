"""``--check-data``'s per-sample check: segmentation images with an EXIF orientation.

mmseg's ``LoadImageFromFile`` (``color_type='color'``) applies the EXIF orientation of a JPEG
(cv2 ``IMREAD_COLOR``); ``LoadAnnotations`` reads the label map as stored.  The reference
here is that pipeline itself, run on the generated pair.
"""
import os.path as osp
from typing import Tuple

import numpy as np
import pytest
from PIL import Image

from mmlinvit.datasets.integrity import check_sample

RED = (255, 0, 0)


def _write_pair(folder, orientation: int, label_size: Tuple[int, int] = (100, 60)):
    """A 100x60 (WxH) JPEG whose left half is red, tagged with ``orientation``, and a label
    map of ``label_size`` (WxH) whose left half is class 1 (drawn on the stored pixels)."""
    img = np.zeros((60, 100, 3), np.uint8)
    img[:, :50] = RED
    image = Image.fromarray(img)
    exif = image.getexif()
    if orientation:
        exif[0x0112] = orientation
    img_path = osp.join(str(folder), 'scene.jpg')
    image.save(img_path, exif=exif.tobytes(), quality=100)
    width, height = label_size
    label = np.full((height, width), 2, np.uint8)
    label[:, :width // 2] = 1
    seg_path = osp.join(str(folder), 'scene.png')
    Image.fromarray(label).save(seg_path)
    return img_path, seg_path


def _load(img_path: str, seg_path: str, color_type: str):
    """(image HxWx3 BGR, label HxW) as mmseg's train pipeline loads them."""
    from mmcv.transforms import LoadImageFromFile
    from mmseg.datasets.transforms import LoadAnnotations
    results = LoadImageFromFile(color_type=color_type)(dict(img_path=img_path))
    results = LoadAnnotations()(dict(results, seg_map_path=seg_path, reduce_zero_label=False,
                                     seg_fields=[]))
    return results['img'], results['gt_seg_map']


def test_rotated_jpeg_with_stored_label_map_is_reported(tmp_path):
    img_path, seg_path = _write_pair(tmp_path, orientation=6)
    problems = check_sample(img_path, seg_path)
    assert len(problems) == 1 and problems[0][0] == seg_path
    reason = problems[0][1]
    assert 'EXIF Orientation=6' in reason and 'rotated 90 degrees clockwise' in reason
    assert "color_type='color_ignore_orientation'" in reason and 'strip the tag' in reason

    # the reference: mmseg's pipeline turns the image and not its label map
    img, gt = _load(img_path, seg_path, 'color')
    assert img.shape[:2] == (100, 60) and gt.shape == (60, 100)
    # the advised fix: the red (class 1) half of the image lands on class 1 again
    img, gt = _load(img_path, seg_path, 'color_ignore_orientation')
    assert img.shape[:2] == gt.shape == (60, 100)
    red = (img[..., 2] > 200) & (img[..., 0] < 50)  # BGR
    assert np.array_equal(red, gt == 1)


@pytest.mark.parametrize('orientation', [2, 3, 5, 7, 8])
def test_every_turning_orientation_is_reported(tmp_path, orientation):
    img_path, seg_path = _write_pair(tmp_path, orientation=orientation)
    problems = check_sample(img_path, seg_path)
    assert len(problems) == 1 and f'EXIF Orientation={orientation}' in problems[0][1]


def test_an_orientation_that_leaves_the_pixels_alone_pairs_up(tmp_path):
    """Orientation 4 (upside down) maps this left-red image onto itself: the pipeline's
    image equals the stored one, so its stored label map pairs up and nothing is reported."""
    img_path, seg_path = _write_pair(tmp_path, orientation=4)
    img, gt = _load(img_path, seg_path, 'color')
    red = (img[..., 2] > 200) & (img[..., 0] < 50)  # BGR
    assert img.shape[:2] == gt.shape and np.array_equal(red, gt == 1)
    assert check_sample(img_path, seg_path) == []


def test_label_map_of_the_displayed_image_pairs_up(tmp_path):
    """Drawn on the turned image (60x100): what the default pipeline hands over, no problem,
    although the stored sizes differ."""
    img_path, seg_path = _write_pair(tmp_path, orientation=6, label_size=(60, 100))
    assert check_sample(img_path, seg_path) == []
    img, gt = _load(img_path, seg_path, 'color')
    assert img.shape[:2] == gt.shape == (100, 60)


def test_plain_images_and_wrong_sizes(tmp_path):
    for orientation in (0, 1):  # no tag, or 'as stored'
        img_path, seg_path = _write_pair(tmp_path, orientation=orientation)
        assert check_sample(img_path, seg_path) == []
        assert check_sample(img_path, None) == []  # classification: nothing to pair
    img_path, seg_path = _write_pair(tmp_path, orientation=6, label_size=(50, 50))
    (path, reason), = check_sample(img_path, seg_path)
    assert path == seg_path and 'label map is 50x50 (WxH)' in reason
    assert '100x60 as stored and 60x100 after its EXIF Orientation=6' in reason
    img_path, _ = _write_pair(tmp_path, orientation=6)
    assert check_sample(img_path, None) == []  # both loaders of an image turn it alike


def _write_format_pair(folder, suffix: str, orientation: int, drawn_on: str):
    """A 100x60 (WxH) image (left half red, EXIF ``orientation``) as ``suffix``, and a label
    map whose class 1 is where the image is red ``drawn_on`` its ``'stored'`` pixels or the
    ``'displayed'`` (turned) ones."""
    from PIL import ImageOps
    img = np.zeros((60, 100, 3), np.uint8)
    img[:, :50] = RED
    image = Image.fromarray(img)
    exif = image.getexif()
    exif[0x0112] = orientation
    img_path = osp.join(str(folder), f'scene{suffix}')
    options = dict(lossless=True) if suffix == '.webp' else dict(quality=100)
    image.save(img_path, exif=exif.tobytes(), **options)
    with Image.open(img_path) as saved:
        assert saved.getexif().get(0x0112) == orientation  # the tag was written
        seen = np.asarray(ImageOps.exif_transpose(saved) if drawn_on == 'displayed' else saved)
    label = np.where(seen[..., 0] > 200, 1, 2).astype(np.uint8)
    seg_path = osp.join(str(folder), 'label.png')
    Image.fromarray(label).save(seg_path)
    return img_path, seg_path


@pytest.mark.parametrize('suffix', ['.jpg', '.webp', '.png'])
@pytest.mark.parametrize('color_type,backend', [('color', 'cv2'), ('color', 'pillow'),
                                                ('color_ignore_orientation', 'cv2')])
@pytest.mark.parametrize('orientation,drawn_on', [(6, 'stored'), (6, 'displayed'),
                                                  (2, 'stored'), (1, 'stored')])
def test_the_verdict_is_the_pipelines_pairing(tmp_path, suffix, color_type, backend,
                                              orientation, drawn_on):
    """The reference is mmcv's ``LoadImageFromFile`` with the dataset's ``color_type`` /
    ``imdecode_backend`` and mmseg's ``LoadAnnotations``: a sample is fine exactly when the
    label map has the loaded image's size and class 1 lies on its red pixels.  Before, the
    check assumed every loader turns every image: a WebP read by cv2 (which ignores its tag)
    was reported though it pairs up, and so was every image of a pipeline already set to
    ``color_type='color_ignore_orientation'`` (the fix the report itself advises)."""
    from mmcv.transforms import LoadImageFromFile
    from mmseg.datasets.transforms import LoadAnnotations

    from mmlinvit.datasets.integrity import ImageDecoding
    img_path, seg_path = _write_format_pair(tmp_path, suffix, orientation, drawn_on)
    loaded = LoadImageFromFile(color_type=color_type, imdecode_backend=backend)(
        dict(img_path=img_path))
    loaded = LoadAnnotations()(dict(loaded, seg_map_path=seg_path, reduce_zero_label=False,
                                    seg_fields=[]))
    img, gt = loaded['img'], loaded['gt_seg_map']
    red = (img[..., 2] > 200) & (img[..., 0] < 50)  # BGR
    pairs_up = img.shape[:2] == gt.shape and np.array_equal(red, gt == 1)
    problems = check_sample(img_path, seg_path, ImageDecoding(color_type, backend))
    assert (problems == []) == pairs_up, (problems, img.shape, gt.shape)


def test_a_dataset_scan_reads_its_pipelines_decoding(tmp_path):
    """``scan_dataset_files`` takes the decoding from the built dataset's pipeline: after the
    advised fix (``color_type='color_ignore_orientation'``) a rotated JPEG with a label map of
    its stored pixels is no longer reported; with mmseg's default loader it is."""
    from mmseg.datasets import BaseSegDataset

    from mmlinvit.datasets.integrity import ImageDecoding, scan_dataset_files
    for sub in ('img', 'ann'):
        (tmp_path / sub).mkdir()
    img_path, seg_path = _write_pair(tmp_path / 'img', orientation=6)
    import shutil
    shutil.move(seg_path, str(tmp_path / 'ann' / 'scene.png'))
    bad = {}
    for color_type in ('color', 'color_ignore_orientation'):
        dataset = BaseSegDataset(
            data_root=str(tmp_path), data_prefix=dict(img_path='img', seg_map_path='ann'),
            img_suffix='.jpg', seg_map_suffix='.png', metainfo=dict(classes=('a', 'b', 'c')),
            pipeline=[dict(type='LoadImageFromFile', color_type=color_type),
                      dict(type='LoadAnnotations')])
        assert ImageDecoding.of_dataset(dataset) == ImageDecoding(color_type, 'cv2')
        bad[color_type] = scan_dataset_files(dataset, num_threads=1).bad
    assert len(bad['color']) == 1 and 'EXIF Orientation=6' in bad['color'][0][1]
    assert bad['color_ignore_orientation'] == []


def test_the_advised_fix_keeps_the_pipelines_colour_type(tmp_path):
    """A grayscale pipeline (``color_type='grayscale'``, mmcv's IMREAD_GRAYSCALE turns a JPEG
    by its tag) is told to set ``'grayscale_ignore_orientation'``, the flag that keeps it
    grayscale; the message named ``'color_ignore_orientation'`` (three channels) and mmseg's
    default ``color_type='color'``.  The advice, run through mmcv's loader, pairs up."""
    from mmlinvit.datasets.integrity import ImageDecoding
    img_path, seg_path = _write_pair(tmp_path, orientation=6)
    problems = check_sample(img_path, seg_path, ImageDecoding('grayscale', 'cv2'))
    assert len(problems) == 1
    reason = problems[0][1]
    assert "color_type='grayscale', imdecode_backend='cv2'" in reason
    assert "color_type='grayscale_ignore_orientation'" in reason
    img, gt = _load(img_path, seg_path, 'grayscale')
    assert img.shape[:2] == (100, 60) and gt.shape == (60, 100)  # the problem, by mmcv
    img, gt = _load(img_path, seg_path, 'grayscale_ignore_orientation')
    assert img.ndim == 2 and img.shape == gt.shape  # the advice: still grayscale, paired
    assert check_sample(img_path, seg_path, ImageDecoding('grayscale_ignore_orientation')) == []
