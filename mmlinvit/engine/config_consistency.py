"""Pre-flight checks that the parts of an inherited config still agree with each other.

A config that inherits a recipe and overrides a few keys keeps everything else at the base's
value, including values the base derived from the keys the child changed (mmengine evaluates
a base's variables inside the base).  Some of the disagreements train without a word and
report wrong numbers; others crash hours later.  Checked before the runner is built:

errors (:class:`ConfigConsistencyError`):
  * a head's ``num_classes`` differs from the number of classes of the training set (a
    Mask2Former child that set only the top-level ``num_classes``; a 150-way ADE20K head on a
    21-class data set): mIoU / accuracy over the wrong classes, or an out-of-range target;
  * a Mask2Former ``loss_cls.class_weight`` whose length is not ``num_classes + 1``
    (fails at iteration 1 with a bare torch message);
  * ``default_hooks.checkpoint.save_best`` names a metric the validation never reports
    (``KeyError`` at the first validation, 16k iterations in);
  * label maps holding labels beyond the head's classes (Cityscapes label ids under the
    train-id name): an out-of-range target in training, a silently wrong mIoU in evaluation
    (also checked by ``tools/test.py``: :func:`label_range_problems`);
warnings (logged; the run goes on):
  * ``reduce_zero_label=True`` on a data set type whose own default is ``False`` (a custom
    ``BaseSegDataset`` under the ADE20K base: label 0 becomes "ignore", every class moves
    down by one);
  * file-decoded images (``LoadImageFromFile``, BGR) reaching an RGB-trained model with the
    preprocessor's channel swap off;
  * a top-level ``crop_size`` that no training crop uses;
  * a scheduler that ends after the run, or a warm-up as long as the run;
  * backbone blocks after the last ``out_indices`` entry that train but never get a gradient.
Each message names the config key and the fix.
"""
import importlib
import logging
import os
from typing import Any, Iterator, List, Optional, Tuple

from mmengine.logging import print_log

from .preflight import PreflightError, _iter_datasets, _strip_scope


class ConfigConsistencyError(PreflightError, ValueError):
    """Parts of a config disagree in a way that trains or evaluates the wrong thing."""


#: Metric names each evaluator reports, by evaluator type (scope removed).
def _metric_keys(evaluator: dict) -> Optional[List[str]]:
    kind = _strip_scope(evaluator.get('type'))
    if kind == 'IoUMetric':  # mmseg's total_area_to_metrics: what each metric adds
        adds = {'mIoU': ['mIoU', 'mAcc'], 'mDice': ['mDice', 'mAcc'],
                'mFscore': ['mFscore', 'mPrecision', 'mRecall']}
        keys = ['aAcc']
        for metric in evaluator.get('iou_metrics', ['mIoU']):
            keys += [k for k in adds.get(metric, [metric]) if k not in keys]
        return keys
    if kind == 'CityscapesMetric':
        return None  # format_only / external keys
    return None


def _walk(node: Any, where: str) -> Iterator[Tuple[str, dict]]:
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from _walk(value, f'{where}.{key}')
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _walk(value, f'{where}[{i}]')


def _heads(model: Any) -> Iterator[Tuple[str, dict]]:
    """(location, config) of every head with ``num_classes`` in the model config."""
    for where, node in _walk(model, 'model'):
        kind = _strip_scope(node.get('type'))
        if 'num_classes' in node and isinstance(kind, str) and kind.endswith('Head'):
            yield where, node


def _dataset_class(type_name: Any) -> Optional[type]:
    """The registered dataset class of a config ``type`` (mmseg's or mmpretrain's)."""
    if not isinstance(type_name, str):
        return type_name if isinstance(type_name, type) else None
    name = _strip_scope(type_name)
    for package in ('mmseg.datasets', 'mmpretrain.datasets'):  # fill the registries
        importlib.import_module(package)
    from mmpretrain.registry import DATASETS as CLS_DATASETS
    from mmseg.registry import DATASETS as SEG_DATASETS
    scope = type_name.split('.')[0] if '.' in type_name else None
    registries = {'mmseg': [SEG_DATASETS], 'mmpretrain': [CLS_DATASETS]}.get(
        scope, [SEG_DATASETS, CLS_DATASETS])
    for registry in registries:
        cls = registry.module_dict.get(name)
        if cls is not None:
            return cls
    return None


def _train_dataset(cfg: Any) -> Optional[Tuple[dict, str]]:
    loader = cfg.get('train_dataloader', None) or {}
    found = list(_iter_datasets(loader.get('dataset', None), 'train_dataloader.dataset'))
    return found[0] if found else None


def _dataset_classes(dataset: dict) -> Optional[Tuple[int, str]]:
    """(number of classes, where it comes from) of a dataset config, when the config says."""
    metainfo = dataset.get('metainfo', None) or {}
    if metainfo.get('classes'):
        return len(metainfo['classes']), 'metainfo.classes'
    classes = dataset.get('classes', None)  # mmpretrain's argument: names or a file of names
    if isinstance(classes, (list, tuple)) and classes:
        return len(classes), 'classes'
    if isinstance(classes, str):
        if not os.path.isfile(classes):
            return None
        with open(classes) as f:
            return len([line for line in f if line.strip()]), f'classes file {classes!r}'
    cls = _dataset_class(dataset.get('type'))
    classes = (getattr(cls, 'METAINFO', None) or {}).get('classes') if cls else None
    if classes:
        return len(classes), f'{cls.__name__}.METAINFO'
    return None


def _class_count_problems(cfg: Any) -> List[str]:
    found = _train_dataset(cfg)
    problems = []
    count = _dataset_classes(found[0]) if found else None
    for where, head in _heads(cfg.get('model', None)):
        n = head['num_classes']
        if count is not None and n != count[0] and '.teacher' not in where:
            problems.append(
                f'{where}.num_classes={n}, but the training set ({found[1]}, type '
                f'{_strip_scope(found[0].get("type"))}) has {count[0]} classes ({count[1]}): '
                f'the head would be trained and scored over the wrong classes. Fix: set '
                f'{where}.num_classes={count[0]} (re-state the head in the config: a base\'s '
                f'top-level num_classes variable is evaluated in the base), or give the data set '
                f'its classes (metainfo=dict(classes=...)) and type')
        loss_cls = head.get('loss_cls', None)
        weight = loss_cls.get('class_weight', None) if isinstance(loss_cls, dict) else None
        if (_strip_scope(head.get('type')) == 'Mask2FormerHead' and isinstance(weight, list)
                and len(weight) != n + 1):
            problems.append(
                f'{where}.loss_cls.class_weight has {len(weight)} entries but num_classes={n} '
                f'needs {n + 1} (one per class and the no-object class; the run would stop at '
                f'iteration 1). Fix: {where}.loss_cls.class_weight=[1.0] * {n} + [0.1]')
    return problems


def _batch_augment_problem(cfg: Any) -> Optional[str]:
    """Mixup / CutMix one-hot labels of another width than the classification head's."""
    pre = _preprocessor(cfg)
    if pre is None:
        return None
    augmented = bool(pre[1].get('batch_augments', None)) or any(
        isinstance(node.get('train_cfg', None), dict) and node['train_cfg'].get('augments')
        for _, node in _walk(cfg.get('model', None), 'model'))
    width = pre[1].get('num_classes', None)
    if not augmented or width is None:
        return None
    for where, head in _heads(cfg.get('model', None)):
        if '.teacher' not in where and head['num_classes'] != width:
            return (f'{pre[0]}.num_classes={width} (the width of the one-hot labels that the '
                    f'batch augments, Mixup / CutMix, mix), but {where}.num_classes='
                    f'{head["num_classes"]}: the first step would stop on a shape mismatch. '
                    f'Fix: {pre[0]}.num_classes={head["num_classes"]}')
    return None


def _save_best_problem(cfg: Any) -> Optional[str]:
    hook = (cfg.get('default_hooks', None) or {}).get('checkpoint', None) or {}
    save_best = hook.get('save_best', None)
    evaluator = cfg.get('val_evaluator', None)
    if not save_best or save_best == 'auto' or not isinstance(evaluator, dict):
        return None
    keys = _metric_keys(evaluator)
    if keys is None:
        return None
    wanted = [save_best] if isinstance(save_best, str) else list(save_best)
    missing = [k for k in wanted if k not in keys and k.split('/')[-1] not in keys]
    if not missing:
        return None
    suggestion = keys[1] if len(keys) > 1 else keys[0]
    return (f'default_hooks.checkpoint.save_best={save_best!r} names {missing}, which '
            f'val_evaluator ({_strip_scope(evaluator.get("type"))}) does not report (it reports '
            f'{keys}): the run would stop with KeyError at the first validation. Fix: '
            f'--cfg-options default_hooks.checkpoint.save_best={suggestion} (or save_best=auto)')


#: Label maps read to see whether labels run up to the class count (1-based labels).
LABEL_SAMPLE = 32


def _sampled_labels(dataset: dict, scope: Optional[str]) -> Optional[Tuple[set, Any]]:
    """(labels in a sample of the data set's label maps, the lazily built data set), if the
    maps are readable."""
    import os.path as osp

    import numpy as np
    from PIL import Image

    from mmlinvit.datasets.pairing import _walk, build_lazy_dataset
    try:
        ds = build_lazy_dataset(dataset, scope)
    except Exception:  # noqa: BLE001 - the dataset is built (and its errors shown) later
        return None
    folder = (getattr(ds, 'data_prefix', None) or {}).get('seg_map_path')
    suffix = getattr(ds, 'seg_map_suffix', None)
    if not folder or not suffix or not osp.isdir(folder):
        return None
    files = [f for f in _walk(folder) if f.endswith(suffix)]
    step = max(len(files) // LABEL_SAMPLE, 1)
    labels = set()
    for name in files[::step][:LABEL_SAMPLE]:
        try:
            with Image.open(osp.join(folder, name)) as label_map:
                values = np.unique(np.asarray(label_map))
        except (OSError, ValueError):  # unreadable: --check-data / the loader report it
            continue
        labels.update(int(v) for v in values)
    return labels, ds


def _max_label(dataset: dict, scope: Optional[str]) -> Optional[int]:
    """The largest label below 255 in a sample of the data set's label maps, if readable."""
    found = _sampled_labels(dataset, scope)
    labels = (found[0] - {255}) if found else set()
    return max(labels) if labels else None


def _trained_label(value: int, reduce_zero_label: bool) -> int:
    """A label map value as mmseg's ``LoadAnnotations`` hands it on (``reduce_zero_label``:
    0 and 255 become 255, every other L becomes L - 1)."""
    if not reduce_zero_label:
        return value
    return 255 if value in (0, 255) else value - 1


def _ignored_labels(cfg: Any, loader_name: str) -> set:
    """The label values mmseg ignores for a loader's data: the heads' ``ignore_index`` (the
    loss; training data) or the evaluator's (the metric; validation / test data), 255 by
    default.  mmseg reads no data set ``ignore_index``."""
    if loader_name == 'train_dataloader':
        values = {head.get('ignore_index', 255) for where, head in
                  _heads(cfg.get('model', None)) if '.teacher' not in where}
    else:
        evaluator = cfg.get('val_evaluator' if loader_name == 'val_dataloader'
                            else 'test_evaluator', None) or {}
        metrics = evaluator if isinstance(evaluator, (list, tuple)) else [evaluator]
        values = {m.get('ignore_index', 255) for m in metrics if isinstance(m, dict)}
    return values or {255}


def label_range_problems(cfg: Any, mode: str) -> List[str]:
    """Label maps holding labels beyond the segmentation head's classes.

    A label ``>= num_classes`` (after ``reduce_zero_label``) that mmseg does not ignore (the
    heads' ``ignore_index`` for training data, the evaluator's for validation / test data)
    stops training with an out-of-range target, but evaluation drops or misreads it without a
    word: Cityscapes label ids (0..33) under the train-id name scored 50.0 mIoU where the
    predictions were half wrong.

    Args:
        cfg: The config.
        mode: ``'train'`` (train and val sets) or ``'test'`` (test set).

    Returns:
        One problem per data set, naming the labels, the class count and the fix.
    """
    from .preflight import _checked_loaders
    counts = {head['num_classes'] for where, head in _heads(cfg.get('model', None))
              if '.teacher' not in where}
    if len(counts) != 1:
        return []
    num_classes = counts.pop()
    problems = []
    for name, loader in _checked_loaders(cfg, mode):
        for dataset, where in _iter_datasets(loader.get('dataset', None), f'{name}.dataset'):
            found = _sampled_labels(dataset, cfg.get('default_scope', None))
            if found is None or getattr(found[1], 'label_map', None):
                continue  # unreadable, or remapped by the data set (a class subset)
            labels, ds = found
            ignored = _ignored_labels(cfg, name)
            reduce = bool(getattr(ds, 'reduce_zero_label', False))
            beyond = sorted(v for v in labels if _trained_label(v, reduce) not in ignored
                            and _trained_label(v, reduce) >= num_classes)
            if not beyond:
                continue
            kind = _strip_scope(dataset.get('type'))
            hint = ('these look like Cityscapes label ids (0..33), not train ids (0..18): '
                    'generate the *_gtFine_labelTrainIds.png files with mmseg\'s '
                    'tools/dataset_converters/cityscapes.py (cityscapesscripts) and keep '
                    'seg_map_suffix=\'_gtFine_labelTrainIds.png\''
                    if kind == 'CityscapesDataset' else
                    f'set the head\'s num_classes to the data\'s class count, give the data set '
                    f'its classes and reduce_zero_label (now {reduce}), or, for a void label, '
                    f'set ignore_index on the heads (training) and the evaluator (metric); '
                    f'now {sorted(ignored)}')
            problems.append(
                f'{where} ({kind}): its label maps hold label(s) {beyond[:8]} (in '
                f'{LABEL_SAMPLE} sampled maps{", after reduce_zero_label" if reduce else ""}) '
                f'but the model has {num_classes} classes: training stops with an out-of-range '
                f'target, evaluation silently drops or misreads them. Fix: {hint}')
    return problems


def _reduce_zero_label_warning(cfg: Any) -> Optional[str]:
    found = _train_dataset(cfg)
    if not found or found[0].get('reduce_zero_label', None) is not True:
        return None
    import inspect
    cls = _dataset_class(found[0].get('type'))
    if cls is None:
        return None
    param = inspect.signature(cls.__init__).parameters.get('reduce_zero_label')
    if param is None or param.default is not False:
        return None
    count = _dataset_classes(found[0])
    top = _max_label(found[0], cfg.get('default_scope', None))
    if count is None or top is None or top >= count[0]:
        return None  # no label maps to read, or labels run 1..N as reduce_zero_label assumes
    seen = (f'; no label {count[0]} (the last class when classes are labelled 1..{count[0]}) in '
            f'{LABEL_SAMPLE} of its label maps, the largest is {top}, as 0-based labels would '
            f'give')
    return (f'{found[1]}.reduce_zero_label=True on a {cls.__name__} (whose default is False; '
            f'the ADE20K bases set True){seen}. It reads label 0 as "ignore" and moves every '
            f'other label down by one: right when label 0 means unlabelled and the classes are '
            f'1..N (ADE20K\'s convention), wrong for 0-based labels, which need '
            f'{found[1]}.reduce_zero_label=False (and in the val / test sets).')


def _preprocessor(cfg: Any) -> Optional[Tuple[str, dict]]:
    model = cfg.get('model', None) or {}
    for where, node in (('model.data_preprocessor', model.get('data_preprocessor', None)),
                        ('data_preprocessor', cfg.get('data_preprocessor', None))):
        if isinstance(node, dict):
            return where, node
    student = model.get('student', None)
    if isinstance(student, dict) and isinstance(student.get('data_preprocessor', None), dict):
        return 'model.student.data_preprocessor', student['data_preprocessor']
    return None


def _channel_order_warning(cfg: Any) -> Optional[str]:
    found = _train_dataset(cfg)
    pre = _preprocessor(cfg)
    if not found or not pre:
        return None
    pipeline = found[0].get('pipeline', None) or []
    loads_files = any(isinstance(t, dict) and _strip_scope(t.get('type')) == 'LoadImageFromFile'
                      for t in pipeline)
    key = 'bgr_to_rgb' if 'bgr_to_rgb' in pre[1] else 'to_rgb'
    if not loads_files or pre[1].get(key, None) is not False:
        return None
    return (f'{pre[0]}.{key}=False while {found[1]} decodes image files (LoadImageFromFile '
            f'gives BGR): the models see BGR, but every backbone family mmlinvit loads (DeiT, '
            f'MAE, DINOv2, CLIP, Adventurer) was trained on RGB. Fix: {pre[0]}.{key}=True '
            f'(to_rgb=False is right only for data sets that yield RGB arrays, e.g. CIFAR).')


def _crop_size_warning(cfg: Any) -> Optional[str]:
    crop = cfg.get('crop_size', None)
    if crop is None:
        return None
    from .pad_size_check import _pair, _train_crops
    crops = list(_train_crops(cfg))
    if not crops or any(c == _pair(crop) for _, c in crops):
        return None
    used = ', '.join(f'{w}={c}' for w, c in crops[:2])
    return (f'the top-level crop_size={tuple(_pair(crop))} is not the training crop ({used}). '
            f'A base\'s variable is evaluated in the base: setting crop_size in a child changes '
            f'nothing. If the training crop should be {tuple(_pair(crop))}, re-state the '
            f'RandomCrop of train_pipeline, the data preprocessor size and the slide test_cfg '
            f'crop_size / stride; if {used} is right, crop_size is a leftover of the base.')


def _schedule_warnings(cfg: Any) -> List[str]:
    train_cfg = cfg.get('train_cfg', None) or {}
    schedulers = cfg.get('param_scheduler', None) or []
    if isinstance(schedulers, dict):
        schedulers = [schedulers]
    warnings = []
    for by_epoch, limit_key in ((False, 'max_iters'), (True, 'max_epochs')):
        limit = train_cfg.get(limit_key, None)
        if not isinstance(limit, (int, float)):
            continue
        for i, sched in enumerate(schedulers):
            if not isinstance(sched, dict) or bool(sched.get('by_epoch', True)) != by_epoch:
                continue
            end = sched.get('end', None)
            begin = sched.get('begin', 0)
            if isinstance(end, (int, float)) and end > limit:
                warnings.append(
                    f'param_scheduler[{i}] ({_strip_scope(sched.get("type"))}) ends at {end} but '
                    f'train_cfg.{limit_key}={limit}: the run stops before its schedule does (the '
                    f'learning rate never reaches its end value). Fix: re-state param_scheduler '
                    f'with end={limit} (base variables are evaluated in the base).')
            elif isinstance(begin, (int, float)) and begin >= limit:
                warnings.append(
                    f'param_scheduler[{i}] ({_strip_scope(sched.get("type"))}) begins at '
                    f'{begin}, at or after train_cfg.{limit_key}={limit}: it never runs (the '
                    f'whole run is warm-up). Fix: re-state param_scheduler for {limit}.')
    return warnings


def _unused_blocks_warning(cfg: Any) -> Optional[str]:
    model = cfg.get('model', None) or {}
    backbone = model.get('backbone', None)
    if not isinstance(backbone, dict):
        return None
    kind = _strip_scope(backbone.get('type'))
    out_indices = backbone.get('out_indices', None)
    if kind not in ('VisionTransformer', 'LinearVisionTransformer', 'Adventurer') or not \
            isinstance(out_indices, (list, tuple)) or not out_indices:
        return None
    arch = backbone.get('arch', 'b')
    if isinstance(arch, dict):
        depth = arch.get('num_layers', None)
    elif kind == 'Adventurer':
        from mmlinvit.backbones.adventurer import ADVENTURER_SIZES
        depth = ADVENTURER_SIZES.get(arch, {}).get('num_layers', None)
    else:
        from mmlinvit.backbones.arch_zoo import VIT_SIZES
        depth = VIT_SIZES.get(arch, {}).get('num_layers', None)
    if not depth:
        return None
    last = max(i % depth for i in out_indices)
    frozen = backbone.get('frozen_stages', -1)
    if last >= depth - 1 or (isinstance(frozen, int) and frozen >= depth):
        return None
    return (f'model.backbone.out_indices={list(out_indices)} ends at block {last} of a '
            f'{depth}-block {kind} (arch {arch!r}): blocks {last + 1}-{depth - 1} run at every '
            f'step, are trainable and never get a gradient (multi-GPU runs stop on unused '
            f'parameters). Fix: out_indices of this depth (e.g. the ViT-L segmentation '
            f'configs use [7, 11, 15, 23]).')


def check_config_consistency(cfg: Any) -> None:
    """Raises on disagreements that train or evaluate the wrong thing, logs the rest.

    Args:
        cfg: The prepared training config.

    Raises:
        ConfigConsistencyError: listing every error found.
    """
    errors = _class_count_problems(cfg)
    errors += [p for p in (_batch_augment_problem(cfg), _save_best_problem(cfg)) if p]
    errors += label_range_problems(cfg, 'train')
    if errors:
        lines = '\n'.join(f'  - {p}' for p in errors)
        raise ConfigConsistencyError(
            f'Cannot start: {len(errors)} part(s) of the config disagree (checked before '
            f'building the runner; nothing was trained):\n{lines}')
    warnings = [w for w in (_reduce_zero_label_warning(cfg), _channel_order_warning(cfg),
                            _crop_size_warning(cfg), _unused_blocks_warning(cfg)) if w]
    warnings += _schedule_warnings(cfg)
    for warning in warnings:
        print_log(f'Config check: {warning}', logger='current', level=logging.WARNING)
