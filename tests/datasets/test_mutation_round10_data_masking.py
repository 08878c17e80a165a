"""Data checks, toy data sets, patch masking and teacher forcing (mutation round 10).

Each test checks a behaviour against an independent reference: mmcv's / mmseg's / mmpretrain's
own loaders and dataset classes (what training will read), MAE's masking count by hand, or a
recomputation written here.  Guarded:

* ``check_sample``: every EXIF orientation is described as the transform mmcv's
  ``LoadImageFromFile`` really applies; tags outside 1-8 (which the loader ignores) are as
  stored; a square image rotated by its tag, and a flipped image next to a label map with its
  sides swapped, are problems; an undecodable image next to a good label map is reported on the
  image, an undecodable label map on the label map;
* ``scan_dataset_files``: every sample of every chunk is scanned, files are counted per sample
  (a classification sample has one), the last progress report is ``(total, total, bad)``, and
  a rank scans its own share;
* ``pair_dataset_files`` lists what mmseg / mmpretrain list: through symlinked folders, with a
  case-sensitive ``img_suffix``, annotation lines whose file names hold spaces; it leaves the
  caller's config untouched; a label map must carry ``seg_map_suffix``;
* the toy ADE20K / Cityscapes layouts: labels written as mmseg's ``LoadAnnotations`` must read
  them (ADE20K ``reduce_zero_label``: class c at c, unlabelled at 255; Cityscapes train ids
  named as the toy classes by ``CityscapesDataset``'s class names, 255 where unlabelled), every
  split draws its own scenes, and labels lie on the pixels drawn for them;
* patch masking: MAE's per-image independence, the documented 64-bit mask stream seed, ratio
  0 allowed (nothing masked), the corner-padded grid, MAE's mask token init (std 0.02);
* teacher forcing: with activation checkpointing, every student block still runs on its own
  teacher block input with its LayerScale; the corner-padded grid is passed; the depth, patch
  size and prefix-token checks refuse what does not pair up;
* token utilities: records and layouts are refused when they cannot pair up.
"""
import copy
import os
import os.path as osp
import re
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import pytest
import torch
import torch.nn as nn
from PIL import Image

import mmlinvit.datasets.integrity as integrity
from mmlinvit.datasets.integrity import check_sample, scan_dataset_files

from teacher_forcing_toys import ToyBackbone

#: A 2x2 block pattern (RGB) whose every flip / rotation differs.
_PALETTE = np.array([(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)], np.uint8)

#: What each description in the problem message means, as a numpy transform of (H, W, C).
_DESCRIBED: Dict[str, Callable[[np.ndarray], np.ndarray]] = {
    'mirrored': lambda a: a[:, ::-1],
    'rotated 180 degrees': lambda a: a[::-1, ::-1],
    'flipped upside down': lambda a: a[::-1],
    'transposed': lambda a: a.transpose(1, 0, 2),
    'rotated 90 degrees clockwise': lambda a: np.rot90(a, -1),
    'transversed': lambda a: np.rot90(a.transpose(1, 0, 2), 2),
    'rotated 90 degrees counter-clockwise': lambda a: np.rot90(a, 1),
}


# ---------------------------------------------------------------- helpers: files
def _blocks(height: int = 48, width: int = 80) -> np.ndarray:
    """(H, W, 3) uint8 image of four flat blocks of the palette."""
    index = (np.arange(height)[:, None] >= height // 2) * 2 + (np.arange(width)[None] >= width // 2)
    return _PALETTE[index]


def _jpeg(path: str, pixels: np.ndarray, orientation: Optional[int]) -> str:
    image = Image.fromarray(pixels)
    exif = image.getexif()
    if orientation is not None:
        exif[0x0112] = orientation
    image.save(path, exif=exif.tobytes(), quality=100)
    return path


def _label(path: str, width: int, height: int) -> str:
    Image.fromarray(np.ones((height, width), np.uint8)).save(path)
    return path


def _mmcv_load(img_path: str) -> np.ndarray:
    """The RGB image mmseg's default ``LoadImageFromFile`` (``color_type='color'``) hands over."""
    from mmcv.transforms import LoadImageFromFile
    return LoadImageFromFile(color_type='color')(dict(img_path=img_path))['img'][..., ::-1]


def _palette_index(pixels: np.ndarray) -> np.ndarray:
    """Nearest palette entry per pixel (robust to JPEG noise at block edges)."""
    dist = ((pixels[..., None, :].astype(int) - _PALETTE.astype(int))**2).sum(-1)
    return dist.argmin(-1)


# ---------------------------------------------------------------- check_sample
@pytest.mark.parametrize('orientation', [2, 3, 4, 5, 6, 7, 8])
def test_orientation_description_is_what_the_image_loader_does(tmp_path, orientation: int):
    """The message says how the image is turned: that transform of the stored pixels must be
    what mmcv's loader returns (pixel by pixel, up to JPEG noise at the block edges)."""
    stored = _blocks()
    img = _jpeg(str(tmp_path / 'a.jpg'), stored, orientation)
    seg = _label(str(tmp_path / 'a.png'), 80, 48)
    (path, reason), = check_sample(img, seg)
    assert path == seg
    described = re.search(r'hands the model the image (.+?), but', reason).group(1)
    expected = _palette_index(_DESCRIBED[described](stored))
    loaded = _palette_index(_mmcv_load(img))
    assert loaded.shape == expected.shape
    assert (loaded == expected).mean() > 0.97, described


@pytest.mark.parametrize('orientation', [0, 9, 65535])
def test_orientation_tags_outside_1_to_8_are_as_stored(tmp_path, orientation: int):
    """A tag value the EXIF standard does not define is ignored by the loader (the image comes
    as stored), so a label map of the stored size pairs up and no problem (or crash) arises."""
    stored = _blocks()
    img = _jpeg(str(tmp_path / 'a.jpg'), stored, orientation)
    seg = _label(str(tmp_path / 'a.png'), 80, 48)
    assert (_palette_index(_mmcv_load(img)) == _palette_index(stored)).mean() > 0.97
    assert check_sample(img, seg) == []
    bad = _label(str(tmp_path / 'b.png'), 48, 80)  # sides swapped: wrong for a stored image
    (path, reason), = check_sample(img, bad)
    assert path == bad and 'label map is 48x80 (WxH)' in reason and 'is 80x48' in reason


def test_square_image_rotated_by_its_tag_is_a_problem(tmp_path):
    """A square image keeps its size when turned, but its pixels move: a label map drawn on
    the stored pixels lands on the wrong ones (the loader returns the rotated image)."""
    stored = _blocks(48, 48)
    img = _jpeg(str(tmp_path / 'a.jpg'), stored, 6)
    seg = _label(str(tmp_path / 'a.png'), 48, 48)
    loaded = _palette_index(_mmcv_load(img))
    assert loaded.shape == (48, 48) and (loaded == _palette_index(stored)).mean() < 0.5
    (path, reason), = check_sample(img, seg)
    assert path == seg and 'EXIF Orientation=6' in reason


@pytest.mark.parametrize('orientation', [2, 3, 4])
def test_flipped_image_next_to_a_swapped_size_label_map_is_a_problem(tmp_path, orientation: int):
    """Orientations 2-4 keep the image's sides (the loader returns the stored shape), so a
    label map with the sides swapped fits neither the stored nor the displayed image."""
    img = _jpeg(str(tmp_path / 'a.jpg'), _blocks(), orientation)
    seg = _label(str(tmp_path / 'a.png'), 48, 80)
    assert _mmcv_load(img).shape[:2] == (48, 80)
    (path, reason), = check_sample(img, seg)
    assert path == seg and 'label map is 48x80 (WxH)' in reason
    assert '80x48 as stored and 80x48 after' in reason


def test_undecodable_files_are_reported_on_themselves(tmp_path):
    """A corrupt image next to a good label map: one problem, on the image; a corrupt label map
    next to a good image: one problem, on the label map."""
    good_img = _jpeg(str(tmp_path / 'good.jpg'), _blocks(), None)
    good_seg = _label(str(tmp_path / 'good.png'), 80, 48)
    bad_img, bad_seg = str(tmp_path / 'bad.jpg'), str(tmp_path / 'bad.png')
    with open(bad_img, 'wb') as f:
        f.write(b'not a jpeg')
    with open(bad_seg, 'wb') as f:
        f.write(b'not a png')
    (path, reason), = check_sample(bad_img, good_seg)
    assert path == bad_img and reason.startswith('image cannot be decoded')
    (path, reason), = check_sample(good_img, bad_seg)
    assert path == bad_seg and reason.startswith('label map cannot be decoded')


# ---------------------------------------------------------------- scan_dataset_files
class _Listing:
    """The two methods of an mmengine dataset the scan uses, over given infos."""

    def __init__(self, infos: List[dict]) -> None:
        self.infos = infos

    def __len__(self) -> int:
        return len(self.infos)

    def get_data_info(self, idx: int) -> dict:
        return dict(self.infos[idx])


def _missing_files(tmp_path, num: int, with_seg: bool = False) -> _Listing:
    """Samples whose files do not exist (each fails to decode quickly)."""
    return _Listing([dict(img_path=str(tmp_path / f'{i}.jpg'),
                          seg_map_path=str(tmp_path / f'{i}.png') if with_seg else None)
                     for i in range(num)])


def test_every_sample_of_every_chunk_is_scanned(tmp_path, monkeypatch):
    """The scan submits the samples in chunks (bounded pending futures): with 2-sample chunks,
    5 samples are still all decoded."""
    monkeypatch.setattr(integrity, '_CHUNK', 2)
    result = scan_dataset_files(_missing_files(tmp_path, 5), num_threads=1)
    assert result.num_samples == 5
    assert sorted(osp.basename(p) for p, _ in result.bad) == [f'{i}.jpg' for i in range(5)]


def test_files_are_counted_per_sample(tmp_path):
    """A classification sample has one file, a segmentation sample two."""
    listing = _Listing(_missing_files(tmp_path, 3).infos +
                       _missing_files(tmp_path / 'seg', 2, with_seg=True).infos)
    result = scan_dataset_files(listing, num_threads=1)
    assert (result.num_samples, result.num_files) == (5, 3 + 2 * 2)


def test_last_progress_report_is_the_total(tmp_path):
    """45 samples report every 2 (5 %); the 45th, not a multiple, is still reported."""
    calls: List[Tuple[int, int, int]] = []
    scan_dataset_files(_missing_files(tmp_path, 45), num_threads=1,
                       progress=lambda *a: calls.append(a))
    assert calls[0] == (2, 45, 2) and calls[-1] == (45, 45, 45)
    assert [c[0] for c in calls] == list(range(2, 45, 2)) + [45]


def test_each_rank_scans_its_own_share(tmp_path):
    listing = _missing_files(tmp_path, 5)
    for rank, share in ((0, ['0.jpg', '2.jpg', '4.jpg']), (1, ['1.jpg', '3.jpg'])):
        result = scan_dataset_files(listing, rank=rank, world_size=2, num_threads=1)
        assert sorted(osp.basename(p) for p, _ in result.bad) == share


# ---------------------------------------------------------------- pair_dataset_files
def _touch(path: str) -> None:
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
        f.write(b'x')


def _seg_cfg(root: str, **kwargs) -> dict:
    cfg = dict(type='BaseSegDataset', data_root=root, data_prefix=dict(img_path='img',
                                                                      seg_map_path='ann'),
               img_suffix='.jpg', seg_map_suffix='.png')
    cfg.update(kwargs)
    return cfg


def _mmseg_listing(cfg: dict) -> List[dict]:
    """What mmseg's own dataset class lists for ``cfg`` (its ``load_data_list``)."""
    import mmseg.datasets  # noqa: F401 (registers the dataset classes)
    from mmengine.registry import DATASETS, DefaultScope
    with DefaultScope.overwrite_default_scope('mmseg'):
        ds = DATASETS.build(dict(copy.deepcopy(cfg), lazy_init=True, pipeline=[]))
    return ds.load_data_list()


def _pair(cfg: dict, scope: str = 'mmseg'):
    import mmpretrain.datasets  # noqa: F401
    import mmseg.datasets  # noqa: F401
    from mmlinvit.datasets.pairing import pair_dataset_files
    return pair_dataset_files(cfg, 'train_dataloader.dataset', scope)


def test_symlinked_image_and_label_folders_are_followed_as_mmseg_does(tmp_path):
    """Data sets are often assembled from symlinked folders; mmengine's file listing follows
    them, so the images behind a link are listed and their label maps found."""
    root, elsewhere = str(tmp_path / 'root'), str(tmp_path / 'elsewhere')
    _touch(f'{root}/img/real/a.jpg')
    _touch(f'{root}/ann/real/a.png')
    _touch(f'{elsewhere}/img/b.jpg')
    _touch(f'{elsewhere}/ann/b.png')
    os.symlink(f'{elsewhere}/img', f'{root}/img/linked')
    os.symlink(f'{elsewhere}/ann', f'{root}/ann/linked')
    listed = _mmseg_listing(_seg_cfg(root))
    assert sorted(osp.relpath(d['img_path'], f'{root}/img') for d in listed) == [
        'linked/b.jpg', 'real/a.jpg']
    report = _pair(_seg_cfg(root))
    assert (report.num_images, report.num_labels, report.problems) == (len(listed), 2, [])


def test_img_suffix_is_case_sensitive_as_in_mmseg(tmp_path):
    """mmseg lists ``*<img_suffix>`` exactly: ``a.JPG`` is not an image of ``img_suffix='.jpg'``
    (training would silently skip it)."""
    root = str(tmp_path)
    for name in ('a.JPG', 'b.jpg'):
        _touch(f'{root}/img/{name}')
    for name in ('a.png', 'b.png'):
        _touch(f'{root}/ann/{name}')
    listed = _mmseg_listing(_seg_cfg(root))
    assert [osp.basename(d['img_path']) for d in listed] == ['b.jpg']
    report = _pair(_seg_cfg(root))
    assert (report.num_images, report.num_labels, report.problems) == (1, 1, [])


def test_a_label_map_must_carry_the_seg_map_suffix(tmp_path):
    """mmseg opens ``<stem><seg_map_suffix>``: a copy of the image in the label folder is no
    label map."""
    root = str(tmp_path)
    _touch(f'{root}/img/a.jpg')
    _touch(f'{root}/ann/a.jpg')
    assert _mmseg_listing(_seg_cfg(root))[0]['seg_map_path'] == f'{root}/ann/a.png'
    report = _pair(_seg_cfg(root))
    assert report.num_labels == 0 and len(report.problems) == 1
    assert "label map <stem>.png under" in report.problems[0]


def test_a_folder_given_as_ann_file_lists_the_image_folder(tmp_path):
    """mmseg reads ``ann_file`` only when it is no folder; a folder (e.g. a config pointing it
    at the split's image folder) lists ``img_path`` as without one."""
    root = str(tmp_path)
    for stem in ('a', 'b'):
        _touch(f'{root}/img/{stem}.jpg')
        _touch(f'{root}/ann/{stem}.png')
    cfg = _seg_cfg(root, ann_file='ann')
    assert len(_mmseg_listing(cfg)) == 2
    report = _pair(cfg)
    assert (report.num_images, report.num_labels, report.problems) == (2, 2, [])


@pytest.mark.parametrize('with_label, line', [(True, 'cat/my photo 1.jpg 0'),
                                              (False, 'cat/my photo 1.jpg')])
def test_annotation_lines_with_spaces_in_file_names(tmp_path, with_label: bool, line: str):
    """mmpretrain's ``CustomDataset`` splits a labelled line at its last space (the class
    index) and takes an unlabelled line whole; file names may hold spaces."""
    from mmengine.registry import DATASETS, DefaultScope
    root = str(tmp_path)
    _touch(f'{root}/img/cat/my photo 1.jpg')
    with open(f'{root}/list.txt', 'w') as f:
        f.write(line + '\n')
    cfg = dict(type='CustomDataset', data_root=root, ann_file='list.txt', data_prefix='img',
               with_label=with_label)
    import mmpretrain.datasets  # noqa: F401
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        listed = DATASETS.build(dict(cfg, lazy_init=True)).load_data_list()
    assert [d['img_path'] for d in listed] == [f'{root}/img/cat/my photo 1.jpg']
    report = _pair(cfg, 'mmpretrain')
    assert (report.num_images, report.problems) == (1, [])


def test_the_callers_dataset_config_is_left_untouched(tmp_path):
    """The lazy build is on a copy: the config the run later builds from keeps its keys (no
    ``lazy_init`` added)."""
    root = str(tmp_path)
    _touch(f'{root}/img/a.jpg')
    _touch(f'{root}/ann/a.png')
    cfg = _seg_cfg(root)
    before = copy.deepcopy(cfg)
    assert _pair(cfg).num_labels == 1
    assert cfg == before


def test_unconverted_cityscapes_is_not_called_an_interrupted_conversion(tmp_path):
    """Raw gtFine (label ids, colours, polygons) without any ``*_gtFine_labelTrainIds.png``:
    the converter never ran, so the message must not say that only some maps exist."""
    from mmlinvit.datasets import make_cityscapes_layout
    root = str(tmp_path)
    stems = make_cityscapes_layout(root, num_train=2, num_val=0, size=(16, 32))
    folder = osp.join(root, 'gtFine', 'train', 'toytown')
    for stem in stems['train']:
        os.rename(osp.join(folder, stem + '_gtFine_labelTrainIds.png'),
                  osp.join(folder, stem + '_gtFine_labelIds.png'))
        _touch(osp.join(folder, stem + '_gtFine_polygons.json'))
    cfg = dict(type='CityscapesDataset', data_root=root,
               data_prefix=dict(img_path='leftImg8bit/train', seg_map_path='gtFine/train'))
    assert not any(osp.isfile(d['seg_map_path']) for d in _mmseg_listing(cfg))
    report = _pair(cfg)
    assert report.num_labels == 0 and len(report.problems) == 1
    assert '2 of 2 images' in report.problems[0]
    assert 'only some exist' not in report.problems[0]


# ---------------------------------------------------------------- toy ADE20K / Cityscapes
def _drawn_scenes(seed: int, count: int, size: Tuple[int, int]):
    """The scenes of all splits, drawn in order from one generator (the documented order)."""
    from mmlinvit.datasets.synthetic_scenes import draw_scene
    rng = np.random.default_rng(seed)
    return [draw_scene(rng, *size) for _ in range(count)]


def _load_annotations(seg_map_path: str, reduce_zero_label: bool) -> np.ndarray:
    from mmseg.datasets.transforms import LoadAnnotations
    results = LoadAnnotations()(  # reads reduce_zero_label from the results, as datasets pass it
        dict(seg_map_path=seg_map_path, reduce_zero_label=reduce_zero_label, seg_fields=[]))
    return results['gt_seg_map']


def test_ade20k_labels_as_mmseg_reads_them(tmp_path):
    """ADE20K's convention: 0 is unlabelled, class c is stored as c + 1; mmseg's
    ``LoadAnnotations(reduce_zero_label=True)`` must then give class c at c and 255 (ignore)
    where the scene is unlabelled.  Validation scenes follow the training ones in the stream."""
    from mmlinvit.datasets import make_ade20k_layout
    root = str(tmp_path / 'ADEChallengeData2016')
    stems = make_ade20k_layout(root, num_train=2, num_val=2, size=(24, 32), seed=5)
    scenes = _drawn_scenes(5, 4, (24, 32))
    files = [('training', s) for s in stems['training']] + [('validation', s)
                                                            for s in stems['validation']]
    assert stems['training'] == ['ADE_train_00000000', 'ADE_train_00000001']
    assert stems['validation'] == ['ADE_val_00000000', 'ADE_val_00000001']
    for (split, stem), (image, label) in zip(files, scenes):
        gt = _load_annotations(osp.join(root, 'annotations', split, stem + '.png'), True)
        np.testing.assert_array_equal(gt, np.where(label < 0, 255, label))
        stored = np.asarray(Image.open(osp.join(root, 'images', split, stem + '.jpg')))
        assert np.abs(stored.astype(int) - image).mean() < 10  # the drawn image (JPEG q95)


def test_cityscapes_train_ids_name_the_toy_classes(tmp_path):
    """Each toy class is written as the Cityscapes train id whose ``CityscapesDataset`` class
    name matches it (sky, terrain, building, vegetation, wall, road), unlabelled as 255."""
    from mmseg.datasets import CityscapesDataset
    from mmlinvit.datasets import SCENE_CLASSES, make_cityscapes_layout
    as_cityscapes = dict(sky='sky', ground='terrain', building='building', tree='vegetation',
                         mountain='wall', lake='road')
    names = CityscapesDataset.METAINFO['classes']
    stems = make_cityscapes_layout(str(tmp_path), num_train=3, num_val=0, size=(32, 48),
                                   seed=2)
    seen = set()
    for stem, (_, label) in zip(stems['train'], _drawn_scenes(2, 3, (32, 48))):
        gt = _load_annotations(osp.join(str(tmp_path), 'gtFine', 'train', 'toytown',
                                        stem + '_gtFine_labelTrainIds.png'), False)
        np.testing.assert_array_equal(gt == 255, label < 0)
        for cls in np.unique(label[label >= 0]):
            seen.add(int(cls))
            assert set(np.unique(gt[label == cls])) == {names.index(
                as_cityscapes[SCENE_CLASSES[cls]])}, SCENE_CLASSES[cls]
    assert {0, 1} <= seen  # sky and ground are in every scene


def test_every_scene_of_every_split_is_its_own(tmp_path):
    """One generator for all splits, in order: no two scenes (within or across splits) are
    the same picture, so the validation set is no copy of training images."""
    from mmlinvit.datasets import make_cityscapes_layout
    stems = make_cityscapes_layout(str(tmp_path), num_train=2, num_val=2, size=(16, 24), seed=0)
    images = [np.asarray(Image.open(osp.join(str(tmp_path), 'leftImg8bit', split, 'toytown',
                                             s + '_leftImg8bit.png')))
              for split in ('train', 'val') for s in stems[split]]
    for i in range(4):
        for j in range(i):
            assert not np.array_equal(images[i], images[j]), (i, j)
    for stored, (image, _) in zip(images, _drawn_scenes(0, 4, (16, 24))):
        np.testing.assert_array_equal(stored, image)  # lossless PNG: exactly the drawn scene


@pytest.mark.parametrize('seed', range(6))
def test_sky_and_ground_labels_lie_on_sky_and_ground_pixels(seed: int):
    """The sky gradient is blue (B >= 200 before objects and noise), the ground's is not
    (B <= 120): every pixel labelled sky / ground must show that colour."""
    from mmlinvit.datasets.synthetic_scenes import draw_scene
    image, label = draw_scene(np.random.default_rng(seed), 40, 56)
    blue = image[..., 2].astype(int)
    assert (label == 0).any() and (label == 1).any()
    assert blue[label == 0].min() > 160 and blue[label == 1].max() < 160


@pytest.mark.parametrize('seed', range(6))
def test_unlabelled_band_covers_both_sides_of_each_object_border(seed: int):
    """The band is one pixel on each side of an object's border (outside and inside), so two
    labelled pixels of different classes are never two steps apart along a row or a column
    (one pixel between them); only sky and ground meet unbanded, at the horizon."""
    from mmlinvit.datasets.synthetic_scenes import draw_scene
    _, label = draw_scene(np.random.default_rng(seed), 40, 56)
    assert (label < 0).any() and (label >= 2).any()
    for a, b in ((label[:, :-2], label[:, 2:]), (label[:-2], label[2:])):
        horizon = (np.minimum(a, b) == 0) & (np.maximum(a, b) == 1)
        close = (a >= 0) & (b >= 0) & (a != b) & ~horizon
        assert not close.any(), np.argwhere(close)[:3]


# ---------------------------------------------------------------- patch masking (MAE)
def test_each_image_of_a_batch_gets_its_own_random_set():
    """MAE draws one noise row per image: within a batch the masked sets differ (for 196
    patches two equal draws are all but impossible), each with MAE's count."""
    from mmlinvit.distill import sample_patch_mask
    for seed in range(3):
        mask = sample_patch_mask(4, 196, 0.75, seed=seed, step=0)
        assert mask.sum(1).tolist() == [196 - int(196 * 0.25)] * 4
        rows = {tuple(row.tolist()) for row in mask}
        assert len(rows) == 4


def test_mask_stream_seed_is_the_documented_64_bit_seed_sequence():
    """``SeedSequence(seed mod 2**64, spawn_key=(0x6D61736B, step, rank))``: seeds that differ
    above bit 32 (``torch.initial_seed()`` is a 64-bit value) draw other masks."""
    from mmlinvit.distill.patch_masking import mask_stream_seed
    for seed, step, rank in ((3, 0, 0), (3, 1, 2), (2**40 + 3, 5, 1), (2**64 + 7, 2, 0)):
        expected = np.random.SeedSequence(seed % 2**64, spawn_key=(0x6D61736B, step, rank))
        assert mask_stream_seed(seed, step, rank) == int(expected.generate_state(1, np.uint64)[0])
    assert mask_stream_seed(3, 1, 2) != mask_stream_seed(3, 2, 1)
    assert mask_stream_seed(3, 0) != mask_stream_seed(3 + 2**32, 0)


@pytest.mark.parametrize('step, rank', [(0, 0), (0, 1), (3, 1), (3, 2)])
def test_masks_are_maes_draw_from_the_stream_of_step_and_rank(step: int, rank: int):
    """By hand: uniform noise per patch from the ``(seed, step, rank)`` stream, the
    ``N - int(N * (1 - ratio))`` patches of lowest noise masked; ranks draw other masks."""
    from mmlinvit.distill import sample_patch_mask
    seed, batch, num, ratio = 11, 3, 20, 0.6
    words = np.random.SeedSequence(seed, spawn_key=(0x6D61736B, step, rank))
    generator = torch.Generator().manual_seed(int(words.generate_state(1, np.uint64)[0]))
    noise = torch.rand(batch, num, generator=generator)
    num_masked = num - int(num * (1 - ratio))
    expected = torch.zeros(batch, num, dtype=torch.bool)
    for b in range(batch):
        expected[b, noise[b].argsort()[:num_masked]] = True
    mask = sample_patch_mask(batch, num, ratio, seed=seed, step=step, rank=rank)
    assert torch.equal(mask, expected)
    other_rank = sample_patch_mask(batch, num, ratio, seed=seed, step=step, rank=rank + 1)
    assert not torch.equal(mask, other_rank)


def test_ratio_one_is_refused_when_built():
    """A ratio of 1 masks every patch: refused by the component, before any step."""
    from mmlinvit.distill import DistillationConfigError, PatchMasking
    with pytest.raises(DistillationConfigError, match=r'ratio must be in \[0, 1\), got 1.0'):
        PatchMasking(ratio=1.0)


def test_ratio_zero_masks_nothing():
    """MAE with ``mask_ratio=0`` keeps ``int(N * 1) = N`` patches: allowed, nothing masked."""
    from mmlinvit.distill import PatchMasking
    masking = PatchMasking(ratio=0.0, seed=0)
    mask = masking.sample(torch.zeros(2, 3, 16, 16), patch_size=4, step=0)
    assert mask.shape == (2, 16) and not mask.any()


@pytest.mark.parametrize('hw, expected', [((30, 30), 4), ((33, 17), 3 * 2), ((32, 32), 4)])
def test_masks_cover_the_corner_padded_grid(hw: Tuple[int, int], expected: int):
    """A 30x30 input with 16-pixel patches is padded to 32x32: ceil(30 / 16)^2 = 4 patches."""
    from mmlinvit.distill import PatchMasking
    masking = PatchMasking(ratio=0.5, seed=0)
    mask = masking.sample(torch.zeros(1, 3, *hw), patch_size=16, step=0)
    assert mask.shape == (1, expected)
    assert int(mask.sum()) == expected - int(expected * 0.5)


class _MaskableBackbone(nn.Module):
    """Everything ``PatchMasking.check`` asks of a student backbone."""

    patch_size, embed_dims = 4, 8

    def forward_tokens(self, x, patch_mask=None, mask_token=None):
        return x


def test_masking_refuses_teacher_forcing_and_task_models():
    """Teacher forcing runs the student's blocks on the teacher's (unmasked) block inputs, so
    masking cannot apply; a task model has no ``forward_tokens``.  The bare backbone alone
    passes."""
    from mmlinvit.distill import DistillationConfigError, PatchMasking
    masking = PatchMasking(ratio=0.5, seed=0)
    masking.check(_MaskableBackbone())
    for kwargs in (dict(teacher_forcing=True), dict(bare_backbone=False)):
        with pytest.raises(DistillationConfigError, match='no teacher forcing'):
            masking.check(_MaskableBackbone(), **kwargs)


def test_new_mask_token_has_maes_init():
    """MAE initialises its mask token with std 0.02 (``normal_(std=.02)``)."""
    from mmlinvit.distill import PatchMasking
    torch.manual_seed(0)
    student = nn.Module()
    student.embed_dims = 4096
    token = PatchMasking(ratio=0.5, seed=0).make_mask_token(student)
    assert isinstance(token, nn.Parameter) and token.shape == (1, 4096)
    assert 0.018 < float(token.detach().std()) < 0.022 and abs(float(token.detach().mean())) < 0.002


# ---------------------------------------------------------------- teacher forcing
@pytest.mark.parametrize('with_cp', [False, True])
@pytest.mark.parametrize('with_layer_scale', [False, True])
def test_each_student_block_runs_on_its_own_teacher_block_input(monkeypatch, with_cp: bool,
                                                                 with_layer_scale: bool):
    """Student block i gets the teacher's input of block i (by hand: x, 2x+1, 2(2x+1)+1), the
    corner-padded grid of the images (30x30 with 16-pixel patches: 2x2), the prefix tokens and
    ``with_layer_scale``, also when the blocks run under activation checkpointing."""
    import mmlinvit.distill.teacher_forcing as tf_module
    from mmlinvit.distill import ModuleInputsRecorder
    from mmlinvit.distill.teacher_forcing import TeacherForcing
    checkpointed = []
    real_checkpoint = tf_module.checkpoint
    monkeypatch.setattr(tf_module, 'checkpoint',
                        lambda *a, **k: checkpointed.append(1) or real_checkpoint(*a, **k))
    student, teacher = ToyBackbone(3, with_cp=with_cp), ToyBackbone(3)
    forcing = TeacherForcing('block_in', with_layer_scale=with_layer_scale)
    tokens = torch.randn(2, 5, 4)
    with ModuleInputsRecorder('blocks.{i}').attach(teacher) as block_in:
        forcing.check(student, teacher, dict(block_in=block_in))
        with torch.no_grad():
            teacher(tokens)
        student.train()
        forcing.forward_student(student, block_in, torch.zeros(2, 3, 30, 30))
    expected = tokens
    for blk in student.blocks:
        (x, hw_shape, prefix, layer_scale), = blk.calls
        torch.testing.assert_close(x, expected, rtol=0, atol=0)
        assert (hw_shape, prefix, layer_scale) == ((2, 2), 1, with_layer_scale)
        expected = 2 * expected + 1
    assert len(checkpointed) == (3 if with_cp else 0)


class _TaskModel(nn.Module):
    """A classifier-like wrapper whose tokens come from ``self.backbone``."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone


@pytest.mark.parametrize('student_kwargs, teacher_kwargs, task_model, match', [
    (dict(patch_size=14), dict(patch_size=16), False, r"teacher's patch size is 16 and the "
                                                      r"student's 14"),
    (dict(patch_size=14), dict(patch_size=16), True, r"teacher's patch size is 16"),
    (dict(num_prefix_tokens=5), dict(num_prefix_tokens=1), False, r'carry 1 class / register '
                                                                  r'token\(s\).*expects 5'),
    (dict(num_prefix_tokens=0), dict(num_prefix_tokens=1), True, r'carry 1 class / register'),
])
def test_teacher_and_student_tokens_must_pair_up(student_kwargs: dict, teacher_kwargs: dict,
                                                 task_model: bool, match: str):
    """Each student block runs on the teacher's tokens: another patch grid or other prefix
    tokens (in either direction, and read from a task model's backbone) are refused."""
    from mmlinvit.distill import DistillationConfigError, ModuleInputsRecorder
    from mmlinvit.distill.teacher_forcing import TeacherForcing
    student = ToyBackbone(2, **student_kwargs)
    teacher = ToyBackbone(2, **teacher_kwargs)
    source = 'blocks.{i}'
    if task_model:
        teacher, source = _TaskModel(teacher), 'backbone.blocks.{i}'
    recorder = ModuleInputsRecorder(source).attach(teacher)
    with pytest.raises(DistillationConfigError, match=match):
        TeacherForcing('block_in').check(student, teacher, dict(block_in=recorder))
    recorder.detach()
    # control: the student built like the teacher passes
    twin = ToyBackbone(2, **teacher_kwargs)
    TeacherForcing('block_in').check(twin, teacher, dict(block_in=recorder.attach(teacher)))
    recorder.detach()


def test_block_outputs_cannot_feed_the_student():
    """Teacher forcing feeds block *inputs*: a recorder of block outputs is refused."""
    from mmlinvit.distill import DistillationConfigError, ModuleOutputsRecorder
    from mmlinvit.distill.teacher_forcing import TeacherForcing
    teacher = ToyBackbone(2)
    recorder = ModuleOutputsRecorder('blocks.{i}').attach(teacher)
    with pytest.raises(DistillationConfigError, match="of type 'ModuleInputs'"):
        TeacherForcing('block_out').check(ToyBackbone(2), teacher, dict(block_out=recorder))
    recorder.detach()


# ---------------------------------------------------------------- token utilities
def test_records_that_cannot_pair_up_are_refused():
    """No records, fewer student than teacher records, a layout of three numbers, a record
    with nothing but special tokens, or another batch size: refused, not silently matched."""
    from mmlinvit.distill.losses.token_utils import (check_layout, check_same_shape,
                                                     patch_tokens, record_pairs)
    one = torch.zeros(2, 5, 3)
    with pytest.raises(TypeError, match='non-empty sequence of tensors'):
        record_pairs([], [one], 'loss')
    with pytest.raises(ValueError, match='the student provides 1 records but the teacher 2'):
        record_pairs([one], [one, one], 'loss')
    with pytest.raises(ValueError, match='the student provides 2 records but the teacher 1'):
        record_pairs([one, one], [one], 'loss')
    with pytest.raises(ValueError, match=r'\(num_prefix_tokens, num_suffix_tokens\)'):
        check_layout((1, 0, 0), 'layout')
    with pytest.raises(ValueError, match='has 5 tokens, not more than its 4 prefix \\+ 1 suffix'):
        patch_tokens(one, (4, 1), 'record')
    with pytest.raises(ValueError, match=r'student shape \(3, 5, 3\) does not match teacher'):
        check_same_shape(torch.zeros(3, 5, 3), one, 'loss')
    # the patch tokens are those between the prefix and the suffix tokens, by index
    tokens = torch.arange(2 * 6 * 1.0).reshape(2, 6, 1)
    assert patch_tokens(tokens, (1, 2), 'record')[0, :, 0].tolist() == [1.0, 2.0, 3.0]
    assert patch_tokens(tokens, (0, 0), 'record')[0, :, 0].tolist() == [0, 1, 2, 3, 4, 5]


def test_dry_run_names_the_block_that_cannot_take_the_teacher_input():
    """The build-time dry run turns a block's shape error into a config error naming the block
    and the teacher input's shape; a training step re-raises the original error."""
    from mmlinvit.distill import DistillationConfigError, ModuleInputsRecorder
    from mmlinvit.distill.teacher_forcing import TeacherForcing

    def too_narrow(x, hw_shape, num_prefix_tokens, with_layer_scale=False):
        return nn.functional.linear(x, torch.zeros(4, 3))  # expects width 3, gets 4

    student, teacher = ToyBackbone(2), ToyBackbone(2)
    student.blocks[1].forward_attn = too_narrow
    forcing = TeacherForcing('block_in')
    with ModuleInputsRecorder('blocks.{i}').attach(teacher) as block_in:
        with torch.no_grad():
            teacher(torch.randn(2, 5, 4))
        with pytest.raises(DistillationConfigError,
                           match=r'student block blocks\.1 cannot take the teacher block input '
                                 r'of shape \(2, 5, 4\)'):
            forcing.forward_student(student, block_in, torch.zeros(2, 3, 32, 32), dry_run=True)
        with pytest.raises(RuntimeError) as err:
            forcing.forward_student(student, block_in, torch.zeros(2, 3, 32, 32))
        assert not isinstance(err.value, DistillationConfigError)
