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

The flips are part of what the weights were trained for, so they travel with them: the
persistent buffer ``flipped_blocks`` (one bool per block) is saved in every checkpoint, and
loading a checkpoint whose ``flipped_blocks`` differ fails, naming both schedules
(``check_flip_schedule=False`` loads it on purpose, with a warning).  A file of the public code
(its unprefixed classifier ``head.*``) gets the record of its code's flips (``'official'``)
when it is read (the ``'adventurer'`` layout of :mod:`mmlinvit.converters`), so it is refused
the same way on every loading path; mmlinvit's checkpoints from before the record load as
they are.

Parameter names follow the public code (``patch_embed.proj``, ``cls_token``, ``pos_embed``
with the class position LAST, ``layers.i.{norm, mixer.*, norm_mlp, mlp.w1, mlp.w2, mlp.w3}``,
``norm_f``) plus ``mask_token``, so released weights load with ``strict=True`` once the
classifier ``head.*`` is dropped (the ``'adventurer'`` layout of :mod:`mmlinvit.converters`,
used by :meth:`Adventurer.init_weights`).

Memory is O(N) in the number of tokens: the mixer's chunked scan never builds an N x N
tensor, only chunk x chunk blocks.  Inputs whose side is not a multiple of the patch size are
zero-padded at the bottom / right, as in mmseg's ViT (grid ``ceil(H / 16) x ceil(W / 16)``).
"""
import warnings
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmlinvit.layers.mamba2 import Mamba2Mixer
from mmlinvit.layers.norm import RMSNorm
from mmlinvit.layers.patch_embed import PatchEmbed
from mmlinvit.layers.pos_embed import POS_GRID_RECORD
from mmlinvit.layers.transformer import DropPath
from .base import TokenBackbone
from .checkpointing import run_block
from .outputs import check_out_type
from .training_record import TrainingRecordMismatchError

#: Sizes of the public models (all patch 16, Mamba-2 headdim 64, d_state 64, expand 2).
ADVENTURER_SIZES: Dict[str, dict] = {
    't': dict(embed_dims=256, num_layers=12),
    's': dict(embed_dims=512, num_layers=12),
    'b': dict(embed_dims=768, num_layers=12),
    'l': dict(embed_dims=1024, num_layers=24),
}
_SIZE_ALIASES = {'tiny': 't', 'small': 's', 'base': 'b', 'large': 'l'}

FLIP_SCHEDULES = ('paper', 'official', 'none')


class FlipScheduleMismatchError(TrainingRecordMismatchError):
    """Checkpoint weights were trained with other patch flips than the model's."""


def describe_flips(indices: Sequence[int], num_layers: int,
                   schedule: Union[str, Sequence[int], None] = None) -> str:
    """``[1, 3, 5] (flip_schedule='paper')``: the flipped blocks and their schedule name.

    Args:
        indices: Flipped block indices.
        num_layers: Depth.
        schedule: The name they were built from, if known; otherwise every name of
            :data:`FLIP_SCHEDULES` that gives these indices at this depth.
    """
    indices = sorted(int(i) for i in indices)
    if isinstance(schedule, str):
        names = [schedule]
    else:
        names = [n for n in FLIP_SCHEDULES if flip_block_indices(n, num_layers) == indices]
    if not names:
        return f'{indices}'
    return f'{indices} (flip_schedule=' + ' or '.join(f"'{n}'" for n in names) + ')'

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
        """Without autograd the gate is applied in place on the hidden buffer (less memory)."""
        if torch.is_grad_enabled():
            return self.drop(self.w3(F.silu(self.w1(x)) * self.w2(x)))
        hidden = F.silu(self.w1(x), inplace=True).mul_(self.w2(x))
        return self.drop(self.w3(hidden))


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



#: Per-block stochastic depth rules of :class:`Adventurer` (``drop_path_schedule``).
DROP_PATH_SCHEDULES = ('official', 'linear')


def drop_path_rates(rate: float, depth: int, schedule: str = 'official') -> List[float]:
    """Stochastic depth rate of each block (plain Python: works under ``torch.device('meta')``).

    Args:
        rate: The maximum rate.
        depth: Number of blocks.
        schedule: ``'official'``: the public Adventurer code's ``[0] + linspace(0, rate,
            depth)``, block i taking entry i (shifted by one block); ``'linear'``:
            ``linspace(0, rate, depth)``.

    Raises:
        ValueError: for an unknown schedule, naming the known ones.
    """
    if schedule not in DROP_PATH_SCHEDULES:
        raise ValueError(f'Unknown drop_path_schedule {schedule!r}; available: '
                         f'{DROP_PATH_SCHEDULES}')
    linear = [rate * i / max(depth - 1, 1) for i in range(depth)]
    return ([0.0] + linear)[:depth] if schedule == 'official' else linear

class Adventurer(TokenBackbone):
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
        drop_path_rate: Maximum stochastic depth rate of the per-block schedule.
        drop_path_schedule: ``'official'`` (default; the public Adventurer code's rule:
            ``([0] + linspace(0, rate, depth))[i]`` for block i, so blocks 0 and 1 have none
            and the last has ``rate (depth - 2) / (depth - 1)``) or ``'linear'``
            (``linspace(0, rate, depth)``, timm's ViT rule).
        out_indices: Block indices whose outputs :meth:`forward` returns (negative allowed).
        out_type: ``'raw'`` (B, n + 1, C), ``'cls_token'`` (B, C), ``'avg_featmap'`` (B, C: mean
            of patch tokens), ``'featmap'`` (B, C, h, w) or ``'cls_avg'`` (class tokens of the
            ``out_indices`` blocks and the last one's mean patch token, concatenated).
        norm_all_outputs: Apply ``norm_f`` to every returned block, not only the last one.
        frozen_stages: Freeze the embeddings, tokens and the first ``frozen_stages`` blocks
            (all of them: the final norm too); 0 or less freezes nothing (mmpretrain's ViT).
        pretrained: Checkpoint path loaded by :meth:`init_weights`: a backbone file, a
            released model (``head.*`` dropped), a task-model checkpoint (``backbone.*``) or a
            ``mmlinvit.DistillationModel`` checkpoint (``student.*``; its connectors and
            masking state dropped), read as the ``'adventurer'`` layout of
            :mod:`mmlinvit.converters`.  A checkpoint ``mask_token`` is dropped for a model
            built with ``with_mask_token=False``; everything else must match.
        with_cp: Activation checkpointing of the blocks while training with gradients
            (recompute in backward; see :mod:`.checkpointing`).
        check_flip_schedule: Refuse weights trained with other flips than this model's
            (their ``flipped_blocks`` record; files of the public Adventurer code are read as
            ``flip_schedule='official'``).  ``False`` loads them anyway, with a warning
            (fine-tuning them with other flips on purpose).
    """

    BLOCKS = 'layers'
    FINAL_NORM = 'norm_f'
    STEM = ('cls_token', 'mask_token', 'pos_embed', 'patch_embed', 'pos_drop')
    BUILD_OPTIONS = 'arch / with_mask_token / mixer_cfg / flip_schedule'
    TRAINING_RECORDS = ('flipped_blocks', POS_GRID_RECORD)
    OPTIONAL_CHECKPOINT_KEYS = {
        'flipped_blocks': 'record of the patch flips (mmlinvit checkpoints from before the '
                          'record have none): the flips of flip_schedule are used',
        POS_GRID_RECORD: 'record of the (rows, cols) grid of pos_embed (checkpoints of the '
                         'public code and of mmlinvit before the record have none; their grid '
                         "is square): the model's grid is recorded",
    }

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
                 drop_path_schedule: str = 'official',
                 out_indices: Union[int, Sequence[int]] = -1,
                 out_type: str = 'cls_token',
                 norm_all_outputs: bool = False,
                 frozen_stages: int = -1,
                 pretrained: Optional[str] = None,
                 with_cp: bool = False,
                 check_flip_schedule: bool = True) -> None:
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
        self.check_flip_schedule = check_flip_schedule
        # Saved with the weights, checked when loading (see the module docstring).
        self.register_training_record('flipped_blocks', torch.tensor(
            [i in self.flip_indices for i in range(self.num_layers)], dtype=torch.bool))
        self.out_type = out_type
        self.norm_all_outputs = norm_all_outputs
        self.frozen_stages = frozen_stages
        self.pretrained = pretrained
        self.with_cp = with_cp
        self.pos_interp = 'bicubic'
        self.pos_interp_source = 'fixed for Adventurer'
        self.checkpoint_layout = 'adventurer'
        self.load_report = None  # ConversionReport of init_weights' pretrained load

        self.patch_embed = PatchEmbed(in_channels, self.embed_dims, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, self.embed_dims))
        self.mask_token = (nn.Parameter(torch.zeros(1, self.embed_dims))
                           if with_mask_token else None)
        # Patch positions in raster order, then the class position (LAST, like the tokens).
        self.pos_embed = nn.Parameter(
            torch.zeros(1, self.pos_grid[0] * self.pos_grid[1] + 1, self.embed_dims))
        self.pos_drop = nn.Dropout(drop_rate)
        dpr = drop_path_rates(drop_path_rate, self.num_layers, drop_path_schedule)
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

        self._finish_init(out_indices)

    # ------------------------------------------------------------------ construction
    @torch.no_grad()
    def _init_parameters(self) -> None:
        """Initialisation of the public code.

        Tokens and position embeddings: truncated normal (std 0.02).  Patch projection:
        LeCun normal as timm's ``lecun_normal_`` (a normal truncated at 2 of its std, that std
        raised by 1 / 0.8796 so that the truncated weights have std sqrt(1 / fan_in)), zero bias.  Linear layers:
        PyTorch default weights, zero biases; every ``mixer.out_proj.weight`` divided by
        sqrt(depth) (prenorm residual rescaling).  Mamba-2 parameters: see
        :class:`~mmlinvit.layers.mamba2.Mamba2Mixer`.
        """
        for p in (self.cls_token, self.pos_embed, self.mask_token):
            if p is not None:
                nn.init.trunc_normal_(p, std=0.02)
        proj = self.patch_embed.proj
        fan_in = proj.in_channels * proj.kernel_size[0] * proj.kernel_size[1]
        # 0.8796 = std of a standard normal truncated to (-2, 2)
        std = fan_in**-0.5 / 0.87962566103423978
        nn.init.trunc_normal_(proj.weight, std=std, a=-2 * std, b=2 * std)
        if proj.bias is not None:
            nn.init.zeros_(proj.bias)
        for m in self.layers.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for blk in self.layers:
            blk.mixer.out_proj.weight.div_(self.num_layers**0.5)

    def check_training_record(self, name: str, recorded: torch.Tensor) -> None:
        """Refuses weights recorded with other flips (``flipped_blocks``), or warns with
        ``check_flip_schedule=False``."""
        recorded = recorded.to(torch.bool).flatten().cpu()
        if torch.equal(recorded, self.flipped_blocks.cpu()):
            return
        theirs = describe_flips(recorded.nonzero().flatten().tolist(), recorded.numel())
        ours = describe_flips(self.flip_indices, self.num_layers, self.flip_schedule)
        if not self.check_flip_schedule:
            warnings.warn(f'Adventurer weights trained reversing the patch scan in blocks '
                          f'{theirs} are loaded into a model that reverses blocks {ours} '
                          f'(check_flip_schedule=False)', stacklevel=2)
            return
        raise FlipScheduleMismatchError(
            f'The checkpoint\'s Adventurer weights were trained reversing the patch scan in '
            f'blocks {theirs} (files of the public Adventurer code, with their unprefixed '
            f'head.*, are read with its flips, blocks n // 2 == 1); this model reverses blocks '
            f'{ours}, so it would compute features the weights were not trained for. Build the '
            f'model with the checkpoint\'s flips: '
            f'flip_schedule={recorded.nonzero().flatten().tolist()} or the name given above '
            f'(config: model.backbone.flip_schedule, or the student\'s in a distillation '
            f'config), or with check_flip_schedule=False to fine-tune them with other flips on '
            f'purpose.')

    # ------------------------------------------------------------------ forward pieces
    @property
    def pos_extra_rows(self) -> Tuple[int, int]:
        """The class position comes last in ``pos_embed``."""
        return 0, 1

    @property
    def token_layout(self) -> Tuple[int, slice]:
        """Patches first, the class token last."""
        return -1, slice(None, -1)

    def _block_args(self, hw_shape: Tuple[int, int]) -> tuple:
        return ()

    @property
    def num_heads(self) -> int:
        """Mamba-2 heads per block."""
        return self.layers[0].mixer.nheads

    def patch_pos_embed(self, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """Patch position embeddings resampled (bicubic) to ``hw_shape``, (1, h * w, C)."""
        return self.learned_patch_pos_embed(hw_shape)

    def _embed_patches(self, tokens: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """Position embeddings, then ``[patches, cls]`` (class token LAST) and dropout.

        The sums take the parameters' dtype: under autocast the patch embedding's 16-bit
        output meets fp32 position embeddings and the residual stream stays fp32 through every
        block, as in the public Adventurer code (a 16-bit stream lost 1.7x its error in bf16).
        """
        tokens = tokens + self.patch_pos_embed(hw_shape)
        cls = (self.cls_token + self.pos_embed[:, -1:]).expand(tokens.shape[0], -1, -1)
        return self.pos_drop(torch.cat([tokens, cls.to(tokens.dtype)], dim=1))

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
