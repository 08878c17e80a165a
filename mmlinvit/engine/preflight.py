"""Checks, before a runner is built, that every data root and checkpoint a config names exists.

mmengine builds datasets and loads weights deep inside ``Runner.train()``; a wrong path then
surfaces as an empty dataset, an obscure ``FileNotFoundError`` from a worker, or a model that
silently starts from random weights.  :func:`check_inputs` walks the config instead and
raises one :class:`MissingInputsError` naming every missing path, where it was configured and
how to obtain it (download, convert, or which training stage produces it).

Configs can add their own advice with ``missing_path_hints = {'model.backbone.pretrained':
'Run AdaLA Stage 2 ...'}`` (keys are the dotted config locations printed in the error).
"""
import os
import os.path as osp
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

#: Config keys whose string value is a local checkpoint path.
CHECKPOINT_KEYS = ('pretrained', 'checkpoint', 'teacher_checkpoint', 'teacher_ckpt',
                   'student_checkpoint', 'init_checkpoint')

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
        '(data/cityscapes by default) and create the *_gtFine_labelTrainIds.png label maps with '
        "mmseg's converter: python tools/dataset_converters/cityscapes.py data/cityscapes "
        '--nproc 8 (from an mmsegmentation checkout)'),
    'ImageNet': ('Download ILSVRC2012 from https://image-net.org/ and arrange it as mmpretrain '
                 'expects (<data_root>/train/<class>/*.JPEG, <data_root>/val/..., meta/*.txt)'),
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


class MissingInputsError(FileNotFoundError):
    """A data root, data folder or checkpoint named by the config does not exist."""


def _strip_scope(type_name: Any) -> str:
    return type_name.split('.')[-1] if isinstance(type_name, str) else ''


def _is_remote(path: str) -> bool:
    return '://' in path or path.startswith(('open-mmlab:', 'mmcls:', 'torchvision:'))


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


def _has_file_with_suffix(folder: str, suffix: str) -> bool:
    for _, _, files in os.walk(folder, followlinks=True):
        if any(name.endswith(suffix) for name in files):
            return True
    return False


def _check_dataset(dataset: dict, where: str, hints: Dict[str, str]) -> List[str]:
    problems = []
    dtype = _strip_scope(dataset.get('type'))
    advice = hints.get(where) or DATASET_HINTS.get(dtype, _GENERIC_DATA_HINT)
    data_root = dataset.get('data_root') or ''
    if data_root and not osp.isdir(data_root):
        return [f'data root {data_root!r} ({where}.data_root, {dtype or "dataset"}) does not '
                f'exist.\n    How to get it: {advice}']
    prefixes = dataset.get('data_prefix') or {}
    if isinstance(prefixes, str):
        prefixes = {'data_prefix': prefixes}
    for key, prefix in prefixes.items():
        if not isinstance(prefix, str) or not prefix or _is_remote(prefix):
            continue
        folder = prefix if osp.isabs(prefix) else osp.join(data_root, prefix)
        if not osp.isdir(folder):
            problems.append(f'{key} folder {folder!r} ({where}.data_prefix.{key}) does not '
                            f'exist.\n    How to get it: {advice}')
        elif key == 'seg_map_path' and dataset.get('seg_map_suffix'):
            suffix = dataset['seg_map_suffix']
            if not _has_file_with_suffix(folder, suffix):
                problems.append(
                    f'no label maps *{suffix} under {folder!r} ({where}). The raw data may not '
                    f'be converted yet.\n    How to get it: {advice}')
        elif key == 'seg_map_path' and dtype == 'CityscapesDataset':
            if not _has_file_with_suffix(folder, '_gtFine_labelTrainIds.png'):
                problems.append(
                    f'no *_gtFine_labelTrainIds.png under {folder!r} ({where}): the Cityscapes '
                    f'labels are not converted to train ids.\n    How to get it: {advice}')
    ann_file = dataset.get('ann_file') or ''
    if ann_file and not _is_remote(ann_file):
        path = ann_file if osp.isabs(ann_file) else osp.join(data_root, ann_file)
        if not osp.isfile(path):
            problems.append(f'annotation file {path!r} ({where}.ann_file) does not exist.\n'
                            f'    How to get it: {advice}')
    return problems


def find_missing_inputs(cfg: Any,
                        mode: str = 'train',
                        checkpoint: Optional[str] = None) -> List[str]:
    """Lists every missing data path / checkpoint of a config (empty when all exist).

    Args:
        cfg: An mmengine ``Config`` (or a plain dict with the same keys).
        mode: ``'train'`` checks the train and val loaders, ``'test'`` the test loader.
        checkpoint: The checkpoint given to the test tool, checked as well.

    Returns:
        One human-readable problem description per missing path.
    """
    if mode not in ('train', 'test'):
        raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
    hints: Dict[str, str] = dict(cfg.get('missing_path_hints', None) or {})
    loaders: Sequence[str] = (('train_dataloader', 'val_dataloader')
                              if mode == 'train' else ('test_dataloader', ))
    problems: List[str] = []
    seen = set()
    for loader in loaders:
        loader_cfg = cfg.get(loader, None)
        if not loader_cfg or (mode == 'train' and loader == 'val_dataloader'
                              and not cfg.get('val_cfg', None)):
            continue
        for dataset, where in _iter_datasets(loader_cfg.get('dataset'), f'{loader}.dataset'):
            key = (dataset.get('data_root'), str(dataset.get('data_prefix')))
            if key in seen:
                continue
            seen.add(key)
            problems.extend(_check_dataset(dataset, where, hints))

    ckpts = list(_iter_checkpoints(cfg.get('model', {}), 'model'))
    load_from = cfg.get('load_from', None)
    if mode == 'train' and isinstance(load_from, str) and load_from:
        ckpts.append((load_from, 'load_from'))
    if checkpoint:
        ckpts.append((checkpoint, 'checkpoint argument'))
    for path, where in ckpts:
        if _is_remote(path) or osp.isfile(path):
            continue
        problems.append(f'checkpoint {path!r} ({where}) does not exist.\n'
                        f'    How to get it: {hints.get(where, _GENERIC_CKPT_HINT)}')
    return problems


def check_inputs(cfg: Any, mode: str = 'train', checkpoint: Optional[str] = None) -> None:
    """Raises :class:`MissingInputsError` listing every missing data path or checkpoint.

    Args:
        cfg: An mmengine ``Config``.
        mode: ``'train'`` or ``'test'`` (see :func:`find_missing_inputs`).
        checkpoint: Checkpoint given to the test tool.
    """
    problems = find_missing_inputs(cfg, mode=mode, checkpoint=checkpoint)
    if problems:
        lines = '\n'.join(f'  - {p}' for p in problems)
        raise MissingInputsError(
            f'Cannot start: {len(problems)} input(s) of the config are missing (checked before '
            f'building the runner; nothing was trained):\n{lines}')
