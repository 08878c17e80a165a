"""Build-time check that a task-model student's own preprocessing is not silently dropped.

A :class:`~mmlinvit.models.distill.DistillationModel` preprocesses each batch once, with its
own ``data_preprocessor``, and hands the result to both teacher and student; the student's
``data_preprocessor`` (and an mmpretrain ``ImageClassifier``'s ``train_cfg.augments``, which
it turns into the preprocessor's ``batch_augments``) never runs.  mmengine's Runner fills
``model.data_preprocessor`` from a config's top-level ``data_preprocessor``, so a config that
sets Mixup / CutMix or other statistics on the student, as mmpretrain configs do on a plain
classifier, would train without them.  :func:`check_student_preprocessing` refuses that.
"""
from typing import Any, List, Optional, Union

import torch.nn as nn

from mmlinvit.utils.config_types import config_type_name

from .errors import DistillationConfigError


def _plain(cfg: Any) -> Any:
    """A config value as plain dicts / lists (mmengine ``ConfigDict`` -> ``dict``)."""
    if hasattr(cfg, 'to_dict'):
        cfg = cfg.to_dict()
    if isinstance(cfg, dict):
        return {key: _plain(value) for key, value in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [_plain(value) for value in cfg]
    return cfg


def _differences(student: dict, model: dict) -> List[str]:
    """``'key: student value != model value'`` for each setting the two configs disagree on.

    ``type`` is compared without its scope, and only when both configs name one.
    """
    found = []
    student_type = config_type_name(student.get('type'))
    model_type = config_type_name(model.get('type'))
    if student_type and model_type and student_type != model_type:
        found.append(f'type: {student_type} != {model_type}')
    for key in sorted((set(student) | set(model)) - {'type'}):
        if student.get(key) != model.get(key):
            found.append(f'{key}: {student.get(key)!r} != {model.get(key)!r}')
    return found


def check_student_preprocessing(student_cfg: Any,
                                data_preprocessor: Optional[Union[dict, nn.Module]]) -> None:
    """Refuses student preprocessing settings that the distillation model would not use.

    Args:
        student_cfg: Config of the student (a task model or a bare backbone).
        data_preprocessor: The distillation model's ``data_preprocessor`` argument (``None``:
            the student's own preprocessor is used, so nothing is dropped).

    Raises:
        DistillationConfigError: when ``data_preprocessor`` is set and the student config
            sets a different ``data_preprocessor`` or sets ``train_cfg`` batch augments
            (Mixup, CutMix) that ``data_preprocessor`` does not have.  The message names the
            differing settings and where to put them.
    """
    if data_preprocessor is None or not isinstance(_plain(student_cfg), dict):
        return
    student = _plain(student_cfg)
    own = student.get('data_preprocessor')
    train_augments = (student.get('train_cfg')
                      if isinstance(student.get('train_cfg'), dict) and
                      'augments' in student['train_cfg'] else None)
    if own is None and train_augments is None:
        return
    where = ('model.data_preprocessor (mmengine fills it from the top-level data_preprocessor '
             'of the config)')
    if isinstance(data_preprocessor, nn.Module):
        raise DistillationConfigError(
            f'the student config sets its own preprocessing ('
            f'{"data_preprocessor" if own is not None else "train_cfg.augments"}), but '
            f'DistillationModel preprocesses every batch once, for teacher and student, with '
            f'the {type(data_preprocessor).__name__} module it was given, so the student\'s '
            f'would never run. Remove it from model.student and configure that module instead.')
    model = _plain(data_preprocessor)
    problems = []
    if own is not None:
        # mmpretrain's ImageClassifier: data_preprocessor.setdefault('batch_augments', train_cfg)
        if train_augments is not None:
            own = dict(own)
            own.setdefault('batch_augments', train_augments)
        problems += [f'  data_preprocessor.{diff}' for diff in _differences(own, model)]
    # a student without its own data_preprocessor turns train_cfg into its batch_augments
    if train_augments is not None and own is None:
        if train_augments != model.get('batch_augments'):
            problems.append(f'  train_cfg (batch augments): {train_augments!r} != '
                            f'data_preprocessor.batch_augments {model.get("batch_augments")!r}')
    if not problems:
        return
    raise DistillationConfigError(
        'the student config sets preprocessing that DistillationModel would silently drop: '
        f'every batch is preprocessed once, for teacher and student, by {where}, never by the '
        'student\'s own data_preprocessor, and a student train_cfg with augments (Mixup / '
        'CutMix) is never applied. Student vs model settings:\n' + '\n'.join(problems) +
        '\nPut them in the model\'s data_preprocessor, e.g. data_preprocessor=dict(..., '
        "batch_augments=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', "
        "alpha=1.0)])), and remove them from model.student (or make both the same).")


def refuse_student_settings(settings: dict) -> None:
    """Refuses keys given to a ``DistillationModel`` that belong to its student model.

    A user who adds ``--cfg-options model.test_cfg.mode=slide`` (or ``model.decode_head.*``)
    to a ``*-distill`` config means the student's setting; without this check mmengine's
    registry fails with a bare ``TypeError`` about an unexpected keyword.

    Args:
        settings: The unexpected keyword arguments of the ``DistillationModel``.

    Raises:
        DistillationConfigError: Naming each key and where it goes (``model.student.<key>``).
    """
    if not settings:
        return
    names = sorted(settings)
    moved = ', '.join(f'model.{name} -> model.student.{name}' for name in names)
    raise DistillationConfigError(
        f'DistillationModel got {names}, which it does not take: settings of the trained '
        f'model (test_cfg, train_cfg, backbone, heads, ...) go under model.student in a '
        f'distillation config ({moved}; e.g. --cfg-options model.student.test_cfg.mode=slide)')


def build_untyped_preprocessor(cfg: dict, student: Optional[nn.Module]) -> nn.Module:
    """The distillation model's ``data_preprocessor`` from a config without ``type``.

    mmpretrain's data set bases give ``data_preprocessor = dict(num_classes=..., mean=...,
    std=..., to_rgb=...)`` without a type, which its ``ImageClassifier`` completes with its own
    preprocessor type; a distillation model built with such a base takes the type of its
    task-model student's preprocessor the same way.

    Args:
        cfg: The preprocessor settings, without ``type``.
        student: The built student task model (``None``: a bare-backbone student, which has no
            preprocessor to take the type from).

    Returns:
        The built preprocessor.

    Raises:
        DistillationConfigError: for a bare-backbone student or one left with mmengine's
            ``BaseDataPreprocessor``, naming ``data_preprocessor.type``.
    """
    if student is None:
        raise DistillationConfigError(
            f'data_preprocessor={_plain(cfg)} has no type (mmpretrain\'s data set bases give it '
            f'without one) and the student is a bare backbone, which has no preprocessor whose '
            f'type could be taken: set '
            f'data_preprocessor.type in the config, e.g. '
            f"data_preprocessor=dict(type='mmpretrain.ClsDataPreprocessor', ...) for "
            f"classification, 'mmseg.SegDataPreProcessor' for segmentation.")
    from mmengine.model import BaseDataPreprocessor
    from mmengine.registry import MODELS
    kind = type(student.data_preprocessor)
    if kind is BaseDataPreprocessor:  # a student whose config sets no preprocessor (mmseg)
        raise DistillationConfigError(
            f'data_preprocessor={_plain(cfg)} has no type (mmpretrain\'s data set bases give it '
            f'without one), and the student has mmengine\'s BaseDataPreprocessor, which takes '
            f'none of these settings: set data_preprocessor.type in the config, e.g. '
            f"'mmpretrain.ClsDataPreprocessor' or 'mmseg.SegDataPreProcessor'.")
    return MODELS.build(dict(_plain(cfg), type=kind))
