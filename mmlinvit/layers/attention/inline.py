"""InLine attention: injective linear attention with subtractive normalisation (Han et al., 2024).

With s = head_dims ** -0.5 and the identity feature map (InLine's choice for DeiT),

    A_ij = (s / N) q_i.k_j + (1 / N) (1 - s q_i.kbar),   kbar = mean_j k_j
    out_i = s q_i (K^T V / N) + (1 - s q_i.kbar) vbar

Each row of A sums to exactly 1 (the subtracted term removes the row mean of the bilinear
scores and adds back a uniform 1/N), but entries may be negative: the map is signed.  All tokens,
prefix tokens included, attend to each other.  The O(N) path is
:func:`mmlinvit.ops.linear_attention.inline_attention` (fp32 accumulation); the O(N^2) map is
:func:`mmlinvit.ops.inline.inline_attention_map`.  ``backend`` picks the kernel backend, with
the precedence: the config's ``backend`` > ``MMLINVIT_LINEAR_ATTN_BACKEND`` (read only when
``backend=None``) > auto.

Local residual (``local_residual=True``, off in the seed-000 recipe): InLine adds a local
attention residual on the patch grid, a depthwise 3 x 3 convolution of V whose kernel is
*predicted per sample* from the input ("learned weighting" of the 9 neighbours):

    kernel = G(mean_n x_n),  G = per-head linear (d -> d), GELU, per-head linear (d -> 9 d)

giving one 3 x 3 kernel per channel and sample (grouped 1 x 1 convolutions with ``num_heads``
groups, so each head's kernels depend on that head's slice of the mean token).  The mean runs
over all tokens of ``x`` (the normalised block input), prefix tokens included.  The branch is
added to the patch tokens' attention output before ``proj``; prefix tokens get no local term
(they have no grid position).  ``G`` keeps PyTorch's default Conv1d init (as the reference
code, whose ViT init only touches Linear layers).
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmlinvit.ops.inline import inline_attention_map
from mmlinvit.ops.linear_attention import inline_attention
from mmlinvit.ops.patch_grid import (check_patch_grid, depthwise_conv2d,
                                     depthwise_conv2d_reference, grid_to_heads, heads_to_grid)
from .base import ATTENTION_OPERATORS, AttentionOperator, check_kernel_backend


@ATTENTION_OPERATORS.register_module('inline')
class InLineAttention(AttentionOperator):
    """InLine injective linear attention (identity feature map).

    Args:
        embed_dims: Token width C.
        num_heads: Number of heads.
        local_residual: Add InLine's input-conditioned 3 x 3 depthwise local branch on V
            (needs ``hw_shape``); parameters ``local_kernel_generator.{0,2}``.
        backend: Kernel backend of the attention term, ``None`` (environment variable, then
            auto), ``'auto'``, ``'torch'`` or ``'triton'``.
        **kwargs: Base :class:`AttentionOperator` options.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 local_residual: bool = False,
                 backend: Optional[str] = None,
                 **kwargs) -> None:
        super().__init__(embed_dims, num_heads, **kwargs)
        self.backend = check_kernel_backend('inline', backend)
        self.local_residual = local_residual
        self.local_kernel_size = 3
        if local_residual:
            k2 = self.local_kernel_size**2
            self.local_kernel_generator = nn.Sequential(
                nn.Conv1d(embed_dims, embed_dims, kernel_size=1, groups=num_heads),
                nn.GELU(),
                nn.Conv1d(embed_dims, embed_dims * k2, kernel_size=1, groups=num_heads))
        else:
            self.local_kernel_generator = None

    # ------------------------------------------------------------------ local branch
    def local_kernels(self, x: torch.Tensor) -> torch.Tensor:
        """Per-sample depthwise kernels (B, C, 3, 3) predicted from the mean token of ``x``.

        Computed in fp32 whatever the dtype of ``x`` or of the parameters.
        """
        b, _, c = x.shape
        k = self.local_kernel_size
        first, last = self.local_kernel_generator[0], self.local_kernel_generator[2]
        mean_token = x.float().mean(dim=1).unsqueeze(-1)  # (B, C, 1)
        hidden = F.gelu(F.conv1d(mean_token, first.weight.float(), first.bias.float(),
                                 groups=self.num_heads))
        kernels = F.conv1d(hidden, last.weight.float(), last.bias.float(), groups=self.num_heads)
        return kernels.reshape(b, c, k, k)

    def local_branch(self, x: torch.Tensor, v: torch.Tensor, hw_shape: Optional[Tuple[int, int]],
                     num_prefix_tokens: int, reference: bool = False) -> torch.Tensor:
        """The local residual on V, (B, H, N, d) in fp32, zero on prefix tokens.

        Args:
            x: Normalised block input (B, N, C).
            v: Per-head values (B, H, N, d).
            hw_shape: (h, w) patch grid.
            num_prefix_tokens: Number of prefix tokens.
            reference: Use the explicit shift-and-add convolution (tests).
        """
        hw = check_patch_grid('inline', v.shape[2], hw_shape, num_prefix_tokens)
        kernels = self.local_kernels(x)
        v_grid = heads_to_grid(v.float(), hw, num_prefix_tokens)
        conv = depthwise_conv2d_reference if reference else depthwise_conv2d
        return grid_to_heads(conv(v_grid, kernels), self.num_heads, num_prefix_tokens)

    # ------------------------------------------------------------------ interface
    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            hw_shape: Optional[Tuple[int, int]], num_prefix_tokens: int) -> torch.Tensor:
        """The InLine attention term only (the local residual needs ``x``, see forward)."""
        return inline_attention(q, k, v, self.scale, backend=self.backend)

    def forward(self,
                x: torch.Tensor,
                hw_shape: Optional[Tuple[int, int]] = None,
                num_prefix_tokens: int = 0) -> torch.Tensor:
        q, k, v = self.split_qkv(x)
        out = self.mix(q, k, v, hw_shape, num_prefix_tokens)
        if self.local_residual:
            local = self.local_branch(x, v, hw_shape, num_prefix_tokens)
            out = (out.float() + local).to(v.dtype)
        return self.project(out)

    def map_from_qk(self, q: torch.Tensor, k: torch.Tensor, hw_shape: Optional[Tuple[int, int]],
                    num_prefix_tokens: int) -> torch.Tensor:
        """The signed InLine map (B, H, N, N) of the attention term; rows sum to 1."""
        return inline_attention_map(q, k, self.scale)

    def local_term_reference(self, x: torch.Tensor, v: torch.Tensor,
                             hw_shape: Optional[Tuple[int, int]],
                             num_prefix_tokens: int) -> Optional[torch.Tensor]:
        """The local residual by explicit shift-and-add (``None`` without it)."""
        if not self.local_residual:
            return None
        return self.local_branch(x, v, hw_shape, num_prefix_tokens, reference=True)

    def extra_repr(self) -> str:
        return (f'{super().extra_repr()}, local_residual={self.local_residual}, '
                f'backend={self.backend}')
