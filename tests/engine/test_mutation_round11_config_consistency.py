"""Config consistency checks (mutation round 11): each check against the library it mirrors.

Guards :mod:`mmlinvit.engine.config_consistency` where the earlier tests left single-line
changes alive.  The oracle is the library that runs the config wherever it can be asked
cheaply: mmseg's ``IoUMetric`` (the keys ``save_best`` may name), mmseg's ``slide_inference``
(which strides cover every pixel), mmseg's ``LoadAnnotations`` (what ``reduce_zero_label``
makes of 0 / 255), mmseg / mmpretrain data set classes (``METAINFO``, ``classes=``, image
folders), mmengine's ``DefaultSampler`` (iterations per epoch under several processes) and
the signatures' defaults (``by_epoch``, ``seg_pad_val``, ``topk``, ``reduce_zero_label``).

Covered: heads found inside lists and under a scope, non-head ``num_classes`` ignored,
teacher heads skipped by every check, scoped data set types and class objects, the
``classes=`` tuple / file forms, image-folder classes (``ann_file``, ``with_label=False``,
stray files, a dict prefix), the test mode reading the test set, slide stride == crop, the
top-k default / scope / list / fix, ``save_best`` against the reported keys, evenly spaced
label-map samples, void 255 under ``reduce_zero_label``, class-subset data sets, the
evaluator read per loader, ``seg_pad_val`` default and scope, the preprocessor mmengine uses,
the epoch-loop share per process, single-dict schedulers, negative ``out_indices`` and
``frozen_stages``.

Four tests (``Found in round 11`` in their docstrings) failed on the code of that round: a
string ``iou_metrics``, an evaluator ``prefix``, label-map samples below twice the sample
size, a channel swap left at the preprocessors' default.
"""
import inspect
import logging
import os
import os.path as osp
from types import SimpleNamespace
from typing import List, Optional, Sequence

import numpy as np
import pytest
import torch
from mmengine.config import Config, ConfigDict
from PIL import Image

from mmlinvit.engine import config_consistency as cc
from mmlinvit.engine.config_consistency import (ConfigConsistencyError,
                                                check_config_consistency,
                                                check_test_config_consistency,
                                                label_range_problems)

from train_testing import captured_log

pytestmark = pytest.mark.usefixtures('one_thread')


# ------------------------------------------------------------------------------ helpers
def _label_maps(root: str, maps: Sequence[Sequence[int]], split: str = 'train') -> str:
    """Writes one 8x8 label map per entry of ``maps`` (its values first, zeros after) under
    ``root/ann/<split>`` (and an empty ``root/img/<split>``); returns ``root``."""
    folder = osp.join(root, 'ann', split)
    os.makedirs(folder, exist_ok=True)
    os.makedirs(osp.join(root, 'img', split), exist_ok=True)
    for i, values in enumerate(maps):
        label = np.zeros((8, 8), np.uint8)
        label.flat[:len(values)] = values
        Image.fromarray(label).save(osp.join(folder, f'{i:03d}.png'))
    return root


def _seg_dataset(root: str, split: str = 'train', dataset_type: str = 'BaseSegDataset',
                 classes: Optional[Sequence[str]] = None, **extra) -> dict:
    """A segmentation data set config over :func:`_label_maps` files."""
    dataset = dict(type=dataset_type, data_root=root, pipeline=[], img_suffix='.png',
                   seg_map_suffix='.png',
                   data_prefix=dict(img_path=f'img/{split}', seg_map_path=f'ann/{split}'))
    if classes is not None:
        dataset['metainfo'] = dict(classes=tuple(classes))
    dataset.update(extra)
    return dataset


def _names(count: int) -> List[str]:
    return [f'c{i}' for i in range(count)]


def _seg_model(num_classes: int, **head) -> dict:
    return dict(type='EncoderDecoder',
                data_preprocessor=dict(type='SegDataPreProcessor', seg_pad_val=255),
                decode_head=dict(type='UPerHead', num_classes=num_classes, **head))


def _seg_cfg(model: dict, train: Optional[dict] = None, **parts) -> Config:
    """A config in mmseg's scope (label maps are read through its registry), training on
    the data set config ``train`` when given."""
    if train is not None:
        parts['train_dataloader'] = dict(dataset=train)
    return Config(dict(default_scope='mmseg', model=model, **parts))


def _image_folder(root: str, classes: Sequence[str] = ('a', 'b')) -> str:
    """Two PNGs per class in mmpretrain's ``CustomDataset`` layout ``root/train/<class>``."""
    for name in classes:
        folder = osp.join(root, 'train', name)
        os.makedirs(folder, exist_ok=True)
        for i in range(2):
            Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(osp.join(folder, f'{i}.png'))
    return root


def _cls_config(dataset: dict, num_classes: int, **model) -> Config:
    head = dict(type='LinearClsHead', num_classes=num_classes, in_channels=8)
    return Config(dict(model=dict(type='ImageClassifier', head=head, **model),
                       train_dataloader=dict(batch_size=1, dataset=dataset)))


def _mmpretrain_classes(dataset: dict) -> Optional[int]:
    """The class count mmpretrain's own data set reports for ``dataset`` (the oracle)."""
    from mmpretrain.registry import DATASETS
    import mmpretrain.datasets  # noqa: F401 - fills the registry
    built = DATASETS.build(dict(dataset, lazy_init=False))
    classes = built.metainfo.get('classes', None)
    return None if classes is None else len(classes)


# ------------------------------------------------------------------------------ heads
def test_heads_in_a_list_are_checked(tmp_path):
    """mmseg's CascadeEncoderDecoder (OCRNet) takes ``decode_head`` as a list: every 150-way
    head on a 2-class data set is refused, named by its list position."""
    cfg = Config(dict(
        model=dict(type='CascadeEncoderDecoder', num_stages=2,
                   decode_head=[dict(type='FCNHead', num_classes=150),
                                dict(type='OCRHead', num_classes=150)]),
        train_dataloader=dict(dataset=dict(type='BaseSegDataset', data_root=str(tmp_path),
                                           metainfo=dict(classes=('a', 'b'))))))
    problems = cc._class_count_problems(cfg)
    assert len(problems) == 2, problems
    assert problems[1].startswith('model.decode_head[1].num_classes=150, but '
                                  'train_dataloader.dataset')


def test_num_classes_outside_heads_is_not_a_head(tmp_path):
    """A classification preprocessor's ``num_classes`` (used by Mixup / CutMix only) is not
    a head: a 1000 there without batch augments trains a 2-class head right."""
    dataset = dict(type='ImageNet', data_root=str(tmp_path), classes=['a', 'b'])
    cfg = _cls_config(dataset, 2, data_preprocessor=dict(type='ClsDataPreprocessor',
                                                         num_classes=1000))
    assert cc._class_count_problems(cfg) == []
    assert cc._batch_augment_problem(cfg) is None


def test_a_scoped_head_type_is_a_head(tmp_path):
    cfg = Config(dict(
        model=dict(type='mmseg.EncoderDecoder',
                   decode_head=dict(type='mmseg.UPerHead', num_classes=150)),
        train_dataloader=dict(dataset=dict(type='BaseSegDataset', data_root=str(tmp_path),
                                           metainfo=dict(classes=('a', 'b'))))))
    problems = cc._class_count_problems(cfg)
    assert len(problems) == 1 and 'model.decode_head.num_classes=150' in problems[0]


def test_a_scoped_mask2former_class_weight_is_checked(tmp_path):
    cfg = Config(dict(model=dict(type='EncoderDecoder', decode_head=dict(
        type='mmseg.Mask2FormerHead', num_classes=2,
        loss_cls=dict(type='mmdet.CrossEntropyLoss', class_weight=[1.0] * 150 + [0.1])))))
    problems = cc._class_count_problems(cfg)
    assert any('class_weight has 151 entries but num_classes=2 needs 3' in p
               for p in problems), problems


# ------------------------------------------------------------------------------ data set classes
@pytest.mark.parametrize('scoped_type,library', [('mmseg.ADE20KDataset', 'mmseg'),
                                                 ('mmpretrain.ImageNet', 'mmpretrain')])
def test_scoped_data_set_types_are_counted(tmp_path, scoped_type, library):
    """A type written with its scope is looked up in that library's registry."""
    if library == 'mmseg':
        from mmseg.datasets import ADE20KDataset as cls
    else:
        from mmpretrain.datasets import ImageNet as cls
    expected = len(cls.METAINFO['classes'])
    cfg = Config(dict(model=dict(type='EncoderDecoder',
                                 decode_head=dict(type='FCNHead', num_classes=7)),
                      train_dataloader=dict(dataset=dict(type=scoped_type,
                                                         data_root=str(tmp_path)))))
    problems = cc._class_count_problems(cfg)
    assert len(problems) == 1 and f'has {expected} classes ({cls.__name__}.METAINFO)' in \
        problems[0], problems


def test_a_data_set_class_object_as_type_is_counted(tmp_path):
    """mmengine builds ``type=<class>`` as well as a name."""
    from mmseg.datasets import ADE20KDataset
    cfg = _seg_cfg(_seg_model(19), dict(type=ADE20KDataset, data_root=str(tmp_path)))
    problems = cc._class_count_problems(cfg)
    assert len(problems) == 1 and 'has 150 classes' in problems[0], problems


def test_classes_argument_as_a_tuple_and_as_a_file(tmp_path):
    """mmpretrain's ``classes=`` takes a tuple as well as a list, or a file of names (one a
    line): an ImageNet subset of 3 classes is right with a 3-way head either way."""
    names_file = tmp_path / 'classes.txt'
    names_file.write_text('cat\ndog\nbird\n')
    from mmengine.fileio import list_from_file
    assert len(list_from_file(str(names_file))) == 3  # what mmpretrain reads
    for classes in (('cat', 'dog', 'bird'), str(names_file)):
        dataset = dict(type='ImageNet', data_root=str(tmp_path), classes=classes)
        assert cc._class_count_problems(_cls_config(dataset, 3)) == []
        problems = cc._class_count_problems(_cls_config(dataset, 1000))
        assert len(problems) == 1 and 'has 3 classes' in problems[0], problems
    assert 'classes file' in cc._class_count_problems(_cls_config(
        dict(type='ImageNet', data_root=str(tmp_path), classes=str(names_file)), 1000))[0]


def test_class_files_are_counted_as_the_libraries_read_them(tmp_path, monkeypatch):
    """A file of names given as ``metainfo.classes`` (mmengine's BaseDataset reads a string meta
    value with ``list_from_file``) counts its lines, not the characters of its path; mmpretrain's
    ``classes=`` file is read after ``~`` expansion and with its blank lines (each one a class
    named '')."""
    names_file = tmp_path / 'classes.txt'
    names_file.write_text('cat\ndog\nbird\n')
    as_meta = dict(type='CustomDataset', data_root=str(tmp_path),
                   metainfo=dict(classes=str(names_file)))
    assert cc._class_count_problems(_cls_config(as_meta, 3)) == []
    problems = cc._class_count_problems(_cls_config(as_meta, 1000))
    assert len(problems) == 1 and 'has 3 classes' in problems[0], problems

    monkeypatch.setenv('HOME', str(tmp_path))
    blank = tmp_path / 'blank.txt'
    blank.write_text('cat\n\ndog\n')
    dataset = dict(type='ImageNet', data_root=str(tmp_path), classes='~/blank.txt')
    (tmp_path / 'ann.txt').write_text('a.jpg 0\n')
    assert _mmpretrain_classes(dict(dataset, type='CustomDataset', ann_file='ann.txt',
                                    pipeline=[])) == 3  # the oracle
    assert cc._class_count_problems(_cls_config(dataset, 3)) == []
    problems = cc._class_count_problems(_cls_config(dataset, 2))
    assert len(problems) == 1 and 'has 3 classes' in problems[0], problems


def test_image_folder_classes_follow_mmpretrain(tmp_path):
    """Sub-folders are the classes only without ``ann_file`` and with labels; files beside
    them are not classes; a dict ``data_prefix`` reads its ``img_path``."""
    root = _image_folder(str(tmp_path / 'data'))
    with open(osp.join(root, 'train', 'README.txt'), 'w') as f:
        f.write('not a class\n')
    plain = dict(type='CustomDataset', data_root=root, data_prefix='train', pipeline=[])
    assert _mmpretrain_classes(plain) == 2  # the stray file is no class
    assert cc._class_count_problems(_cls_config(plain, 2)) == []
    as_dict = dict(plain, data_prefix=dict(img_path='train'))
    problems = cc._class_count_problems(_cls_config(as_dict, 1000))
    assert len(problems) == 1 and 'has 2 classes (sub-folders of' in problems[0], problems

    ann_file = osp.join(root, 'ann.txt')
    with open(ann_file, 'w') as f:
        f.write('a/0.png 0\nb/0.png 4\n')
    listed = dict(plain, ann_file=ann_file)
    assert _mmpretrain_classes(listed) is None  # mmpretrain takes no classes from folders
    assert cc._class_count_problems(_cls_config(listed, 5)) == []


def test_unlabelled_image_folder_has_no_classes(tmp_path):
    """``with_label=False`` (self-supervised stages): the sub-folders are not classes."""
    root = _image_folder(str(tmp_path / 'data'))
    unlabelled = dict(type='CustomDataset', data_root=root, data_prefix='train', pipeline=[],
                      with_label=False)
    assert _mmpretrain_classes(unlabelled) is None
    assert cc._class_count_problems(_cls_config(unlabelled, 1000)) == []


def test_the_test_mode_checks_the_test_set(tmp_path):
    """``tools/test.py`` scores the test set: its classes are compared with the head, not the
    training set's (a 150-class ADE20K test set under a 2-class head, silent wrong mIoU)."""
    cfg = Config(dict(
        model=_seg_model(2),
        train_dataloader=dict(dataset=_seg_dataset(str(tmp_path), classes=('a', 'b'))),
        test_dataloader=dict(dataset=_seg_dataset(str(tmp_path), 'val', 'ADE20KDataset'))))
    with pytest.raises(ConfigConsistencyError,
                       match=r'test_dataloader.dataset \(type ADE20KDataset\) has 150 classes'):
        check_test_config_consistency(cfg)


# ------------------------------------------------------------------------------ teachers
def _distillation(student: dict, teacher: dict, **extra) -> Config:
    return Config(dict(model=dict(type='DistillationModel', student=student, teacher=teacher),
                       **extra))


def test_teacher_heads_are_left_out_of_every_check(tmp_path):
    """A frozen teacher's head keeps its checkpoint's classes / ignore_index: class count,
    Mixup width, top-k and ignored labels read the student only."""
    seg = _distillation(
        _seg_model(2), dict(type='EncoderDecoder', decode_head=dict(
            type='UPerHead', num_classes=150, ignore_index=0)),
        train_dataloader=dict(dataset=dict(type='BaseSegDataset', data_root=str(tmp_path),
                                           metainfo=dict(classes=('a', 'b')))),
        val_cfg=dict(), val_dataloader=dict(dataset=dict(type='BaseSegDataset',
                                                         data_root=str(tmp_path))),
        val_evaluator=dict(type='IoUMetric'))
    assert cc._class_count_problems(seg) == []
    assert cc._ignore_index_problems(seg, 'train') == ([], [])

    student = dict(type='ImageClassifier',
                   head=dict(type='LinearClsHead', num_classes=2, in_channels=8),
                   data_preprocessor=dict(type='ClsDataPreprocessor', num_classes=2,
                                          batch_augments=dict(augments=[dict(type='Mixup',
                                                                             alpha=0.8)])))
    teacher = dict(type='ImageClassifier',
                   head=dict(type='LinearClsHead', num_classes=1000, in_channels=8))
    cls = _distillation(student, teacher, test_evaluator=dict(type='Accuracy', topk=(1, 5)))
    assert cc._batch_augment_problem(cls) is None
    problems = cc._evaluation_problems(cls, 'test')
    assert len(problems) == 1 and 'topk=(1, 5) but the model has 2 classes' in problems[0]


# ------------------------------------------------------------------------------ evaluation
def _slide_covers_every_pixel(crop: int, stride: int, size: int = 100) -> bool:
    """Whether mmseg's own ``EncoderDecoder.slide_inference`` runs (it asserts that every
    pixel is covered by a window) on a ``size`` x ``size`` image."""
    from mmseg.models.segmentors import EncoderDecoder
    stub = SimpleNamespace(
        test_cfg=ConfigDict(mode='slide', crop_size=(crop, crop), stride=(stride, stride)),
        out_channels=2,
        encode_decode=lambda x, metas: torch.zeros(x.shape[0], 2, *x.shape[2:]))
    try:
        EncoderDecoder.slide_inference(stub, torch.zeros(1, 3, size, size), [dict()])
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize('stride', [31, 32, 33])
def test_slide_stride_refused_exactly_where_mmseg_fails(stride):
    """A stride equal to the crop tiles the image (right); one pixel more leaves gaps."""
    cfg = Config(dict(model=dict(type='EncoderDecoder', decode_head=dict(
        type='UPerHead', num_classes=2), test_cfg=dict(mode='slide', crop_size=(32, 32),
                                                       stride=(stride, stride)))))
    refused = bool(cc._evaluation_problems(cfg, 'test'))
    assert refused is not _slide_covers_every_pixel(32, stride)


def test_slide_settings_of_a_run_without_validation_are_not_refused():
    """Training without ``val_cfg`` never runs the slide test: nothing to refuse then."""
    cfg = Config(dict(model=dict(type='EncoderDecoder', decode_head=dict(
        type='UPerHead', num_classes=2), test_cfg=dict(mode='slide', crop_size=(32, 32),
                                                       stride=(48, 48))),
        val_dataloader=dict(dataset=dict(type='BaseSegDataset', data_root='none'))))
    assert cc._evaluation_problems(cfg, 'train') == []
    cfg.val_cfg = dict(type='ValLoop')
    assert len(cc._evaluation_problems(cfg, 'train')) == 1


def _cls_evaluation(evaluator, num_classes: int = 2) -> Config:
    return Config(dict(model=dict(type='ImageClassifier', head=dict(
        type='LinearClsHead', num_classes=num_classes, in_channels=8)),
        test_evaluator=evaluator))


def test_topk_default_scope_list_and_fix():
    """mmpretrain's ``Accuracy`` defaults to top-1; a scoped type and a list of evaluators
    are read; the fix keeps every k that is defined."""
    from mmpretrain.evaluation import Accuracy
    assert inspect.signature(Accuracy).parameters['topk'].default == (1, )
    assert cc._evaluation_problems(_cls_evaluation(dict(type='Accuracy')), 'test') == []
    scoped = cc._evaluation_problems(
        _cls_evaluation(dict(type='mmpretrain.Accuracy', topk=(1, 5))), 'test')
    assert len(scoped) == 1 and 'test_evaluator.topk=(1, 5)' in scoped[0]
    listed = cc._evaluation_problems(
        _cls_evaluation([dict(type='Accuracy', topk=(1, 2, 5))]), 'test')
    assert len(listed) == 1 and 'test_evaluator[0].topk=(1, 2, 5)' in listed[0]
    assert 'topk="(1, 2)"' in listed[0]


def test_a_heads_training_accuracy_topk_beyond_its_classes():
    """``cal_acc=True`` with ``topk=(1, 5)`` on a 3-way head: mmpretrain's head raises at its
    first loss (the oracle); refused before training, with the top-k that is defined.
    Without ``cal_acc`` (mmpretrain's default) the head's top-k is never used."""
    from mmpretrain.models.heads import LinearClsHead
    from mmpretrain.structures import DataSample
    head_cfg = dict(num_classes=3, in_channels=8, topk=(1, 5))
    samples = [DataSample().set_gt_label(1), DataSample().set_gt_label(2)]
    features = (torch.randn(2, 8), )
    with pytest.raises(ValueError, match='Top-5 accuracy is unavailable'):
        LinearClsHead(cal_acc=True, **head_cfg).loss(features, samples)
    LinearClsHead(**head_cfg).loss(features, samples)  # cal_acc=False: trains
    from mmpretrain.models.heads import ClsHead
    assert inspect.signature(ClsHead).parameters['cal_acc'].default is False

    def cfg(**head) -> Config:
        return Config(dict(model=dict(type='ImageClassifier',
                                      head=dict(head_cfg, type='LinearClsHead', **head))))

    problems = cc._training_accuracy_problems(cfg(cal_acc=True))
    assert len(problems) == 1, problems
    assert 'model.head.topk=(1, 5) with cal_acc=True but the head has 3 classes' in problems[0]
    assert 'topk="(1,)"' in problems[0]
    assert cc._training_accuracy_problems(cfg()) == []
    assert cc._training_accuracy_problems(cfg(cal_acc=True, topk=(1, 3))) == []


# ------------------------------------------------------------------------------ save_best
def _reported_keys(evaluator: dict) -> List[str]:
    """The metric names mmseg's IoUMetric (through mmengine's ``BaseMetric.evaluate``, which
    adds the prefix) hands to the checkpoint hook, for this evaluator config."""
    from mmseg.evaluation import IoUMetric
    metric = IoUMetric(**{k: v for k, v in evaluator.items() if k != 'type'})
    metric.dataset_meta = dict(classes=('a', 'b'))
    area = torch.tensor([2.0, 3.0])
    metric.results = [(area, area + 1, area, area)]
    return list(metric.evaluate(1))


SAVE_BEST_KEYS = ['aAcc', 'mIoU', 'mAcc', 'mDice', 'mFscore', 'mPrecision', 'mRecall']


def _save_best_refused(save_best, evaluator: dict) -> bool:
    cfg = Config(dict(default_hooks=dict(checkpoint=dict(save_best=save_best)),
                      val_evaluator=evaluator))
    return cc._save_best_problem(cfg) is not None


@pytest.mark.parametrize('iou_metrics', [None, ['mIoU'], ['mDice'], ['mFscore'],
                                         ['mIoU', 'mFscore']])
def test_save_best_refused_exactly_when_iou_metric_does_not_report_it(iou_metrics):
    evaluator = dict(type='IoUMetric')
    if iou_metrics is not None:
        evaluator['iou_metrics'] = iou_metrics
    reported = _reported_keys(evaluator)
    for key in SAVE_BEST_KEYS:
        assert _save_best_refused(key, evaluator) is (key not in reported), (key, reported)


def test_save_best_auto_and_unchecked_evaluators_pass():
    """``save_best='auto'`` takes the first reported key (mmengine); CityscapesMetric's
    keys are not known here, so nothing is refused for it."""
    assert not _save_best_refused('auto', dict(type='IoUMetric', iou_metrics=['mDice']))
    assert not _save_best_refused('mIoU', dict(type='CityscapesMetric'))


def test_save_best_fix_names_the_main_metric():
    """The fix offers the evaluator's main metric (mIoU), not the pixel accuracy aAcc."""
    cfg = Config(dict(default_hooks=dict(checkpoint=dict(save_best='mDice')),
                      val_evaluator=dict(type='IoUMetric')))
    problem = cc._save_best_problem(cfg)
    assert problem is not None and problem.endswith(
        'Fix: --cfg-options default_hooks.checkpoint.save_best=mIoU (or save_best=auto)')


@pytest.mark.parametrize('iou_metrics', ['mIoU', 'mDice'])
def test_iou_metrics_given_as_a_string(iou_metrics):
    """Found in round 11: mmseg's IoUMetric takes ``iou_metrics`` as a list or a string; a
    string was read letter by letter, and ``save_best`` of a metric it reports was refused."""
    evaluator = dict(type='IoUMetric', iou_metrics=iou_metrics)
    reported = _reported_keys(evaluator)
    assert iou_metrics in reported
    for key in SAVE_BEST_KEYS:
        assert _save_best_refused(key, evaluator) is (key not in reported), (key, reported)


def test_save_best_follows_the_evaluator_prefix():
    """Found in round 11: an evaluator ``prefix`` renames every key (``val/mIoU``):
    ``save_best='mIoU'`` stops the first validation with mmengine's KeyError and was let
    through, as was ``'val/mIoU'`` for an evaluator without a prefix."""
    prefixed = dict(type='IoUMetric', prefix='val')
    assert 'val/mIoU' in _reported_keys(prefixed) and 'mIoU' not in _reported_keys(prefixed)
    assert not _save_best_refused('val/mIoU', prefixed)
    assert _save_best_refused('mIoU', prefixed)
    assert _save_best_refused('val/mIoU', dict(type='IoUMetric'))


# ------------------------------------------------------------------------------ label maps
def test_label_maps_are_sampled_over_the_whole_list(tmp_path):
    """64 maps, a label beyond the classes only in map 40: the 32 sampled maps are every
    second one, not the first 32."""
    maps = [[0, 1, 2]] * 64
    maps[40] = [0, 1, 5]
    root = _label_maps(str(tmp_path), maps)
    cfg = _seg_cfg(_seg_model(3), _seg_dataset(root, classes=_names(3)))
    problems = label_range_problems(cfg, 'train')
    assert len(problems) == 1 and 'label(s) [5]' in problems[0], problems


def test_label_maps_sampled_evenly_below_twice_the_sample(tmp_path):
    """Found in round 11: with fewer than 2 x 32 maps the sample was the first 32 only
    (step 1): a label beyond the classes in map 62 of 63 passed, though the sample is "evenly
    spaced"."""
    maps = [[0, 1, 2]] * 63
    maps[62] = [0, 1, 5]
    root = _label_maps(str(tmp_path), maps)
    cfg = _seg_cfg(_seg_model(3), _seg_dataset(root, classes=_names(3)))
    problems = label_range_problems(cfg, 'train')
    assert len(problems) == 1 and 'label(s) [5]' in problems[0], problems


def _load_annotations(path: str, reduce_zero_label: bool) -> np.ndarray:
    from mmseg.datasets.transforms import LoadAnnotations
    return LoadAnnotations()(dict(seg_map_path=path, reduce_zero_label=reduce_zero_label,
                                  seg_fields=[]))['gt_seg_map']


def test_void_255_under_reduce_zero_label(tmp_path):
    """mmseg keeps 255 as 255 under ``reduce_zero_label`` (0 becomes 255 too): ADE-style
    maps 0..N with 255 fit N classes; 0-based maps 0..N-1 with 255 still warn."""
    root = _label_maps(str(tmp_path / 'ade'), [[0, 1, 2, 3, 255]] * 4)
    loaded = _load_annotations(osp.join(root, 'ann', 'train', '000.png'), True)
    assert set(np.unique(loaded)) == {0, 1, 2, 255}
    one_based = _seg_dataset(root, classes=_names(3), reduce_zero_label=True)
    cfg = _seg_cfg(_seg_model(3), one_based)
    assert label_range_problems(cfg, 'train') == []

    zero_based_root = _label_maps(str(tmp_path / 'voc'), [[0, 1, 2, 3, 255]] * 4)
    zero_based = _seg_dataset(zero_based_root, classes=_names(4), reduce_zero_label=True)
    cfg = _seg_cfg(_seg_model(4), zero_based)
    warning = cc._reduce_zero_label_warning(cfg, zero_based, 'train_dataloader.dataset')
    assert warning is not None and 'the largest is 3' in warning, warning


def test_a_class_subset_data_set_is_remapped_not_refused(tmp_path):
    """ADE20K with two of its classes: mmseg's label_map sends every other class to 255."""
    root = _label_maps(str(tmp_path), [[0, 1, 2, 10, 150]] * 4)
    from mmseg.datasets import ADE20KDataset
    subset = ADE20KDataset.METAINFO['classes'][:2]
    dataset = _seg_dataset(root, dataset_type='ADE20KDataset', classes=subset)
    from mmlinvit.datasets.pairing import build_lazy_dataset
    assert build_lazy_dataset(dataset, 'mmseg').label_map[9] == 255  # label 10 -> ignored
    cfg = _seg_cfg(_seg_model(2), dataset)
    assert label_range_problems(cfg, 'train') == []


def test_a_class_subset_data_set_is_checked_after_its_label_map(tmp_path):
    """A class subset is checked on the labels mmseg's ``LoadAnnotations`` hands on (after
    ``reduce_zero_label`` and the data set's ``label_map``): three ADE20K classes under a
    2-way head, or a label beyond ADE20K's 150, are out of range; the same data with a 3-way
    head is not."""
    from mmseg.datasets import ADE20KDataset
    from mmseg.datasets.transforms import LoadAnnotations

    from mmlinvit.datasets.pairing import build_lazy_dataset
    subset = ADE20KDataset.METAINFO['classes'][:3]
    root = _label_maps(str(tmp_path / 'three'), [[0, 1, 2, 3, 10]] * 4)
    dataset = _seg_dataset(root, dataset_type='ADE20KDataset', classes=subset)
    ds = build_lazy_dataset(dataset, 'mmseg')
    loaded = LoadAnnotations()(dict(seg_map_path=osp.join(root, 'ann', 'train', '000.png'),
                                    reduce_zero_label=True, label_map=ds.label_map,
                                    seg_fields=[]))['gt_seg_map']
    assert sorted(set(np.unique(loaded).tolist()) - {255}) == [0, 1, 2]  # the oracle
    problems = label_range_problems(_seg_cfg(_seg_model(2), dataset), 'train')
    assert len(problems) == 1 and 'label(s) [3]' in problems[0], problems
    assert label_range_problems(_seg_cfg(_seg_model(3), dataset), 'train') == []
    root = _label_maps(str(tmp_path / 'beyond'), [[0, 1, 2, 201]] * 4)
    dataset = _seg_dataset(root, dataset_type='ADE20KDataset', classes=subset)
    problems = label_range_problems(_seg_cfg(_seg_model(3), dataset), 'train')
    assert len(problems) == 1 and 'label(s) [201]' in problems[0], problems


def test_reduce_zero_label_is_the_data_sets_own(tmp_path):
    """ADE20KDataset without the key reads with its default True (labels 1..150 fit 150
    classes); with True stated and labels beyond, the message does not call it turned off."""
    from mmseg.datasets import ADE20KDataset
    assert inspect.signature(ADE20KDataset).parameters['reduce_zero_label'].default is True
    root = _label_maps(str(tmp_path), [list(range(0, 151, 5)) + [150]] * 4)
    dataset = _seg_dataset(root, dataset_type='ADE20KDataset')
    cfg = _seg_cfg(_seg_model(150), dataset)
    assert label_range_problems(cfg, 'train') == []
    beyond_root = _label_maps(str(tmp_path / 'beyond'), [[0, 1, 200]] * 4)
    cfg.train_dataloader.dataset = _seg_dataset(beyond_root, dataset_type='ADE20KDataset',
                                                reduce_zero_label=True)
    problems = label_range_problems(cfg, 'train')
    assert len(problems) == 1 and 'label(s) [200] (in up to 32 sampled maps, after ' \
        'reduce_zero_label)' in problems[0], problems
    assert 'turns off' not in problems[0]


def test_each_loader_is_read_with_its_own_evaluator(tmp_path):
    """Validation data is scored by ``val_evaluator``'s ignore_index, test data by
    ``test_evaluator``'s."""
    root = _label_maps(str(tmp_path), [[0, 1, 19]] * 2, split='val')
    labelled = _seg_dataset(root, 'val', classes=_names(19))
    cfg = _seg_cfg(_seg_model(19, ignore_index=19), val_cfg=dict(),
                   val_dataloader=dict(dataset=labelled), test_dataloader=dict(dataset=labelled),
                   val_evaluator=dict(type='IoUMetric', ignore_index=19),
                   test_evaluator=dict(type='IoUMetric', ignore_index=255))
    assert label_range_problems(cfg, 'train') == []
    assert len(label_range_problems(cfg, 'test')) == 1


# ------------------------------------------------------------------------------ reduce_zero_label
def test_validation_set_keeping_the_type_default_is_compared(tmp_path):
    """A validation ADE20KDataset without the key reads with True (its default) against a
    training set stated False."""
    cfg = Config(dict(
        val_cfg=dict(),
        train_dataloader=dict(dataset=dict(type='ADE20KDataset', data_root=str(tmp_path),
                                           reduce_zero_label=False)),
        val_dataloader=dict(dataset=dict(type='ADE20KDataset', data_root=str(tmp_path)))))
    problems = cc._reduce_zero_label_problems(cfg, 'train')
    assert len(problems) == 1 and problems[0].startswith(
        'val_dataloader.dataset.reduce_zero_label=True but the training set'), problems


def test_a_training_set_of_mixed_reduce_zero_label_is_not_compared(tmp_path):
    """No single training value: nothing to compare the validation set with."""
    train = dict(type='ConcatDataset', datasets=[
        dict(type='ADE20KDataset', data_root=str(tmp_path)),
        dict(type='BaseSegDataset', data_root=str(tmp_path), reduce_zero_label=False)])
    cfg = Config(dict(val_cfg=dict(), train_dataloader=dict(dataset=train),
                      val_dataloader=dict(dataset=dict(type='BaseSegDataset',
                                                       data_root=str(tmp_path)))))
    assert cc._reduce_zero_label_problems(cfg, 'train') == []


def test_kept_reduce_zero_label_is_warned_once_per_training_set(tmp_path):
    """The validation set with the same value is covered by the training set's warning."""
    root = _label_maps(str(tmp_path), [[0, 1, 2, 3]] * 4)
    _label_maps(root, [[0, 1, 2, 3]] * 2, split='val')
    cfg = _seg_cfg(_seg_model(4), _seg_dataset(root, classes=_names(4), reduce_zero_label=True),
                   val_cfg=dict(), val_evaluator=dict(type='IoUMetric'),
                   val_dataloader=dict(dataset=_seg_dataset(root, 'val', classes=_names(4),
                                                            reduce_zero_label=True)))
    with captured_log(logging.WARNING) as messages:
        check_config_consistency(cfg)
    warned = [m for m in messages if 'reduce_zero_label=True on a BaseSegDataset' in m]
    assert len(warned) == 1 and 'train_dataloader.dataset.reduce_zero_label' in warned[0]


def test_test_mode_warns_about_the_test_set(tmp_path):
    """``tools/test.py``: the kept ``reduce_zero_label`` and the evaluator's ignored label are
    warned for the test set."""
    root = _label_maps(str(tmp_path), [[0, 1, 2, 3]] * 4, split='val')
    kept = _seg_dataset(root, 'val', classes=_names(4), reduce_zero_label=True)
    cfg = _seg_cfg(_seg_model(4), test_dataloader=dict(dataset=kept),
                   test_evaluator=dict(type='IoUMetric'))
    with captured_log(logging.WARNING) as messages:
        check_test_config_consistency(cfg)
    assert any('test_dataloader.dataset.reduce_zero_label=True on a BaseSegDataset' in m
               for m in messages), messages
    cfg.test_dataloader.dataset.reduce_zero_label = False
    cfg.test_evaluator.ignore_index = 0  # 0 a void label of the metric, not of the heads
    with captured_log(logging.WARNING) as messages:
        check_test_config_consistency(cfg)
    assert any('test_evaluator ignores label(s) [0] but the heads ignore [255]' in m
               for m in messages), messages


# ------------------------------------------------------------------------------ preprocessor
def test_seg_pad_val_default_and_scoped_type():
    """SegDataPreProcessor pads labels with 255 unless told; a scoped type is read too."""
    from mmseg.models import SegDataPreProcessor
    assert inspect.signature(SegDataPreProcessor).parameters['seg_pad_val'].default == 255
    cfg = Config(dict(model=dict(type='EncoderDecoder',
                                 data_preprocessor=dict(type='SegDataPreProcessor'),
                                 decode_head=dict(type='UPerHead', num_classes=2))))
    assert cc._ignore_index_problems(cfg, 'train') == ([], [])
    cfg.model.decode_head.ignore_index = 0
    errors = cc._ignore_index_problems(cfg, 'train')[0]
    assert len(errors) == 1 and 'seg_pad_val=255 is not a label the heads ignore' in errors[0]
    cfg.model.data_preprocessor = dict(type='mmseg.SegDataPreProcessor', seg_pad_val=255)
    assert len(cc._ignore_index_problems(cfg, 'train')[0]) == 1


def _channel_cfg(model: dict, **extra) -> Config:
    return Config(dict(model=model, train_dataloader=dict(dataset=dict(
        type='ADE20KDataset', data_root='data/none',
        pipeline=[dict(type='LoadImageFromFile'), dict(type='PackSegInputs')])), **extra))


def test_channel_order_reads_the_preprocessor_mmengine_uses():
    """mmengine's Runner only fills a model without its own preprocessor from the top-level
    one (``model.setdefault``); a distillation model without either uses its student's."""
    from mmengine.runner import Runner
    assert "model.setdefault('data_preprocessor', data_preprocessor)" in \
        inspect.getsource(Runner.__init__)
    own = _channel_cfg(dict(type='EncoderDecoder', data_preprocessor=dict(
        type='SegDataPreProcessor', bgr_to_rgb=True)),
        data_preprocessor=dict(type='SegDataPreProcessor', bgr_to_rgb=False))
    assert cc._channel_order_warning(own) is None
    student = _channel_cfg(dict(type='DistillationModel', student=dict(
        type='EncoderDecoder', data_preprocessor=dict(type='SegDataPreProcessor',
                                                      bgr_to_rgb=False))))
    warning = cc._channel_order_warning(student)
    assert warning is not None and warning.startswith(
        'model.student.data_preprocessor.bgr_to_rgb=False'), warning


def test_channel_swap_left_at_the_library_default_is_warned():
    """Found in round 11: SegDataPreProcessor / ClsDataPreprocessor default to no channel
    swap; a preprocessor that does not state it hands BGR file images to an RGB-trained model,
    and only an explicit False was warned."""
    from mmpretrain.models import ClsDataPreprocessor
    from mmseg.models import SegDataPreProcessor
    assert inspect.signature(SegDataPreProcessor).parameters['bgr_to_rgb'].default is False
    assert inspect.signature(ClsDataPreprocessor).parameters['to_rgb'].default is False
    cfg = _channel_cfg(dict(type='EncoderDecoder',
                            data_preprocessor=dict(type='SegDataPreProcessor')))
    warning = cc._channel_order_warning(cfg)
    assert warning is not None and 'bgr_to_rgb' in warning, warning


def test_top_level_crop_size_used_by_any_training_set_is_not_warned():
    def dataset(crop):
        return dict(type='ADE20KDataset', data_root='data/none',
                    pipeline=[dict(type='RandomCrop', crop_size=crop)])
    cfg = Config(dict(crop_size=(64, 64), train_dataloader=dict(dataset=dict(
        type='ConcatDataset', datasets=[dataset((32, 32)), dataset((64, 64))]))))
    assert cc._crop_size_warning(cfg) is None


# ------------------------------------------------------------------------------ schedules
def test_epoch_loop_share_per_process_rounds_up(monkeypatch):
    """mmengine's DefaultSampler gives every process ceil(N / world) samples (padded): 10
    samples on 3 processes are 4 iterations of batch 1 per epoch, not 3."""
    import mmengine.dataset.sampler as sampler_module
    monkeypatch.setattr(sampler_module, 'get_dist_info', lambda: (0, 3))
    sampler = sampler_module.DefaultSampler(list(range(10)), shuffle=False, seed=0)
    monkeypatch.setenv('WORLD_SIZE', '3')
    cfg = Config(dict(train_cfg=dict(max_epochs=2), train_dataloader=dict(batch_size=1)))
    assert cc._epoch_loop_iterations(cfg, 10) == 2 * len(sampler) == 8


def _schedule_cfg(scheduler, **train_cfg) -> Config:
    return Config(dict(train_cfg=dict(train_cfg), param_scheduler=scheduler))


def test_a_single_scheduler_dict_and_the_by_epoch_default():
    """mmengine builds a single dict as a one-scheduler list; ``by_epoch`` defaults to True
    (an epoch-unit scheduler is not compared with max_iters)."""
    from mmengine.optim.scheduler.param_scheduler import PolyParamScheduler
    assert inspect.signature(PolyParamScheduler).parameters['by_epoch'].default is True
    single = _schedule_cfg(dict(type='PolyLR', by_epoch=False, begin=0, end=200),
                           type='IterBasedTrainLoop', max_iters=100)
    warnings = cc._schedule_warnings(single)
    assert len(warnings) == 1 and 'ends at 200 but train_cfg.max_iters=100' in warnings[0]
    epoch_unit = _schedule_cfg([dict(type='PolyLR', begin=0, end=200)],
                               type='IterBasedTrainLoop', max_iters=100)
    assert cc._schedule_warnings(epoch_unit) == []


# ------------------------------------------------------------------------------ unused blocks
def _backbone_cfg(**backbone) -> Config:
    return Config(dict(model=dict(backbone=dict(backbone))))


def test_negative_out_indices_count_from_the_end():
    """The backbones resolve -1 as the last block (``resolve_out_indices``)."""
    from mmlinvit.backbones.outputs import resolve_out_indices
    assert max(resolve_out_indices([3, 5, 7, -1], 12)) == 11
    assert cc._unused_blocks_warning(_backbone_cfg(type='VisionTransformer', arch='b',
                                                   out_indices=[3, 5, 7, -1])) is None
    warning = cc._unused_blocks_warning(_backbone_cfg(type='VisionTransformer', arch='b',
                                                      out_indices=[3, -3]))
    assert warning is not None and 'ends at block 9 of a 12-block' in warning, warning


def test_frozen_stages_of_every_block_leave_nothing_untrained():
    """``frozen_stages=depth`` freezes every block (the backbone's own freezing): no block
    trains without a gradient; one block less leaves the last one trainable and unused."""
    from mmlinvit.backbones.vit import VisionTransformer
    arch = dict(embed_dims=16, num_layers=4, num_heads=2, mlp_hidden_dims=32)
    for frozen, warned in ((4, False), (3, True)):
        model = VisionTransformer(arch=arch, img_size=16, patch_size=8, out_indices=[1],
                                  frozen_stages=frozen)
        last_trainable = any(p.requires_grad for p in model.block_list[-1].parameters())
        assert last_trainable is warned
        warning = cc._unused_blocks_warning(_backbone_cfg(
            type='VisionTransformer', arch=arch, out_indices=[1], frozen_stages=frozen))
        assert (warning is not None) is warned, warning


def test_adventurer_depth_is_read():
    from mmlinvit.backbones.adventurer import ADVENTURER_SIZES
    depth = ADVENTURER_SIZES['b']['num_layers']
    warning = cc._unused_blocks_warning(_backbone_cfg(type='Adventurer', arch='b',
                                                      out_indices=[depth - 2]))
    assert warning is not None and f'of a {depth}-block Adventurer' in warning, warning


def test_other_libraries_vision_transformers_are_not_judged_by_mmlinvits_arch_table():
    """mmseg's ``VisionTransformer`` (``num_layers=8``, no ``arch``) ending its out_indices at
    block 7 uses every block: unscoped under ``default_scope='mmseg'`` or scoped
    ``mmseg.VisionTransformer``, it is not read as mmlinvit's 12-block arch ``'b'`` (which
    warned of blocks 8-11, which it does not have); mmlinvit's own backbone (scoped, or with
    mmlinvit's scope) still is."""
    mmseg_vit = dict(num_layers=8, out_indices=[1, 3, 5, 7])
    for backbone, scope in ((dict(mmseg_vit, type='VisionTransformer'), 'mmseg'),
                            (dict(mmseg_vit, type='mmseg.VisionTransformer'), 'mmseg'),
                            (dict(mmseg_vit, type='mmseg.VisionTransformer'), None)):
        cfg = Config(dict(default_scope=scope, model=dict(backbone=backbone)))
        assert cc._unused_blocks_warning(cfg) is None, backbone
    ours = dict(type='mmlinvit.VisionTransformer', arch='b', out_indices=[3, 5, 7, 10])
    for scope in ('mmseg', 'mmlinvit', None):
        cfg = Config(dict(default_scope=scope, model=dict(backbone=ours)))
        assert 'ends at block 10 of a 12-block' in cc._unused_blocks_warning(cfg)
    cfg = Config(dict(default_scope='mmlinvit', model=dict(backbone=dict(
        ours, type='VisionTransformer'))))
    assert 'ends at block 10 of a 12-block' in cc._unused_blocks_warning(cfg)
