"""Converters from official checkpoint layouts to the canonical layouts of the backbones.

The canonical ViT layout is the one of :class:`mmlinvit.backbones.VisionTransformer` (timm
names): ``cls_token``, ``reg_token``, ``mask_token`` (1, C), ``pos_embed`` (class position
first when the model has a class token, never register positions), ``patch_embed.proj``,
``pre_norm``, ``blocks.i.{norm1, attn.qkv, attn.proj, ls1.gamma, norm2, mlp.fc1, mlp.fc2,
ls2.gamma}``, ``norm``.  :class:`mmlinvit.backbones.Adventurer` keeps the names of the public
Adventurer code (layout ``'adventurer'``).

Each converter takes a flat ``{name: tensor}`` dict and returns the canonical dict plus a
:class:`~.report.ConversionReport`.  Every value change is exact (a zero class position, a
register position folded into the register token), so converted models reproduce the
source model's features.  Keys a converter does not know pass through unchanged, so that
:func:`mmlinvit.converters.load_pretrained` reports them instead of silently dropping them;
only parts that are not the backbone (heads, decoders, text towers) are dropped, and the
report lists them.
"""
import math
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from mmlinvit.utils import NameRegistry
from mmlinvit.layers.pos_embed import POS_GRID_RECORD, recorded_pos_grid
from .checkpoint_file import CheckpointFileError
from .report import ConversionReport

StateDict = Dict[str, torch.Tensor]
ConversionResult = Tuple[StateDict, ConversionReport]

#: Registered layout converters: name -> function(state_dict, **options).
CHECKPOINT_LAYOUTS = NameRegistry('checkpoint layout')

#: The one table of wrapper prefixes under which checkpoints hold a backbone, selected before
#: detection (every backbone's ``pretrained``, :func:`mmlinvit.converters.convert_state_dict`,
#: ``tools/model_converters/export_student.py``), in order of preference: the first one that
#: some key carries selects the keys under it; the others are dropped and reported.  A DDP
#: ``module.`` on every key is stripped first.  ``student.backbone.`` / ``student.``:
#: checkpoints of mmlinvit.DistillationModel (task-model / bare-backbone student, e.g. the
#: ViT-Linearizer Adventurer; the teacher is never saved there); ``backbone.``: mmpretrain /
#: mmseg task models.
BACKBONE_PREFIXES = ('teacher.backbone.', 'student.backbone.', 'backbone.', 'student.')
#: The teacher's prefix in :data:`BACKBONE_PREFIXES`.  It comes first for DINOv2's training
#: checkpoints, which hold ``student.backbone.`` and ``teacher.backbone.``: the teacher is the
#: network DINOv2 evaluates and releases.
TEACHER_PREFIX = 'teacher.backbone.'
#: Where mmrazor's distillation checkpoints keep their student (the teacher: ``teacher.``).
#: Not loaded here; a file with it and a teacher is refused (:func:`select_backbone`).
MMRAZOR_STUDENT_PREFIX = 'architecture.'
#: The prefixes of :data:`BACKBONE_PREFIXES` that hold a distillation student.
STUDENT_PREFIXES = tuple(p for p in BACKBONE_PREFIXES if p.startswith('student.'))
#: Keys of the HuggingFace transformers ViT / DINOv2 / CLIP vision models
#: (``embeddings.patch_embeddings.projection``, ``encoder.layer.N.attention.attention.query``,
#: CLIP's ``embeddings.patch_embedding`` and ``encoder.layers.N.self_attn``).
HF_TRANSFORMERS_KEY = re.compile(
    r'(^|\.)(embeddings\.patch_embeddings?\.|encoder\.layers?\.\d+\.(attention\.attention|'
    r'self_attn)\.)')
#: Keys only Adventurer blocks have (Mamba-2 mixer, SwiGLU norm).
ADVENTURER_BLOCK_KEY = re.compile(r'^layers\.\d+\.(mixer|norm_mlp)\.')
#: Adventurer's record of the blocks that reverse the patch scan (a bool per block).
FLIPS_RECORD = 'flipped_blocks'
_LAYER_INDEX = re.compile(r'^layers\.(\d+)\.')


def _is_square(n: int) -> bool:
    return n > 0 and math.isqrt(n)**2 == n


def _rename(out: StateDict, report: ConversionReport, src: str, dst: str,
            value: torch.Tensor) -> None:
    if dst in out:
        raise ValueError(f'Two checkpoint keys map to {dst!r} (the second is {src!r}); the '
                         f'checkpoint mixes layouts')
    out[dst] = value
    if src != dst:
        report.renamed[src] = dst


def _keys_under(state_dict: Mapping[str, torch.Tensor], prefix: str, report: ConversionReport,
                drop_reason: str) -> StateDict:
    """The keys under ``prefix``, without it; every other key is dropped with ``drop_reason``."""
    out = {}
    for k, v in state_dict.items():
        if k.startswith(prefix):
            out[k[len(prefix):]] = v
        else:
            report.drop(k, drop_reason)
    return out


def _first_swap(name: str, swaps: Sequence[Tuple[str, str]]) -> str:
    """``name`` with the first of the ``(pattern, replacement)`` swaps that matches applied."""
    for pattern, repl in swaps:
        new, count = re.subn(pattern, repl, name)
        if count:
            return new
    return name


def select_backbone(state_dict: Mapping[str, torch.Tensor],
                    prefixes: Sequence[str] = BACKBONE_PREFIXES) -> ConversionResult:
    """Strips DDP ``module.`` and keeps the keys under a backbone prefix.

    Args:
        state_dict: Flat checkpoint dict.
        prefixes: The prefixes to look for, in order of preference (a subset of
            :data:`BACKBONE_PREFIXES`, e.g. :data:`STUDENT_PREFIXES`).

    Returns:
        The backbone's keys without the prefix, and a report (layout ``'prefix'``) naming the
        prefix used (``report.prefix``, ``''`` when no key carries one) and listing the keys
        left out (heads, necks, DINO heads, connectors, data preprocessors...).
    """
    report = ConversionReport(source_layout='prefix')
    sd = dict(state_dict)
    if sd and all(k.startswith('module.') for k in sd):
        sd = {k[len('module.'):]: v for k, v in sd.items()}
        report.notes.append("stripped the 'module.' prefix of every key")
    _refuse_teacher_and_student(sd, prefixes)
    for prefix in prefixes:
        if any(k.startswith(prefix) for k in sd):
            out = _keys_under(sd, prefix, report, f'outside {prefix!r}')
            report.prefix = prefix
            return out, report
    return sd, report


def _refuse_teacher_and_student(state_dict: Mapping[str, torch.Tensor],
                                prefixes: Sequence[str]) -> None:
    """Refuses an mmrazor distillation checkpoint (student under ``architecture.``, teacher
    under ``teacher.``) where the teacher's prefix would be selected.

    Taking the first prefix of the table loaded the teacher, with no error, where the
    distilled student was almost always meant (``architecture.`` is not in the table).
    """
    if TEACHER_PREFIX not in prefixes:
        return
    teacher = sum(k.startswith(TEACHER_PREFIX) for k in state_dict)
    student = sum(k.startswith(MMRAZOR_STUDENT_PREFIX) for k in state_dict)
    if teacher and student:
        raise CheckpointFileError(
            f'The checkpoint is an mmrazor distillation checkpoint: a student ({student} keys '
            f'under {MMRAZOR_STUDENT_PREFIX!r}) and a teacher ({teacher} keys under '
            f'{TEACHER_PREFIX!r}); which one to load is not clear. For the student, keep the '
            f'keys under {MMRAZOR_STUDENT_PREFIX!r} without the prefix in a file of their own '
            f'(mmrazor: tools/model_converters/convert_kd_ckpt_to_student.py); for the '
            f'teacher, load its original file.')


def detect_layout(state_dict: Mapping[str, torch.Tensor]) -> str:
    """Names the layout of a flat (prefix-stripped) checkpoint dict.

    Args:
        state_dict: Flat checkpoint dict, after :func:`select_backbone`.

    Returns:
        ``'openai_clip'``, ``'adventurer'``, ``'mmpretrain'``, ``'dinov2'`` or ``'timm'``.

    Raises:
        ValueError: when no layout matches; the message shows some of the keys.
    """
    keys = list(state_dict)
    hf = next((k for k in keys if HF_TRANSFORMERS_KEY.search(k)), None)
    if hf is not None:
        raise ValueError(
            f'The checkpoint is in the HuggingFace transformers layout (e.g. {hf!r}), which '
            f'mmlinvit does not convert (its layouts: {CHECKPOINT_LAYOUTS.names}). Use the '
            f'original release of the same weights: the DINOv2 hub files '
            f'(dinov2_vitb14_pretrain.pth ...), the OpenAI CLIP / open_clip files, or the timm '
            f'files (vit_*.safetensors from timm\'s hub repositories).')
    if any(re.search(r'(^|\.)class_embedding$', k) for k in keys) or any(
            'transformer.resblocks.' in k for k in keys):
        return 'openai_clip'
    if 'norm_f.weight' in state_dict or any(ADVENTURER_BLOCK_KEY.match(k) for k in keys):
        return 'adventurer'
    if ('patch_embed.projection.weight' in state_dict
            or any(re.match(r'layers\.\d+\.(ln1|attn\.qkv)\.', k) for k in keys)):
        return 'mmpretrain'
    mask_token = state_dict.get('mask_token')
    if ('register_tokens' in state_dict
            or any(re.match(r'blocks\.\d+\.\d+\.', k) or '.mlp.w12.' in k for k in keys)
            or (mask_token is not None and mask_token.ndim == 2)):
        return 'dinov2'
    if 'patch_embed.proj.weight' in state_dict or any(k.startswith('blocks.') for k in keys):
        return 'timm'
    raise ValueError(f'Cannot detect the layout of a checkpoint with keys {sorted(keys)[:12]}'
                     f'{" ..." if len(keys) > 12 else ""}; pass layout= one of '
                     f'{CHECKPOINT_LAYOUTS.names}')


@CHECKPOINT_LAYOUTS.register_module('dinov2')
def convert_dinov2(state_dict: Mapping[str, torch.Tensor]) -> ConversionResult:
    """facebookresearch/dinov2 hub layout -> canonical.

    ``register_tokens`` -> ``reg_token``; chunked ``blocks.<chunk>.<i>.`` -> ``blocks.<i>.``;
    SwiGLU ``mlp.w12`` / ``mlp.w3`` -> ``mlp.fc1`` / ``mlp.fc2``; ``mask_token`` (1, C) and
    ``pos_embed`` (class position first, no register positions) are kept as they are.

    Args:
        state_dict: Flat DINOv2 backbone state dict (``backbone.`` already stripped).

    Returns:
        Canonical state dict and report.
    """
    report = ConversionReport(source_layout='dinov2')
    out: StateDict = {}
    chunked = False
    for key, value in state_dict.items():
        new = key
        if key == 'register_tokens':
            new = 'reg_token'
        elif key.startswith('head.'):
            report.drop(key, 'classification head (not part of the backbone)')
            continue
        elif key == 'mask_token' and value.ndim != 2:
            value = value.reshape(1, -1)
            report.notes.append(f'mask_token reshaped to (1, {value.shape[-1]})')
        match = re.match(r'^blocks\.(\d+)\.(\d+)\.(.*)$', new)
        if match:
            new = f'blocks.{match.group(2)}.{match.group(3)}'
            chunked = True
        new = re.sub(r'\.mlp\.w12\.', '.mlp.fc1.', new)
        new = re.sub(r'\.mlp\.w3\.', '.mlp.fc2.', new)
        _rename(out, report, key, new, value)
    if chunked:
        report.notes.append('flattened chunked blocks (blocks.<chunk>.<i> -> blocks.<i>)')
    return out, report


def _fix_timm_pos_embed(out: StateDict, report: ConversionReport,
                        no_embed_class: Optional[bool]) -> None:
    """Brings a timm ``pos_embed`` to the canonical one (class position, no registers)."""
    pos = out.get('pos_embed')
    if pos is None or pos.ndim != 3:
        return
    has_cls = 'cls_token' in out
    num_reg = out['reg_token'].shape[1] if 'reg_token' in out else 0
    length = pos.shape[1]
    recorded = recorded_pos_grid(out)  # mmlinvit files: the grid's (rows, cols)
    if recorded is not None:
        count = recorded[0] * recorded[1]

        def fits(n: int) -> bool:
            return n == count
    else:
        fits = _is_square
    # Candidate readings of the pos_embed rows, by how many prefix rows precede the grid.
    readings = {
        'no_embed_class': 0,  # timm no_embed_class=True: grid only
        'canonical': int(has_cls),  # class position, no register positions
        'all_prefix': int(has_cls) + num_reg,  # timm no_embed_class=False: every prefix
    }
    if no_embed_class is True:
        if not fits(length):  # like no_embed_class=False, a reading that does not fit is refused
            grid = (f'the recorded {recorded[0]}x{recorded[1]} grid' if recorded is not None
                    else 'a square grid')
            raise ValueError(f'no_embed_class=True reads all {length} pos_embed rows as grid '
                             f'positions, but they are not {grid} (class token: {has_cls}, '
                             f'register tokens: {num_reg}); pass no_embed_class=False, or None '
                             f'to infer the reading from the row count')
        names = ['no_embed_class']
    elif no_embed_class is False:
        names = [n for n in ('all_prefix', 'canonical') if fits(length - readings[n])][:1]
    else:
        names = [n for n, rows in readings.items() if fits(length - rows)]
    grids = {length - readings[n] for n in names}
    if not names and fits is not _is_square:
        raise ValueError(
            f'The checkpoint records a {recorded[0]}x{recorded[1]} position grid '
            f'({POS_GRID_RECORD}) but its pos_embed has {length} rows, which is that grid after '
            f'none of {sorted(set(readings.values()))} prefix rows: the file is inconsistent '
            f'(pos_embed edited without its record?)')
    if not names:
        raise ValueError(
            f'pos_embed has {length} rows, which is no square grid after '
            f'{sorted(set(readings.values()))} prefix rows (class token: {has_cls}, register '
            f'tokens: {num_reg}). A grid learned at a non-square image size cannot be read off '
            f'its row count: mmlinvit files record it ({POS_GRID_RECORD}); for a file from '
            f'before the record, or other code, build the model with the image size the grid '
            f'was learned at (img_size=(H, W)) and add the record: '
            f'state_dict[{POS_GRID_RECORD!r}] = torch.tensor([rows, cols])')
    if len(grids) > 1:
        raise ValueError(f'pos_embed with {length} rows is ambiguous for {num_reg} register '
                         f'tokens (readings {names}); pass no_embed_class=True or False')
    name = names[0]
    if readings[name] == readings['canonical']:
        return
    if name == 'no_embed_class':
        if has_cls:
            zero = torch.zeros_like(pos[:, :1])
            out['pos_embed'] = torch.cat([zero, pos], dim=1)
            report.notes.append('no_embed_class pos_embed: prepended a zero class position '
                                '(the class token already holds its position)')
        return
    # all_prefix with registers: fold the constant register positions into the tokens.
    start = int(has_cls)
    out['reg_token'] = out['reg_token'] + pos[:, start:start + num_reg].to(out['reg_token'])
    out['pos_embed'] = torch.cat([pos[:, :start], pos[:, start + num_reg:]], dim=1)
    report.notes.append(f'folded {num_reg} register positions into reg_token')


_DIST_TOKEN_NOTE = ('DeiT distilled checkpoint: its distillation token (dist_token) is read '
                    'as one register token (the same computation): build with '
                    'num_reg_tokens=1')


@CHECKPOINT_LAYOUTS.register_module('timm')
def convert_timm(state_dict: Mapping[str, torch.Tensor],
                 no_embed_class: Optional[bool] = None) -> ConversionResult:
    """timm VisionTransformer layout -> canonical (also DeiT, DeiT-III and MAE releases).

    ``norm_pre`` -> ``pre_norm``; ``head.*``, ``fc_norm.*``, ``attn_pool.*`` and MAE decoder
    keys are dropped (reported); a ``no_embed_class`` ``pos_embed`` gets a zero class row;
    register positions (``no_embed_class=False`` with registers) are folded into
    ``reg_token``.  Old DeiT-III ``gamma_1``/``gamma_2`` become ``ls1.gamma``/``ls2.gamma``.

    Args:
        state_dict: Flat timm state dict.
        no_embed_class: How ``pos_embed`` rows line up with the prefix tokens; ``None``
            infers it from the row count (an error names the ambiguity if there is one).

    Returns:
        Canonical state dict and report.
    """
    report = ConversionReport(source_layout='timm')
    is_mae_pretrain = any(k.startswith('decoder_') for k in state_dict)
    out: StateDict = {}
    for key, value in state_dict.items():
        if key.startswith(('head.', 'head_dist.', 'head_drop.', 'pre_logits.')):
            report.drop(key, 'classification head (not part of the backbone)')
            continue
        if key == 'dist_token' and 'reg_token' not in state_dict:
            # DeiT distilled: [cls, dist, patches] with a position for each, which is a model
            # with one register token whose position is folded in (_fix_timm_pos_embed).
            _rename(out, report, key, 'reg_token', value)
            report.notes.append(_DIST_TOKEN_NOTE)
            continue
        if key.startswith('fc_norm.'):
            report.drop(key, 'pooled-feature norm of the head (backbone features are '
                        'pre-pooling)')
            continue
        if key.startswith('attn_pool.'):
            report.drop(key, 'attention-pooling head (not part of the backbone)')
            continue
        if is_mae_pretrain and (key.startswith('decoder_') or key == 'mask_token'):
            report.drop(key, 'MAE decoder')
            continue
        new = key
        if key.startswith('norm_pre.'):
            new = 'pre_norm.' + key[len('norm_pre.'):]
        new = re.sub(r'\.gamma_([12])$', r'.ls\1.gamma', new)
        _rename(out, report, key, new, value)
    _fix_timm_pos_embed(out, report, no_embed_class)
    return out, report


_CLIP_SWAPS = (
    (r'^conv1\.', 'patch_embed.proj.'),
    (r'^ln_pre\.', 'pre_norm.'),
    (r'^ln_post\.', 'norm.'),
    (r'^transformer\.resblocks\.(\d+)\.ln_1\.', r'blocks.\1.norm1.'),
    (r'^transformer\.resblocks\.(\d+)\.ln_2\.', r'blocks.\1.norm2.'),
    (r'^transformer\.resblocks\.(\d+)\.attn\.in_proj_weight$', r'blocks.\1.attn.qkv.weight'),
    (r'^transformer\.resblocks\.(\d+)\.attn\.in_proj_bias$', r'blocks.\1.attn.qkv.bias'),
    (r'^transformer\.resblocks\.(\d+)\.attn\.out_proj\.', r'blocks.\1.attn.proj.'),
    (r'^transformer\.resblocks\.(\d+)\.mlp\.c_fc\.', r'blocks.\1.mlp.fc1.'),
    (r'^transformer\.resblocks\.(\d+)\.mlp\.c_proj\.', r'blocks.\1.mlp.fc2.'),
    # OpenCLIP's variant of the layout adds LayerScale.
    (r'^transformer\.resblocks\.(\d+)\.ls_1\.gamma$', r'blocks.\1.ls1.gamma'),
    (r'^transformer\.resblocks\.(\d+)\.ls_2\.gamma$', r'blocks.\1.ls2.gamma'),
)


@CHECKPOINT_LAYOUTS.register_module('openai_clip')
def convert_openai_clip(state_dict: Mapping[str, torch.Tensor],
                        keep_projection: bool = False) -> ConversionResult:
    """OpenAI CLIP ViT layout (whole model or ``model.visual``) -> canonical.

    The image tower's ``visual.`` keys are kept (the text tower is dropped and reported);
    ``conv1`` -> ``patch_embed.proj``, ``class_embedding`` -> ``cls_token``,
    ``positional_embedding`` -> ``pos_embed``, ``ln_pre`` -> ``pre_norm``,
    ``transformer.resblocks.i.{ln_1, attn.in_proj_*, attn.out_proj, ln_2, mlp.c_fc,
    mlp.c_proj}`` -> ``blocks.i.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}``,
    ``ln_post`` -> ``norm``.  The backbone outputs pre-projection features, so ``proj`` is
    dropped, or set aside in ``report.extras['proj']`` (C, D) with ``keep_projection``.

    Args:
        state_dict: Flat OpenAI CLIP state dict.
        keep_projection: Return ``proj`` in ``report.extras`` instead of dropping it.

    Returns:
        Canonical state dict and report.
    """
    report = ConversionReport(source_layout='openai_clip')
    sd = dict(state_dict)
    prefix = ''
    if any(k.startswith('visual.') for k in sd):
        prefix = 'visual.'
        sd = _keys_under(sd, prefix, report,
                         'CLIP text tower / logit scale (not the image encoder)')
    if any(k.startswith(('layer1.', 'attnpool.')) for k in sd):
        raise ValueError('This is a ResNet CLIP checkpoint (layer1 / attnpool keys); only '
                         'ViT CLIP checkpoints convert to the ViT backbone')
    out: StateDict = {}
    for key, value in sd.items():
        if key == 'proj':
            if keep_projection:
                report.extras['proj'] = value
                report.notes.append(f'proj {tuple(value.shape)} set aside in extras')
            else:
                report.drop(prefix + key, 'image projection into the joint embedding space '
                            '(features are pre-projection; keep_projection=True keeps it)')
            continue
        if key == 'class_embedding':
            _rename(out, report, prefix + key, 'cls_token', value.reshape(1, 1, -1))
            continue
        if key == 'positional_embedding':
            _rename(out, report, prefix + key, 'pos_embed', value.reshape(1, *value.shape[-2:]))
            continue
        _rename(out, report, prefix + key, _first_swap(key, _CLIP_SWAPS), value)
    return out, report


_MMPRETRAIN_BLOCK_SWAPS = (
    (r'^ln1\.', 'norm1.'),
    (r'^ln2\.', 'norm2.'),
    (r'^attn\.gamma1\.weight$', 'ls1.gamma'),
    (r'^ffn\.gamma2\.weight$', 'ls2.gamma'),
    (r'^ffn\.layers\.0\.0\.', 'mlp.fc1.'),
    (r'^ffn\.layers\.1\.', 'mlp.fc2.'),
    (r'^ffn\.w12\.', 'mlp.fc1.'),
    (r'^ffn\.w3\.', 'mlp.fc2.'),
    # mmseg's ViT: nn.MultiheadAttention inside ``attn.attn`` (in_proj rows are q, k, v)
    (r'^attn\.attn\.in_proj_(weight|bias)$', r'attn.qkv.\1'),
    (r'^attn\.attn\.out_proj\.', 'attn.proj.'),
)


@CHECKPOINT_LAYOUTS.register_module('mmpretrain')
def convert_mmpretrain(state_dict: Mapping[str, torch.Tensor]) -> ConversionResult:
    """mmpretrain (and mmseg) ``VisionTransformer`` layout -> canonical.

    ``patch_embed.projection`` -> ``patch_embed.proj``; ``layers.i.{ln1, attn.qkv, attn.proj,
    attn.gamma1.weight, ln2, ffn.layers.0.0, ffn.layers.1, ffn.gamma2.weight}`` (or SwiGLU
    ``ffn.w12`` / ``ffn.w3``) -> ``blocks.i.{norm1, attn.qkv, attn.proj, ls1.gamma, norm2,
    mlp.fc1, mlp.fc2, ls2.gamma}``; mmseg's ``attn.attn.in_proj_*`` / ``attn.attn.out_proj``
    -> ``attn.qkv`` / ``attn.proj``; final ``ln1`` -> ``norm``; ``pre_norm`` kept (mmseg's
    ``ln_pre`` -> ``pre_norm``); the
    ``avg_featmap`` output norm ``ln2`` -> ``avg_norm`` (loaded by ``avg_featmap_norm=True``
    backbones, dropped with a warning by ``'avg_featmap'`` ones without it).

    Args:
        state_dict: Flat mmpretrain backbone state dict (``backbone.`` already stripped).

    Returns:
        Canonical state dict and report.
    """
    report = ConversionReport(source_layout='mmpretrain')
    out: StateDict = {}
    for key, value in state_dict.items():
        if key.startswith('ln2.'):  # the avg_featmap output norm (``avg_featmap_norm``)
            _rename(out, report, key, 'avg_norm.' + key[len('ln2.'):], value)
            continue
        new = key
        if key == 'dist_token' and 'reg_token' not in state_dict:
            _rename(out, report, key, 'reg_token', value)
            report.notes.append(_DIST_TOKEN_NOTE)
            continue
        if key.startswith('patch_embed.projection.'):
            new = 'patch_embed.proj.' + key[len('patch_embed.projection.'):]
        elif key.startswith('ln1.'):
            new = 'norm.' + key[len('ln1.'):]
        elif key.startswith('ln_pre.'):  # mmseg's ViT(pre_norm=True)
            new = 'pre_norm.' + key[len('ln_pre.'):]
        else:
            match = re.match(r'^layers\.(\d+)\.(.*)$', key)
            if match:
                rest = _first_swap(match.group(2), _MMPRETRAIN_BLOCK_SWAPS)
                new = f'blocks.{match.group(1)}.{rest}'
        _rename(out, report, key, new, value)
    # mmpretrain's DeiT3 has no class position (timm's no_embed_class), its DeiT distilled
    # one per prefix token.
    _fix_timm_pos_embed(out, report, None)
    return out, report


@CHECKPOINT_LAYOUTS.register_module('adventurer')
def convert_adventurer(state_dict: Mapping[str, torch.Tensor]) -> ConversionResult:
    """Public Adventurer code (wangf3014/Adventurer ``models_mamba.py``) -> :class:`Adventurer`.

    The backbone keeps the public names (``patch_embed.proj``, ``cls_token``, ``pos_embed``
    with the class position last, ``layers.i.{norm, mixer.*, norm_mlp, mlp.w1, mlp.w2,
    mlp.w3}``, ``norm_f``; ``mask_token`` of masked distillation), so only the ImageNet
    classifier ``head.*`` is dropped (reported).  A file of the public code (its unprefixed
    ``head.*``, no ``flipped_blocks`` record; mmlinvit task models keep their heads outside
    the backbone's prefix) gets the record of the flips its code trains with, blocks with
    ``n // 2 == 1`` (``flip_schedule='official'``), so that every loading path refuses it in
    a model of other flips (:class:`mmlinvit.backbones.Adventurer`).

    Args:
        state_dict: Flat Adventurer state dict (wrapper prefixes already stripped).

    Returns:
        The state dict and report.
    """
    report = ConversionReport(source_layout='adventurer')
    out: StateDict = {}
    for key, value in state_dict.items():
        if key.startswith('head.'):
            report.drop(key, 'classifier head')
            continue
        out[key] = value
    if 'head.weight' in state_dict and FLIPS_RECORD not in state_dict:
        depth = 1 + max((int(m.group(1)) for m in map(_LAYER_INDEX.match, state_dict) if m),
                        default=-1)
        if depth > 0:
            out[FLIPS_RECORD] = torch.tensor([n // 2 == 1 for n in range(depth)],
                                             dtype=torch.bool)
            report.notes.append(f'public Adventurer code file (classifier head.*, no '
                                f'{FLIPS_RECORD} record): its flips, blocks with n // 2 == 1 '
                                f"(flip_schedule='official'), recorded as {FLIPS_RECORD}")
    return out, report


def layout_names() -> List[str]:
    """``'auto'`` followed by the registered layouts."""
    return ['auto'] + CHECKPOINT_LAYOUTS.names
