"""Pre-flight checks that the parts of an inherited config still agree with each other.

A config that inherits a recipe and overrides a few keys keeps everything else at the base's
value, including values the base derived from the keys the child changed (mmengine evaluates
a base's variables inside the base).  Some of the disagreements train without a word and
report wrong numbers; others crash hours later.  Checked before the runner is built:

errors (:class:`ConfigConsistencyError`):
  * a head's ``num_classes`` differs from the number of classes of the training or validation
    set (a Mask2Former child that set only the top-level ``num_classes``; a 150-way ADE20K head
    on a 21-class data set; a 1000-way ImageNet head on an image folder of 2 class
    sub-folders): mIoU / accuracy over the wrong classes, or an out-of-range target;
  * a validation set read with another ``reduce_zero_label`` than the training set (a child
    that re-states only part of the ADE20K base's validation set): every label scored against
    its neighbour class;
  * a segmentation preprocessor that pads label maps with a ``seg_pad_val`` the heads do not
    ignore (padding trained as a class, or an out-of-range target);
  * a slide test whose stride exceeds its crop, a top-k accuracy over fewer than k classes
    (both stop the first validation; a head's own ``cal_acc`` top-k, the first iteration);
  * a MaskFormer / Mask2Former ``loss_cls.class_weight`` whose length is not ``num_classes + 1``
    (fails at iteration 1 with a bare torch message);
  * ``default_hooks.checkpoint.save_best`` names a metric the validation never reports
    (``KeyError`` at the first validation, 16k iterations in);
  * label maps holding labels beyond the head's classes, as mmseg's ``LoadAnnotations`` hands
    them on (after ``reduce_zero_label`` and a class subset's ``label_map``; Cityscapes label
    ids under the train-id name): an out-of-range target in training, a silently wrong mIoU in evaluation
    (also checked by ``tools/test.py``: :func:`label_range_problems`);
warnings (logged; the run goes on):
  * ``reduce_zero_label=True`` on a data set type whose own default is ``False`` (a custom
    ``BaseSegDataset`` under the ADE20K base: label 0 becomes "ignore", every class moves
    down by one);
  * file-decoded images (``LoadImageFromFile``, BGR) reaching an RGB-trained model with the
    preprocessor's channel swap off;
  * a top-level ``crop_size`` that no training crop uses;
  * ``reduce_zero_label=True`` read from 0-based label maps in any data set the run reads;
  * an evaluator that ignores other labels than the heads (void pixels scored as a class);
  * a scheduler that ends after the run, or a warm-up as long as the run (epoch loops too:
    an iteration-unit warm-up against max_epochs x the batches of the counted training set);
  * backbone blocks after the last ``out_indices`` entry that train but never get a gradient.
Each message names the config key and the fix.
"""
import importlib
import logging
import os
from typing import Any, Iterator, List, Optional, Tuple

from mmengine.fileio import list_from_file
from mmengine.logging import print_log

from mmlinvit.utils.config_types import config_type_name

from .preflight import PreflightError, _iter_datasets, _type_scope


class ConfigConsistencyError(PreflightError, ValueError):
    """Parts of a config disagree in a way that trains or evaluates the wrong thing."""


#: Metric names each evaluator reports, by evaluator type (scope removed).
def _metric_keys(evaluator: dict) -> Optional[List[str]]:
    kind = config_type_name(evaluator.get('type'))
    if kind == 'IoUMetric':  # mmseg's total_area_to_metrics: what each metric adds
        adds = {'mIoU': ['mIoU', 'mAcc'], 'mDice': ['mDice', 'mAcc'],
                'mFscore': ['mFscore', 'mPrecision', 'mRecall']}
        metrics = evaluator.get('iou_metrics', ['mIoU'])
        if isinstance(metrics, str):  # mmseg takes one name as well as a list
            metrics = [metrics]
        keys = ['aAcc']
        for metric in metrics:
            keys += [k for k in adds.get(metric, [metric]) if k not in keys]
        prefix = evaluator.get('prefix', None)  # mmengine's BaseMetric renames every key
        return [f'{prefix}/{k}' for k in keys] if prefix else keys
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
        kind = config_type_name(node.get('type'))
        if 'num_classes' in node and isinstance(kind, str) and kind.endswith('Head'):
            yield where, node


def _dataset_class(type_name: Any) -> Optional[type]:
    """The registered dataset class of a config ``type`` (mmseg's or mmpretrain's)."""
    if not isinstance(type_name, str):
        return type_name if isinstance(type_name, type) else None
    name = config_type_name(type_name)
    for package in ('mmseg.datasets', 'mmpretrain.datasets'):  # fill the registries
        importlib.import_module(package)
    from mmpretrain.registry import DATASETS as CLS_DATASETS
    from mmseg.registry import DATASETS as SEG_DATASETS
    scope = _type_scope(type_name)
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
    if isinstance(metainfo.get('classes'), str):
        # mmengine's BaseDataset reads a string meta value as a file of names (list_from_file)
        path = metainfo['classes']
        return (len(list_from_file(path)), f'metainfo.classes file {path!r}') \
            if os.path.isfile(path) else None
    if metainfo.get('classes'):
        return len(metainfo['classes']), 'metainfo.classes'
    classes = dataset.get('classes', None)  # mmpretrain's argument: names or a file of names
    if isinstance(classes, (list, tuple)) and classes:
        return len(classes), 'classes'
    if isinstance(classes, str):
        path = os.path.expanduser(classes)  # as mmpretrain's BaseDataset reads it
        if not os.path.isfile(path):
            return None
        # every line a class, blank ones too (mmengine's list_from_file, as mmpretrain reads it)
        return len(list_from_file(path)), f'classes file {classes!r}'
    cls = _dataset_class(dataset.get('type'))
    classes = (getattr(cls, 'METAINFO', None) or {}).get('classes') if cls else None
    if classes:
        return len(classes), f'{cls.__name__}.METAINFO'
    return _folder_classes(dataset, cls)


def _folder_classes(dataset: dict, cls: Optional[type]) -> Optional[Tuple[int, str]]:
    """Classes of an mmpretrain ``CustomDataset`` without ``ann_file``: its sub-folders
    (mmpretrain's ``find_folders``: every directory under the image folder, sorted)."""
    import os.path as osp
    try:
        from mmpretrain.datasets import CustomDataset
    except ImportError:  # mmpretrain is part of the stack; a partial install checks nothing
        return None
    if (cls is None or not issubclass(cls, CustomDataset) or dataset.get('ann_file')
            or dataset.get('with_label', True) is False):
        return None
    prefix = dataset.get('data_prefix', '') or ''
    if isinstance(prefix, dict):
        prefix = prefix.get('img_path', '') or ''
    root = dataset.get('data_root', '') or ''
    folder = prefix if osp.isabs(prefix) or not root else osp.join(root, prefix)
    if not folder or not osp.isdir(folder):
        return None
    with os.scandir(folder) as entries:
        count = sum(1 for entry in entries if entry.is_dir())
    return (count, f'sub-folders of {folder!r}') if count else None


def _class_count_problems(cfg: Any, mode: str = 'train') -> List[str]:
    """Heads whose ``num_classes`` is not the class count of a data set the run reads (the
    training set, and the validation set when it validates; the test set for ``'test'``)."""
    from .preflight import _checked_loaders
    counted = []
    for name, loader in _checked_loaders(cfg, mode):
        for dataset, where in _iter_datasets(loader.get('dataset', None), f'{name}.dataset'):
            count = _dataset_classes(dataset)
            if count is not None:
                counted.append((dataset, where, count))
    problems = []
    for where, head in _heads(cfg.get('model', None)):
        n = head['num_classes']
        if '.teacher' in where:
            continue
        for dataset, data_where, count in counted:
            if n == count[0]:
                continue
            scored = ('trained and scored' if data_where.startswith('train_dataloader')
                      else 'scored')
            problems.append(
                f'{where}.num_classes={n}, but {data_where} (type '
                f'{config_type_name(dataset.get("type"))}) has {count[0]} classes ({count[1]}): '
                f'the head would be {scored} over the wrong classes. Fix: set '
                f'{where}.num_classes={count[0]} (re-state the head in the config: a base\'s '
                f'top-level num_classes variable is evaluated in the base), or give the data set '
                f'its classes (metainfo=dict(classes=...)) and type')
        loss_cls = head.get('loss_cls', None)
        weight = loss_cls.get('class_weight', None) if isinstance(loss_cls, dict) else None
        if (config_type_name(head.get('type')) in ('MaskFormerHead', 'Mask2FormerHead')
                and isinstance(weight, (list, tuple)) and len(weight) != n + 1):
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


def _evaluation_problems(cfg: Any, mode: str) -> List[str]:
    """Evaluation settings that stop the run at its first validation (or ``tools/test.py``):
    a slide window whose stride exceeds its crop (mmseg asserts on the pixels no window
    covers) and a top-k accuracy over fewer classes than k."""
    problems = []
    validates = (cfg.get('val_cfg', None) is not None and cfg.get('val_dataloader', None)) \
        if mode == 'train' else True
    if not validates:
        return problems
    for where, node in _walk(cfg.get('model', None), 'model'):
        test_cfg = node.get('test_cfg', None)
        if not isinstance(test_cfg, dict) or test_cfg.get('mode', None) != 'slide':
            continue
        crop, stride = test_cfg.get('crop_size', None), test_cfg.get('stride', None)
        if crop is None or stride is None:
            continue
        from .pad_size_check import _pair
        if any(s > c for s, c in zip(_pair(stride), _pair(crop))):
            problems.append(
                f'{where}.test_cfg.stride={tuple(_pair(stride))} is larger than its crop_size='
                f'{tuple(_pair(crop))}: the slide windows leave pixels no window covers, and '
                f'mmseg stops at the first validation / test. Fix: {where}.test_cfg.stride='
                f'{tuple(c * 2 // 3 for c in _pair(crop))} (2 / 3 of the crop, as mmseg\'s '
                f'configs)')
    counts = {head['num_classes'] for where, head in _heads(cfg.get('model', None))
              if '.teacher' not in where}
    if len(counts) != 1:
        return problems
    num_classes = counts.pop()
    key = 'val_evaluator' if mode == 'train' else 'test_evaluator'
    evaluator = cfg.get(key, None) or []
    for i, metric in enumerate(evaluator if isinstance(evaluator, (list, tuple)) else [evaluator]):
        if not isinstance(metric, dict) or config_type_name(metric.get('type')) != 'Accuracy':
            continue
        topk = metric.get('topk', (1, ))
        topk = [topk] if isinstance(topk, int) else list(topk)
        if max(topk) > num_classes:
            where = key if not isinstance(evaluator, (list, tuple)) else f'{key}[{i}]'
            defined = tuple(k for k in topk if k <= num_classes) or (1, )
            problems.append(
                f'{where}.topk={tuple(topk)} but the model has {num_classes} classes: top-'
                f'{max(topk)} accuracy is undefined and mmpretrain stops at the first '
                f'evaluation. Fix: --cfg-options {where}.topk="{defined}"')
    return problems


def _training_accuracy_problems(cfg: Any) -> List[str]:
    """A classification head that reports training accuracy (``cal_acc=True``) over a
    ``topk`` beyond its classes: mmpretrain's ``Accuracy.calculate`` raises at the first
    training iteration."""
    problems = []
    for where, head in _heads(cfg.get('model', None)):
        if '.teacher' in where or not head.get('cal_acc', False):
            continue
        topk = head.get('topk', (1, ))
        if isinstance(topk, int):  # ClsHead passes it on to Accuracy.calculate, which iterates
            fix = topk if topk <= head['num_classes'] else 1
            problems.append(
                f'{where}.topk={topk} with cal_acc=True: mmpretrain\'s head hands the int to '
                f'Accuracy.calculate, which takes a sequence, and stops at the first iteration '
                f'(TypeError: \'int\' object is not iterable). Fix: --cfg-options '
                f'{where}.topk="({fix},)" (or {where}.cal_acc=False)')
            continue
        topk = list(topk)
        if max(topk) > head['num_classes']:
            defined = tuple(k for k in topk if k <= head['num_classes']) or (1, )
            problems.append(
                f'{where}.topk={tuple(topk)} with cal_acc=True but the head has '
                f'{head["num_classes"]} classes: top-{max(topk)} training accuracy is '
                f'undefined and mmpretrain stops at the first iteration. Fix: --cfg-options '
                f'{where}.topk="{defined}" (or {where}.cal_acc=False)')
    return problems


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
    # mmengine's CheckpointHook reads ['auto'] (it allows 'auto' only alone) as 'auto'
    missing = [k for k in wanted if k != 'auto' and k not in keys]
    if not missing:
        return None
    suggestion = keys[1] if len(keys) > 1 else keys[0]
    return (f'default_hooks.checkpoint.save_best={save_best!r} names {missing}, which '
            f'val_evaluator ({config_type_name(evaluator.get("type"))}) does not report '
            f'(it reports {keys}): the run would stop with KeyError at the first validation. Fix: '
            f'--cfg-options default_hooks.checkpoint.save_best={suggestion} (or save_best=auto)')


#: Label maps read to see whether labels run up to the class count (1-based labels).
LABEL_SAMPLE = 32
#: Label maps read before the ``reduce_zero_label`` warning says the last class is missing
#: (a class absent from the first sample may only be rare).
LABEL_CONFIRM_SAMPLE = 512


def _sampled_labels(dataset: dict, scope: Optional[str],
                    limit: int = LABEL_SAMPLE) -> Optional[Tuple[set, Any]]:
    """(labels in a sample of the data set's label maps, the lazily built data set), if the
    maps are readable.

    Args:
        dataset: The data set config.
        scope: The config's ``default_scope``.
        limit: At most this many maps, evenly spaced over the sorted file list.
    """
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
    step = max(-(-len(files) // limit), 1)  # ceil: the sample spans the whole list
    labels = set()
    for name in files[::step][:limit]:
        try:
            with Image.open(osp.join(folder, name)) as label_map:
                values = np.unique(np.asarray(label_map))
        except (OSError, ValueError):  # unreadable: --check-data / the loader report it
            continue
        labels.update(int(v) for v in values)
    return labels, ds


def _max_label(dataset: dict, scope: Optional[str], limit: int = LABEL_SAMPLE) -> Optional[int]:
    """The largest label below 255 in a sample of at most ``limit`` of the data set's label
    maps, if readable."""
    found = _sampled_labels(dataset, scope, limit)
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


def _ignore_index_problems(cfg: Any, mode: str) -> Tuple[List[str], List[str]]:
    """(errors, warnings) about ignored labels: the segmentation preprocessor pads label maps
    with ``seg_pad_val``, which the heads must ignore (else padding is trained as a class, or
    an out-of-range target stops the run); an evaluator that ignores another label than the
    heads scores the void pixels the model never learnt as a class (84.31 mIoU where the
    predictions were right on every labelled pixel)."""
    ignored = {where: head.get('ignore_index', 255)
               for where, head in _heads(cfg.get('model', None)) if '.teacher' not in where}
    heads = set(ignored.values())
    pre = _preprocessor(cfg)
    errors, warnings = [], []
    if not heads or pre is None or config_type_name(pre[1].get('type')) != 'SegDataPreProcessor':
        return errors, warnings
    pad = pre[1].get('seg_pad_val', 255)
    if mode == 'train' and pad not in heads:
        errors.append(
            f'{pre[0]}.seg_pad_val={pad} is not a label the heads ignore (ignore_index '
            f'{sorted(heads)}): the padding of the label maps would be trained as class {pad} '
            f'(or stop the run with an out-of-range target). Fix: {pre[0]}.seg_pad_val='
            f'{min(heads)}')
    elif mode == 'train' and len(heads) > 1:  # every head is trained on the same label maps
        others = ', '.join(f'{where}.ignore_index={index}'
                           for where, index in ignored.items() if index != pad)
        errors.append(
            f'{pre[0]}.seg_pad_val={pad} is not a label every head ignores ({others}): '
            f'those heads train the padding (and the void label {pad}) as class {pad}, or '
            f'stop the run with an out-of-range target. Fix: ignore_index={pad} on every head')
    loaders = ('val_dataloader', ) if mode == 'train' else ('test_dataloader', )
    from .preflight import _checked_loaders
    for name, _ in _checked_loaders(cfg, mode):
        if name not in loaders:
            continue
        evaluator_key = 'val_evaluator' if name == 'val_dataloader' else 'test_evaluator'
        metric = _ignored_labels(cfg, name)
        if metric != heads:
            warnings.append(
                f'{evaluator_key} ignores label(s) {sorted(metric)} but the heads ignore '
                f'{sorted(heads)} (ignore_index): the metric scores pixels the model was never '
                f'trained on (or drops ones it was). Fix: {evaluator_key}.ignore_index='
                f'{min(heads)} (mmseg reads no data set ignore_index)')
    return errors, warnings


def label_range_problems(cfg: Any, mode: str) -> List[str]:
    """Label maps holding labels beyond the segmentation head's classes.

    A label ``>= num_classes`` (after ``reduce_zero_label`` and a class subset's
    ``label_map``, as mmseg's ``LoadAnnotations`` applies them) that mmseg does not ignore (the
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
            if found is None:
                continue  # unreadable: --check-data / the loader report it
            labels, ds = found
            ignored = _ignored_labels(cfg, name)
            reduce = bool(getattr(ds, 'reduce_zero_label', False))
            # a class subset: mmseg's LoadAnnotations maps each label after reduce_zero_label
            label_map = dict(getattr(ds, 'label_map', None) or {})

            def trained(value: int) -> int:
                label = _trained_label(value, reduce)
                return label_map.get(label, label)

            def beyond_classes(values: set) -> List[int]:
                return sorted(v for v in values if trained(v) not in ignored
                              and trained(v) >= num_classes)

            beyond, sampled = beyond_classes(labels), LABEL_SAMPLE
            default = _reduce_zero_label_default(dataset)
            against_default = not reduce and default is not None and default[1] is True
            if not beyond and against_default:
                # reduce_zero_label=False on a 1-based type (ADE20K, Pascal Context 59...):
                # its last class N may be rare, and Mask2Former trains label N silently as
                # its no-object class
                again = _sampled_labels(dataset, cfg.get('default_scope', None),
                                        LABEL_CONFIRM_SAMPLE)
                beyond, sampled = beyond_classes(again[0] if again else set()), \
                    LABEL_CONFIRM_SAMPLE
            if not beyond:
                continue
            kind = config_type_name(dataset.get('type'))
            hint = ('these look like Cityscapes label ids (0..33), not train ids (0..18): '
                    'generate the *_gtFine_labelTrainIds.png files with mmseg\'s '
                    'tools/dataset_converters/cityscapes.py (cityscapesscripts) and keep '
                    'seg_map_suffix=\'_gtFine_labelTrainIds.png\''
                    if kind == 'CityscapesDataset' else
                    f'set the head\'s num_classes to the data\'s class count, give the data set '
                    f'its classes and reduce_zero_label (now {reduce}), or, for a void label, '
                    f'set ignore_index on the heads (training) and the evaluator (metric); '
                    f'now {sorted(ignored)}')
            if against_default:
                hint = (f'{kind}\'s default is reduce_zero_label=True (label 0 unlabelled, '
                        f'classes 1..{num_classes}), which {where}.reduce_zero_label=False '
                        f'turns off: set it to True; else {hint}')
            problems.append(
                f'{where} ({kind}): its label maps hold label(s) {beyond[:8]} (in up to '
                f'{sampled} sampled maps{", after reduce_zero_label" if reduce else ""}) '
                f'but the model has {num_classes} classes: training stops with an out-of-range '
                f'target (a Mask2Former head trains label {num_classes} silently as its '
                f'no-object class), evaluation silently drops or misreads them. Fix: {hint}')
    return problems


def _reduce_zero_label_default(dataset: dict) -> Optional[Tuple[type, Any]]:
    """(data set class, its ``reduce_zero_label`` default), or None when the type is unknown
    or takes no such argument."""
    import inspect
    cls = _dataset_class(dataset.get('type'))
    if cls is None:
        return None
    # mmseg's COCOStuff / Cityscapes / PascalVOC / Synapse... data sets take **kwargs and pass
    # reduce_zero_label on to BaseSegDataset: its default is theirs
    for klass in cls.__mro__:
        init = klass.__dict__.get('__init__')
        if init is None:
            continue
        params = inspect.signature(init).parameters
        if 'reduce_zero_label' in params:
            return cls, params['reduce_zero_label'].default
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return None  # the argument is not passed on
    return None


def _reduce_zero_label(dataset: dict) -> Optional[bool]:
    """A segmentation data set's ``reduce_zero_label``: the config's, else its type's default
    (None when the type takes no such argument)."""
    found = _reduce_zero_label_default(dataset)
    if found is None:
        return None
    value = dataset.get('reduce_zero_label', found[1])
    return bool(value)  # mmseg's LoadAnnotations reads it by truth value (None: False)


def _reduce_zero_label_problems(cfg: Any, mode: str) -> List[str]:
    """Validation / test data read with another ``reduce_zero_label`` than the training set:
    a child that re-states the training set but only part of the validation set keeps the
    ADE20K base's ``True`` there, and every label is scored against the class below it
    (perfect predictions: 0.00 mIoU)."""
    if mode != 'train':
        return []
    from .preflight import _checked_loaders
    found = {}
    for name, loader in _checked_loaders(cfg, mode):
        for dataset, where in _iter_datasets(loader.get('dataset', None), f'{name}.dataset'):
            value = _reduce_zero_label(dataset)
            if value is not None:
                found[where] = value
    train = {w: v for w, v in found.items() if w.startswith('train_dataloader')}
    if len(set(train.values())) != 1:
        return []
    value = next(iter(train.values()))
    return [f'{where}.reduce_zero_label={other} but the training set ({next(iter(train))}) '
            f'reads its labels with reduce_zero_label={value}: every label would be scored '
            f'against {"the class below" if other else "the class above"} the one the model '
            f'learnt for it. Fix: {where}.reduce_zero_label={value} (a base\'s value stays '
            f'unless the child re-states it; the test set too)'
            for where, other in found.items() if where not in train and other != value]


def _reduce_zero_label_warnings(cfg: Any, mode: str) -> List[str]:
    """The label-based ``reduce_zero_label`` warning for the training set (a validation set
    with another value is an error, the same value is covered by the training set's) or, in
    ``'test'`` mode, the test set."""
    from .preflight import _checked_loaders, _dataset_key
    warnings, seen = [], set()
    for name, loader in _checked_loaders(cfg, mode):
        if name == 'val_dataloader':
            continue
        for dataset, where in _iter_datasets(loader.get('dataset', None), f'{name}.dataset'):
            if _dataset_key(dataset) in seen:
                continue
            seen.add(_dataset_key(dataset))
            warning = _reduce_zero_label_warning(cfg, dataset, where)
            if warning:
                warnings.append(warning)
    return warnings


def _reduce_zero_label_warning(cfg: Any, dataset: dict, where: str) -> Optional[str]:
    if dataset.get('reduce_zero_label', None) is not True:
        return None
    found = _reduce_zero_label_default(dataset)
    if found is None or found[1] is not False:
        return None
    cls = found[0]
    count = _dataset_classes(dataset)
    scope = cfg.get('default_scope', None)
    top = _max_label(dataset, scope)
    if count is None or top is None or top >= count[0]:
        return None  # no label maps to read, or labels run 1..N as reduce_zero_label assumes
    top = _max_label(dataset, scope, LABEL_CONFIRM_SAMPLE)  # the last class may only be rare
    if top is None or top >= count[0]:
        return None
    seen = (f'; no label {count[0]} (the last class when classes are labelled 1..{count[0]}) in '
            f'up to {LABEL_CONFIRM_SAMPLE} of its label maps, the largest is {top}, as 0-based '
            f'labels (0..{count[0] - 1}) would give')
    return (f'{where}.reduce_zero_label=True on a {cls.__name__} (whose default is False; '
            f'the ADE20K bases set True){seen}. It reads label 0 as "ignore" and moves every '
            f'other label down by one: right when label 0 means unlabelled and the classes are '
            f'1..N (ADE20K\'s convention; then class {count[0]} is only absent from these '
            f'maps), wrong for 0-based labels (e.g. COCO-Stuff 164k, Cityscapes '
            f'*_labelTrainIds, Pascal VOC), which need {where}.reduce_zero_label=False (and in '
            f'the other data sets).')


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
    loads_files = any(isinstance(t, dict) and config_type_name(t.get('type')) == 'LoadImageFromFile'
                      for t in pipeline)
    # mmpretrain's ClsDataPreprocessor (the type ImageClassifier gives an untyped one) reads
    # to_rgb; mmseg's / mmengine's read bgr_to_rgb
    classifier = config_type_name(pre[1].get('type')) in ('', 'ClsDataPreprocessor')
    key = 'bgr_to_rgb' if 'bgr_to_rgb' in pre[1] else \
        'to_rgb' if 'to_rgb' in pre[1] or classifier else 'bgr_to_rgb'
    # unset is no swap too: the default of mmseg's, mmpretrain's and mmengine's preprocessors
    if not loads_files or pre[1].get(key, False) is not False:
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


def _epoch_loop_iterations(cfg: Any, train_samples: Optional[int]) -> Optional[int]:
    """Iterations of an epoch-based run: max_epochs x batches per epoch (the training set's
    ``train_samples`` over batch size x processes), or None when unknown."""
    train_cfg = cfg.get('train_cfg', None) or {}
    loader = cfg.get('train_dataloader', None) or {}
    epochs, batch = train_cfg.get('max_epochs', None), loader.get('batch_size', None)
    if not train_samples or not isinstance(epochs, int) or not isinstance(batch, int) \
            or batch <= 0 or train_cfg.get('max_iters', None) is not None:
        return None
    world = int(os.environ.get('WORLD_SIZE', '1') or 1)
    per_rank = -(-train_samples // world)  # mmengine's DefaultSampler pads to equal shares
    per_epoch = (per_rank // batch) if loader.get('drop_last', False) else -(-per_rank // batch)
    return epochs * per_epoch if per_epoch else None


def _schedule_warnings(cfg: Any, train_samples: Optional[int] = None) -> List[str]:
    train_cfg = cfg.get('train_cfg', None) or {}
    schedulers = cfg.get('param_scheduler', None) or []
    if isinstance(schedulers, dict):
        schedulers = [schedulers]
    warnings = []
    run_iters = _epoch_loop_iterations(cfg, train_samples)
    limits = [(False, 'max_iters', train_cfg.get('max_iters', None)),
              (True, 'max_epochs', train_cfg.get('max_epochs', None))]
    if run_iters is not None:  # iteration-unit schedulers of an epoch loop (warm-ups)
        limits.append((False, f'max_epochs={train_cfg["max_epochs"]} x '
                       f'{run_iters // train_cfg["max_epochs"]} iterations per epoch '
                       f'({train_samples} training samples) =', run_iters))
    for by_epoch, limit_key, limit in limits:
        if not isinstance(limit, (int, float)):
            continue
        for i, sched in enumerate(schedulers):
            if not isinstance(sched, dict) or bool(sched.get('by_epoch', True)) != by_epoch:
                continue
            end = sched.get('end', None)
            begin = sched.get('begin', 0)
            if isinstance(end, (int, float)) and end > limit:
                warnings.append(
                    f'param_scheduler[{i}] ({config_type_name(sched.get("type"))}) ends at '
                    f'{end} but {_limit_text(limit_key, limit)}: the run stops before its '
                    f'schedule does (the learning rate never reaches its end value). Fix: re-state '
                    f'param_scheduler with end={limit} (base variables are evaluated in the '
                    f'base{EPOCH_FORM if "=" in limit_key else ""}).')
            elif isinstance(begin, (int, float)) and begin >= limit:
                warnings.append(
                    f'param_scheduler[{i}] ({config_type_name(sched.get("type"))}) begins at '
                    f'{begin}, at or after {_limit_text(limit_key, limit)}: it never runs (the '
                    f'whole run is warm-up). Fix: re-state param_scheduler for {limit}.')
    return warnings


#: The other fix of an iteration-unit scheduler in an epoch loop.
EPOCH_FORM = '; or count it in epochs: by_epoch=True, convert_to_iter_based=True'


def _limit_text(limit_key: str, limit: Any) -> str:
    """``train_cfg.max_iters=N``, or the estimate of an epoch loop's iterations."""
    if '=' in limit_key:
        return f'{limit_key} {limit} iterations'
    return f'train_cfg.{limit_key}={limit}'


def _unused_blocks_warning(cfg: Any) -> Optional[str]:
    model = cfg.get('model', None) or {}
    backbone = model.get('backbone', None)
    if not isinstance(backbone, dict):
        return None
    kind = config_type_name(backbone.get('type'))
    scope = _type_scope(backbone.get('type')) or cfg.get('default_scope', None)
    out_indices = backbone.get('out_indices', None)
    # mmlinvit's backbones only: mmseg's / mmpretrain's VisionTransformer read other arguments
    if scope not in (None, 'mmlinvit') or kind not in ('VisionTransformer', 'LinearVisionTransformer',
                                            'Adventurer') or not \
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


def check_config_consistency(cfg: Any, train_samples: Optional[int] = None) -> None:
    """Raises on disagreements that train or evaluate the wrong thing, logs the rest.

    Args:
        cfg: The prepared training config.
        train_samples: Samples of the training set, if counted (epoch loops: iteration-unit
            schedulers are compared with the run's iterations).

    Raises:
        ConfigConsistencyError: listing every error found.
    """
    errors = _class_count_problems(cfg)
    errors += [p for p in (_batch_augment_problem(cfg), _save_best_problem(cfg)) if p]
    errors += _reduce_zero_label_problems(cfg, 'train') + _evaluation_problems(cfg, 'train')
    errors += _training_accuracy_problems(cfg)
    ignore_errors, ignore_warnings = _ignore_index_problems(cfg, 'train')
    errors += ignore_errors
    errors += label_range_problems(cfg, 'train')
    if errors:
        lines = '\n'.join(f'  - {p}' for p in errors)
        raise ConfigConsistencyError(
            f'Cannot start: {len(errors)} part(s) of the config disagree (checked before '
            f'building the runner; nothing was trained):\n{lines}')
    warnings = [w for w in (_channel_order_warning(cfg), _crop_size_warning(cfg),
                            _unused_blocks_warning(cfg)) if w]
    warnings += _reduce_zero_label_warnings(cfg, 'train') + ignore_warnings
    warnings += _schedule_warnings(cfg, train_samples)
    for warning in warnings:
        print_log(f'Config check: {warning}', logger='current', level=logging.WARNING)


def check_test_config_consistency(cfg: Any) -> None:
    """The test-time part of :func:`check_config_consistency` (``tools/test.py``): head
    classes vs the test set's, label maps beyond the head's classes, and (warnings) the
    test set's ``reduce_zero_label`` and the evaluator's ignored labels.

    Args:
        cfg: The prepared test config.

    Raises:
        ConfigConsistencyError: listing every error found.
    """
    errors = _class_count_problems(cfg, 'test') + _evaluation_problems(cfg, 'test')
    errors += label_range_problems(cfg, 'test')
    if errors:
        lines = '\n'.join(f'  - {p}' for p in errors)
        raise ConfigConsistencyError(f'Cannot evaluate:\n{lines}')
    warnings = _reduce_zero_label_warnings(cfg, 'test') + _ignore_index_problems(cfg, 'test')[1]
    for warning in warnings:
        print_log(f'Config check: {warning}', logger='current', level=logging.WARNING)
