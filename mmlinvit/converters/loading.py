"""Reading checkpoint files safely, converting them, and loading them all-or-nothing."""
import importlib.util
import inspect
import logging
import os
import pickle
import re
import zipfile
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch
import torch.nn as nn

from mmlinvit.backbones.base import TokenBackbone
from mmlinvit.backbones.training_record import MLP_ACT_RECORD, decode_names, encode_names
from mmlinvit.layers.pos_embed import POS_GRID_RECORD, recorded_pos_grid
from .checkpoint_file import (ZIP_MAGIC, CheckpointFileError, checkpoint_file_problem,
                              is_safetensors_path)
from .layouts import (ADVENTURER_BLOCK_KEY, CHECKPOINT_LAYOUTS, ConversionResult, StateDict,
                      detect_layout, select_backbone)
from .report import ConversionReport, summarise_keys

#: Keys under which training frameworks nest the weights, unwrapped in this order.
WRAPPER_KEYS = ('state_dict', 'model', 'module', 'teacher')
#: Where timm's train.py saves the model EMA's weights, beside ``state_dict``.
TIMM_EMA_KEY = 'state_dict_ema'

logger = logging.getLogger(__name__)

#: Attention-operator parameters without a softmax counterpart: everything an operator owns
#: under ``blocks.<i>.attn.`` besides the softmax ``qkv`` / ``proj`` every operator shares
#: (Hedgehog feature maps, MHLA block mixing and local conv, TTT inner weights and positional
#: conv, ...).  Group 1 is the block index.  A softmax checkpoint has none of them, so from
#: such a block they keep the operator's documented init (and are reported); a checkpoint
#: block that carries operator parameters must carry all of the model's (see
#: :func:`initialisable_missing_keys`).
OPERATOR_EXTRA_KEY = re.compile(r'^blocks\.(\d+)\.attn\.(?!qkv\.|proj\.)')


class _DiscardedState:
    """What an mmengine runner checkpoint's training state (message hub, numpy values) reads
    as here: nothing.  It stands for the classes and the functions of that state alike: built
    (or called) with any arguments, it ignores the state it is given, so a pickle cannot write
    attributes (``__setstate__``...) into it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


#: The objects besides tensors that an mmengine runner checkpoint (``epoch_N.pth``,
#: ``iter_N.pth``) pickles in its training state: its ``HistoryBuffer`` s (with ``getattr``
#: references to their statistics methods) and numpy arrays, dtypes and scalars (a
#: ``save_best`` score of mmseg's ``IoUMetric`` is a numpy float32).  The safe read
#: (:func:`load_checkpoint_file`) rebuilds them as :class:`_DiscardedState` stand-ins: only the
#: tensors are read, and nothing of these names runs (mmengine's own allowlist, which
#: ``Runner.resume`` then leaves for a full unpickle, admits the real ``getattr`` and
#: ``HistoryBuffer``, with which a crafted file runs code).
_TRAINING_STATE_NAMES = (
    'builtins.getattr', 'mmengine.logging.history_buffer.HistoryBuffer',
    'numpy.ndarray', 'numpy.dtype', 'numpy.core.multiarray._reconstruct',
    'numpy._core.multiarray._reconstruct', 'numpy.core.multiarray.scalar',
    'numpy._core.multiarray.scalar') + tuple(
        f'numpy.dtypes.{kind}DType'
        for kind in ('Bool', 'Float16', 'Float32', 'Float64', 'LongDouble', 'Complex64',
                     'Complex128', 'CLongDouble', 'Int8', 'Int16', 'Int32', 'Int64',
                     'LongLong', 'UInt8', 'UInt16', 'UInt32', 'UInt64', 'ULongLong'))


def _training_state_stand_ins() -> List[Any]:
    """``(stand-in, name)`` pairs for ``torch.serialization.safe_globals``, and ``slice``
    (harmless, and in mmengine's allowlist)."""
    return [(_DiscardedState, name) for name in _TRAINING_STATE_NAMES] + [slice]


class CheckpointMismatchError(ValueError):
    """A checkpoint does not fit a model; raised before anything is loaded."""


class UntrustedCheckpointError(RuntimeError, TypeError):
    """A checkpoint holds pickled objects that ``weights_only=True`` refuses to build.

    Also a ``TypeError`` (the file holds other types than tensors), which is what
    ``Adventurer.init_weights`` raised before it read checkpoints through this module.
    """


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
                if key == 'state_dict' and isinstance(obj.get(TIMM_EMA_KEY), Mapping):
                    # timm's train.py saves the EMA weights beside the live ones, and timm's
                    # load_checkpoint(use_ema=True, its default) loads those
                    logger.warning(
                        '%s also holds %r (the EMA weights of a timm training run, which '
                        "timm's load_checkpoint loads by default); loading 'state_dict' (the "
                        'live weights). For the EMA weights save checkpoint[%r] as its own file '
                        'and load that', source, TIMM_EMA_KEY, TIMM_EMA_KEY)
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


def is_torchscript_archive(path: str) -> bool:
    """Whether ``path`` is a TorchScript archive (``torch.jit.save``), not a ``torch.save`` file.

    Both are zip archives; only TorchScript writes a ``constants.pkl`` record (the test
    ``torch.serialization`` itself uses before refusing such a file with ``weights_only=True``).
    The official OpenAI CLIP releases (``ViT-B-16.pt`` ...) are TorchScript archives.

    Args:
        path: An existing file.
    """
    with open(path, 'rb') as f:
        if f.read(len(ZIP_MAGIC)) != ZIP_MAGIC:
            return False
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.split('/', 1)[-1] == 'constants.pkl' for name in archive.namelist())
    except zipfile.BadZipFile:
        return False


def load_checkpoint_file(path: str, trust_checkpoint: bool = False) -> StateDict:
    """Reads a checkpoint file into a flat ``{name: tensor}`` dict on the CPU.

    ``.safetensors`` files are read with safetensors; anything else with
    ``torch.load(weights_only=True)``, which builds tensors and plain containers only.
    A TorchScript archive (the official OpenAI CLIP releases) is read with
    ``torch.jit.load(...).state_dict()`` when ``trust_checkpoint`` is True.  Weights nested
    under ``state_dict`` / ``model`` / ``module`` / ``teacher`` are unwrapped.

    Args:
        path: Checkpoint file.
        trust_checkpoint: Allow a full unpickle (``weights_only=False``) when the file holds
            other Python objects, and ``torch.jit.load`` of a TorchScript archive.  Both run
            code from the file: only for files you trust.

    Returns:
        Flat state dict.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        CheckpointFileError: when the file is empty, truncated or not a checkpoint, naming
            the cause (:mod:`mmlinvit.converters.checkpoint_file`).
        UntrustedCheckpointError: when the file needs a full unpickle or is a TorchScript
            archive, and ``trust_checkpoint`` is False.
    """
    if os.path.isdir(path):
        raise FileNotFoundError(f'Checkpoint file {path!r} is a directory; give the checkpoint '
                                f'file in it (e.g. {os.path.join(path, "<name>.pth")!r})')
    if not os.path.isfile(path):
        raise FileNotFoundError(f'Checkpoint file {path!r} does not exist')
    problem = checkpoint_file_problem(path)  # truncated / empty / not a checkpoint at all
    if problem is not None:
        raise CheckpointFileError(f'Checkpoint {path!r} {problem}')
    if is_safetensors_path(path):
        if importlib.util.find_spec('safetensors') is None:
            raise ImportError(f'Reading {path!r} needs the safetensors package: '
                              f'pip install safetensors')
        from safetensors.torch import load_file
        return load_file(path, device='cpu')
    if is_torchscript_archive(path):
        if not trust_checkpoint:
            raise UntrustedCheckpointError(
                f'{path!r} is a TorchScript archive (torch.jit.save; e.g. an official OpenAI '
                f'CLIP release such as ViT-B-16.pt), not a torch.save checkpoint: reading it '
                f'means torch.jit.load, which loads and runs the code stored in the file, so '
                f'the safe torch.load(weights_only=True) cannot read it. If you trust the '
                f'file, convert it once: python tools/model_converters/convert_checkpoint.py '
                f'{path} checkpoints/clip_vit_b16_openai.pt --trust-checkpoint (or pass '
                f'trust_checkpoint=True).')
        archive = torch.jit.load(path, map_location='cpu')
        state_dict, _ = _unwrap(dict(archive.state_dict()), repr(path))
        return state_dict
    try:
        with torch.serialization.safe_globals(_training_state_stand_ins()):
            obj = torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as err:
        if not trust_checkpoint:
            found = re.search(r'Unsupported global: GLOBAL ([\w.]+)', str(err))
            what = f' ({found.group(1)})' if found else ''
            raise UntrustedCheckpointError(
                f'{path!r} holds Python objects besides tensors{what}, so the safe '
                f'torch.load(weights_only=True) refuses it (a full unpickle can run code from '
                f'the file). If you trust the file, re-save only its weights once: python '
                f'tools/model_converters/convert_checkpoint.py {path} OUT.pth '
                f'--trust-checkpoint (a release, e.g. the public Adventurer code\'s files, '
                f'which hold its argparse arguments), or, for the student of a distillation '
                f'run, tools/model_converters/export_student.py {path} OUT.pth '
                f'--trust-checkpoint (or use the student_backbone.pth written by '
                f'mmlinvit.ExportStudentHook); then give OUT.pth (pretrained=OUT.pth). In '
                f'Python, load_checkpoint_file / load_pretrained take trust_checkpoint=True.'
                ) from err
        obj = torch.load(path, map_location='cpu', weights_only=False)
    state_dict, _ = _unwrap(obj, repr(path))
    return state_dict


def convert_state_dict(state_dict: Mapping[str, Any], layout: str = 'auto',
                       **options: Any) -> ConversionResult:
    """Converts a checkpoint dict into the canonical layout of a backbone.

    Args:
        state_dict: Flat or wrapped (``state_dict`` / ``model`` / ...) checkpoint dict.
            ``module.`` is stripped and the first prefix of
            :data:`~.layouts.BACKBONE_PREFIXES` that occurs (``backbone.``, ``student.``...)
            selects the backbone's keys.
        layout: ``'auto'`` or a name in ``CHECKPOINT_LAYOUTS`` (``'dinov2'``, ``'timm'``,
            ``'openai_clip'``, ``'mmpretrain'``, ``'adventurer'``).
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
    report.prefix = prefix_report.prefix
    report.dropped = {**prefix_report.dropped, **report.dropped}
    report.notes = notes + prefix_report.notes + report.notes
    return converted, report


def convert_foreign_keys_on_load(model: TokenBackbone, state_dict: Dict[str, torch.Tensor],
                                 prefix: str) -> Optional[ConversionReport]:
    """Converts, in place, a backbone's keys of a whole-model state dict read in another layout.

    mmengine loads a model-level ``init_cfg=dict(type='Pretrained')`` (mmpretrain's
    ``ImageClassifier(pretrained=...)`` too) and ``load_from`` into the whole model by name:
    an mmpretrain classifier file (``backbone.layers.i.ln1...``), an official DINOv2 or CLIP
    file would load only the tokens whose names agree and leave every block at its
    initialisation.  Called by the backbone's first ``load_state_dict`` pre-hook: the keys under
    ``prefix`` are converted (:func:`convert_state_dict`, the backbone's ``checkpoint_layout``)
    when they are not the backbone's own names and the conversion places more of them; the
    backbone's own checkpoints are left as they are.

    Args:
        model: The backbone being loaded.
        state_dict: The state dict handed to ``load_state_dict`` (changed in place).
        prefix: The backbone's prefix in it.

    Returns:
        The conversion report, or None when nothing was converted.
    """
    sub = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    if not sub:
        return None
    own = set(model.state_dict(keep_vars=True)) | set(model.surplus_checkpoint_keys())
    foreign = [k for k in sub if k not in own]
    if not foreign:
        return None
    try:
        converted, report = convert_state_dict(sub, layout=model.checkpoint_layout)
    except (ValueError, KeyError) as err:  # no layout matches: left to load_state_dict
        logger.debug('no layout conversion of %r on load: %s', prefix, err)
        return None
    placed_before = len(sub) - len(foreign)
    placed_after = sum(k in own for k in converted)
    unplaced_after = len(converted) - placed_after
    if not (placed_after > placed_before
            or (placed_after == placed_before and unplaced_after < len(foreign))):
        return None
    check_act = getattr(model, 'check_checkpoint_act', None)
    if check_act is not None:
        check_act(converted, f'the keys under {prefix!r} (read as layout '
                             f'{report.source_layout!r})')
    for key in sub:
        del state_dict[prefix + key]
    state_dict.update({prefix + k: v for k, v in converted.items()})
    logger.info('The keys under %r are in the %r layout: converted on load into %s:\n%s',
                prefix, report.source_layout, type(model).__name__, report.format())
    return report


def _checkpoint_summary(sd: Mapping[str, torch.Tensor]) -> str:
    """A one-line guess of the architecture a canonical state dict belongs to."""
    facts = []
    if 'patch_embed.proj.weight' in sd:
        weight = sd['patch_embed.proj.weight']
        facts.append(f'embed_dims={weight.shape[0]}')
        if weight.ndim == 4:
            facts.append(f'patch_size={weight.shape[-1]}')
    adventurer = 'norm_f.weight' in sd or any(ADVENTURER_BLOCK_KEY.match(k) for k in sd)
    blocks = 'layers.' if adventurer else 'blocks.'
    depth = {int(k.split('.')[1]) for k in sd if k.startswith(blocks) and
             k.split('.')[1].isdigit()}
    if depth:
        facts.append(f'num_layers={max(depth) + 1}')
    if 'layers.0.mlp.w1.weight' in sd:
        facts.append(f'mlp_hidden_dims={sd["layers.0.mlp.w1.weight"].shape[0]}')
    fc1, fc2 = sd.get('blocks.0.mlp.fc1.weight'), sd.get('blocks.0.mlp.fc2.weight')
    if fc1 is not None and fc2 is not None:
        if fc1.shape[0] == 2 * fc2.shape[-1]:
            facts.append(f"mlp_type='swiglu', mlp_hidden_dims={fc2.shape[-1]}")
        else:
            facts.append(f'mlp_hidden_dims={fc1.shape[0]}')
    if not adventurer:
        facts.append(f'layer_scale={"blocks.0.ls1.gamma" in sd}')
    facts.append(f'class_token={"cls_token" in sd}')
    if 'reg_token' in sd:
        facts.append(f'num_reg_tokens={sd["reg_token"].shape[1]}')
    facts.append(f'mask_token={"mask_token" in sd}')
    if not adventurer:
        facts.append(f'pre_norm={"pre_norm.weight" in sd}')
    facts.append(f'patch_bias={"patch_embed.proj.bias" in sd}')
    return ', '.join(facts)


def _optional_keys(model: nn.Module) -> Mapping[str, str]:
    """Model keys a checkpoint may lack (a backbone's ``OPTIONAL_CHECKPOINT_KEYS``)."""
    return model.OPTIONAL_CHECKPOINT_KEYS if isinstance(model, TokenBackbone) else {}


def initialisable_missing_keys(missing: List[str],
                               state_dict: Mapping[str, torch.Tensor],
                               optional: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The missing model keys that may keep their init, each with the reason.

    * Keys in ``optional`` (the backbone's ``OPTIONAL_CHECKPOINT_KEYS``): the ViT's
      ``mask_token``, which timm's DINOv2 layouts lack (Adventurer declares none: its
      checkpoints must match ``with_mask_token``).
    * Attention-operator parameters (:data:`OPERATOR_EXTRA_KEY`) of block ``i`` when the
      checkpoint has no operator parameters in block ``i``: it comes from softmax attention (or
      a parameter-free operator), whose ``qkv`` / ``proj`` the operator starts from.  When
      block ``i`` of the checkpoint does carry operator parameters, it was saved from a
      linearized operator, and a missing one is an error, not an initialisation.

    Args:
        missing: Model keys the (canonical) checkpoint lacks.
        state_dict: The canonical checkpoint.
        optional: Model keys that may be missing, with the reason (default: none).

    Returns:
        Missing key -> why it may keep its init; keys not in it are errors.
    """
    optional = optional or {}
    blocks_with_extras = set()
    for key in state_dict:
        match = OPERATOR_EXTRA_KEY.match(key)
        if match:
            blocks_with_extras.add(match.group(1))
    # mmlinvit files say which blocks were trained with a linear operator: their missing
    # operator parameters (another option of the operator, e.g. InLine's local branch) are
    # errors even when the block carries none.
    record = state_dict.get('block_operators')
    if isinstance(record, torch.Tensor) and record.dtype == torch.uint8 and record.ndim == 2:
        blocks_with_extras.update(str(i) for i, name in enumerate(decode_names(record))
                                  if name != 'softmax')
    allowed = {}
    for key in missing:
        match = OPERATOR_EXTRA_KEY.match(key)
        if key in optional:
            allowed[key] = optional[key]
        elif match and match.group(1) not in blocks_with_extras:
            allowed[key] = ('attention-operator parameter without a softmax counterpart (the '
                            'checkpoint block has no operator parameters), kept at the '
                            "operator's init")
    return allowed


def check_state_dict_fits(model: nn.Module,
                          state_dict: Mapping[str, torch.Tensor],
                          strict: bool = True,
                          source: str = 'checkpoint') -> Tuple[List[str], List[str]]:
    """Compares keys and shapes; raises one error naming every disagreement.

    A ``pos_embed`` with another (square) grid fits a backbone: it is resampled to the model
    grid.  Missing keys that :func:`initialisable_missing_keys` allows (a mask token, the operator
    parameters of a block that comes from softmax attention) are never errors; operator
    parameters missing from a checkpoint block that has other operator parameters are.

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
        if (key == 'pos_embed' and isinstance(model, TokenBackbone)
                and model.pos_embed_loads(value, recorded_pos_grid(state_dict))):
            continue
        if tuple(value.shape) != tuple(own.shape):
            mismatched.append(f'{key}: checkpoint {tuple(value.shape)} vs model '
                              f'{tuple(own.shape)}')
    allowed = initialisable_missing_keys(missing, state_dict, _optional_keys(model))
    hard_missing = [k for k in missing if k not in allowed]
    optional = set(_optional_keys(model))
    # Nothing of the model in the file: strict=False would load nothing without an error.
    no_overlap = not any(k in state_dict for k in expected if k not in optional)
    if not mismatched and not no_overlap and (not strict or not (hard_missing or unexpected)):
        return missing, unexpected
    described = ', '.join(f'{name}={getattr(model, name)!r}'
                          for name in ('family', 'arch', 'embed_dims', 'num_layers')
                          if hasattr(model, name))
    lines = [f'{source} does not fit {type(model).__name__}({described}); nothing was loaded.']
    if mismatched:
        lines.append(f'shape mismatches ({len(mismatched)}):')
        lines.extend(f'  {m}' for m in mismatched[:40])
        if len(mismatched) > 40:
            lines.append(f'  ... and {len(mismatched) - 40} more')
    operator_missing = [k for k in hard_missing if OPERATOR_EXTRA_KEY.match(k)]
    if strict and hard_missing:
        lines.append(f'missing keys ({len(hard_missing)}): '
                     f'{", ".join(summarise_keys(hard_missing))}')
    if strict and 'mask_token' in hard_missing:
        lines.append('  the checkpoint has no mask_token: build the model with '
                     'with_mask_token=False')
    if strict and operator_missing:
        present = [k for k in state_dict if OPERATOR_EXTRA_KEY.match(k)]
        record = state_dict.get('block_operators')
        evidence = (f'carry other operator parameters ({", ".join(summarise_keys(present, 6))})'
                    if present else
                    f'were trained with {sorted(set(decode_names(record)))} (block_operators)'
                    if isinstance(record, torch.Tensor) else 'were linearized')
        lines.append(f'  {len(operator_missing)} of them are attention-operator parameters '
                     f'missing from checkpoint blocks that {evidence}: the checkpoint was '
                     f'saved from a linearized operator, so they would be silently '
                     f're-initialised. Build the model with the checkpoint\'s attn_cfg '
                     f'(operator and its options), or load with strict=False to initialise '
                     f'them.')
    if strict and ('norm.weight' in hard_missing and 'norm.weight' in expected
                   and 'blocks.0.norm1.weight' in state_dict):
        lines.append('  the checkpoint has no final norm: a global-pool fine-tuned release '
                     '(e.g. MAE fine-tuned, whose fc_norm belongs to its head) is loaded with '
                     'final_norm=False')
    if strict and unexpected:
        lines.append(f'unexpected keys ({len(unexpected)}): '
                     f'{", ".join(summarise_keys(unexpected))}')
    if strict and 'cls_token' in unexpected and getattr(model, 'cls_token', 1) is None:
        lines.append('  the checkpoint has a class token (and learned positions) that this model '
                     'was built without (MHLA / TTT take their papers\' setting unless told '
                     'otherwise): build it with with_cls_token=True pos_embed_type=learned '
                     'check_operator_setting=False (a documented deviation) to load them, or '
                     'start from the file with tools/linearize.py')
    reg = state_dict.get('reg_token')
    if reg is not None and reg.ndim == 3 and getattr(model, 'num_reg_tokens', None) == 0:
        lines.append(f'  the checkpoint has {reg.shape[1]} register token(s) (DINOv2 *_reg; a '
                     f'DeiT distilled checkpoint\'s dist_token is read as one): build the model '
                     f'with num_reg_tokens={reg.shape[1]}')
    lines.append(f'the checkpoint looks like: {_checkpoint_summary(state_dict)}')
    options = model.BUILD_OPTIONS if isinstance(model, TokenBackbone) else 'arch'
    if no_overlap:
        lines.append(f'no tensor of the checkpoint has a place in the model (strict=False '
                     f'would load nothing): it is another model or a layout read wrongly; '
                     f'build the model with the matching {options} or pick the right layout=')
    elif len(hard_missing) * 3 > len(expected):
        lines.append(f'fix: build the model with the matching {options} or pick the right '
                     f'layout= (strict=False would leave {len(hard_missing)} of the model\'s '
                     f'{len(expected)} tensors at their initialisation)')
    else:
        lines.append(f'fix: build the model with the matching {options}, pick the right '
                     f'layout=, or load with strict=False to skip missing and unexpected keys')
    raise CheckpointMismatchError('\n'.join(lines))


def _pos_interp_note(model: nn.Module) -> str:
    """Which position-grid resampling the model uses, and where the choice came from."""
    mode = getattr(model, 'pos_interp', None)
    if mode is None or getattr(model, 'pos_embed', None) is None:
        return ''
    source = getattr(model, 'pos_interp_source', 'unknown origin')
    return (f'position grids are resampled with pos_interp={mode!r} ({source}; grid '
            f'{getattr(model, "pos_grid", "?")})')


def _fit_pos_grid(model: nn.Module, state_dict: Dict[str, torch.Tensor],
                  report: ConversionReport) -> None:
    """Resamples a checkpoint position grid of another size to a backbone's grid, in place of
    the parameter (which is kept: runners build the optimizer before loading)."""
    pos = state_dict.get('pos_embed')
    if not isinstance(model, TokenBackbone) or pos is None or model.pos_embed is None:
        return
    recorded = recorded_pos_grid(state_dict)
    if pos.shape == model.pos_embed.shape and model.on_model_grid(pos, recorded):
        return
    src = model.checkpoint_grid(pos, recorded)
    state_dict['pos_embed'] = model.resample_pos_embed(pos, recorded)
    # the grid it describes (or the square one without a record) is gone: the model's own
    # is loaded, and says so to the load_state_dict hook (which would resample it again)
    state_dict[POS_GRID_RECORD] = torch.tensor(tuple(model.pos_grid), dtype=torch.long)
    dst = model.pos_grid
    report.notes.append(f'pos_embed resampled ({model.pos_interp}) from a {src[0]}x{src[1]} '
                        f'grid to the model grid {dst[0]}x{dst[1]}')


def read_checkpoint(checkpoint: Union[str, Mapping[str, Any]],
                    layout: str = 'auto',
                    trust_checkpoint: bool = False,
                    **options: Any) -> Tuple[StateDict, ConversionReport, str]:
    """Reads a checkpoint file (or takes a dict) and converts it to the canonical layout.

    An OpenAI CLIP TorchScript release (the only source of TorchScript CLIP archives) gets
    the record of its MLP activation, QuickGELU (``mlp_act``), which its weights do not say.

    Args:
        checkpoint: Checkpoint file path or an in-memory (possibly wrapped) state dict.
        layout: Source layout, ``'auto'`` to detect it.
        trust_checkpoint: Allow a full unpickle of files that need it (see
            :func:`load_checkpoint_file`).
        **options: Layout converter options (see :func:`convert_state_dict`).

    Returns:
        ``(canonical state dict, conversion report, description of the source)``.
    """
    if isinstance(checkpoint, str):
        source = repr(checkpoint)
        raw = load_checkpoint_file(checkpoint, trust_checkpoint=trust_checkpoint)
    else:
        source = 'the checkpoint dict'
        raw = checkpoint
    converted, report = convert_state_dict(raw, layout=layout, **options)
    if (isinstance(checkpoint, str) and report.source_layout == 'openai_clip'
            and MLP_ACT_RECORD not in converted and is_torchscript_archive(checkpoint)):
        converted[MLP_ACT_RECORD] = encode_names(['quick_gelu'])
        report.notes.append("OpenAI CLIP TorchScript release: its MLP activation (QuickGELU) "
                            "recorded as mlp_act")
    return converted, report, source


def load_pretrained(model: nn.Module,
                    checkpoint: Union[str, Mapping[str, Any]],
                    layout: str = 'auto',
                    strict: bool = True,
                    trust_checkpoint: bool = False,
                    **options: Any) -> ConversionReport:
    """Converts a checkpoint and loads it into a backbone, all or nothing.

    Keys and shapes are compared first; any disagreement raises one
    :class:`CheckpointMismatchError` and leaves the model untouched.  The keys a backbone
    drops (``surplus_checkpoint_keys``: an Adventurer built without a mask token) are
    reported as dropped; a position grid of another size is resampled to the model grid.

    Args:
        model: A :class:`mmlinvit.backbones.VisionTransformer` or
            :class:`mmlinvit.backbones.Adventurer` (or any module in a canonical layout).
        checkpoint: Checkpoint file path or an in-memory (possibly wrapped) state dict.
        layout: Source layout, ``'auto'`` to detect it.
        strict: Whether missing / unexpected keys are errors; if False they are skipped and
            listed in the report.  Shape disagreements are always errors.  Missing keys that
            :func:`initialisable_missing_keys` allows never are (a mask token; the operator
            parameters of a block that comes from softmax attention): they keep their init
            and are listed in ``report.initialised``.
        trust_checkpoint: Allow a full unpickle of files that need it (see
            :func:`load_checkpoint_file`).
        **options: Layout converter options (see :func:`convert_state_dict`).

    Returns:
        The conversion report, with ``loaded``, ``missing``, ``initialised`` and
        ``unexpected`` filled in.  The report is logged (``logging``, logger
        ``mmlinvit.converters.loading``) at INFO; parameters that keep their init and ignored
        tensors are logged at WARNING, so they show at default verbosity.
    """
    converted, report, source = read_checkpoint(checkpoint, layout=layout,
                                                trust_checkpoint=trust_checkpoint, **options)
    check_act = getattr(model, 'check_checkpoint_act', None)
    if check_act is not None:
        check_act(converted, f'{source} (read as layout {report.source_layout!r})')
    surplus_warnings: List[str] = []
    if isinstance(model, TokenBackbone):
        dropped = []
        for key, reason in model.surplus_checkpoint_keys().items():
            if key in converted:
                del converted[key]
                report.drop(report.prefix + key, reason)
                dropped.append(key)
        surplus_warnings = model.surplus_key_warnings(dropped)
    missing, unexpected = check_state_dict_fits(
        model, converted, strict=strict,
        source=f'{source} (read as layout {report.source_layout!r})')
    loadable = {k: v for k, v in converted.items() if k not in unexpected}
    _fit_pos_grid(model, loadable, report)
    # Everything was checked above; strict=False only lets the allowed keys stay at init.
    model.load_state_dict(loadable, strict=False)
    report.loaded = len(loadable)
    report.missing = missing
    report.unexpected = unexpected
    report.initialised = initialisable_missing_keys(missing, converted, _optional_keys(model))
    note = _pos_interp_note(model)
    if note:
        report.notes.append(note)
    logger.info('Loaded %s into %s:\n%s', source, type(model).__name__, report.format())
    # Training records (what the weights were trained with) are not weights: a file without
    # them (official releases) is the normal case, reported at INFO above.
    records = set(getattr(model, 'TRAINING_RECORDS', ()))
    weights_missing = [k for k in missing if k not in records]
    if weights_missing:
        # Visible at default verbosity (WARNING): parameters that did not come from the file.
        logger.warning('%s: %d tensor(s) of %s are not in the checkpoint and keep their '
                       'init: %s', source, len(weights_missing), type(model).__name__,
                       '; '.join(report.describe_initialised(weights_missing)))
    for message in surplus_warnings:
        logger.warning('%s: %s', source, message)
    if unexpected:
        logger.warning('%s: %d checkpoint tensor(s) have no place in %s and were ignored '
                       '(strict=False): %s', source, len(unexpected), type(model).__name__,
                       ', '.join(summarise_keys(unexpected)))
    return report
