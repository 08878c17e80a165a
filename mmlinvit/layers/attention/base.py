"""The block-level interface every attention operator implements.

An operator maps normalised tokens ``x`` (B, N, C) to the attention output (B, N, C), after
the output projection and before layer-scale / residual.  All operators own a fused ``qkv``
projection (C -> 3C, rows ordered q, k, v) and an output ``proj`` (C -> C) with the same names
and shapes as softmax attention, so any pretrained ViT checkpoint loads into any operator.

Operators receive the patch grid ``hw_shape`` and the number of prefix (class / register)
tokens, which sit at the front of the sequence; spatial operators (MHLA, TTT) need both.

Hook point: the output of ``blocks[i].attn`` is the per-block attention output used by
attention distillation; the positional inputs of ``blocks[i]`` are the block input.
"""
import inspect
from types import MappingProxyType
from typing import Any, Mapping, Optional, Tuple

import torch
import torch.nn as nn

from mmlinvit.ops.linear_attention.dispatch import BACKEND_ENV_VAR, BACKENDS
from mmlinvit.ops.precision import autocast_disabled
from mmlinvit.utils import NameRegistry

ATTENTION_OPERATORS = NameRegistry('attention operator')

#: Seed 000's setting of the spatial operators (MHLA, TTT): no class token, fixed sin-cos
#: position embeddings, average pooling (patch-token outputs).
NO_CLS_SINCOS_AVG_POOL: Mapping[str, Tuple[Any, ...]] = MappingProxyType(
    dict(with_cls_token=(False, ), pos_embed_type=('sincos', ),
         out_type=('avg_featmap', 'featmap', 'raw')))


#: Values of the ``backend`` option of the operators with a kernel path (``elu``, ``relu``,
#: ``hedgehog``, ``inline``); ``None`` defers to the environment variable.
KERNEL_BACKEND_CHOICES: Tuple[Optional[str], ...] = (None, 'auto') + tuple(BACKENDS)


def check_kernel_backend(op_name: str, backend: Optional[str]) -> Optional[str]:
    """Validates an operator's ``backend`` option at build time and returns it.

    Precedence at call time (see :mod:`mmlinvit.ops.linear_attention.dispatch`): a ``backend``
    given here (``'torch'``, ``'triton'`` or ``'auto'``) > the environment variable
    ``MMLINVIT_LINEAR_ATTN_BACKEND`` (only read when ``backend=None``) > auto.

    Args:
        op_name: Operator name used in the error message.
        backend: ``None``, ``'auto'``, ``'torch'`` or ``'triton'``.

    Raises:
        ValueError: If ``backend`` is not one of these.
    """
    if backend not in KERNEL_BACKEND_CHOICES:
        raise ValueError(f'Unknown backend {backend!r} for the {op_name!r} attention operator; '
                         f'valid: {list(KERNEL_BACKEND_CHOICES)} (None defers to '
                         f'{BACKEND_ENV_VAR}, then auto)')
    return backend


class AttentionOperator(nn.Module):
    """Base class: fused QKV projection, head split, output projection.

    Subclasses implement :meth:`mix` (the O(N) token mixing on per-head q, k, v) and, where
    the operator has an explicit map, :meth:`map_from_qk` (the map from per-head q, k) and,
    for a term outside the map, :meth:`local_term_reference`.

    Args:
        embed_dims: Token width C.
        num_heads: Number of heads; C must be divisible by it.
        qkv_bias: Whether the QKV projection has a bias.
        proj_bias: Whether the output projection has a bias.
        attn_drop: Dropout on the attention output before the projection (softmax: on
            the attention probabilities, as timm / mmpretrain).
        proj_drop: Dropout after the output projection.
    """

    #: Whether the operator has an N x N map (softmax, kernel LA, InLine, MHLA).
    has_attention_map: bool = True
    #: Whether the operator mixes tokens through a q.k^T form (Mimetic / Impulse need it).
    has_qk_form: bool = True
    #: The backbone setting the operator's paper runs it in, ``{VisionTransformer argument:
    #: accepted values}``; the first value is used where the argument is not given, other
    #: given values are refused at build time (``check_operator_setting=False`` allows them,
    #: with a warning).  Empty: no requirement.  See :data:`NO_CLS_SINCOS_AVG_POOL`.
    paper_backbone_setting: Mapping[str, Tuple[Any, ...]] = MappingProxyType({})
    #: Attributes that change what the operator computes without changing its parameters'
    #: names or shapes (MHLA's block layout, TTT's inner learning rate): recorded with the
    #: weights by the backbone, so a checkpoint is not silently run with other ones.
    recorded_settings: Tuple[str, ...] = ()

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 qkv_bias: bool = True,
                 proj_bias: bool = True,
                 attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        if embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims ({embed_dims}) must be divisible by num_heads '
                             f'({num_heads})')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.scale = self.head_dims**-0.5
        self.qkv = nn.Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(embed_dims, embed_dims, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    # ------------------------------------------------------------------ helpers
    def split_qkv(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projects (B, N, C) tokens to per-head q, k, v of shape (B, H, N, d)."""
        b, n, _ = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dims).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    def merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        """(B, H, N, d) -> (B, N, C)."""
        b, h, n, d = out.shape
        return out.transpose(1, 2).reshape(b, n, h * d)

    def project(self, out: torch.Tensor) -> torch.Tensor:
        """Head merge, dropout and output projection."""
        return self.proj_drop(self.proj(self.attn_drop(self.merge_heads(out))))

    # ------------------------------------------------------------------ interface
    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            hw_shape: Optional[Tuple[int, int]], num_prefix_tokens: int) -> torch.Tensor:
        """Token mixing on per-head tensors (B, H, N, d) -> (B, H, N, d)."""
        raise NotImplementedError

    def forward(self,
                x: torch.Tensor,
                hw_shape: Optional[Tuple[int, int]] = None,
                num_prefix_tokens: int = 0) -> torch.Tensor:
        """Attention output (post-projection, pre-residual).

        Args:
            x: Normalised tokens, (B, N, C); prefix tokens first.
            hw_shape: (h, w) patch grid, with ``h * w + num_prefix_tokens == N``.
            num_prefix_tokens: Number of class / register tokens at the front.
        """
        q, k, v = self.split_qkv(x)
        return self.project(self.mix(q, k, v, hw_shape, num_prefix_tokens))

    def pre_attention(self,
                      x: torch.Tensor,
                      hw_shape: Optional[Tuple[int, int]] = None,
                      num_prefix_tokens: int = 0) -> torch.Tensor:
        """The block's residual stream before ``norm1`` / attention (default: unchanged).

        :class:`~mmlinvit.layers.TransformerBlock` computes ``x = attn.pre_attention(x)`` first.
        ViT^3's TTT adds its 3x3 depthwise positional convolution here (``x + cpe(x)``); such
        parameters belong to the operator, so they load, transfer and train as its extras.

        Args:
            x: Block input (B, N, C), prefix tokens first (not normalised).
            hw_shape: (h, w) patch grid.
            num_prefix_tokens: Number of class / register tokens at the front.
        """
        return x

    def attention_map(self,
                      x: torch.Tensor,
                      hw_shape: Optional[Tuple[int, int]] = None,
                      num_prefix_tokens: int = 0) -> torch.Tensor:
        """The explicit (B, H, N, N) map (O(N^2); analysis and tests only).

        Takes the arguments of :meth:`forward`; the map comes from :meth:`map_from_qk`, in
        fp32 under automatic mixed precision too (q and k are projected as in :meth:`forward`,
        in the autocast dtype; the map's products and row sums are not: in fp16 the ELU+1 row
        sums overflow from about 1k tokens, and bf16 scores lose the map's q-gradient).
        """
        q, k, _ = self.split_qkv(x)
        if q.device.type == 'meta' or not torch.is_autocast_enabled(q.device.type):
            return self.map_from_qk(q, k, hw_shape, num_prefix_tokens)
        with autocast_disabled(q.device):  # the operator's own parameters are fp32 under AMP
            return self.map_from_qk(q.float(), k.float(), hw_shape, num_prefix_tokens)

    def map_from_qk(self, q: torch.Tensor, k: torch.Tensor, hw_shape: Optional[Tuple[int, int]],
                    num_prefix_tokens: int) -> torch.Tensor:
        """The (B, H, N, N) map of :meth:`attention_map` from per-head q, k (B, H, N, d).

        Operators with an explicit map implement it; the others raise.
        """
        raise NotImplementedError(f'{type(self).__name__} has no explicit attention map')

    def forward_reference(self,
                          x: torch.Tensor,
                          hw_shape: Optional[Tuple[int, int]] = None,
                          num_prefix_tokens: int = 0) -> torch.Tensor:
        """O(N^2) reference of :meth:`forward` through the explicit map (tests only).

        ``project(attention_map @ V + local_term_reference)``.
        """
        _, _, v = self.split_qkv(x)
        out = self.attention_map(x, hw_shape, num_prefix_tokens) @ v.float()
        local = self.local_term_reference(x, v, hw_shape, num_prefix_tokens)
        if local is not None:
            out = out + local
        return self.project(out.to(v.dtype))

    def local_term_reference(self, x: torch.Tensor, v: torch.Tensor,
                             hw_shape: Optional[Tuple[int, int]],
                             num_prefix_tokens: int) -> Optional[torch.Tensor]:
        """The term outside the map that :meth:`forward_reference` adds, or ``None``.

        A local branch on V (InLine, MHLA) in its reference form, (B, H, N, d) fp32.

        Args:
            x: Normalised tokens, (B, N, C).
            v: Per-head values (B, H, N, d).
            hw_shape: (h, w) patch grid.
            num_prefix_tokens: Number of prefix tokens.
        """
        return None

    def settings_record(self) -> str:
        """``'name=value ...'`` of :attr:`recorded_settings` (empty for none)."""
        return ' '.join(f'{name}={getattr(self, name)!r}'.replace(' ', '')
                        for name in self.recorded_settings)

    def init_extra_parameters(self) -> None:
        """Documented default initialisation of parameters softmax attention does not have."""

    def extra_repr(self) -> str:
        return f'embed_dims={self.embed_dims}, num_heads={self.num_heads}'


def build_attention_operator(cfg, embed_dims: int, num_heads: int, **defaults) -> AttentionOperator:
    """Builds an operator from ``'name'`` or ``dict(type='name', ...)``.

    Args:
        cfg: Operator name or config dict.
        embed_dims: Token width.
        num_heads: Number of heads.
        **defaults: Extra keyword defaults (e.g. ``qkv_bias``) the config may override.
    """
    if isinstance(cfg, dict):
        if not isinstance(cfg.get('type', ''), str):
            raise TypeError(f'attn_cfg {dict(cfg)!r}: type must be the registered name of an '
                            f'operator ({", ".join(ATTENTION_OPERATORS.names)}), got '
                            f'{cfg["type"]!r}')
        name = str(cfg.get('type', ''))
        cls = ATTENTION_OPERATORS.get(name.split('.')[-1]) if name else None
        if cls is not None:
            # the options of the operator and of the classes it hands **kwargs on to
            accepted = {p.name for klass in cls.__mro__ if issubclass(klass, AttentionOperator)
                        for p in inspect.signature(klass.__init__).parameters.values()
                        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - {'self'}
            unknown = sorted(set(cfg) - {'type'} - accepted - set(defaults))
            if unknown:
                raise TypeError(
                    f'attn_cfg {dict(cfg)!r}: {unknown} are not options of the {name!r} '
                    f'operator (it takes {sorted(accepted - {"embed_dims", "num_heads"})}). '
                    f'A base\'s operator options stay when only attn_cfg.type is changed: '
                    f'give the whole operator instead, e.g. --cfg-options '
                    f'<...>.attn_cfg={name.split(".")[-1]} (or a dict with its own options)')
    try:
        return ATTENTION_OPERATORS.build(cfg, embed_dims=embed_dims, num_heads=num_heads,
                                         **defaults)
    except TypeError as err:
        if 'multiple values for keyword argument' not in str(err):
            raise
        raise TypeError(f'attn_cfg {cfg!r}: {err}: the operator fixes that option itself '
                        f'(e.g. \'elu\' is the kernel operator with feature_map=\'elu\'); '
                        f'drop it, or name the operator that has the wanted setting') from err
