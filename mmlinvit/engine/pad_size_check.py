"""Pre-flight check: the segmentation data preprocessor pads training crops to the crop size.

mmseg's ``SegDataPreProcessor(size=...)`` pads every batch to ``size``.  mmseg configs set it
to the crop (``data_preprocessor = dict(size=crop_size)``); a config that changes the crop but
keeps a base's preprocessor - typically a ``DistillationModel`` whose student comes from a
512 x 512 segmentation base, trained on smaller crops - pads every crop with zeros: the step
costs (size / crop)^2 times the pixels and the models learn on mostly padding, silently.  A
``size`` smaller than a new, larger ``RandomCrop`` leaves batches of unequal sizes (the crops
of smaller images), which stop the first such batch with a bare torch message.
"""
from typing import Any, Iterator, Optional, Tuple

from mmlinvit.utils.config_types import config_type_name

from .preflight import PreflightError, _iter_datasets

#: Pipeline transforms that fix the training crop, and the argument that holds it (mmseg's
#: ``RandomCrop``, mmpretrain's ``RandomResizedCrop``).
CROP_TRANSFORMS = {'RandomCrop': 'crop_size', 'RandomResizedCrop': 'scale'}


class PadSizeError(PreflightError, ValueError):
    """The data preprocessor pads training crops to a larger size."""


def _pair(size: Any) -> Tuple[int, int]:
    return (int(size), int(size)) if isinstance(size, (int, float)) else (int(size[0]),
                                                                           int(size[1]))


def _preprocessors(cfg: Any) -> Iterator[Tuple[str, dict]]:
    """(location, config) of the preprocessor(s) that will run: the model's own (mmengine's
    ``Runner`` gives a model config without ``data_preprocessor`` the top-level one), else,
    for a distillation model without one, its student's (which it reuses)."""
    model = cfg.get('model', None)
    if not isinstance(model, dict):
        return
    if 'data_preprocessor' not in model and isinstance(cfg.get('data_preprocessor', None),
                                                           dict):
        yield 'data_preprocessor', cfg['data_preprocessor']
    elif isinstance(model.get('data_preprocessor'), dict):
        yield 'model.data_preprocessor', model['data_preprocessor']
    elif isinstance(model.get('student'), dict) and \
            isinstance(model['student'].get('data_preprocessor'), dict):
        yield 'model.student.data_preprocessor', model['student']['data_preprocessor']


def _train_crops(cfg: Any) -> Iterator[Tuple[str, Tuple[int, int]]]:
    loader = cfg.get('train_dataloader', None) or {}
    for dataset, where in _iter_datasets(loader.get('dataset', None), 'train_dataloader.dataset'):
        for i, transform in enumerate(dataset.get('pipeline', None) or []):
            if not isinstance(transform, dict):
                continue
            key = CROP_TRANSFORMS.get(config_type_name(transform.get('type')))
            if key is not None and transform.get(key) is not None:
                yield f'{where}.pipeline[{i}].{key}', _pair(transform[key])


def find_pad_size_problem(cfg: Any) -> Optional[str]:
    """Describes a preprocessor ``size`` other than the training crop, or ``None``."""
    crops = list(_train_crops(cfg))
    for where, preprocessor in _preprocessors(cfg):
        if preprocessor.get('size') is None:
            continue
        size = _pair(preprocessor['size'])
        for crop_where, crop in crops:
            if crop[0] < size[0] or crop[1] < size[1]:
                factor = size[0] * size[1] / (crop[0] * crop[1])
                return (f'{where}.size={size} pads every {crop} training crop '
                        f'({crop_where}) to {size}: {factor:.0f}x the pixels per step, mostly '
                        f'zero padding that the models then train on.\n    Fix: set the '
                        f'preprocessor to the crop, e.g. --cfg-options {where}.size="{crop}" '
                        f'(mmseg configs use data_preprocessor = dict(size=crop_size)).')
            if crop_where.endswith('.crop_size') and (crop[0] > size[0] or crop[1] > size[1]):
                return (f'{where}.size={size} is smaller than the {crop} training crop '
                        f'({crop_where}): batches are padded to {size} only, so crops of '
                        f'images smaller than {crop} keep their own sizes and the first such '
                        f'batch stops with "stack expects each tensor to be equal size".\n'
                        f'    Fix: set the preprocessor to the crop, e.g. --cfg-options '
                        f'{where}.size="{crop}" (mmseg configs use data_preprocessor = '
                        f'dict(size=crop_size)).')
    return None
