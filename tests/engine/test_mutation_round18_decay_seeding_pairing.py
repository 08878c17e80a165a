"""Mutation round 18: layer-wise lr decay, per-sample seeding, teacher forcing, the dataset
pairing pre-flight and the CLIP input-statistics warnings, on branches earlier rounds left open.

Guarded here (each test names its oracle):

* teacher forcing: a teacher that states no patch size is not refused for one, and a recorder
  of only some blocks (``indices=[...]``, negative ones included) feeds exactly those student
  blocks (inputs worked out by hand);
* pairing: an unlabelled mmpretrain annotation file is read line by line *without* stripping
  (``CustomDataset.load_data_list`` joins each raw line to the image folder), so a line with
  a leading or trailing space names a file that does not exist - a finding of this round, the
  pre-flight stripped the lines and reported the list as fine (the fix is in
  ``mmlinvit/datasets/pairing.py``: ``_read_lines(..., strip=ds.with_label)``);
* pairing, against mmseg's own listing: images an ``ann_file`` names but that are missing
  are neither counted nor paired with a label map; ONE image with ``img_suffix=''`` pairs
  with the single ``<seg_map_path>/<seg_map_suffix>`` (only 2+ images share it); a list
  relative to the working directory (``img_path=''``, no ``data_root``) is not refused;
* sample seeding: attribute forwarding stops at dunder names, so ``copy.deepcopy`` of the
  wrapper is a wrapper, not the wrapped dataset's own copy.

Layer-wise lr decay and the CLIP statistics: every round-18 mutant is killed by earlier
tests (see the round's report).
"""
import copy
import os.path as osp
from pathlib import Path
from typing import List, Sequence, Tuple

import pytest
import torch

from teacher_forcing_toys import ToyBackbone


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'x')


# ------------------------------------------------------------------------- teacher forcing
def test_a_teacher_without_a_patch_size_is_not_compared():
    """The patch sizes are compared only when the teacher states one (``patch_size`` is
    ``None`` or missing, e.g. a teacher without a patch embedding attribute): its absence is
    not "another patch size", so the check passes; the prefix tokens are still compared."""
    from mmlinvit.distill import DistillationConfigError, ModuleInputsRecorder
    from mmlinvit.distill.teacher_forcing import TeacherForcing
    student, teacher = ToyBackbone(2, patch_size=14), ToyBackbone(2)
    del teacher.patch_size
    with ModuleInputsRecorder('blocks.{i}').attach(teacher) as block_in:
        TeacherForcing('block_in').check(student, teacher, dict(block_in=block_in))
        teacher.num_prefix_tokens = 2  # control: a stated difference is still refused
        with pytest.raises(DistillationConfigError, match='carry 2 class / register'):
            TeacherForcing('block_in').check(student, teacher, dict(block_in=block_in))


@pytest.mark.parametrize('indices, forced', [([1, 2], [1, 2]), ([-1], [2]), ([2, 0], [2, 0])])
def test_a_recorder_of_some_blocks_forces_exactly_those_student_blocks(
        indices: List[int], forced: List[int]):
    """``indices=[...]`` on the teacher's input recorder: student block i (and only the
    recorded ones) runs on the teacher's input of block i - by hand, teacher block i gets
    ``x``, ``2x + 1``, ``2(2x + 1) + 1`` for i = 0, 1, 2."""
    from mmlinvit.distill import ModuleInputsRecorder
    from mmlinvit.distill.teacher_forcing import TeacherForcing
    student, teacher = ToyBackbone(3), ToyBackbone(3)
    tokens = torch.randn(2, 5, 4)
    teacher_inputs = [tokens, 2 * tokens + 1, 2 * (2 * tokens + 1) + 1]
    forcing = TeacherForcing('block_in')
    with ModuleInputsRecorder('blocks.{i}', indices=indices).attach(teacher) as block_in:
        forcing.check(student, teacher, dict(block_in=block_in))
        with torch.no_grad():
            teacher(tokens)
        forcing.forward_student(student, block_in, torch.zeros(2, 3, 32, 32))
    for i, blk in enumerate(student.blocks):
        if i not in forced:
            assert blk.calls == []
            continue
        (x, grid, prefix, _), = blk.calls
        torch.testing.assert_close(x, teacher_inputs[i], rtol=0, atol=0)
        assert (grid, prefix) == ((2, 2), 1)


# ------------------------------------------------------------------------------- pairing
def _mmpretrain_paths(cfg: dict) -> List[str]:
    """Image paths mmpretrain's dataset lists for ``cfg`` (the oracle)."""
    import mmpretrain.datasets  # noqa: F401 - fills the registry
    from mmengine.registry import DATASETS, DefaultScope
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        ds = DATASETS.build(dict(copy.deepcopy(cfg), lazy_init=True, pipeline=[]))
    return [d['img_path'] for d in ds.load_data_list()]


@pytest.mark.parametrize('lines', [['a.jpg ', 'b.jpg'], [' a.jpg', 'b.jpg'], ['a.jpg\t', 'b.jpg']])
def test_unlabelled_list_lines_are_taken_whole_as_by_mmpretrain(tmp_path: Path,
                                                                lines: List[str]):
    """FINDING (fails on the unfixed pairing): mmpretrain's ``CustomDataset`` with
    ``with_label=False`` joins each raw line (only the newline removed by
    ``list_from_file``) to the image folder, so ``'a.jpg '`` names a file that is not there
    and the run fails when a data worker opens it.  The pre-flight stripped the line, found
    ``a.jpg`` and reported 2 images and no problem; it must count what mmpretrain can open."""
    from mmlinvit.datasets.pairing import pair_dataset_files
    for name in ('a.jpg', 'b.jpg'):
        _touch(tmp_path / 'img' / name)
    (tmp_path / 'list.txt').write_text(''.join(line + '\n' for line in lines))
    cfg = dict(type='CustomDataset', data_root=str(tmp_path), ann_file='list.txt',
               data_prefix='img', with_label=False)
    openable = [p for p in _mmpretrain_paths(cfg) if osp.isfile(p)]
    assert len(openable) == 1  # the oracle: only 'b.jpg' opens
    report = pair_dataset_files(cfg, 'train_dataloader.dataset', 'mmpretrain')
    assert report.num_images == len(openable)
    assert len(report.problems) == 1 and 'not under' in report.problems[0]


@pytest.mark.parametrize('lines,bad', [(['a.jpg 0', 'b.jpg'], 1), (['a.jpg\t0', 'b.jpg 1'], 1),
                                       (['a.jpg cat', 'b.jpg 1'], 1), (['a.jpg 0', 'b.jpg -1'], 0),
                                       ([' a.jpg 0 ', 'b.jpg 1'], 0)])
def test_labelled_list_lines_without_an_integer_label_are_named(tmp_path: Path,
                                                                 lines: List[str], bad: int):
    """FINDING (round 18): with ``with_label=True`` mmpretrain splits each stripped line at its
    last space and takes ``int`` of the label; a line without one (or a tab before it, or a
    word) stopped the run with a bare ``ValueError`` while the pre-flight reported no problem.
    The oracle is mmpretrain's own ``load_data_list`` on the same file."""
    from mmlinvit.datasets.pairing import pair_dataset_files
    for name in ('a.jpg', 'b.jpg'):
        _touch(tmp_path / 'img' / name)
    (tmp_path / 'list.txt').write_text(''.join(line + '\n' for line in lines))
    cfg = dict(type='CustomDataset', data_root=str(tmp_path), ann_file='list.txt',
               data_prefix='img', with_label=True)
    report = pair_dataset_files(cfg, 'train_dataloader.dataset', 'mmpretrain')
    label_problems = [p for p in report.problems if 'integer label' in p]
    if bad:
        with pytest.raises(ValueError):
            _mmpretrain_paths(cfg)
        assert len(label_problems) == 1 and f'{bad} line(s)' in label_problems[0]
    else:
        assert len(_mmpretrain_paths(cfg)) == 2
        assert not report.problems and report.num_images == 2


def _mmseg_samples(cfg: dict) -> List[Tuple[bool, bool]]:
    """(image exists, label map exists) of every sample mmseg's dataset lists (the oracle)."""
    import mmseg.datasets  # noqa: F401 - fills the registry
    from mmengine.registry import DATASETS, DefaultScope
    with DefaultScope.overwrite_default_scope('mmseg'):
        ds = DATASETS.build(dict(copy.deepcopy(cfg), lazy_init=True, pipeline=[]))
    return [(osp.isfile(d['img_path']), osp.isfile(d['seg_map_path']))
            for d in ds.load_data_list()]


def test_listed_images_that_are_missing_are_not_counted_nor_paired(tmp_path: Path):
    """An ``ann_file`` lists a, b, c; image c is missing but its label map exists.  mmseg
    lists all three and fails on c: the report counts the 2 images mmseg can open and the 2
    label maps beside them, and names c - the label map of a missing image is not counted."""
    from mmlinvit.datasets.pairing import pair_dataset_files
    for stem in ('a', 'b'):
        _touch(tmp_path / 'img' / f'{stem}.jpg')
    for stem in ('a', 'b', 'c'):
        _touch(tmp_path / 'ann' / f'{stem}.png')
    (tmp_path / 'list.txt').write_text('a\nb\nc\n')
    cfg = dict(type='BaseSegDataset', data_root=str(tmp_path), ann_file='list.txt',
               img_suffix='.jpg', seg_map_suffix='.png',
               data_prefix=dict(img_path='img', seg_map_path='ann'))
    samples = _mmseg_samples(cfg)
    assert len(samples) == 3
    openable = [s for s in samples if s[0]]
    report = pair_dataset_files(cfg, 'train_dataloader.dataset', 'mmseg')
    assert report.num_images == len(openable) == 2
    assert report.num_labels == sum(label for _, label in openable) == 2
    assert len(report.problems) == 1 and "'c.jpg'" in report.problems[0]


def test_a_single_image_without_img_suffix_pairs_with_the_one_label_map(tmp_path: Path):
    """``img_suffix=''`` with ONE image: mmseg cuts 0 characters off its name (stem '') and
    opens ``<seg_map_path>/<seg_map_suffix>``; when that file exists the one image has its one
    label map and nothing is wrong.  Only 2+ images share a label map (refused elsewhere)."""
    from mmlinvit.datasets.pairing import pair_dataset_files
    _touch(tmp_path / 'img' / 'a.jpg')
    _touch(tmp_path / 'ann' / '.png')
    cfg = dict(type='BaseSegDataset', data_root=str(tmp_path), img_suffix='',
               seg_map_suffix='.png', data_prefix=dict(img_path='img', seg_map_path='ann'))
    assert _mmseg_samples(cfg) == [(True, True)]
    report = pair_dataset_files(cfg, 'train_dataloader.dataset', 'mmseg')
    assert (report.num_images, report.num_labels, report.problems) == (1, 1, [])


def test_a_segmentation_list_relative_to_the_working_directory_is_not_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``img_path=''`` without ``data_root``: mmseg opens ``<line><img_suffix>`` relative to
    the working directory (the image exists, so does its label map); the pre-flight, which
    cannot walk a folder named '', must not call that image missing."""
    from mmlinvit.datasets.pairing import pair_dataset_files
    _touch(tmp_path / 'a.jpg')
    _touch(tmp_path / 'ann' / 'a.png')
    (tmp_path / 'list.txt').write_text('a\n')
    monkeypatch.chdir(tmp_path)
    cfg = dict(type='BaseSegDataset', ann_file=str(tmp_path / 'list.txt'), img_suffix='.jpg',
               seg_map_suffix='.png', data_prefix=dict(img_path='', seg_map_path='ann'))
    assert _mmseg_samples(cfg) == [(True, True)]
    report = pair_dataset_files(cfg, 'train_dataloader.dataset', 'mmseg')
    assert report is None or (report.problems == [] and report.num_images == 1)


# ------------------------------------------------------------------------ sample seeding
class _SelfCopyingDataset(torch.utils.data.Dataset):
    """A dataset with its own deep-copy hook (returns a fresh dataset of the same items)."""

    def __init__(self, items: Sequence[int]) -> None:
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> int:
        return self.items[index]

    def __deepcopy__(self, memo: dict) -> '_SelfCopyingDataset':
        return _SelfCopyingDataset(self.items)


def test_a_deep_copy_of_the_wrapper_is_a_wrapper():
    """Attribute forwarding stops at dunder names: Python's ``copy.deepcopy`` looks
    ``__deepcopy__`` up on the instance, and the wrapped dataset's hook must not answer for
    the wrapper - the copy of a :class:`SampleSeedDataset` is a :class:`SampleSeedDataset`
    (whose seeded items are those of the original), not a bare copy of the wrapped dataset."""
    from mmlinvit.engine.sample_seeding import SampleSeedDataset
    wrapper = SampleSeedDataset(_SelfCopyingDataset([3, 4, 5]))
    twin = copy.deepcopy(wrapper)
    assert type(twin) is SampleSeedDataset
    assert twin is not wrapper and [twin[(i, 7)] for i in range(3)] == [3, 4, 5]
