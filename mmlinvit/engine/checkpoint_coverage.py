"""Evaluation refuses checkpoints that leave part of the model at its random initialisation.

mmengine loads ``load_from`` (``tools/test.py``'s CHECKPOINT) and the inferencers load their
weights with ``strict=False``: a checkpoint that misses weights of the model (an exported
``student_backbone.pth`` given to a task config, the checkpoint of another config) is
reported in one log line and the model is evaluated with those weights random.
:func:`check_checkpoint_covers` turns that into an error naming the missing weights and the
fix.  Keys a backbone declares optional (``OPTIONAL_CHECKPOINT_KEYS``: training records,
the DINOv2 mask token) may be missing; keys the checkpoint has beyond the model are ignored.
A tensor of another shape (another ``num_classes``, width) is refused too, except a
backbone's position grid, which is resampled on load.
"""
import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, Set

import torch.nn as nn

from mmlinvit.backbones.base import TokenBackbone
from mmlinvit.converters.report import summarise_keys

#: mmengine's default ``revise_keys`` of ``load_checkpoint``: a DDP wrapper prefix.
_WRAPPER_PREFIX = re.compile(r'^module\.')


class CheckpointCoverageError(ValueError):
    """A checkpoint to evaluate does not hold every weight of the model."""


def _unwrapped(state_dict: Mapping[str, Any]) -> Dict[str, Any]:
    """The checkpoint's keys without a DDP wrapper prefix (as mmengine loads them)."""
    return {_WRAPPER_PREFIX.sub('', key): value for key, value in state_dict.items()}


def _backbone_keys(model: nn.Module, names: Callable[[TokenBackbone], Iterable[str]]
                   ) -> Set[str]:
    """``names(backbone)`` of every backbone in ``model``, as keys of ``model``."""
    keys = set()
    for prefix, module in model.named_modules():
        if isinstance(module, TokenBackbone):
            stem = f'{prefix}.' if prefix else ''
            keys.update(stem + name for name in names(module))
    return keys


def as_loaded(model: nn.Module, state_dict: Mapping[str, Any]) -> Dict[str, Any]:
    """The checkpoint's keys as the model's load sees them: without a DDP wrapper prefix, and
    each backbone's keys in another layout (an mmpretrain classifier file) converted, as the
    backbones' load pre-hook converts them."""
    from mmlinvit.converters.loading import convert_foreign_keys_on_load
    seen = _unwrapped(state_dict)
    for prefix, module in model.named_modules():
        if isinstance(module, TokenBackbone):
            convert_foreign_keys_on_load(module, seen, f'{prefix}.' if prefix else '')
    return seen


def optional_model_keys(model: nn.Module) -> Set[str]:
    """Keys of ``model`` that a checkpoint may lack (each backbone's optional keys)."""
    return _backbone_keys(model, lambda backbone: backbone.OPTIONAL_CHECKPOINT_KEYS)


def uncovered_keys(model: nn.Module, state_dict: Mapping[str, Any]) -> List[str]:
    """The model's state-dict keys that ``state_dict`` lacks, optional keys left out.

    Args:
        model: The model to evaluate (not wrapped).
        state_dict: The checkpoint's state dict (a ``module.`` prefix is removed as mmengine
            does).
    """
    present = _unwrapped(state_dict)
    optional = optional_model_keys(model)
    return sorted(k for k in model.state_dict() if k not in present and k not in optional)


def resized_model_keys(model: nn.Module) -> Set[str]:
    """Keys whose checkpoint tensor may have another shape: backbones resample a position
    grid of another size on load."""
    return _backbone_keys(model, lambda backbone: ('pos_embed', ))


def mismatched_shapes(model: nn.Module, state_dict: Mapping[str, Any]) -> List[str]:
    """``'key: checkpoint (a, b) vs model (c, d)'`` for each tensor that mmengine's
    ``strict=False`` load would skip (left at its initialisation) for its shape."""
    ckpt = _unwrapped(state_dict)
    resized = resized_model_keys(model)
    found = []
    for key, value in model.state_dict().items():
        other = ckpt.get(key)
        if (key not in resized and hasattr(other, 'shape')
                and tuple(other.shape) != tuple(value.shape)):
            found.append(f'{key}: checkpoint {tuple(other.shape)} vs model {tuple(value.shape)}')
    return found


def _hint(model_keys: List[str], present: Set[str]) -> str:
    """What the checkpoint probably is, and what to do with it."""
    student = {k[len('student.'):] for k in present if k.startswith('student.')}
    backbone = [k[len('backbone.'):] for k in model_keys if k.startswith('backbone.')]
    for keys, what in ((present, 'a bare backbone (e.g. an exported student_backbone.pth)'),
                       (student, 'the bare-backbone student of a distillation run (student.*)')):
        if backbone and 2 * sum(k in keys for k in backbone) >= len(backbone):
            return (f' It holds {what}: load it as model.backbone.pretrained=PATH in a config '
                    f'that trains the head, and evaluate the checkpoint of that run.')
    if student:
        return (' It holds the student of a distillation run (student.*): evaluate it with the '
                'distillation config that wrote it.')
    return ' Check that CHECKPOINT was written by a run of this config.'


def check_checkpoint_covers(model: nn.Module, checkpoint: Mapping[str, Any],
                            source: str) -> None:
    """Raises when ``checkpoint`` does not hold every (non-optional) weight of ``model``.

    Args:
        model: The model to evaluate (not wrapped).
        checkpoint: A loaded checkpoint (``{'state_dict': ...}`` or a bare state dict).
        source: What the checkpoint is, for the message (e.g. its path).

    Raises:
        CheckpointCoverageError: naming the missing weights, what the checkpoint looks like,
            and ``check_checkpoint_coverage=False`` to evaluate anyway.
    """
    state_dict = as_loaded(model, checkpoint.get('state_dict', checkpoint))
    check_evaluated_operators(model, state_dict, source)
    missing = uncovered_keys(model, state_dict)
    mismatched = mismatched_shapes(model, state_dict)
    if mismatched and not missing:
        raise CheckpointCoverageError(
            f'{source} holds {len(mismatched)} weight(s) of another shape than the model to '
            f'evaluate, which would be skipped and evaluated at their random initialisation: '
            f'{"; ".join(mismatched[:6])}{" ..." if len(mismatched) > 6 else ""}. Check that '
            f'CHECKPOINT was written by a run of this config (same sizes / num_classes). To '
            f'evaluate anyway, pass --cfg-options check_checkpoint_coverage=False.')
    if not missing:
        return
    model_keys = list(model.state_dict())
    present = set(_unwrapped(state_dict))
    raise CheckpointCoverageError(
        f'{source} does not hold {len(missing)} of the {len(model_keys)} weights of the model '
        f'to evaluate, which would be evaluated at their random initialisation; missing per '
        f'module: {_per_module(missing, model_keys)} ('
        f'{", ".join(summarise_keys(missing, limit=6))}).' + _hint(model_keys, present) +
        ' To evaluate anyway, pass --cfg-options check_checkpoint_coverage=False.')


def check_evaluated_operators(model: nn.Module, state_dict: Mapping[str, Any],
                              source: str,
                              escape: str = ' To evaluate anyway, pass --cfg-options '
                                            'check_checkpoint_coverage=False.') -> None:
    """Refuses weights trained with other attention operators than the model runs.

    Softmax-attention weights load into any operator (where linearization starts), but
    evaluated (or exported) as a linear-attention model they compute another function: a
    softmax-trained checkpoint given to a linear config (or ``attn_cfg`` changed by
    ``--cfg-options``) is refused.

    Args:
        model: The model to evaluate.
        state_dict: Its checkpoint's state dict, keys relative to ``model``.
        source: What the checkpoint is, for the message.
        escape: The message's last sentence (how to go on anyway), if any.

    Raises:
        CheckpointCoverageError: naming both operators and the fix.
    """
    from mmlinvit.backbones.training_record import decode_names
    from mmlinvit.backbones.vit import VisionTransformer, operator_name
    for prefix, module in model.named_modules():
        if not isinstance(module, VisionTransformer):
            continue
        record = state_dict.get(f'{prefix}.block_operators' if prefix else 'block_operators')
        if not hasattr(record, 'shape') or record.shape != module.block_operators.shape:
            continue
        theirs = decode_names(record)
        ours = [operator_name(cfg) for cfg in module.attn_cfgs]
        # other operators' weights are refused by the load itself (block_operators record)
        blocks = [i for i, (t, o) in enumerate(zip(theirs, ours)) if t == 'softmax' != o]
        if blocks:
            fix = f"'{theirs[0]}'" if len(set(theirs)) == 1 else f'{theirs}'
            raise CheckpointCoverageError(
                f'{source} holds weights trained with attention operators {sorted(set(theirs))} '
                f'but the model to evaluate ({prefix or "the model"}) runs {sorted(set(ours))} in '
                f'blocks {blocks}: the weights would be evaluated with an operator they were not '
                f'trained with. Evaluate with the config that trained them (or '
                f'--cfg-options "{"model." + prefix if prefix else "model"}.attn_cfg={fix}", '
                f'the checkpoint\'s operators).{escape}')


def _per_module(missing: List[str], model_keys: List[str]) -> str:
    """``'backbone 67/67, decode_head 50/50'``: missing / all keys per top-level module."""
    top = lambda key: key.split('.', 1)[0]  # noqa: E731
    totals: Dict[str, int] = {}
    for key in model_keys:
        totals[top(key)] = totals.get(top(key), 0) + 1
    counts: Dict[str, int] = {}
    for key in missing:
        counts[top(key)] = counts.get(top(key), 0) + 1
    return ', '.join(f'{name} {count}/{totals[name]}' for name, count in counts.items())


def check_training_load_from(model: nn.Module, checkpoint: Mapping[str, Any],
                             source: str) -> None:
    """Raises when a training run's ``load_from`` gives a trainable backbone none of its
    weights while nothing else would (no ``pretrained=``), or weights of another shape.

    mmengine loads ``load_from`` with ``strict=False``: a file whose keys do not match (an
    exported ``student_backbone.pth`` given to a distillation or task model, whose keys carry
    ``student.`` / ``backbone.``) loads nothing, and the run trains from a random
    initialisation with only a key-mismatch note in the log.  Fine-tuning that replaces a
    head or a neck (their keys missing) is not refused: only backbones of which the file
    holds less than half of the weights.  Backbone tensors of another shape (a checkpoint of
    another width or MLP size) are refused too: mmengine skips them with one warning.  Keys in
    another layout are counted as the backbone's load hook converts them.

    Args:
        model: The model to train (not wrapped), after ``init_weights``.
        checkpoint: The loaded ``load_from`` checkpoint.
        source: What the checkpoint is, for the message.

    Raises:
        CheckpointCoverageError: naming the backbone, the counts, what the file looks like
            and ``check_checkpoint_coverage=False``.
    """
    seen = as_loaded(model, checkpoint.get('state_dict', checkpoint))
    for prefix, module in model.named_modules():
        if not isinstance(module, TokenBackbone):
            continue
        if not any(p.requires_grad for p in module.parameters()):
            continue  # a frozen teacher: its weights come from its own checkpoint
        stem = f'{prefix}.' if prefix else ''
        own = module.state_dict()
        mismatched = [f'{stem}{k}: checkpoint {tuple(seen[stem + k].shape)} vs model '
                      f'{tuple(v.shape)}' for k, v in own.items()
                      if k != 'pos_embed' and hasattr(seen.get(stem + k), 'shape')
                      and tuple(seen[stem + k].shape) != tuple(v.shape)]
        if mismatched:
            kept = ('pretrained= weights' if getattr(module, 'pretrained', None)
                    else 'random initialisation')
            raise CheckpointCoverageError(
                f'load_from {source} holds {len(mismatched)} weight(s) of the trainable '
                f'backbone {prefix or "(the model)"!r} with another shape: mmengine would skip '
                f'them (strict=False) and train them from their '
                f'{kept}: '
                f'{"; ".join(mismatched[:6])}{" ..." if len(mismatched) > 6 else ""}. Check that '
                f'it was written by a run of a model with this backbone (arch, mlp width). To '
                f'train anyway, pass --cfg-options check_checkpoint_coverage=False.')
        if getattr(module, 'pretrained', None):
            continue
        optional = set(module.OPTIONAL_CHECKPOINT_KEYS)
        keys = [stem + k for k in own if k not in optional]
        covered = sum(k in seen for k in keys)
        if keys and 2 * covered < len(keys):
            bare = sum(k[len(stem):] in seen for k in keys)
            what = (f' The file holds a bare backbone (e.g. an exported student_backbone.pth): '
                    f'load it as model.{stem}pretrained=PATH and leave load_from unset.'
                    if 2 * bare >= len(keys) else
                    ' Check that it was written by a run of a model with this backbone.')
            raise CheckpointCoverageError(
                f'load_from {source} holds {covered} of the {len(keys)} weights of the '
                f'trainable backbone {prefix or "(the model)"!r}, which has no pretrained= '
                f'either: mmengine would load it with strict=False and train that backbone '
                f'from its random initialisation.{what} To train anyway, pass --cfg-options '
                f'check_checkpoint_coverage=False.')
