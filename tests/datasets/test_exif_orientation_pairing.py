"""EXIF orientations: mirrored / rotated-180 / flipped images next to a label map of the
stored size are reported; a transposed (5) image whose label map has the displayed size pairs
up.  (The images have a bright top-left quadrant: a flip must change their pixels, else
the pipeline's image equals the stored one and the pair is fine.)"""
import numpy as np
import pytest
from PIL import Image
from mmlinvit.datasets.integrity import check_sample


def _write(path, size, orientation=None):
    pixels = np.zeros((size[1], size[0], 3), np.uint8)
    pixels[:size[1] // 2, :size[0] // 2] = 255
    img = Image.fromarray(pixels if orientation else pixels[..., 0])
    if orientation:
        exif = Image.Exif()
        exif[0x0112] = orientation
        img.save(path, exif=exif)
    else:
        img.save(path)
    return str(path)


@pytest.mark.parametrize('orientation', [2, 3, 4])
def test_flip_orientations_next_to_a_stored_size_label_map_are_reported(tmp_path, orientation):
    img = _write(tmp_path / 'a.jpg', (40, 20), orientation)
    seg = _write(tmp_path / 'a.png', (40, 20))
    problems = check_sample(img, seg)
    assert len(problems) == 1 and f'EXIF Orientation={orientation}' in problems[0][1], problems


def test_transposed_image_with_a_displayed_size_label_map_pairs_up(tmp_path):
    img = _write(tmp_path / 'a.jpg', (40, 20), 5)
    seg = _write(tmp_path / 'a.png', (20, 40))
    assert check_sample(img, seg) == []
