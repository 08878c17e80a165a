"""Adventurer: a causal Mamba-2 vision backbone (Wang et al., 2024), plain PyTorch.

Token order is ``[patch_1 .. patch_n, cls]``: the class token is appended at the END so that
the causal scan lets it read every patch.  Each block (residual stream x of n + 1 tokens)::

    t = RMSNorm(x)
    t = [flip(t[:, :-1]), t[:, -1:]]     only in flipped blocks (patches reversed, cls stays)
    t = [mean(t), t]                     "heading average" token prepended
    t = Mamba2Mixer(t)[:, 1:]            its output is dropped
    t = [flip(t[:, :-1]), t[:, -1:]]     flipped back, so every block keeps the patch order
    x = x + drop_path(t)
    x = x + drop_path(SwiGLU(RMSNorm(x)))   hidden width 2.5 x embed_dims

Flip schedules (``flip_schedule``):

* ``'paper'`` (default): every other block runs in the reverse direction (blocks 1, 3, 5, ...),
  which is what the paper and the comment of the public code describe ("execute it every two
  blocks").  Chosen as the default because it is the documented design and gives every
  patch token context from both sides at every depth.
* ``'official'``: the literal condition of the public code, ``n // 2 == 1``, which flips only
  blocks 2 and 3.  Use it to reproduce or fine-tune the released checkpoints, which were
  trained with it.
* ``'none'``, or a sequence of block indices to flip.

Parameter names follow the public code (``patch_embed.proj``, ``cls_token``, ``pos_embed``
with the class position LAST, ``layers.i.{norm, mixer.*, norm_mlp, mlp.w1, mlp.w2, mlp.w3}``,
``norm_f``) plus ``mask_token``, so released weights load with ``strict=True`` once the
classifier ``head.*`` is dropped (see :meth:`Adventurer.init_weights`).

Memory is O(N) in the number of tokens: the mixer's chunked scan never builds an N x N
tensor, only chunk x chunk blocks.  Inputs whose side is not a multiple of the patch size are
zero-padded at the bottom / right, as in mmseg's ViT (grid ``ceil(H / 16) x ceil(W / 16)``).
"""
import logging
import pickle
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmlinvit.layers.mamba2 import Mamba2Mixer
from mmlinvit.layers.norm import RMSNorm
from mmlinvit.layers.patch_embed import PatchEmbed
from mmlinvit.layers.pos_embed import infer_square_grid, resample_pos_grid
from mmlinvit.layers.transformer import DropPath
from .checkpointing import run_block
from .outputs import check_out_type, format_tokens, resolve_out_indices

logger = logging.getLogger(__name__)

#: Sizes of the public models (all patch 16, Mamba-2 headdim 64, d_state 64, expand 2).
ADVENTURER_SIZES: Dict[str, dict] = {
    't': dict(embed_dims=256, num_layers=12),
    's': dict(embed_dims=512, num_layers=12),
    'b': dict(embed_dims=768, num_layers=12),
    'l': dict(embed_dims=1024, num_layers=24),
}
_SIZE_ALIASES = {'tiny': 't', 'small': 's', 'base': 'b', 'large': 'l'}

FLIP_SCHEDULES = ('paper', 'official', 'none')
#: Checkpoint keys that wrap a state dict, unwrapped by :meth:`Adventurer.init_weights`.
CHECKPOINT_WRAPPER_KEYS = ('state_dict', 'model')
#: Key prefixes under which other models hold an Adventurer, tried in this order: a
#: ``mmlinvit.DistillationModel`` with a task-model student, one with a bare-backbone student
#: (ViT-Linearizer), an mmpretrain / mmseg task model.  The first prefix some key carries
#: selects the keys under it; every other key (teacher, connectors, heads...) is dropped.
CHECKPOINT_PREFIXES = ('student.backbone.', 'student.', 'backbone.')


@dataclass
class AdventurerCheckpointReport:
    """What :func:`select_adventurer_state_dict` / :meth:`Adventurer.init_weights` did.

    Attributes:
        source: The checkpoint (path or description).
        prefix: The prefix whose keys were kept (``''``: none, a plain backbone file).
        dropped: Checkpoint key -> why it was not loaded.
        notes: Value changes (e.g. a resampled position grid).
        loaded: Number of tensors loaded (0 until loaded).
    """
    source: str
    prefix: str = ''
    dropped: Dict[str, str] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    loaded: int = 0

    def summary(self) -> str:
        """One line: what was loaded, under which prefix, and what was dropped (grouped)."""
        reasons: Dict[str, List[str]] = {}
        for key, reason in self.dropped.items():
            reasons.setdefault(reason, []).append(key)
        parts = [f'loaded {self.loaded} tensors from {self.source}']
        if self.prefix:
            parts.append(f'keys under {self.prefix!r}')
        for reason, keys in sorted(reasons.items()):
            shown = ', '.join(sorted(keys)[:6]) + (' ...' if len(keys) > 6 else '')
            parts.append(f'dropped {len(keys)} ({reason}): {shown}')
        return '; '.join(parts + self.notes)


def select_adventurer_state_dict(
        checkpoint: Mapping[str, Any],
        source: str = 'the checkpoint') -> Tuple[Dict[str, torch.Tensor],
                                                  AdventurerCheckpointReport]:
    """Extracts Adventurer weights from a backbone file or a training checkpoint.

    Unwraps ``state_dict`` / ``model``, strips a DDP ``module.`` prefix, keeps the keys under
    the first of :data:`CHECKPOINT_PREFIXES` that occurs (a ``mmlinvit.DistillationModel``
    checkpoint: ``student.*``; its ``connectors.*``, wrapper ``mask_token`` and ``mask_step``
    are dropped) and drops classifier keys ``head.*`` (released ImageNet models).

    Args:
        checkpoint: The loaded checkpoint object.
        source: Description for the report and error messages.

    Returns:
        The Adventurer state dict and an :class:`AdventurerCheckpointReport`.

    Raises:
        TypeError: when no state dict of tensors is found.
    """
    obj: Any = checkpoint
    for key in CHECKPOINT_WRAPPER_KEYS:
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            obj = obj[key]
            break
    if not isinstance(obj, Mapping) or not obj:
        raise TypeError(f'{source} does not hold a state dict (got {type(obj).__name__})')
    state = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    report = AdventurerCheckpointReport(source)
    for key in obj:
        if key not in state:
            report.dropped[key] = 'not a tensor'
    if state and all(k.startswith('module.') for k in state):
        state = {k[len('module.'):]: v for k, v in state.items()}
    for prefix in CHECKPOINT_PREFIXES:
        if any(k.startswith(prefix) for k in state):
            report.prefix = prefix
            for key in state:
                if not key.startswith(prefix):
                    report.dropped[key] = f'outside {prefix!r}'
            state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            break
    for key in [k for k in state if k.startswith('head.')]:
        report.dropped[report.prefix + key] = 'classifier head'
        del state[key]
    return state, report


def flip_block_indices(schedule: Union[str, Sequence[int]], num_layers: int) -> List[int]:
    """Indices of the blocks that scan the patch tokens in reverse.

    Args:
        schedule: ``'paper'`` (odd blocks), ``'official'`` (``n // 2 == 1``: blocks 2, 3),
            ``'none'`` or an explicit sequence of block indices.
        num_layers: Depth.

    Returns:
        Sorted block indices.
    """
    if isinstance(schedule, str):
        if schedule == 'paper':
            return [n for n in range(num_layers) if n % 2 == 1]
        if schedule == 'official':
            return [n for n in range(num_layers) if n // 2 == 1]
        if schedule == 'none':
            return []
        raise KeyError(f'Unknown flip_schedule {schedule!r}; available: {FLIP_SCHEDULES} or a '
                       f'list of block indices')
    indices = sorted({int(n) for n in schedule})
    bad = [n for n in indices if not 0 <= n < num_layers]
    if bad:
        raise IndexError(f'flip_schedule indices {bad} are out of range for {num_layers} blocks')
    return indices


def stage_block_indices(num_layers: int, num_stages: int) -> List[int]:
    """Last block of each of ``num_stages`` equal stages (12 blocks, 4 stages: 2, 5, 8, 11)."""
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f'num_stages must be in [1, {num_layers}] (the depth), got {num_stages}')
    return [(k * num_layers) // num_stages - 1 for k in range(1, num_stages + 1)]


def flip_patches(tokens: torch.Tensor) -> torch.Tensor:
    """Reverses the patch tokens of ``[patches, cls]`` and keeps the class token last."""
    return torch.cat([tokens[:, :-1].flip(1), tokens[:, -1:]], dim=1)


class SwiGLUFFN(nn.Module):
    """w3(silu(w1 x) * w2 x), with the unpacked ``w1`` / ``w2`` / ``w3`` names of Adventurer.

    Args:
        in_dims: Input and output width.
        hidden_dims: Hidden width.
        drop: Dropout after ``w3``.
    """

    def __init__(self, in_dims: int, hidden_dims: int, drop: float = 0.0) -> None:
        super().__init__()
        self.w1 = nn.Linear(in_dims, hidden_dims)
        self.w2 = nn.Linear(in_dims, hidden_dims)
        self.w3 = nn.Linear(hidden_dims, in_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.w3(F.silu(self.w1(x)) * self.w2(x)))


class AdventurerBlock(nn.Module):
    """One Adventurer block on ``[patches, cls]`` tokens (see the module docstring).

    Hook point: a forward hook on ``self.mixer`` sees the mixer output of the n + 2 token
    sequence (heading token first, flipped order in flipped blocks); :meth:`forward_mixer`
    returns the branch output in the original token order.

    Args:
        embed_dims: Token width.
        mlp_hidden_dims: SwiGLU hidden width.
        flip: Whether this block scans the patches in reverse.
        mixer_cfg: Keyword arguments of :class:`~mmlinvit.layers.mamba2.Mamba2Mixer`.
        norm_eps: RMSNorm epsilon.
        drop_rate: Dropout after the MLP.
        drop_path_rate: Stochastic depth rate of both residual branches.
    """

    def __init__(self,
                 embed_dims: int,
                 mlp_hidden_dims: int,
                 flip: bool = False,
                 mixer_cfg: Optional[dict] = None,
                 norm_eps: float = 1e-5,
                 drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0) -> None:
        super().__init__()
        self.flip = flip
        self.norm = RMSNorm(embed_dims, eps=norm_eps)
        self.mixer = Mamba2Mixer(embed_dims, **(mixer_cfg or {}))
        self.norm_mlp = RMSNorm(embed_dims, eps=norm_eps)
        self.mlp = SwiGLUFFN(embed_dims, mlp_hidden_dims, drop=drop_rate)
        self.drop_path = DropPath(drop_path_rate)

    def forward_mixer(self, x: torch.Tensor) -> torch.Tensor:
        """Mixer branch for block input ``x`` (B, n + 1, C), in the original token order."""
        t = self.norm(x)
        if self.flip:
            t = flip_patches(t)
        t = torch.cat([t.mean(dim=1, keepdim=True), t], dim=1)  # heading average token
        t = self.mixer(t)[:, 1:]
        return flip_patches(t) if self.flip else t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.forward_mixer(x))
        return x + self.drop_path(self.mlp(self.norm_mlp(x)))

    def extra_repr(self) -> str:
        return f'flip={self.flip}'


class StageFeatures(NamedTuple):
    """Output of :meth:`Adventurer.forward_stages`.

    Attributes:
        stages: One (B, h * w, C) tensor per stage: the residual stream after the stage's last
            block, patch tokens only (no class / heading token), in the original patch order.
        tokens: Final normalised tokens (B, h * w + 1, C), class token last.
        hw_shape: The (h, w) patch grid.
    """
    stages: List[torch.Tensor]
    tokens: torch.Tensor
    hw_shape: Tuple[int, int]


class Adventurer(nn.Module):
    """Adventurer backbone with ViT-like outputs (classification, segmentation, distillation).

    Args:
        arch: Size in :data:`ADVENTURER_SIZES` (``'t'``, ``'s'``, ``'b'``, ``'l'`` or the long
            names) or a dict with ``embed_dims``, ``num_layers`` and optionally
            ``mlp_hidden_dims`` (default ``int(2.5 * embed_dims)``).
        img_size: Training resolution; sets the learned position grid.
        patch_size: Patch side.
        in_channels: Input channels.
        mixer_cfg: Overrides of the :class:`~mmlinvit.layers.mamba2.Mamba2Mixer` defaults
            (d_state 64, expand 2, headdim 64, d_conv 4, chunk_size 256, ngroups 1...).
        flip_schedule: ``'paper'`` (default), ``'official'``, ``'none'`` or block indices;
            see the module docstring.
        norm_eps: RMSNorm epsilon.
        with_mask_token: Whether a learnable ``mask_token`` exists (masked distillation).
            Build with ``False`` to load released checkpoints, which have none.
        drop_rate: Dropout after the position embedding and in the MLPs.
        drop_path_rate: Maximum stochastic depth rate, linearly increasing from 0 at the
            first block (the public code shifts this schedule by one block).
        out_indices: Block indices whose outputs :meth:`forward` returns (negative allowed).
        out_type: ``'raw'`` (B, n + 1, C), ``'cls_token'`` (B, C), ``'avg_featmap'`` (B, C: mean
            of patch tokens) or ``'featmap'`` (B, C, h, w).
        norm_all_outputs: Apply ``norm_f`` to every returned block, not only the last one.
        frozen_stages: Freeze the embeddings, tokens and the first ``frozen_stages`` blocks.
        pretrained: Checkpoint path loaded by :meth:`init_weights`.
        with_cp: Activation checkpointing of the blocks while training with gradients
            (recompute in backward; see :mod:`.checkpointing`).
    """

    def __init__(self,
                 arch: Union[str, dict] = 'b',
                 img_size: Union[int, Tuple[int, int]] = 224,
                 patch_size: int = 16,
                 in_channels: int = 3,
                 mixer_cfg: Optional[dict] = None,
                 flip_schedule: Union[str, Sequence[int]] = 'paper',
                 norm_eps: float = 1e-5,
                 with_mask_token: bool = True,
                 drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0,
                 out_indices: Union[int, Sequence[int]] = -1,
                 out_type: str = 'cls_token',
                 norm_all_outputs: bool = False,
                 frozen_stages: int = -1,
                 pretrained: Optional[str] = None,
                 with_cp: bool = False) -> None:
        super().__init__()
        if isinstance(arch, str):
            key = _SIZE_ALIASES.get(arch, arch)
            if key not in ADVENTURER_SIZES:
                raise KeyError(f'Unknown Adventurer arch {arch!r}; available: '
                               f'{sorted(ADVENTURER_SIZES)} (or {sorted(_SIZE_ALIASES)}) or a '
                               f'dict with embed_dims and num_layers')
            arch_cfg = dict(ADVENTURER_SIZES[key])
            self.arch = key
        else:
            missing = {'embed_dims', 'num_layers'} - set(arch)
            if missing:
                raise KeyError(f'Custom Adventurer arch dict is missing {sorted(missing)}')
            arch_cfg = dict(arch)
            self.arch = 'custom'
        check_out_type(out_type)

        self.embed_dims = arch_cfg['embed_dims']
        self.num_layers = arch_cfg['num_layers']
        mlp_hidden_dims = arch_cfg.get('mlp_hidden_dims', int(2.5 * self.embed_dims))
        self.patch_size = patch_size
        self.img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.pos_grid = (self.img_size[0] // patch_size, self.img_size[1] // patch_size)
        self.mixer_cfg = dict(mixer_cfg or {})
        self.flip_schedule = flip_schedule
        self.flip_indices = flip_block_indices(flip_schedule, self.num_layers)
        self.out_type = out_type
        self.norm_all_outputs = norm_all_outputs
        self.frozen_stages = frozen_stages
        self.pretrained = pretrained
        self.with_cp = with_cp
        #: What the last :meth:`init_weights` loaded and dropped (``None`` before).
        self.load_report: Optional[AdventurerCheckpointReport] = None

        self.patch_embed = PatchEmbed(in_channels, self.embed_dims, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, self.embed_dims))
        self.mask_token = (nn.Parameter(torch.zeros(1, self.embed_dims))
                           if with_mask_token else None)
        # Patch positions in raster order, then the class position (LAST, like the tokens).
        self.pos_embed = nn.Parameter(
            torch.zeros(1, self.pos_grid[0] * self.pos_grid[1] + 1, self.embed_dims))
        self.pos_drop = nn.Dropout(drop_rate)
        # linspace(0, drop_path_rate, depth) in Python (works under torch.device('meta'))
        dpr = [drop_path_rate * i / max(self.num_layers - 1, 1) for i in range(self.num_layers)]
        self.layers = nn.ModuleList([
            AdventurerBlock(
                self.embed_dims,
                mlp_hidden_dims,
                flip=i in self.flip_indices,
                mixer_cfg=self.mixer_cfg,
                norm_eps=norm_eps,
                drop_rate=drop_rate,
                drop_path_rate=dpr[i]) for i in range(self.num_layers)
        ])
        self.norm_f = RMSNorm(self.embed_dims, eps=norm_eps)

        self.out_indices = resolve_out_indices(out_indices, self.num_layers)
        self._init_parameters()
        self._register_load_state_dict_pre_hook(self._adapt_pos_embed_on_load)
        self._freeze_stages()

    # ------------------------------------------------------------------ construction
    @torch.no_grad()
    def _init_parameters(self) -> None:
        """Initialisation of the public code.

        Tokens and position embeddings: truncated normal (std 0.02).  Patch projection:
        LeCun normal (std sqrt(1 / fan_in), truncated at 2 std), zero bias.  Linear layers:
        PyTorch default weights, zero biases; every ``mixer.out_proj.weight`` divided by
        sqrt(depth) (prenorm residual rescaling).  Mamba-2 parameters: see
        :class:`~mmlinvit.layers.mamba2.Mamba2Mixer`.
        """
        for p in (self.cls_token, self.pos_embed, self.mask_token):
            if p is not None:
                nn.init.trunc_normal_(p, std=0.02)
        proj = self.patch_embed.proj
        fan_in = proj.in_channels * proj.kernel_size[0] * proj.kernel_size[1]
        std = fan_in**-0.5
        nn.init.trunc_normal_(proj.weight, std=std, a=-2 * std, b=2 * std)
        if proj.bias is not None:
            nn.init.zeros_(proj.bias)
        for m in self.layers.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for blk in self.layers:
            blk.mixer.out_proj.weight.div_(self.num_layers**0.5)

    def init_weights(self) -> None:
        """Loads ``pretrained`` if set (mmengine calls this); otherwise keeps the init.

        The file is read with ``torch.load(weights_only=True)`` and passed through
        :func:`select_adventurer_state_dict`, so a plain backbone file, a released model
        (``head.*`` dropped), a task-model checkpoint (``backbone.*``) and a
        ``mmlinvit.DistillationModel`` checkpoint of a distilled Adventurer (``student.*``;
        connectors and the wrapper's masking state dropped) all load.  A ``mask_token`` in
        the checkpoint is dropped when this model is built with ``with_mask_token=False``
        (the token is only used by masked distillation, never by :meth:`forward`).
        Everything else must match exactly (``strict=True``); a mismatch raises a
        ``KeyError`` that lists the missing and unexpected keys.  A checkpoint position grid
        of another (square) size is resampled (bicubic) to this model's grid before loading,
        so the ``pos_embed`` parameter is kept: runners build the optimizer and the DDP
        wrapper before ``init_weights``, and mmengine refuses replaced parameters.  What was
        loaded, dropped and resampled is logged and kept in ``self.load_report``
        (:class:`AdventurerCheckpointReport`).
        """
        if not self.pretrained:
            return
        try:
            ckpt = torch.load(self.pretrained, map_location='cpu', weights_only=True)
        except pickle.UnpicklingError as err:
            raise TypeError(
                f'{self.pretrained} holds Python objects besides tensors (an mmengine runner '
                f'checkpoint with its training state?), which the safe torch.load('
                f'weights_only=True) refuses. Use the student_backbone.pth written by '
                f'mmlinvit.ExportStudentHook, or re-save the weights of a checkpoint you trust '
                f'with tools/model_converters/export_student.py CKPT OUT --trust-checkpoint'
            ) from err
        state, report = select_adventurer_state_dict(ckpt, str(self.pretrained))
        if self.mask_token is None and 'mask_token' in state:
            report.dropped[report.prefix + 'mask_token'] = (
                'mask token of masked distillation; this model has with_mask_token=False')
            del state['mask_token']
        self._fit_pos_grid(state, report)
        own = set(self.state_dict())
        missing, unexpected = sorted(own - set(state)), sorted(set(state) - own)
        if missing or unexpected:
            hints = []
            if 'mask_token' in missing:
                hints.append('the checkpoint has no mask_token: build with with_mask_token=False')
            if report.dropped:
                hints.append(report.summary())
            raise KeyError(f'Checkpoint {self.pretrained} does not match Adventurer '
                           f'({self.arch}): missing keys {missing}; unexpected keys '
                           f'{unexpected}' + (f" ({'; '.join(hints)})" if hints else ''))
        self.load_state_dict(state, strict=True)
        report.loaded = len(state)
        self.load_report = report
        logger.info('Adventurer.init_weights: %s', report.summary())

    def _fit_pos_grid(self, state: Dict[str, torch.Tensor],
                      report: AdventurerCheckpointReport) -> None:
        """Resamples a checkpoint ``pos_embed`` of another square grid to ``self.pos_grid``.

        Shapes that are no (1, s * s + 1, C) grid of this width are left to the strict load,
        which reports them.
        """
        pos = state.get('pos_embed')
        if (pos is None or pos.shape == self.pos_embed.shape or pos.ndim != 3
                or pos.shape[0] != 1 or pos.shape[-1] != self.embed_dims):
            return
        src = infer_square_grid(pos.shape[1] - 1)
        patches = resample_pos_grid(pos[:, :-1], src, self.pos_grid, 'bicubic')
        state['pos_embed'] = torch.cat([patches.to(pos.dtype), pos[:, -1:]], dim=1)
        report.notes.append(f'pos_embed resampled (bicubic) from a {src[0]}x{src[1]} grid to '
                            f'the model grid {self.pos_grid[0]}x{self.pos_grid[1]}')

    def _freeze_stages(self) -> None:
        if self.frozen_stages < 0:
            return
        for p in (self.cls_token, self.mask_token, self.pos_embed):
            if p is not None:
                p.requires_grad_(False)
        for mod in [self.patch_embed] + list(self.layers[:self.frozen_stages]):
            mod.eval()
            for p in mod.parameters():
                p.requires_grad_(False)

    def train(self, mode: bool = True) -> 'Adventurer':
        super().train(mode)
        self._freeze_stages()
        return self

    def _adapt_pos_embed_on_load(self, state_dict: Dict[str, torch.Tensor], prefix: str,
                                 *args) -> None:
        """Adopts the checkpoint's (square) position grid; forward resamples it."""
        key = prefix + 'pos_embed'
        if key not in state_dict:
            return
        ckpt = state_dict[key]
        if (ckpt.shape == self.pos_embed.shape or ckpt.ndim != 3
                or ckpt.shape[-1] != self.embed_dims):
            return  # matching, or a mismatch load_state_dict reports with both shapes
        self.pos_grid = infer_square_grid(ckpt.shape[1] - 1)
        self.pos_embed = nn.Parameter(torch.empty_like(ckpt, device=self.pos_embed.device),
                                      requires_grad=self.pos_embed.requires_grad)

    # ------------------------------------------------------------------ forward pieces
    @property
    def num_heads(self) -> int:
        """Mamba-2 heads per block."""
        return self.layers[0].mixer.nheads

    def patch_pos_embed(self, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """Patch position embeddings resampled (bicubic) to ``hw_shape``, (1, h * w, C)."""
        return resample_pos_grid(self.pos_embed[:, :-1], self.pos_grid, hw_shape, 'bicubic')

    def prepare_tokens(self,
                       x: torch.Tensor,
                       patch_mask: Optional[torch.Tensor] = None,
                       mask_token: Optional[torch.Tensor] = None
                       ) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """Patchify, mask, add position embeddings and append the class token.

        Args:
            x: Images (B, C, H, W).
            patch_mask: Optional (B, h * w) bool; True patches are replaced by the mask token
                before the position embedding is added.
            mask_token: (1, C) or (C,) token for masked patches; defaults to
                ``self.mask_token``.

        Returns:
            Tokens (B, h * w + 1, C) with the class token last, and the (h, w) grid.
        """
        tokens, hw_shape = self.patch_embed(x)
        b, n, _ = tokens.shape
        if patch_mask is not None:
            token = self.mask_token if mask_token is None else mask_token
            if token is None:
                raise ValueError('patch_mask given but the model has no mask token; build it '
                                 'with with_mask_token=True or pass mask_token')
            if tuple(patch_mask.shape) != (b, n):
                raise ValueError(f'patch_mask must be (batch, h * w) = {(b, n)}, got '
                                 f'{tuple(patch_mask.shape)}')
            tokens = torch.where(patch_mask.unsqueeze(-1),
                                 token.to(tokens.dtype).reshape(1, 1, -1), tokens)
        tokens = tokens + self.patch_pos_embed(hw_shape).to(tokens.dtype)
        cls = (self.cls_token + self.pos_embed[:, -1:]).to(tokens.dtype).expand(b, -1, -1)
        return self.pos_drop(torch.cat([tokens, cls], dim=1)), hw_shape

    def format_output(self, tokens: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """Turns (B, n + 1, C) tokens (class token last) into the configured ``out_type``."""
        return format_tokens(tokens, self.out_type, -1, slice(None, -1), hw_shape)

    def forward_tokens(self,
                       x: torch.Tensor,
                       patch_mask: Optional[torch.Tensor] = None,
                       mask_token: Optional[torch.Tensor] = None
                       ) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """Final normalised tokens (B, h * w + 1, C), class token last, and the grid."""
        tokens, hw_shape = self.prepare_tokens(x, patch_mask, mask_token)
        for blk in self.layers:
            tokens = run_block(blk, tokens, with_cp=self.with_cp)
        return self.norm_f(tokens), hw_shape

    def forward_stages(self,
                       x: torch.Tensor,
                       patch_mask: Optional[torch.Tensor] = None,
                       num_stages: int = 4,
                       mask_token: Optional[torch.Tensor] = None,
                       normalize_stages: bool = False) -> StageFeatures:
        """Per-stage patch features and final tokens in one pass (activation distillation).

        The depth is split into ``num_stages`` equal stages (:func:`stage_block_indices`);
        the residual stream after each stage's last block is returned for the patch tokens
        only (class and heading tokens excluded), in the original raster order.

        Args:
            x: Images (B, C, H, W).
            patch_mask: Optional (B, h * w) bool mask (see :meth:`prepare_tokens`).
            num_stages: Number of stages K (1 <= K <= depth).
            mask_token: Optional replacement of ``self.mask_token``.
            normalize_stages: Apply ``norm_f`` to the stage features too.

        Returns:
            :class:`StageFeatures` (stages, final normalised tokens, grid).
        """
        ends = set(stage_block_indices(self.num_layers, num_stages))
        tokens, hw_shape = self.prepare_tokens(x, patch_mask, mask_token)
        stages = []
        for i, blk in enumerate(self.layers):
            tokens = run_block(blk, tokens, with_cp=self.with_cp)
            if i in ends:
                feats = self.norm_f(tokens) if normalize_stages else tokens
                stages.append(feats[:, :-1])
        return StageFeatures(stages, self.norm_f(tokens), hw_shape)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """Outputs of the blocks in ``out_indices``, formatted by ``out_type``."""
        tokens, hw_shape = self.prepare_tokens(x)
        outs = []
        last = self.num_layers - 1
        for i, blk in enumerate(self.layers):
            tokens = run_block(blk, tokens, with_cp=self.with_cp)
            if i in self.out_indices:
                out = self.norm_f(tokens) if (i == last or self.norm_all_outputs) else tokens
                outs.append(self.format_output(out, hw_shape))
        return tuple(outs)

    # ------------------------------------------------------------------ optimisation helpers
    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """Layer depth of a parameter for layer-wise learning-rate decay.

        Embeddings and tokens are depth 0, block i is depth i + 1, everything after the
        blocks (``norm_f``, heads) is ``num_layers + 1``.

        Args:
            param_name: Full parameter name.
            prefix: Prefix of this backbone's parameters in ``param_name``
                (e.g. ``'backbone.'``).

        Returns:
            (layer_depth, num_layers + 2).
        """
        total = self.num_layers + 2
        if not param_name.startswith(prefix):
            return total - 1, total
        name = param_name[len(prefix):]
        if name.split('.')[0] in ('cls_token', 'mask_token', 'pos_embed', 'patch_embed'):
            return 0, total
        if name.startswith('layers.'):
            return int(name.split('.')[1]) + 1, total
        return total - 1, total
