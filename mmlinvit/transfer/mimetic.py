"""Mimetic initialisation of self-attention (Trockman & Kolter, 2023).

Pretrained attention layers have ``W_q W_k^T`` close to a positive multiple of the identity
plus noise and ``W_v W_proj`` close to a negative one.  Mimetic init writes such products
directly.  With the row-vector convention ``q = x W_q`` (``W_q^h = qkv.weight[q rows of
head h].T``, C x d), per layer:

* per head ``h``: ``W_q^h W_k^h^T ~= alpha Z_h + beta I`` (C x C), ``Z_h`` i.i.d. N(0, 1/C);
* all heads together: ``W_v W_proj ~= v_alpha Z_v - v_beta I`` (C x C), i.e. the value and
  output projections compose to that map (the concatenation over heads is the full product).

Each target ``M = U S V^T`` (SVD) is split as ``L = U sqrt(S)``, ``R = V sqrt(S)`` restricted
to the first ``d`` singular directions for q/k (``W_q^h = L[:, :d]``, ``W_k^h = R[:, :d]``:
the best rank-``d`` approximation, since a head has only ``d`` dims) and to all ``C`` for v/proj
(``W_v = L``, ``W_proj = R^T``: exact).  Targets are drawn in float64 on the CPU (reproducible
across devices) and split in float32 on the weights' device.  Biases keep the student's (zero)
initialisation.  Layer ``i`` draws its ``Z`` matrices from :func:`layer_generator`
``(seed, i)``, seeded from ``numpy.random.SeedSequence(seed, spawn_key=(i,))``, in the order
``Z_1 .. Z_H, Z_v`` (see :func:`mimetic_targets`): every (seed, layer) pair has its own stream
(the former ``manual_seed(seed + i)`` gave run seed ``s + 1`` the layers of seed ``s`` shifted
by one).

Nothing is copied from the teacher except what the ``base`` strategy copies (``'random'``:
nothing, ``'mlp_copy'``: MLPs and their norms); the teacher is still needed for the pairing
report and the architecture check.
"""
import math
from typing import Any, Dict, Optional, Set, Tuple, Union

import numpy as np
import torch

from mmlinvit.backbones import VisionTransformer
from .base import TRANSFER_STRATEGIES, AttentionInitStrategy, TransferReport


def mimetic_targets(embed_dims: int, num_heads: int, alpha: float, beta: float,
                    v_alpha: float, v_beta: float,
                    generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    """Target products of one layer, in float64.

    Args:
        embed_dims: Width C.
        num_heads: Number of heads H.
        alpha: Noise weight of the q.k^T targets.
        beta: Identity weight of the q.k^T targets.
        v_alpha: Noise weight of the value / projection target.
        v_beta: Identity weight of the value / projection target (subtracted).
        generator: Source of the Gaussian matrices (drawn Z_1 .. Z_H, then Z_v).

    Returns:
        ``(qk_targets (H, C, C), vo_target (C, C))``.
    """
    eye = torch.eye(embed_dims, dtype=torch.float64)
    scale = 1.0 / math.sqrt(embed_dims)
    qk = torch.stack([
        alpha * scale * torch.randn(embed_dims, embed_dims, generator=generator,
                                    dtype=torch.float64) + beta * eye for _ in range(num_heads)
    ])
    z_v = scale * torch.randn(embed_dims, embed_dims, generator=generator, dtype=torch.float64)
    return qk, v_alpha * z_v - v_beta * eye


def layer_generator(seed: int, layer: int) -> torch.Generator:
    """The CPU generator layer ``layer`` draws its targets from, for the strategy seed ``seed``.

    Seeded (64 bits) from ``numpy.random.SeedSequence(seed, spawn_key=(layer,))``, i.e. the
    ``layer``-th child of the seed's sequence: no two (seed, layer) pairs share a stream.

    Args:
        seed: The strategy's seed (taken modulo 2**64).
        layer: Block index.
    """
    sequence = np.random.SeedSequence(int(seed) % 2**64, spawn_key=(int(layer),))
    return torch.Generator().manual_seed(int(sequence.generate_state(1, np.uint64)[0]))


def split_low_rank(target: torch.Tensor, rank: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(L, R)``, each (C, rank), with ``L @ R.T`` the best rank-``rank`` approximation.

    Args:
        target: (C, C) matrix.
        rank: Number of singular directions kept (``<= C``).
    """
    u, s, vh = torch.linalg.svd(target)
    root = s[:rank].sqrt()
    return u[:, :rank] * root, vh[:rank].transpose(0, 1) * root


@TRANSFER_STRATEGIES.register_module('Mimetic')
@TRANSFER_STRATEGIES.register_module('mimetic')
class MimeticInit(AttentionInitStrategy):
    """Mimetic init of every block's QKV and output projection weights.

    Args:
        alpha: Noise weight of ``W_q W_k^T`` (paper: 0.7).
        beta: Identity weight of ``W_q W_k^T`` (paper: 0.7).
        v_alpha: Noise weight of ``W_v W_proj`` (paper: 0.4).
        v_beta: Identity weight subtracted in ``W_v W_proj`` (paper: 0.4).
        seed: Layer ``i`` draws from :func:`layer_generator` ``(seed, i)``; ``None``
            (default) takes the run's seed (:meth:`run_seed`).
        base: Copy strategy applied first (``'random'`` or ``'mlp_copy'``).
    """

    name = 'mimetic'

    def __init__(self,
                 alpha: float = 0.7,
                 beta: float = 0.7,
                 v_alpha: float = 0.4,
                 v_beta: float = 0.4,
                 seed: Optional[int] = None,
                 base: Union[str, dict] = 'random') -> None:
        super().__init__(base)
        self.alpha = alpha
        self.beta = beta
        self.v_alpha = v_alpha
        self.v_beta = v_beta
        self.seed = seed

    def initialize(self, student: VisionTransformer, report: TransferReport) -> Set[str]:
        c, heads = student.embed_dims, student.num_heads
        seed = self.run_seed(self.seed)
        report.details.update(seed=seed)
        written = set()
        for i, block in enumerate(student.blocks):
            attn = block.attn
            d = attn.head_dims
            gen = layer_generator(seed, i)
            qk, vo = mimetic_targets(c, heads, self.alpha, self.beta, self.v_alpha, self.v_beta,
                                     gen)
            # The SVDs run in float32 on the weights' device (a GPU makes ViT-L instant).
            device = attn.qkv.weight.device
            qk = qk.to(device, torch.float32)
            vo = vo.to(device, torch.float32)
            weight = torch.empty_like(attn.qkv.weight, dtype=torch.float32)
            for h in range(heads):
                left, right = split_low_rank(qk[h], d)
                weight[h * d:(h + 1) * d] = left.T
                weight[c + h * d:c + (h + 1) * d] = right.T
            left, right = split_low_rank(vo, c)
            weight[2 * c:] = left.T
            attn.qkv.weight.copy_(weight)
            attn.proj.weight.copy_(right)  # float32 -> the weights' dtype
            written.update({f'blocks.{i}.attn.qkv.weight', f'blocks.{i}.attn.proj.weight'})
        return written

    def options(self) -> Dict[str, Any]:
        return dict(alpha=self.alpha, beta=self.beta, v_alpha=self.v_alpha, v_beta=self.v_beta,
                    seed=self.seed, **super().options())
