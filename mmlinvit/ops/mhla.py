"""MHLA token mixing: linear attention with block-mixed KV summaries (torch only).

Tokens carry a block id (``-1`` for prefix tokens, else ``0 .. nb - 1``).  With per-block
summaries ``KV_b = sum_{j in b} phi(k_j)^T [v_j, 1] / N`` and a mixing matrix m (nb x nb, shared
or per head), a patch query i in block a(i) reads ``sum_b m_{a(i), b} KV_b`` plus the prefix
group's summary (weight 1); a prefix query reads the sum of all summaries.  The output is the
numerator over the sign-safe normaliser, i.e. the map

    A_ij = w_ij phi(q_i).phi(k_j) / sum_l w_il phi(q_i).phi(k_l),   w_ij = m_{a(i), b(j)}

(w = 1 where a prefix token is involved), whose rows sum to 1.  The layer
:class:`mmlinvit.layers.attention.MultiHeadLinearAttention` owns m, the feature map and the
local branch.
"""
import math
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from .precision import autocast_disabled
from .signed_normaliser import signed_safe_denominator


def block_centre_mixing(block_grid: Tuple[int, int], tau: float = 1.0) -> torch.Tensor:
    """Row-stochastic init of the block-mixing matrix: ``softmax_b(-|c_a - c_b| / tau)``.

    Args:
        block_grid: (gh, gw) blocks per side.
        tau: Distance temperature in block units (smaller: more local).

    Returns:
        (gh * gw, gh * gw) float32 matrix with rows summing to 1.
    """
    dist = _block_centre_distances(block_grid)
    return (-dist / tau).softmax(dim=-1)


def block_centre_mixing_cos(block_grid: Tuple[int, int]) -> torch.Tensor:
    """The public MHLA code's init: ``cos(d_ab / max(d) * pi / 4)``, columns summing to 1.

    Args:
        block_grid: (gh, gw) blocks per side.

    Returns:
        (gh * gw, gh * gw) float32 matrix (all ones on a 1 x 1 grid).
    """
    return _public_transform(block_grid, lambda rel: torch.cos(rel * math.pi / 4))


def block_centre_mixing_linear(block_grid: Tuple[int, int]) -> torch.Tensor:
    """The public MHLA code's ``transform='linear'`` init: ``1 - d_ab / max(d)``, columns sum to 1.

    Args:
        block_grid: (gh, gw) blocks per side.

    Returns:
        (gh * gw, gh * gw) float32 matrix (all ones on a 1 x 1 grid).
    """
    return _public_transform(block_grid, lambda rel: 1.0 - rel)


def _public_transform(block_grid: Tuple[int, int],
                      transform: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``transform(d_ab / max(d))`` with each column divided by its sum (public
    ``BlockDistanceConv``); all ones on a 1 x 1 grid, where the public code divides by 0."""
    dist = _block_centre_distances(block_grid)
    max_dist = float(dist.max())
    mat = transform(dist / max_dist) if max_dist > 0 else torch.ones_like(dist)
    return mat / mat.sum(dim=0, keepdim=True)


def _block_centre_distances(block_grid: Tuple[int, int]) -> torch.Tensor:
    """Distances |c_a - c_b| between block centres (row + 0.5, col + 0.5), in block units."""
    gh, gw = block_grid
    rows, cols = torch.meshgrid(torch.arange(gh, dtype=torch.float32) + 0.5,
                                torch.arange(gw, dtype=torch.float32) + 0.5, indexing='ij')
    centres = torch.stack([rows.flatten(), cols.flatten()], dim=-1)
    return torch.cdist(centres, centres)


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


def token_block_index(hw_shape: Tuple[int, int], block_grid: Tuple[int, int],
                      num_prefix_tokens: int,
                      device: Optional[torch.device] = None) -> torch.Tensor:
    """Block id of every token (prefix tokens first, then patches in raster order), -1 for prefix.

    Args:
        hw_shape: (h, w) patch grid.
        block_grid: (gh, gw) blocks per side.
        num_prefix_tokens: Number of prefix tokens at the front.
        device: Device of the result.

    Returns:
        (num_prefix_tokens + h * w,) integer tensor.
    """
    block = patch_block_index(hw_shape, block_grid, device)
    prefix = torch.full((num_prefix_tokens, ), -1, dtype=block.dtype, device=device)
    return torch.cat([prefix, block])


def _block_spans(n: int, g: int) -> List[Tuple[int, int]]:
    """[start, stop) of each of ``g`` blocks over ``n`` positions, as :func:`patch_block_index`
    assigns them (position y to block ``min((y * g + g - 1) // n, g - 1)``)."""
    start, stop = [n] * g, [0] * g
    for y in range(n):  # owners are non-decreasing in y: each block is one run
        block = min((y * g + g - 1) // n, g - 1)
        start[block], stop[block] = min(start[block], y), y + 1
    return [(a, b) if b > a else (0, 0) for a, b in zip(start, stop)]


def block_token_indices(hw_shape: Tuple[int, int], block_grid: Tuple[int, int],
                        num_prefix_tokens: int,
                        device: Optional[torch.device] = None) -> List[torch.Tensor]:
    """Token indices of every block (row-major over ``block_grid``), prefix tokens first.

    Built from the grid sizes alone (no data-dependent ops), so ``torch.compile`` and
    ``torch.export`` take :func:`mhla_attention` as one graph.  Equals
    ``[torch.nonzero(token_block_index(...) == b).flatten() for b in range(gh * gw)]``.

    Args:
        hw_shape: (h, w) patch grid.
        block_grid: (gh, gw) blocks per side.
        num_prefix_tokens: Number of prefix tokens at the front.
        device: Device of the results.

    Returns:
        ``gh * gw`` integer tensors (empty for a block without patches).
    """
    (h, w), (gh, gw) = hw_shape, block_grid
    rows, cols = _block_spans(h, gh), _block_spans(w, gw)
    return [(torch.arange(r0, r1, device=device)[:, None] * w
             + torch.arange(c0, c1, device=device)[None, :]).flatten() + num_prefix_tokens
            for r0, r1 in rows for c0, c1 in cols]


def mhla_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                   block_tokens: Sequence[torch.Tensor], num_prefix_tokens: int,
                   mixing: torch.Tensor, eps: float) -> torch.Tensor:
    """O(N) block-mixed linear attention (the attention term, no local branch), fp32.

    Args:
        phi_q: Query features (B, H, N, d), fp32.
        phi_k: Key features (B, H, N, d), fp32.
        v: Values (B, H, N, e).
        block_tokens: Token indices of every block (:func:`block_token_indices`).
        num_prefix_tokens: Number of prefix tokens (which come first, in no block).
        mixing: (H or 1, nb, nb) mixing matrix m.
        eps: Normaliser epsilon (on the 1/N-scaled normaliser).

    Returns:
        (B, H, N, e) float32.
    """
    # fp32 math under AMP too: fp16 block sums of phi(k) [v, 1] overflow at high resolution
    with autocast_disabled(phi_k.device):
        phi_q, phi_k = phi_q.float(), phi_k.float()
        n = phi_k.shape[-2]
        p = num_prefix_tokens
        if len(block_tokens) != mixing.shape[-1]:
            raise ValueError(f'{len(block_tokens)} blocks of tokens for a '
                             f'{mixing.shape[-1]}-block mixing matrix')
        v32 = v.float()
        ones = torch.ones(v32.shape[:-1] + (1, ), dtype=v32.dtype, device=v32.device)
        v_aug = torch.cat([v32, ones], dim=-1)  # (B, H, N, e + 1): numerator and normaliser

        # Per-block summaries (B, H, nb, d, e + 1) and the prefix group's summary.
        kv_blocks = torch.stack([
            torch.matmul(phi_k[:, :, idx].transpose(-2, -1), v_aug[:, :, idx])
            for idx in block_tokens
        ], dim=2).div_(n)
        kv_prefix = torch.matmul(phi_k[:, :, :p].transpose(-2, -1), v_aug[:, :, :p]).div_(n)
        z, h, nb, d, e1 = kv_blocks.shape
        mixed = torch.matmul(mixing.float(), kv_blocks.reshape(z, h, nb, d * e1))
        mixed = mixed.reshape(z, h, nb, d, e1) + kv_prefix.unsqueeze(2)

        outs = [torch.matmul(phi_q[:, :, :p], kv_blocks.sum(dim=2) + kv_prefix)]
        outs += [torch.matmul(phi_q[:, :, idx], mixed[:, :, a])
                 for a, idx in enumerate(block_tokens)]
        order = torch.cat([torch.arange(p, device=phi_k.device)] + block_tokens)
        out = torch.cat(outs, dim=2)[:, :, torch.argsort(order)]
        num, den = out[..., :-1], out[..., -1:]
        return num / signed_safe_denominator(den, eps)


def mhla_token_mixing_weights(block_of: torch.Tensor, mixing: torch.Tensor) -> torch.Tensor:
    """The (H or 1, N, N) weights ``m_{a(i), b(j)}`` (1 where a prefix token is involved).

    Args:
        block_of: (N,) block id of every token, -1 for prefix tokens.
        mixing: (H or 1, nb, nb) mixing matrix.
    """
    idx = block_of.clamp(min=0)
    weights = mixing[:, idx][:, :, idx]
    is_prefix = block_of < 0
    prefix_pair = is_prefix[:, None] | is_prefix[None, :]
    return torch.where(prefix_pair, torch.ones_like(weights), weights)


def mhla_attention_map(phi_q: torch.Tensor, phi_k: torch.Tensor, block_of: torch.Tensor,
                       mixing: torch.Tensor, eps: float) -> torch.Tensor:
    """The implied (B, H, N, N) map of :func:`mhla_attention`, fp32 (O(N^2); tests).

    Args:
        phi_q: Query features (B, H, N, d).
        phi_k: Key features (B, H, N, d).
        block_of: (N,) block id of every token, -1 for prefix tokens.
        mixing: (H or 1, nb, nb) mixing matrix.
        eps: Normaliser epsilon.
    """
    n = phi_k.shape[-2]
    with autocast_disabled(phi_q.device):  # fp32 under AMP too
        weights = mhla_token_mixing_weights(block_of, mixing.float())
        scores = weights * (phi_q.float() @ phi_k.float().transpose(-2, -1))
        den = scores.sum(dim=-1, keepdim=True) / n
        return scores / (n * signed_safe_denominator(den, eps))
