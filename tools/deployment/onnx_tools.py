"""Shared pieces of the ONNX deployment tools (:mod:`export_onnx`, :mod:`benchmark_onnx`).

* :func:`build_export_module` builds the model of a config through the OpenMMLab registries,
  loads a checkpoint (strict; read by :func:`mmlinvit.converters.load_checkpoint_file`:
  ``torch.load(weights_only=True)``, or a full unpickle with ``trust_checkpoint=True``, which
  mmengine runner checkpoints need for their pickled training state) and returns the module to
  export: the whole task model in ``mode='tensor'`` (mmseg segmentor: decode-head logits;
  mmpretrain classifier: class logits) or a backbone (tuple of its outputs) - the student of
  a distillation model by default, its softmax teacher with ``which='teacher'``.
* :func:`export_onnx` runs ``torch.onnx.export(dynamo=True)`` (``torch.export`` based; linear
  attention takes its whole-tensor graph form while exporting) at a FIXED input size: the
  ViTs resample their position grid to the input grid inside ``forward``, so the grid is
  part of the graph.  Export once per deployment resolution.
* :func:`onnxruntime_outputs` / :func:`max_abs_errors` run the file with onnxruntime (CPU
  execution provider) and compare it with PyTorch.

Imports of onnx / onnxruntime / OpenMMLab happen inside the functions that need them.
"""
import contextlib
import inspect
import json
import logging
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

PARTS = ('auto', 'model', 'backbone')
WHICH = ('student', 'teacher')
DEFAULT_OPSET = 18


class BackboneExport(nn.Module):
    """A backbone whose forward returns a tuple of tensors (ONNX outputs ``out0``...).

    Args:
        backbone: Any mmlinvit backbone (``forward(images) -> tuple``).
    """

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, images: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        outs = self.backbone(images)
        return tuple(outs) if isinstance(outs, (tuple, list)) else (outs, )


class TaskModelExport(nn.Module):
    """An OpenMMLab task model in ``mode='tensor'`` (segmentor logits / classifier logits).

    Args:
        model: An mmseg segmentor or an mmpretrain classifier.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        outs = self.model(images, None, mode='tensor')
        return tuple(outs) if isinstance(outs, (tuple, list)) else (outs, )


def load_weights(module: nn.Module, path: str, where: str,
                 trust_checkpoint: bool = False) -> str:
    """Loads ``path`` strictly into ``module``; a whole-model file may hold it under a prefix.

    Args:
        module: The module the weights are for.
        path: Checkpoint file.
        where: Name of the module for messages (``'model'``, ``'student backbone'``...).
        trust_checkpoint: Allow a full unpickle of the file: mmengine runner checkpoints
            (``iter_N.pth`` / ``epoch_N.pth``) hold pickled training state (message hub,
            optimizer) besides the weights.  Only for trusted files.

    A ViT backbone also takes any layout :mod:`mmlinvit.converters` reads (timm, DINOv2 hub,
    OpenAI CLIP, mmpretrain: a softmax teacher's original checkpoint) when no prefix matches.

    Returns:
        The key prefix the weights were taken from (``''`` for an exact match), or
        ``'converted'`` when the converters loaded them.

    Raises:
        UntrustedCheckpointError: the file holds pickled objects besides tensors and
            ``trust_checkpoint`` is False (the message names ``--trust-checkpoint``).
        CheckpointFileError: the file is empty, truncated or not a checkpoint.
        ValueError: the keys match but some shapes do not (named).
        KeyError: no prefix of the file matches the module exactly (and, for a ViT, the
            converters refused it too); the message lists the missing / unexpected keys of
            the closest candidate.
    """
    from mmlinvit.backbones import VisionTransformer
    from mmlinvit.converters import load_checkpoint_file
    from mmlinvit.engine.checkpoint_coverage import (check_evaluated_operators,
                                                     optional_model_keys)
    state = load_checkpoint_file(path, trust_checkpoint=trust_checkpoint)
    own = set(module.state_dict().keys())
    # keys a checkpoint may lack (training records of files from before them, a mask token):
    # they keep the module's own values, as on every other loading path
    optional = optional_model_keys(module)
    candidates = ['', 'backbone.', 'student.', 'student.backbone.', 'teacher.',
                  'teacher.backbone.', 'model.']
    best: Optional[Tuple[int, str, List[str], List[str]]] = None
    for prefix in candidates:
        sub = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if prefix and not sub:
            continue  # no key of the file: not a candidate to name in the message
        missing = sorted(own - set(sub) - optional)
        unexpected = sorted(set(sub) - own)
        if not missing and not unexpected:
            own_state = module.state_dict()
            shapes = [f'{k}: {tuple(v.shape)} vs {tuple(own_state[k].shape)}'
                      for k, v in sub.items() if tuple(v.shape) != tuple(own_state[k].shape)]
            if shapes:
                raise ValueError(f'{path} has the keys of the {where} but other shapes '
                                 f'(checkpoint vs model; another size or config?): '
                                 f'{shapes[:6]}{"..." if len(shapes) > 6 else ""}')
            # softmax weights load into a linear operator only to start a linearization
            check_evaluated_operators(module, sub, path, escape='')
            module.load_state_dict(sub, strict=False)  # only optional keys may be absent
            return prefix
        score = len(missing) + len(unexpected)
        if best is None or score < best[0]:
            best = (score, prefix, missing, unexpected)
    _, prefix, missing, unexpected = best
    if isinstance(module, VisionTransformer):
        from mmlinvit.converters import load_pretrained
        try:
            load_pretrained(module, path, trust_checkpoint=trust_checkpoint)
            return 'converted'
        except (KeyError, ValueError) as err:
            raise KeyError(f'{path} does not hold the weights of the {where} in the canonical '
                           f'layout (closest key prefix {prefix!r} misses {missing[:8]}, '
                           f'unexpected {unexpected[:8]}), and the converters refused it: '
                           f'{err}') from err
    raise KeyError(f'{path} does not hold the weights of the {where}: closest key prefix '
                   f'{prefix!r} misses {missing[:8]}{"..." if len(missing) > 8 else ""} and has '
                   f'unexpected {unexpected[:8]}{"..." if len(unexpected) > 8 else ""}')


#: The distillation teacher's build-time note when it has no checkpoint of its own.
RANDOM_TEACHER_NOTE = 'The teacher has no checkpoint'


def _not_random_teacher_note(record: logging.LogRecord) -> bool:
    """Drops the teacher's "keeps its random initialisation" note (the export's CHECKPOINT
    supplies the weights; the config's checkpoint paths are cleared)."""
    return not record.getMessage().startswith(RANDOM_TEACHER_NOTE)


def build_export_module(config: str,
                        checkpoint: Optional[str],
                        part: str = 'auto',
                        which: str = 'student',
                        cfg_options: Optional[Dict[str, Any]] = None,
                        trust_checkpoint: bool = False
                        ) -> Tuple[nn.Module, Dict[str, Any]]:
    """Builds the module to export from a config and a checkpoint.

    Args:
        config: Config file.
        checkpoint: Checkpoint file (runner checkpoint, exported student backbone or any
            state dict whose keys match under one of the usual prefixes); ``None`` keeps the
            random initialisation (tests, benchmarks).
        part: ``'model'`` (task model, ``mode='tensor'``), ``'backbone'``, or ``'auto'``
            (the task model for mmseg / mmpretrain task models, the backbone otherwise).
        which: For distillation models: ``'student'`` or ``'teacher'``.
        cfg_options: Config overrides (``{'model.backbone.arch': 't'}``).
        trust_checkpoint: Allow a full unpickle of ``checkpoint`` (mmengine runner
            checkpoints hold their pickled training state; only for trusted files).

    Returns:
        The eval-mode export module and a description dict (what was exported, crop size,
        checkpoint prefix).
    """
    from mmengine.logging import print_log
    from mmengine.model import BaseModel
    from mmengine.registry import MODELS, init_default_scope

    from mmlinvit.engine.launch import adapt_to_device, load_config
    from mmlinvit.engine.log_filtering import current_logger_filter
    from mmlinvit.engine.preflight import clear_checkpoints
    from mmlinvit.models.distill import DistillationModel
    if part not in PARTS:
        raise ValueError(f'part must be one of {PARTS}, got {part!r}')
    if which not in WHICH:
        raise ValueError(f'which must be one of {WHICH}, got {which!r}')
    cfg = load_config(config, cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    clear_checkpoints(cfg.model)  # the weights come from the exported checkpoint instead
    if cfg.get('data_preprocessor') is not None:  # as mmengine's Runner merges it
        cfg.model.setdefault('data_preprocessor', cfg.data_preprocessor)
    adapt_to_device(cfg)
    with (current_logger_filter(_not_random_teacher_note) if checkpoint is not None
          else contextlib.nullcontext()):
        model = MODELS.build(cfg.model)
    if isinstance(model, DistillationModel):
        if which == 'teacher' and model.teacher is None:
            raise ValueError(f'{config}: the distillation model has no teacher to export')
        task = model.student if which == 'student' else model.teacher
        backbone = model.student_backbone() if which == 'student' else model.teacher_backbone()
    else:
        if which == 'teacher':
            raise ValueError(f'{config} is not a distillation model; export its teacher from '
                             "the teacher's own config (or with which='student')")
        task, backbone = model, getattr(model, 'backbone', model)
    if part == 'auto':
        part = 'model' if isinstance(task, BaseModel) and task is not backbone else 'backbone'
    if part == 'model' and not (isinstance(task, BaseModel) and task is not backbone):
        raise ValueError(f'{config}: the {which} is a bare backbone; export part "backbone"')
    head = getattr(task, 'decode_head', None)
    if part == 'model' and head is not None and _needs_data_samples(head):
        raise ValueError(
            f'{config}: {type(head).__name__}.forward needs data samples (batch_data_samples) '
            f'and its pixel decoder does not pass torch.export: the whole segmentor cannot be '
            f'exported. Export the backbone with --part backbone and run the neck and head in '
            f'PyTorch.')
    prefix = None
    if checkpoint is not None:
        # Whole-model files load into the whole model (distillation: teacher weights are not
        # saved, so load what exists into the exported part instead).
        target = task if part == 'model' else backbone
        prefix = load_weights(target, checkpoint, f'{which} {part}', trust_checkpoint)
        print_log(f'Exporting the {which} {part} with the weights of {checkpoint}'
                  f'{f" (keys under {prefix!r})" if prefix else ""}', logger='current',
                  level=logging.WARNING if which == 'teacher' else logging.INFO)
    module = TaskModelExport(task) if part == 'model' else BackboneExport(backbone)
    module.eval()
    info = dict(config=config, checkpoint=checkpoint, part=part, which=which,
                model=type(task).__name__, backbone=type(backbone).__name__,
                checkpoint_prefix=prefix, crop=_config_crop(cfg, backbone),
                patch_size=_patch_size(backbone),
                # a segmentor pads to the patch grid outside its backbone (and crops the
                # prediction back), as the graph cannot; classifiers pad inside it
                pads_outside_backbone=head is not None)
    info['input'] = graph_input_convention(model, task, which, info)
    return module, info


def _needs_data_samples(head: nn.Module) -> bool:
    """Whether a decode head's ``forward`` has a required ``batch_data_samples`` argument
    (mmseg's Mask2Former head), which ``mode='tensor'`` does not pass."""
    params = inspect.signature(head.forward).parameters
    param = params.get('batch_data_samples')
    return param is not None and param.default is inspect.Parameter.empty


def graph_input_convention(model: nn.Module, task: nn.Module, which: str,
                           info: Dict[str, Any]) -> Dict[str, Any]:
    """What the exported graph takes: the data preprocessor's output, which the graph does not
    contain (written into the ONNX file's metadata and the tool's JSON).

    Args:
        model: The config's model (a distillation model, or the task model itself).
        task: The exported task model (or the distillation model's part).
        which: ``'student'`` or ``'teacher'``.
        info: The export description so far (``patch_size``, ``pads_outside_backbone``).

    Returns:
        ``mean`` / ``std`` (0-255 units; ``None`` when the preprocessor does not normalise),
        ``bgr_to_rgb`` (the preprocessor's channel swap of the loaded image), the padding
        multiple, where a segmentor pads (``patch_padding``; None when the graph pads) and a
        sentence saying how to prepare an image.
    """
    from mmlinvit.models.distill import DistillationConfigError
    from mmlinvit.models.distill.teacher_input_norm import student_input_stats
    pre = getattr(model, 'data_preprocessor', None)
    try:
        # the preprocessor's fp32 buffers, as the shortest decimals that give them back in
        # fp32 (123.675, not 123.67500305175781)
        mean, std = ([float(str(value)) for value in t.numpy()]
                     for t in student_input_stats(pre))
    except DistillationConfigError:  # the preprocessor does not normalise
        mean = std = None
    teacher_norm = getattr(model, 'teacher_input_norm', None)
    if which == 'teacher' and teacher_norm is not None:
        mean, std = teacher_norm.stats['mean'], teacher_norm.stats['std']
    # mmseg's SegDataPreProcessor / mmpretrain's ClsDataPreprocessor name the swap apart
    swap = bool(getattr(pre, '_channel_conversion', getattr(pre, 'to_rgb', False)))
    patch = info.get('patch_size')
    # mmlinvit.EncoderDecoder pads the normalised input with zeros: at the bottom / right
    # ('corner', mmseg's) or split evenly, the extra row / column at the bottom / right
    # ('center', DINOv2's CenterPadding)
    padding = getattr(task, 'patch_padding', 'corner') if info.get('pads_outside_backbone') \
        else None
    where = ('split evenly between both sides (the extra row / column at the bottom / right; '
             'patch_padding=center)' if padding == 'center' else
             'at the bottom / right (patch_padding=corner)')
    how = ('the data preprocessor\'s output: the image as the test pipeline loads it (BGR '
           'for files read by LoadImageFromFile)' + (', channels reversed to RGB' if swap else
                                                    '') +
           (f', then (x - mean) / std with mean {mean} and std {std} (0-255 units)'
            if mean is not None else ', not normalised') +
           (f'; pad H and W with zeros (after normalising) to multiples of the patch size '
            f'{where}; resize the logits (bilinear, align_corners=False) to the padded size, '
            f'crop them back to the image (same offsets), resize them to the original image '
            f'if the test pipeline resized it, and take the argmax'
            if info.get('pads_outside_backbone') else
            '; a side off the patch grid is padded inside the graph (bottom / right)'))
    return dict(mean=mean, std=std, bgr_to_rgb=swap, pad_to_multiple=patch,
                patch_padding=padding, prepare=how)


def write_onnx_metadata(path: str, entries: Dict[str, Any]) -> None:
    """Adds ``entries`` (JSON-encoded values) to an ONNX file's ``metadata_props``.

    Args:
        path: The ONNX file (external weight files, if any, are left alone).
        entries: Key -> value.
    """
    import onnx
    proto = onnx.load(path, load_external_data=False)
    for key, value in entries.items():
        prop = proto.metadata_props.add()
        prop.key, prop.value = key, json.dumps(value)
    onnx.save(proto, path)


def _patch_size(backbone: nn.Module) -> Optional[int]:
    patch = getattr(backbone, 'patch_size', None)
    if isinstance(patch, (tuple, list)):
        patch = patch[0]
    return None if patch is None else int(patch)


def check_export_shape(shape: Tuple[int, int], patch_size: Optional[int]) -> None:
    """Refuses an export size that is not a multiple of the patch size.

    The exported graph is the model's ``mode='tensor'`` / backbone forward, which pads such an
    input inside the backbone at the bottom / right, whereas ``tools/test.py`` and
    ``tools/infer.py`` pad where the segmentor's ``patch_padding`` says (centred for DINOv2)
    and crop the prediction back: the graph would compute something else than the evaluated
    model, without any error.

    Args:
        shape: (H, W) of the export.
        patch_size: The backbone's patch size (``None``: no check).

    Raises:
        ValueError: naming the nearest valid ``--shape``.
    """
    if patch_size is None or all(s % patch_size == 0 for s in shape):
        return
    up = [-(-s // patch_size) * patch_size for s in shape]
    raise ValueError(
        f'--shape {shape[0]} {shape[1]} is not a multiple of the patch size {patch_size}: the '
        f'graph would pad inside the backbone, unlike the evaluated model; export at '
        f'--shape {up[0]} {up[1]} and pad the images to it as the config does (e.g. '
        f"patch_padding='center' for DINOv2)")


def _config_crop(cfg: Any, backbone: nn.Module) -> Tuple[int, int]:
    crop = cfg.get('crop_size', None)
    if crop is None:
        crop = (cfg.model.get('data_preprocessor') or {}).get('size', None)
    if crop is None:
        crop = getattr(backbone, 'img_size', (224, 224))
    if isinstance(crop, int):
        crop = (crop, crop)
    return int(crop[0]), int(crop[1])


def export_onnx(module: nn.Module, images: torch.Tensor, path: str,
                opset: int = DEFAULT_OPSET) -> List[str]:
    """Exports ``module(images)`` to ``path`` (fixed input shape); returns output names.

    Args:
        module: Eval-mode module returning a tuple of tensors.
        images: Example input (B, 3, H, W); its shape is baked into the graph.
        path: Output ``.onnx`` file (weights stored inside the file).
        opset: ONNX opset.
    """
    with torch.no_grad():
        n_out = len(module(images))
    names = [f'out{i}' for i in range(n_out)]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with torch.no_grad():
        program = torch.onnx.export(module, (images, ), dynamo=True, opset_version=opset,
                                     input_names=['images'], output_names=names,
                                     external_data=False, verbose=False)
    program.save(path, external_data=False)
    return names


def onnxruntime_session(path: str, threads: int = 2) -> Any:
    """An onnxruntime CPU session with ``threads`` intra-op threads."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    # No busy-waiting of idle pool threads: on a shared CPU, spinning threads steal the cores
    # the working ones need.
    options.add_session_config_entry('session.intra_op.allow_spinning', '0')
    return ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])


def onnxruntime_outputs(session: Any, images: torch.Tensor) -> List[torch.Tensor]:
    """Runs the session on ``images``; outputs as torch tensors."""
    outs = session.run(None, {session.get_inputs()[0].name: images.numpy()})
    return [torch.from_numpy(o) for o in outs]


def max_abs_errors(got: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> List[float]:
    """max |got - ref| per output (shapes must match)."""
    if len(got) != len(ref):
        raise ValueError(f'{len(got)} onnxruntime outputs vs {len(ref)} PyTorch outputs')
    errors = []
    for i, (a, b) in enumerate(zip(got, ref)):
        if tuple(a.shape) != tuple(b.shape):
            raise ValueError(f'output {i}: onnxruntime shape {tuple(a.shape)} vs PyTorch '
                             f'{tuple(b.shape)}')
        errors.append(float((a.float() - b.float()).abs().max()))
    return errors
