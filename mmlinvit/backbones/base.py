"""Plumbing shared by the ViT and Adventurer backbones (torch only).

Both backbones are a stem (patch embedding, tokens, a learned or fixed position embedding), a
list of blocks and a final norm.  :class:`TokenBackbone` holds everything that does not
depend on what a block computes:

* ``frozen_stages`` (:meth:`TokenBackbone._freeze_stages`, re-applied by :meth:`train`);
* the forward loop over the blocks with ``out_indices`` / ``out_type`` / ``norm_all_outputs``
  and activation checkpointing (``with_cp``, :mod:`.checkpointing`), and
  :meth:`~TokenBackbone.forward_tokens`;
* position-embedding rows and grids: resampling a checkpoint grid to the model grid
  (:meth:`~TokenBackbone.resample_pos_embed`), applied by a ``load_state_dict`` pre-hook;
* ``init_weights`` (``pretrained`` through :func:`mmlinvit.converters.load_pretrained`) and
  ``get_layer_depth`` (layer-wise learning-rate decay);
* training records (:mod:`.training_record`): buffers saved with the weights that say what
  they were trained with, compared by a ``load_state_dict`` pre-hook.

A subclass names its parts with the class attributes below and implements
:meth:`prepare_tokens` and :meth:`_block_args`.
"""
import warnings
import weakref
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from mmlinvit.layers.pos_embed import (POS_GRID_RECORD, checkpoint_pos_grid, recorded_pos_grid,
                                      resample_pos_grid)
from mmlinvit.ops.graph_capture import capturing_graph
from .checkpointing import run_block
from .outputs import check_output_setting, combine_outputs, format_tokens, resolve_out_indices


class TokenBackbone(nn.Module):
    """Base of the token backbones: freezing, forward loop, position grids, loading, depths.

    Subclasses set, in ``__init__``, ``embed_dims``, ``num_layers``, ``pos_grid``,
    ``pos_embed`` and ``mask_token`` (parameters or ``None``), ``pos_interp``, ``out_type``,
    ``norm_all_outputs``, ``frozen_stages``, ``pretrained``, ``checkpoint_layout``,
    ``with_cp`` and ``load_report = None``, build their modules (``patch_embed``, the
    :attr:`BLOCKS` list, the :attr:`FINAL_NORM`), and end with :meth:`_finish_init`.
    """

    #: Name of the ``nn.ModuleList`` of blocks.
    BLOCKS: str
    #: Name of the norm after the last block.
    FINAL_NORM: str
    #: Parameters and modules before the first block, in the order ``frozen_stages`` freezes
    #: them: layer depth 0 for layer-wise decay (absent ones, e.g. ``None`` tokens, are skipped).
    STEM: Tuple[str, ...]
    #: Model keys a checkpoint may lack; they keep the model's init (key -> reason).
    OPTIONAL_CHECKPOINT_KEYS: Dict[str, str] = {}
    #: What to build differently when a checkpoint does not fit (for the error message).
    BUILD_OPTIONS: str = 'arch'
    #: Names of the training-record buffers (:mod:`.training_record`): state-dict entries
    #: that describe the weights instead of being weights.
    TRAINING_RECORDS: Tuple[str, ...] = ()

    # ------------------------------------------------------------------ construction
    def _finish_init(self, out_indices: Union[int, Sequence[int]]) -> None:
        """Resolves ``out_indices``, initialises, hooks position grids and freezes."""
        self.out_indices = resolve_out_indices(out_indices, self.num_layers)
        self._check_output_setting()
        self._init_parameters()
        # The position grid is recorded with the weights: a checkpoint's grid of another size
        # is resampled from its true (rows, cols), which its row count alone does not give.
        self.register_training_record(POS_GRID_RECORD,
                                      torch.tensor(tuple(self.pos_grid), dtype=torch.long))
        # First: the other hooks read the backbone's own key names.
        self._register_load_state_dict_pre_hook(self._convert_foreign_keys_on_load)
        # Before the records hook, which replaces the checkpoint's records by the model's.
        self._register_load_state_dict_pre_hook(self._adapt_pos_embed_on_load)
        self._register_load_state_dict_pre_hook(self._check_training_records_on_load)
        self._register_load_state_dict_pre_hook(self._note_weights_loaded)
        #: Whether weights were loaded (``init_weights`` with ``pretrained``, or any
        #: ``load_state_dict`` / runner checkpoint that reaches this module).
        self.weights_loaded = False
        self._warned_not_loaded = False
        self._freeze_stages()

    def _init_parameters(self) -> None:
        raise NotImplementedError

    @property
    def block_list(self) -> nn.ModuleList:
        """The blocks (``self.blocks`` of the ViT, ``self.layers`` of Adventurer)."""
        return getattr(self, self.BLOCKS)

    @property
    def final_norm(self) -> nn.Module:
        """The norm after the last block."""
        return getattr(self, self.FINAL_NORM)

    def init_weights(self) -> None:
        """Loads ``pretrained`` (any layout of :mod:`mmlinvit.converters`) if set.

        mmengine calls this.  The checkpoint is read safely, converted from
        ``checkpoint_layout``, compared key by key and shape by shape and loaded all or
        nothing by :func:`mmlinvit.converters.load_pretrained`; a position grid of another
        size is resampled to the model grid in place (runners build the optimizer and the
        DDP wrapper before ``init_weights``, and mmengine refuses replaced parameters).  The
        report (loaded, dropped, resampled, initialised keys) is logged and kept as
        ``self.load_report``.
        """
        if self.pretrained:
            from mmlinvit.converters import load_pretrained
            self.load_report = load_pretrained(self, self.pretrained,
                                               layout=self.checkpoint_layout)
            self.weights_loaded = True

    def _note_weights_loaded(self, state_dict: Dict[str, torch.Tensor], prefix: str,
                             *args) -> None:
        """``load_state_dict`` pre-hook: a checkpoint with weights of this module loads it
        (training records, which the records hook puts in, are not weights)."""
        weights = set(self.state_dict(keep_vars=True)) - set(self.TRAINING_RECORDS)
        if any(key.startswith(prefix) and key[len(prefix):] in weights for key in state_dict):
            self.weights_loaded = True

    def _convert_foreign_keys_on_load(self, state_dict: Dict[str, torch.Tensor], prefix: str,
                                      *args) -> None:
        """``load_state_dict`` pre-hook: this module's keys of a whole-model checkpoint in
        another layout (an mmpretrain classifier, an official DINOv2 / CLIP file given as a
        model-level ``init_cfg=Pretrained`` or ``load_from``) are converted to its own names
        (:func:`mmlinvit.converters.loading.convert_foreign_keys_on_load`)."""
        from mmlinvit.converters.loading import convert_foreign_keys_on_load
        convert_foreign_keys_on_load(self, state_dict, prefix)

    def warn_if_pretrained_not_loaded(self) -> None:
        """Warns (once) when ``pretrained`` is set but no weights were ever loaded.

        ``pretrained=`` is read by :meth:`init_weights`, which mmengine runners call; a model
        built by hand and run without it computes with its random initialisation.
        """
        if self.pretrained and not self.weights_loaded and not self._warned_not_loaded:
            self._warned_not_loaded = True
            warnings.warn(
                f'{type(self).__name__}(pretrained={self.pretrained!r}) runs with weights that '
                f'were never loaded: pretrained= is read by init_weights(), which mmengine '
                f'runners call; call model.init_weights() after building it by hand',
                stacklevel=3)

    def surplus_checkpoint_keys(self) -> Dict[str, str]:
        """Checkpoint keys this model drops instead of reporting them as unexpected.

        A checkpoint's ``mask_token`` is dropped when this model has none (built with
        ``with_mask_token=False``): only masked training uses it, and a trainable parameter
        that gets no gradient stops DDP runs (``find_unused_parameters=False``).

        Returns:
            Key -> why it is dropped.
        """
        if getattr(self, 'mask_token', None) is not None:
            return {}
        return {'mask_token': 'mask token of masked training (this model has '
                              'with_mask_token=False)'}

    def surplus_key_warnings(self, dropped: Sequence[str]) -> List[str]:
        """Warnings about checkpoint keys dropped by :meth:`surplus_checkpoint_keys` that
        change what this model computes (none here).

        Args:
            dropped: The dropped keys.

        Returns:
            One message per problem.
        """
        return []

    # ------------------------------------------------------------------ freezing
    def _freeze_stages(self) -> None:
        if self.frozen_stages <= 0:  # 0 freezes nothing, as mmpretrain's ViT (not the stem)
            return
        modules = []
        for name in self.STEM:
            part = getattr(self, name)
            if isinstance(part, nn.Parameter):
                part.requires_grad_(False)
            elif isinstance(part, nn.Module):
                modules.append(part)
        if self.frozen_stages >= len(self.block_list):
            # every block frozen: the final norm too (a linear probe), as mmpretrain's ViT
            modules.append(self.final_norm)
        for mod in modules + list(self.block_list[:self.frozen_stages]):
            mod.eval()
            for p in mod.parameters():
                p.requires_grad_(False)

    def __getstate__(self) -> dict:
        """Pickled without the resampled-grid cache (it holds a weak reference)."""
        state = self.__dict__.copy()
        state.pop('_pos_resample_cache', None)
        return state

    def train(self, mode: bool = True) -> 'TokenBackbone':
        super().train(mode)
        self._freeze_stages()
        return self

    # ------------------------------------------------------------------ position grids
    @property
    def pos_extra_rows(self) -> Tuple[int, int]:
        """Rows of ``pos_embed`` before and after the patch grid (class positions)."""
        raise NotImplementedError

    def patch_rows(self, pos: torch.Tensor) -> torch.Tensor:
        """The patch-grid rows of a (1, rows, C) position embedding."""
        before, after = self.pos_extra_rows
        return pos[:, before:pos.shape[1] - after]

    def checkpoint_grid(self, pos: torch.Tensor,
                        recorded: Optional[Tuple[int, int]] = None) -> Tuple[int, int]:
        """The (rows, cols) grid of a checkpoint's (1, rows, C) ``pos_embed``.

        Args:
            pos: Position embedding of a checkpoint.
            recorded: The grid the checkpoint records (``pos_embed_grid``), if any; without
                it the grid must be square (see :func:`~mmlinvit.layers.pos_embed.checkpoint_pos_grid`).

        Returns:
            ``(rows, cols)``.
        """
        return checkpoint_pos_grid(self.patch_rows(pos).shape[1], recorded)

    def resample_pos_embed(self, pos: torch.Tensor,
                           recorded: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """A (1, rows, C) position embedding of another grid, resampled to ``pos_grid``.

        Class rows are kept; the grid is resampled with ``pos_interp``.

        Args:
            pos: Position embedding of a checkpoint.
            recorded: The (rows, cols) the checkpoint records (``pos_embed_grid``); without
                it the grid must be square.

        Returns:
            The embedding on this model's grid.
        """
        before, after = self.pos_extra_rows
        patches = resample_pos_grid(self.patch_rows(pos), self.checkpoint_grid(pos, recorded),
                                    self.pos_grid, self.pos_interp)
        return torch.cat([pos[:, :before], patches, pos[:, pos.shape[1] - after:]], dim=1)

    def on_model_grid(self, pos: torch.Tensor,
                      recorded: Optional[Tuple[int, int]] = None) -> bool:
        """Whether a checkpoint ``pos_embed`` of this model's shape is on this model's grid.

        With a record (``pos_embed_grid``) it is when the record is the model grid.  Without
        one the grid is square (official releases, mmlinvit files from before the record): a
        square row count is that square grid, which a non-square model grid of the same count
        (16 x 64 and 32 x 32) is not; another count can only be the model's own grid.
        """
        if recorded is not None:
            return tuple(recorded) == tuple(self.pos_grid)
        n = self.patch_rows(pos).shape[1]
        side = int(n**0.5 + 0.5)
        return side * side != n or self.pos_grid[0] == self.pos_grid[1]

    def pos_embed_loads(self, pos: torch.Tensor,
                        recorded: Optional[Tuple[int, int]] = None) -> bool:
        """Whether a checkpoint ``pos_embed`` of another shape is a grid this model resamples:
        (1, extra rows + rows * cols, embed_dims), with (rows, cols) from ``recorded`` (the
        checkpoint's ``pos_embed_grid``) or a square grid without it."""
        n = pos.shape[1] - sum(self.pos_extra_rows) if pos.ndim == 3 else 0
        if not (self.pos_embed is not None and pos.ndim == 3 and pos.shape[0] == 1
                and pos.shape[-1] == self.embed_dims and n > 0):
            return False
        if recorded is not None:
            return recorded[0] * recorded[1] == n
        return int(n**0.5 + 0.5)**2 == n

    # ------------------------------------------------------------------ training records
    def register_training_record(self, name: str, value: torch.Tensor) -> None:
        """Registers a persistent buffer saying what the weights are trained with.

        ``name`` must be in the class's :attr:`TRAINING_RECORDS` and
        ``OPTIONAL_CHECKPOINT_KEYS`` (checkpoints without the record load), and the class
        implements :meth:`check_training_record`.

        Args:
            name: Buffer name.
            value: The model's record.
        """
        if name not in self.TRAINING_RECORDS or name not in self.OPTIONAL_CHECKPOINT_KEYS:
            raise ValueError(f'{type(self).__name__} must list {name!r} in TRAINING_RECORDS and '
                             f'OPTIONAL_CHECKPOINT_KEYS')
        self.register_buffer(name, value)

    def check_training_record(self, name: str, recorded: torch.Tensor) -> None:
        """Raises :class:`~.training_record.TrainingRecordMismatchError` when a checkpoint's
        record ``name`` (same shape as the model's) rules its weights out for this model."""
        raise NotImplementedError

    def _check_training_records_on_load(self, state_dict: Dict[str, torch.Tensor], prefix: str,
                                        *args) -> None:
        """``load_state_dict`` pre-hook (it runs before any tensor of this module or its
        children is copied): checks each record the checkpoint has.  A record never changes
        by loading: what is loaded is the model's own (a softmax checkpoint's record loaded
        into a linear student must not make the student's checkpoints claim softmax).  A
        record of another shape (another depth) is left to ``load_state_dict``, which reports
        it with the other shape mismatches."""
        for name in self.TRAINING_RECORDS:
            key = prefix + name
            recorded = state_dict.get(key)
            own = getattr(self, name)
            if recorded is not None and tuple(recorded.shape) != tuple(own.shape):
                continue
            # Any position grid loads (resampled by _adapt_pos_embed_on_load).
            if recorded is not None and name != POS_GRID_RECORD:
                self.check_training_record(name, recorded)
            state_dict[key] = own.clone()

    def _adapt_pos_embed_on_load(self, state_dict: Dict[str, torch.Tensor], prefix: str,
                                 *args) -> None:
        """``load_state_dict`` pre-hook: a checkpoint grid of another size is handed to
        :meth:`_load_other_grid`; other shapes are left to ``load_state_dict``, which reports
        them with both shapes."""
        key = prefix + 'pos_embed'
        if self.pos_embed is None or key not in state_dict:
            return
        ckpt = state_dict[key]
        recorded = recorded_pos_grid(state_dict, prefix)
        if ((ckpt.shape == self.pos_embed.shape and self.on_model_grid(ckpt, recorded))
                or ckpt.ndim != 3
                or ckpt.shape[-1] != self.embed_dims):
            return
        theirs = prefix + 'cls_token' in state_dict
        if hasattr(self, 'with_cls_token') and theirs != self.with_cls_token:
            # a class row in one pos_embed only: not another grid (the grid hook blamed the
            # file: "inconsistent (edited by hand?)" / "no square grid")
            raise ValueError(
                f"The checkpoint {'has a' if theirs else 'has no'} class token ({prefix}cls_token"
                f" and its row in {key}: {ckpt.shape[1]} rows) but the model is built with "
                f'with_cls_token={not theirs} ({self.pos_embed.shape[1]} rows). Build it with '
                f'with_cls_token={theirs} (config: the backbone\'s with_cls_token), or start '
                f'another token layout from these weights with mmlinvit.transfer.'
                f'transfer_weights, which maps the class token explicitly.')
        state_dict[key] = self._load_other_grid(ckpt, recorded)

    def _load_other_grid(self, pos: torch.Tensor,
                         recorded: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """What ``load_state_dict`` loads for a checkpoint grid of another size (or shape:
        ``recorded`` is the checkpoint's ``pos_embed_grid``): by default the grid resampled to
        the model grid (the parameter is kept)."""
        return self.resample_pos_embed(pos, recorded)

    def clear_pos_cache(self) -> None:
        """Forgets the resampled position grid kept for inference."""
        self.__dict__.pop('_pos_resample_cache', None)

    def learned_patch_pos_embed(self, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """The learned patch positions resampled (``pos_interp``) to ``hw_shape``, (1, h * w, C).

        Without autograd (inference), the last resampled grid is reused while the parameter is
        unchanged: the key holds the parameter's storage, version counter (bumped by every
        in-place update: optimizer steps, ``load_state_dict``), dtype, device and
        ``pos_interp``.  On an H200 the antialiased bicubic resampling of a ViT-L/14 grid to
        1024 px took 5.5 ms, a quarter of the softmax model's 21 ms forward.  Tracing and
        export always resample, so exported graphs keep the resampling.  Writes through
        ``pos_embed.data`` bypass the version counter: after such a write, call
        :meth:`clear_pos_cache` (or write to the parameter itself under ``torch.no_grad()``).
        """
        pos = self.pos_embed
        if tuple(hw_shape) == tuple(self.pos_grid):
            return self.patch_rows(pos)
        if (torch.is_grad_enabled() and pos.requires_grad) or capturing_graph():
            return resample_pos_grid(self.patch_rows(pos), self.pos_grid, hw_shape,
                                     self.pos_interp)
        key = (tuple(hw_shape), pos.data_ptr(), pos._version, pos.dtype, pos.device,
               self.pos_interp, tuple(self.pos_grid))
        cached = self.__dict__.get('_pos_resample_cache')
        if cached is None or cached[0]() is not pos or cached[1] != key:
            with torch.no_grad():
                grid = resample_pos_grid(self.patch_rows(pos), self.pos_grid, hw_shape,
                                         self.pos_interp)
            cached = (weakref.ref(pos), key, grid)  # the parameter object itself, too
            self.__dict__['_pos_resample_cache'] = cached
        return cached[2]

    # ------------------------------------------------------------------ forward
    def prepare_tokens(self,
                       x: torch.Tensor,
                       patch_mask: Optional[torch.Tensor] = None,
                       mask_token: Optional[torch.Tensor] = None
                       ) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """Patchify, mask, add position embeddings and the class / register tokens.

        Args:
            x: Images (B, C, H, W).
            patch_mask: Optional (B, h * w) bool; True patches are replaced by a mask token
                before the position embeddings are added (as in DINOv2).
            mask_token: (1, C) or (C,) token for masked patches; defaults to
                ``self.mask_token``.

        Returns:
            The input tokens of the first block (B, N, C), in the order of
            :attr:`token_layout`, and the (h, w) grid.
        """
        if self.pretrained and not self.weights_loaded and not capturing_graph():
            self.warn_if_pretrained_not_loaded()
        tokens, hw_shape = self.patch_embed(x)
        tokens = self.mask_patches(tokens, patch_mask, mask_token)
        return self._embed_patches(tokens, hw_shape), hw_shape

    def _embed_patches(self, tokens: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """Adds position embeddings and the class / register tokens to (B, h * w, C) patch
        tokens; returns the input of the first block."""
        raise NotImplementedError

    def mask_patches(self, tokens: torch.Tensor, patch_mask: Optional[torch.Tensor],
                     mask_token: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Replaces the masked patch tokens by a mask token (before position embeddings).

        Args:
            tokens: Patch tokens (B, h * w, C).
            patch_mask: ``None`` (nothing masked) or (B, h * w) bool, True where masked.
            mask_token: (1, C) or (C,) token; defaults to ``self.mask_token``.

        Returns:
            The tokens with the masked ones replaced.

        Raises:
            ValueError: when there is no mask token or the mask has another shape.
        """
        if patch_mask is None:
            return tokens
        token = self.mask_token if mask_token is None else mask_token
        if token is None:
            raise ValueError('patch_mask given but the model has no mask token; build it '
                             'with with_mask_token=True or pass mask_token')
        b, n = tokens.shape[:2]
        if tuple(patch_mask.shape) != (b, n):
            raise ValueError(f'patch_mask must be (batch, h * w) = {(b, n)}, got '
                             f'{tuple(patch_mask.shape)}')
        return torch.where(patch_mask.unsqueeze(-1), token.to(tokens.dtype).reshape(1, 1, -1),
                           tokens)

    def _block_args(self, hw_shape: Tuple[int, int]) -> tuple:
        """Positional arguments of every block after the tokens."""
        raise NotImplementedError

    @property
    def token_layout(self) -> Tuple[int, slice]:
        """(position of the class token, slice of the patch tokens) in the token sequence."""
        raise NotImplementedError

    def _check_output_setting(self) -> None:
        """Refuses an ``out_type`` this model cannot give
        (:func:`.outputs.check_output_setting`)."""
        check_output_setting(self.out_type, self.out_indices, self.num_layers,
                             self.cls_token is not None, self.norm_all_outputs)

    def format_output(self, tokens: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """Turns (B, N, C) tokens into the configured ``out_type``."""
        cls_index, patches = self.token_layout
        return format_tokens(tokens, self.out_type, cls_index, patches, hw_shape)

    def forward_tokens(self,
                       x: torch.Tensor,
                       patch_mask: Optional[torch.Tensor] = None,
                       mask_token: Optional[torch.Tensor] = None
                       ) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """Final normalised tokens (B, N, C) of the whole stack, and the (h, w) grid.

        ``patch_mask`` / ``mask_token`` are passed to :meth:`prepare_tokens`.
        """
        tokens, hw_shape = self.prepare_tokens(x, patch_mask, mask_token)
        args = self._block_args(hw_shape)
        for blk in self.block_list:
            tokens = run_block(blk, tokens, *args, with_cp=self.with_cp)
        return self.final_norm(tokens), hw_shape

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """Outputs of the blocks in ``out_indices``, formatted by ``out_type``.

        The last block's output is always normalised; the others only with
        ``norm_all_outputs``.  ``out_type='cls_avg'`` returns one tensor, DINOv2's linear
        input over the ``out_indices`` blocks (:func:`.outputs.combine_outputs`).
        """
        if self.out_type == 'cls_avg':
            self._check_output_setting()  # out_type / out_indices may be set after __init__
        tokens, hw_shape = self.prepare_tokens(x)
        args = self._block_args(hw_shape)
        outs = []
        last = self.num_layers - 1
        for i, blk in enumerate(self.block_list):
            tokens = run_block(blk, tokens, *args, with_cp=self.with_cp)
            if i in self.out_indices:
                out = self.final_norm(tokens) if (i == last or self.norm_all_outputs) else tokens
                outs.append(self.format_output(out, hw_shape))
        return combine_outputs(outs, self.out_type)

    # ------------------------------------------------------------------ optimisation helpers
    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """Layer depth of a parameter for layer-wise learning-rate decay.

        The stem (:attr:`STEM`: embeddings and tokens) is depth 0, block i is depth i + 1,
        everything after the blocks (final norm, heads) is ``num_layers + 1``.  CLIP's
        ``pre_norm`` (``ln_pre``, before block 0) is in the stem, as timm's layer decay puts
        ``norm_pre``; mmpretrain's and mmseg's ViT depth rules give it the last depth through
        their catch-all branch (their learning rate for it is 1 / decay ** (num_layers + 1)
        times this one).

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
        if name.split('.')[0] in self.STEM:
            return 0, total
        if name.startswith(self.BLOCKS + '.'):
            return int(name.split('.')[1]) + 1, total
        return total - 1, total
