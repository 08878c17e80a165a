"""Config consistency and pre-flight checks (mutation round 20): branches, boundaries and
defaults of :mod:`mmlinvit.engine.config_consistency` and :mod:`mmlinvit.engine.preflight`
that every earlier test let a single-line change pass.

Each test checks against the library that runs the config (mmengine's ``Config`` /
``Runner`` rules, mmseg's / mmpretrain's classes built or called in the test) or a value
worked out by hand:

* heads given as a tuple (mmengine's ``Config`` keeps tuples; mmseg's
  ``CascadeEncoderDecoder`` builds its stages from one);
* image-folder classes: mmpretrain's ``find_folders`` counts hidden sub-folders too;
* the fix of an int ``cal_acc`` top-k equal to the class count (mmpretrain's head trains
  with that k as a tuple);
* ``save_best=['auto']``, which mmengine's ``CheckpointHook`` reads as ``'auto'`` (a bug
  found in this round: the check refused it);
* label maps: a teacher's ``ignore_index`` does not hide labels the student's loss
  (mmseg's ``CrossEntropyLoss``) stops on; no 1-based hint for mmseg's ``BaseSegDataset``;
* pre-flight: a config without ``launcher`` is one process (mmengine's ``Runner`` default)
  for SyncBN heads and no train loader means no batch-size problem.
"""
from typing import Optional

import pytest
import torch
from mmengine.config import Config

from mmlinvit.engine import config_consistency as cc
from mmlinvit.engine import preflight as pf

from test_mutation_round11_config_consistency import _image_folder
from test_mutation_round16_config_consistency import _label_maps

pytestmark = pytest.mark.usefixtures('one_thread', 'no_new_global_loggers')



# ------------------------------------------------------------------------------ helpers
def _cls_config(dataset: dict, num_classes: int) -> Config:
    head = dict(type='LinearClsHead', num_classes=num_classes, in_channels=8)
    return Config(dict(model=dict(type='ImageClassifier', head=head),
                       train_dataloader=dict(batch_size=2, dataset=dataset)))


def _mmpretrain_classes(dataset: dict) -> Optional[int]:
    """The class count mmpretrain's own data set reports for ``dataset`` (the oracle)."""
    import mmpretrain.datasets  # noqa: F401 - fills the registry
    from mmpretrain.registry import DATASETS
    built = DATASETS.build(dict(dataset, lazy_init=False))
    classes = built.metainfo.get('classes', None)
    return None if classes is None else len(classes)


# ------------------------------------------------------------------------------ heads
def test_heads_in_a_tuple_are_checked(tmp_path) -> None:
    """mmengine's ``Config`` keeps a tuple of decode heads a tuple and mmseg's
    ``CascadeEncoderDecoder`` builds one stage per entry; both 150-way heads on a 2-class
    data set are refused, each named by its position."""
    from mmseg.models.segmentors import CascadeEncoderDecoder
    heads = (dict(type='FCNHead', in_channels=8, channels=4, num_classes=150, num_convs=1),
             dict(type='FCNHead', in_channels=8, channels=4, num_classes=150, num_convs=1))
    cfg = Config(dict(
        model=dict(type='CascadeEncoderDecoder', num_stages=2, decode_head=heads),
        train_dataloader=dict(dataset=dict(type='BaseSegDataset', data_root=str(tmp_path),
                                           metainfo=dict(classes=('a', 'b'))))))
    assert isinstance(cfg.model.decode_head, tuple)
    import mmseg.models  # noqa: F401 - fills the registry
    from mmseg.registry import MODELS
    with MODELS.switch_scope_and_registry('mmseg'):
        built = CascadeEncoderDecoder(
            num_stages=2, backbone=dict(type='mmseg.ResNetV1c', depth=18, out_indices=(3, )),
            decode_head=[dict(h) for h in cfg.model.decode_head])
    assert [head.num_classes for head in built.decode_head] == [150, 150]
    problems = cc._class_count_problems(cfg)
    assert len(problems) == 2, problems
    assert problems[0].startswith('model.decode_head[0].num_classes=150')
    assert problems[1].startswith('model.decode_head[1].num_classes=150')


def test_hidden_sub_folders_are_classes_as_mmpretrain_counts_them(tmp_path) -> None:
    """mmpretrain's ``find_folders`` lists every sub-folder (mmengine's local backend skips
    hidden files, not hidden folders): ``.extra`` is a third class."""
    root = _image_folder(str(tmp_path / 'data'), ('a', 'b', '.extra'))
    dataset = dict(type='CustomDataset', data_root=root, data_prefix='train', pipeline=[])
    assert _mmpretrain_classes(dataset) == 3
    assert cc._class_count_problems(_cls_config(dataset, 3)) == []
    problems = cc._class_count_problems(_cls_config(dataset, 2))
    assert len(problems) == 1 and 'has 3 classes (sub-folders of' in problems[0], problems


def test_the_fix_of_an_int_top_k_equal_to_the_classes_keeps_k() -> None:
    """``topk=3`` on a 3-way head with ``cal_acc``: the tuple form ``(3,)`` trains in
    mmpretrain's head (top-3 of 3 classes is defined), so the fix keeps k."""
    from mmpretrain.models.heads import LinearClsHead
    from mmpretrain.structures import DataSample
    samples = [DataSample().set_gt_label(0), DataSample().set_gt_label(2)]
    losses = LinearClsHead(num_classes=3, in_channels=8, topk=(3, ), cal_acc=True).loss(
        (torch.randn(2, 8), ), samples)
    assert 0.0 <= float(losses['accuracy_top-3'][0]) <= 100.0  # defined: no error
    cfg = Config(dict(model=dict(type='ImageClassifier', head=dict(
        type='LinearClsHead', num_classes=3, in_channels=8, topk=3, cal_acc=True))))
    problems = cc._training_accuracy_problems(cfg)
    assert len(problems) == 1 and 'topk="(3,)"' in problems[0], problems


# ------------------------------------------------------------------------------ save_best
def _checkpoint_hook_keeps_best(save_best, metrics: dict, out_dir: str) -> bool:
    """Runs mmengine's own ``CheckpointHook._save_best_checkpoint`` on ``metrics`` (the
    oracle): True when it saves a best checkpoint, False when it stops with ``KeyError``."""
    from unittest import mock

    from mmengine.fileio import get_file_backend
    from mmengine.hooks import CheckpointHook
    hook = CheckpointHook(interval=1, by_epoch=False, save_best=save_best)
    hook.out_dir = out_dir
    hook.file_backend = get_file_backend(out_dir)
    runner = mock.MagicMock(iter=0, epoch=0)
    runner.message_hub.runtime_info = {}
    try:
        hook._save_best_checkpoint(runner, metrics)
    except KeyError:
        return False
    return runner.save_checkpoint.called


def test_save_best_auto_in_a_list_is_auto(tmp_path) -> None:
    """Found in round 20: mmengine's ``CheckpointHook`` takes ``save_best=['auto']`` as
    ``'auto'`` (the first metric the evaluator reports; it keeps the best mIoU run by run),
    but the check read ``'auto'`` in a list as a metric name and refused the config
    ("names ['auto'], which val_evaluator (IoUMetric) does not report")."""
    metrics = {'aAcc': 90.0, 'mIoU': 40.0, 'mAcc': 50.0}
    assert _checkpoint_hook_keeps_best(['auto'], metrics, str(tmp_path))
    assert _checkpoint_hook_keeps_best('auto', metrics, str(tmp_path))
    assert not _checkpoint_hook_keeps_best(['mDice'], metrics, str(tmp_path))

    def problem(save_best) -> Optional[str]:
        return cc._save_best_problem(Config(dict(
            default_hooks=dict(checkpoint=dict(type='CheckpointHook', save_best=save_best)),
            val_evaluator=dict(type='IoUMetric', iou_metrics=['mIoU']))))

    assert problem(['auto']) is None
    assert problem('auto') is None
    assert problem(['mDice']) is not None  # the check still refuses a metric never reported


# ------------------------------------------------------------------------------ label maps
def _seg_dataset(root: str, split: str = 'train', **extra) -> dict:
    dataset = dict(type='BaseSegDataset', data_root=root, pipeline=[], img_suffix='.png',
                   seg_map_suffix='.png', metainfo=dict(classes=('a', 'b')),
                   data_prefix=dict(img_path=f'img/{split}', seg_map_path=f'ann/{split}'))
    dataset.update(extra)
    return dataset


def _seg_head(num_classes: int = 2, **extra) -> dict:
    return dict(type='FCNHead', in_channels=8, channels=4, num_classes=num_classes, **extra)


def test_a_teachers_ignore_index_does_not_hide_the_students_out_of_range_labels(
        tmp_path) -> None:
    """A frozen teacher that ignores label 5 computes no loss: the student's loss (mmseg's
    ``CrossEntropyLoss`` with its own ``ignore_index=255``) stops on label 5 of a 2-class
    head, so the label maps are refused whatever the teacher ignores."""
    from mmseg.models.losses import CrossEntropyLoss
    with pytest.raises((IndexError, RuntimeError)):
        CrossEntropyLoss()(torch.zeros(1, 2, 2, 2), torch.tensor([[[0, 1], [5, 0]]]),
                           ignore_index=255)
    root = _label_maps(str(tmp_path), [[0, 1, 5], [1]])
    cfg = Config(dict(default_scope='mmseg', model=dict(
        type='DistillationModel',
        student=dict(type='EncoderDecoder', decode_head=_seg_head(2)),
        teacher=dict(type='EncoderDecoder', decode_head=_seg_head(150, ignore_index=5))),
        train_dataloader=dict(dataset=_seg_dataset(root))))
    problems = cc.label_range_problems(cfg, 'train')
    assert len(problems) == 1 and 'hold label(s) [5]' in problems[0], problems


def test_a_zero_based_type_is_not_said_to_default_to_reduce_zero_label(tmp_path) -> None:
    """mmseg's ``BaseSegDataset`` defaults to ``reduce_zero_label=False``: labels beyond a
    2-class head are refused without the hint meant for the 1-based types (ADE20K)."""
    import inspect

    from mmseg.datasets import BaseSegDataset
    assert inspect.signature(BaseSegDataset).parameters['reduce_zero_label'].default is False
    root = _label_maps(str(tmp_path), [[0, 1, 5]])
    cfg = Config(dict(default_scope='mmseg',
                      model=dict(type='EncoderDecoder', decode_head=_seg_head(2)),
                      train_dataloader=dict(dataset=_seg_dataset(root))))
    problems = cc.label_range_problems(cfg, 'train')
    assert len(problems) == 1, problems
    assert 'in up to 32 sampled maps' in problems[0]
    assert "default is reduce_zero_label=True" not in problems[0]


# ------------------------------------------------------------------------------ pre-flight
def test_syncbn_without_a_launcher_is_one_process() -> None:
    """mmengine's ``Runner`` defaults to ``launcher='none'`` (one process): a config without a
    launcher trains SyncBN heads on one sample per step, as BatchNorm (which torch refuses on
    one value per channel)."""
    import inspect

    from mmengine.runner import Runner
    assert inspect.signature(Runner).parameters['launcher'].default == 'none'
    with pytest.raises(ValueError, match='Expected more than 1 value per channel'):
        torch.nn.BatchNorm2d(2).train()(torch.zeros(1, 2, 1, 1))
    head = _seg_head(2, norm_cfg=dict(type='SyncBN', requires_grad=True))
    cfg = Config(dict(model=dict(type='EncoderDecoder', decode_head=head),
                      train_dataloader=dict(batch_size=1)))
    problem = pf.find_batch_norm_problem(cfg)
    assert problem is not None and 'model.decode_head.norm_cfg=SyncBN' in problem
    assert pf.find_batch_norm_problem(Config(dict(cfg.to_dict(), launcher='pytorch'))) is None


def test_a_config_that_does_not_train_has_no_batch_size_problem() -> None:
    """Without a train loader nothing is trained (mmengine's ``Runner.train`` needs one):
    BatchNorm heads are no problem."""
    cfg = Config(dict(model=dict(type='EncoderDecoder', decode_head=_seg_head(
        2, norm_cfg=dict(type='BN', requires_grad=True)))))
    assert pf.find_batch_norm_problem(cfg) is None
    assert pf.find_batch_norm_problem(Config(dict(cfg.to_dict(), train_dataloader=dict(
        batch_size=1)))) is not None
