"""Pre-flight (mutation round 13): the input, batch-norm and pad-size checks of
:mod:`mmlinvit.engine.preflight` / :mod:`mmlinvit.engine.pad_size_check` on branches that no
other test reached.  Each test below failed on at least one single-line change of the module
that the rest of the suite let pass.

Guarded here, each against mmengine / mmseg / mmpretrain run in the test or a hand-written
expectation:

* which dataset configs are checked: only the modes 'train' / 'test', the dataset inside a
  RepeatDataset, a dataset given by an absolute ``data_prefix`` alone, a dataset read by two
  loaders (keys in another order, another pipeline) counted once, datasets without a
  ``data_root`` each checked, a file given as ``data_root``, the image counts (``sizes``) and
  their log lines;
* where advice comes from: ``missing_path_hints`` at a path's own location beats the
  dataset's, a dataset's covers all its paths, scoped dataset types get their
  :data:`DATASET_HINTS`, checkpoint locations take their hints, and an empty image folder
  says how to get the data while a partly filled one does not;
* the locations printed for ``data_prefix`` strings and dict keys;
* Cityscapes: a non-train-id suffix is named even when the data root is missing, once; label
  folders reached through a symbolic link count (mmseg's listing follows them); a label-map
  suffix is looked for in the label folder only;
* checkpoints inside lists (``auxiliary_head`` lists), ``pretrained=''`` (no file, as the
  backbone reads it), the default and empty locations of :func:`clear_checkpoints`, and
  ``_type_scope`` against mmengine's ``Registry.split_scope_key``;
* batch-norm heads: a list of auxiliary heads, the batch size that trains (2, with mmseg's
  PSPHead run here), the shown-locations limit, the SyncBN advice;
* ``check_config_consistency = False`` in training, the counted training set passed on to the
  schedule warning, ``check_data``'s default thread count;
* pad size: every dataset of a ConcatDataset and every crop of a pipeline, a crop transform
  without its size argument.

Findings (fixed in round 13; each test below failed on the code before it):

* ``find_pad_size_problem`` ignores a top-level ``data_preprocessor``, which mmengine's
  ``Runner`` merges into a model config that has none: crops padded 64x pass.
* ``find_batch_norm_problem`` ignores a train loader without ``batch_size``, which mmengine
  builds with torch's default batch size of 1.
* ``find_batch_norm_problem`` does not look at an mmpretrain classifier's ``head``, whose
  BatchNorm fails on one sample the same way (``StackedLinearClsHead`` run here).
* ``clear_checkpoints`` leaves ``dict(type='Pretrained', checkpoint=None)`` inside an
  ``init_cfg`` list (and a scoped ``'mmengine.Pretrained'``), on which mmengine's
  ``init_weights`` (called at build time for a distillation teacher) fails with
  "expected string or bytes-like object".
"""
import copy
import logging
import os
import os.path as osp
import sys
from typing import Dict, List

import pytest
import torch
from mmengine.config import Config

from mmlinvit.datasets import make_ade20k_layout, make_cityscapes_layout
from mmlinvit.engine import preflight
from mmlinvit.engine.pad_size_check import find_pad_size_problem
from mmlinvit.engine.preflight import (DATASET_HINTS, check_inputs, clear_checkpoints,
                                       find_batch_norm_problem, find_missing_inputs)

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from train_testing import captured_log  # noqa: E402

BN = dict(type='BN', requires_grad=True)


@pytest.fixture()
def ade(tmp_path) -> str:
    root = str(tmp_path / 'ADEChallengeData2016')
    make_ade20k_layout(root, num_train=6, num_val=2, size=(32, 32), seed=0)
    return root


def _ade_dataset(root: str, **kwargs) -> dict:
    return dict(type='ADE20KDataset', data_root=root, pipeline=[],
                data_prefix=dict(img_path='images/training',
                                 seg_map_path='annotations/training'), **kwargs)


def _seg_cfg(dataset: dict, **kwargs) -> Config:
    base = dict(default_scope='mmseg', train_dataloader=dict(batch_size=2, dataset=dataset),
                model=dict())
    return Config(dict(base, **kwargs))


def _mmseg_len(dataset: dict) -> int:
    """How many samples mmseg's own dataset class lists for ``dataset``."""
    from mmengine.registry import DefaultScope
    from mmseg.registry import DATASETS
    with DefaultScope.overwrite_default_scope('mmseg'):
        return len(DATASETS.build(copy.deepcopy(dataset)))


# ------------------------------------------------------------- which datasets are checked
def test_a_dataset_given_by_an_absolute_data_prefix_alone_is_checked(tmp_path):
    """mmpretrain's CustomDataset reads ``data_prefix`` without any ``data_root``; a missing
    folder there fails mmpretrain and must be named."""
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import DATASETS
    folder = str(tmp_path / 'no_such_images')
    dataset = dict(type='CustomDataset', data_prefix=folder, with_label=False, pipeline=[])
    with DefaultScope.overwrite_default_scope('mmpretrain'), pytest.raises(Exception):
        DATASETS.build(copy.deepcopy(dataset))  # the reference: mmpretrain cannot list it
    cfg = Config(dict(default_scope='mmpretrain',
                      train_dataloader=dict(batch_size=2, dataset=dataset)))
    problems = find_missing_inputs(cfg)
    assert len(problems) == 1 and f'data_prefix folder {folder!r}' in problems[0], problems


def test_a_dataset_of_two_loaders_is_counted_once_whatever_its_key_order(ade):
    """The same dataset written with its keys in another order and another pipeline lists the
    same files (mmseg gives both the same length): it is counted once, as
    ``test_dataloader = val_dataloader``."""
    train = _ade_dataset(ade)
    val = dict(reversed(list(copy.deepcopy(train).items())))
    val['pipeline'] = [dict(type='LoadImageFromFile')]  # another pipeline, the same files
    assert list(val) != list(train) and _mmseg_len(val) == _mmseg_len(train) == 6
    cfg = _seg_cfg(train, val_cfg=dict(), val_dataloader=dict(batch_size=1, dataset=val))
    counts: List[str] = []
    assert find_missing_inputs(cfg, counts=counts) == []
    assert counts == ['train_dataloader.dataset: 6 images, 6 label maps']


@pytest.mark.parametrize('mode', ['val', 'Train', ''])
def test_an_unknown_mode_is_refused(mode: str):
    """Only 'train' and 'test' say which loaders a run reads; another word must not fall
    back to the test loader."""
    with pytest.raises(ValueError, match="mode must be 'train' or 'test'"):
        find_missing_inputs(dict(model=dict()), mode=mode)


def test_the_dataset_inside_a_repeat_dataset_is_checked(tmp_path):
    """mmengine's RepeatDataset / ClassBalancedDataset wrap one ``dataset``."""
    root = str(tmp_path / 'missing')
    cfg = _seg_cfg(dict(type='RepeatDataset', times=2, dataset=_ade_dataset(root)))
    problems = find_missing_inputs(cfg)
    assert len(problems) == 1, problems
    assert f'data root {root!r} (train_dataloader.dataset.dataset.data_root' in problems[0]


def test_type_scope_splits_as_mmengines_registry():
    from mmengine.registry import Registry
    for name in ('UPerHead', 'mmseg.UPerHead', 'mmlinvit.DistillationModel'):
        assert preflight._type_scope(name) == Registry.split_scope_key(name)[0]
    assert preflight._type_scope(None) is None


def test_datasets_without_a_data_root_are_each_checked(tmp_path):
    """No ``data_root`` is not a missing root: the absolute folders of both loaders are named."""
    def dataset(name: str) -> dict:
        return dict(type='CustomDataset', data_prefix=dict(img_path=str(tmp_path / name)),
                    with_label=False, pipeline=[])
    cfg = Config(dict(default_scope='mmpretrain', val_cfg=dict(),
                      train_dataloader=dict(batch_size=2, dataset=dataset('train_imgs')),
                      val_dataloader=dict(batch_size=2, dataset=dataset('val_imgs'))))
    problems = find_missing_inputs(cfg)
    assert len(problems) == 2, problems
    assert 'train_imgs' in problems[0] and 'val_imgs' in problems[1], problems


def test_a_file_given_as_data_root_is_a_missing_root(tmp_path):
    root = tmp_path / 'ade.zip'
    root.write_bytes(b'PK')  # the archive, not the unzipped folder
    problems = find_missing_inputs(_seg_cfg(_ade_dataset(str(root))))
    assert len(problems) == 1 and f"data root {str(root)!r}" in problems[0], problems
    assert 'ADEChallengeData2016.zip' in problems[0]


def test_image_counts_are_returned_and_logged(ade):
    """``sizes`` holds the number of images mmseg lists, and each count line is logged."""
    dataset = _ade_dataset(ade)
    val = dict(_ade_dataset(ade), data_prefix=dict(img_path='images/validation',
                                                   seg_map_path='annotations/validation'))
    cfg = _seg_cfg(dataset, val_cfg=dict(), val_dataloader=dict(batch_size=1, dataset=val))
    sizes: Dict[str, int] = {}
    assert find_missing_inputs(cfg, sizes=sizes) == []
    assert sizes == {'train_dataloader.dataset': _mmseg_len(dataset),
                     'val_dataloader.dataset': _mmseg_len(val)} == {
        'train_dataloader.dataset': 6, 'val_dataloader.dataset': 2}
    with captured_log(logging.INFO) as messages:
        check_inputs(Config(dict(cfg.to_dict(), check_config_consistency=False)))
    assert 'Data check: train_dataloader.dataset: 6 images, 6 label maps' in messages
    assert 'Data check: val_dataloader.dataset: 2 images, 2 label maps' in messages


# ---------------------------------------------------------------------------------- advice
def test_hints_at_a_path_beat_the_datasets_and_a_datasets_hint_covers_its_paths(tmp_path):
    """The module docstring: keys are the printed locations, and a dataset's location covers
    all of its paths."""
    root = str(tmp_path / 'missing')
    both = dict(missing_path_hints={'train_dataloader.dataset.data_root': 'ROOT ADVICE',
                                    'train_dataloader.dataset': 'DATASET ADVICE'})
    problems = find_missing_inputs(_seg_cfg(_ade_dataset(root), **both))
    assert len(problems) == 1 and 'How to get it: ROOT ADVICE' in problems[0], problems
    dataset_only = dict(missing_path_hints={'train_dataloader.dataset': 'DATASET ADVICE'})
    problems = find_missing_inputs(_seg_cfg(_ade_dataset(root), **dataset_only))
    assert len(problems) == 1 and 'How to get it: DATASET ADVICE' in problems[0], problems


def test_a_scoped_dataset_type_gets_its_download_hint(tmp_path):
    dataset = dict(_ade_dataset(str(tmp_path / 'missing')), type='mmseg.ADE20KDataset')
    problems = find_missing_inputs(_seg_cfg(dataset))
    assert len(problems) == 1 and DATASET_HINTS['ADE20KDataset'] in problems[0], problems


def test_a_checkpoint_hint_is_given_at_its_location(tmp_path):
    path = str(tmp_path / 'student_backbone.pth')
    cfg = dict(model=dict(backbone=dict(pretrained=path)),
               missing_path_hints={'model.backbone.pretrained': 'Run AdaLA Stage 2 first'})
    problems = find_missing_inputs(cfg)
    assert len(problems) == 1 and 'How to get it: Run AdaLA Stage 2 first' in problems[0]


def test_an_empty_image_folder_says_how_to_get_the_data_and_a_partial_one_does_not(ade):
    img_dir = osp.join(ade, 'images', 'training')
    names = sorted(os.listdir(img_dir))
    for name in names[1:]:
        os.remove(osp.join(img_dir, name))
    os.remove(osp.join(ade, 'annotations', 'training', names[0].replace('.jpg', '.png')))
    # one image without its label map: the data exist, no download advice
    problems = find_missing_inputs(_seg_cfg(_ade_dataset(ade)))
    assert len(problems) == 1 and '1 of 1 images' in problems[0], problems
    assert 'How to get it' not in problems[0], problems
    os.remove(osp.join(img_dir, names[0]))
    problems = find_missing_inputs(_seg_cfg(_ade_dataset(ade)))
    assert len(problems) == 1 and 'no images *.jpg' in problems[0], problems
    assert f"How to get it: {DATASET_HINTS['ADE20KDataset']}" in problems[0], problems


# ------------------------------------------------------------------------------- locations
def test_locations_of_data_prefix_strings_and_keys(tmp_path):
    (tmp_path / 'root').mkdir()
    root = str(tmp_path / 'root')
    cls = Config(dict(default_scope='mmpretrain', train_dataloader=dict(batch_size=2, dataset=dict(
        type='CustomDataset', data_root=root, data_prefix='train', pipeline=[]))))
    problems = find_missing_inputs(cls)
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        f"data_prefix folder {osp.join(root, 'train')!r} (train_dataloader.dataset.data_prefix)"
        ' does not exist'), problems
    seg = _seg_cfg(dict(_ade_dataset(root), data_prefix=dict(img_path='imgs')),
                   missing_path_hints={'train_dataloader.dataset.data_prefix.img_path': 'IMGS'})
    problems = find_missing_inputs(seg)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"img_path folder {osp.join(root, 'imgs')!r} "
                                  '(train_dataloader.dataset.data_prefix.img_path)'), problems
    assert problems[0].endswith('How to get it: IMGS'), problems


# ------------------------------------------------------------------------------ Cityscapes
def _cityscapes(root: str, **kwargs) -> dict:
    return dict(type='CityscapesDataset', data_root=root, pipeline=[],
                data_prefix=dict(img_path='leftImg8bit/train', seg_map_path='gtFine/train'),
                **kwargs)


def test_a_label_id_suffix_is_named_with_a_missing_root_and_only_once(tmp_path):
    root = str(tmp_path / 'cityscapes')
    problems = find_missing_inputs(_seg_cfg(_cityscapes(root,
                                                        seg_map_suffix='_gtFine_labelIds.png')))
    assert len(problems) == 2, problems
    assert "seg_map_suffix='_gtFine_labelIds.png'" in problems[0]
    assert f'data root {root!r}' in problems[1]
    make_cityscapes_layout(root, num_train=2, num_val=1, size=(16, 32))  # train ids only
    problems = find_missing_inputs(_seg_cfg(_cityscapes(root,
                                                        seg_map_suffix='_gtFine_labelIds.png')))
    assert len(problems) == 1 and "seg_map_suffix='_gtFine_labelIds.png'" in problems[0], \
        problems


def test_label_folders_behind_a_symbolic_link_count(tmp_path):
    """A city folder linked in (as a shared drive often is) is listed by mmseg."""
    root = str(tmp_path / 'cityscapes')
    make_cityscapes_layout(root, num_train=3, num_val=1, size=(16, 32))
    city = osp.join(root, 'gtFine', 'train', 'toytown')
    os.rename(city, str(tmp_path / 'elsewhere'))
    os.symlink(str(tmp_path / 'elsewhere'), city)
    dataset = _cityscapes(root)
    assert _mmseg_len(dataset) == 3  # mmseg follows the link
    counts: List[str] = []
    assert find_missing_inputs(_seg_cfg(dataset), counts=counts) == []
    assert counts == ['train_dataloader.dataset: 3 images, 3 label maps']


def test_train_id_maps_among_many_other_files_are_found(tmp_path):
    """The converter writes the train ids next to the download's polygons / colour maps."""
    root = str(tmp_path / 'cityscapes')
    stems = make_cityscapes_layout(root, num_train=1, num_val=1, size=(16, 32))
    city = osp.join(root, 'gtFine', 'train', 'toytown')
    for i in range(40):
        with open(osp.join(city, f'{stems["train"][0]}_{i:02d}_gtFine_polygons.json'), 'w') as f:
            f.write('{}')
    assert find_missing_inputs(_seg_cfg(_cityscapes(root))) == []


def test_a_label_suffix_is_looked_for_in_the_label_folder_only(ade):
    """An explicit ``seg_map_suffix`` (mmseg's ADE20K default, written out) is not looked for
    among the images."""
    dataset = _ade_dataset(ade, seg_map_suffix='.png')
    assert _mmseg_len(dataset) == 6
    assert find_missing_inputs(_seg_cfg(dataset)) == []


def test_a_label_folder_without_maps_of_the_suffix_is_named(ade):
    ann_dir = osp.join(ade, 'annotations', 'training')
    for name in os.listdir(ann_dir):
        os.rename(osp.join(ann_dir, name), osp.join(ann_dir, name[:-4] + '.bmp'))
    problems = find_missing_inputs(_seg_cfg(_ade_dataset(ade, seg_map_suffix='.png')))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f'no label maps *.png under {ann_dir!r}'), problems
    assert 'not be converted yet' in problems[0]


# ----------------------------------------------------------------------------- checkpoints
def test_checkpoints_inside_lists_are_checked_and_cleared(tmp_path):
    """mmseg accepts a list of auxiliary heads; each may carry a Pretrained init_cfg."""
    path = str(tmp_path / 'aux.pth')
    model = dict(type='EncoderDecoder', auxiliary_head=[
        dict(type='FCNHead'),
        dict(type='FCNHead', init_cfg=dict(type='Normal', std=0.01)),
        dict(type='FCNHead', pretrained=path)])
    problems = find_missing_inputs(dict(model=copy.deepcopy(model)))
    assert len(problems) == 1 and '(model.auxiliary_head[2].pretrained)' in problems[0], problems
    assert clear_checkpoints(model) == ['model.auxiliary_head[2].pretrained']
    assert model['auxiliary_head'][2]['pretrained'] is None


def test_an_empty_pretrained_is_no_checkpoint():
    """``pretrained=''`` reads no file (the backbone initialises without one): nothing is
    missing and nothing is reported as cleared."""
    from mmlinvit.registry import MODELS
    backbone = dict(type='mmlinvit.VisionTransformer', family='deit', img_size=16,
                    patch_size=8, attn_cfg='softmax', pretrained='',
                    arch=dict(embed_dims=16, num_layers=1, num_heads=2, mlp_hidden_dims=32))
    built = MODELS.build(copy.deepcopy(backbone))
    built.init_weights()
    assert not built.weights_loaded  # the reference: no checkpoint was read
    assert find_missing_inputs(dict(model=dict(backbone=copy.deepcopy(backbone)))) == []
    model = dict(backbone=backbone)
    assert clear_checkpoints(model) == [] and model['backbone']['pretrained'] is None


def test_clear_checkpoints_locations_default_to_model_and_can_be_bare():
    node = dict(backbone=dict(pretrained='a.pth'),
                init_cfg=dict(type='Pretrained', checkpoint='b.pth'))
    assert clear_checkpoints(copy.deepcopy(node)) == ['model.backbone.pretrained',
                                                      'model.init_cfg']
    assert clear_checkpoints(copy.deepcopy(node), '') == ['backbone.pretrained', 'init_cfg']


def _init_weights(init_cfg) -> None:
    """mmengine's ``BaseModule.init_weights`` with ``init_cfg`` (what a distillation teacher
    runs when it is built)."""
    from mmengine.model import BaseModule

    class Tiny(BaseModule):

        def __init__(self) -> None:
            super().__init__(init_cfg)
            self.fc = torch.nn.Linear(2, 2)

    Tiny().init_weights()


@pytest.mark.parametrize('init_cfg', [
    [dict(type='Constant', val=0.5, layer='Linear'), dict(type='Pretrained', checkpoint='x.pth')],
    dict(type='mmengine.Pretrained', checkpoint='x.pth'),
])
def test_cleared_pretrained_init_cfgs_can_be_initialised(init_cfg):
    """After clearing, no file is read and mmengine's init_weights runs, as for a plain
    ``init_cfg=dict(type='Pretrained', ...)`` (set to None)."""
    model = dict(teacher=dict(init_cfg=copy.deepcopy(init_cfg)))
    assert clear_checkpoints(model) != []
    _init_weights(model['teacher']['init_cfg'])


def test_a_cleared_plain_pretrained_init_cfg_can_be_initialised():
    model = dict(teacher=dict(init_cfg=dict(type='Pretrained', checkpoint='x.pth')))
    assert clear_checkpoints(model) == ['model.teacher.init_cfg']
    _init_weights(model['teacher']['init_cfg'])


# ----------------------------------------------------------------- batch-norm heads at bs 1
def _psp_loss(batch: int) -> None:
    """mmseg's PSPHead with BatchNorm and pool scale 1, one training step on ``batch``
    images."""
    from mmseg.models.decode_heads import PSPHead
    head = PSPHead(in_channels=4, channels=4, pool_scales=(1, ), num_classes=2,
                   norm_cfg=BN).train()
    head([torch.randn(batch, 4, 8, 8)])


def test_batch_size_two_trains_and_one_does_not():
    with pytest.raises(ValueError, match='Expected more than 1 value per channel'):
        _psp_loss(1)
    _psp_loss(2)
    model = dict(decode_head=dict(type='PSPHead', norm_cfg=BN))
    assert find_batch_norm_problem(dict(train_dataloader=dict(batch_size=2), model=model)) \
        is None
    assert find_batch_norm_problem(dict(train_dataloader=dict(batch_size=1), model=model))


def test_bn_in_a_list_of_auxiliary_heads_is_found():
    cfg = dict(launcher='none', train_dataloader=dict(batch_size=1), model=dict(
        type='EncoderDecoder', decode_head=dict(type='UPerHead', norm_cfg=dict(type='GN')),
        auxiliary_head=[dict(type='FCNHead', norm_cfg=dict(type='GN')),
                        dict(type='FCNHead', norm_cfg=BN)]))
    problem = find_batch_norm_problem(cfg)
    assert problem is not None and 'model.auxiliary_head[1].norm_cfg=BN' in problem, problem


def test_at_most_four_locations_are_shown():
    heads = [dict(type='FCNHead', norm_cfg=BN) for _ in range(5)]
    cfg = dict(launcher='none', train_dataloader=dict(batch_size=1),
               model=dict(decode_head=dict(type='UPerHead', norm_cfg=BN), auxiliary_head=heads))
    problem = find_batch_norm_problem(cfg)
    shown = ['model.decode_head.norm_cfg=BN'] + [f'model.auxiliary_head[{i}].norm_cfg=BN'
                                                  for i in range(3)]
    assert f'({", ".join(shown)} and 2 more)' in problem, problem
    assert 'auxiliary_head[3]' not in problem


def test_syncbn_is_advised_in_a_single_process_only():
    cfg = dict(launcher='none', train_dataloader=dict(batch_size=1),
               model=dict(decode_head=dict(type='UPerHead', norm_cfg=BN)))
    assert 'or SyncBN in a multi-GPU run (--launcher pytorch).' in find_batch_norm_problem(cfg)
    problem = find_batch_norm_problem(dict(cfg, launcher='pytorch'))  # BN is per GPU
    assert problem is not None and 'SyncBN' not in problem, problem


def test_a_loader_without_batch_size_has_batch_size_one():
    from mmengine.runner import Runner
    loader = Runner.build_dataloader(dict(dataset=list(range(4)),
                                          sampler=dict(type='DefaultSampler', shuffle=False)))
    assert loader.batch_size == 1  # the reference: torch's default
    cfg = dict(launcher='none', train_dataloader=dict(num_workers=0),
               model=dict(decode_head=dict(type='PSPHead', norm_cfg=BN)))
    assert find_batch_norm_problem(cfg) is not None


def test_bn_in_a_classification_head_with_batch_size_one():
    from mmpretrain.models.heads import StackedLinearClsHead
    head_cfg = dict(type='StackedLinearClsHead', num_classes=3, in_channels=4, mid_channels=[8],
                    norm_cfg=dict(type='BN1d'))
    head = StackedLinearClsHead(**{k: v for k, v in head_cfg.items() if k != 'type'}).train()
    head((torch.randn(2, 4), ))
    with pytest.raises(ValueError, match='Expected more than 1 value per channel'):
        head((torch.randn(1, 4), ))  # the reference: mmpretrain cannot train on one sample
    cfg = dict(launcher='none', train_dataloader=dict(batch_size=1),
               model=dict(type='ImageClassifier', backbone=dict(type='VisionTransformer'),
                          head=head_cfg))
    assert find_batch_norm_problem(cfg) is not None


# --------------------------------------------------------------- what check_inputs runs next
def _inconsistent_cfg(ade: str) -> Config:
    """A head of 3 classes on ADE20K (150 classes)."""
    return _seg_cfg(_ade_dataset(ade), model=dict(
        type='EncoderDecoder', decode_head=dict(type='FCNHead', num_classes=3)))


def test_check_config_consistency_false_skips_it_in_training(ade):
    from mmlinvit.engine.config_consistency import ConfigConsistencyError
    with pytest.raises(ConfigConsistencyError):
        check_inputs(_inconsistent_cfg(ade))
    cfg = _inconsistent_cfg(ade)
    cfg.check_config_consistency = False
    check_inputs(cfg)


def test_the_counted_training_set_reaches_the_schedule_check(monkeypatch, ade):
    import mmlinvit.engine.config_consistency as consistency
    seen: List = []
    monkeypatch.setattr(consistency, 'check_config_consistency',
                        lambda cfg, train_samples=None: seen.append(train_samples))
    check_inputs(_seg_cfg(_ade_dataset(ade)))
    assert seen == [6]


def test_check_data_threads_default_to_the_loaders_workers(monkeypatch, ade):
    import mmlinvit.datasets.integrity as integrity
    threads: List[int] = []

    def scan(dataset, rank, world_size, num_threads, progress):
        threads.append(num_threads)
        return integrity.ScanResult(num_samples=len(dataset), bad=[])

    monkeypatch.setattr(integrity, 'scan_dataset_files', scan)
    cfg = _seg_cfg(_ade_dataset(ade))
    cfg.train_dataloader.num_workers = 3
    assert preflight.check_data(cfg) == 6
    cfg.train_dataloader.num_workers = 0
    preflight.check_data(cfg)
    preflight.check_data(cfg, num_threads=5)
    assert threads == [3, 1, 5]


# ---------------------------------------------------------------------------------- pad size
def _pad_cfg(datasets: List[dict], size) -> Config:
    return Config(dict(model=dict(data_preprocessor=dict(type='SegDataPreProcessor', size=size)),
                       train_dataloader=dict(dataset=dict(type='ConcatDataset',
                                                          datasets=datasets))))


def test_every_dataset_and_every_crop_is_compared():
    """A ConcatDataset's second set and a pipeline's second crop: 32 x 32 crops padded to
    64 x 64 are 4x the pixels."""
    first = dict(type='ADE20KDataset', data_root='a', pipeline=[
        dict(type='RandomCrop', crop_size=(64, 64))])
    second = dict(type='ADE20KDataset', data_root='b', pipeline=[
        dict(type='RandomCrop', crop_size=(64, 64)), dict(type='RandomCrop', crop_size=32)])
    assert find_pad_size_problem(_pad_cfg([first], (64, 64))) is None
    problem = find_pad_size_problem(_pad_cfg([first, second], (64, 64)))
    assert problem is not None, problem
    assert '(train_dataloader.dataset.datasets[1].pipeline[1].crop_size)' in problem
    assert '4x the pixels' in problem


def test_a_crop_transform_without_its_size_is_passed_over():
    dataset = dict(type='ADE20KDataset', data_root='a', pipeline=[
        dict(type='RandomCrop', crop_size=None), dict(type='RandomResizedCrop')])
    assert find_pad_size_problem(_pad_cfg([dataset], (64, 64))) is None


def test_a_top_level_preprocessor_is_the_models(tmp_path):
    from mmengine.registry import DefaultScope
    from mmengine.runner import Runner
    crop = (64, 64)
    cfg = Config(dict(
        default_scope='mmseg', work_dir=str(tmp_path / 'wd'),
        data_preprocessor=dict(type='SegDataPreProcessor', size=(512, 512)),
        model=dict(type='EncoderDecoder',
                   backbone=dict(type='ResNetV1c', depth=18, num_stages=1, out_indices=(0, ),
                                 strides=(1, ), dilations=(1, )),
                   decode_head=dict(type='FCNHead', in_channels=64, channels=8, num_convs=1,
                                    num_classes=2, norm_cfg=dict(type='GN', num_groups=4))),
        train_dataloader=dict(batch_size=2, dataset=dict(
            type='ADE20KDataset', data_root='data/none',
            pipeline=[dict(type='RandomCrop', crop_size=crop)]))))
    runner_cfg = copy.deepcopy(cfg)
    runner_cfg.train_dataloader = None  # (a runner that trains needs a schedule too)
    with DefaultScope.overwrite_default_scope('mmseg'):  # (restores the current scope)
        runner = Runner.from_cfg(runner_cfg)  # the reference: what the runner pads to
    assert tuple(runner.model.data_preprocessor.size) == (512, 512)
    problem = find_pad_size_problem(cfg)
    assert problem is not None and 'pads every (64, 64) training crop' in problem, problem
    # A distillation model without its own preprocessor gets the top-level one as well (and
    # then runs it instead of its student's): a student fixed to the crop does not help.
    student = copy.deepcopy(cfg.model)
    student.data_preprocessor = dict(type='SegDataPreProcessor', size=crop)
    cfg.model = dict(type='mmlinvit.DistillationModel', student=student, teacher=dict())
    problem = find_pad_size_problem(cfg)
    assert problem is not None and 'data_preprocessor.size=(512, 512) pads' in problem, problem
