"""Reading checkpoint files safely, converting them, and loading them all-or-nothing."""
import importlib.util
import inspect
import os
import pickle
import re
from typing import Any, List, Mapping, Tuple, Union

import torch
import torch.nn as nn

from .layouts import (CHECKPOINT_LAYOUTS, ConversionResult, StateDict, detect_layout,
                      select_backbone)
from .report import ConversionReport, summarise_keys

#: Keys under which training frameworks nest the weights, unwrapped in this order.
WRAPPER_KEYS = ('state_dict', 'model', 'module', 'teacher')

#: Attention-operator parameters beyond ``qkv`` / ``proj`` (feature maps, block mixing, TTT
#: inner models...): no softmax checkpoint has them, so their absence is never an error; they
#: keep the operator's documented init and are listed in ``report.missing``.
OPERATOR_EXTRA_KEY = re.compile(r'^blocks\.\d+\.attn\.(?!qkv\.|proj\.)')


class CheckpointMismatchError(ValueError):
    """A checkpoint does not fit a model; raised before anything is loaded."""


class UntrustedCheckpointError(RuntimeError):
    """A checkpoint holds pickled objects that ``weights_only=True`` refuses to build."""


def _unwrap(obj: Any, source: str) -> Tuple[StateDict, List[str]]:
    notes = []
    for _ in range(len(WRAPPER_KEYS) + 1):
        if not isinstance(obj, Mapping):
            raise TypeError(f'{source} holds a {type(obj).__name__}, not a state dict')
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return dict(obj), notes
        for key in WRAPPER_KEYS:
            if isinstance(obj.get(key), Mapping):
                notes.append(f'unwrapped checkpoint[{key!r}]')
                obj = obj[key]
                break
        else:
            tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
            if tensors:
                skipped = sorted(k for k in obj if k not in tensors)
                notes.append(f'ignored non-tensor entries {skipped}')
                return tensors, notes
            raise ValueError(f'{source} has no tensors at its top level nor under any of '
                             f'{WRAPPER_KEYS}; top-level keys: {sorted(obj)[:20]}')
    raise ValueError(f'{source} nests wrapper keys too deeply')


def load_checkpoint_file(path: str, trust_checkpoint: bool = False) -> StateDict:
    """Reads a checkpoint file into a flat ``{name: tensor}`` dict on the CPU.

    ``.safetensors`` files are read with safetensors; anything else with
    ``torch.load(weights_only=True)``, which builds tensors and plain containers only.
    Weights nested under ``state_dict`` / ``model`` / ``module`` / ``teacher`` are unwrapped.

    Args:
        path: Checkpoint file.
        trust_checkpoint: Allow a full unpickle (``weights_only=False``) when the file holds
            other Python objects.  Unpickling runs code from the file: only for files you
            trust.

    Returns:
        Flat state dict.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        UntrustedCheckpointError: when the file needs a full unpickle and
            ``trust_checkpoint`` is False.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f'Checkpoint file {path!r} does not exist')
    if path.endswith('.safetensors'):
        if importlib.util.find_spec('safetensors') is None:
            raise ImportError(f'Reading {path!r} needs the safetensors package: '
                              f'pip install safetensors')
        from safetensors.torch import load_file
        return load_file(path, device='cpu')
    try:
        obj = torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as err:
        if not trust_checkpoint:
            found = re.search(r'Unsupported global: GLOBAL ([\w.]+)', str(err))
            what = f' ({found.group(1)})' if found else ''
            raise UntrustedCheckpointError(
                f'{path!r} holds Python objects besides tensors{what}, so the safe '
                f'torch.load(weights_only=True) refuses it. If you trust the file, pass '
                f'trust_checkpoint=True (CLI: --trust-checkpoint), or re-save only its '
                f'weights.') from err
        obj = torch.load(path, map_location='cpu', weights_only=False)
    state_dict, _ = _unwrap(obj, repr(path))
    return state_dict


def convert_state_dict(state_dict: Mapping[str, Any], layout: str = 'auto',
                       **options: Any) -> ConversionResult:
    """Converts a checkpoint dict into the canonical ViT layout.

    Args:
        state_dict: Flat or wrapped (``state_dict`` / ``model`` / ...) checkpoint dict.
            ``module.`` is stripped and a ``backbone.`` (or ``teacher.backbone.``) prefix
            selects the backbone's keys.
        layout: ``'auto'`` or a name in ``CHECKPOINT_LAYOUTS`` (``'dinov2'``, ``'timm'``,
            ``'openai_clip'``, ``'mmpretrain'``).
        **options: Options of that layout's converter (``keep_projection`` for
            ``openai_clip``, ``no_embed_class`` for ``timm``).

    Returns:
        The canonical state dict and a :class:`ConversionReport`.
    """
    flat, notes = _unwrap(state_dict, 'the checkpoint')
    flat, prefix_report = select_backbone(flat)
    if layout == 'auto':
        layout = detect_layout(flat)
        notes.append(f'layout detected as {layout!r}')
    converter = CHECKPOINT_LAYOUTS.get(layout)
    accepted = [p for p in inspect.signature(converter).parameters if p != 'state_dict']
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TypeError(f'Layout {layout!r} takes no option(s) {unknown}; it accepts '
                        f'{accepted or "none"}')
    converted, report = converter(flat, **options)
    report.dropped = {**prefix_report.dropped, **report.dropped}
    report.notes = notes + prefix_report.notes + report.notes
    return converted, report


def _checkpoint_summary(sd: Mapping[str, torch.Tensor]) -> str:
    """A one-line guess of the architecture a canonical state dict belongs to."""
    facts = []
    if 'patch_embed.proj.weight' in sd:
        weight = sd['patch_embed.proj.weight']
        facts.append(f'embed_dims={weight.shape[0]}')
        if weight.ndim == 4:
            facts.append(f'patch_size={weight.shape[-1]}')
    depth = {int(k.split('.')[1]) for k in sd if k.startswith('blocks.') and
             k.split('.')[1].isdigit()}
    if depth:
        facts.append(f'num_layers={max(depth) + 1}')
    fc1, fc2 = sd.get('blocks.0.mlp.fc1.weight'), sd.get('blocks.0.mlp.fc2.weight')
    if fc1 is not None and fc2 is not None:
        if fc1.shape[0] == 2 * fc2.shape[-1]:
            facts.append(f"mlp_type='swiglu', mlp_hidden_dims={fc2.shape[-1]}")
        else:
            facts.append(f'mlp_hidden_dims={fc1.shape[0]}')
    facts.append(f'layer_scale={"blocks.0.ls1.gamma" in sd}')
    facts.append(f'class_token={"cls_token" in sd}')
    if 'reg_token' in sd:
        facts.append(f'num_reg_tokens={sd["reg_token"].shape[1]}')
    facts.append(f'mask_token={"mask_token" in sd}')
    facts.append(f'pre_norm={"pre_norm.weight" in sd}')
    facts.append(f'patch_bias={"patch_embed.proj.bias" in sd}')
    return ', '.join(facts)


def _pos_embed_fits(model: nn.Module, ckpt: torch.Tensor, own: torch.Tensor) -> bool:
    """Whether a checkpoint pos_embed loads (same width, prefix rows + a square grid)."""
    if ckpt.shape == own.shape:
        return True
    prefix = int(getattr(model, 'with_cls_token', False))
    if ckpt.ndim != 3 or ckpt.shape[0] != 1 or ckpt.shape[-1] != own.shape[-1]:
        return False
    n = ckpt.shape[1] - prefix
    return n > 0 and int(n**0.5 + 0.5)**2 == n


def check_state_dict_fits(model: nn.Module,
                          state_dict: Mapping[str, torch.Tensor],
                          strict: bool = True,
                          source: str = 'checkpoint') -> Tuple[List[str], List[str]]:
    """Compares keys and shapes; raises one error naming every disagreement.

    A ``pos_embed`` with another (square) grid fits: the backbone adopts the checkpoint grid.
    Missing attention-operator extras (:data:`OPERATOR_EXTRA_KEY`) are never errors.

    Args:
        model: The model to load into.
        state_dict: Canonical state dict.
        strict: Whether missing and unexpected keys are errors (shape disagreements always are).
        source: What the state dict is, for the message.

    Returns:
        (missing keys, unexpected keys), for a non-strict load.

    Raises:
        CheckpointMismatchError: listing missing keys, unexpected keys and shape mismatches.
    """
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    mismatched = []
    for key, value in state_dict.items():
        if key not in expected:
            continue
        own = expected[key]
        if key == 'pos_embed' and _pos_embed_fits(model, value, own):
            continue
        if tuple(value.shape) != tuple(own.shape):
            mismatched.append(f'{key}: checkpoint {tuple(value.shape)} vs model '
                              f'{tuple(own.shape)}')
    hard_missing = [k for k in missing if not OPERATOR_EXTRA_KEY.match(k)]
    if not mismatched and (not strict or not (hard_missing or unexpected)):
        return missing, unexpected
    lines = [f'{source} does not fit {type(model).__name__}'
             f'(family={getattr(model, "family", "?")!r}, arch={getattr(model, "arch", "?")!r}, '
             f'embed_dims={getattr(model, "embed_dims", "?")}, '
             f'num_layers={getattr(model, "num_layers", "?")}); nothing was loaded.']
    if mismatched:
        lines.append(f'shape mismatches ({len(mismatched)}):')
        lines.extend(f'  {m}' for m in mismatched[:40])
        if len(mismatched) > 40:
            lines.append(f'  ... and {len(mismatched) - 40} more')
    if strict and hard_missing:
        lines.append(f'missing keys ({len(hard_missing)}): '
                     f'{", ".join(summarise_keys(hard_missing))}')
    if strict and unexpected:
        lines.append(f'unexpected keys ({len(unexpected)}): '
                     f'{", ".join(summarise_keys(unexpected))}')
    lines.append(f'the checkpoint looks like: {_checkpoint_summary(state_dict)}')
    lines.append('fix: build the model with the matching family / arch / num_reg_tokens / '
                 'with_mask_token, pick the right layout=, or load with strict=False to '
                 'skip missing and unexpected keys')
    raise CheckpointMismatchError('\n'.join(lines))


def load_pretrained(model: nn.Module,
                    checkpoint: Union[str, Mapping[str, Any]],
                    layout: str = 'auto',
                    strict: bool = True,
                    trust_checkpoint: bool = False,
                    **options: Any) -> ConversionReport:
    """Converts a checkpoint and loads it into a VisionTransformer, all or nothing.

    Keys and shapes are compared first; any disagreement raises one
    :class:`CheckpointMismatchError` and leaves the model untouched.

    Args:
        model: An :class:`mmlinvit.backbones.VisionTransformer` (or any module in the
            canonical layout).
        checkpoint: Checkpoint file path or an in-memory (possibly wrapped) state dict.
        layout: Source layout, ``'auto'`` to detect it.
        strict: Whether missing / unexpected keys are errors; if False they are skipped and
            listed in the report.  Shape disagreements are always errors; missing
            attention-operator extras (e.g. a student's feature maps) never are.
        trust_checkpoint: Allow a full unpickle of files that need it (see
            :func:`load_checkpoint_file`).
        **options: Layout converter options (see :func:`convert_state_dict`).

    Returns:
        The conversion report, with ``loaded``, ``missing`` and ``unexpected`` filled in.
    """
    if isinstance(checkpoint, str):
        source = repr(checkpoint)
        raw = load_checkpoint_file(checkpoint, trust_checkpoint=trust_checkpoint)
    else:
        source = 'the checkpoint dict'
        raw = checkpoint
    converted, report = convert_state_dict(raw, layout=layout, **options)
    missing, unexpected = check_state_dict_fits(
        model, converted, strict=strict,
        source=f'{source} (read as layout {report.source_layout!r})')
    loadable = {k: v for k, v in converted.items() if k not in unexpected}
    # Everything was checked above; strict=False only lets operator extras stay at init.
    model.load_state_dict(loadable, strict=False)
    report.loaded = len(loadable)
    report.missing = missing
    report.unexpected = unexpected
    return report
