"""Config consistency and pad-size checks (mutation round 16): branches, defaults and
messages that earlier rounds left alive.

Guards :mod:`mmlinvit.engine.config_consistency` and :mod:`mmlinvit.engine.pad_size_check`
where a single-line change passed every other test.  The oracle is the library that runs
the config wherever it can be asked cheaply, else a value worked out by hand in the test:

* ``save_best``: the metric names mmseg's ``IoUMetric`` reports (the list the message shows,
  ``iou_metrics=[]``), a list of evaluators;
* class counts: a ``metainfo.classes`` file that does not exist (mmengine keeps the string),
  the training set named as trained on;
* top-k: mmpretrain's ``RetrievalRecall`` (whose top-k is not over classes), a teacher head
  that never computes a loss, ``cal_acc`` with an int ``topk`` or mmpretrain's default one,
  and the public entry point;
* label maps: an unreadable map among the sample, Cityscapes label ids beside train ids (the
  file list mmseg's ``CityscapesDataset`` reads), more than eight labels beyond the classes;
* ``reduce_zero_label``: a data set type that does not pass the argument on, the direction of
  the shift (mmseg's ``LoadAnnotations``), a data set read twice warned once, the 1-based
  types (ADE20K) not warned;
* channel order: the key mmpretrain's ``ClsDataPreprocessor`` takes (typed and untyped), data
  sets that decode no image files;
* crop size, schedules (mmengine's ``begin`` default, one warning per scheduler), mmlinvit's
  ``LinearVisionTransformer`` and the backbones' default arch;
* pad size: a config without a model, a preprocessor padding to a divisor only (mmseg's
  ``SegDataPreProcessor`` run on a crop).
"""
import inspect
import os
import os.path as osp
from typing import Sequence

import numpy as np
import pytest
import torch
from mmengine.config import Config
from PIL import Image

from mmlinvit.engine import config_consistency as cc
from mmlinvit.engine.config_consistency import (ConfigConsistencyError,
                                                check_config_consistency,
                                                label_range_problems)
from mmlinvit.engine.pad_size_check import find_pad_size_problem

from checkpoint_damage import truncate_to_half
from test_mutation_round11_config_consistency import (_names, _reported_keys, _seg_cfg,
                                                     _seg_dataset, _seg_model)

pytestmark = pytest.mark.usefixtures('one_thread', 'no_new_global_loggers')



# ------------------------------------------------------------------------------ helpers
def _label_maps(root: str, maps: Sequence[Sequence[int]], split: str = 'train',
                suffix: str = '.png', img_suffix: str = '.png') -> str:
    """Writes one 8x8 label map per entry of ``maps`` (its values first, zeros after) as
    ``root/ann/<split>/<i><suffix>`` and an image ``root/img/<split>/<i><img_suffix>``."""
    folder = osp.join(root, 'ann', split)
    images = osp.join(root, 'img', split)
    os.makedirs(folder, exist_ok=True)
    os.makedirs(images, exist_ok=True)
    for i, values in enumerate(maps):
        label = np.zeros((8, 8), np.uint8)
        label.flat[:len(values)] = values
        Image.fromarray(label).save(osp.join(folder, f'{i:03d}{suffix}'))
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(
            osp.join(images, f'{i:03d}{img_suffix}'))
    return root


def _save_best_cfg(save_best, evaluator) -> Config:
    return Config(dict(default_hooks=dict(checkpoint=dict(save_best=save_best)),
                       val_evaluator=evaluator))


# ------------------------------------------------------------------------------ save_best
@pytest.mark.parametrize('iou_metrics', [['mIoU', 'mDice'], ['mIoU', 'mFscore'],
                                         ['mDice', 'mIoU']])
def test_the_message_lists_the_keys_iou_metric_reports(iou_metrics):
    """mIoU and mDice both add mAcc, which IoUMetric reports once: the listed keys are its
    keys, in its order."""
    evaluator = dict(type='IoUMetric', iou_metrics=iou_metrics)
    reported = _reported_keys(evaluator)
    problem = cc._save_best_problem(_save_best_cfg('mRecallX', evaluator))
    assert problem is not None and f'(it reports {reported})' in problem, (problem, reported)


def test_save_best_with_pixel_accuracy_only():
    """``iou_metrics=[]``: IoUMetric reports aAcc alone; ``save_best='mIoU'`` is refused and
    the fix names the one key there is."""
    evaluator = dict(type='IoUMetric', iou_metrics=[])
    assert _reported_keys(evaluator) == ['aAcc']
    problem = cc._save_best_problem(_save_best_cfg('mIoU', evaluator))
    assert problem is not None and problem.endswith(
        'save_best=aAcc (or save_best=auto)'), problem
    assert cc._save_best_problem(_save_best_cfg('aAcc', evaluator)) is None


def test_a_list_of_evaluators_is_not_judged():
    """mmengine takes a list of metrics as the evaluator (their keys merged); the check reads
    single IoUMetric configs only and lets a list through instead of failing on it."""
    from mmengine.evaluator import Evaluator
    assert isinstance(Evaluator([]).metrics, list)  # a list is a valid evaluator config
    cfg = _save_best_cfg('mIoU', [dict(type='IoUMetric'), dict(type='IoUMetric',
                                                               iou_metrics=['mDice'])])
    assert cc._save_best_problem(cfg) is None


# ------------------------------------------------------------------------------ classes
def test_a_missing_metainfo_classes_file_gives_no_count(tmp_path):
    """mmengine's BaseDataset keeps a string meta value it cannot read as a file (no class
    list): nothing to compare, and the check does not fail on the missing file."""
    from mmseg.datasets import BaseSegDataset
    missing = str(tmp_path / 'no_such_classes.txt')
    built = BaseSegDataset(data_root=str(tmp_path), metainfo=dict(classes=missing),
                           lazy_init=True)
    assert built.metainfo['classes'] == missing  # the oracle: not a list of names
    dataset = dict(type='BaseSegDataset', data_root=str(tmp_path),
                   metainfo=dict(classes=missing))
    assert cc._dataset_classes(dataset) is None
    assert cc._class_count_problems(_seg_cfg(_seg_model(7), dataset)) == []


def test_the_training_set_is_named_trained_on(tmp_path):
    """A head of other classes than the training set is trained and scored wrong; one that
    differs from the validation set only is scored wrong."""
    cfg = Config(dict(
        model=_seg_model(3), val_cfg=dict(),
        train_dataloader=dict(dataset=dict(type='BaseSegDataset', data_root=str(tmp_path),
                                           metainfo=dict(classes=_names(2)))),
        val_dataloader=dict(dataset=dict(type='BaseSegDataset', data_root=str(tmp_path),
                                         metainfo=dict(classes=_names(4))))))
    problems = cc._class_count_problems(cfg)
    assert len(problems) == 2, problems
    train = [p for p in problems if 'train_dataloader.dataset' in p]
    val = [p for p in problems if 'val_dataloader.dataset' in p]
    assert 'would be trained and scored over the wrong classes' in train[0], train
    assert 'would be scored over the wrong classes' in val[0], val


def test_missing_class_files_and_image_folders_are_left_to_the_data_set(tmp_path):
    """A ``classes=`` file or an image folder that does not exist: mmpretrain itself reports it
    when it builds the data set (FileNotFoundError); the check counts nothing and does not
    fail first."""
    from mmpretrain.datasets import CustomDataset
    missing = str(tmp_path / 'missing')
    with pytest.raises(FileNotFoundError):
        CustomDataset(data_root=missing, data_prefix='train', pipeline=[])
    for dataset in (dict(type='ImageNet', data_root=str(tmp_path), classes=f'{missing}.txt'),
                    dict(type='CustomDataset', data_root=missing, data_prefix='train')):
        assert cc._dataset_classes(dataset) is None, dataset
        cfg = Config(dict(model=_cls_model(7), train_dataloader=dict(dataset=dataset)))
        assert cc._class_count_problems(cfg) == []


def test_the_class_weight_fix_has_one_entry_per_class_and_no_object(tmp_path):
    """The fix, evaluated, is a list of ``num_classes + 1`` weights (mmseg's Mask2Former
    configs: ``[1.0] * num_classes + [0.1]``)."""
    cfg = Config(dict(model=dict(type='EncoderDecoder', decode_head=dict(
        type='Mask2FormerHead', num_classes=5,
        loss_cls=dict(type='mmdet.CrossEntropyLoss', class_weight=[1.0] * 151)))))
    problems = cc._class_count_problems(cfg)
    assert len(problems) == 1, problems
    fix = problems[0].split('Fix: model.decode_head.loss_cls.class_weight=')[1]
    weights = eval(fix, {})  # noqa: S307 - the message's own list expression
    assert len(weights) == 5 + 1 and weights[-1] == 0.1 and weights[:-1] == [1.0] * 5


def test_maskformer_class_weight_length_is_checked_too():
    """Found in round 16: mmseg's MaskFormerHead (mmdet's, like Mask2FormerHead) scores
    ``num_classes + 1`` classes, the last the no-object class: mmseg's own MaskFormer config
    gives ``class_weight=[1.0] * num_classes + [0.1]``, and a kept 151-entry list on a 2-class
    head stops iteration 1 in the cross entropy (the oracle: torch's weighted cross entropy,
    which mmdet's ``CrossEntropyLoss`` calls with ``weight=class_weight``).  Only
    ``Mask2FormerHead`` was checked."""
    import mmseg
    official = Config.fromfile(osp.join(osp.dirname(mmseg.__file__), '.mim', 'configs',
                                        'maskformer',
                                        'maskformer_r50-d32_8xb2-160k_ade20k-512x512.py'),
                               import_custom_modules=False)
    head = official.model.decode_head
    assert head.type == 'MaskFormerHead'
    assert len(head.loss_cls.class_weight) == head.num_classes + 1
    kept = [1.0] * 150 + [0.1]
    with pytest.raises(RuntimeError):
        torch.nn.functional.cross_entropy(torch.randn(4, 2 + 1), torch.tensor([0, 1, 2, 2]),
                                          weight=torch.tensor(kept))
    cfg = Config(dict(model=dict(type='EncoderDecoder', decode_head=dict(
        type='MaskFormerHead', num_classes=2,
        loss_cls=dict(type='mmdet.CrossEntropyLoss', class_weight=kept)))))
    problems = cc._class_count_problems(cfg)
    assert any('class_weight has 151 entries but num_classes=2 needs 3' in p
               for p in problems), problems
    cfg.model.decode_head.loss_cls.class_weight = [1.0] * 2 + [0.1]
    assert cc._class_count_problems(cfg) == []


def test_the_mixup_fix_is_the_heads_width():
    """The fix sets the preprocessor's one-hot width to the head's classes, exactly."""
    cfg = Config(dict(
        model=dict(type='ImageClassifier', head=dict(type='LinearClsHead', num_classes=10),
                   train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8)])),
        data_preprocessor=dict(type='ClsDataPreprocessor', num_classes=1000)))
    problem = cc._batch_augment_problem(cfg)
    assert problem is not None and problem.endswith(
        'Fix: data_preprocessor.num_classes=10'), problem


# ------------------------------------------------------------------------------ top-k
def _cls_model(num_classes: int, **head) -> dict:
    return dict(type='ImageClassifier', head=dict(type='LinearClsHead',
                                                  num_classes=num_classes, in_channels=8,
                                                  **head))


def test_only_accuracy_top_k_is_over_classes():
    """mmpretrain's RetrievalRecall ranks a gallery: its top-5 is defined for a 2-class model
    (the oracle computes it); only Accuracy's top-k is refused."""
    from mmpretrain.evaluation import RetrievalRecall
    recall = RetrievalRecall.calculate(torch.rand(2, 8), [[0], [1]], topk=(1, 5))
    assert len(recall) == 2
    cfg = Config(dict(model=_cls_model(2),
                      test_evaluator=[dict(type='RetrievalRecall', topk=(1, 5))]))
    assert cc._evaluation_problems(cfg, 'test') == []
    cfg.test_evaluator.append(dict(type='Accuracy', topk=(1, 5)))
    problems = cc._evaluation_problems(cfg, 'test')
    assert len(problems) == 1 and 'test_evaluator[1].topk=(1, 5)' in problems[0], problems


def test_a_teacher_heads_training_accuracy_is_never_computed():
    """A frozen teacher only predicts (mmpretrain's ``predict`` computes no accuracy): its
    ``cal_acc`` top-k beyond its classes is harmless; the student's is refused."""
    from mmpretrain.models.heads import LinearClsHead
    from mmpretrain.structures import DataSample
    head = LinearClsHead(num_classes=2, in_channels=8, topk=(1, 5), cal_acc=True)
    head.predict((torch.randn(2, 8), ))  # the teacher's use: no error
    with pytest.raises(ValueError, match='Top-5 accuracy is unavailable'):
        head.loss((torch.randn(2, 8), ), [DataSample().set_gt_label(0),
                                          DataSample().set_gt_label(1)])
    risky = dict(topk=(1, 5), cal_acc=True)
    teacher_only = Config(dict(model=dict(type='DistillationModel', student=_cls_model(2),
                                          teacher=_cls_model(2, **risky))))
    assert cc._training_accuracy_problems(teacher_only) == []
    student = Config(dict(model=dict(type='DistillationModel', student=_cls_model(2, **risky),
                                     teacher=_cls_model(2))))
    problems = cc._training_accuracy_problems(student)
    assert len(problems) == 1 and problems[0].startswith('model.student.head.topk=(1, 5)')


def test_training_accuracy_with_mmpretrains_default_top_k():
    """mmpretrain's ClsHead defaults to top-1, defined on any head: ``cal_acc=True`` alone on
    a 2-way head trains (the oracle runs its loss) and is not refused."""
    from mmpretrain.models.heads import ClsHead, LinearClsHead
    from mmpretrain.structures import DataSample
    assert inspect.signature(ClsHead).parameters['topk'].default == (1, )
    LinearClsHead(num_classes=2, in_channels=8, cal_acc=True).loss((torch.randn(2, 8), ), [
        DataSample().set_gt_label(0), DataSample().set_gt_label(1)])
    assert cc._training_accuracy_problems(Config(dict(model=_cls_model(
        2, cal_acc=True)))) == []


@pytest.mark.parametrize('k', [1, 2, 5])
def test_training_accuracy_with_an_int_top_k(k):
    """Found in round 16: mmpretrain's ClsHead documents ``topk`` as an int or a tuple, but
    with ``cal_acc=True`` it hands an int to ``Accuracy.calculate``, which iterates it: every
    int stops the first iteration with a bare ``TypeError: 'int' object is not iterable`` (the
    oracle runs the head's loss), top-1 on 3 classes included; the check let ``topk=1`` / ``2``
    through (it refused only an int beyond the classes).  The fix names the tuple form."""
    from mmpretrain.models.heads import LinearClsHead
    from mmpretrain.structures import DataSample
    samples = [DataSample().set_gt_label(0), DataSample().set_gt_label(2)]
    features = (torch.randn(2, 8), )
    with pytest.raises((TypeError, ValueError)):
        LinearClsHead(num_classes=3, in_channels=8, topk=k, cal_acc=True).loss(features,
                                                                              samples)
    LinearClsHead(num_classes=3, in_channels=8, topk=(min(k, 3), ), cal_acc=True).loss(
        features, samples)  # the tuple form trains
    problems = cc._training_accuracy_problems(Config(dict(model=_cls_model(
        3, topk=k, cal_acc=True))))
    assert len(problems) == 1 and problems[0].startswith(
        f'model.head.topk={k} with cal_acc=True'), problems
    assert f'topk="({k if k <= 3 else 1},)"' in problems[0], problems


def test_training_accuracy_top_k_stops_the_training_check():
    """``check_config_consistency`` refuses the head's ``cal_acc`` top-k (not only the helper)."""
    cfg = Config(dict(model=_cls_model(3, topk=(1, 5), cal_acc=True)))
    with pytest.raises(ConfigConsistencyError, match=r'model.head.topk=\(1, 5\) with cal_acc'):
        check_config_consistency(cfg)


def test_slide_settings_without_a_stride_are_left_to_mmseg():
    """A slide ``test_cfg`` without its stride is incomplete, not judged here (no crash)."""
    cfg = Config(dict(model=dict(type='EncoderDecoder', decode_head=dict(
        type='UPerHead', num_classes=2), test_cfg=dict(mode='slide', crop_size=(32, 32)))))
    assert cc._evaluation_problems(cfg, 'test') == []


# ------------------------------------------------------------------------------ label maps
def test_an_unreadable_label_map_is_skipped_not_fatal(tmp_path):
    """A truncated PNG among the maps (PIL raises OSError on it) is left to --check-data; the
    other sampled maps are still read."""
    root = _label_maps(str(tmp_path), [[0, 1, 5]] * 3)
    bad = osp.join(root, 'ann', 'train', '001.png')
    truncate_to_half(bad)
    with pytest.raises(OSError):
        with Image.open(bad) as image:
            np.asarray(image)
    cfg = _seg_cfg(_seg_model(3), _seg_dataset(root, classes=_names(3)))
    problems = label_range_problems(cfg, 'train')
    assert len(problems) == 1 and 'label(s) [5]' in problems[0], problems


def _cityscapes(root: str) -> str:
    """Two Cityscapes-style samples: train ids (0..18) beside label ids (0..33) in one folder,
    as cityscapesscripts writes them."""
    folder, images = osp.join(root, 'ann', 'train'), osp.join(root, 'img', 'train')
    os.makedirs(folder)
    os.makedirs(images)
    for i in range(2):
        for suffix, top in (('_gtFine_labelTrainIds.png', 18), ('_gtFine_labelIds.png', 33)):
            label = np.zeros((8, 8), np.uint8)
            label.flat[:3] = [0, top, 255]
            Image.fromarray(label).save(osp.join(folder, f'c{i}{suffix}'))
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(
            osp.join(images, f'c{i}_leftImg8bit.png'))
    return root


def test_only_the_label_maps_of_the_suffix_are_read(tmp_path):
    """mmseg's CityscapesDataset reads the ``seg_map_suffix`` files only: the label ids beside
    the train ids are not its labels; read under the label-id suffix, they are refused with the
    Cityscapes hint."""
    root = _cityscapes(str(tmp_path))
    dataset = dict(type='CityscapesDataset', data_root=root, pipeline=[],
                   data_prefix=dict(img_path='img/train', seg_map_path='ann/train'))
    from mmseg.datasets import CityscapesDataset
    built = CityscapesDataset(**{k: v for k, v in dataset.items() if k != 'type'})
    assert len(built) == 2 and all(d['seg_map_path'].endswith('_gtFine_labelTrainIds.png')
                                   for d in built.data_list)  # the oracle
    cfg = _seg_cfg(_seg_model(19), dataset)
    assert label_range_problems(cfg, 'train') == []
    cfg.train_dataloader.dataset.seg_map_suffix = '_gtFine_labelIds.png'
    problems = label_range_problems(cfg, 'train')
    assert len(problems) == 1 and 'label(s) [33]' in problems[0], problems
    assert 'these look like Cityscapes label ids (0..33), not train ids' in problems[0]


def test_at_most_eight_labels_are_named(tmp_path):
    """Labels 3..12 beyond a 3-class head: the message names the first eight, 3..10."""
    root = _label_maps(str(tmp_path), [list(range(13))] * 2)
    problems = label_range_problems(_seg_cfg(_seg_model(3), _seg_dataset(
        root, classes=_names(3))), 'train')
    assert len(problems) == 1 and 'label(s) [3, 4, 5, 6, 7, 8, 9, 10] (in up to' in \
        problems[0], problems


def test_an_evaluator_without_metrics_is_not_said_to_ignore_other_labels():
    """``val_evaluator=[]`` (mmengine's Evaluator with no metric) scores no label: no warning
    that it ignores other labels than the heads (255, mmseg's default)."""
    from mmengine.evaluator import Evaluator
    assert Evaluator([]).metrics == []
    cfg = _seg_cfg(_seg_model(3), val_cfg=dict(), val_evaluator=[],
                   val_dataloader=dict(dataset=dict(type='BaseSegDataset', data_root='x')))
    assert cc._ignore_index_problems(cfg, 'train') == ([], [])


# ------------------------------------------------------------------------------ reduce_zero_label
def test_a_type_that_fixes_reduce_zero_label_itself_is_not_compared(tmp_path):
    """A data set type whose ``__init__`` takes no ``reduce_zero_label`` (and no ``**kwargs``)
    sets it itself: the config cannot change it, and its parent's default is not its value
    (this one reads with True, like the validation set)."""
    from mmseg.datasets import BaseSegDataset

    class FixedLabels(BaseSegDataset):

        def __init__(self, data_root: str, lazy_init: bool = True) -> None:
            super().__init__(data_root=data_root, reduce_zero_label=True, lazy_init=lazy_init)

    assert FixedLabels(data_root=str(tmp_path)).reduce_zero_label is True  # the oracle
    with pytest.raises(TypeError):
        FixedLabels(data_root=str(tmp_path), reduce_zero_label=False)
    assert cc._reduce_zero_label_default(dict(type=FixedLabels)) is None
    cfg = Config(dict(
        val_cfg=dict(),
        train_dataloader=dict(dataset=dict(type=FixedLabels, data_root=str(tmp_path))),
        val_dataloader=dict(dataset=dict(type='BaseSegDataset', data_root=str(tmp_path),
                                         reduce_zero_label=True))))
    assert cc._reduce_zero_label_problems(cfg, 'train') == []


def _read(path: str, reduce_zero_label: bool) -> np.ndarray:
    from mmseg.datasets.transforms import LoadAnnotations
    return LoadAnnotations()(dict(seg_map_path=path, reduce_zero_label=reduce_zero_label,
                                  seg_fields=[]))['gt_seg_map']


def test_a_validation_set_without_the_shift_scores_against_the_class_above(tmp_path):
    """Trained with ``reduce_zero_label=True`` (label 5 learnt as class 4), validated without
    (label 5 scored as class 5): every label is scored against the class above the one the
    model learnt for it."""
    root = _label_maps(str(tmp_path), [[5]])
    path = osp.join(root, 'ann', 'train', '000.png')
    learnt, scored = int(_read(path, True).flat[0]), int(_read(path, False).flat[0])
    assert scored == learnt + 1  # the oracle: mmseg's LoadAnnotations
    cfg = Config(dict(
        val_cfg=dict(),
        train_dataloader=dict(dataset=dict(type='BaseSegDataset', data_root=root,
                                           reduce_zero_label=True)),
        val_dataloader=dict(dataset=dict(type='BaseSegDataset', data_root=root,
                                         reduce_zero_label=False))))
    problems = cc._reduce_zero_label_problems(cfg, 'train')
    assert len(problems) == 1 and 'scored against the class above the one' in problems[0]


def test_reduce_zero_label_none_reads_as_false(tmp_path):
    """Found in round 16: mmseg's LoadAnnotations takes a data set's ``reduce_zero_label`` by
    truth value (``None`` shifts nothing, as ``False``); a validation set stated ``None``
    against a training set read with ``True`` (every label scored against the class above)
    was not compared."""
    root = _label_maps(str(tmp_path), [[5]])
    path = osp.join(root, 'ann', 'train', '000.png')
    from mmseg.datasets.transforms import LoadAnnotations
    none = LoadAnnotations()(dict(seg_map_path=path, reduce_zero_label=None,
                                  seg_fields=[]))['gt_seg_map']
    assert int(none.flat[0]) == int(_read(path, False).flat[0]) == 5  # the oracle
    cfg = Config(dict(
        val_cfg=dict(),
        train_dataloader=dict(dataset=dict(type='BaseSegDataset', data_root=root,
                                           reduce_zero_label=True)),
        val_dataloader=dict(dataset=dict(type='BaseSegDataset', data_root=root,
                                         reduce_zero_label=None))))
    problems = cc._reduce_zero_label_problems(cfg, 'train')
    assert len(problems) == 1 and problems[0].startswith(
        'val_dataloader.dataset.reduce_zero_label=False but the training set'), problems


def test_a_data_set_read_twice_is_warned_once(tmp_path):
    """The same 0-based label maps twice in a ConcatDataset (one set of files) under
    ``reduce_zero_label=True``: one warning."""
    root = _label_maps(str(tmp_path), [[0, 1, 2, 3]] * 4)
    one = _seg_dataset(root, classes=_names(4), reduce_zero_label=True)
    cfg = _seg_cfg(_seg_model(4), dict(type='ConcatDataset', datasets=[one, dict(one)]))
    warnings = cc._reduce_zero_label_warnings(cfg, 'train')
    assert len(warnings) == 1 and warnings[0].startswith(
        'train_dataloader.dataset.datasets[0].reduce_zero_label=True'), warnings


def test_reduce_zero_label_on_a_type_whose_default_it_is_is_not_warned(tmp_path):
    """ADE20KDataset reads with ``reduce_zero_label=True`` by default: stating it is no
    leftover of another base, whatever the labels of a small sample (0..3 of 150)."""
    from mmseg.datasets import ADE20KDataset
    assert inspect.signature(ADE20KDataset).parameters['reduce_zero_label'].default is True
    root = _label_maps(str(tmp_path), [[0, 1, 2, 3]] * 4, img_suffix='.jpg')
    dataset = _seg_dataset(root, dataset_type='ADE20KDataset', img_suffix='.jpg',
                           reduce_zero_label=True)
    cfg = _seg_cfg(_seg_model(150), dataset)
    assert cc._reduce_zero_label_warning(cfg, dataset, 'train_dataloader.dataset') is None
    # the same maps on a type whose default is False are warned (the check reads them)
    other = dict(dataset, type='BaseSegDataset', metainfo=dict(classes=_names(150)))
    assert cc._reduce_zero_label_warning(cfg, other, 'train_dataloader.dataset') is not None


def test_the_last_class_seen_in_the_first_sample_settles_it(tmp_path):
    """1-based labels (0 unlabelled, classes 1..7) whose class 7 is in one map of 600, one of
    the 32 evenly spaced maps read first (every 19th: map 19): labels 1..N are what
    ``reduce_zero_label`` assumes, no warning - even though the larger confirming sample
    (every 2nd map) would not contain that map."""
    n, step = 600, -(-600 // cc.LABEL_SAMPLE)
    assert step == 19 and 19 % -(-n // cc.LABEL_CONFIRM_SAMPLE) == 1  # map 19: first only
    maps = [[0, 1, 2, 3, 4, 5, 6]] * n
    maps[19] = [0, 7]
    root = _label_maps(str(tmp_path), maps)
    dataset = _seg_dataset(root, classes=_names(7), reduce_zero_label=True)
    cfg = _seg_cfg(_seg_model(7), dataset)
    assert cc._reduce_zero_label_warning(cfg, dataset, 'train_dataloader.dataset') is None


# ------------------------------------------------------------------------------ channel order
def _file_pipeline(loads_files: bool = True) -> list:
    first = [dict(type='LoadImageFromFile')] if loads_files else []
    return first + [dict(type='RandomCrop', crop_size=32), dict(type='PackInputs')]


@pytest.mark.parametrize('preprocessor', [dict(type='ClsDataPreprocessor'),
                                          dict(type='mmpretrain.ClsDataPreprocessor'), dict()])
def test_a_classifiers_channel_swap_is_named_to_rgb(preprocessor):
    """mmpretrain's ClsDataPreprocessor (the type ImageClassifier gives an untyped one) takes
    ``to_rgb``, not ``bgr_to_rgb``: the fix names the key it accepts."""
    from mmpretrain.models import ClsDataPreprocessor, ImageClassifier
    params = inspect.signature(ClsDataPreprocessor).parameters
    assert 'to_rgb' in params and 'bgr_to_rgb' not in params
    assert "setdefault('type', 'ClsDataPreprocessor')" in inspect.getsource(
        ImageClassifier.__init__)
    cfg = Config(dict(model=dict(type='ImageClassifier', data_preprocessor=preprocessor),
                      train_dataloader=dict(dataset=dict(type='ImageNet', data_root='none',
                                                         pipeline=_file_pipeline()))))
    warning = cc._channel_order_warning(cfg)
    assert warning is not None and warning.startswith(
        'model.data_preprocessor.to_rgb=False') and 'Fix: model.data_preprocessor.to_rgb=True' \
        in warning, warning


def test_a_data_set_of_arrays_is_not_warned():
    """CIFAR yields RGB arrays (no LoadImageFromFile): no swap is right there."""
    cfg = Config(dict(model=dict(type='ImageClassifier',
                                 data_preprocessor=dict(type='ClsDataPreprocessor')),
                      train_dataloader=dict(dataset=dict(type='CIFAR10', data_root='none',
                                                         pipeline=_file_pipeline(False)))))
    assert cc._channel_order_warning(cfg) is None


# ------------------------------------------------------------------------------ crop size
def _crop_cfg(top, crops: Sequence) -> Config:
    datasets = [dict(type='ADE20KDataset', data_root=f'data/{i}',
                     pipeline=[dict(type='RandomCrop', crop_size=c)] if c else [])
                for i, c in enumerate(crops)]
    return Config(dict(crop_size=top, train_dataloader=dict(dataset=dict(
        type='ConcatDataset', datasets=datasets))))


def test_a_top_level_crop_size_without_training_crops_is_not_warned():
    """No RandomCrop to compare with (e.g. resize-only training): nothing to warn about."""
    assert cc._crop_size_warning(_crop_cfg((64, 64), [None])) is None


def test_the_crop_size_warning_names_two_training_crops():
    warning = cc._crop_size_warning(_crop_cfg((64, 64), [(32, 32), (48, 48), (16, 16)]))
    assert warning is not None and (
        '(train_dataloader.dataset.datasets[0].pipeline[0].crop_size=(32, 32), '
        'train_dataloader.dataset.datasets[1].pipeline[0].crop_size=(48, 48))') in warning
    assert '(16, 16)' not in warning


# ------------------------------------------------------------------------------ schedules
def _schedule(max_iters: int, **sched) -> Config:
    return Config(dict(train_cfg=dict(type='IterBasedTrainLoop', max_iters=max_iters),
                       param_scheduler=[dict(type='LinearLR', by_epoch=False, **sched)]))


def test_a_scheduler_without_begin_starts_at_zero():
    """mmengine's schedulers begin at 0 unless told: one ending with a 1-iteration run runs."""
    from mmengine.optim.scheduler.param_scheduler import LinearParamScheduler
    assert inspect.signature(LinearParamScheduler).parameters['begin'].default == 0
    assert cc._schedule_warnings(_schedule(1, end=1)) == []


def test_one_warning_per_scheduler():
    """A scheduler that begins and ends after the run is one warning (its end)."""
    warnings = cc._schedule_warnings(_schedule(100, begin=200, end=300))
    assert len(warnings) == 1 and 'ends at 300 but train_cfg.max_iters=100' in warnings[0]


class _Listed(list):
    """A data set with the ``metainfo`` mmengine's loops hand to the visualizer."""
    metainfo: dict = {}


def test_a_whole_float_max_epochs_is_a_limit_too():
    """mmengine's EpochBasedTrainLoop takes ``max_epochs=10.0`` (it keeps ``int(10.0)``): an
    epoch scheduler ending at 20 still outlives that run."""
    from types import SimpleNamespace

    from mmengine.runner import EpochBasedTrainLoop
    from torch.utils.data import DataLoader
    runner = SimpleNamespace(visualizer=SimpleNamespace(dataset_meta=None))
    loop = EpochBasedTrainLoop(runner=runner, dataloader=DataLoader(_Listed(range(4))),
                               max_epochs=10.0)
    assert loop.max_epochs == 10  # the oracle: a valid loop of 10 epochs
    cfg = Config(dict(train_cfg=dict(type='EpochBasedTrainLoop', max_epochs=10.0),
                      param_scheduler=[dict(type='CosineAnnealingLR', by_epoch=True, begin=0,
                                            end=20)]))
    warnings = cc._schedule_warnings(cfg)
    assert len(warnings) == 1 and 'ends at 20 but train_cfg.max_epochs=10.0' in warnings[0]


# ------------------------------------------------------------------------------ unused blocks
def test_linear_vision_transformer_and_the_default_arch():
    """mmlinvit's LinearVisionTransformer is judged like its VisionTransformer; a backbone
    without ``arch`` has the backbones' default depth (arch 'b', 12 blocks)."""
    from mmlinvit.backbones import LinearVisionTransformer, VisionTransformer
    from mmlinvit.backbones.arch_zoo import VIT_SIZES
    for cls in (VisionTransformer, LinearVisionTransformer):
        assert inspect.signature(cls).parameters['arch'].default == 'b'
    assert VIT_SIZES['b']['num_layers'] == 12
    for kind in ('LinearVisionTransformer', 'VisionTransformer'):
        cfg = Config(dict(model=dict(backbone=dict(type=kind, out_indices=[3, 10]))))
        warning = cc._unused_blocks_warning(cfg)
        assert warning is not None and 'ends at block 10 of a 12-block' in warning, warning
        cfg.model.backbone.out_indices = [11]
        assert cc._unused_blocks_warning(cfg) is None


# ------------------------------------------------------------------------------ pad size
def test_a_config_without_a_model_has_no_pad_problem():
    cfg = Config(dict(train_dataloader=dict(dataset=dict(type='ADE20KDataset', data_root='x',
                                                         pipeline=[dict(type='RandomCrop',
                                                                        crop_size=32)]))))
    assert find_pad_size_problem(cfg) is None


def test_a_preprocessor_padding_to_a_divisor_only_is_passed_over():
    """mmseg's SegDataPreProcessor without ``size`` pads a 32 x 32 crop to its divisor, not to
    a larger fixed size (the oracle runs it): nothing to report."""
    from mmseg.models import SegDataPreProcessor
    from mmseg.structures import SegDataSample
    pre = SegDataPreProcessor(size_divisor=32)
    sample = SegDataSample()
    out = pre(dict(inputs=[torch.zeros(3, 32, 32)], data_samples=[sample]), training=True)
    assert tuple(out['inputs'].shape[-2:]) == (32, 32)
    cfg = Config(dict(model=dict(data_preprocessor=dict(type='SegDataPreProcessor',
                                                        size_divisor=32)),
                      train_dataloader=dict(dataset=dict(type='ADE20KDataset', data_root='x',
                                                         pipeline=[dict(type='RandomCrop',
                                                                        crop_size=32)]))))
    assert find_pad_size_problem(cfg) is None



def test_class_typed_heads_are_checked_as_named_ones():
    """Pure-Python configs name a head by its class (``type=Mask2FormerHead``): the checks read
    the class name as they read ``'Mask2FormerHead'`` / ``'mmseg.Mask2FormerHead'`` (before:
    ``''``, so every check keyed on a head type passed over such a head)."""
    from mmseg.models.decode_heads import Mask2FormerHead
    kept = [1.0] * 150 + [0.1]
    for head_type in ('Mask2FormerHead', 'mmseg.Mask2FormerHead', Mask2FormerHead):
        cfg = Config(dict(model=dict(type='EncoderDecoder', decode_head=dict(
            type=head_type, num_classes=2,
            loss_cls=dict(type='mmdet.CrossEntropyLoss', class_weight=kept)))))
        problems = cc._class_count_problems(cfg)
        assert any('class_weight has 151 entries but num_classes=2 needs 3' in p
                   for p in problems), (head_type, problems)
