"""The pre-flight pairing lists the files mmseg / mmpretrain list, and refuses what they fail on.

* Folder mode: mmengine's ``list_dir_or_file`` skips file names starting with '.' (the ``._*``
  AppleDouble files a copy from macOS leaves beside every image). The pairing counted them
  and refused a data set mmseg reads whole ("1 of 3 images have no label map '._ADE_a.png'").
* Annotation files: ``list_from_file`` keeps blank lines, and mmseg reads one as the image
  ``<img_path>/<img_suffix>``; the pairing skipped them, and the run stopped in a data worker
  when the sampler reached that image.
"""
import copy
import os
import os.path as osp
from pathlib import Path

import pytest

from mmlinvit.datasets.pairing import pair_dataset_files


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'x')


def _mmseg_images(cfg: dict) -> list:
    """The image paths mmseg's data set lists for ``cfg`` (the oracle)."""
    import mmseg.datasets  # noqa: F401 - fills the registry
    from mmengine.registry import DATASETS, DefaultScope
    with DefaultScope.overwrite_default_scope('mmseg'):
        ds = DATASETS.build(dict(copy.deepcopy(cfg), lazy_init=True, pipeline=[]))
    return [osp.relpath(d['img_path'], cfg['data_root']) for d in ds.load_data_list()]


def test_hidden_files_beside_the_images_are_not_counted(tmp_path: Path):
    for stem in ('ADE_a', 'ADE_b'):
        _touch(tmp_path / 'images' / 'training' / f'{stem}.jpg')
        _touch(tmp_path / 'annotations' / 'training' / f'{stem}.png')
    _touch(tmp_path / 'images' / 'training' / '._ADE_a.jpg')
    cfg = dict(type='ADE20KDataset', data_root=str(tmp_path),
               data_prefix=dict(img_path='images/training',
                                seg_map_path='annotations/training'))
    listed = _mmseg_images(cfg)
    assert len(listed) == 2
    report = pair_dataset_files(cfg, 'train_dataloader.dataset', 'mmseg')
    assert report.problems == []
    assert report.num_images == len(listed) == report.num_labels


def test_hidden_files_in_class_folders_are_not_counted(tmp_path: Path):
    import mmpretrain.datasets  # noqa: F401 - fills the registry
    from mmengine.registry import DATASETS, DefaultScope
    for label in ('cat', 'dog'):
        _touch(tmp_path / 'train' / label / f'{label}1.png')
        _touch(tmp_path / 'train' / label / f'._{label}1.png')
    cfg = dict(type='CustomDataset', data_root=str(tmp_path), data_prefix='train')
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        listed = len(DATASETS.build(dict(cfg, pipeline=[])))
    assert listed == 2
    report = pair_dataset_files(cfg, 'train_dataloader.dataset', 'mmpretrain')
    assert report.problems == [] and report.num_images == listed


@pytest.mark.parametrize('text, blank', [('a\n\nb\n', [2]), ('a\nb\n\n', [3]),
                                         ('a\n  \nb\n', [2])])
def test_blank_annotation_lines_are_refused(tmp_path: Path, text: str, blank: list):
    for stem in ('a', 'b'):
        _touch(tmp_path / 'img' / f'{stem}.jpg')
        _touch(tmp_path / 'ann' / f'{stem}.png')
    (tmp_path / 'list.txt').write_text(text)
    cfg = dict(type='BaseSegDataset', data_root=str(tmp_path), ann_file='list.txt',
               data_prefix=dict(img_path='img', seg_map_path='ann'), img_suffix='.jpg',
               seg_map_suffix='.png')
    listed = _mmseg_images(cfg)
    assert len(listed) == 3 and os.path.join('img', '.jpg') in listed  # mmseg's reading
    report = pair_dataset_files(cfg, 'train_dataloader.dataset', 'mmseg')
    assert len(report.problems) == 1
    assert f'1 blank line(s) (line {blank[0]})' in report.problems[0]
    assert 'remove the blank lines' in report.problems[0]
    # without the blank line: no problem, the images mmseg lists
    (tmp_path / 'list.txt').write_text('a\nb\n')
    report = pair_dataset_files(cfg, 'train_dataloader.dataset', 'mmseg')
    assert report.problems == [] and report.num_images == len(_mmseg_images(cfg)) == 2


def test_blank_lines_of_a_classification_list_are_refused(tmp_path: Path):
    for name in ('x.png', 'y.png'):
        _touch(tmp_path / 'train' / name)
    (tmp_path / 'meta.txt').write_text('x.png 0\n\ny.png 1\n')
    cfg = dict(type='CustomDataset', data_root=str(tmp_path), data_prefix='train',
               ann_file='meta.txt')
    report = pair_dataset_files(cfg, 'train_dataloader.dataset', 'mmpretrain')
    assert len(report.problems) == 1 and 'blank line(s) (line 2)' in report.problems[0]
