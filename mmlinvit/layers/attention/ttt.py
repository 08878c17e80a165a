"""ViT^3 test-time-training (TTT) token mixer (Han et al., 2025), as an attention operator.

Per sample and head, an inner SwiGLU model

    f_W(x) = ((x W1) * silu(x W2)) W3,    W1, W2: d -> m,  W3: m -> d   (m = inner_hidden_dims)

is trained by ONE gradient step on a self-supervised loss over the sample's own (k, v) pairs,
then applied to the queries:

    W' = W - lr * G / (|G| + 1),   G = dL/dW,   out_i = f_W'(q_i)

with ``|G|`` the Frobenius norm of each weight's gradient per sample and head (ViT^3's public
code normalises column-wise; per-matrix Frobenius clipping is this module's documented
choice).  Inner losses (N tokens, prefix tokens included):

* ``'dot_product'`` (ViT^3 default): L = -(s / N) sum_n f(k_n).v_n with s = d ** -0.5;
* ``'mse'``: L = 1 / (2N) sum_n |f(k_n) - v_n|^2.

The gradient is written in closed form (:meth:`swiglu_inner_gradients`, O(N) matmuls, fp32)
and differentiated through by autograd for the outer training; tests check it against
``torch.autograd.grad`` of :meth:`swiglu_inner_loss`.  Nothing is kept between calls: the
inner weights start from the learned ``inner_w*`` for every sample, in training and inference.

Convolution branch (``conv_branch=True``, ViT^3's "3x3dwc" inner module): an extra projection
``conv_qkv`` (C -> 3d) gives d-channel q', k', v' on the patch grid; a depthwise k x k kernel
``conv_inner_weight`` (d, k, k) is trained by one step of the same loss on (k', v') (clipped per
channel: each channel's k x k gradient by its own Frobenius norm, s = 1 / k) and applied to
q'.  Its d-channel output is projected by ``conv_proj`` (d -> C, no bias) and added to
``proj``'s output: together ``proj`` and ``conv_proj`` are ViT^3's (C + d) -> C projection, and
the softmax ``qkv`` / ``proj`` keep their names and shapes so checkpoints still load.  Prefix
tokens take part in the SwiGLU branch but get no convolution term (no grid position).

Default init (:meth:`init_extra_parameters`): ``inner_w1``, ``inner_w2`` and
``conv_inner_weight`` truncated normal (std 0.02, as ViT^3); ``inner_w3`` the (rectangular)
identity, so at init the inner model is ViT^3's simplified SwiGLU (identity output layer);
``conv_qkv`` / ``conv_proj`` truncated normal (std 0.02) with zero bias.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import ATTENTION_OPERATORS, AttentionOperator
from .grid import check_patch_grid, depthwise_conv2d

INNER_LOSSES = ('dot_product', 'mse')


def clip_inner_gradient(grad: torch.Tensor, num_dims: int = 2) -> torch.Tensor:
    """``g / (|g| + 1)`` with ``|g|`` the Frobenius norm over the last ``num_dims`` dims."""
    norm = grad.flatten(-num_dims).norm(dim=-1)
    return grad / (norm.reshape(norm.shape + (1, ) * num_dims) + 1.0)


def silu_derivative(z: torch.Tensor) -> torch.Tensor:
    """d silu(z) / dz = sigmoid(z) (1 + z (1 - sigmoid(z)))."""
    sig = torch.sigmoid(z)
    return sig * (1.0 + z * (1.0 - sig))


@ATTENTION_OPERATORS.register_module('ttt')
class TestTimeTrainingAttention(AttentionOperator):
    """ViT^3 test-time-training block (no attention map, no q.k form).

    See the module docstring for the inner model, loss, clipping, branches and init.

    Args:
        embed_dims: Token width C.
        num_heads: Number of heads.
        inner_hidden_dims: Hidden width m of the inner SwiGLU (default: head_dims).
        inner_lr: Inner learning rate (ViT^3: 1.0).
        inner_loss: ``'dot_product'`` or ``'mse'``.
        conv_branch: Add the inner-trained depthwise-conv branch (needs ``hw_shape``).
        conv_kernel_size: Odd kernel side of the conv branch (ViT^3: 3).
        **kwargs: Base :class:`AttentionOperator` options (``qkv_bias`` also applies to
            ``conv_qkv``).
    """

    has_attention_map = False
    has_qk_form = False

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 inner_hidden_dims: Optional[int] = None,
                 inner_lr: float = 1.0,
                 inner_loss: str = 'dot_product',
                 conv_branch: bool = True,
                 conv_kernel_size: int = 3,
                 **kwargs) -> None:
        super().__init__(embed_dims, num_heads, **kwargs)
        if inner_loss not in INNER_LOSSES:
            raise ValueError(f'Unknown inner_loss {inner_loss!r}; available: {INNER_LOSSES}')
        if conv_kernel_size < 1 or conv_kernel_size % 2 == 0:
            raise ValueError(f'conv_kernel_size must be odd, got {conv_kernel_size}')
        d = self.head_dims
        hidden = inner_hidden_dims or d
        self.inner_hidden_dims = hidden
        self.inner_lr = inner_lr
        self.inner_loss = inner_loss
        self.inner_loss_scale = d**-0.5
        self.inner_w1 = nn.Parameter(torch.empty(num_heads, d, hidden))
        self.inner_w2 = nn.Parameter(torch.empty(num_heads, d, hidden))
        self.inner_w3 = nn.Parameter(torch.empty(num_heads, hidden, d))
        self.conv_branch = conv_branch
        self.conv_kernel_size = conv_kernel_size
        self.conv_loss_scale = 1.0 / conv_kernel_size  # (k * k) ** -0.5, ViT^3's choice for 3x3
        if conv_branch:
            self.conv_qkv = nn.Linear(embed_dims, 3 * d, bias=kwargs.get('qkv_bias', True))
            self.conv_inner_weight = nn.Parameter(torch.empty(d, conv_kernel_size,
                                                              conv_kernel_size))
            self.conv_proj = nn.Linear(d, embed_dims, bias=False)
        else:
            self.conv_qkv = self.conv_inner_weight = self.conv_proj = None
        self.init_extra_parameters()

    def init_extra_parameters(self) -> None:
        """Documented init of the inner model and the conv branch (module docstring)."""
        nn.init.trunc_normal_(self.inner_w1, std=0.02)
        nn.init.trunc_normal_(self.inner_w2, std=0.02)
        with torch.no_grad():
            eye = torch.eye(self.inner_hidden_dims, self.head_dims)
            self.inner_w3.copy_(eye.expand_as(self.inner_w3))
        if self.conv_branch:
            nn.init.trunc_normal_(self.conv_inner_weight, std=0.02)
            for lin in (self.conv_qkv, self.conv_proj):
                nn.init.trunc_normal_(lin.weight, std=0.02)
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)

    # ------------------------------------------------------------------ SwiGLU inner model
    def inner_weights(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The learned initial inner weights in fp32, (H, d, m), (H, d, m), (H, m, d)."""
        return self.inner_w1.float(), self.inner_w2.float(), self.inner_w3.float()

    @staticmethod
    def swiglu_apply(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                     w3: torch.Tensor) -> torch.Tensor:
        """f_W(x) = ((x W1) * silu(x W2)) W3 for x (B, H, N, d), W (H, ...) or (B, H, ...)."""
        return torch.matmul(torch.matmul(x, w1) * F.silu(torch.matmul(x, w2)), w3)

    def swiglu_inner_loss(self, k: torch.Tensor, v: torch.Tensor, w1: torch.Tensor,
                          w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
        """The inner self-supervised loss per sample and head, (B, H), computed directly."""
        pred = self.swiglu_apply(k, w1, w2, w3)
        n = k.shape[-2]
        if self.inner_loss == 'dot_product':
            return -(self.inner_loss_scale / n) * (pred * v).sum(dim=(-2, -1))
        return 0.5 / n * (pred - v).pow(2).sum(dim=(-2, -1))

    def swiglu_inner_gradients(self, k: torch.Tensor, v: torch.Tensor, w1: torch.Tensor,
                               w2: torch.Tensor, w3: torch.Tensor
                               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Closed-form dL/dW1, dL/dW2, dL/dW3 per sample and head (unclipped), O(N).

        With z1 = k W1, z2 = k W2, u = z1 * silu(z2), y = u W3 and e = dL/dy:
        dW3 = u^T e, du = e W3^T, dW1 = k^T (du * silu(z2)), dW2 = k^T (du * z1 * silu'(z2)).

        Args:
            k: Keys (B, H, N, d), fp32.
            v: Values (B, H, N, d), fp32.
            w1: (H, d, m) or (B, H, d, m).
            w2: (H, d, m) or (B, H, d, m).
            w3: (H, m, d) or (B, H, m, d).

        Returns:
            Gradients of shapes (B, H, d, m), (B, H, d, m), (B, H, m, d).
        """
        n = k.shape[-2]
        z1 = torch.matmul(k, w1)
        z2 = torch.matmul(k, w2)
        gate = F.silu(z2)
        u = z1 * gate
        if self.inner_loss == 'dot_product':
            e = v * (-self.inner_loss_scale / n)
        else:
            e = (torch.matmul(u, w3) - v) / n
        k_t = k.transpose(-2, -1)
        g3 = torch.matmul(u.transpose(-2, -1), e)
        du = torch.matmul(e, w3.transpose(-2, -1))
        g1 = torch.matmul(k_t, du * gate)
        g2 = torch.matmul(k_t, du * z1 * silu_derivative(z2))
        return g1, g2, g3

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            hw_shape: Optional[Tuple[int, int]], num_prefix_tokens: int) -> torch.Tensor:
        """SwiGLU branch: one clipped inner step on (k, v), then f_W'(q), (B, H, N, d)."""
        q32, k32, v32 = q.float(), k.float(), v.float()
        weights = self.inner_weights()
        grads = self.swiglu_inner_gradients(k32, v32, *weights)
        w1, w2, w3 = (w - self.inner_lr * clip_inner_gradient(g) for w, g in zip(weights, grads))
        return self.swiglu_apply(q32, w1, w2, w3).to(v.dtype)

    # ------------------------------------------------------------------ conv inner model
    def conv_qkv_grids(self, x: torch.Tensor, hw_shape: Optional[Tuple[int, int]],
                       num_prefix_tokens: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q', k', v' of the conv branch as fp32 (B, d, h, w) grids of the patch tokens."""
        h, w = check_patch_grid('ttt', x.shape[1], hw_shape, num_prefix_tokens)
        qkv = self.conv_qkv(x[:, num_prefix_tokens:]).float()  # (B, h*w, 3d)
        b = x.shape[0]
        grids = qkv.transpose(1, 2).reshape(b, 3, self.head_dims, h, w)
        return grids[:, 0], grids[:, 1], grids[:, 2]

    def conv_inner_loss(self, k: torch.Tensor, v: torch.Tensor,
                        weight: torch.Tensor) -> torch.Tensor:
        """The conv branch's inner loss per sample, (B,), computed directly with conv2d."""
        pred = depthwise_conv2d(k, weight)
        n = k.shape[-2] * k.shape[-1]
        if self.inner_loss == 'dot_product':
            return -(self.conv_loss_scale / n) * (pred * v).sum(dim=(1, 2, 3))
        return 0.5 / n * (pred - v).pow(2).sum(dim=(1, 2, 3))

    def conv_inner_gradient(self, k: torch.Tensor, v: torch.Tensor,
                            weight: torch.Tensor) -> torch.Tensor:
        """Closed-form dL/dweight per sample, (B, d, ks, ks) (unclipped).

        For pred = depthwise_conv2d(k, weight) and e = dL/dpred,
        ``grad[b, c, i, j] = sum_{y, x} k_pad[b, c, y + i, x + j] e[b, c, y, x]``.

        Args:
            k: (B, d, h, w) keys.
            v: (B, d, h, w) values.
            weight: (d, ks, ks) or (B, d, ks, ks) kernels.
        """
        _, _, h, w = k.shape
        n = h * w
        ks = weight.shape[-1]
        if self.inner_loss == 'dot_product':
            e = v * (-self.conv_loss_scale / n)
        else:
            e = (depthwise_conv2d(k, weight) - v) / n
        pad = ks // 2
        k_pad = F.pad(k, (pad, pad, pad, pad))
        taps = [(k_pad[:, :, i:i + h, j:j + w] * e).sum(dim=(-2, -1))
                for i in range(ks) for j in range(ks)]
        return torch.stack(taps, dim=-1).reshape(k.shape[0], k.shape[1], ks, ks)

    def conv_branch_output(self, x: torch.Tensor, hw_shape: Optional[Tuple[int, int]],
                           num_prefix_tokens: int, reference: bool = False) -> torch.Tensor:
        """Conv-branch output before ``conv_proj``, (B, N, d) fp32, zero on prefix tokens.

        Args:
            x: Normalised tokens (B, N, C).
            hw_shape: (h, w) grid.
            num_prefix_tokens: Number of prefix tokens.
            reference: Take the inner gradient from autograd instead of the closed form.
        """
        q, k, v = self.conv_qkv_grids(x, hw_shape, num_prefix_tokens)
        weight = self.conv_inner_weight.float()
        if reference:
            grad = self._autograd_grad(lambda w: self.conv_inner_loss(k, v, w), weight,
                                       x.shape[0])
        else:
            grad = self.conv_inner_gradient(k, v, weight)
        new_weight = weight - self.inner_lr * clip_inner_gradient(grad)
        out = depthwise_conv2d(q, new_weight).flatten(2).transpose(1, 2)  # (B, h*w, d)
        return F.pad(out, (0, 0, num_prefix_tokens, 0))

    # ------------------------------------------------------------------ interface
    def forward(self,
                x: torch.Tensor,
                hw_shape: Optional[Tuple[int, int]] = None,
                num_prefix_tokens: int = 0) -> torch.Tensor:
        q, k, v = self.split_qkv(x)
        return self._combine(x, self.mix(q, k, v, hw_shape, num_prefix_tokens), hw_shape,
                             num_prefix_tokens, reference=False)

    def _combine(self, x: torch.Tensor, swiglu_out: torch.Tensor,
                 hw_shape: Optional[Tuple[int, int]], num_prefix_tokens: int,
                 reference: bool) -> torch.Tensor:
        """proj(SwiGLU branch) + conv_proj(conv branch), then dropout."""
        out = self.proj(self.attn_drop(self.merge_heads(swiglu_out)))
        if self.conv_branch:
            conv = self.conv_branch_output(x, hw_shape, num_prefix_tokens, reference)
            out = out + self.conv_proj(self.attn_drop(conv.to(out.dtype)))
        return self.proj_drop(out)

    @staticmethod
    def _autograd_grad(loss_fn, weight: torch.Tensor, batch: int) -> torch.Tensor:
        """Per-sample dL/dW by autograd on a per-sample copy of ``weight`` (values only)."""
        with torch.enable_grad():
            per_sample = weight.detach().unsqueeze(0).repeat(
                (batch, ) + (1, ) * weight.dim()).requires_grad_(True)
            return torch.autograd.grad(loss_fn(per_sample).sum(), per_sample)[0]

    def swiglu_inner_gradients_autograd(self, k: torch.Tensor, v: torch.Tensor, w1: torch.Tensor,
                                        w2: torch.Tensor, w3: torch.Tensor
                                        ) -> Tuple[torch.Tensor, ...]:
        """dL/dW of :meth:`swiglu_inner_loss` by ``torch.autograd.grad`` (reference, values only).

        Per-sample, per-head copies of the weights make the gradient of the summed loss equal
        to each sample's and head's own gradient.
        """
        b = k.shape[0]
        with torch.enable_grad():
            copies = [w.detach().unsqueeze(0).repeat(b, 1, 1, 1).requires_grad_(True)
                      for w in (w1, w2, w3)]
            loss = self.swiglu_inner_loss(k.detach(), v.detach(), *copies).sum()
            return torch.autograd.grad(loss, copies)

    def forward_reference(self,
                          x: torch.Tensor,
                          hw_shape: Optional[Tuple[int, int]] = None,
                          num_prefix_tokens: int = 0) -> torch.Tensor:
        """Reference forward with the inner gradients from autograd (tests; values only)."""
        q, k, v = self.split_qkv(x)
        q32, k32, v32 = q.float(), k.float(), v.float()
        weights = self.inner_weights()
        grads = self.swiglu_inner_gradients_autograd(k32, v32, *weights)
        w1, w2, w3 = (w - self.inner_lr * clip_inner_gradient(g) for w, g in zip(weights, grads))
        out = self.swiglu_apply(q32, w1, w2, w3).to(v.dtype)
        return self._combine(x, out, hw_shape, num_prefix_tokens, reference=True)

    def extra_repr(self) -> str:
        return (f'{super().extra_repr()}, inner_hidden_dims={self.inner_hidden_dims}, '
                f'inner_lr={self.inner_lr}, inner_loss={self.inner_loss!r}, '
                f'conv_branch={self.conv_branch}')
