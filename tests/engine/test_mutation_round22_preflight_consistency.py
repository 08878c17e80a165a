"""Pre-flight and config-consistency checks (mutation round 22): branches of
:mod:`mmlinvit.engine.preflight` and :mod:`mmlinvit.engine.config_consistency` that every
earlier test let a single-line change pass.  Each test below failed on at least one such
change.

Guarded here, each against the library that runs the config (mmengine's ``BaseModule``
initialisers, mmseg's ``CityscapesDataset`` signature, mmengine's ``ConcatDataset``) or a
value worked out by hand:

* ``clear_checkpoints`` keeps the other initialisers of an ``init_cfg`` list (mmengine's
  ``Constant`` init still runs after the ``Pretrained`` entry is dropped);
* the Cityscapes suffix message gives mmseg's own default ``seg_map_suffix`` as the one to
  keep;
* a ``teacher`` entry of a distillation model hides only the teacher from the batch-norm
  check, not the student configured after it;
* ``--check-data`` and the missing-input check go on after a data set they have already
  seen (a validation ``ConcatDataset`` that repeats the training set);
* a teacher configured before the student (as the distillation bases do) hides only itself
  from the head-class count and the slide-window check;
* label maps: a map PIL cannot decode does not end the sampling (mmseg's ``LoadAnnotations``
  reads the next one), and the 1-based hint names label 0 as the unlabelled one;
* the training top-k fix keeps every k mmpretrain's ``LinearClsHead`` can compute;
* the crop-size warning's explanation, checked with mmengine's ``Config.fromfile`` on a base
  and a child; the epoch-loop estimate with an empty ``WORLD_SIZE`` and torch's
  ``drop_last=False`` default;
* a train loader without a data set is left to mmengine's ``Runner.build_dataloader``.

Finding (fixed in round 22; the test failed on the code before it): the batch-norm check
matched only the bare names ('BN', 'SyncBN', ...), so a head whose ``norm_cfg`` names
BatchNorm by class (pure-Python configs: ``nn.BatchNorm2d``, ``nn.SyncBatchNorm``) or by a
scoped name (``'mmseg.BN'``) trained at batch size 1 into torch's "Expected more than 1
value per channel" at the first iteration; mmcv's ``build_norm_layer`` is the oracle.
"""
import copy
import inspect
import os
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from mmlinvit.datasets import make_ade20k_layout
from mmlinvit.engine import config_consistency as cc
from mmlinvit.engine import preflight as pf

from checkpoint_damage import truncate_to_half
from test_mutation_round11_config_consistency import _load_annotations
from test_mutation_round16_config_consistency import _label_maps

pytestmark = pytest.mark.usefixtures('one_thread', 'no_new_global_loggers')



# ------------------------------------------------------------------ clear_checkpoints
def test_clearing_a_pretrained_entry_keeps_the_other_initialisers_of_the_list() -> None:
    """``init_cfg=[Constant, Pretrained]``: only the ``Pretrained`` entry goes; mmengine's
    ``init_weights`` then still applies the ``Constant`` init (0.5 in every Linear weight)."""
    from mmengine.model import BaseModule

    constant = dict(type='Constant', val=0.5, layer='Linear')
    model = dict(teacher=dict(init_cfg=[copy.deepcopy(constant),
                                        dict(type='Pretrained', checkpoint='x.pth')]))
    assert pf.clear_checkpoints(model) == ['model.teacher.init_cfg[1]']
    assert model['teacher']['init_cfg'] == [constant]

    class Tiny(BaseModule):

        def __init__(self) -> None:
            super().__init__(model['teacher']['init_cfg'])
            self.fc = torch.nn.Linear(3, 2)

    tiny = Tiny()
    tiny.init_weights()
    assert torch.equal(tiny.fc.weight, torch.full((2, 3), 0.5))


# ------------------------------------------------------------------------- Cityscapes
def test_the_cityscapes_suffix_message_gives_mmsegs_default_suffix(tmp_path) -> None:
    from mmseg.datasets import CityscapesDataset
    default = inspect.signature(CityscapesDataset.__init__).parameters['seg_map_suffix'].default
    problem = pf._cityscapes_suffix_problem(
        dict(type='CityscapesDataset', seg_map_suffix='_gtFine_labelIds.png'),
        'train_dataloader.dataset')
    assert f"Fix: drop seg_map_suffix (mmseg's default is {default!r})" in problem


# ------------------------------------------------------------------- batch-norm heads
def test_a_teacher_before_the_student_hides_only_the_teacher_from_the_batch_norm_check(
) -> None:
    """The distillation bases (``linearizer_clip-b16.py``) configure ``teacher`` before the
    child's ``student``: the student's BatchNorm head still trains on one sample (torch
    refuses one value per channel), the frozen teacher's runs in eval mode."""
    with pytest.raises(ValueError, match='Expected more than 1 value per channel'):
        torch.nn.BatchNorm2d(2).train()(torch.zeros(1, 2, 1, 1))
    bn = dict(type='BN', requires_grad=True)
    head = dict(type='FCNHead', in_channels=4, channels=4, num_classes=2, norm_cfg=bn)
    cfg = Config(dict(model=dict(type='mmlinvit.DistillationModel',
                                 teacher=dict(type='EncoderDecoder', decode_head=head),
                                 student=dict(type='EncoderDecoder', decode_head=head)),
                      train_dataloader=dict(batch_size=1)))
    assert list(cfg.model) == ['type', 'teacher', 'student']
    problem = pf.find_batch_norm_problem(cfg)
    assert problem is not None
    assert '(model.student.decode_head.norm_cfg=BN)' in problem and 'teacher' not in problem


# ------------------------------------------------------------------------ check-data
def test_check_data_decodes_the_data_sets_after_one_already_decoded(tmp_path) -> None:
    """A validation ``ConcatDataset`` (mmengine's) of the training set and the validation
    split: the training set is decoded once, the validation split after it still is, and
    its truncated image stops the run (5 + 3 samples)."""
    from mmengine.dataset import ConcatDataset  # noqa: F401 - the wrapper the config names
    root = str(tmp_path / 'ade')
    make_ade20k_layout(root, num_train=5, num_val=3, size=(16, 16), seed=0)

    def ade(split: str) -> dict:
        return dict(type='ADE20KDataset', data_root=root, pipeline=[],
                    data_prefix=dict(img_path=f'images/{split}',
                                     seg_map_path=f'annotations/{split}'))

    folder = osp.join(root, 'images', 'validation')
    bad = osp.join(folder, sorted(os.listdir(folder))[-1])
    truncate_to_half(bad)
    cfg = Config(dict(default_scope='mmseg', val_cfg=dict(),
                      train_dataloader=dict(num_workers=0, dataset=ade('training')),
                      val_dataloader=dict(num_workers=0, dataset=dict(
                          type='ConcatDataset',
                          datasets=[ade('training'), ade('validation')]))))
    with pytest.raises(pf.DataCheckError) as exc:
        pf.check_data(cfg, num_threads=1)
    assert '1 bad file(s) among 8 samples' in str(exc.value)
    assert f'{bad}: ' in str(exc.value)


# ------------------------------------------------------------------- missing inputs
def test_data_sets_after_one_already_checked_are_checked(tmp_path) -> None:
    """The same validation ``ConcatDataset`` for the missing-path check: after the training
    set (checked already), a second member whose data root does not exist is named."""
    root = str(tmp_path / 'ade')
    make_ade20k_layout(root, num_train=2, num_val=1, size=(16, 16), seed=0)
    missing = str(tmp_path / 'nowhere')

    def ade(data_root: str) -> dict:
        return dict(type='ADE20KDataset', data_root=data_root, pipeline=[],
                    data_prefix=dict(img_path='images/training',
                                     seg_map_path='annotations/training'))

    cfg = Config(dict(default_scope='mmseg', val_cfg=dict(),
                      train_dataloader=dict(dataset=ade(root)),
                      val_dataloader=dict(dataset=dict(type='ConcatDataset',
                                                       datasets=[ade(root), ade(missing)]))))
    problems = pf.find_missing_inputs(cfg)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"data root {missing!r} "
                                  '(val_dataloader.dataset.datasets[1].data_root')


# ------------------------------------------------------------ config consistency: heads
def test_a_teacher_before_the_student_hides_only_the_teacher_from_the_class_count() -> None:
    """A 150-way ADE20K teacher configured before a 21-way student: the student head is
    still compared with the data set (mmseg's ``ADE20KDataset`` has 150 classes)."""
    from mmseg.datasets import ADE20KDataset
    ade_classes = len(ADE20KDataset.METAINFO['classes'])

    def segmentor(num_classes: int) -> dict:
        return dict(type='EncoderDecoder', decode_head=dict(
            type='FCNHead', in_channels=4, channels=4, num_classes=num_classes))

    cfg = Config(dict(
        model=dict(type='mmlinvit.DistillationModel', teacher=segmentor(ade_classes),
                   student=segmentor(21)),
        train_dataloader=dict(batch_size=2, dataset=dict(
            type='ADE20KDataset', data_root='data/ade', pipeline=[]))))
    problems = cc._class_count_problems(cfg)
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        f'model.student.decode_head.num_classes=21, but train_dataloader.dataset (type '
        f'ADE20KDataset) has {ade_classes} classes')


def test_a_loader_without_a_data_set_is_left_to_mmengine() -> None:
    """A train loader that names no data set (mmengine's ``Runner.build_dataloader`` stops on
    it with its own message) is no data set to check, not a crash of the check."""
    from mmengine.runner import Runner
    with pytest.raises(KeyError):
        Runner.build_dataloader(dict(batch_size=2, sampler=dict(type='DefaultSampler')))
    cfg = Config(dict(model=dict(type='EncoderDecoder', data_preprocessor=dict(
        type='SegDataPreProcessor', bgr_to_rgb=True)), train_dataloader=dict(batch_size=2)))
    assert list(pf._iter_datasets(cfg.train_dataloader.get('dataset'), 'x')) == []
    cc.check_config_consistency(cfg)



def test_the_slide_check_goes_on_after_a_slide_setting_without_a_stride() -> None:
    """A teacher configured first with ``mode='slide'`` and no stride (its test settings are
    never run) does not end the check: the student's stride 400 over a 300 crop (mmseg
    leaves pixels uncovered and stops) is still refused."""
    cfg = Config(dict(
        val_cfg=dict(), val_dataloader=dict(batch_size=1),
        model=dict(type='mmlinvit.DistillationModel',
                   teacher=dict(type='EncoderDecoder', test_cfg=dict(mode='slide',
                                                                     crop_size=(300, 300))),
                   student=dict(type='EncoderDecoder', test_cfg=dict(
                       mode='slide', crop_size=(300, 300), stride=(400, 400))))))
    problems = cc._evaluation_problems(cfg, 'train')
    assert len(problems) == 1, problems
    assert problems[0].startswith('model.student.test_cfg.stride=(400, 400) is larger than '
                                  'its crop_size=(300, 300)')


# ------------------------------------------------------------------------- label maps
def test_the_1_based_hint_says_label_0_is_the_unlabelled_one(tmp_path) -> None:
    """ADE20K maps read with ``reduce_zero_label=False``: the hint names label 0 as the
    unlabelled one and the classes 1..N, as mmseg's ``LoadAnnotations`` reads them with the
    type's default (0 -> 255 ignored, 150 -> class 149)."""
    root = _label_maps(str(tmp_path), [[0, 1, 150]])
    loaded = _load_annotations(osp.join(root, 'ann', 'train', '000.png'), True)
    assert set(loaded.flat[:3]) == {255, 0, 149}
    dataset = dict(type='ADE20KDataset', data_root=root, pipeline=[], img_suffix='.png',
                   reduce_zero_label=False,
                   data_prefix=dict(img_path='img/train', seg_map_path='ann/train'))
    cfg = Config(dict(default_scope='mmseg', train_dataloader=dict(dataset=dataset),
                      model=dict(type='EncoderDecoder', decode_head=dict(
                          type='FCNHead', in_channels=4, channels=4, num_classes=150))))
    problems = cc.label_range_problems(cfg, 'train')
    assert len(problems) == 1, problems
    assert ("ADE20KDataset's default is reduce_zero_label=True (label 0 unlabelled, classes "
            '1..150), which train_dataloader.dataset.reduce_zero_label=False turns off: set '
            'it to True') in problems[0]


def test_label_maps_after_an_unreadable_one_are_still_read(tmp_path) -> None:
    """The first map is truncated (PIL cannot decode it; --check-data reports it): the
    label 5 of the next map, which mmseg's ``LoadAnnotations`` hands a 2-class head, is still
    found."""
    from PIL import Image
    root = _label_maps(str(tmp_path), [[0, 1], [0, 1, 5]])
    bad = osp.join(root, 'ann', 'train', '000.png')
    truncate_to_half(bad)
    with pytest.raises(OSError):
        with Image.open(bad) as image:
            image.load()
    assert 5 in _load_annotations(osp.join(root, 'ann', 'train', '001.png'), False)
    dataset = dict(type='BaseSegDataset', data_root=root, pipeline=[], img_suffix='.png',
                   seg_map_suffix='.png', metainfo=dict(classes=('a', 'b')),
                   data_prefix=dict(img_path='img/train', seg_map_path='ann/train'))
    cfg = Config(dict(default_scope='mmseg', train_dataloader=dict(dataset=dataset),
                      model=dict(type='EncoderDecoder', decode_head=dict(
                          type='FCNHead', in_channels=4, channels=4, num_classes=2))))
    problems = cc.label_range_problems(cfg, 'train')
    assert len(problems) == 1 and 'hold label(s) [5]' in problems[0], problems


# --------------------------------------------------------------- training accuracy top-k
@pytest.mark.parametrize('topk, fix', [((1, 3, 5), (1, 3)), ((5, ), (1, ))])
def test_the_training_top_k_fix_keeps_every_k_the_head_can_compute(topk, fix) -> None:
    """A 3-way head with ``cal_acc=True``: the suggested top-k keeps each k up to 3 (top-3 of
    3 classes is defined) and falls back to top-1; mmpretrain's ``LinearClsHead`` computes
    its training accuracy with the fix and raises with the configured top-k."""
    from mmpretrain.models.heads import LinearClsHead
    from mmpretrain.structures import DataSample
    samples = [DataSample().set_gt_label(1), DataSample().set_gt_label(2)]
    features = (torch.randn(2, 8), )
    with pytest.raises(ValueError, match='Top-5 accuracy is unavailable'):
        LinearClsHead(num_classes=3, in_channels=8, cal_acc=True, topk=topk).loss(
            features, samples)
    losses = LinearClsHead(num_classes=3, in_channels=8, cal_acc=True, topk=fix).loss(
        features, samples)
    assert sorted(k for k in losses if k.startswith('accuracy')) == \
        sorted(f'accuracy_top-{k}' for k in fix)
    cfg = Config(dict(model=dict(type='ImageClassifier', head=dict(
        type='LinearClsHead', num_classes=3, in_channels=8, cal_acc=True, topk=topk))))
    problems = cc._training_accuracy_problems(cfg)
    assert len(problems) == 1, problems
    assert f'model.head.topk="{fix}"' in problems[0]


# ----------------------------------------------------------------------------- warnings
def test_the_crop_size_warning_says_a_childs_crop_size_changes_nothing(tmp_path) -> None:
    """mmengine's ``Config.fromfile``: a child that sets ``crop_size`` keeps the base's
    RandomCrop, which was evaluated with the base's variable; the warning says so."""
    (tmp_path / 'base.py').write_text(
        'crop_size = (64, 64)\n'
        "train_dataloader = dict(dataset=dict(type='ADE20KDataset', data_root='data/ade', "
        "pipeline=[dict(type='RandomCrop', crop_size=crop_size)]))\n")
    (tmp_path / 'child.py').write_text("_base_ = './base.py'\ncrop_size = (32, 32)\n")
    cfg = Config.fromfile(str(tmp_path / 'child.py'))
    assert tuple(cfg.crop_size) == (32, 32)
    assert tuple(cfg.train_dataloader.dataset.pipeline[0].crop_size) == (64, 64)
    warning = cc._crop_size_warning(cfg)
    assert warning is not None and warning.startswith(
        'the top-level crop_size=(32, 32) is not the training crop (train_dataloader.dataset'
        ".pipeline[0].crop_size=(64, 64)). A base's variable is evaluated in the base: "
        'setting crop_size in a child changes nothing.')


def test_an_empty_world_size_is_one_process(monkeypatch) -> None:
    """``WORLD_SIZE=''`` (set but empty) counts as one process, as without the variable:
    10 samples in batches of 3 are 4 iterations per epoch (mmengine's ``DefaultSampler`` on
    one process keeps all 10; torch's ``DataLoader`` keeps the last, short batch unless
    ``drop_last`` is given)."""
    from mmengine.dataset import DefaultSampler
    from torch.utils.data import DataLoader
    sampler = DefaultSampler(list(range(10)), shuffle=False, seed=0)
    assert len(sampler) == 10
    assert len(DataLoader(list(range(10)), batch_size=3, sampler=sampler)) == 4
    cfg = Config(dict(train_cfg=dict(max_epochs=2), train_dataloader=dict(batch_size=3)))
    monkeypatch.delenv('WORLD_SIZE', raising=False)
    assert cc._epoch_loop_iterations(cfg, 10) == 2 * 4
    monkeypatch.setenv('WORLD_SIZE', '')
    assert cc._epoch_loop_iterations(cfg, 10) == 2 * 4


def test_an_epoch_scheduler_after_an_iteration_warm_up_is_compared_with_max_epochs() -> None:
    """An iteration-unit warm-up first, then a cosine schedule in epochs that ends at epoch
    300 of a 100-epoch run: the second scheduler is still compared with ``max_epochs``."""
    cfg = Config(dict(
        train_cfg=dict(type='EpochBasedTrainLoop', max_epochs=100),
        param_scheduler=[dict(type='LinearLR', by_epoch=False, begin=0, end=50),
                         dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=300)]))
    warnings = cc._schedule_warnings(cfg)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith('param_scheduler[1] (CosineAnnealingLR) ends at 300 but '
                                  'train_cfg.max_epochs=100: the run stops before its '
                                  'schedule does')


def test_every_task_head_is_checked_after_one_with_an_int_top_k() -> None:
    """mmpretrain's ``MultiTaskHead``: the first task head's int top-k (a TypeError in
    ``Accuracy.calculate``) does not end the check; the second head's top-5 of 3 classes is
    named too."""
    task = dict(type='LinearClsHead', num_classes=3, in_channels=8, cal_acc=True)
    cfg = Config(dict(model=dict(type='ImageClassifier', head=dict(
        type='MultiTaskHead', task_heads=dict(a=dict(task, topk=1), b=dict(task, topk=(1, 5)))))))
    problems = cc._training_accuracy_problems(cfg)
    assert len(problems) == 2, problems
    assert problems[0].startswith('model.head.task_heads.a.topk=1 with cal_acc=True')
    assert problems[1].startswith('model.head.task_heads.b.topk=(1, 5) with cal_acc=True but '
                                  'the head has 3 classes')


# ------------------------------------------- batch-norm heads given by class or scoped name
@pytest.mark.parametrize('norm_type', ['mmseg.BN', torch.nn.BatchNorm2d, torch.nn.SyncBatchNorm])
def test_batch_norm_given_by_class_or_scoped_name_is_refused_at_batch_size_one(norm_type):
    """A pure-Python config gives ``norm_cfg`` its class, an inherited one may scope the name:
    mmcv's ``build_norm_layer`` builds BatchNorm from each (SyncBN reverted to BatchNorm by
    mmengine in a one-process run), which torch refuses to train on one value per channel.
    Before: only the bare names ('BN', 'SyncBN', ...) were matched, and these trained into
    the error at the first iteration."""
    from mmcv.cnn import build_norm_layer
    from mmengine.model import revert_sync_batchnorm
    layer = revert_sync_batchnorm(build_norm_layer(dict(type=norm_type), 2)[1])
    assert isinstance(layer, torch.nn.modules.batchnorm._BatchNorm)
    with pytest.raises(ValueError, match='Expected more than 1 value per channel'):
        layer.train()(torch.zeros(1, 2, 1, 1))
    head = dict(type='FCNHead', in_channels=4, channels=4, num_classes=2,
                norm_cfg=dict(type=norm_type, requires_grad=True))
    cfg = Config(dict(model=dict(type='EncoderDecoder', decode_head=head),
                      train_dataloader=dict(batch_size=1)))
    problem = pf.find_batch_norm_problem(cfg)
    name = norm_type if isinstance(norm_type, type) else 'BN'
    assert problem is not None, norm_type
    assert f'(model.decode_head.norm_cfg={getattr(name, "__name__", name)})' in problem
    distributed = pf.find_batch_norm_problem(Config(dict(cfg.to_dict(), launcher='pytorch')))
    assert (distributed is None) is (norm_type is torch.nn.SyncBatchNorm)
