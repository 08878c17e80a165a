"""ViT^3 test-time-training (TTT) block (Han et al., 2025, arXiv 2512.01643) as an operator.

Follows the paper's public code (LeapLabTHU/ViTTT, ``vittt/models/ttt_block.py``, ``vittt.py``).
Per sample, two inner models are trained by ONE clipped gradient step on the sample's own
(k, v) and applied to its queries (math in :mod:`mmlinvit.ops.ttt`):

* Branch 1, simplified SwiGLU per head (d = head dim):
  ``f(x) = (x W1) * silu(x W2)``, W1, W2 (d, d) (``inner_w1`` / ``inner_w2``, (H, d, d)).
* Branch 2, 3x3 depthwise convolution on the patch grid with its own d-channel q, k, v:
  ``f(x) = dwconv3x3(x, w)`` (``conv_inner_weight``, (d, 3, 3)), per sample.

Inner loss of both: ``L = -scale * mean_tokens(f(k) . v)`` with ``scale = 9 ** -0.5``, so the
error signal is ``e = -scale * v / N``.  Gradients are clipped per column
(``G / (||G||_{dim=-2} + 1)``) for W1, W2 and per channel (``G / (||G||_{3x3} + 1)``) for w;
step ``W' = W - inner_lr * G`` with ``inner_lr = 1``.  Nothing is kept between calls: every
sample starts from the learned initial weights, in training and inference.

Projections.  ViT^3 uses ``qkv: Linear(C, 3C + 3d)`` (q1, k1, v1 with C channels for branch
1; q2, k2, v2 with d channels for branch 2) and ``proj: Linear(C + d, C)`` on
``cat[branch 1, branch 2]``.  This module holds the same weights split in two so that softmax
checkpoints load unchanged: ``qkv`` (C -> 3C) and ``proj`` (C -> C, with the bias) keep the
softmax names and shapes, ``conv_qkv`` (C -> 3d) holds the extra 3d rows of ViT^3's qkv and
``conv_proj`` (d -> C, no bias) the extra d input columns of its proj.  The outputs are
identical: ``proj(cat[a, b]) = proj_C(a) + conv_proj(b)``.

Positional convolution.  ViT^3 blocks compute ``x = x + cpe(x)`` (3x3 depthwise Conv2d on the
C-channel token grid, with bias) BEFORE ``norm1`` / attention.  The operator owns it as
``cpe`` and applies it in :meth:`pre_attention`, which
:class:`~mmlinvit.layers.TransformerBlock` calls; :meth:`forward` is the attention output only
(the distillation hook point).

Prefix tokens (the paper's models have none; seed 000 runs TTT without a class token): they
take part in branch 1 (its token mean includes them), get no branch-2 term and are not changed
by ``cpe`` (no grid position).

Inner computations run in fp32.  Parameters without a softmax counterpart (``inner_w1``,
``inner_w2``, ``conv_qkv.*``, ``conv_inner_weight``, ``conv_proj.weight``, ``cpe.*``) keep the
documented init of :meth:`init_extra_parameters` when a softmax checkpoint is loaded or
transferred.  Options that deviate from ViT^3 (``conv_branch=False``,
``positional_conv=False``, another ``inner_loss_scale`` / ``inner_lr``) are ablations.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmlinvit.ops.patch_grid import check_patch_grid
from mmlinvit.ops.precision import autocast_disabled
from mmlinvit.ops.ttt import ttt_depthwise_conv, ttt_simplified_swiglu
from .base import ATTENTION_OPERATORS, NO_CLS_SINCOS_AVG_POOL, AttentionOperator

#: ViT^3's inner-loss scale: (1 x 3 x 3) ** -0.5, the "equivalent head dim" of the conv branch.
VITTT_INNER_LOSS_SCALE = 9**-0.5
#: Kernel side of the conv branch and of the positional convolution.
KERNEL_SIZE = 3


@ATTENTION_OPERATORS.register_module('ttt')
class TestTimeTrainingAttention(AttentionOperator):
    """ViT^3 test-time-training block (no attention map, no q.k form).

    See the module docstring for the inner models, loss, clipping, projections and init.

    Args:
        embed_dims: Token width C.
        num_heads: Number of heads H (head dim d = C / H).
        inner_lr: Inner learning rate (ViT^3: 1.0).
        inner_loss_scale: Scale of the dot-product inner loss of both branches (ViT^3:
            ``9 ** -0.5``; the paper reports ``d ** -0.5`` performing similarly).
        conv_branch: Keep the 3x3 depthwise-conv inner model (ViT^3: True). ``False`` is an
            ablation: no ``conv_qkv`` / ``conv_inner_weight`` / ``conv_proj``.
        positional_conv: Add ``x + cpe(x)`` before ``norm1`` (ViT^3: True). ``False`` is an
            ablation (then the model relies on its position embedding alone).
        **kwargs: Base :class:`AttentionOperator` options (``qkv_bias`` also applies to
            ``conv_qkv``).
    """

    has_attention_map = False
    has_qk_form = False
    #: Seed 000: no class token, sin-cos positions, average pooling (ViT^3: no class token).
    paper_backbone_setting = NO_CLS_SINCOS_AVG_POOL

    recorded_settings = ('inner_lr', 'inner_loss_scale')

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 inner_lr: float = 1.0,
                 inner_loss_scale: float = VITTT_INNER_LOSS_SCALE,
                 conv_branch: bool = True,
                 positional_conv: bool = True,
                 **kwargs) -> None:
        super().__init__(embed_dims, num_heads, **kwargs)
        d = self.head_dims
        self.inner_lr = float(inner_lr)
        self.inner_loss_scale = float(inner_loss_scale)
        self.inner_w1 = nn.Parameter(torch.empty(num_heads, d, d))
        self.inner_w2 = nn.Parameter(torch.empty(num_heads, d, d))
        self.conv_branch = conv_branch
        if conv_branch:
            self.conv_qkv = nn.Linear(embed_dims, 3 * d, bias=kwargs.get('qkv_bias', True))
            self.conv_inner_weight = nn.Parameter(torch.empty(d, KERNEL_SIZE, KERNEL_SIZE))
            self.conv_proj = nn.Linear(d, embed_dims, bias=False)
        else:
            self.conv_qkv = self.conv_inner_weight = self.conv_proj = None
        self.cpe = (nn.Conv2d(embed_dims, embed_dims, KERNEL_SIZE, padding=KERNEL_SIZE // 2,
                              groups=embed_dims) if positional_conv else None)
        self.init_extra_parameters()

    def init_extra_parameters(self) -> None:
        """ViT^3's init of the parameters softmax attention lacks.

        ``inner_w1``, ``inner_w2``, ``conv_inner_weight``: truncated normal, std 0.02.
        ``conv_qkv`` / ``conv_proj`` (ViT^3's extra qkv rows / proj columns): truncated normal,
        std 0.02, zero bias, as timm's ViT init of ViT^3's ``qkv`` / ``proj``.  ``cpe``:
        PyTorch's default ``Conv2d`` init (ViT^3's model init leaves convolutions alone).
        """
        nn.init.trunc_normal_(self.inner_w1, std=0.02)
        nn.init.trunc_normal_(self.inner_w2, std=0.02)
        if self.conv_branch:
            nn.init.trunc_normal_(self.conv_inner_weight, std=0.02)
            for lin in (self.conv_qkv, self.conv_proj):
                nn.init.trunc_normal_(lin.weight, std=0.02)
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)
        if self.cpe is not None:
            self.cpe.reset_parameters()

    # ------------------------------------------------------------------ block pieces
    def pre_attention(self,
                      x: torch.Tensor,
                      hw_shape: Optional[Tuple[int, int]] = None,
                      num_prefix_tokens: int = 0) -> torch.Tensor:
        """ViT^3's ``x + cpe(x)`` on the patch tokens (prefix tokens unchanged).

        Args:
            x: Block input (B, N, C), prefix tokens first.
            hw_shape: (h, w) patch grid.
            num_prefix_tokens: Number of class / register tokens at the front.
        """
        if self.cpe is None:
            return x
        h, w = check_patch_grid('ttt', x.shape[1], hw_shape, num_prefix_tokens)
        patches = x[:, num_prefix_tokens:]
        grid = patches.transpose(1, 2).reshape(x.shape[0], self.embed_dims, h, w)
        patches = patches + self.cpe(grid).flatten(2).transpose(1, 2)
        return torch.cat([x[:, :num_prefix_tokens], patches], dim=1)

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            hw_shape: Optional[Tuple[int, int]], num_prefix_tokens: int) -> torch.Tensor:
        """Branch 1 (simplified SwiGLU, one inner step per sample and head), (B, H, N, d)."""
        with autocast_disabled(q.device):  # the inner step in fp32 under AMP too
            out = ttt_simplified_swiglu(q.float(), k.float(), v.float(), self.inner_w1.float(),
                                        self.inner_w2.float(), self.inner_loss_scale,
                                        self.inner_lr)
        return out.to(v.dtype)

    def conv_branch_output(self, x: torch.Tensor, hw_shape: Optional[Tuple[int, int]],
                           num_prefix_tokens: int) -> torch.Tensor:
        """Branch 2 (3x3 depthwise conv, one inner step per sample), (B, N, d) fp32.

        Args:
            x: Normalised tokens (B, N, C).
            hw_shape: (h, w) patch grid.
            num_prefix_tokens: Number of prefix tokens (their rows are zero).
        """
        h, w = check_patch_grid('ttt', x.shape[1], hw_shape, num_prefix_tokens)
        b, d = x.shape[0], self.head_dims
        qkv = self.conv_qkv(x[:, num_prefix_tokens:]).float()  # (B, h*w, 3d)
        q, k, v = qkv.transpose(1, 2).reshape(b, 3, d, h, w).unbind(1)
        with autocast_disabled(x.device):  # the inner step in fp32 under AMP too
            out = ttt_depthwise_conv(q, k, v, self.conv_inner_weight.float(),
                                     self.inner_loss_scale, self.inner_lr)
        return F.pad(out.flatten(2).transpose(1, 2), (0, 0, num_prefix_tokens, 0))

    # ------------------------------------------------------------------ interface
    def forward(self,
                x: torch.Tensor,
                hw_shape: Optional[Tuple[int, int]] = None,
                num_prefix_tokens: int = 0) -> torch.Tensor:
        """``proj(cat[branch 1, branch 2])`` for normalised tokens ``x`` (B, N, C)."""
        q, k, v = self.split_qkv(x)
        out = self.proj(self.attn_drop(self.merge_heads(self.mix(q, k, v, hw_shape,
                                                                 num_prefix_tokens))))
        if self.conv_branch:
            conv = self.conv_branch_output(x, hw_shape, num_prefix_tokens).to(out.dtype)
            out = out + self.conv_proj(self.attn_drop(conv))
        return self.proj_drop(out)

    def forward_reference(self,
                          x: torch.Tensor,
                          hw_shape: Optional[Tuple[int, int]] = None,
                          num_prefix_tokens: int = 0) -> torch.Tensor:
        """TTT has no explicit map; tests compare it with formulas written in the test."""
        raise NotImplementedError('TestTimeTrainingAttention has no O(N^2) reference; see '
                                  'tests/layers/test_ttt.py for the independent formulas')

    def extra_repr(self) -> str:
        return (f'{super().extra_repr()}, inner_lr={self.inner_lr}, '
                f'inner_loss_scale={self.inner_loss_scale:.4g}, '
                f'conv_branch={self.conv_branch}, positional_conv={self.cpe is not None}')
