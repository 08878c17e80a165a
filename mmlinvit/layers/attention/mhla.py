"""MHLA: multi-head linear attention with block-wise KV summaries on the patch grid.

The h x w patch grid is split into ``block_grid = (gh, gw)`` rectangular blocks (default 2 x 2,
any grid size: row edges ``floor(i * h / gh)``, column edges likewise, so uneven splits are
fine and blocks may be empty on tiny grids).  With phi = ReLU (seed 000), each block b has the
summaries

    KV_b = sum_{j in b} phi(k_j)^T v_j / N,    z_b = sum_{j in b} phi(k_j) / N

and a query i in block a(i) reads the mixed summaries (a learned num_blocks x num_blocks
matrix m, the "1 x 1 conv" over blocks):

    out_i = phi(q_i) (sum_b m_{a(i), b} KV_b) / (phi(q_i) (sum_b m_{a(i), b} z_b) + eps)

i.e. the implied map A_ij = m_{a(i), b(j)} phi(q_i).phi(k_j) / sum_l m_{a(i), b(l)}
phi(q_i).phi(k_l) whose rows sum to 1.  (The public MHLA code mixes the per-query normalisers
across blocks instead, so its rows do not sum to 1; this module applies the mixing to z_b, the
same matrix as for KV_b.)  The normaliser uses
:func:`mmlinvit.ops.signed_normaliser.signed_safe_denominator`, so a learned m with negative
entries can never divide by zero.

``block_mixing`` is shared by all heads by default (as the public code's single 1 x 1 conv),
or one matrix per head with ``per_head_mixing=True``.  Init (``mixing_init``): block centres
c_a = (row + 0.5, col + 0.5) in block units, d_ab = |c_a - c_b|, and

* ``'softmax'`` (default): m_a = softmax_b(-d_ab / tau) (rows sum to 1, the own block gets the
  largest weight);
* ``'cos'``: the public ``MHLA_Normed_Torch``'s default (``BlockDistanceConv(transform='cos')``):
  m_ab = cos(d_ab / max(d) * pi / 4), each column b divided by its sum.  Flatter: on the 2 x 2
  grid the own block gets 0.29 (``'softmax'``: 0.51).
* ``'linear'``: the public code's ``BlockDistanceConv(transform='linear')``, the transform of
  its training command (``scripts/train_mhla.sh``: ``transform=linear``): m_ab = 1 - d_ab /
  max(d), each column b divided by its sum (the farthest blocks get 0; own block 0.63 on the
  2 x 2 grid).  On a 1 x 1 grid (max(d) = 0) both public transforms give 1.

m is then learned freely.  The maths (summaries, mixing, normaliser, implied map) is in
:mod:`mmlinvit.ops.mhla`; this layer owns m, the feature map and the local branch.

Prefix tokens (class / register; seed-000 MHLA models have none, but they are supported):
prefix keys form a global group mixed into every block's summary with weight 1 (not learned),
and prefix queries attend globally to all tokens with weight 1 (plain linear attention).  Rows
still sum to 1.

Options that restore the public code (DAGroup-PKU/MHLA ``MHLA_Normed_Torch`` as its registered
models build it; all off by default, i.e. the seed paper's setting):

* ``input_norm=True``: a LayerNorm(C) (eps 1e-5, affine; ``input_norm.weight`` / ``.bias``) on
  the operator input before ``qkv``: the public module's own ``self.norm``, applied after the
  block's ``norm1`` (a second normalisation).
* ``qk_norm=True``: an RMSNorm over all C channels of q and of k (``q_norm.weight``,
  ``k_norm.weight``; ``nn.RMSNorm(C)`` with its default eps, ``torch.finfo(dtype).eps``),
  before the head split and the feature map, as the registered models (``qk_norm=True``).
  :meth:`mix` and :meth:`map_from_qk` take q, k after it (:meth:`split_qkv` applies both norms).
* ``feature_eps=1e-6``: phi(x) + feature_eps for q and k, i.e. relu(x) + 1e-6 (the public code
  adds its eps, 1e-6, after the ReLU).  It matters where all features of a query vanish: such
  a query then reads a (mixed) average of V instead of 0.
* ``eps_placement='sum'``: ``eps`` is added to the normaliser summed over the N tokens, as the
  public code, instead of to the normaliser averaged over them (``'mean'``, the default, i.e.
  N * eps on the sum).  ``eps_placement='sum'`` equals ``'mean'`` with ``eps / N``.

The normaliser itself stays the correct one (see above); no option restores the public one.
These parameters are operator parameters (``blocks.i.attn.*``): a softmax checkpoint leaves
them at :meth:`init_extra_parameters` (LayerNorm / RMSNorm: ones, zero bias).

Local branch: a 5 x 5 depthwise convolution (with bias) of V on the patch grid, added to the
attention output before ``proj`` (zero for prefix tokens).  Its weight is named
``local_conv.weight`` (C, 1, 5, 5) and keeps PyTorch's default Conv2d init, as the public code.
"""
import math
import numbers
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from mmlinvit.ops.feature_maps import get_feature_map
from mmlinvit.ops.mhla import (block_centre_mixing, block_centre_mixing_cos,
                               block_centre_mixing_linear, block_token_indices,
                               mhla_attention, mhla_attention_map,
                               mhla_token_mixing_weights, patch_block_index, token_block_index)
from mmlinvit.ops.patch_grid import (check_patch_grid, depthwise_conv2d,
                                     depthwise_conv2d_reference, grid_to_heads, heads_to_grid)
from .base import ATTENTION_OPERATORS, NO_CLS_SINCOS_AVG_POOL, AttentionOperator

#: Block-mixing inits (see the module docstring).
MIXING_INITS = ('softmax', 'cos', 'linear')
#: Where ``eps`` enters the normaliser: averaged over the N tokens (default) or summed (public).
EPS_PLACEMENTS = ('mean', 'sum')
#: Feature maps MHLA accepts (positive).
MHLA_FEATURE_MAPS = ('relu', 'elu')

__all__ = ['MultiHeadLinearAttention', 'MIXING_INITS', 'EPS_PLACEMENTS', 'block_centre_mixing',
           'block_centre_mixing_cos', 'block_centre_mixing_linear', 'patch_block_index']


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f'MHLA option {name} must be True or False, got {value!r}')
    return value


@ATTENTION_OPERATORS.register_module('mhla')
class MultiHeadLinearAttention(AttentionOperator):
    """Multi-head linear attention (MHLA) with the correct block-mixed normaliser.

    See the module docstring for the maths, init and prefix-token handling.

    Args:
        embed_dims: Token width C.
        num_heads: Number of heads.
        block_grid: (gh, gw) blocks, or an int n for an n x n split.  Default 2 x 2 (4 blocks,
            7 x 7 each on a 14 x 14 grid).
        per_head_mixing: One mixing matrix per head instead of one shared matrix.
        mixing_tau: Temperature of the ``'softmax'`` block-centre-distance init.
        mixing_init: ``'softmax'``, ``'cos'`` (the public MHLA code's class default) or
            ``'linear'`` (its training command's); module docstring.
        feature_map: ``'relu'`` (seed 000) or ``'elu'``.
        local_kernel_size: Side of the depthwise conv on V (odd); 0 disables the branch.
        eps: Normaliser epsilon, added where ``eps_placement`` says.
        input_norm: LayerNorm(C) on the operator input (the public module's own ``norm``).
        qk_norm: RMSNorm over all C channels of q and of k before the feature map (public
            registered models).
        feature_eps: Added to the feature map of q and k (public code: 1e-6); >= 0.
        eps_placement: ``'mean'`` (default): ``eps`` is added to the normaliser averaged over
            the N tokens; ``'sum'``: to the normaliser summed over them (public code).
        **kwargs: Base :class:`AttentionOperator` options.
    """

    #: Seed 000 runs MHLA without a class token, with sin-cos positions and average pooling.
    paper_backbone_setting = NO_CLS_SINCOS_AVG_POOL

    recorded_settings = ('block_grid', 'feature_map', 'feature_eps', 'eps_placement', 'eps')

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 block_grid: Union[int, Sequence[int]] = (2, 2),
                 per_head_mixing: bool = False,
                 mixing_tau: float = 1.0,
                 mixing_init: str = 'softmax',
                 feature_map: str = 'relu',
                 local_kernel_size: int = 5,
                 eps: float = 1e-6,
                 input_norm: bool = False,
                 qk_norm: bool = False,
                 feature_eps: float = 0.0,
                 eps_placement: str = 'mean',
                 **kwargs) -> None:
        super().__init__(embed_dims, num_heads, **kwargs)
        if isinstance(block_grid, numbers.Integral):
            block_grid = (block_grid, block_grid)
        if (not isinstance(block_grid, (tuple, list)) or len(block_grid) != 2
                or any(isinstance(g, bool) or not isinstance(g, numbers.Integral) or g < 1
                       for g in block_grid)):
            raise ValueError(f'block_grid must be a positive int or (gh, gw), got {block_grid!r}')
        block_grid = tuple(int(g) for g in block_grid)
        if feature_map not in MHLA_FEATURE_MAPS:
            raise ValueError(f'MHLA needs a positive feature map; valid: {MHLA_FEATURE_MAPS}, '
                             f'got {feature_map!r}')
        if local_kernel_size < 0 or (local_kernel_size and local_kernel_size % 2 == 0):
            raise ValueError(f'local_kernel_size must be odd (or 0 to disable), got '
                             f'{local_kernel_size}')
        if mixing_init not in MIXING_INITS:
            raise ValueError(f'Unknown mixing_init {mixing_init!r}; available: {MIXING_INITS}')
        if mixing_init == 'softmax' and not (isinstance(mixing_tau, (int, float))
                                             and math.isfinite(mixing_tau) and mixing_tau > 0):
            raise ValueError(f'mixing_tau must be a finite number > 0 (the temperature of the '
                             f"'softmax' block-mixing init), got {mixing_tau!r}")
        if eps_placement not in EPS_PLACEMENTS:
            raise ValueError(f'Unknown eps_placement {eps_placement!r}; available: '
                             f'{EPS_PLACEMENTS} (\'mean\': eps on the normaliser averaged over '
                             f'the tokens, \'sum\': on the sum, as the public code)')
        if (isinstance(feature_eps, bool) or not isinstance(feature_eps, (int, float))
                or not math.isfinite(feature_eps) or feature_eps < 0):
            raise ValueError(f'feature_eps must be a finite number >= 0 (public code: 1e-6), '
                             f'got {feature_eps!r}')
        self.mixing_init = mixing_init
        self.eps_placement = eps_placement
        self.feature_eps = float(feature_eps)
        self.block_grid = block_grid
        self.num_blocks = block_grid[0] * block_grid[1]
        self.per_head_mixing = _check_bool('per_head_mixing', per_head_mixing)
        self.mixing_tau = mixing_tau
        self.feature_map = feature_map
        self.eps = eps
        shape = ((num_heads, self.num_blocks, self.num_blocks) if per_head_mixing else
                 (self.num_blocks, self.num_blocks))
        self.block_mixing = nn.Parameter(torch.empty(shape))
        self.local_conv = (nn.Conv2d(embed_dims, embed_dims, local_kernel_size,
                                     padding=local_kernel_size // 2, groups=embed_dims)
                           if local_kernel_size else None)
        self.input_norm = (nn.LayerNorm(embed_dims) if _check_bool('input_norm', input_norm)
                           else None)
        if _check_bool('qk_norm', qk_norm):
            self.q_norm, self.k_norm = nn.RMSNorm(embed_dims), nn.RMSNorm(embed_dims)
        else:
            self.q_norm = self.k_norm = None
        self.init_extra_parameters()

    def init_extra_parameters(self) -> None:
        """Block-mixing from block-centre distances; ``local_conv`` keeps its default init;
        ``input_norm`` / ``q_norm`` / ``k_norm`` (when present): unit weight, zero bias."""
        if self.mixing_init == 'cos':
            init = block_centre_mixing_cos(self.block_grid)
        elif self.mixing_init == 'linear':
            init = block_centre_mixing_linear(self.block_grid)
        else:
            init = block_centre_mixing(self.block_grid, self.mixing_tau)
        with torch.no_grad():
            self.block_mixing.copy_(init.expand_as(self.block_mixing))
        for norm in (self.input_norm, self.q_norm, self.k_norm):
            if norm is not None:
                norm.reset_parameters()

    # ------------------------------------------------------------------ pieces
    def split_qkv(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head q, k, v (B, H, N, d), with ``input_norm`` before ``qkv`` and ``qk_norm`` (over
        all C channels) on q and k before the head split, when enabled."""
        if self.input_norm is not None:
            x = self.input_norm(x)
        if self.q_norm is None:
            return super().split_qkv(x)
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.embed_dims).unbind(2)
        q, k = self.q_norm(q), self.k_norm(k)
        return tuple(t.reshape(b, n, self.num_heads, self.head_dims).transpose(1, 2)
                     for t in (q, k, v))

    def _phi(self, t: torch.Tensor) -> torch.Tensor:
        phi = get_feature_map(self.feature_map)(t.float())
        return phi + self.feature_eps if self.feature_eps else phi

    def _eps(self, num_tokens: int) -> float:
        """The epsilon on the 1/N-scaled normaliser of :mod:`mmlinvit.ops.mhla`."""
        return self.eps / num_tokens if self.eps_placement == 'sum' else self.eps

    def _mixing(self) -> torch.Tensor:
        """(H or 1, nb, nb) fp32 mixing matrix."""
        m = self.block_mixing.float()
        return m if self.per_head_mixing else m.unsqueeze(0)

    def token_block_index(self, num_tokens: int, hw_shape: Optional[Tuple[int, int]],
                          num_prefix_tokens: int, device: torch.device) -> torch.Tensor:
        """Block id of every token, (N,), with -1 for prefix tokens."""
        hw = check_patch_grid('mhla', num_tokens, hw_shape, num_prefix_tokens)
        return token_block_index(hw, self.block_grid, num_prefix_tokens, device)

    def local_branch(self, v: torch.Tensor, hw_shape: Tuple[int, int], num_prefix_tokens: int,
                     reference: bool = False) -> torch.Tensor:
        """5 x 5 depthwise conv of V on the grid, (B, H, N, d) fp32, zero on prefix tokens."""
        grid = heads_to_grid(v.float(), hw_shape, num_prefix_tokens)
        weight = self.local_conv.weight.float().squeeze(1)
        bias = None if self.local_conv.bias is None else self.local_conv.bias.float()
        conv = depthwise_conv2d_reference if reference else depthwise_conv2d
        return grid_to_heads(conv(grid, weight, bias), self.num_heads, num_prefix_tokens)

    # ------------------------------------------------------------------ interface
    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            hw_shape: Optional[Tuple[int, int]], num_prefix_tokens: int) -> torch.Tensor:
        """O(N) block-mixed linear attention plus the local branch, (B, H, N, d)."""
        hw = check_patch_grid('mhla', k.shape[-2], hw_shape, num_prefix_tokens)
        blocks = block_token_indices(hw, self.block_grid, num_prefix_tokens, k.device)
        out = mhla_attention(self._phi(q), self._phi(k), v, blocks, num_prefix_tokens,
                             self._mixing(), self._eps(k.shape[-2]))
        if self.local_conv is not None:
            out = out + self.local_branch(v, tuple(hw_shape), num_prefix_tokens)
        return out.to(v.dtype)

    def token_mixing_weights(self, num_tokens: int, hw_shape: Optional[Tuple[int, int]],
                             num_prefix_tokens: int, device: torch.device) -> torch.Tensor:
        """The (H or 1, N, N) weights m_{a(i), b(j)} (1 where a prefix token is involved)."""
        block_of = self.token_block_index(num_tokens, hw_shape, num_prefix_tokens, device)
        return mhla_token_mixing_weights(block_of, self._mixing())

    def map_from_qk(self, q: torch.Tensor, k: torch.Tensor, hw_shape: Optional[Tuple[int, int]],
                    num_prefix_tokens: int) -> torch.Tensor:
        """The implied (B, H, N, N) map of the attention term (without the local branch)."""
        block_of = self.token_block_index(k.shape[-2], hw_shape, num_prefix_tokens, k.device)
        return mhla_attention_map(self._phi(q), self._phi(k), block_of, self._mixing(),
                                  self._eps(k.shape[-2]))

    def local_term_reference(self, x: torch.Tensor, v: torch.Tensor,
                             hw_shape: Optional[Tuple[int, int]],
                             num_prefix_tokens: int) -> Optional[torch.Tensor]:
        """The 5 x 5 local branch by explicit shift-and-add (``None`` without it)."""
        if self.local_conv is None:
            return None
        return self.local_branch(v, tuple(hw_shape), num_prefix_tokens, reference=True)

    def extra_repr(self) -> str:
        text = (f'{super().extra_repr()}, block_grid={self.block_grid}, '
                f'per_head_mixing={self.per_head_mixing}, feature_map={self.feature_map}')
        if self.feature_eps:
            text += f', feature_eps={self.feature_eps}'
        if self.eps_placement != 'mean':
            text += f', eps_placement={self.eps_placement!r}'
        return text
