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


@pytest.mark.parametrize('orientation', [2, 3, 4, 5, 7, 8])
def test_every_turning_orientation_is_reported(tmp_path, orientation):
    img_path, seg_path = _write_pair(tmp_path, orientation=orientation)
    problems = check_sample(img_path, seg_path)
    assert len(problems) == 1 and f'EXIF Orientation={orientation}' in problems[0][1]


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
