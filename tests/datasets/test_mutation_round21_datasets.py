"""Dataset pairing, data integrity checks and toy scenes (mutation round 21).

Each test checks behaviour against an independent reference: mmseg's ``BaseSegDataset`` /
``ADE20KDataset`` / ``CityscapesDataset``, mmpretrain's ``CustomDataset``, mmcv's
``LoadImageFromFile`` and mmseg's ``LoadAnnotations`` run on files Pillow writes into
``tmp_path``, or a value worked out by hand in the test.  Guarded:

* ``datasets.pairing``: a dangling symbolic link is neither an image nor a label map, as
  mmengine's ``list_dir_or_file`` (which skips it) and mmseg's loader (which cannot open it)
  see it - a FINDING of this round, the pairing counted both (the fix is in
  ``mmlinvit/datasets/pairing.py``: ``_walk`` lists regular files only); a segmentation
  dataset without ``seg_map_path`` (mmseg lists its images without label maps); missing
  ADE20K label maps get no Cityscapes-converter advice; more than three blank lines of an
  annotation file are counted and three named; the texts of a classification folder
  without images; 1-based line numbers of lines without an integer label;
* ``datasets.integrity``: mmcv's ``turbojpeg`` backend never turns an image and takes no
  ``*_ignore_orientation`` flag; whether an image is turned is
  measured with the pipeline's own backend; the decoding is that of the first
  ``LoadImageFromFile`` (subclasses included); progress every 1,000 samples of a large
  share; an image and its label map that both fail are two problems, named with the
  decoder's error type;
* ``datasets.synthetic_scenes``: the documented defaults of ``make_ade20k_layout`` (64 / 16
  scenes of 64x64) and ``make_cityscapes_layout`` (8 / 4 scenes of 64x128 in ``toytown``),
  as mmseg's ``ADE20KDataset`` / ``CityscapesDataset`` list them.
"""
import copy
import os
import os.path as osp
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np
import pytest
from mmengine.registry import DefaultScope
from PIL import Image

from mmlinvit.datasets.pairing import pair_dataset_files

WHERE = 'train_dataloader.dataset'


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'x')


def _mmseg_samples(cfg: dict) -> List[dict]:
    """The samples mmseg's own dataset lists for ``cfg`` (the oracle), paths relative to
    ``data_root``."""
    import mmseg.datasets  # noqa: F401 - fills the registry
    from mmengine.registry import DATASETS
    with DefaultScope.overwrite_default_scope('mmseg'):
        ds = DATASETS.build(dict(copy.deepcopy(cfg), lazy_init=True, pipeline=[]))
    root = cfg['data_root']
    return [{key: osp.relpath(info[key], root) for key in ('img_path', 'seg_map_path')
             if key in info} for info in ds.load_data_list()]


def _seg_cfg(root: Path, **kwargs) -> dict:
    cfg = dict(type='BaseSegDataset', data_root=str(root), img_suffix='.jpg',
               seg_map_suffix='.png', data_prefix=dict(img_path='img', seg_map_path='ann'))
    cfg.update(kwargs)
    return cfg


# ------------------------------------------------------------------------------ pairing
def test_dangling_symlinks_are_neither_images_nor_label_maps(tmp_path: Path):
    """FINDING (fails on the unfixed pairing): a symbolic link whose target is gone (data
    linked file by file from a disk that moved) is skipped by mmengine's ``list_dir_or_file``
    (``entry.is_file()`` is false), so mmseg does not list such an image, and a label map
    that is such a link cannot be opened by ``LoadAnnotations``.  ``os.walk`` lists both
    as files: the pairing counted 3 images and 2 label maps, blamed the image mmseg never
    lists, and called the sample whose label map cannot be read paired."""
    for stem in ('a', 'b'):
        _touch(tmp_path / 'img' / f'{stem}.jpg')
    _touch(tmp_path / 'ann' / 'a.png')
    os.symlink(str(tmp_path / 'gone' / 'b.png'), str(tmp_path / 'ann' / 'b.png'))
    os.symlink(str(tmp_path / 'gone' / 'c.jpg'), str(tmp_path / 'img' / 'c.jpg'))
    cfg = _seg_cfg(tmp_path)
    samples = _mmseg_samples(cfg)
    assert [s['img_path'] for s in samples] == ['img/a.jpg', 'img/b.jpg']  # the oracle
    readable = [osp.isfile(osp.join(str(tmp_path), s['seg_map_path'])) for s in samples]
    assert readable == [True, False]
    report = pair_dataset_files(cfg, WHERE, 'mmseg')
    assert (report.num_images, report.num_labels) == (len(samples), sum(readable)) == (2, 1)
    assert len(report.problems) == 1
    assert "'b.png'" in report.problems[0] and "'c.png'" not in report.problems[0]


def test_dangling_symlinks_are_not_classification_images(tmp_path: Path):
    """The same for mmpretrain's ``CustomDataset`` (class folders listed by mmengine)."""
    import mmpretrain.datasets  # noqa: F401 - fills the registry
    from mmengine.registry import DATASETS
    _touch(tmp_path / 'train' / 'cat' / 'a.jpg')
    os.symlink(str(tmp_path / 'gone.jpg'), str(tmp_path / 'train' / 'cat' / 'b.jpg'))
    cfg = dict(type='CustomDataset', data_root=str(tmp_path), data_prefix='train')
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        listed = len(DATASETS.build(dict(cfg, pipeline=[])))
    assert listed == 1
    report = pair_dataset_files(cfg, WHERE, 'mmpretrain')
    assert report.num_images == listed and report.problems == []


def test_a_segmentation_dataset_without_label_maps_is_counted(tmp_path: Path):
    """``data_prefix`` without ``seg_map_path`` (an unlabelled test set): mmseg lists the
    images without a ``seg_map_path``; the pairing counts them, pairs nothing, and finds no
    problem (it must not walk a folder that is not there)."""
    for stem in ('a', 'b', 'c'):
        _touch(tmp_path / 'img' / f'{stem}.jpg')
    cfg = _seg_cfg(tmp_path, data_prefix=dict(img_path='img'))
    samples = _mmseg_samples(cfg)
    assert len(samples) == 3 and all('seg_map_path' not in s for s in samples)
    report = pair_dataset_files(cfg, WHERE, 'mmseg')
    assert (report.num_images, report.num_labels, report.problems) == (3, None, [])
    assert report.summary() == f'{WHERE}: 3 images'


def test_a_missing_ade20k_label_map_gets_no_cityscapes_advice(tmp_path: Path):
    """Some ADE20K label maps missing: the advice to rerun mmseg's Cityscapes converter is
    for ``*_gtFine_labelTrainIds.png`` only; here the fix is the suffix, the folder or the
    missing maps (mmseg's ``ADE20KDataset`` lists the map that is not there)."""
    for stem in ('ADE_train_00000001', 'ADE_train_00000002'):
        _touch(tmp_path / 'images' / 'training' / f'{stem}.jpg')
    _touch(tmp_path / 'annotations' / 'training' / 'ADE_train_00000001.png')
    cfg = dict(type='ADE20KDataset', data_root=str(tmp_path),
               data_prefix=dict(img_path='images/training',
                                seg_map_path='annotations/training'))
    samples = _mmseg_samples(cfg)
    exists = [osp.isfile(osp.join(str(tmp_path), s['seg_map_path'])) for s in samples]
    assert exists == [True, False]
    report = pair_dataset_files(cfg, WHERE, 'mmseg')
    assert report.num_labels == sum(exists) and len(report.problems) == 1
    problem = report.problems[0]
    assert "'ADE_train_00000002.png'" in problem
    assert 'add the missing label maps' in problem
    assert 'Cityscapes' not in problem and 'converter' not in problem


def test_more_than_three_blank_lines_are_counted_and_three_are_named(tmp_path: Path):
    """Four blank lines (2-5): mmseg lists each as an image ``img/.jpg``; the problem counts
    all four, names the first three and says how many more there are."""
    for stem in ('a', 'b'):
        _touch(tmp_path / 'img' / f'{stem}.jpg')
        _touch(tmp_path / 'ann' / f'{stem}.png')
    (tmp_path / 'list.txt').write_text('a\n\n\n \n\nb\n')
    cfg = _seg_cfg(tmp_path, ann_file='list.txt')
    listed = [s['img_path'] for s in _mmseg_samples(cfg)]
    assert listed.count(osp.join('img', '.jpg')) == 4  # mmseg's reading of a blank line
    report = pair_dataset_files(cfg, WHERE, 'mmseg')
    assert len(report.problems) == 1
    assert '4 blank line(s) (line 2, 3, 4 and 1 more)' in report.problems[0]
    assert (report.num_images, report.num_labels) == (2, 2)
    # exactly three: all named, none "more"
    (tmp_path / 'list.txt').write_text('a\n\n\n\nb\n')
    report = pair_dataset_files(cfg, WHERE, 'mmseg')
    assert '3 blank line(s) (line 2, 3, 4);' in report.problems[0]


def _custom_dataset_error(cfg: dict) -> Optional[str]:
    """The error mmpretrain's ``CustomDataset`` stops with on ``cfg`` (``None``: it builds)."""
    import mmpretrain.datasets  # noqa: F401 - fills the registry
    from mmengine.registry import DATASETS
    try:
        with DefaultScope.overwrite_default_scope('mmpretrain'):
            DATASETS.build(dict(copy.deepcopy(cfg), pipeline=[]))
    except RuntimeError as err:
        return str(err)
    return None


def test_one_loose_image_of_a_labelled_folder_is_explained(tmp_path: Path):
    """One image directly in the folder of a labelled ``CustomDataset`` (no class folders):
    mmpretrain finds no sample; the problem names the ``<class>/*`` layout it looked for,
    the one loose image and the class sub-folders to make."""
    _touch(tmp_path / 'val' / 'ILSVRC2012_val_00000001.JPEG')
    cfg = dict(type='CustomDataset', data_root=str(tmp_path), data_prefix='val')
    assert 'Found 0 files' in _custom_dataset_error(cfg)  # the oracle: nothing is listed
    report = pair_dataset_files(cfg, WHERE, 'mmpretrain')
    assert report.num_images == 0 and len(report.problems) == 1
    problem = report.problems[0]
    assert 'no images <class>/*{' in problem and '(with_label=True)' in problem
    assert 'The 1 images lie directly in the folder' in problem
    assert 'put each class in its own sub-folder' in problem


def test_an_unlabelled_folder_without_images_is_explained(tmp_path: Path):
    """``with_label=False``: mmpretrain looks at every file below the folder (``**/*``);
    with none of its extensions there it finds nothing, and the advice is not about class
    sub-folders."""
    _touch(tmp_path / 'val' / 'notes.txt')
    cfg = dict(type='CustomDataset', data_root=str(tmp_path), data_prefix='val',
               with_label=False)
    assert 'Found 0 files' in _custom_dataset_error(cfg)
    report = pair_dataset_files(cfg, WHERE, 'mmpretrain')
    assert report.num_images == 0 and len(report.problems) == 1
    problem = report.problems[0]
    assert 'no images **/*{' in problem and '(with_label=False)' in problem
    assert 'class' not in problem and 'lie directly' not in problem


def test_lines_without_an_integer_label_are_numbered_from_one(tmp_path: Path):
    """Four of five lines end without an integer label: the problem counts 4 and shows the
    first three with their line numbers (1-based, as an editor shows them)."""
    for name in 'abcde':
        _touch(tmp_path / 'img' / f'{name}.jpg')
    (tmp_path / 'list.txt').write_text('a.jpg 0\nb.jpg\nc.jpg x\nd.jpg\ne.jpg\n')
    cfg = dict(type='CustomDataset', data_root=str(tmp_path), ann_file='list.txt',
               data_prefix='img', with_label=True)
    report = pair_dataset_files(cfg, WHERE, 'mmpretrain')
    (problem, ) = [p for p in report.problems if 'integer label' in p]
    assert "4 line(s) of" in problem
    assert "(line 2: 'b.jpg'; line 3: 'c.jpg x'; line 4: 'd.jpg')" in problem


# ---------------------------------------------------------------------------- integrity
def _tagged_pair(folder: Path, suffix: str = '.jpg', orientation: int = 6,
                 label_size: Tuple[int, int] = (100, 60)) -> Tuple[str, str]:
    """A 100x60 (WxH) image, left half red, with EXIF ``orientation``, and a label map of
    ``label_size`` (WxH) drawn on the stored pixels (left half class 1)."""
    pixels = np.zeros((60, 100, 3), np.uint8)
    pixels[:, :50] = (255, 0, 0)
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = orientation
    img_path = str(folder / f'scene{suffix}')
    image.save(img_path, exif=exif.tobytes(), quality=100)
    width, height = label_size
    label = np.full((height, width), 2, np.uint8)
    label[:, :width // 2] = 1
    seg_path = str(folder / 'scene.png')
    Image.fromarray(label).save(seg_path)
    return img_path, seg_path


def test_the_turbojpeg_backend_is_not_decoded_with_an_orientation_flag(tmp_path: Path):
    """mmcv's ``turbojpeg`` backend never applies the tag (``TurboJPEG.decode`` takes only a
    pixel format) and accepts only ``'color'`` / ``'grayscale'``: the check must not decode
    with ``'color_ignore_orientation'`` for it (mmcv raises, or fails without PyTurboJPEG);
    the label map of the stored size pairs up."""
    from mmlinvit.datasets.integrity import ImageDecoding, check_sample
    img_path, seg_path = _tagged_pair(tmp_path, '.jpg')
    assert check_sample(img_path, seg_path, ImageDecoding('color', 'turbojpeg')) == []


def test_an_orientation_is_measured_with_the_pipelines_own_backend(tmp_path: Path):
    """Whether the loader turns an image is measured by decoding it twice with the same
    backend (with and without the orientation): Pillow's grayscale conversion and cv2's
    differ by a grey level here, so decoding the stored pixels with another backend than
    the pipeline's would call an image turned that the loader hands over as stored.  The
    image is symmetric top-bottom, so orientation 4 (upside down) leaves it unchanged; the
    reference is mmcv's ``LoadImageFromFile(color_type='grayscale',
    imdecode_backend='pillow')`` + ``LoadAnnotations``, whose pixels pair up."""
    import mmcv
    from mmcv.transforms import LoadImageFromFile
    from mmseg.datasets.transforms import LoadAnnotations

    from mmlinvit.datasets.integrity import ImageDecoding, check_sample
    top = np.random.default_rng(0).integers(0, 256, (32, 100, 3), dtype=np.uint8)
    image = Image.fromarray(np.concatenate([top, top[::-1]], 0))
    exif = image.getexif()
    exif[0x0112] = 4
    img_path, seg_path = str(tmp_path / 'a.png'), str(tmp_path / 'a_seg.png')
    image.save(img_path, exif=exif.tobytes())
    Image.fromarray(np.zeros((64, 100), np.uint8)).save(seg_path)
    loaded = LoadImageFromFile(color_type='grayscale', imdecode_backend='pillow')(
        dict(img_path=img_path))
    loaded = LoadAnnotations()(dict(loaded, seg_map_path=seg_path, reduce_zero_label=False,
                                    seg_fields=[]))
    with open(img_path, 'rb') as f:
        content = f.read()
    as_stored = mmcv.imfrombytes(content, 'grayscale_ignore_orientation', backend='pillow')
    assert np.array_equal(loaded['img'], as_stored)  # the loader leaves the pixels alone
    assert loaded['img'].shape == loaded['gt_seg_map'].shape
    by_cv2 = mmcv.imfrombytes(content, 'grayscale_ignore_orientation', backend='cv2')
    assert not np.array_equal(by_cv2, as_stored)  # what makes the backend matter here
    assert check_sample(img_path, seg_path, ImageDecoding('grayscale', 'pillow')) == []


class _Pipeline:
    """Stands in for mmengine's ``Compose``: only ``transforms`` is read."""

    def __init__(self, transforms: list) -> None:
        self.transforms = transforms


class _Dataset:
    """A dataset with a pipeline and no samples."""

    def __init__(self, transforms: list) -> None:
        self.pipeline = _Pipeline(transforms)


def test_the_decoding_is_the_first_image_loaders_including_subclasses():
    """``of_dataset`` reads the first ``LoadImageFromFile`` of the pipeline, subclasses
    included (mmseg's ``LoadImageFromNDArray`` is one); mmcv's defaults without one."""
    from mmcv.transforms import LoadImageFromFile
    from mmseg.datasets.transforms import LoadAnnotations, LoadImageFromNDArray

    from mmlinvit.datasets.integrity import ImageDecoding
    assert issubclass(LoadImageFromNDArray, LoadImageFromFile)

    class CustomLoader(LoadImageFromFile):
        pass

    first = CustomLoader(color_type='grayscale', imdecode_backend='pillow')
    second = LoadImageFromFile(color_type='color_ignore_orientation')
    assert ImageDecoding.of_dataset(_Dataset([LoadAnnotations(), first, second])) == \
        ImageDecoding('grayscale', 'pillow')
    assert ImageDecoding.of_dataset(_Dataset([second, first])) == \
        ImageDecoding('color_ignore_orientation', 'cv2')
    default = LoadImageFromFile()
    assert ImageDecoding.of_dataset(_Dataset([LoadAnnotations()])) == \
        ImageDecoding(default.color_type, default.imdecode_backend)
    assert ImageDecoding.of_dataset(object()) == ImageDecoding('color', 'cv2')


class _Listing:
    """A built dataset of ``n`` samples (only ``__len__`` / ``get_data_info`` are read)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def get_data_info(self, idx: int) -> dict:
        return dict(img_path=f'img_{idx}.jpg', seg_map_path=f'ann_{idx}.png')


def test_progress_is_reported_every_1000_samples_of_a_large_share(
        monkeypatch: pytest.MonkeyPatch):
    """24,000 samples: 5 % would be 1,200, so progress comes every 1,000 samples (24 calls,
    the last one ``(total, total, bad)``).  The per-sample decoding is replaced by a stub
    (it is not what is checked here) reporting one bad file per 4,000th sample."""
    import mmlinvit.datasets.integrity as integrity

    def check(img_path: str, seg_map_path: Optional[str], decoding=None):
        idx = int(img_path[4:-4])
        return [(seg_map_path, 'bad')] if idx % 4000 == 0 else []

    monkeypatch.setattr(integrity, 'check_sample', check)
    calls = []
    result = integrity.scan_dataset_files(_Listing(24000), num_threads=2,
                                          progress=lambda *args: calls.append(args))
    assert [c[0] for c in calls] == list(range(1000, 24001, 1000))
    assert all(c[1] == 24000 for c in calls)
    assert [c[2] for c in calls[:5]] == [1, 1, 1, 1, 2]  # bad ones found so far
    assert calls[-1] == (24000, 24000, 6) and len(result.bad) == 6
    assert (result.num_samples, result.num_files) == (24000, 48000)


def test_a_sample_with_both_files_undecodable_has_two_problems(tmp_path: Path):
    """An image and its label map that both fail to decode: each is reported, on its own
    path, with the decoder's error type (Pillow's ``UnidentifiedImageError``)."""
    from PIL import UnidentifiedImageError

    from mmlinvit.datasets.integrity import check_sample
    img, seg = tmp_path / 'a.jpg', tmp_path / 'a.png'
    img.write_bytes(b'not an image')
    seg.write_bytes(b'not a label map')
    with pytest.raises(UnidentifiedImageError):
        Image.open(str(img))
    problems = check_sample(str(img), str(seg))
    assert [path for path, _ in problems] == [str(img), str(seg)]
    assert problems[0][1].startswith('image cannot be decoded (UnidentifiedImageError: ')
    assert problems[1][1].startswith('label map cannot be decoded (UnidentifiedImageError: ')
    # a scan of a dataset with this one sample keeps both
    from mmlinvit.datasets.integrity import scan_dataset_files

    class OneSample(_Listing):

        def get_data_info(self, idx: int) -> dict:
            return dict(img_path=str(img), seg_map_path=str(seg))

    result = scan_dataset_files(OneSample(1), num_threads=1)
    assert result.bad == problems and (result.num_samples, result.num_files) == (1, 2)


# --------------------------------------------------------------------- synthetic scenes
def test_cityscapes_defaults_as_mmseg_lists_them(tmp_path: Path):
    """``make_cityscapes_layout(root)`` with its documented defaults (8 train / 4 val scenes,
    city ``'toytown'``, 64x128): mmseg's ``CityscapesDataset`` lists 8 and 4 samples in
    ``leftImg8bit/<split>/toytown`` with label maps of the images' size."""
    from mmseg.datasets import CityscapesDataset

    from mmlinvit.datasets import make_cityscapes_layout
    stems = make_cityscapes_layout(str(tmp_path))
    for split, count in (('train', 8), ('val', 4)):
        with DefaultScope.overwrite_default_scope('mmseg'):
            ds = CityscapesDataset(data_root=str(tmp_path),
                                   data_prefix=dict(img_path=f'leftImg8bit/{split}',
                                                    seg_map_path=f'gtFine/{split}'),
                                   pipeline=[])
        assert len(ds) == len(stems[split]) == count
        info = ds.get_data_info(0)
        assert osp.basename(osp.dirname(info['img_path'])) == 'toytown'
        with Image.open(info['img_path']) as img, Image.open(info['seg_map_path']) as seg:
            assert img.size == seg.size == (128, 64)


def test_ade20k_defaults_as_mmseg_lists_them(tmp_path: Path):
    """``make_ade20k_layout(root)`` with its documented defaults (64 training / 16
    validation scenes of 64x64): mmseg's ``ADE20KDataset`` lists them with their label
    maps."""
    from mmseg.datasets import ADE20KDataset

    from mmlinvit.datasets import make_ade20k_layout
    stems = make_ade20k_layout(str(tmp_path))
    for split, count in (('training', 64), ('validation', 16)):
        with DefaultScope.overwrite_default_scope('mmseg'):
            ds = ADE20KDataset(data_root=str(tmp_path),
                               data_prefix=dict(img_path=f'images/{split}',
                                                seg_map_path=f'annotations/{split}'),
                               pipeline=[])
        assert len(ds) == len(stems[split]) == count
        info = ds.get_data_info(count - 1)
        with Image.open(info['img_path']) as img, Image.open(info['seg_map_path']) as seg:
            assert img.size == seg.size == (64, 64)


@pytest.mark.parametrize('backend', ['cv2', 'pillow', 'tifffile'])
@pytest.mark.parametrize('color_type', ['color', 'color_ignore_orientation'])
def test_tiff_with_an_exif_orientation_is_checked_as_the_pipeline_loads_it(
        tmp_path: Path, backend: str, color_type: str):
    """FINDING: Pillow turns a TIFF with EXIF Orientation=6 when it loads it (and drops the
    tag), mmcv's cv2 / pillow backends turn it whatever the ``color_type``, its ``tifffile``
    backend does not.  Under ``tifffile`` the check called the label map of the stored size a
    problem and passed one of the turned size, the reverse of what the pipeline pairs up.
    Oracle: mmcv's ``LoadImageFromFile`` and mmseg's ``LoadAnnotations`` run on the files."""
    from mmcv.transforms import LoadImageFromFile
    from mmseg.datasets.transforms import LoadAnnotations

    from mmlinvit.datasets.integrity import ImageDecoding, check_sample
    stored = Image.fromarray(np.random.default_rng(0).integers(0, 255, (6, 10, 3), np.uint8))
    exif = stored.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise when shown: 10x6 (WxH) becomes 6x10
    img_path = str(tmp_path / 'img.tif')
    stored.save(img_path, exif=exif)
    for name, hw in (('stored', (6, 10)), ('turned', (10, 6))):
        seg_path = str(tmp_path / f'{name}.png')
        Image.fromarray(np.zeros(hw, np.uint8)).save(seg_path)
        img = LoadImageFromFile(color_type=color_type,
                                imdecode_backend=backend)(dict(img_path=img_path))['img']
        seg = LoadAnnotations()(dict(seg_map_path=seg_path, reduce_zero_label=False,
                                     seg_fields=[]))['gt_seg_map']
        pairs = img.shape[:2] == seg.shape[:2]
        problems = check_sample(img_path, seg_path, ImageDecoding(color_type, backend))
        assert (problems == []) == pairs, (name, problems)
