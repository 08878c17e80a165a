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
:func:`~.kernel_linear.signed_safe_denominator`, so a learned m with negative entries can never
divide by zero.

``block_mixing`` is shared by all heads by default (as the public code's single 1 x 1 conv),
or one matrix per head with ``per_head_mixing=True``.  Init (``mixing_init``): block centres
c_a = (row + 0.5, col + 0.5) in block units, d_ab = |c_a - c_b|, and

* ``'softmax'`` (default): m_a = softmax_b(-d_ab / tau) (rows sum to 1, the own block gets the
  largest weight);
* ``'cos'``: the public MHLA code's default (``BlockDistanceConv(transform='cos')``):
  m_ab = cos(d_ab / max(d) * pi / 4), each column b divided by its sum.  Flatter: on the 2 x 2
  grid the own block gets 0.29 (``'softmax'``: 0.51).

m is then learned freely.

Prefix tokens (class / register; seed-000 MHLA models have none, but they are supported):
prefix keys form a global group mixed into every block's summary with weight 1 (not learned),
and prefix queries attend globally to all tokens with weight 1 (plain linear attention).  Rows
still sum to 1.

Local branch: a 5 x 5 depthwise convolution (with bias) of V on the patch grid, added to the
attention output before ``proj`` (zero for prefix tokens).  Its weight is named
``local_conv.weight`` (C, 1, 5, 5) and keeps PyTorch's default Conv2d init, as the public code.
"""
import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from mmlinvit.ops.feature_maps import get_feature_map
from .base import ATTENTION_OPERATORS, NO_CLS_SINCOS_AVG_POOL, AttentionOperator
from .grid import (check_patch_grid, depthwise_conv2d, depthwise_conv2d_reference,
                   grid_to_heads, heads_to_grid)
from .kernel_linear import signed_safe_denominator

#: Block-mixing inits (see the module docstring).
MIXING_INITS = ('softmax', 'cos')


def block_centre_mixing(block_grid: Tuple[int, int], tau: float = 1.0) -> torch.Tensor:
    """Row-stochastic init of the block-mixing matrix: ``softmax_b(-|c_a - c_b| / tau)``.

    Args:
        block_grid: (gh, gw) blocks per side.
        tau: Distance temperature in block units (smaller: more local).

    Returns:
        (gh * gw, gh * gw) float32 matrix with rows summing to 1.
    """
    gh, gw = block_grid
    rows, cols = torch.meshgrid(torch.arange(gh, dtype=torch.float32) + 0.5,
                                torch.arange(gw, dtype=torch.float32) + 0.5, indexing='ij')
    centres = torch.stack([rows.flatten(), cols.flatten()], dim=-1)
    dist = torch.cdist(centres, centres)
    return (-dist / tau).softmax(dim=-1)


def block_centre_mixing_cos(block_grid: Tuple[int, int]) -> torch.Tensor:
    """The public MHLA code's init: ``cos(d_ab / max(d) * pi / 4)``, columns summing to 1.

    Args:
        block_grid: (gh, gw) blocks per side.

    Returns:
        (gh * gw, gh * gw) float32 matrix (all ones on a 1 x 1 grid).
    """
    gh, gw = block_grid
    rows, cols = torch.meshgrid(torch.arange(gh, dtype=torch.float32) + 0.5,
                                torch.arange(gw, dtype=torch.float32) + 0.5, indexing='ij')
    centres = torch.stack([rows.flatten(), cols.flatten()], dim=-1)
    dist = torch.cdist(centres, centres)
    max_dist = float(dist.max())
    mat = torch.cos(dist / max_dist * math.pi / 4) if max_dist > 0 else torch.ones_like(dist)
    return mat / mat.sum(dim=0, keepdim=True)


def patch_block_index(hw_shape: Tuple[int, int], block_grid: Tuple[int, int],
                      device: Optional[torch.device] = None) -> torch.Tensor:
    """Block id (row-major over ``block_grid``) of every patch in raster order, (h * w,).

    Args:
        hw_shape: (h, w) patch grid.
        block_grid: (gh, gw) blocks per side; edges at ``floor(i * h / gh)``.
        device: Device of the result.
    """
    h, w = hw_shape
    gh, gw = block_grid
    # The block of row y is the largest i with floor(i * h / gh) <= y, i.e.
    # floor((y * gh + gh - 1) / h), capped to gh - 1; exact integer arithmetic.
    y = torch.arange(h, device=device)
    x = torch.arange(w, device=device)
    row_block = torch.clamp((y * gh + gh - 1) // h, max=gh - 1)
    col_block = torch.clamp((x * gw + gw - 1) // w, max=gw - 1)
    return (row_block[:, None] * gw + col_block[None, :]).flatten()


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
        mixing_init: ``'softmax'`` or ``'cos'`` (the public MHLA code's); module docstring.
        feature_map: ``'relu'`` (seed 000) or ``'elu'``.
        local_kernel_size: Side of the depthwise conv on V (odd); 0 disables the branch.
        eps: Normaliser epsilon (on the 1/N-scaled normaliser).
        **kwargs: Base :class:`AttentionOperator` options.
    """

    #: Seed 000 runs MHLA without a class token, with sin-cos positions and average pooling.
    paper_backbone_setting = NO_CLS_SINCOS_AVG_POOL

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
                 **kwargs) -> None:
        super().__init__(embed_dims, num_heads, **kwargs)
        if isinstance(block_grid, int):
            block_grid = (block_grid, block_grid)
        block_grid = tuple(int(g) for g in block_grid)
        if len(block_grid) != 2 or min(block_grid) < 1:
            raise ValueError(f'block_grid must be a positive int or (gh, gw), got {block_grid}')
        if feature_map not in ('relu', 'elu'):
            raise ValueError(f"MHLA needs a positive feature map, 'relu' or 'elu', got "
                             f"{feature_map!r}")
        if local_kernel_size < 0 or (local_kernel_size and local_kernel_size % 2 == 0):
            raise ValueError(f'local_kernel_size must be odd (or 0 to disable), got '
                             f'{local_kernel_size}')
        if mixing_init not in MIXING_INITS:
            raise ValueError(f'Unknown mixing_init {mixing_init!r}; available: {MIXING_INITS}')
        self.mixing_init = mixing_init
        self.block_grid = block_grid
        self.num_blocks = block_grid[0] * block_grid[1]
        self.per_head_mixing = per_head_mixing
        self.mixing_tau = mixing_tau
        self.feature_map = feature_map
        self.eps = eps
        shape = ((num_heads, self.num_blocks, self.num_blocks) if per_head_mixing else
                 (self.num_blocks, self.num_blocks))
        self.block_mixing = nn.Parameter(torch.empty(shape))
        self.local_conv = (nn.Conv2d(embed_dims, embed_dims, local_kernel_size,
                                     padding=local_kernel_size // 2, groups=embed_dims)
                           if local_kernel_size else None)
        self.init_extra_parameters()

    def init_extra_parameters(self) -> None:
        """Block-mixing from block-centre distances; ``local_conv`` keeps its default init."""
        if self.mixing_init == 'cos':
            init = block_centre_mixing_cos(self.block_grid)
        else:
            init = block_centre_mixing(self.block_grid, self.mixing_tau)
        with torch.no_grad():
            self.block_mixing.copy_(init.expand_as(self.block_mixing))

    # ------------------------------------------------------------------ pieces
    def _phi(self, t: torch.Tensor) -> torch.Tensor:
        return get_feature_map(self.feature_map)(t.float())

    def _mixing(self) -> torch.Tensor:
        """(H or 1, nb, nb) fp32 mixing matrix."""
        m = self.block_mixing.float()
        return m if self.per_head_mixing else m.unsqueeze(0)

    def token_block_index(self, num_tokens: int, hw_shape: Optional[Tuple[int, int]],
                          num_prefix_tokens: int, device: torch.device) -> torch.Tensor:
        """Block id of every token, (N,), with -1 for prefix tokens."""
        hw = check_patch_grid('mhla', num_tokens, hw_shape, num_prefix_tokens)
        block = patch_block_index(hw, self.block_grid, device)
        prefix = torch.full((num_prefix_tokens, ), -1, dtype=block.dtype, device=device)
        return torch.cat([prefix, block])

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
        n = k.shape[-2]
        block_of = self.token_block_index(n, hw_shape, num_prefix_tokens, k.device)
        phi_q, phi_k = self._phi(q), self._phi(k)
        v32 = v.float()
        ones = torch.ones(v32.shape[:-1] + (1, ), dtype=v32.dtype, device=v32.device)
        v_aug = torch.cat([v32, ones], dim=-1)  # (B, H, N, e + 1): numerator and normaliser

        p = num_prefix_tokens
        block_tokens: List[torch.Tensor] = [
            torch.nonzero(block_of == b).flatten() for b in range(self.num_blocks)
        ]
        # Per-block summaries (B, H, nb, d, e + 1) and the prefix group's summary.
        kv_blocks = torch.stack([
            torch.matmul(phi_k[:, :, idx].transpose(-2, -1), v_aug[:, :, idx])
            for idx in block_tokens
        ], dim=2).div_(n)
        kv_prefix = torch.matmul(phi_k[:, :, :p].transpose(-2, -1), v_aug[:, :, :p]).div_(n)
        z, h, nb, d, e1 = kv_blocks.shape
        mixed = torch.matmul(self._mixing(), kv_blocks.reshape(z, h, nb, d * e1))
        mixed = mixed.reshape(z, h, nb, d, e1) + kv_prefix.unsqueeze(2)

        outs = [torch.matmul(phi_q[:, :, :p], kv_blocks.sum(dim=2) + kv_prefix)]
        outs += [
            torch.matmul(phi_q[:, :, idx], mixed[:, :, a])
            for a, idx in enumerate(block_tokens)
        ]
        order = torch.cat([torch.arange(p, device=k.device)] + block_tokens)
        out = torch.cat(outs, dim=2)[:, :, torch.argsort(order)]
        num, den = out[..., :-1], out[..., -1:]
        out = num / signed_safe_denominator(den, self.eps)
        if self.local_conv is not None:
            out = out + self.local_branch(v, tuple(hw_shape), p)
        return out.to(v.dtype)

    def token_mixing_weights(self, num_tokens: int, hw_shape: Optional[Tuple[int, int]],
                             num_prefix_tokens: int, device: torch.device) -> torch.Tensor:
        """The (H or 1, N, N) weights m_{a(i), b(j)} (1 where a prefix token is involved)."""
        block_of = self.token_block_index(num_tokens, hw_shape, num_prefix_tokens, device)
        idx = block_of.clamp(min=0)
        m = self._mixing()
        weights = m[:, idx][:, :, idx]
        is_prefix = block_of < 0
        prefix_pair = is_prefix[:, None] | is_prefix[None, :]
        return torch.where(prefix_pair, torch.ones_like(weights), weights)

    def attention_map(self,
                      x: torch.Tensor,
                      hw_shape: Optional[Tuple[int, int]] = None,
                      num_prefix_tokens: int = 0) -> torch.Tensor:
        """The implied (B, H, N, N) map of the attention term (without the local branch)."""
        q, k, _ = self.split_qkv(x)
        n = k.shape[-2]
        weights = self.token_mixing_weights(n, hw_shape, num_prefix_tokens, x.device)
        scores = weights * (self._phi(q) @ self._phi(k).transpose(-2, -1))
        den = scores.sum(dim=-1, keepdim=True) / n
        return scores / (n * signed_safe_denominator(den, self.eps))

    def forward_reference(self,
                          x: torch.Tensor,
                          hw_shape: Optional[Tuple[int, int]] = None,
                          num_prefix_tokens: int = 0) -> torch.Tensor:
        """O(N^2) reference of the whole operator (map @ V plus the local branch)."""
        _, _, v = self.split_qkv(x)
        out = self.attention_map(x, hw_shape, num_prefix_tokens) @ v.float()
        if self.local_conv is not None:
            out = out + self.local_branch(v, tuple(hw_shape), num_prefix_tokens, reference=True)
        return self.project(out.to(v.dtype))

    def extra_repr(self) -> str:
        return (f'{super().extra_repr()}, block_grid={self.block_grid}, '
                f'per_head_mixing={self.per_head_mixing}, feature_map={self.feature_map}')
