"""Decode every image and label map of a dataset before training (``tools/train.py --check-data``).

A corrupt, truncated or empty file otherwise stops a run when a data worker first reads it,
possibly hours in (mmseg's ``LoadAnnotations`` then reports a Pillow error on a ``BytesIO``,
without the file's name).  :func:`scan_dataset_files` reads every file of a built dataset with
Pillow in full (``Image.load()``, which refuses truncated files), checks that each label map has
its image's size (after the image's EXIF orientation where the dataset's image loader applies
it, which its label loader never does: an image the pipeline turns next to a label map of its
stored pixels is reported), and returns the bad files with the reason.  Whether the loader
turns an image is measured, not assumed: the file is decoded as the pipeline's
``LoadImageFromFile`` decodes it (its ``color_type`` and ``imdecode_backend``) and with the
orientation ignored, and the two are compared (cv2 turns a JPEG / PNG / TIFF but not a WebP;
Pillow turns all of them; ``color_type='color_ignore_orientation'`` turns none).  It runs in
threads (Pillow's decoders release the GIL) and reports progress through a callback.  In a
distributed run each process scans its share (``rank::world_size``); the caller gathers the results.
"""
import concurrent.futures
import dataclasses
from typing import Any, Callable, Iterator, List, Optional, Tuple

import numpy as np
from PIL import Image

#: Samples per progress report, at most (a report is also made every 5 % of the data).
PROGRESS_EVERY = 1000
_CHUNK = 4096


@dataclasses.dataclass
class ScanResult:
    """Outcome of a scan.

    Args:
        num_samples: Samples checked.
        num_files: Files decoded (images + label maps).
        bad: ``(path, reason)`` of every file that cannot be used.
    """

    num_samples: int = 0
    num_files: int = 0
    bad: List[Tuple[str, str]] = dataclasses.field(default_factory=list)


#: First bytes of a TIFF file (little- and big-endian).
TIFF_MAGIC = (b'II*\x00', b'MM\x00*')
#: EXIF tag of the orientation (1 = as stored; 2-8 = flip / rotate when displayed).
EXIF_ORIENTATION = 0x0112
#: What each EXIF orientation does to the stored pixels when it is applied.
ORIENTATIONS = {2: 'mirrored', 3: 'rotated 180 degrees', 4: 'flipped upside down',
                5: 'transposed', 6: 'rotated 90 degrees clockwise', 7: 'transversed',
                8: 'rotated 90 degrees counter-clockwise'}


@dataclasses.dataclass(frozen=True)
class ImageDecoding:
    """How a pipeline decodes its images: mmcv ``LoadImageFromFile``'s settings.

    Args:
        color_type: ``color_type`` (mmcv ``imfrombytes`` ``flag``).
        backend: ``imdecode_backend``.
    """

    color_type: str = 'color'
    backend: str = 'cv2'

    @classmethod
    def of_dataset(cls, dataset: Any) -> 'ImageDecoding':
        """The decoding of the first mmcv ``LoadImageFromFile`` (mmseg's and mmpretrain's
        image loader, or a subclass) in ``dataset.pipeline``; mmcv's defaults without one."""
        from mmcv.transforms import LoadImageFromFile
        for transform in getattr(getattr(dataset, 'pipeline', None), 'transforms', ()):
            if isinstance(transform, LoadImageFromFile):
                return cls(transform.color_type, transform.imdecode_backend)
        return cls()


def _orientation_applied(path: str, decoding: ImageDecoding) -> bool:
    """Whether loading ``path`` with ``decoding`` applies its EXIF orientation.

    Decodes the file as the pipeline does and with ``<color_type>_ignore_orientation`` and
    compares the pixels (an image that the orientation leaves unchanged counts as not turned:
    its label map pairs up either way).  Only ``'color'`` / ``'grayscale'`` can turn an image;
    mmcv's ``turbojpeg`` and ``tifffile`` backends never do.
    """
    import mmcv
    if decoding.color_type not in ('color', 'grayscale') or \
            decoding.backend not in ('cv2', 'pillow'):
        return False
    with open(path, 'rb') as f:
        content = f.read()
    loaded = mmcv.imfrombytes(content, flag=decoding.color_type, backend=decoding.backend)
    stored = mmcv.imfrombytes(content, flag=f'{decoding.color_type}_ignore_orientation',
                              backend=decoding.backend)
    return loaded.shape != stored.shape or not np.array_equal(loaded, stored)


def _loaded_size(path: str, decoding: ImageDecoding,
                 fallback: Tuple[int, int]) -> Tuple[int, int]:
    """(width, height) of ``path`` as the pipeline decodes it (mmcv, the dataset's backend).

    Differs from Pillow's size for a TIFF with an EXIF orientation that turns it: Pillow turns
    such a TIFF when it opens it (so do mmcv's cv2 and pillow backends), mmcv's ``tifffile``
    backend does not.  Other formats, and files mmcv decodes to nothing (reported
    elsewhere), give ``fallback`` (Pillow's size) without decoding.
    """
    import mmcv
    with open(path, 'rb') as f:
        content = f.read(len(TIFF_MAGIC[0]))
        if content not in TIFF_MAGIC:  # not a TIFF: decided by its first bytes, not read on
            return fallback
        content += f.read()
    img = mmcv.imfrombytes(content, flag=decoding.color_type, backend=decoding.backend)
    return fallback if img is None else (img.shape[1], img.shape[0])


def _decode(path: str) -> Tuple[Optional[Tuple[int, int]], Optional[str], int]:
    """(width, height) of a fully decoded image (as stored; a TIFF as Pillow turns it, see
    :func:`_loaded_size`) or the reason it cannot be decoded, and its EXIF orientation (1 when
    it has none)."""
    try:
        with Image.open(path) as img:
            # Read before load(): loading a TIFF applies its orientation and drops the tag.
            orientation = img.getexif().get(EXIF_ORIENTATION, 1)
            img.load()
            return img.size, None, orientation if orientation in ORIENTATIONS else 1
    except Exception as err:  # noqa: BLE001 (any decoder failure makes the file unusable)
        return None, f'cannot be decoded ({type(err).__name__}: {err})', 1


def _orientation_problem(img_path: str, img_size: Tuple[int, int], orientation: int,
                         seg_size: Tuple[int, int], decoding: ImageDecoding) -> Optional[str]:
    """The problem of a label map next to an image with an EXIF orientation, or ``None``.

    Called for an image the pipeline's ``LoadImageFromFile`` turns (``decoding``; mmseg's
    default ``color_type='color'``: cv2 ``IMREAD_COLOR`` for most formats, Pillow's
    ``exif_transpose`` for the pillow backend); ``LoadAnnotations`` reads the label map as
    stored.  A label map of the stored size is then paired with a flipped / rotated image.
    One of the displayed size (orientations 5-8 swap the sides) was drawn on the turned image
    and pairs up.
    """
    shown = img_size[::-1] if orientation >= 5 else img_size
    if seg_size == shown and shown != img_size:
        return None  # drawn on the displayed (turned) image: what the pipeline hands over
    if seg_size != img_size:
        return (f'label map is {seg_size[0]}x{seg_size[1]} (WxH) but its image {img_path!r} '
                f'is {img_size[0]}x{img_size[1]} as stored and {shown[0]}x{shown[1]} after '
                f'its EXIF Orientation={orientation} is applied')
    return (f'its image {img_path!r} has EXIF Orientation={orientation}: the pipeline\'s '
            f'LoadImageFromFile (color_type={decoding.color_type!r}, imdecode_backend='
            f'{decoding.backend!r}) hands the model the image '
            f'{ORIENTATIONS[orientation]}, but LoadAnnotations reads this label map as stored, '
            f'so labels land on the wrong pixels (no error is raised). Fix: set '
            f'color_type={decoding.color_type + "_ignore_orientation"!r} in the '
            f'LoadImageFromFile of the train / val / test pipelines, or strip the tag from the '
            f'images (e.g. exiftool '
            f'-Orientation= -overwrite_original); if the label maps were drawn on the displayed '
            f'image instead, write the images turned (PIL.ImageOps.exif_transpose) without the '
            f'tag')


def check_sample(img_path: str,
                 seg_map_path: Optional[str],
                 decoding: Optional[ImageDecoding] = None) -> List[Tuple[str, str]]:
    """Decodes one image and its label map (if any); returns ``(path, reason)`` problems.

    Besides files that do not decode and label maps of another size than their image (as the
    pipeline loads it), an image that the pipeline turns by its EXIF orientation next to a
    label map of its stored size is a problem: the image is turned, not the label map.

    Args:
        img_path: Image file.
        seg_map_path: Label map file, or ``None`` (classification).
        decoding: How the pipeline decodes images (default: mmseg's, ``color_type='color'``
            with cv2; :meth:`ImageDecoding.of_dataset` reads a dataset's).

    Returns:
        Problems; empty when both decode and their pixels pair up as the pipeline loads them.
    """
    decoding = decoding or ImageDecoding()
    problems = []
    img_size, reason, orientation = _decode(img_path)
    if reason:
        problems.append((img_path, f'image {reason}'))
    if seg_map_path is not None:
        seg_size, reason, _ = _decode(seg_map_path)
        if reason:
            problems.append((seg_map_path, f'label map {reason}'))
        elif img_size is not None and orientation != 1 and \
                _orientation_applied(img_path, decoding):
            problem = _orientation_problem(img_path, img_size, orientation, seg_size, decoding)
            if problem:
                problems.append((seg_map_path, problem))
        elif img_size is not None:
            if orientation != 1:  # the size as loaded (see _loaded_size: TIFFs)
                img_size = _loaded_size(img_path, decoding, img_size)
            if seg_size != img_size:
                problems.append((seg_map_path,
                                 f'label map is {seg_size[0]}x{seg_size[1]} (WxH) but its image '
                                 f'{img_path!r} is {img_size[0]}x{img_size[1]}'))
    return problems


def iter_sample_files(dataset: Any, rank: int = 0,
                      world_size: int = 1) -> Iterator[Tuple[str, Optional[str]]]:
    """(image, label map or ``None``) of every ``world_size``-th sample of a built dataset.

    Samples without an ``img_path`` (e.g. CIFAR's in-memory arrays) are skipped.

    Args:
        dataset: A fully initialised mmengine ``BaseDataset``.
        rank: This process's share.
        world_size: Number of processes sharing the scan.
    """
    for idx in range(rank, len(dataset), world_size):
        info = dataset.get_data_info(idx)
        if info.get('img_path'):
            yield info['img_path'], info.get('seg_map_path')


def scan_dataset_files(dataset: Any,
                       rank: int = 0,
                       world_size: int = 1,
                       num_threads: int = 4,
                       progress: Optional[Callable[[int, int, int], None]] = None) -> ScanResult:
    """Decodes the files of this process's share of ``dataset``.

    Args:
        dataset: A fully initialised mmengine dataset (mmseg / mmpretrain).
        rank: This process's share (``rank::world_size``).
        world_size: Number of processes sharing the scan.
        num_threads: Decoding threads.
        progress: ``progress(done, total, num_bad)``, called every :data:`PROGRESS_EVERY`
            samples or 5 % of the share, and at the end.

    Returns:
        A :class:`ScanResult` of this share.
    """
    samples = list(iter_sample_files(dataset, rank, world_size))
    decoding = ImageDecoding.of_dataset(dataset)
    total = len(samples)
    every = max(1, min(PROGRESS_EVERY, total // 20))
    result = ScanResult()
    done = 0
    with concurrent.futures.ThreadPoolExecutor(max(1, num_threads)) as pool:
        for start in range(0, total, _CHUNK):  # bounded number of pending futures
            chunk = samples[start:start + _CHUNK]
            checked = pool.map(lambda sample: check_sample(*sample, decoding), chunk)
            for sample, problems in zip(chunk, checked):
                done += 1
                result.num_samples += 1
                result.num_files += 1 + int(sample[1] is not None)
                result.bad.extend(problems)
                if progress is not None and (done % every == 0 or done == total):
                    progress(done, total, len(result.bad))
    return result
