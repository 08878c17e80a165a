"""Pairing: one image of an ann_file missing, some (not all) images without label maps, one
classification image of an ann_file missing."""
import mmpretrain.datasets  # noqa: F401 (registers CustomDataset)
import mmseg.datasets  # noqa: F401 (registers BaseSegDataset)
from mmlinvit.datasets.pairing import pair_dataset_files


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'x')


def _seg(tmp_path, ann_file=''):
    return dict(type='BaseSegDataset', data_root=str(tmp_path), ann_file=ann_file,
                data_prefix=dict(img_path='img', seg_map_path='ann'),
                img_suffix='.jpg', seg_map_suffix='.png')


def test_one_listed_image_missing_is_reported(tmp_path):
    for s in ('a', 'b'):
        _touch(tmp_path / 'img' / f'{s}.jpg')
        _touch(tmp_path / 'ann' / f'{s}.png')
    (tmp_path / 'list.txt').write_text('a\nb\nc\n')
    report = pair_dataset_files(_seg(tmp_path, 'list.txt'), 'train_dataloader.dataset', 'mmseg')
    assert any('1 of the 3 images listed' in p for p in report.problems), report.problems


def test_some_images_without_label_maps_are_reported(tmp_path):
    for s in ('a', 'b', 'c'):
        _touch(tmp_path / 'img' / f'{s}.jpg')
    _touch(tmp_path / 'ann' / 'a.png')
    report = pair_dataset_files(_seg(tmp_path), 'train_dataloader.dataset', 'mmseg')
    assert report.num_labels == 1
    assert any('2 of 3 images under' in p for p in report.problems), report.problems


def test_one_listed_classification_image_missing_is_reported(tmp_path):
    _touch(tmp_path / 'img' / 'cat' / 'a.jpg')
    (tmp_path / 'list.txt').write_text('cat/a.jpg 0\ncat/b.jpg 0\n')
    cfg = dict(type='CustomDataset', data_root=str(tmp_path), ann_file='list.txt',
               data_prefix='img', with_label=True)
    report = pair_dataset_files(cfg, 'train_dataloader.dataset', 'mmpretrain')
    assert report.num_images == 1
    assert any('1 of the 2 images listed' in p for p in report.problems), report.problems
