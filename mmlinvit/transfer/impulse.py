"""Impulse initialisation of attention (structured init, arXiv 2404.01139).

Each head's softmax map over the position embeddings alone is fitted to a random *impulse*
(shifted-delta) pattern: query patch (r, c) attends to (r + dy, c + dx), with the shift drawn
from a ``window x window`` neighbourhood, so every head starts out as one tap of a
convolution kernel.  The fitted quantity is

    softmax(LN(P) W_q^h W_k^h^T LN(P)^T / sqrt(d))

with ``P`` the student's patch position embeddings on its training grid (sin-cos or learned)
and ``LN`` a parameter-free LayerNorm (the blocks' ``norm1`` at initialisation).  As in the
paper the student must have no prefix tokens (no class / register token; pool with
``out_type='avg_featmap'``) and a position embedding (``'sincos'`` as in the paper, or
``'learned'``); other students are rejected with a clear error.  The value and output
projections keep the student's initialisation, as in the paper.

Implementation choices (documented deviations from the paper's 10k Adam steps at lr 1e-4 with
an MSE loss, needed to fit in a few hundred steps):

* The loss is the cross-entropy between each map row and its one-hot target, over the queries
  whose target lies inside the grid (border queries of a shift have no target and are left
  free; MSE toward their all-zero rows stalls at large grids).  ``fit_loss='mse'`` fits the
  paper's way instead: the mean squared error between the whole map and the impulse matrix
  (one-hot rows, all-zero rows for border queries); with ``steps=10000, lr=1e-4`` that is the
  paper's fit.
* One (W_q, W_k) pair is fitted per shift of the window (a *bank*, all shifts jointly), not
  per head: heads that draw the same shift get ``W_q R, W_k R`` with a random orthogonal
  ``R`` (d x d), which leaves the map unchanged while keeping the weights of heads distinct.
  The bank depends only on LN(P), the head width and the fit options, so every layer shares
  it and it is cached on disk (``cache_dir``, key = SHA-256 of shapes, options, seed and the
  bytes of LN(P)).
"""
import hashlib
import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn.functional as F

from mmlinvit.backbones import VisionTransformer
from .base import TRANSFER_STRATEGIES, AttentionInitStrategy, TransferReport

#: Default on-disk cache of fitted banks.
DEFAULT_IMPULSE_CACHE = os.path.join(os.path.expanduser('~'), '.cache', 'mmlinvit', 'impulse')
#: Bumped whenever the fit changes, so stale cache entries are not reused.
_FIT_VERSION = 1
#: Losses of the bank fit.
FIT_LOSSES = ('cross_entropy', 'mse')


def impulse_shifts(window: int) -> List[Tuple[int, int]]:
    """All (dy, dx) shifts of a ``window x window`` neighbourhood, row-major.

    Args:
        window: Odd window side.
    """
    if window < 1 or window % 2 == 0:
        raise ValueError(f'The impulse window must be a positive odd number, got {window}')
    half = window // 2
    return [(dy, dx) for dy in range(-half, half + 1) for dx in range(-half, half + 1)]


def impulse_targets(grid: Tuple[int, int], shift: Tuple[int, int]) -> torch.Tensor:
    """Key index attended by each query under ``shift``, or -1 outside the grid.

    Args:
        grid: (h, w) patch grid (row-major token order).
        shift: (dy, dx).

    Returns:
        (h * w,) long tensor.
    """
    h, w = grid
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing='ij')
    rr, cc = rows + shift[0], cols + shift[1]
    inside = (rr >= 0) & (rr < h) & (cc >= 0) & (cc < w)
    return torch.where(inside, rr * w + cc, torch.full_like(rr, -1)).reshape(-1)


def impulse_peak_fraction(attn: torch.Tensor, grid: Tuple[int, int],
                          shift: Tuple[int, int]) -> float:
    """Fraction of the queries with an in-grid target whose map row peaks at that target.

    Args:
        attn: (N, N) attention map over the patch grid.
        grid: (h, w).
        shift: (dy, dx).
    """
    target = impulse_targets(grid, shift).to(attn.device)
    valid = target >= 0
    return (attn.argmax(-1)[valid] == target[valid]).float().mean().item()


def fit_impulse_bank(tokens: torch.Tensor, grid: Tuple[int, int], head_dims: int,
                     shifts: Sequence[Tuple[int, int]], steps: int, lr: float,
                     seed: int, fit_loss: str = 'cross_entropy') -> Dict[str, Any]:
    """Fits one (W_q, W_k) pair per shift so that the softmax map is the impulse pattern.

    Args:
        tokens: (N, C) normalised position embeddings LN(P), N = h * w.
        grid: (h, w).
        head_dims: Head width d; the map is ``softmax(t W_q W_k^T t^T / sqrt(d))``.
        shifts: The shifts to fit (one pair each).
        steps: Adam steps.
        lr: Adam learning rate.
        seed: Seed of the initial weights.
        fit_loss: ``'cross_entropy'`` (rows with an in-grid target) or ``'mse'`` (the
            paper's: the whole map against the impulse matrix).

    Returns:
        dict(wq=(S, C, d), wk=(S, C, d), loss=final loss, peak=per-shift peak fractions).
    """
    if fit_loss not in FIT_LOSSES:
        raise ValueError(f'Unknown fit_loss {fit_loss!r}; available: {FIT_LOSSES}')
    n, c = tokens.shape
    if n != grid[0] * grid[1]:
        raise ValueError(f'{n} position tokens do not match the {grid[0]}x{grid[1]} grid')
    tokens = tokens.detach().float()
    gen = torch.Generator().manual_seed(seed)
    init_std = 1.0 / math.sqrt(c)
    wq = (torch.randn(len(shifts), c, head_dims, generator=gen) * init_std).to(tokens.device)
    wk = (torch.randn(len(shifts), c, head_dims, generator=gen) * init_std).to(tokens.device)
    wq.requires_grad_(True)
    wk.requires_grad_(True)
    targets = torch.stack([impulse_targets(grid, s) for s in shifts]).to(tokens.device)
    valid = targets >= 0
    impulse = F.one_hot(targets.clamp(min=0), n).to(tokens.dtype) * valid.unsqueeze(-1)
    scale = head_dims**-0.5

    def logits() -> torch.Tensor:
        return (tokens @ wq) @ (tokens @ wk).transpose(1, 2) * scale

    # Plain Adam (betas 0.9 / 0.999, eps 1e-8), written out: torch.optim's first use imports
    # torch._dynamo, which costs seconds for a fit that itself takes well under one.
    params = (wq, wk)
    first = [torch.zeros_like(p) for p in params]
    second = [torch.zeros_like(p) for p in params]
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    loss = torch.zeros(())
    for step in range(1, steps + 1):
        with torch.enable_grad():
            if fit_loss == 'mse':
                loss = (logits().softmax(-1) - impulse).square().mean()
            else:
                log_prob = logits().log_softmax(-1)
                picked = log_prob.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
                loss = -picked[valid].mean()
            grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g, m, v in zip(params, grads, first, second):
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                denom = (v / (1 - beta2**step)).sqrt_().add_(eps)
                p.addcdiv_(m, denom, value=-lr / (1 - beta1**step))
    with torch.no_grad():
        attn = logits().softmax(-1)
        peak = [impulse_peak_fraction(attn[i], grid, s) for i, s in enumerate(shifts)]
    return dict(wq=wq.detach().cpu(), wk=wk.detach().cpu(), loss=float(loss.item()), peak=peak)


def _cache_key(tokens: torch.Tensor, grid: Tuple[int, int], head_dims: int, window: int,
               steps: int, lr: float, seed: int, fit_loss: str = 'cross_entropy') -> str:
    meta = dict(version=_FIT_VERSION, shape=list(tokens.shape), grid=list(grid),
                head_dims=head_dims, window=window, steps=steps, lr=lr, seed=seed)
    if fit_loss != 'cross_entropy':  # keeps the keys of existing cross-entropy banks
        meta['fit_loss'] = fit_loss
    meta = json.dumps(meta, sort_keys=True)
    digest = hashlib.sha256(meta.encode())
    digest.update(tokens.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def load_or_fit_impulse_bank(tokens: torch.Tensor, grid: Tuple[int, int], head_dims: int,
                             window: int, steps: int, lr: float, seed: int,
                             cache_dir: Optional[str],
                             fit_loss: str = 'cross_entropy') -> Dict[str, Any]:
    """:func:`fit_impulse_bank` over all window shifts, through the on-disk cache.

    Args:
        tokens: (N, C) LN(P).
        grid: (h, w).
        head_dims: Head width.
        window: Odd window side.
        steps: Adam steps.
        lr: Adam learning rate.
        seed: Seed of the fit.
        cache_dir: Cache folder, or ``None`` to always fit and store nothing.
        fit_loss: See :func:`fit_impulse_bank`.

    Returns:
        The bank dict plus ``shifts``, ``cache_file`` (or ``None``) and ``cache_hit``.
    """
    shifts = impulse_shifts(window)
    path = None
    if cache_dir is not None:
        key = _cache_key(tokens, grid, head_dims, window, steps, lr, seed, fit_loss)
        path = os.path.join(cache_dir, f'impulse_{key[:24]}.pt')
        if os.path.isfile(path):
            bank = torch.load(path, map_location='cpu', weights_only=True)
            bank.update(cache_file=path, cache_hit=True, shifts=shifts)
            return bank
    bank = fit_impulse_bank(tokens, grid, head_dims, shifts, steps, lr, seed, fit_loss)
    if path is not None:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = f'{path}.{os.getpid()}.tmp'
        torch.save(bank, tmp)
        os.replace(tmp, path)
    bank.update(cache_file=path, cache_hit=False, shifts=shifts)
    return bank


def _random_orthogonal(dims: int, generator: torch.Generator) -> torch.Tensor:
    """Haar-random (dims x dims) orthogonal matrix."""
    q, r = torch.linalg.qr(torch.randn(dims, dims, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


@TRANSFER_STRATEGIES.register_module('Impulse')
@TRANSFER_STRATEGIES.register_module('impulse')
class ImpulseInit(AttentionInitStrategy):
    """Impulse init of every block's query / key weights (see the module docstring).

    Args:
        window: Side of the neighbourhood the shifts are drawn from (odd; paper: 3 or 5).
        steps: Adam steps of the bank fit.
        lr: Adam learning rate of the bank fit.
        seed: Seed of the fit, of the per-head shifts and of the per-head rotations;
            ``None`` (default) takes the run's seed (:meth:`run_seed`).
        cache_dir: Folder of cached banks; ``None`` uses :data:`DEFAULT_IMPULSE_CACHE`.
        use_cache: Set ``False`` to always fit and write nothing to disk.
        base: Copy strategy applied first (``'random'`` or ``'mlp_copy'``).
        fit_loss: ``'cross_entropy'`` (default, converges in a few hundred steps) or
            ``'mse'`` (the paper's; with ``steps=10000, lr=1e-4`` its whole fit).
        share_across_layers: Every block gets the same per-head weights (shift and rotation
            drawn once), as the public code does by default (``init_once=True``: one
            ``impulse_init`` for layer 0, its Q / K written into every block).  ``False``
            draws them anew for each block.
    """

    name = 'impulse'

    def __init__(self,
                 window: int = 3,
                 steps: int = 200,
                 lr: float = 1e-2,
                 seed: Optional[int] = None,
                 cache_dir: Optional[str] = None,
                 use_cache: bool = True,
                 base: Union[str, dict] = 'random',
                 fit_loss: str = 'cross_entropy',
                 share_across_layers: bool = True) -> None:
        super().__init__(base)
        impulse_shifts(window)  # validates the window
        if steps < 1:
            raise ValueError(f'steps must be positive, got {steps}')
        self.window = window
        self.steps = steps
        self.lr = lr
        if fit_loss not in FIT_LOSSES:
            raise ValueError(f'Unknown fit_loss {fit_loss!r}; available: {FIT_LOSSES}')
        self.fit_loss = fit_loss
        self.seed = seed
        self.share_across_layers = share_across_layers
        self.cache_dir = (cache_dir or DEFAULT_IMPULSE_CACHE) if use_cache else None

    def check(self, student: VisionTransformer) -> None:
        super().check(student)
        if student.num_prefix_tokens:
            raise ValueError(
                f"Strategy 'impulse' fits attention maps over the patch grid only and needs a "
                f'student without prefix tokens, but the student has {student.num_prefix_tokens} '
                f'(class token: {student.with_cls_token}, register tokens: '
                f"{student.num_reg_tokens}). Build it with with_cls_token=False, "
                f"num_reg_tokens=0 and out_type='avg_featmap' (the paper: no class token, "
                f'sin-cos position embedding, global average pooling).')
        if student.pos_embed_type == 'none':
            raise ValueError("Strategy 'impulse' fits maps over the position embeddings, but the "
                             "student has pos_embed_type='none'; use 'sincos' (as in the paper) "
                             "or 'learned'.")
        grid = tuple(student.pos_grid)
        half = self.window // 2
        if half >= min(grid):
            raise ValueError(
                f"Strategy 'impulse': window={self.window} has shifts of up to {half} patches, "
                f'but the student grid is {grid[0]}x{grid[1]}: no query has a key {half} rows / '
                f'columns away inside the grid, so a head drawing such a shift could not be '
                f'fitted (it would keep its random start). Use window <= '
                f'{2 * min(grid) - 1}, or a grid of at least {half + 1} patches per side.')

    def position_tokens(self, student: VisionTransformer) -> torch.Tensor:
        """LN(P): the student's normalised patch position embeddings on its grid, (N, C)."""
        device = student.blocks[0].attn.qkv.weight.device
        pos = student.patch_pos_embed(tuple(student.pos_grid), device, torch.float32)[0]
        eps = student.blocks[0].norm1.eps
        return F.layer_norm(pos.detach().float(), (student.embed_dims, ), eps=eps)

    def initialize(self, student: VisionTransformer, report: TransferReport) -> Set[str]:
        grid = tuple(student.pos_grid)
        c, heads = student.embed_dims, student.num_heads
        d = student.blocks[0].attn.head_dims
        seed = self.run_seed(self.seed)
        bank = load_or_fit_impulse_bank(self.position_tokens(student), grid, d, self.window,
                                        self.steps, self.lr, seed, self.cache_dir,
                                        self.fit_loss)
        shifts = bank['shifts']
        gen = torch.Generator().manual_seed(seed)

        def draw_heads():  # (shift index, rotation) of each head
            return [(int(torch.randint(len(shifts), (1, ), generator=gen)),
                     _random_orthogonal(d, gen)) for _ in range(heads)]

        shared = draw_heads() if self.share_across_layers else None
        written = set()
        chosen = []
        for i, block in enumerate(student.blocks):
            weight = block.attn.qkv.weight
            layer_shifts = []
            for h, (s, rot) in enumerate(shared or draw_heads()):
                wq = bank['wq'][s].double() @ rot
                wk = bank['wk'][s].double() @ rot
                weight[h * d:(h + 1) * d] = wq.T.to(weight)
                weight[c + h * d:c + (h + 1) * d] = wk.T.to(weight)
                layer_shifts.append(list(shifts[s]))
            chosen.append(layer_shifts)
            written.add(f'blocks.{i}.attn.qkv.weight')
        report.details.update(
            seed=seed, shifts=chosen, grid=list(grid), fit_loss=bank['loss'],
            fit_peak_fraction_min=min(bank['peak']), cache_file=bank['cache_file'],
            cache_hit=bank['cache_hit'])
        return written

    def options(self) -> Dict[str, Any]:
        return dict(window=self.window, steps=self.steps, lr=self.lr, fit_loss=self.fit_loss,
                    seed=self.seed, cache_dir=self.cache_dir,
                    share_across_layers=self.share_across_layers, **super().options())
