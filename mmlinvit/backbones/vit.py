"""The ViT skeleton shared by the softmax teacher and the linearized student (torch only).

One class expresses DINOv2 (patch 14, LayerScale, register tokens, mask token, offset
interpolation), DeiT / DeiT-III, OpenAI CLIP (pre-LayerNorm, QuickGELU) and MAE through
:data:`~.arch_zoo.VIT_FAMILIES`, and any token mixer through ``attn_cfg`` (one config, or
one per layer for hybrid stacks).

Canonical parameter layout (timm names): ``cls_token``, ``reg_token``, ``mask_token``,
``pos_embed`` (class position first when there is a class token, never register
positions), ``patch_embed.proj``, ``pre_norm`` (CLIP ``ln_pre``), ``blocks.i.{norm1, attn.qkv,
attn.proj, ls1.gamma, norm2, mlp.fc1, mlp.fc2, ls2.gamma}``, ``norm``.  Converters in
:mod:`mmlinvit.converters` map the official layouts to it.

Position embeddings are learned on the grid of ``img_size``; a checkpoint trained on another
grid is resampled to it once at load time (family interpolation), and inputs of any other
resolution (512, 518, 1024, 512 x 1024) resample it per forward.  A side that is not a
multiple of the patch size is zero-padded at the bottom / right (mmseg's ViT, ``padding=
'corner'``): a 500 x 500 input at patch 16 gives a 32 x 32 grid, not a cropped 31 x 31.
"""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from mmlinvit.layers.attention import ATTENTION_OPERATORS
from mmlinvit.layers.pos_embed import POS_GRID_RECORD, check_pos_interp, sincos_pos_embed_2d
from mmlinvit.layers.patch_embed import PatchEmbed, patch_grid
from mmlinvit.layers.transformer import TransformerBlock
from .arch_zoo import VIT_SIZES, family_defaults
from .base import TokenBackbone
from .operator_setting import resolve_operator_setting
from .outputs import check_out_type
from .training_record import (MLP_ACT_RECORD, OPERATOR_SETTINGS_RECORD, SETTINGS_BYTES,
                              TrainingRecordMismatchError, decode_names, describe_blocks,
                              encode_names)


class AttentionOperatorMismatchError(TrainingRecordMismatchError):
    """Checkpoint blocks were trained with another attention operator than the model's."""


def operator_name(attn_cfg: Union[str, dict]) -> str:
    """The registered operator name of one block's ``attn_cfg`` (``'mmlinvit.'`` dropped)."""
    name = attn_cfg if isinstance(attn_cfg, str) else attn_cfg['type']
    return name[len('mmlinvit.'):] if name.startswith('mmlinvit.') else name


#: Canonical keys of the avg_featmap output norm (mmpretrain's ``ln2``).
AVG_NORM_KEYS = ('avg_norm.weight', 'avg_norm.bias')


class VisionTransformer(TokenBackbone):
    """Plain ViT backbone with a pluggable attention operator per layer.

    Args:
        arch: Size name in :data:`VIT_SIZES` (``'s'``, ``'b'``, ``'l'``, ``'g'``...) or a dict
            with ``embed_dims``, ``num_layers``, ``num_heads`` and ``mlp_hidden_dims``.
        family: Family name in :data:`VIT_FAMILIES`; sets the defaults below.
        attn_cfg: Operator name/config for every layer, or a list with one per layer.
        img_size: Training resolution; sets the learned position grid (the token grid of an
            ``img_size`` input, ``ceil(img_size / patch_size)`` per side).
        patch_size: Patch side (family default if ``None``).
        in_channels: Input channels.
        with_cls_token: Whether a class token is prepended.  ``None``: the operators' paper
            setting (``paper_backbone_setting``: none for MHLA / TTT) or ``True``.
        num_reg_tokens: Number of register tokens (DINOv2 with registers).
        with_mask_token: Whether a ``mask_token`` parameter exists (DINOv2 checkpoints).
        pos_embed_type: ``'learned'``, ``'sincos'`` (fixed, recomputed per grid) or ``'none'``.
            ``None``: the operators' paper setting (``'sincos'`` for MHLA / TTT) or
            ``'learned'``.
        pos_interp: Resampling of learned grids, ``'bicubic'``, ``'bicubic_antialias'`` (timm),
            ``'dinov2'`` or ``'dinov2_reg'`` (the DINOv2 hub without / with registers).  The
            default is the family's, and follows the model: family ``'dinov2'`` with
            ``num_reg_tokens > 0`` uses ``'dinov2_reg'`` (see
            :data:`~.arch_zoo.VIT_FAMILY_REGISTER_DEFAULTS`).  ``pos_interp_source`` records
            which it was.
        layer_scale_init: LayerScale init (``None`` disables).
        act: MLP activation (``'gelu'`` or ``'quick_gelu'``).
        mlp_type: ``'mlp'`` or ``'swiglu'`` (defaults to swiglu for DINOv2-g).
        norm_eps: LayerNorm epsilon.
        pre_norm: LayerNorm before the blocks (CLIP ``ln_pre``).
        final_norm: LayerNorm after the last block.
        avg_featmap_norm: A LayerNorm on the ``'avg_featmap'`` output (after the mean), as
            mmpretrain's ``VisionTransformer`` always applies (its ``ln2``, which mmpretrain
            checkpoints of avg_featmap classifiers (MAE, EVA, ... fine-tuned) carry and which
            loads here).  False (default): the mean of the patch tokens, as timm / DeiT /
            DINOv2; a checkpoint's ``ln2`` is then dropped, with a warning for an
            ``'avg_featmap'`` model (its features are not those the checkpoint's head read).
        patch_bias: Whether the patch projection has a bias.
        qkv_bias: Whether QKV projections have biases.
        drop_rate: Dropout rate.
        drop_path_rate: Maximum stochastic depth rate (linearly increasing).
        out_indices: Block indices whose outputs are returned (negative allowed).
        out_type: ``'raw'`` (B, N, C), ``'cls_token'`` (B, C), ``'avg_featmap'`` (B, C: mean
            of patch tokens), ``'featmap'`` (B, C, h, w) or ``'cls_avg'`` (one (B, (n + 1) C)
            tensor: the class tokens of the n ``out_indices`` blocks and the mean patch token
            of the last, DINOv2's linear-evaluation input; see
            :func:`mmlinvit.backbones.outputs.combine_outputs`).  ``None``: ``'cls_token'``
            with a class token, else ``'avg_featmap'``.
        norm_all_outputs: Apply the final norm to every returned block (segmentation on
            DINOv2 features), not only to the last one.
        frozen_stages: Freeze patch embedding, tokens and the first ``frozen_stages`` blocks
            (all of them: the final norm too); 0 or less freezes nothing (mmpretrain's ViT).
        pretrained: Checkpoint path (any layout :mod:`mmlinvit.converters` handles) loaded in
            :meth:`init_weights`.
        checkpoint_layout: Source layout (``'auto'`` detects it).
        check_operator_setting: Refuse ``with_cls_token`` / ``pos_embed_type`` / ``out_type``
            values an operator's paper does not use (MHLA / TTT: no class token, sin-cos,
            average pooling), naming the fix; ``False`` builds them with a warning (a
            deliberate deviation).  See :mod:`.operator_setting`.
        with_cp: Activation checkpointing of the blocks while training with gradients
            (recompute in backward; see :mod:`.checkpointing`).
    """

    BLOCKS = 'blocks'
    FINAL_NORM = 'norm'
    STEM = ('cls_token', 'reg_token', 'mask_token', 'pos_embed', 'patch_embed', 'drop_after_pos',
            'pre_norm')
    OPTIONAL_CHECKPOINT_KEYS = {
        'mask_token': 'mask token (only replaces masked patches; timm DINOv2 checkpoints have '
                      'none), initialised to zeros as in the DINOv2 code',
        'block_operators': 'record of the attention operator of each block (official '
                           'checkpoints and mmlinvit files from before the record have none): '
                           "the model's operators are recorded",
        OPERATOR_SETTINGS_RECORD: 'record of the attention operators\' settings (MHLA block '
                                  'layout, TTT inner learning rate; checkpoints from before '
                                  'the record have none): the model\'s settings are recorded',
        MLP_ACT_RECORD: 'record of the MLP activation (official checkpoints and mmlinvit files '
                        'from before the record have none): the model\'s activation is '
                        'recorded',
        POS_GRID_RECORD: 'record of the (rows, cols) grid of pos_embed (official checkpoints '
                         'and mmlinvit files from before the record have none; their grid is '
                         "square): the model's grid is recorded",
    }
    BUILD_OPTIONS = 'family / arch / num_reg_tokens / with_mask_token / attn_cfg'
    #: Families whose published weights differ in MLP activation by source, which a
    #: checkpoint does not say: OpenAI's CLIP releases (and open_clip's ``openai`` /
    #: ``*-quickgelu`` models) use QuickGELU, open_clip's LAION-2B / DataComp models and timm's
    #: ``vit_*_clip_224.laion2b*`` GELU.  A checkpoint without an activation record loads into
    #: such a family only with ``act`` given explicitly.
    ACT_AMBIGUOUS_FAMILIES = ('clip', )
    TRAINING_RECORDS = ('block_operators', OPERATOR_SETTINGS_RECORD, MLP_ACT_RECORD,
                        POS_GRID_RECORD)

    def __init__(self,
                 arch: Union[str, dict] = 'b',
                 family: str = 'deit',
                 attn_cfg: Union[str, dict, Sequence[Union[str, dict]]] = 'softmax',
                 img_size: Optional[Union[int, Tuple[int, int]]] = None,
                 patch_size: Optional[int] = None,
                 in_channels: int = 3,
                 with_cls_token: Optional[bool] = None,
                 num_reg_tokens: int = 0,
                 with_mask_token: Optional[bool] = None,
                 pos_embed_type: Optional[str] = None,
                 pos_interp: Optional[str] = None,
                 layer_scale_init: Optional[float] = -1.0,
                 act: Optional[str] = None,
                 mlp_type: Optional[str] = None,
                 norm_eps: Optional[float] = None,
                 pre_norm: Optional[bool] = None,
                 final_norm: bool = True,
                 avg_featmap_norm: bool = False,
                 patch_bias: Optional[bool] = None,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0,
                 out_indices: Union[int, Sequence[int]] = -1,
                 out_type: Optional[str] = None,
                 norm_all_outputs: bool = False,
                 frozen_stages: int = -1,
                 pretrained: Optional[str] = None,
                 checkpoint_layout: str = 'auto',
                 check_operator_setting: bool = True,
                 with_cp: bool = False) -> None:
        super().__init__()
        fam = family_defaults(family, num_reg_tokens)
        if isinstance(arch, str):
            if arch not in VIT_SIZES:
                raise KeyError(f'Unknown ViT arch {arch!r}; available: {sorted(VIT_SIZES)} '
                               f'or a dict with embed_dims/num_layers/num_heads/mlp_hidden_dims')
            arch_cfg = dict(VIT_SIZES[arch])
            arch_name = arch
        else:
            missing = {'embed_dims', 'num_layers', 'num_heads', 'mlp_hidden_dims'} - set(arch)
            if missing:
                raise KeyError(f'Custom arch dict is missing {sorted(missing)}')
            arch_cfg = dict(arch)
            arch_name = 'custom'
        setting = resolve_operator_setting(
            list(attn_cfg) if isinstance(attn_cfg, (list, tuple)) else [attn_cfg],
            dict(with_cls_token=with_cls_token, pos_embed_type=pos_embed_type,
                 out_type=out_type), check_operator_setting)
        with_cls_token = setting['with_cls_token']
        pos_embed_type = setting['pos_embed_type']
        out_type = setting['out_type']
        check_out_type(out_type)
        if out_type == 'cls_token' and not with_cls_token:
            raise ValueError("out_type='cls_token' needs with_cls_token=True; use "
                             "'avg_featmap' for models without a class token")
        if avg_featmap_norm and out_type != 'avg_featmap':
            raise ValueError(f"avg_featmap_norm=True normalises the 'avg_featmap' output; "
                             f"out_type is {out_type!r}")
        if pos_embed_type not in ('learned', 'sincos', 'none'):
            raise KeyError(f"Unknown pos_embed_type {pos_embed_type!r}; use 'learned', "
                           f"'sincos' or 'none'")

        def pick(value, key):
            return fam.get(key) if value is None else value

        self.family = family
        self.arch = arch_name
        self.embed_dims = arch_cfg['embed_dims']
        self.num_layers = arch_cfg['num_layers']
        self.num_heads = arch_cfg['num_heads']
        self.patch_size = pick(patch_size, 'patch_size')
        img_size = pick(img_size, 'img_size')
        self.img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.pos_interp = pick(pos_interp, 'pos_interp')
        check_pos_interp(self.pos_interp)  # not only when the input size first differs
        self.pos_interp_source = (
            'explicit' if pos_interp is not None else
            f'family {family!r} default' + (f' with {num_reg_tokens} register tokens'
                                             if num_reg_tokens else ''))
        self.pos_embed_type = pos_embed_type
        self.with_cls_token = with_cls_token
        self.num_reg_tokens = num_reg_tokens
        self.num_prefix_tokens = int(with_cls_token) + num_reg_tokens
        self.out_type = out_type
        self.norm_all_outputs = norm_all_outputs
        self.frozen_stages = frozen_stages
        self.pretrained = pretrained
        self.with_cp = with_cp
        self.load_report = None  # ConversionReport of init_weights' pretrained load
        self.checkpoint_layout = checkpoint_layout
        if layer_scale_init == -1.0:
            layer_scale_init = fam['layer_scale_init']
        mlp_type = mlp_type or ('swiglu' if (family == 'dinov2' and arch_name == 'g') else 'mlp')
        with_mask_token = pick(with_mask_token, 'with_mask_token') or False

        self.patch_embed = PatchEmbed(in_channels, self.embed_dims, self.patch_size,
                                      bias=pick(patch_bias, 'patch_bias'))
        # The token grid of an img_size input (corner-padded to whole patches): a DINOv2
        # model at img_size=512 keeps the checkpoint's 37 x 37 grid, resampled neither at load
        # nor per forward.
        self.pos_grid = patch_grid(self.img_size, self.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, self.embed_dims)) if with_cls_token else None
        self.reg_token = (nn.Parameter(torch.zeros(1, num_reg_tokens, self.embed_dims))
                          if num_reg_tokens else None)
        self.mask_token = nn.Parameter(torch.zeros(1, self.embed_dims)) if with_mask_token else None
        if pos_embed_type == 'learned':
            n_pos = self.pos_grid[0] * self.pos_grid[1] + int(with_cls_token)
            self.pos_embed = nn.Parameter(torch.zeros(1, n_pos, self.embed_dims))
        else:
            self.pos_embed = None
        self.drop_after_pos = nn.Dropout(drop_rate)
        self.pre_norm = (nn.LayerNorm(self.embed_dims, eps=pick(norm_eps, 'norm_eps'))
                         if pick(pre_norm, 'pre_norm') else nn.Identity())

        attn_cfgs = self._per_layer(attn_cfg)
        dpr = [drop_path_rate * i / max(self.num_layers - 1, 1) for i in range(self.num_layers)]
        self.blocks = nn.ModuleList([
            TransformerBlock(
                self.embed_dims,
                self.num_heads,
                arch_cfg['mlp_hidden_dims'],
                attn_cfg=attn_cfgs[i],
                qkv_bias=qkv_bias,
                mlp_type=mlp_type,
                act=pick(act, 'act'),
                layer_scale_init=layer_scale_init,
                norm_eps=pick(norm_eps, 'norm_eps'),
                drop_rate=drop_rate,
                drop_path_rate=dpr[i]) for i in range(self.num_layers)
        ])
        self.attn_cfgs = attn_cfgs
        self.act = pick(act, 'act')
        self.act_source = 'explicit' if act is not None else f'family {family!r} default'
        # Saved with the weights, checked when loading (see check_training_record).
        self.register_training_record('block_operators', encode_names(
            [operator_name(cfg) for cfg in attn_cfgs]))
        self.register_training_record(OPERATOR_SETTINGS_RECORD, encode_names(
            [blk.attn.settings_record() for blk in self.blocks], width=SETTINGS_BYTES))
        self.register_training_record(MLP_ACT_RECORD, encode_names([self.act]))
        self.norm = (nn.LayerNorm(self.embed_dims, eps=pick(norm_eps, 'norm_eps'))
                     if final_norm else nn.Identity())
        #: mmpretrain's avg_featmap output norm (``ln2``), or None.
        self.avg_norm = (nn.LayerNorm(self.embed_dims, eps=pick(norm_eps, 'norm_eps'))
                         if avg_featmap_norm else None)

        self._finish_init(out_indices)

    def format_output(self, tokens: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """Turns (B, N, C) tokens into the configured ``out_type`` (``avg_norm`` applied to
        ``'avg_featmap'`` outputs when built; ``out_type`` may be changed after ``__init__``,
        and mmpretrain's ``ln2`` normalises the patch mean only)."""
        out = super().format_output(tokens, hw_shape)
        if self.avg_norm is None or self.out_type != 'avg_featmap':
            return out
        return self.avg_norm(out)

    def _freeze_stages(self) -> None:
        super()._freeze_stages()
        if self.avg_norm is not None and self.frozen_stages >= self.num_layers:
            self.avg_norm.eval()  # every block frozen: the output norm too, as mmpretrain's
            self.avg_norm.requires_grad_(False)

    def surplus_checkpoint_keys(self) -> Dict[str, str]:
        """Also mmpretrain's avg_featmap output norm when this model has none (see
        ``avg_featmap_norm``)."""
        keys = super().surplus_checkpoint_keys()
        if self.avg_norm is None:
            for key in AVG_NORM_KEYS:
                keys[key] = ("norm of mmpretrain's avg_featmap output (ln2); this model has "
                             "avg_featmap_norm=False")
        return keys

    def surplus_key_warnings(self, dropped: Sequence[str]) -> List[str]:
        """A dropped avg_featmap output norm changes an ``'avg_featmap'`` model's features."""
        if self.out_type != 'avg_featmap' or not set(dropped) & set(AVG_NORM_KEYS):
            return []
        return ["the checkpoint's avg_featmap output norm (mmpretrain's ln2) is not applied: "
                "mmpretrain's feature is ln2(mean(patch tokens)), this model's "
                "mean(patch tokens), so a head trained on the checkpoint reads other "
                "features. Build the backbone with avg_featmap_norm=True to load and apply it."]

    # ------------------------------------------------------------------ construction
    def _per_layer(self, attn_cfg) -> List[Union[str, dict]]:
        if isinstance(attn_cfg, (list, tuple)):
            if len(attn_cfg) != self.num_layers:
                raise ValueError(f'attn_cfg has {len(attn_cfg)} entries but the model has '
                                 f'{self.num_layers} layers')
            cfgs = list(attn_cfg)
        else:
            cfgs = [attn_cfg] * self.num_layers
        for cfg in cfgs:  # fail at build time with the list of operators
            ATTENTION_OPERATORS.get(cfg if isinstance(cfg, str) else cfg['type'])
        return cfgs

    def check_checkpoint_act(self, state_dict: Dict[str, torch.Tensor], source: str) -> None:
        """Refuses a checkpoint whose MLP activation is unknown to a family that publishes
        weights with either (:data:`ACT_AMBIGUOUS_FAMILIES`), unless ``act`` was given.

        A checkpoint knows its activation when it records it (``mlp_act``: mmlinvit files,
        and OpenAI CLIP TorchScript releases read through :mod:`mmlinvit.converters`) or is an
        mmlinvit file from before the record (``block_operators``).

        Args:
            state_dict: The canonical state dict about to be loaded.
            source: What the checkpoint is, for the message.

        Raises:
            TrainingRecordMismatchError: naming both activations and their sources.
        """
        if (self.family not in self.ACT_AMBIGUOUS_FAMILIES or self.act_source == 'explicit'
                or MLP_ACT_RECORD in state_dict or 'block_operators' in state_dict):
            return
        raise TrainingRecordMismatchError(
            f'{source}: the MLP activation of {self.family!r} weights is not stored in the '
            f'checkpoint, and it differs by source: OpenAI\'s CLIP releases and open_clip\'s '
            f'"openai" / "*-quickgelu" models use QuickGELU (act=\'quick_gelu\'), open_clip\'s '
            f'LAION-2B / DataComp models and timm\'s vit_*_clip_224.laion2b* GELU '
            f'(act=\'gelu\'; mmpretrain\'s converted CLIP classifiers: act=\'gelu\', '
            f'norm_eps=1e-6). A wrong guess loads without error and computes other features, '
            f'so give the backbone act= explicitly (config: the backbone\'s act; '
            f'tools/linearize.py: --act). The OpenAI TorchScript release itself (ViT-B-16.pt) '
            f'and files converted from it by tools/model_converters/convert_checkpoint.py '
            f'record QuickGELU and need nothing (a file converted before the record: convert '
            f'it again, or give act=\'quick_gelu\').')

    def check_training_record(self, name: str, recorded: torch.Tensor) -> None:
        """Refuses a checkpoint whose blocks were trained with another attention operator
        (``block_operators``) or another MLP activation (``mlp_act``).  Softmax-attention
        weights load into every operator: they are what linearization starts from.

        Raises:
            AttentionOperatorMismatchError: naming the blocks, both operators and the
                ``attn_cfg`` that loads the checkpoint.
            TrainingRecordMismatchError: naming both activations.
        """
        if name == MLP_ACT_RECORD:
            theirs = decode_names(recorded)[0]
            if theirs != self.act:
                raise TrainingRecordMismatchError(
                    f'The checkpoint\'s MLP was trained with act={theirs!r}, this model uses '
                    f'act={self.act!r} ({self.act_source}): it would compute features the '
                    f'weights were not trained for. Build the model with act={theirs!r}.')
            return
        if name == OPERATOR_SETTINGS_RECORD:
            self._check_operator_settings(decode_names(recorded))
            return
        theirs = decode_names(recorded)
        ours = [operator_name(cfg) for cfg in self.attn_cfgs]
        clashes: Dict[Tuple[str, str], List[int]] = {}
        for i, (their, our) in enumerate(zip(theirs, ours)):
            if their != our and their != 'softmax':
                clashes.setdefault((their, our), []).append(i)
        if not clashes:
            return
        lines = [f"block{'s' if len(blocks) > 1 else ''} {describe_blocks(blocks)}: '{their}' "
                 f"in the checkpoint, '{our}' in the model"
                 for (their, our), blocks in clashes.items()]
        fix = f"'{theirs[0]}'" if len(set(theirs)) == 1 else f'{theirs}'
        raise AttentionOperatorMismatchError(
            'The checkpoint\'s weights were trained with other attention operators than this '
            'model\'s, so the model would compute features they were not trained for:\n  '
            + '\n  '.join(lines) + '\nSoftmax-attention weights load into any operator (the '
            'start of linearization); other operators\' weights only into their own. Build the '
            f'model with the checkpoint\'s operators: attn_cfg={fix} (config: '
            'model.backbone.attn_cfg, or the student\'s / teacher\'s backbone of a '
            'distillation config).')

    def _check_operator_settings(self, theirs: List[str]) -> None:
        """Refuses weights whose operators were trained with other settings than this
        model's (MHLA's ``block_grid`` / ``feature_map``, TTT's ``inner_lr``...: same
        parameters, another computation).  Blocks recorded without settings (softmax, an
        operator without any) are not compared; another operator is the ``block_operators``
        check's."""
        ours = [blk.attn.settings_record() for blk in self.blocks]
        names = [operator_name(cfg) for cfg in self.attn_cfgs]
        clashes: Dict[Tuple[str, str, str], List[int]] = {}
        for i, (their, our) in enumerate(zip(theirs, ours)):
            # settings both records name (a setting recorded by a later version only is not
            # compared)
            their_items = dict(item.split('=', 1) for item in their.split() if '=' in item)
            our_items = dict(item.split('=', 1) for item in our.split() if '=' in item)
            if any(their_items[k] != our_items[k] for k in set(their_items) & set(our_items)):
                clashes.setdefault((names[i], their, our), []).append(i)
        if not clashes:
            return
        lines = [f"block{'s' if len(blocks) > 1 else ''} {describe_blocks(blocks)} ({name}): "
                 f"{their} in the checkpoint, {our or 'no settings'} in the model"
                 for (name, their, our), blocks in clashes.items()]
        raise AttentionOperatorMismatchError(
            'The checkpoint\'s attention operators were trained with other settings than this '
            'model\'s (same parameters, another computation), so the model would compute '
            'features the weights were not trained for:\n  ' + '\n  '.join(lines) +
            '\nBuild the model with the checkpoint\'s settings in its attn_cfg (config: '
            'model.backbone.attn_cfg, or the student\'s backbone of a distillation config).')

    def _init_parameters(self) -> None:
        """timm-style init: truncated normal tokens / linears, zero biases, unit norms."""
        for name, p in (('cls_token', self.cls_token), ('reg_token', self.reg_token),
                        ('mask_token', self.mask_token)):
            if p is not None:
                nn.init.normal_(p, std=1e-6 if name != 'mask_token' else 0.0)
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for blk in self.blocks:
            blk.attn.init_extra_parameters()

    # ------------------------------------------------------------------ token layout
    @property
    def pos_extra_rows(self) -> Tuple[int, int]:
        """The class position comes first in ``pos_embed`` (when there is a class token)."""
        return int(self.with_cls_token), 0

    @property
    def token_layout(self) -> Tuple[int, slice]:
        """Class token first, then register tokens, then the patches."""
        return 0, slice(self.num_prefix_tokens, None)

    def _block_args(self, hw_shape: Tuple[int, int]) -> tuple:
        return hw_shape, self.num_prefix_tokens

    # ------------------------------------------------------------------ forward pieces
    def patch_pos_embed(self, hw_shape: Tuple[int, int], device, dtype) -> Optional[torch.Tensor]:
        """Patch position embeddings for a (h, w) grid, (1, h * w, C), or ``None``."""
        if self.pos_embed_type == 'learned':
            return self.learned_patch_pos_embed(hw_shape)
        if self.pos_embed_type == 'sincos':
            return sincos_pos_embed_2d(hw_shape, self.embed_dims, device=device, dtype=dtype)
        return None

    def _embed_patches(self, tokens: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """Position embeddings, then ``[cls, registers, patches]``, dropout and ``pre_norm``."""
        b = tokens.shape[0]
        pos = self.patch_pos_embed(hw_shape, tokens.device, tokens.dtype)
        if pos is not None:
            tokens = tokens + pos
        prefix = []
        if self.cls_token is not None:
            cls = self.cls_token
            if self.pos_embed_type == 'learned':
                cls = cls + self.pos_embed[:, :1]
            prefix.append(cls.expand(b, -1, -1))
        if self.reg_token is not None:
            prefix.append(self.reg_token.expand(b, -1, -1))
        if prefix:
            tokens = torch.cat(prefix + [tokens], dim=1)
        return self.pre_norm(self.drop_after_pos(tokens))


class LinearVisionTransformer(VisionTransformer):
    """The linearized student: a :class:`VisionTransformer` whose default ``attn_cfg`` is
    ``'elu'`` (kernel linear attention with ELU + 1, ViT-AdaLA's student operator).

    Every softmax-teacher checkpoint loads into it unchanged (all operators keep the ``qkv`` /
    ``proj`` parameters); token mixing is O(N) in time and memory.  Any other operator, or a
    per-layer hybrid list, can still be passed as ``attn_cfg``.

    Args:
        arch: See :class:`VisionTransformer`.
        attn_cfg: Operator name/config, or one per layer; default ``'elu'``.
        **kwargs: Every other :class:`VisionTransformer` argument.
    """

    def __init__(self,
                 arch: Union[str, dict] = 'b',
                 attn_cfg: Union[str, dict, Sequence[Union[str, dict]]] = 'elu',
                 **kwargs) -> None:
        super().__init__(arch=arch, attn_cfg=attn_cfg, **kwargs)
