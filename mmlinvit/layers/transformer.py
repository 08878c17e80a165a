"""Pre-norm transformer block pieces: MLPs, LayerScale, DropPath and the block itself."""
from typing import Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import AttentionOperator, build_attention_operator


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x), the activation of OpenAI CLIP."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


_ACTIVATIONS = {'gelu': nn.GELU, 'quick_gelu': QuickGELU, 'silu': nn.SiLU}


def build_activation(name: str) -> nn.Module:
    """Builds ``gelu``, ``quick_gelu`` or ``silu``."""
    if name not in _ACTIVATIONS:
        raise KeyError(f'Unknown activation {name!r}; available: {sorted(_ACTIVATIONS)}')
    return _ACTIVATIONS[name]()


class Mlp(nn.Module):
    """fc1 -> act -> fc2 (timm key layout ``mlp.fc1`` / ``mlp.fc2``).

    Args:
        in_dims: Input and output width.
        hidden_dims: Hidden width.
        act: Activation name.
        drop: Dropout after the activation and after fc2.
    """

    def __init__(self, in_dims: int, hidden_dims: int, act: str = 'gelu', drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dims, hidden_dims)
        self.act = build_activation(act)
        self.fc2 = nn.Linear(hidden_dims, in_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class SwiGLUMlp(nn.Module):
    """Packed SwiGLU: ``fc1`` gives [x1, x2]; out = fc2(silu(x1) * x2) (DINOv2 ``w12``/``w3``).

    Args:
        in_dims: Input and output width.
        hidden_dims: Hidden width (each of the two halves of ``fc1``).
        drop: Dropout after fc2.
    """

    def __init__(self, in_dims: int, hidden_dims: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dims, 2 * hidden_dims)
        self.fc2 = nn.Linear(hidden_dims, in_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = self.fc1(x).chunk(2, dim=-1)
        return self.drop(self.fc2(F.silu(x1) * x2))


class LayerScale(nn.Module):
    """Per-channel scale ``gamma`` (DINOv2 / DeiT-III ``ls1.gamma``).

    Args:
        dims: Width.
        init_value: Initial value of every entry.
    """

    def __init__(self, dims: int, init_value: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init_value * torch.ones(dims))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class DropPath(nn.Module):
    """Stochastic depth per sample.

    Args:
        drop_prob: Probability of dropping the residual branch.
    """

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0], ) + (1, ) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep if keep > 0.0 else x * mask  # p = 1: all dropped (timm)

    def extra_repr(self) -> str:
        return f'drop_prob={self.drop_prob}'


class TransformerBlock(nn.Module):
    """Pre-norm ViT block: x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x))).

    The operator may first transform the residual stream, ``x = attn.pre_attention(x)``
    (identity except for ViT^3's TTT, which adds its depthwise positional conv ``x + cpe(x)``).

    Hook points: a forward hook on ``self.attn`` sees the attention output (post-projection,
    pre-layer-scale); a forward pre-hook on the block sees the block input.

    Args:
        embed_dims: Token width.
        num_heads: Number of heads.
        mlp_hidden_dims: Hidden width of the MLP.
        attn_cfg: Attention operator name or config (see ``ATTENTION_OPERATORS``).
        qkv_bias: Whether the QKV projection has a bias.
        mlp_type: ``'mlp'`` or ``'swiglu'``.
        act: MLP activation for ``'mlp'``.
        layer_scale_init: LayerScale init value; ``None`` disables LayerScale.
        norm_eps: LayerNorm epsilon.
        drop_rate: Dropout rate in attention projection and MLP.
        drop_path_rate: Stochastic depth rate.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 mlp_hidden_dims: int,
                 attn_cfg: Union[str, dict] = 'softmax',
                 qkv_bias: bool = True,
                 mlp_type: str = 'mlp',
                 act: str = 'gelu',
                 layer_scale_init: Optional[float] = None,
                 norm_eps: float = 1e-6,
                 drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.attn: AttentionOperator = build_attention_operator(
            attn_cfg, embed_dims, num_heads, qkv_bias=qkv_bias, proj_drop=drop_rate)
        self.ls1 = LayerScale(embed_dims, layer_scale_init) if layer_scale_init else nn.Identity()
        self.drop_path1 = DropPath(drop_path_rate)
        self.norm2 = nn.LayerNorm(embed_dims, eps=norm_eps)
        if mlp_type == 'mlp':
            self.mlp = Mlp(embed_dims, mlp_hidden_dims, act=act, drop=drop_rate)
        elif mlp_type == 'swiglu':
            self.mlp = SwiGLUMlp(embed_dims, mlp_hidden_dims, drop=drop_rate)
        else:
            raise KeyError(f"Unknown mlp_type {mlp_type!r}; use 'mlp' or 'swiglu'")
        self.ls2 = LayerScale(embed_dims, layer_scale_init) if layer_scale_init else nn.Identity()
        self.drop_path2 = DropPath(drop_path_rate)

    def forward_attn(self, x: torch.Tensor, hw_shape: Optional[Tuple[int, int]],
                     num_prefix_tokens: int, with_layer_scale: bool = False) -> torch.Tensor:
        """The attention output of this block for block input ``x`` (teacher forcing uses it).

        Args:
            x: (B, N, C) block input.
            hw_shape: Patch grid of the tokens.
            num_prefix_tokens: Class / register tokens before the patches.
            with_layer_scale: Also apply ``ls1`` (the branch as the residual adds it), so that
                a recorder on ``ls1`` sees it; the default stops at the attention module.
        """
        x = self.attn.pre_attention(x, hw_shape, num_prefix_tokens)
        out = self.attn(self.norm1(x), hw_shape, num_prefix_tokens)
        return self.ls1(out) if with_layer_scale else out

    def forward(self,
                x: torch.Tensor,
                hw_shape: Optional[Tuple[int, int]] = None,
                num_prefix_tokens: int = 0) -> torch.Tensor:
        x = self.attn.pre_attention(x, hw_shape, num_prefix_tokens)  # ViT^3 TTT: x + cpe(x)
        attn_out = self.attn(self.norm1(x), hw_shape, num_prefix_tokens)
        x = x + self.drop_path1(self.ls1(attn_out))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x
