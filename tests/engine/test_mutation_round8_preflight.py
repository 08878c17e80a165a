"""Pre-flight (mutation round 8): remote paths are left to mmengine, and ``--check-data`` in a
distributed run.

Guarded here:

* ``is_remote_path``: checkpoints, ``load_from``, the test tool's checkpoint argument, data
  prefixes and annotation files behind a URL scheme (``https://``, ``s3://``,
  ``open-mmlab://`` ...) are not looked up on the local disk, while local paths that merely
  contain a colon or a scheme-like word still are.
* ``check_data`` across processes: each rank decodes exactly the samples
  ``rank::world_size`` of each dataset (the reference is the sorted file list written here),
  the shares of every rank are gathered and summed (count and bad files), only rank 0 writes
  ``bad_data_files.txt``, a dataset read by two loaders is decoded once, and the message lists
  at most :data:`MAX_BAD_SHOWN` files.

The process group is replaced by stand-ins for ``mmengine.dist.get_rank`` /
``get_world_size`` / ``all_gather_object`` whose other ranks' shares are written by hand.
"""
import os
import os.path as osp
import re
from typing import Callable, Dict, List, Tuple

import numpy as np
import pytest
from mmengine.config import Config
from PIL import Image

import mmlinvit.datasets.integrity as integrity
from mmlinvit.datasets import make_ade20k_layout
from mmlinvit.datasets.integrity import ScanResult
from mmlinvit.engine.preflight import (MAX_BAD_SHOWN, DataCheckError, check_data,
                                       find_missing_inputs)

from checkpoint_damage import truncate_to_half

#: Checkpoint locations that mmengine's ``CheckpointLoader`` fetches through a URL scheme.
REMOTE_CHECKPOINTS = ('https://download.openmmlab.com/mmseg/v0.5/x.pth',
                      'http://example.org/weights.pth',
                      's3://bucket/weights.pth',
                      'open-mmlab://resnet50_v1c',
                      'openmmlab://resnet50_v1c',
                      'mmcls://vit-base',
                      'torchvision://resnet50',
                      'modelzoo://resnet50',
                      'pavi://model/weights.pth')


# ------------------------------------------------------------------------------ remote paths
@pytest.mark.parametrize('path', REMOTE_CHECKPOINTS)
def test_remote_checkpoints_are_not_looked_up_locally(path: str):
    """Every checkpoint slot accepts a remote location: mmengine downloads it at load time."""
    cfg = dict(model=dict(backbone=dict(pretrained=path),
                          init_cfg=dict(type='Pretrained', checkpoint=path)),
               load_from=path)
    assert find_missing_inputs(cfg, mode='train') == []
    assert find_missing_inputs(dict(model=dict()), mode='test', checkpoint=path) == []


@pytest.mark.parametrize('name', ['epoch:12.pth', 'run//epoch_12.pth', 'https_weights.pth',
                                  'open-mmlab_resnet.pth', 'torchvision-resnet50.pth'])
def test_local_checkpoints_that_look_like_urls_are_checked(tmp_path, name: str):
    """A missing local file is reported even when its path holds a colon, a double slash or a
    scheme word."""
    path = f'{tmp_path}/{name}'
    problems = find_missing_inputs(dict(model=dict(backbone=dict(pretrained=path))))
    assert len(problems) == 1 and f'checkpoint {path!r}' in problems[0], problems
    problems = find_missing_inputs(dict(model=dict()), mode='test', checkpoint=path)
    assert len(problems) == 1 and 'checkpoint argument' in problems[0], problems


def test_remote_data_prefix_and_ann_file_are_not_looked_up_locally(tmp_path):
    """Only the local folder of the dataset is reported; the remote prefix and annotation
    file next to it are left to the file backend."""
    root = str(tmp_path)
    cfg = dict(default_scope='mmseg', train_dataloader=dict(dataset=dict(
        type='ADE20KDataset', data_root=root, ann_file='https://example.org/ann/train.txt',
        data_prefix=dict(img_path='s3://bucket/images/training',
                         seg_map_path='annotations/training'))))
    problems = find_missing_inputs(cfg)
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        f"seg_map_path folder {osp.join(root, 'annotations/training')!r}"), problems
    # the same names as local paths are checked
    cfg['train_dataloader']['dataset'].update(
        ann_file='ann/train.txt', data_prefix=dict(img_path='bucket/images/training'))
    problems = find_missing_inputs(cfg)
    assert len(problems) == 2, problems
    assert 'img_path folder' in problems[0] and 'annotation file' in problems[1], problems


# ------------------------------------------------------------------- --check-data, many ranks
@pytest.fixture()
def ade(tmp_path) -> str:
    """An ADE20K layout with 5 training and 3 validation scenes."""
    root = str(tmp_path / 'ADEChallengeData2016')
    make_ade20k_layout(root, num_train=5, num_val=3, size=(16, 16), seed=0)
    return root


def _ade_dataset(root: str, split: str) -> dict:
    return dict(type='ADE20KDataset', data_root=root, pipeline=[],
                data_prefix=dict(img_path=f'images/{split}', seg_map_path=f'annotations/{split}'))


def _cfg(root: str, work_dir: str, val_split: str = 'validation') -> Config:
    return Config(dict(default_scope='mmseg', work_dir=work_dir, val_cfg=dict(),
                       train_dataloader=dict(num_workers=0,
                                             dataset=_ade_dataset(root, 'training')),
                       val_dataloader=dict(num_workers=0,
                                           dataset=_ade_dataset(root, val_split))))


def _images(root: str, split: str) -> List[str]:
    """The images of a split in mmseg's order (sorted by path)."""
    folder = osp.join(root, 'images', split)
    return sorted(osp.join(folder, name) for name in os.listdir(folder))


def _fake_processes(monkeypatch, rank: int, world_size: int,
                    others: List[Dict[int, ScanResult]]) -> List[str]:
    """Makes ``check_data`` run as ``rank`` of ``world_size`` processes.

    Args:
        others: For each gather (one per dataset, in order), the shares of the other ranks.

    Returns:
        The image paths this process decodes, in order (filled while it runs).
    """
    import mmengine.dist
    calls = iter(others)

    def all_gather_object(obj):
        shares = dict(next(calls))
        shares[rank] = obj
        return [shares[r] for r in range(world_size)]

    decoded: List[str] = []
    real_check: Callable = integrity.check_sample

    def check_sample(img_path, seg_map_path, decoding=None):
        decoded.append(img_path)
        return real_check(img_path, seg_map_path, decoding)

    monkeypatch.setattr(mmengine.dist, 'get_rank', lambda *args, **kwargs: rank)
    monkeypatch.setattr(mmengine.dist, 'get_world_size', lambda *args, **kwargs: world_size)
    monkeypatch.setattr(mmengine.dist, 'all_gather_object', all_gather_object)
    monkeypatch.setattr(integrity, 'check_sample', check_sample)
    return decoded


@pytest.mark.parametrize('rank', [0, 1])
def test_each_rank_decodes_its_share_and_counts_every_rank(tmp_path, monkeypatch, ade, rank):
    """Two processes: rank r decodes samples r, r + 2, ... of each dataset; the returned
    count adds the other rank's share."""
    other = 1 - rank
    others = [{other: ScanResult(num_samples=7)}, {other: ScanResult(num_samples=11)}]
    decoded = _fake_processes(monkeypatch, rank, 2, others)
    total = check_data(_cfg(ade, str(tmp_path / 'wd')), num_threads=1)
    train, val = _images(ade, 'training'), _images(ade, 'validation')
    assert decoded == train[rank::2] + val[rank::2]
    assert total == len(train[rank::2]) + 7 + len(val[rank::2]) + 11


def _bad(n: int, tag: str) -> List[Tuple[str, str]]:
    return [(f'/data/{tag}_{i:02d}.jpg', f'image cannot be decoded ({tag})') for i in range(n)]


def test_bad_files_of_every_rank_stop_every_rank(tmp_path, monkeypatch, ade):
    """Rank 1's own share is clean, rank 0 found a bad file: rank 1 raises too, naming it and
    the count of all samples, and leaves the listing to rank 0."""
    train = _images(ade, 'training')
    truncate_to_half(train[0])  # rank 0's share
    work_dir = tmp_path / 'wd'
    others = [{0: ScanResult(num_samples=3, bad=_bad(1, 'rank0'))}, {0: ScanResult(num_samples=2)}]
    decoded = _fake_processes(monkeypatch, 1, 2, others)
    with pytest.raises(DataCheckError) as exc:
        check_data(_cfg(ade, str(work_dir)), num_threads=1)
    assert train[0] not in decoded  # not this rank's share
    msg = str(exc.value)
    assert '1 bad file(s) among 8 samples' in msg, msg  # 3 + 2 (rank 0) + 2 + 1 (rank 1)
    assert '/data/rank0_00.jpg: image cannot be decoded (rank0)' in msg
    assert not osp.exists(work_dir / 'bad_data_files.txt')
    assert 'The full list is in' not in msg


def test_rank_zero_writes_the_bad_files_of_every_rank(tmp_path, monkeypatch, ade):
    train = _images(ade, 'training')
    truncate_to_half(train[2])  # rank 0's share (0, 2, 4)
    work_dir = tmp_path / 'wd'
    others = [{1: ScanResult(num_samples=2, bad=_bad(2, 'rank1'))}, {1: ScanResult(num_samples=1)}]
    _fake_processes(monkeypatch, 0, 2, others)
    with pytest.raises(DataCheckError) as exc:
        check_data(_cfg(ade, str(work_dir)), num_threads=1)
    msg = str(exc.value)
    assert '3 bad file(s) among 8 samples' in msg, msg
    listing = work_dir / 'bad_data_files.txt'
    assert f'The full list is in {listing}' in msg
    lines = listing.read_text().splitlines()
    assert [line.split('\t')[0] for line in lines] == [
        train[2], '/data/rank1_00.jpg', '/data/rank1_01.jpg']  # in rank order


def test_a_dataset_read_by_two_loaders_is_decoded_once(tmp_path, monkeypatch, ade):
    """``val_dataloader`` on the training set (common in small recipes): one scan."""
    decoded = _fake_processes(monkeypatch, 0, 1, [])
    total = check_data(_cfg(ade, str(tmp_path / 'wd'), val_split='training'), num_threads=1)
    assert total == 5
    assert decoded == _images(ade, 'training')


def test_test_mode_decodes_the_test_loader_only(tmp_path, monkeypatch, ade):
    cfg = _cfg(ade, str(tmp_path / 'wd'))
    cfg.test_dataloader = dict(num_workers=0, dataset=_ade_dataset(ade, 'validation'))
    decoded = _fake_processes(monkeypatch, 0, 1, [])
    assert check_data(cfg, mode='test', num_threads=1) == 3
    assert decoded == _images(ade, 'validation')


@pytest.mark.parametrize('num_bad', [MAX_BAD_SHOWN, MAX_BAD_SHOWN + 1])
def test_the_message_lists_at_most_max_bad_shown_files(tmp_path, monkeypatch, ade, num_bad):
    others = [{1: ScanResult(num_samples=50, bad=_bad(num_bad, 'rank1'))},
              {1: ScanResult(num_samples=1)}]
    _fake_processes(monkeypatch, 0, 2, others)
    with pytest.raises(DataCheckError) as exc:
        check_data(_cfg(ade, str(tmp_path / 'wd')), num_threads=1)
    msg = str(exc.value)
    listed = [line for line in msg.splitlines() if line.startswith('  - /data/')]
    assert len(listed) == min(num_bad, MAX_BAD_SHOWN)
    more = num_bad - MAX_BAD_SHOWN
    assert (f'... and {more} more' in msg) == (more > 0), msg
    assert len((tmp_path / 'wd' / 'bad_data_files.txt').read_text().splitlines()) == num_bad


def test_labels_of_the_share_are_decoded_with_their_images(tmp_path, monkeypatch, ade):
    """A corrupt label map in rank 1's share is found by rank 1 and by no other rank."""
    train = _images(ade, 'training')
    label = osp.join(ade, 'annotations', 'training',
                     osp.basename(train[3]).replace('.jpg', '.png'))
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(label)  # wrong size
    for rank, found in ((0, False), (1, True)):
        others = [{1 - rank: ScanResult()}, {1 - rank: ScanResult()}]
        _fake_processes(monkeypatch, rank, 2, others)
        if found:
            with pytest.raises(DataCheckError, match=re.escape(f'{label}: label map is 4x4')):
                check_data(_cfg(ade, str(tmp_path / f'wd{rank}')), num_threads=1)
        else:
            assert check_data(_cfg(ade, str(tmp_path / f'wd{rank}')), num_threads=1) == 5


@pytest.mark.parametrize('path', ['open-mmlab:resnet50_v1c', 'mmcls:deit-base',
                                  'torchvision:resnet50'])
def test_a_scheme_without_slashes_is_a_missing_local_file(path):
    """mmengine's CheckpointLoader reads 'open-mmlab:x' (no ``//``) from the disk: it was
    taken for remote and passed the check, then failed inside the runner with a bare
    FileNotFoundError."""
    from mmengine.runner.checkpoint import CheckpointLoader

    from mmlinvit.engine.preflight import find_missing_inputs, is_remote_path
    from mmlinvit.engine.resume import _is_local
    assert CheckpointLoader._get_checkpoint_loader(path).__name__ == 'load_from_local'
    assert not is_remote_path(path) and _is_local(path)
    missing = find_missing_inputs(dict(model=dict(backbone=dict(pretrained=path))))
    assert [m for m in missing if path in str(m)], missing
    assert is_remote_path(path.replace(':', '://', 1))
