"""Real photographs shipped inside scikit-image's wheel (no download), for analysis figures.

``skimage.data`` bundles a handful of real photos in the installed package (astronaut, chelsea
the cat, a cup of coffee, a rocket on its launch pad, a motorcycle).  They give the attention-map
tools and the demo natural images on an offline machine.  scikit-image is part of the pinned
stack (``tools/requirements/stack.txt``).
"""
from typing import Dict, Tuple

import numpy as np

#: Photo name -> short caption.  Each is an RGB photograph stored in the scikit-image wheel.
REAL_PHOTOS: Dict[str, str] = {
    'astronaut': 'astronaut Eileen Collins (NASA)',
    'chelsea': 'Chelsea the cat',
    'coffee': 'a cup of coffee',
    'rocket': 'a rocket on its launch pad (NASA)',
    'motorcycle': 'a motorcycle (Middlebury stereo, left view)',
}


def _load_skimage_photo(name: str) -> np.ndarray:
    try:
        from skimage import data
    except ImportError as err:
        raise ImportError('real photos come from scikit-image, which is not installed: '
                          '`pip install -r tools/requirements/stack.txt` (or `pip install '
                          'scikit-image`)') from err
    if name == 'motorcycle':
        return data.stereo_motorcycle()[0]
    return getattr(data, name)()


def load_photo(name: str, size_hw: Tuple[int, int]) -> np.ndarray:
    """A real photograph, centre-cropped to the aspect of ``size_hw`` and resized to it.

    Args:
        name: One of :data:`REAL_PHOTOS`.
        size_hw: Output (height, width) in pixels.

    Returns:
        (H, W, 3) uint8 RGB array.
    """
    if name not in REAL_PHOTOS:
        raise KeyError(f'unknown photo {name!r}; available: {", ".join(REAL_PHOTOS)}')
    image = np.asarray(_load_skimage_photo(name))
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f'scikit-image photo {name!r} is {image.shape} {image.dtype}, '
                         f'expected (H, W, 3) uint8 RGB')
    return center_crop_resize(image, size_hw)


def center_crop_resize(image: np.ndarray, size_hw: Tuple[int, int]) -> np.ndarray:
    """Largest centred crop with the aspect of ``size_hw``, resized (bicubic) to it.

    Args:
        image: (H, W, 3) uint8 image.
        size_hw: Output (height, width).

    Returns:
        (height, width, 3) uint8 array.
    """
    from PIL import Image
    out_h, out_w = int(size_hw[0]), int(size_hw[1])
    if out_h <= 0 or out_w <= 0:
        raise ValueError(f'size must be positive, got {size_hw}')
    h, w = image.shape[:2]
    if h * out_w > w * out_h:  # too tall: crop rows
        crop_h, crop_w = max(1, round(w * out_h / out_w)), w
    else:
        crop_h, crop_w = h, max(1, round(h * out_w / out_h))
    top, left = (h - crop_h) // 2, (w - crop_w) // 2
    crop = image[top:top + crop_h, left:left + crop_w]
    resized = Image.fromarray(crop).resize((out_w, out_h), Image.BICUBIC)
    return np.array(resized)  # writable (torch.from_numpy warns on read-only arrays)
