"""Checks, before a runner is built, that every data root and checkpoint a config names exists.

mmengine builds datasets and loads weights deep inside ``Runner.train()``; a wrong path then
surfaces as an empty dataset, an obscure ``FileNotFoundError`` from a worker, or a model that
silently starts from random weights.  :func:`check_inputs` walks the config instead and
raises one :class:`MissingInputsError` naming every missing path, where it was configured and
how to obtain it (download, convert, or which training stage produces it).

Configs can add their own advice with ``missing_path_hints = {'model.backbone.pretrained':
'Run AdaLA Stage 2 ...'}`` (keys are the dotted config locations printed in the error; a
dataset's location, e.g. ``'train_dataloader.dataset'``, covers all of its paths).

Once a dataset's folders exist, the images (and label maps) it will list are counted with
mmseg's / mmpretrain's own listing rules (:mod:`mmlinvit.datasets.pairing`): an empty image
folder, a wrong ``img_suffix`` or images without label maps stop the run here, naming the
folder, the suffix looked for and what is there, instead of failing inside mmengine with
"need at least one array to concatenate".  The counts are logged.

In training, a per-GPU batch size of 1 (stated, or torch's default when the train loader has
no ``batch_size``) with BatchNorm in a decode / auxiliary head or a classifier ``head`` is
refused (:class:`BatchNormBatchSizeError`): BatchNorm cannot train on one value per channel,
which pooled branches (UPerHead / PSPHead pool scale 1, ASPP image pooling) and classifier
heads produce, and mmseg / mmpretrain fail at the first iteration with "Expected more than 1 value per channel when training".
"""
import logging
import os
import os.path as osp
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch.nn as nn
from mmengine.logging import print_log

from mmlinvit.datasets.pairing import CITYSCAPES_TRAIN_ID_SUFFIX, pair_dataset_files
from mmlinvit.utils.config_types import config_type_name, is_pretrained_init

#: Config keys whose string value is a local checkpoint path.
CHECKPOINT_KEYS = ('pretrained', 'checkpoint', 'teacher_checkpoint', 'teacher_ckpt',
                   'student_checkpoint', 'init_checkpoint')

_CITYSCAPES_CONVERTER = (
    "mmseg's converter, which writes <city>/*_gtFine_labelTrainIds.png next to each "
    '*_gtFine_polygons.json: pip install cityscapesscripts, then python '
    'tools/dataset_converters/cityscapes.py data/cityscapes --nproc 8 (from an mmsegmentation '
    'checkout)')

#: How to obtain each dataset, keyed by the dataset ``type`` of the config (scope removed).
DATASET_HINTS: Dict[str, str] = {
    'ADE20KDataset': (
        'Download ADEChallengeData2016.zip from '
        'http://data.csail.mit.edu/places/ADEchallenge/ADEChallengeData2016.zip and unzip it so '
        'that <data_root>/images/{training,validation}/*.jpg and '
        '<data_root>/annotations/{training,validation}/*.png exist (mmseg layout, '
        'data/ade/ADEChallengeData2016 by default); or point the config at it with '
        '--cfg-options train_dataloader.dataset.data_root=... val_dataloader.dataset.data_root=...'
    ),
    'CityscapesDataset': (
        'Download leftImg8bit_trainvaltest.zip and gtFine_trainvaltest.zip from '
        'https://www.cityscapes-dataset.com/downloads/, unzip both into <data_root> '
        '(data/cityscapes by default) and create the label maps with ' + _CITYSCAPES_CONVERTER),
    'ImageNet': (
        'Download ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from https://image-net.org/ '
        '(data/imagenet by default; split=\'train\' reads <data_root>/train/, split=\'val\' '
        '<data_root>/val/). train/: one folder per class, <data_root>/train/n01440764/*.JPEG '
        '(extract the train tar, then each class tar inside it into a folder of its name). '
        'val/: either the same class folders (<data_root>/val/<wnid>/*.JPEG), or flat as '
        'ILSVRC2012_img_val.tar extracts (<data_root>/val/ILSVRC2012_val_00000001.JPEG ...) with '
        "mmpretrain's annotation file <data_root>/meta/val.txt, one line per image such as "
        "'ILSVRC2012_val_00000001.JPEG 65' (the class index in sorted-wnid order, 0-999). "
        'ImageNet reads meta/<split>.txt whenever it exists; flat images without it are not '
        'listed at all'),
    'CIFAR10': (
        "mmpretrain's CIFAR10 downloads https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz "
        '(163 MB) into <data_root> on first use (download=True) and would create the folder, '
        'but pre-flight stops on a missing data root: mkdir -p data/cifar10 (the default '
        'data_root) to let it download, or extract cifar-10-python.tar.gz there yourself '
        '(<data_root>/cifar-10-batches-py/data_batch_1 ...) on a machine without internet'),
    'CIFAR100': (
        "mmpretrain's CIFAR100 downloads https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz "
        'into <data_root> on first use (download=True), but pre-flight stops on a missing data '
        'root: mkdir -p <data_root> to let it download, or extract the archive there yourself '
        '(<data_root>/cifar-100-python/train ...)'),
    'CustomDataset': ('Put images under <data_root>/<data_prefix> (one sub-folder per class for '
                      'classification, or any folder for unlabelled distillation data)'),
    'CocoDataset': ('Download COCO 2017 images from https://cocodataset.org/#download and '
                    'unzip train2017/ val2017 under <data_root>'),
}

_GENERIC_DATA_HINT = ('Create or download the data set so that this path exists, or override '
                      'its data_root with --cfg-options')
_GENERIC_CKPT_HINT = ('Train or download the checkpoint, convert official weights with '
                      "mmlinvit.converters if needed, or point the config at it with "
                      '--cfg-options <location>=<path>')


class PreflightError(Exception):
    """A problem found by the pre-flight checks, before anything is built."""


class MissingInputsError(PreflightError, FileNotFoundError):
    """A data root, data folder or checkpoint named by the config does not exist, or a data
    folder holds no images (or images without label maps) that the dataset would list."""


class BatchNormBatchSizeError(PreflightError, ValueError):
    """Training with one sample per GPU through BatchNorm layers of a head."""


#: Norm types that normalise over the batch in every process.
LOCAL_BATCH_NORMS = ('BN', 'BN1d', 'BN2d', 'BN3d')
#: Norm types that normalise over the batch of all processes (one process: like BN).
SYNC_BATCH_NORMS = ('SyncBN', 'MMSyncBN', 'NaiveSyncBN')
#: Config keys of the heads that are trained on the task loss (mmseg's decode / auxiliary
#: heads, mmpretrain's classifier ``head``).
HEAD_KEYS = ('decode_head', 'auxiliary_head', 'head')


def _type_scope(type_name: Any) -> Optional[str]:
    """The scope a type name gives itself (``'mmseg'`` of ``'mmseg.UPerHead'``, up to the first
    dot as mmengine's registries split it), or None."""
    return type_name.split('.')[0] if isinstance(type_name, str) and '.' in type_name else None


def is_remote_path(path: str) -> bool:
    """Whether mmengine fetches ``path`` through a URL scheme rather than from the disk.

    Every scheme mmengine's ``CheckpointLoader`` registers has ``://`` (http(s), pavi,
    open-mmlab / openmmlab, mmcls, modelzoo / torchvision; s3 through its file backends);
    ``'open-mmlab:x'`` without ``//`` is read as a local file, so it is checked as one (it
    was taken for remote and failed inside the runner with a bare FileNotFoundError).
    """
    return '://' in path


def _iter_datasets(dataset: Any, where: str) -> Iterator[Tuple[dict, str]]:
    """Yields (dataset config, location) through wrappers (Concat / Repeat / ClassBalanced)."""
    if not isinstance(dataset, dict):
        return
    if 'datasets' in dataset:
        for i, sub in enumerate(dataset['datasets']):
            yield from _iter_datasets(sub, f'{where}.datasets[{i}]')
    if isinstance(dataset.get('dataset'), dict):
        yield from _iter_datasets(dataset['dataset'], f'{where}.dataset')
    if 'data_root' in dataset or 'data_prefix' in dataset:
        yield dataset, where


def _checked_loaders(cfg: Any, mode: str) -> Iterator[Tuple[str, dict]]:
    """Yields (name, config) of the data loaders a ``mode`` run reads.

    ``'train'``: the train loader and, when the config validates, the val loader;
    ``'test'``: the test loader.  Loaders set to ``None`` are skipped.  Like mmengine's
    ``Runner``, a run validates whenever ``val_cfg`` is not ``None``: ``val_cfg = dict()``
    (every classification schedule) builds the default ``ValLoop`` and its dataset.
    ``Runner.test()`` needs the test loader whatever ``test_cfg`` is (it fails without one).
    """
    if mode not in ('train', 'test'):
        raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
    names = ('train_dataloader', 'val_dataloader') if mode == 'train' else ('test_dataloader', )
    for name in names:
        loader_cfg = cfg.get(name, None)
        if not loader_cfg or (mode == 'train' and name == 'val_dataloader'
                              and cfg.get('val_cfg', None) is None):
            continue
        yield name, loader_cfg


def _freeze(value: Any) -> Any:
    """A hashable, order-independent copy of a config value (dicts sorted by key)."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def _dataset_key(dataset: dict) -> Any:
    """What identifies the files a dataset config lists: the whole config but its pipeline.

    ``test_dataloader = val_dataloader`` is checked once, while ImageNet's train and val sets
    (same ``data_root``, different ``split``) are two datasets.
    """
    return _freeze({k: v for k, v in dataset.items() if k != 'pipeline'})


def _iter_checkpoints(node: Any, where: str) -> Iterator[Tuple[str, str]]:
    """Yields (path, location) for every checkpoint-like key under ``node``."""
    if isinstance(node, dict):
        for key, value in node.items():
            loc = f'{where}.{key}' if where else str(key)
            if key in CHECKPOINT_KEYS and isinstance(value, str) and value:
                yield value, loc
            else:
                yield from _iter_checkpoints(value, loc)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _iter_checkpoints(value, f'{where}[{i}]')


def clear_checkpoints(node: Any, where: str = 'model') -> List[str]:
    """Sets every checkpoint path and ``Pretrained`` init_cfg under ``node`` to None, in place.

    For tools that build a config's model without reading weights (FLOP counting) or whose
    weights come from another file (inference and evaluation of a runner checkpoint).

    Args:
        node: A config dict / list (e.g. ``cfg.model``); checkpoint keys are
            :data:`CHECKPOINT_KEYS`.
        where: The dotted config location of ``node``, for the returned locations.

    Returns:
        The dotted locations that were cleared (e.g. ``['model.backbone.pretrained']``).
    """
    cleared: List[str] = []
    if isinstance(node, dict):
        for key in list(node.keys()):
            value = node[key]
            loc = f'{where}.{key}' if where else str(key)
            if key in CHECKPOINT_KEYS and isinstance(value, str):
                node[key] = None
                if value:
                    cleared.append(loc)
            elif key == 'init_cfg' and is_pretrained_init(value):
                node[key] = None
                cleared.append(loc)
            elif key == 'init_cfg' and isinstance(value, (list, tuple)) and \
                    any(is_pretrained_init(v) for v in value):
                # mmengine's init_weights cannot run a Pretrained entry without a checkpoint
                cleared.extend(f'{loc}[{i}]' for i, v in enumerate(value)
                               if is_pretrained_init(v))
                node[key] = [v for v in value if not is_pretrained_init(v)] or None
            else:
                cleared.extend(clear_checkpoints(value, loc))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            cleared.extend(clear_checkpoints(value, f'{where}[{i}]'))
    return cleared


def _has_file_with_suffix(folder: str, suffix: str) -> bool:
    for _, _, files in os.walk(folder, followlinks=True):
        if any(name.endswith(suffix) for name in files):
            return True
    return False


def _cityscapes_suffix_problem(dataset: dict, where: str) -> Optional[str]:
    """Refuses Cityscapes label maps that are not in train ids (e.g. ``*_gtFine_labelIds.png``).

    mmseg's ``CityscapesDataset`` reads the label map as stored: ``*_labelIds.png`` holds the
    raw ids 0-33, which the 19-class metric and loss take as train ids, so training and mIoU
    are silently wrong.
    """
    suffix = dataset.get('seg_map_suffix') or CITYSCAPES_TRAIN_ID_SUFFIX
    if suffix.endswith('labelTrainIds.png'):
        return None
    return (f'{where}.seg_map_suffix={suffix!r}: Cityscapes label maps must be in train ids '
            f'(*{CITYSCAPES_TRAIN_ID_SUFFIX}: 0-18, 255 = ignore). Other gtFine maps hold '
            f'the raw label ids 0-33 (*_labelIds.png) or colours / instances, which mmseg reads '
            f'as train ids without an error: training learns the wrong classes and the mIoU is '
            f'wrong.\n    Fix: drop seg_map_suffix (mmseg\'s default is '
            f'{CITYSCAPES_TRAIN_ID_SUFFIX!r}) and create the maps with {_CITYSCAPES_CONVERTER}. '
            f'(Maps that hold train ids already: name them *labelTrainIds.png.)')


def _dataset_advice(dataset: dict, where: str, hints: Dict[str, str],
                    location: Optional[str] = None) -> str:
    """How to obtain a dataset: the config's ``missing_path_hints`` at ``location`` (e.g.
    ``train_dataloader.dataset.data_root``) or at the dataset (``train_dataloader.dataset``),
    else :data:`DATASET_HINTS` of its type."""
    return (hints.get(location or where) or hints.get(where)
            or DATASET_HINTS.get(config_type_name(dataset.get('type')), _GENERIC_DATA_HINT))


def _check_dataset(dataset: dict, where: str, hints: Dict[str, str]) -> List[str]:
    problems = []
    dtype = config_type_name(dataset.get('type'))

    def advice(location: str) -> str:
        return _dataset_advice(dataset, where, hints, location)

    if dtype == 'CityscapesDataset':
        problem = _cityscapes_suffix_problem(dataset, where)
        if problem:
            problems.append(problem)
    data_root = dataset.get('data_root') or ''
    if data_root and not osp.isdir(data_root):
        return problems + [
            f'data root {data_root!r} ({where}.data_root, {dtype or "dataset"}) does not '
            f'exist.\n    How to get it: {advice(f"{where}.data_root")}']
    prefixes = dataset.get('data_prefix') or {}
    if isinstance(prefixes, str):
        prefixes = {'data_prefix': prefixes}
    for key, prefix in prefixes.items():
        if not isinstance(prefix, str) or not prefix or is_remote_path(prefix):
            continue
        folder = prefix if osp.isabs(prefix) else osp.join(data_root, prefix)
        location = f'{where}.data_prefix' + ('' if key == 'data_prefix' else f'.{key}')
        if not osp.isdir(folder):
            problems.append(f'{key} folder {folder!r} ({location}) does not '
                            f'exist.\n    How to get it: {advice(location)}')
        elif key == 'seg_map_path' and dtype == 'CityscapesDataset':
            suffix = dataset.get('seg_map_suffix') or CITYSCAPES_TRAIN_ID_SUFFIX
            if suffix.endswith('labelTrainIds.png') and not _has_file_with_suffix(folder, suffix):
                problems.append(
                    f'no *{suffix} under {folder!r} ({where}): the Cityscapes labels are not '
                    f'converted to train ids.\n    How to get it: {advice(location)}')
        elif key == 'seg_map_path' and dataset.get('seg_map_suffix'):
            suffix = dataset['seg_map_suffix']
            if not _has_file_with_suffix(folder, suffix):
                problems.append(
                    f'no label maps *{suffix} under {folder!r} ({where}). The raw data may not '
                    f'be converted yet.\n    How to get it: {advice(location)}')
    ann_file = dataset.get('ann_file') or ''
    if ann_file and not is_remote_path(ann_file):
        path = ann_file if osp.isabs(ann_file) else osp.join(data_root, ann_file)
        if not osp.isfile(path):
            problems.append(f'annotation file {path!r} ({where}.ann_file) does not exist.\n'
                            f'    How to get it: {advice(f"{where}.ann_file")}')
    return problems


def find_missing_inputs(cfg: Any,
                        mode: str = 'train',
                        checkpoint: Optional[str] = None,
                        counts: Optional[List[str]] = None,
                        sizes: Optional[Dict[str, int]] = None) -> List[str]:
    """Lists every missing data path / checkpoint of a config (empty when all exist).

    Datasets whose folders exist are also checked for images (and label maps) that pair up
    (:func:`mmlinvit.datasets.pairing.pair_dataset_files`).

    Args:
        cfg: An mmengine ``Config`` (or a plain dict with the same keys).
        mode: ``'train'`` checks the train and val loaders, ``'test'`` the test loader.
        checkpoint: The checkpoint given to the test tool, checked as well.
        counts: If given, one line per checked dataset with its image / label-map counts is
            appended to it.
        sizes: If given, filled with the number of images of each checked dataset, by its
            location (``'train_dataloader.dataset'``).

    Returns:
        One human-readable problem description per missing path or unpaired data folder.
    """
    hints: Dict[str, str] = dict(cfg.get('missing_path_hints', None) or {})
    problems: List[str] = []
    seen = set()
    missing_roots = set()
    for loader, loader_cfg in _checked_loaders(cfg, mode):
        for dataset, where in _iter_datasets(loader_cfg.get('dataset'), f'{loader}.dataset'):
            key = _dataset_key(dataset)
            data_root = dataset.get('data_root') or ''
            if key in seen or data_root in missing_roots:  # each missing root named once
                continue
            seen.add(key)
            if data_root and not osp.isdir(data_root):
                missing_roots.add(data_root)
            missing = _check_dataset(dataset, where, hints)
            problems.extend(missing)
            if not missing:
                report = pair_dataset_files(dataset, where, cfg.get('default_scope', None))
                if report is not None:
                    hint = ''
                    if report.num_images == 0:  # nothing found: say how to get the data
                        hint = f'\n    How to get it: {_dataset_advice(dataset, where, hints)}'
                    problems.extend(problem + hint for problem in report.problems)
                    if counts is not None:
                        counts.append(report.summary())
                    if sizes is not None:
                        sizes[where] = report.num_images

    ckpts = list(_iter_checkpoints(cfg.get('model', {}), 'model'))
    load_from = cfg.get('load_from', None)
    if mode == 'train' and isinstance(load_from, str) and load_from:
        ckpts.append((load_from, 'load_from'))
    if checkpoint:
        ckpts.append((checkpoint, 'checkpoint argument'))
    for path, where in ckpts:
        if is_remote_path(path) or osp.isfile(path):
            continue
        problems.append(f'checkpoint {path!r} ({where}) does not exist.\n'
                        f'    How to get it: {hints.get(where, _GENERIC_CKPT_HINT)}')
    return problems


def _batch_norm_kind(norm_type: Any) -> Optional[str]:
    """``'local'`` or ``'sync'`` for a BatchNorm config ``type``, else None.

    The type may be a registered name (``'BN'``), a scoped one (``'mmengine.SyncBN'``, as
    mmengine's registries resolve it) or the class of a pure-Python config (``nn.BatchNorm2d``,
    ``nn.SyncBatchNorm``; mmcv's ``build_norm_layer`` takes a class as it is).
    """
    if isinstance(norm_type, type):
        if issubclass(norm_type, nn.SyncBatchNorm) or norm_type.__name__ == 'SyncBatchNorm':
            return 'sync'  # torch's / mmengine's SyncBN and mmcv's MMSyncBN
        return 'local' if issubclass(norm_type, nn.modules.batchnorm._BatchNorm) else None
    name = config_type_name(norm_type)
    if name in LOCAL_BATCH_NORMS:
        return 'local'
    return 'sync' if name in SYNC_BATCH_NORMS else None


def _iter_head_batch_norms(node: Any, where: str, in_head: bool = False
                           ) -> Iterator[Tuple[str, Any]]:
    """Yields (location, norm type) of BatchNorm configs inside decode / auxiliary / classifier
    heads.

    The frozen ``teacher`` of a distillation model runs in eval mode and is skipped.
    """
    if isinstance(node, dict):
        norm_type = node.get('type')
        if in_head and _batch_norm_kind(norm_type) is not None:
            yield where, norm_type
        for key, value in node.items():
            if key == 'teacher':
                continue
            yield from _iter_head_batch_norms(value, f'{where}.{key}', in_head or key in HEAD_KEYS)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _iter_head_batch_norms(value, f'{where}[{i}]', in_head)


def find_batch_norm_problem(cfg: Any) -> Optional[str]:
    """Describes a per-GPU train batch size of 1 with BatchNorm in a head, or ``None``.

    ``SyncBN`` is fine in a distributed run (it normalises over every process's sample) and
    counts as BatchNorm when ``cfg.launcher`` is ``'none'``.

    Args:
        cfg: The prepared training config (``launcher`` set by ``tools/train.py``).

    Returns:
        The problem and how to fix it, or ``None``.
    """
    loader = cfg.get('train_dataloader', None) or {}
    # mmengine passes the loader config to torch's DataLoader, whose batch_size defaults to 1
    if not loader or loader.get('batch_size', 1) != 1:
        return None
    distributed = cfg.get('launcher', 'none') != 'none'
    found = [(where, config_type_name(norm))
             for where, norm in _iter_head_batch_norms(cfg.get('model', {}), 'model')
             if _batch_norm_kind(norm) == 'local' or not distributed]
    if not found:
        return None
    shown = ', '.join(f'{where}={norm}' for where, norm in found[:4])
    more = f' and {len(found) - 4} more' if len(found) > 4 else ''
    return (f'train_dataloader.batch_size=1 (per GPU) with BatchNorm in the heads ({shown}{more}). '
            f'BatchNorm cannot train on one sample: pooled branches (UPerHead / PSPHead pool '
            f'scale 1, ASPP image pooling) and classifier heads fail with "Expected more than 1 value per channel '
            f'when training", and the statistics of one image are noise anyway.\n'
            f'    Fix: use at least 2 images per GPU (--cfg-options '
            f'train_dataloader.batch_size=2), or a norm that does not use the batch in the heads, '
            f"e.g. norm_cfg=dict(type='GN', num_groups=32, requires_grad=True) (GroupNorm; 'LN' "
            f'for transformer-style heads)'
            + ('' if distributed else ', or SyncBN in a multi-GPU run (--launcher pytorch)') + '.')


def check_inputs(cfg: Any, mode: str = 'train', checkpoint: Optional[str] = None) -> None:
    """Runs the pre-flight checks: missing / unpaired inputs, then (training) batch-size-1 BN.

    Args:
        cfg: An mmengine ``Config``.
        mode: ``'train'`` or ``'test'`` (see :func:`find_missing_inputs`).
        checkpoint: Checkpoint given to the test tool.

    Raises:
        MissingInputsError: listing every missing path and data folder that does not pair up.
        BatchNormBatchSizeError: training with batch size 1 per GPU through BatchNorm heads.
        PadSizeError: training crops padded to a larger preprocessor size
            (:mod:`.pad_size_check`).
        ConfigConsistencyError: parts of an inherited config that disagree (head classes vs
            data set classes, ``save_best`` vs the metric, label maps beyond the head's classes
            (also in test mode); :mod:`.config_consistency`, which also logs warnings).
            ``check_config_consistency = False`` in the config skips it.
    """
    counts: List[str] = []
    sizes: Dict[str, int] = {}
    problems = find_missing_inputs(cfg, mode=mode, checkpoint=checkpoint, counts=counts,
                                   sizes=sizes)
    if problems:
        lines = '\n'.join(f'  - {p}' for p in problems)
        raise MissingInputsError(
            f'Cannot start: {len(problems)} input problem(s) in the config (checked before '
            f'building the runner; nothing was trained):\n{lines}')
    for line in counts:
        print_log(f'Data check: {line}', logger='current', level=logging.INFO)
    if mode == 'test' and cfg.get('check_config_consistency', True):
        from .config_consistency import check_test_config_consistency
        check_test_config_consistency(cfg)
    if mode == 'train':
        problem = find_batch_norm_problem(cfg)
        if problem:
            raise BatchNormBatchSizeError(f'Cannot start: {problem}')
        from .pad_size_check import PadSizeError, find_pad_size_problem
        problem = find_pad_size_problem(cfg)
        if problem:
            raise PadSizeError(f'Cannot start: {problem}')
        if cfg.get('check_config_consistency', True):
            from .config_consistency import check_config_consistency
            check_config_consistency(cfg, train_samples=sizes.get('train_dataloader.dataset'))


class DataCheckError(PreflightError):
    """``--check-data`` found images or label maps that cannot be used."""


#: Bad files listed in the error message (all of them go to the work dir's list).
MAX_BAD_SHOWN = 20


def check_data(cfg: Any, mode: str = 'train', num_threads: Optional[int] = None) -> int:
    """Decodes every image and label map of the config's datasets (``--check-data``).

    Each dataset of the train and val loaders (``mode='train'``) or the test loader is built
    as the runner will build it, and every file it lists is decoded in full
    (:func:`mmlinvit.datasets.integrity.scan_dataset_files`); progress is logged.  In a
    distributed run each process scans ``rank::world_size`` and the results are gathered, so
    every process stops together.  When files are bad, their list is written to
    ``<work_dir>/bad_data_files.txt``.

    Args:
        cfg: The prepared config (call after the runner is built in distributed runs, so the
            process group exists).
        mode: ``'train'`` or ``'test'``.
        num_threads: Decoding threads per process (default: the loader's ``num_workers``,
            at least 1).

    Returns:
        The number of samples checked (all processes).

    Raises:
        DataCheckError: naming the bad files and why each is bad.
    """
    from mmengine.dist import all_gather_object, get_rank, get_world_size
    from mmengine.registry import DATASETS, DefaultScope

    from mmlinvit.datasets.integrity import scan_dataset_files
    rank, world_size = get_rank(), get_world_size()
    scope = cfg.get('default_scope', None)
    bad: List[Tuple[str, str]] = []
    num_samples = 0
    seen = set()
    for loader, loader_cfg in _checked_loaders(cfg, mode):
        threads = num_threads or max(1, int(loader_cfg.get('num_workers', 0) or 0))
        for dataset_cfg, where in _iter_datasets(loader_cfg.get('dataset'), f'{loader}.dataset'):
            key = _dataset_key(dataset_cfg)
            if key in seen:
                continue
            seen.add(key)
            with DefaultScope.overwrite_default_scope(scope):
                dataset = DATASETS.build(dict(dataset_cfg))

            def progress(done: int, total: int, num_bad: int, where: str = where) -> None:
                print_log(f'check-data {where}: {done}/{total} samples decoded'
                          f'{f" (rank {rank}/{world_size})" if world_size > 1 else ""}, '
                          f'{num_bad} bad file(s)', logger='current', level=logging.INFO)

            result = scan_dataset_files(dataset, rank, world_size, threads, progress)
            shares = all_gather_object(result) if world_size > 1 else [result]
            num_samples += sum(share.num_samples for share in shares)
            bad.extend(item for share in shares for item in share.bad)
    if not bad:
        print_log(f'check-data: {num_samples} samples decoded, no bad file', logger='current',
                  level=logging.INFO)
        return num_samples
    listing = ''
    work_dir = cfg.get('work_dir', None)
    if work_dir and rank == 0:
        os.makedirs(work_dir, exist_ok=True)
        listing = osp.join(work_dir, 'bad_data_files.txt')
        with open(listing, 'w') as f:
            f.writelines(f'{path}\t{reason}\n' for path, reason in bad)
    shown = '\n'.join(f'  - {path}: {reason}' for path, reason in bad[:MAX_BAD_SHOWN])
    more = f'\n  ... and {len(bad) - MAX_BAD_SHOWN} more' if len(bad) > MAX_BAD_SHOWN else ''
    raise DataCheckError(
        f'--check-data: {len(bad)} bad file(s) among {num_samples} samples (nothing was '
        f'trained):\n{shown}{more}\n'
        + (f'The full list is in {listing}.\n' if listing else '')
        + 'Replace or delete these files (for an ann_file dataset, drop their lines) and run '
          'again.')
