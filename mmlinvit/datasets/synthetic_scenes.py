"""Procedurally drawn outdoor scenes written in mmseg's ADE20K or Cityscapes folder layouts.

Used by the embedded demo and the tests: every scene has a sky / ground split at a random
horizon (vertical colour gradients), then buildings (textured rectangles with windows),
trees (noisy disks), mountains (triangles rising from the horizon) and lakes (rippled
ellipses on the ground) in class-specific colours with per-object jitter.  A 1-pixel band
around every object is left *unlabelled* (ADE20K label 0, Cityscapes 255) so that the
ignore conventions are exercised.

Only numpy and Pillow are needed; generation is deterministic for a given seed.
"""
import os
import os.path as osp
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
from PIL import Image

#: Class names of the toy scenes, in label order (ADE20K labels are index + 1).
SCENE_CLASSES: Tuple[str, ...] = ('sky', 'ground', 'building', 'tree', 'mountain', 'lake')
#: A display palette (RGB) per class.
SCENE_PALETTE: Tuple[Tuple[int, int, int], ...] = ((70, 130, 180), (152, 251, 152),
                                                   (70, 70, 70), (107, 142, 35),
                                                   (120, 90, 60), (0, 60, 100))
#: Cityscapes train ids the toy classes are written as (sky, terrain, building,
#: vegetation, wall, car is not used; 'lake' uses 'road' for a flat surface).
CITYSCAPES_TRAIN_IDS: Tuple[int, ...] = (10, 9, 2, 8, 3, 0)

_SKY, _GROUND, _BUILDING, _TREE, _MOUNTAIN, _LAKE = range(6)


def _gradient(h: int, w: int, top: Sequence[float], bottom: Sequence[float]) -> np.ndarray:
    t = np.linspace(0.0, 1.0, h, dtype=np.float32)[:, None, None]
    return np.broadcast_to((1 - t) * np.asarray(top, np.float32) +
                           t * np.asarray(bottom, np.float32), (h, w, 3)).copy()


def _jitter(rng: np.random.Generator, rgb: Sequence[float], amount: float = 18.0) -> np.ndarray:
    return np.clip(np.asarray(rgb, np.float32) + rng.uniform(-amount, amount, 3), 0, 255)


def _outline(mask: np.ndarray) -> np.ndarray:
    """Pixels within one pixel of the mask border (outside or inside)."""
    pad = np.pad(mask, 1, mode='edge')
    grown = (pad[:-2, 1:-1] | pad[2:, 1:-1] | pad[1:-1, :-2] | pad[1:-1, 2:] | mask)
    shrunk = (pad[:-2, 1:-1] & pad[2:, 1:-1] & pad[1:-1, :-2] & pad[1:-1, 2:] & mask)
    return grown & ~shrunk


def draw_scene(rng: np.random.Generator, height: int, width: int,
               max_objects: int = 4) -> Tuple[np.ndarray, np.ndarray]:
    """Draws one scene.

    Args:
        rng: Random generator.
        height: Image height.
        width: Image width.
        max_objects: Maximum number of objects besides sky and ground.

    Returns:
        RGB image (H, W, 3) uint8 and class map (H, W) int64 with values in
        ``[0, len(SCENE_CLASSES))`` or ``-1`` for unlabelled pixels.
    """
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    horizon = int(rng.uniform(0.3, 0.6) * height)
    img = np.empty((height, width, 3), np.float32)
    label = np.full((height, width), _GROUND, np.int64)
    img[:horizon] = _gradient(horizon, width, _jitter(rng, (90, 140, 230)),
                              _jitter(rng, (190, 215, 250)))
    img[horizon:] = _gradient(height - horizon, width, _jitter(rng, (120, 160, 80)),
                              _jitter(rng, (150, 120, 70)))
    label[:horizon] = _SKY
    unlabelled = np.zeros((height, width), bool)

    for _ in range(int(rng.integers(1, max_objects + 1))):
        kind = int(rng.choice([_BUILDING, _TREE, _MOUNTAIN, _LAKE], p=[0.25, 0.35, 0.2, 0.2]))
        size = rng.uniform(0.15, 0.35) * min(height, width)
        cx = rng.uniform(0.1, 0.9) * width
        if kind == _BUILDING:
            bw, bh = size * rng.uniform(0.6, 1.2), size * rng.uniform(1.0, 2.0)
            base = horizon + rng.uniform(0, 0.15) * height
            mask = (np.abs(xx - cx) < bw / 2) & (yy < base) & (yy > base - bh)
            colour = _jitter(rng, (95, 95, 125), 15)
            windows = ((xx.astype(int) // 3 % 2 == 0) & (yy.astype(int) // 4 % 2 == 0))
            texture = np.where(windows[..., None], colour * 0.55 + 100, colour)
        elif kind == _TREE:
            cy = horizon + rng.uniform(-0.1, 0.15) * height
            mask = (xx - cx)**2 + (yy - cy)**2 < (0.6 * size)**2
            colour = _jitter(rng, (20, 75, 25), 10)
            leaves = ((xx.astype(int) + yy.astype(int)) % 4 < 2)[..., None]
            texture = colour + np.where(leaves, np.float32(30), np.float32(-10))
        elif kind == _MOUNTAIN:
            half = size * rng.uniform(1.0, 1.8)
            peak = horizon - size * rng.uniform(0.6, 1.2)
            mask = (yy <= horizon) & (yy >= peak + np.abs(xx - cx) * (horizon - peak) / half)
            colour = _jitter(rng, (140, 95, 55), 12)
            snow = yy < peak + 0.25 * (horizon - peak)
            texture = np.where(snow[..., None], np.float32(235), colour)
        else:  # lake
            cy = horizon + rng.uniform(0.2, 0.7) * (height - horizon)
            ax, ay = size * rng.uniform(0.8, 1.4), size * rng.uniform(0.25, 0.45)
            mask = ((xx - cx) / ax)**2 + ((yy - cy) / ay)**2 < 1.0
            colour = _jitter(rng, (40, 90, 170), 15)
            ripples = 14.0 * np.sin(yy * 1.7)[..., None]
            texture = colour + ripples
        if not mask.any():
            continue
        img = np.where(mask[..., None], texture, img)
        label[mask] = kind
        unlabelled = (unlabelled & ~mask) | _outline(mask)

    img = img + rng.normal(0, 4, img.shape)
    label[unlabelled] = -1
    return np.clip(img, 0, 255).astype(np.uint8), label


def _write(path: str, array: np.ndarray, **save_kwargs) -> None:
    os.makedirs(osp.dirname(path), exist_ok=True)
    Image.fromarray(array).save(path, **save_kwargs)


def _write_splits(counts: Dict[str, int], size: Tuple[int, int], seed: int,
                  write: Callable[[str, int, np.ndarray, np.ndarray], str]) -> Dict[str, List[str]]:
    """Draws the scenes of every split from one generator, in order, and writes them.

    Args:
        counts: ``{split: number of scenes}``.
        size: (height, width).
        seed: Random seed.
        write: ``write(split, index, image, label)`` writes one scene and returns its stem.

    Returns:
        ``{split: [stems]}``.
    """
    rng = np.random.default_rng(seed)
    return {
        split: [write(split, i, *draw_scene(rng, *size)) for i in range(count)]
        for split, count in counts.items()
    }


def make_ade20k_layout(root: str,
                       num_train: int = 64,
                       num_val: int = 16,
                       size: Tuple[int, int] = (64, 64),
                       seed: int = 0) -> Dict[str, List[str]]:
    """Writes scenes as ``root/images/{training,validation}/*.jpg`` and ``root/annotations/...png``.

    Labels follow ADE20K: 0 = unlabelled ("other", dropped by ``reduce_zero_label``), class
    ``c`` of :data:`SCENE_CLASSES` is ``c + 1``.

    Args:
        root: Data root (the ``ADEChallengeData2016`` folder).
        num_train: Training images.
        num_val: Validation images.
        size: (height, width).
        seed: Random seed.

    Returns:
        ``{'training': [stems], 'validation': [stems]}``.
    """

    def write(split: str, i: int, img: np.ndarray, label: np.ndarray) -> str:
        stem = f'ADE_{"train" if split == "training" else "val"}_{i:08d}'
        _write(osp.join(root, 'images', split, stem + '.jpg'), img, quality=95)
        _write(osp.join(root, 'annotations', split, stem + '.png'), (label + 1).astype(np.uint8))
        return stem

    return _write_splits({'training': num_train, 'validation': num_val}, size, seed, write)


def make_cityscapes_layout(root: str,
                           num_train: int = 8,
                           num_val: int = 4,
                           size: Tuple[int, int] = (64, 128),
                           seed: int = 0,
                           city: str = 'toytown') -> Dict[str, List[str]]:
    """Writes scenes as Cityscapes: ``leftImg8bit/{train,val}/<city>/*_leftImg8bit.png`` and
    ``gtFine/{train,val}/<city>/*_gtFine_labelTrainIds.png`` (already converted train ids,
    255 = ignore), i.e. the layout after mmseg's ``tools/dataset_converters/cityscapes.py``.

    Args:
        root: Data root (``data/cityscapes``).
        num_train: Training images.
        num_val: Validation images.
        size: (height, width).
        seed: Random seed.
        city: City folder name.

    Returns:
        ``{'train': [stems], 'val': [stems]}``.
    """
    lut = np.full(len(SCENE_CLASSES) + 1, 255, np.uint8)
    lut[:len(SCENE_CLASSES)] = CITYSCAPES_TRAIN_IDS  # index -1 (unlabelled) -> 255

    def write(split: str, i: int, img: np.ndarray, label: np.ndarray) -> str:
        stem = f'{city}_{i:06d}_000019'
        _write(osp.join(root, 'leftImg8bit', split, city, stem + '_leftImg8bit.png'), img)
        _write(osp.join(root, 'gtFine', split, city, stem + '_gtFine_labelTrainIds.png'),
               lut[label])
        return stem

    return _write_splits({'train': num_train, 'val': num_val}, size, seed, write)
