"""Config checks over every data set a run reads, not only the training set (a new task
inherited from a shipped config): the validation set's classes and ``reduce_zero_label``, an
image folder's class sub-folders, ignored labels of heads / preprocessor / evaluator,
evaluation settings that stop the first validation, an iteration warm-up longer than an
epoch-based run, and a preprocessor smaller than the crop.  Each of these trained without a
word before (measured: perfect predictions scored 0.00 mIoU; a 1000-way head trained on 2
classes; void pixels scored as a class, 84.31 instead of 100.00 mIoU; peak lr 1.6e-6 of 1e-4).
"""
import logging

import pytest

from mmlinvit.engine.config_consistency import (ConfigConsistencyError,
                                                check_config_consistency,
                                                check_test_config_consistency)
from mmlinvit.engine.launch import build_runner
from mmlinvit.engine.pad_size_check import PadSizeError, find_pad_size_problem

from train_testing import (captured_log, make_image_folder, make_toy_scenes, toy_cls_config,
                           toy_config, with_validation)

pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory) -> str:
    return make_toy_scenes(str(tmp_path_factory.mktemp('toy') / 'toy_ade'))


@pytest.fixture
def warnings_logged():
    with captured_log(logging.WARNING) as messages:
        yield messages


def validated(toy_root, tmp_path):
    return with_validation(toy_config(toy_root, str(tmp_path)), toy_root)


def test_the_validated_toy_recipe_passes(tmp_path, toy_root, warnings_logged):
    check_config_consistency(validated(toy_root, tmp_path))
    assert not [m for m in warnings_logged if m.startswith('Config check')]


def test_validation_set_with_another_reduce_zero_label_is_refused(tmp_path, toy_root):
    """A child re-states the training set (0-based labels: reduce_zero_label=False) and only
    part of the validation set, which keeps the ADE20K base's True."""
    cfg = validated(toy_root, tmp_path)
    train = cfg.train_dataloader.dataset
    n = len(train.metainfo['classes']) + 1  # labels 0..N read as 0-based classes
    train.update(type='BaseSegDataset', reduce_zero_label=False,
                 metainfo=dict(classes=tuple(f'c{i}' for i in range(n))))
    cfg.val_dataloader.dataset.update(type='BaseSegDataset', metainfo=train.metainfo,
                                      reduce_zero_label=True)
    cfg.model.decode_head.num_classes = n
    with pytest.raises(ConfigConsistencyError,
                       match=r'val_dataloader.dataset.reduce_zero_label=True but the training '
                             r'set .*reduce_zero_label=False.*the class below.*Fix: '
                             r'val_dataloader.dataset.reduce_zero_label=False'):
        check_config_consistency(cfg)
    cfg.val_dataloader.dataset.reduce_zero_label = False
    check_config_consistency(cfg)


def test_validation_set_classes_must_be_the_heads(tmp_path, toy_root):
    """A validation set that re-states only data_root keeps the base's type and classes."""
    cfg = validated(toy_root, tmp_path)
    cfg.val_dataloader.dataset.update(type='ADE20KDataset', metainfo=None)  # the base's
    with pytest.raises(ConfigConsistencyError,
                       match=r'val_dataloader.dataset \(type ADE20KDataset\) has 150 classes.*'
                             r'scored over the wrong classes'):
        check_config_consistency(cfg)


def test_image_folder_classes_are_its_sub_folders(tmp_path):
    """mmpretrain's CustomDataset without ann_file takes its classes from the sub-folders:
    a 1000-way ImageNet head on a 2-class folder trained (8 of 8 predictions outside)."""
    data = make_image_folder(str(tmp_path / 'data'))
    cfg = toy_cls_config(data, str(tmp_path / 'wd'))
    check_config_consistency(cfg)
    cfg.model.head.num_classes = 1000
    with pytest.raises(ConfigConsistencyError,
                       match=r'model.head.num_classes=1000, but train_dataloader.dataset .*has 2 '
                             r'classes \(sub-folders of'):
        check_config_consistency(cfg)


def test_ignored_labels_of_preprocessor_heads_and_evaluator(tmp_path, toy_root,
                                                            warnings_logged):
    """ADE-style labels kept as they are (0 = void, a class of its own the heads ignore)."""
    cfg = validated(toy_root, tmp_path)
    train = cfg.train_dataloader.dataset
    n = len(train.metainfo['classes']) + 1
    train.update(type='BaseSegDataset', reduce_zero_label=False,
                 metainfo=dict(classes=('void', ) + tuple(train.metainfo['classes'])))
    cfg.val_dataloader.dataset.update(type='BaseSegDataset', metainfo=train.metainfo,
                                      reduce_zero_label=False)
    cfg.model.decode_head.update(num_classes=n, ignore_index=0)
    with pytest.raises(ConfigConsistencyError,
                       match=r'seg_pad_val=255 is not a label the heads ignore \(ignore_index '
                             r'\[0\]\).*Fix: model.data_preprocessor.seg_pad_val=0'):
        check_config_consistency(cfg)
    cfg.model.data_preprocessor.seg_pad_val = 0
    check_config_consistency(cfg)
    assert any('val_evaluator ignores label(s) [255] but the heads ignore [0]' in m
               and 'val_evaluator.ignore_index=0' in m for m in warnings_logged)
    warnings_logged.clear()
    cfg.val_evaluator.ignore_index = 0
    check_config_consistency(cfg)
    assert not [m for m in warnings_logged if 'ignore' in m]


def test_evaluation_settings_that_stop_the_first_validation(tmp_path, toy_root):
    cfg = validated(toy_root, tmp_path)
    cfg.model.test_cfg = dict(mode='slide', crop_size=(32, 32), stride=(48, 48))
    with pytest.raises(ConfigConsistencyError,
                       match=r'model.test_cfg.stride=\(48, 48\) is larger than its '
                             r'crop_size=\(32, 32\).*stride=\(21, 21\)'):
        check_config_consistency(cfg)
    with pytest.raises(ConfigConsistencyError, match='larger than its crop_size'):
        check_test_config_consistency(cfg)
    data = make_image_folder(str(tmp_path / 'data'))
    cls = toy_cls_config(data, str(tmp_path / 'wd'))
    cls.test_dataloader = cls.train_dataloader
    cls.test_evaluator = dict(type='Accuracy', topk=(1, 5))
    with pytest.raises(ConfigConsistencyError,
                       match=r'test_evaluator.topk=\(1, 5\) but the model has 2 classes.*'
                             r'topk="\(1,\)"'):
        check_test_config_consistency(cls)


def test_iteration_warm_up_longer_than_an_epoch_run_is_warned(tmp_path, warnings_logged):
    """The AdaLA Stage-1 schedule (LinearLR warm-up over 500 iterations in a 4-epoch loop) on
    a small image folder: the lr never reached its peak, and nothing said so."""
    data = make_image_folder(str(tmp_path / 'data'))
    cfg = toy_cls_config(data, str(tmp_path / 'wd'), max_epochs=3)
    cfg.param_scheduler = [
        dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=500),
        dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=3,
             convert_to_iter_based=True)]
    build_runner(cfg)  # the preflight counts the training set
    output = ' '.join('\n'.join(warnings_logged).split())
    assert ('param_scheduler[0] (LinearLR) ends at 500 but max_epochs=3 x 4 iterations per '
            'epoch (8 training samples) = 12 iterations') in output
    assert 'convert_to_iter_based=True' in output


def test_a_preprocessor_smaller_than_the_crop_is_refused(tmp_path, toy_root):
    """mmseg pads batches to size only: crops of images smaller than a larger new crop keep
    their own sizes, and the first such batch stopped with a bare torch.stack message."""
    cfg = toy_config(toy_root, str(tmp_path))
    crop = next(t for t in cfg.train_dataloader.dataset.pipeline if t['type'] == 'RandomCrop')
    size = tuple(cfg.model.data_preprocessor.size)
    crop['crop_size'] = (size[0] + 16, size[1] + 16)
    problem = find_pad_size_problem(cfg)
    assert problem and f'size={size} is smaller than the' in problem
    with pytest.raises(PadSizeError):
        build_runner(cfg)


def test_mask2former_class_weight_given_as_a_tuple_is_checked(tmp_path, toy_root):
    """Only a list was checked: a tuple of the wrong length passed and stopped iteration 1."""
    cfg = toy_config(toy_root, str(tmp_path))
    n = len(cfg.train_dataloader.dataset.metainfo['classes'])
    cfg.model.decode_head = dict(type='Mask2FormerHead', num_classes=n,
                                 loss_cls=dict(class_weight=(1.0, ) * 150 + (0.1, )))
    with pytest.raises(ConfigConsistencyError, match='class_weight has 151 entries'):
        check_config_consistency(cfg)


@pytest.mark.parametrize('dataset_type', ['COCOStuffDataset', 'CityscapesDataset',
                                          'PascalVOCDataset', 'SynapseDataset'])
def test_reduce_zero_label_of_types_that_pass_it_on(tmp_path, toy_root, dataset_type):
    """mmseg types whose ``__init__`` takes ``**kwargs`` and passes ``reduce_zero_label`` on to
    ``BaseSegDataset`` (default False) were skipped by both ``reduce_zero_label`` checks: an
    ADE20K base's True kept on COCO-Stuff / Cityscapes scored perfect predictions 0.00 mIoU
    (right: 100.00), no word, while the same mistake on Pascal Context was warned."""
    from mmlinvit.engine.config_consistency import _reduce_zero_label_default
    assert _reduce_zero_label_default(dict(type=dataset_type))[1] is False
    assert _reduce_zero_label_default(dict(type='ADE20KDataset'))[1] is True
    cfg = validated(toy_root, tmp_path)
    cfg.train_dataloader.dataset.update(type=dataset_type, metainfo=None, reduce_zero_label=False)
    cfg.val_dataloader.dataset.update(type=dataset_type, metainfo=None)  # the base's True kept
    with pytest.raises(ConfigConsistencyError,
                       match=r'val_dataloader.dataset.reduce_zero_label=True but the training '
                             r'set .*reduce_zero_label=False'):
        check_config_consistency(cfg)


@pytest.mark.parametrize('dataset_type,num_classes', [('COCOStuffDataset', 171),
                                                      ('CityscapesDataset', 19)])
def test_kept_ade20k_reduce_zero_label_on_0_based_types_is_warned(tmp_path, toy_root,
                                                                  warnings_logged, dataset_type,
                                                                  num_classes):
    cfg = validated(toy_root, tmp_path)
    for loader in (cfg.train_dataloader, cfg.val_dataloader):
        loader.dataset.update(type=dataset_type, metainfo=None, img_suffix='.jpg',
                              seg_map_suffix='.png')  # the ADE20K base's True kept
    cfg.model.decode_head.num_classes = num_classes
    check_config_consistency(cfg)
    text = '\n'.join(warnings_logged)
    assert f'train_dataloader.dataset.reduce_zero_label=True on a {dataset_type}' in text
    assert 'need train_dataloader.dataset.reduce_zero_label=False' in text


def _label_maps(root, maps) -> str:
    import os

    import numpy as np
    from PIL import Image
    folder = os.path.join(root, 'annotations', 'training')
    os.makedirs(folder)
    os.makedirs(os.path.join(root, 'images', 'training'))  # the data set needs it to build
    for i, values in enumerate(maps):
        label = np.zeros((8, 8), np.uint8)
        label.flat[:len(values)] = values
        Image.fromarray(label).save(os.path.join(folder, f'{i:03d}.png'))
    return root


@pytest.mark.parametrize('rare_last_class', [True, False])
def test_a_rare_last_class_is_not_read_as_0_based_labels(tmp_path, toy_root, warnings_logged,
                                                         rare_last_class):
    """ADE20K-convention data (0 unlabelled, classes 1..7) whose class 7 occurs only in the
    40th of 40 maps was warned as 0-based after the first 32 maps, with
    reduce_zero_label=False as the fix, which shifts every label; 0-based data (0..6) still
    is."""
    maps = [[0, 1, 2, 3, 4, 5, 6]] * 39 + [[7 if rare_last_class else 6]]
    root = _label_maps(str(tmp_path / 'data'), maps)
    cfg = toy_config(toy_root, str(tmp_path / 'wd'))
    cfg.train_dataloader.dataset.update(data_root=root, reduce_zero_label=True)
    cfg.train_dataloader.dataset.metainfo = dict(classes=tuple(f'c{i}' for i in range(7)))
    cfg.model.decode_head.num_classes = 7
    check_config_consistency(cfg)
    warned = [m for m in warnings_logged if 'reduce_zero_label=True on a BaseSegDataset' in m]
    assert bool(warned) is not rare_last_class


def test_reduce_zero_label_false_on_a_1_based_type_reads_more_maps(tmp_path, toy_root):
    """ADE20K / Pascal Context 59 label maps (0 unlabelled, classes 1..N) read with
    ``reduce_zero_label=False`` (the README's custom-data example copied with only the type
    changed): when label N was absent from the first 32 maps nothing fired, and Mask2Former
    trained label N silently as its no-object class (perfect predictions: 0.90 mIoU).  A
    setting against the type's default is checked on up to 512 maps."""
    maps = [list(range(0, 150, 3))] * 39 + [[150]]  # label 150 only in the 40th map
    root = _label_maps(str(tmp_path / 'data'), maps)
    cfg = toy_config(toy_root, str(tmp_path / 'wd'))
    cfg.train_dataloader.dataset.update(type='ADE20KDataset', data_root=root,
                                        reduce_zero_label=False)
    cfg.train_dataloader.dataset.metainfo = None
    cfg.model.decode_head.num_classes = 150
    with pytest.raises(ConfigConsistencyError,
                       match=r'(?s)label\(s\) \[150\] \(in up to 512 sampled maps\).*no-object.*'
                             r'ADE20KDataset\'s default is reduce_zero_label=True'):
        check_config_consistency(cfg)
    cfg.train_dataloader.dataset.reduce_zero_label = True  # the type's default: right
    check_config_consistency(cfg)
