"""Kernel linear attention with feature maps: ``elu``, ``relu``, ``hedgehog``, ``identity``.

For a feature map phi, every token attends to every token (prefix tokens included):

    A_ij = phi(q_i).phi(k_j) / (sum_l phi(q_i).phi(k_l) + N * eps)
    out_i = sum_j A_ij v_j = phi(q_i) S / (phi(q_i) z + eps),  S = phi(K)^T V / N, z = mean phi(K)

computed in O(N) memory by :func:`mmlinvit.ops.linear_attention.linear_attention` (fp32
accumulation whatever the input dtype).  For the positive maps (ELU + 1, ReLU, Hedgehog) the
normaliser is >= 0 and the ``eps`` (> 0 for every map) keeps it > 0, so there is never a
division by zero: a query whose ReLU features are all zero (or whose ELU + 1 / Hedgehog features
underflow to 0 in fp32) gets an all-zero output row.

The ``identity`` map is signed, so ``phi(q_i) z`` can be ~0 or negative.  Its operator uses the
sign-preserving normaliser :func:`mmlinvit.ops.signed_normaliser.signed_safe_denominator`
(``|den| >= eps`` always; maths in :mod:`mmlinvit.ops.identity_attention`), which is
finite but can still make rows huge where ``q_i . mean(k)`` ~ 0; InLine's subtractive
normalisation (:mod:`.inline`) is the stable way to use the identity map.

Kernel backend: ``elu``, ``relu`` and ``hedgehog`` take ``backend`` (``'torch'``, ``'triton'``,
``'auto'`` or ``None``, e.g. ``attn_cfg=dict(type='elu', backend='torch')``).  Precedence: the
``backend`` given in the config > the environment variable ``MMLINVIT_LINEAR_ATTN_BACKEND``
(read only when ``backend=None``, the default) > auto (Triton for supported CUDA inputs, else
torch).  An unknown value raises ``ValueError`` at build time.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn

from mmlinvit.ops.feature_maps import hedgehog_feature
from mmlinvit.ops.identity_attention import (identity_linear_attention,
                                             identity_linear_attention_map)
from mmlinvit.ops.linear_attention import linear_attention, linear_attention_map_naive
from .base import ATTENTION_OPERATORS, AttentionOperator, check_kernel_backend

__all__ = [
    'KernelLinearAttention', 'ELULinearAttention', 'ReLULinearAttention',
    'HedgehogLinearAttention', 'IdentityLinearAttention'
]



def check_eps(eps: float, name: str) -> float:
    """Refuses a normaliser epsilon that lets the division fail.

    No map of this module is safe at 0: ReLU rows can be all zero, the signed identity
    normaliser can be 0, and ELU+1 / Hedgehog features, > 0 in exact arithmetic, underflow to
    0 in fp32 (``ELU(x) + 1 == 0`` for x <= -18; Hedgehog's softmax halves of a query and a key
    can meet only in entries below 1e-45), so an all-zero row would be 0 / 0 = NaN.

    Args:
        eps: The epsilon given.
        name: The operator, for the message.

    Returns:
        ``eps``.

    Raises:
        ValueError: ``eps`` not > 0 (0, negative or NaN: a negative one flips or zeroes
            normalisers).
    """
    if not eps > 0:
        raise ValueError(f'{name}: eps must be > 0 (0 divides an all-zero row by 0: NaN), '
                         f'got {eps!r}; the default is 1e-6')
    return eps


class KernelLinearAttention(AttentionOperator):
    """Non-causal kernel linear attention with a fixed positive feature map.

    Keeps the softmax ``qkv`` / ``proj`` parameters (checkpoints load unchanged) and has no
    other parameters.

    Args:
        embed_dims: Token width C.
        num_heads: Number of heads.
        feature_map: ``'elu'`` (ELU + 1) or ``'relu'``.
        eps: Normaliser epsilon (on the 1/N-scaled normaliser, see the module docstring).
        backend: Kernel backend, ``None`` (environment variable, then auto), ``'auto'``,
            ``'torch'`` or ``'triton'``; see the module docstring for the precedence.
        **kwargs: ``qkv_bias``, ``proj_bias``, ``attn_drop``, ``proj_drop`` of
            :class:`AttentionOperator`.
    """

    recorded_settings = ('eps', )

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 feature_map: str = 'elu',
                 eps: float = 1e-6,
                 backend: Optional[str] = None,
                 **kwargs) -> None:
        super().__init__(embed_dims, num_heads, **kwargs)
        self.backend = check_kernel_backend(feature_map, backend)
        if feature_map not in ('elu', 'relu'):
            raise ValueError(f"KernelLinearAttention needs a positive feature map, 'elu' or "
                             f"'relu', got {feature_map!r}; use the 'identity' or 'hedgehog' "
                             f"operators for the other maps")
        self.feature_map = feature_map
        self.eps = check_eps(eps, f'{feature_map} linear attention')

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            hw_shape: Optional[Tuple[int, int]], num_prefix_tokens: int) -> torch.Tensor:
        return linear_attention(q, k, v, feature_map=self.feature_map, eps=self.eps,
                                backend=self.backend)

    def map_from_qk(self, q: torch.Tensor, k: torch.Tensor, hw_shape: Optional[Tuple[int, int]],
                    num_prefix_tokens: int) -> torch.Tensor:
        return linear_attention_map_naive(q, k, self.feature_map, self.eps)

    def extra_repr(self) -> str:
        return (f'{super().extra_repr()}, feature_map={self.feature_map}, eps={self.eps}, '
                f'backend={self.backend}')


class FixedMapLinearAttention(KernelLinearAttention):
    """:class:`KernelLinearAttention` whose feature map is set by the subclass (``FEATURE_MAP``).

    Args:
        embed_dims: Token width C.
        num_heads: Number of heads.
        eps: Normaliser epsilon.
        backend: Kernel backend (see :class:`KernelLinearAttention`).
        **kwargs: Base :class:`AttentionOperator` options.
    """

    #: The positive feature map of the operator, ``'elu'`` or ``'relu'``.
    FEATURE_MAP: str = ''

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 eps: float = 1e-6,
                 backend: Optional[str] = None,
                 **kwargs) -> None:
        super().__init__(embed_dims, num_heads, feature_map=self.FEATURE_MAP, eps=eps,
                         backend=backend, **kwargs)


@ATTENTION_OPERATORS.register_module('elu')
class ELULinearAttention(FixedMapLinearAttention):
    """Kernel linear attention with phi(x) = ELU(x) + 1 (ViT-AdaLA's default student).

    Arguments as :class:`FixedMapLinearAttention`.
    """

    FEATURE_MAP = 'elu'


@ATTENTION_OPERATORS.register_module('relu')
class ReLULinearAttention(FixedMapLinearAttention):
    """Kernel linear attention with phi(x) = ReLU(x); ``eps`` keeps all-zero rows finite.

    Arguments as :class:`FixedMapLinearAttention`.
    """

    FEATURE_MAP = 'relu'


@ATTENTION_OPERATORS.register_module('hedgehog')
class HedgehogLinearAttention(AttentionOperator):
    """Linear attention with Hedgehog's learnable feature map (Zhang et al., 2024), in the
    form of LoLCATS' ``FeatureMapMLP`` (the paper writes exp of a biased linear layer).

    Per head, phi(x) = [softmax(x W), softmax(-x W)] with the softmax over the ``feature_dims``
    features, W: head_dims -> feature_dims, so phi(x) has 2 * feature_dims positive entries
    that sum to 2 (the normaliser is always > 0).  As in Hedgehog / LoLCATS, queries and keys
    have separate maps (``feature_q``, ``feature_k``, each (H, head_dims, feature_dims)) unless
    ``share_feature_map=True`` (then only ``feature_q`` exists).

    Init (:meth:`init_extra_parameters`), ``feature_init``:

    * ``'identity'`` (default): ``W[h] = eye(head_dims, feature_dims)`` (rectangular identity,
      no bias), so at init phi(x) = [softmax(x'), softmax(-x')] where x' is x zero-padded /
      truncated to ``feature_dims`` entries; attention distillation then trains W from a
      deterministic, rank-preserving start.  This is LoLCATS' ``zero_init=True`` option.
    * ``'kaiming_uniform'``: ``nn.init.kaiming_uniform_`` on each (H, head_dims, feature_dims)
      weight (|W| <= sqrt(6 / (head_dims * feature_dims))), what LoLCATS' released configs
      use (``zero_init: false``).

    Args:
        embed_dims: Token width C.
        num_heads: Number of heads.
        feature_dims: Features per softmax half (phi has twice as many).
        share_feature_map: Use one map for queries and keys.
        eps: Normaliser epsilon.
        backend: Kernel backend (see :class:`KernelLinearAttention`).
        feature_init: ``'identity'`` (default) or ``'kaiming_uniform'`` (LoLCATS' released
            configs); see above.
        **kwargs: Base :class:`AttentionOperator` options.
    """

    #: Feature-map weight inits (see the class docstring).
    FEATURE_INITS = ('identity', 'kaiming_uniform')
    recorded_settings = ('eps', )

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 feature_dims: int = 64,
                 share_feature_map: bool = False,
                 eps: float = 1e-6,
                 backend: Optional[str] = None,
                 feature_init: str = 'identity',
                 **kwargs) -> None:
        super().__init__(embed_dims, num_heads, **kwargs)
        self.backend = check_kernel_backend('hedgehog', backend)
        if feature_dims < 1:
            raise ValueError(f'feature_dims must be >= 1, got {feature_dims}')
        if feature_init not in self.FEATURE_INITS:
            raise ValueError(f'Unknown Hedgehog feature_init {feature_init!r}; available: '
                             f'{self.FEATURE_INITS}')
        self.feature_init = feature_init
        self.feature_dims = feature_dims
        self.share_feature_map = share_feature_map
        self.eps = check_eps(eps, 'hedgehog linear attention')
        self.feature_q = nn.Parameter(torch.empty(num_heads, self.head_dims, feature_dims))
        self.feature_k = (None if share_feature_map else nn.Parameter(
            torch.empty(num_heads, self.head_dims, feature_dims)))
        self.init_extra_parameters()

    def init_extra_parameters(self) -> None:
        """Init of the feature-map projections, ``feature_init`` (see the class docstring)."""
        eye = torch.eye(self.head_dims, self.feature_dims)
        with torch.no_grad():
            for p in (self.feature_q, self.feature_k):
                if p is None:
                    continue
                if self.feature_init == 'kaiming_uniform':
                    nn.init.kaiming_uniform_(p)
                else:
                    p.copy_(eye.expand_as(p))

    def feature_maps(self, q: torch.Tensor,
                     k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """phi(q), phi(k) of per-head queries and keys, fp32 (B, H, N, 2 * feature_dims)."""
        weight_k = self.feature_q if self.feature_k is None else self.feature_k
        return hedgehog_feature(q, self.feature_q), hedgehog_feature(k, weight_k)

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            hw_shape: Optional[Tuple[int, int]], num_prefix_tokens: int) -> torch.Tensor:
        phi_q, phi_k = self.feature_maps(q, k)
        return linear_attention(phi_q, phi_k, v, feature_map='identity', eps=self.eps,
                                backend=self.backend)

    def map_from_qk(self, q: torch.Tensor, k: torch.Tensor, hw_shape: Optional[Tuple[int, int]],
                    num_prefix_tokens: int) -> torch.Tensor:
        phi_q, phi_k = self.feature_maps(q, k)
        return linear_attention_map_naive(phi_q, phi_k, 'identity', self.eps)

    def extra_repr(self) -> str:
        return (f'{super().extra_repr()}, feature_dims={self.feature_dims}, '
                f'share_feature_map={self.share_feature_map}, backend={self.backend}')


@ATTENTION_OPERATORS.register_module('identity')
class IdentityLinearAttention(AttentionOperator):
    """Linear attention with the identity feature map and a sign-safe normaliser.

    out_i = q_i S / safe(q_i . kbar), S = K^T V / N, kbar = mean(K), where ``safe`` is
    :func:`~mmlinvit.ops.signed_normaliser.signed_safe_denominator` (never divides by zero;
    maths in :mod:`mmlinvit.ops.identity_attention`).  The map is signed and its rows
    sum to ``den / safe(den)`` ~ 1, but they are unbounded when ``q_i . kbar`` ~ 0: use it only
    where an operator needs the raw identity map (analysis, ablations); InLine is the
    well-conditioned identity-map operator.

    Args:
        embed_dims: Token width C.
        num_heads: Number of heads.
        eps: Minimum magnitude of the normaliser.
        **kwargs: Base :class:`AttentionOperator` options.
    """

    recorded_settings = ('eps', )

    def __init__(self, embed_dims: int, num_heads: int, eps: float = 1e-6, **kwargs) -> None:
        super().__init__(embed_dims, num_heads, **kwargs)
        self.eps = check_eps(eps, 'identity linear attention')

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            hw_shape: Optional[Tuple[int, int]], num_prefix_tokens: int) -> torch.Tensor:
        return identity_linear_attention(q, k, v, self.eps)

    def map_from_qk(self, q: torch.Tensor, k: torch.Tensor, hw_shape: Optional[Tuple[int, int]],
                    num_prefix_tokens: int) -> torch.Tensor:
        return identity_linear_attention_map(q, k, self.eps)

    def extra_repr(self) -> str:
        return f'{super().extra_repr()}, eps={self.eps}'
