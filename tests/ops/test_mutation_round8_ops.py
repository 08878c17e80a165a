"""Mutation audit, round 8: the plain-PyTorch operator numerics against hand computations.

Each test here was written against a mutant of the operator code that the rest of the suite
let through (ids from the round-8 audit; the mutant is named in each docstring).  Every check
compares with a formula evaluated in this file, in fp64, never with another code path of the
package:

* the Mamba-2 SSD scan against the token-by-token recurrence
  ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = h_t C_t + D x_t`` in the documented
  layouts (x (batch, L, H, P), dt (batch, L, H), B / C (batch, L, G, N), head h reading group
  ``h // (H // G)``), on ragged lengths (not a multiple of the chunk size), for the three forms
  of :func:`ssd_scan_torch` (inference, differentiable with ``chunks_per_step``, captured graph)
  and for the sequential oracle itself;
* kernel linear attention against ``phi(Q) (phi(K)^T V) / (phi(Q) sum_j phi(k_j) + M eps)``
  with an eps large enough (0.5) that its placement (on the 1/M-scaled normaliser) is visible,
  on the in-output, query-streaming and graph forms;
* InLine's map in cross-attention (N != M), MHLA's implied map where the signed normaliser is
  negative, and the input checks whose absence lets wrong shapes broadcast silently.
"""
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

from mmlinvit.ops.inline import inline_attention_map
from mmlinvit.ops.linear_attention import (linear_attention_graph, linear_attention_map_naive,
                                           linear_attention_naive, linear_attention_torch)
from mmlinvit.ops.linear_attention.torch_impl import _can_run_in_output
from mmlinvit.ops.mhla import (block_token_indices, mhla_attention, mhla_attention_map,
                               token_block_index)
from mmlinvit.ops.patch_grid import check_patch_grid
from mmlinvit.ops.ssd import ssd_scan_naive, ssd_scan_torch
from mmlinvit.ops.ssd import torch_impl as ssd_torch_impl

EXACT = dict(rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------------------- SSD scan
def _ssd_inputs(batch: int = 2, length: int = 37, heads: int = 4, headdim: int = 3,
                groups: int = 2, d_state: int = 5, a_range=(0.05, 1.5), seed: int = 0,
                dtype: torch.dtype = torch.float64):
    """x, dt, A, B, C, D at Mamba-2 scales (dt = softplus(.) > 0, A < 0)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = randn(batch, length, heads, headdim)
    dt = F.softplus(randn(batch, length, heads) - 1.0)
    A = -(torch.rand(heads, generator=gen, dtype=torch.float64) * (a_range[1] - a_range[0])
          + a_range[0])
    B = randn(batch, length, groups, d_state) * d_state**-0.5
    C = randn(batch, length, groups, d_state) * d_state**-0.5
    D = randn(heads)
    return [t.to(dtype) for t in (x, dt, A, B, C, D)]


def _ssd_recurrence(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                    C: torch.Tensor, D: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The Mamba-2 recurrence token by token in fp64 (differentiable).

    Args:
        x: (batch, L, H, P).
        dt: (batch, L, H).
        A: (H,).
        B: (batch, L, G, N); head h reads group ``h // (H // G)``.
        C: (batch, L, G, N).
        D: Optional (H,).

    Returns:
        y (batch, L, H, P) in fp64.
    """
    x, dt, A, B, C = (t.double() for t in (x, dt, A, B, C))
    batch, length, heads, headdim = x.shape
    groups, d_state = B.shape[2], B.shape[3]
    group_of = [h // (heads // groups) for h in range(heads)]
    state = [x.new_zeros(batch, headdim, d_state) for _ in range(heads)]
    ys = []
    for t in range(length):
        y_t = []
        for h in range(heads):
            g = group_of[h]
            decay = torch.exp(dt[:, t, h] * A[h])[:, None, None]
            inject = dt[:, t, h, None, None] * x[:, t, h, :, None] * B[:, t, g, None, :]
            state[h] = decay * state[h] + inject
            y = (state[h] * C[:, t, g, None, :]).sum(-1)
            if D is not None:
                y = y + D[h].double() * x[:, t, h]
            y_t.append(y)
        ys.append(torch.stack(y_t, dim=1))
    return torch.stack(ys, dim=1)


@pytest.mark.parametrize('length,chunk_size,step', [(37, 8, 2), (21, 4, 3), (70, 16, 1)])
def test_ssd_differentiable_form_carries_the_state_between_steps(length, chunk_size, step):
    """With autograd and ``chunks_per_step`` the scan runs several vectorised steps; the state
    leaving one step must enter the next (mutant T17: a zero state per step).  Ragged lengths,
    forward and the gradient of x against the recurrence."""
    x, dt, A, B, C, D = _ssd_inputs(length=length)
    x_leaf = x.clone().requires_grad_()
    out = ssd_scan_torch(x_leaf, dt, A, B, C, D, chunk_size=chunk_size, chunks_per_step=step)
    assert out.requires_grad
    x_ref = x.clone().requires_grad_()
    ref = _ssd_recurrence(x_ref, dt, A, B, C, D)
    torch.testing.assert_close(out, ref, **EXACT)
    grad = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (got, ) = torch.autograd.grad(out, x_leaf, grad)
    (want, ) = torch.autograd.grad(ref, x_ref, grad)
    torch.testing.assert_close(got, want, **EXACT)


def test_ssd_differentiable_form_in_place_steps(monkeypatch):
    """The chunked form without autograd (in-place buffers, one output written per step), as
    the FLOP counter runs it, with several ragged steps (mutant T17)."""
    monkeypatch.setattr(ssd_torch_impl, 'INFERENCE_FORM', False)
    args = _ssd_inputs(length=45)
    with torch.no_grad():
        out = ssd_scan_torch(*args, chunk_size=8, chunks_per_step=2)
    torch.testing.assert_close(out, _ssd_recurrence(*args), **EXACT)


def test_ssd_gradient_when_only_d_requires_grad():
    """dL/dD_h = sum_{b, t, p} g x for y = ... + D x: the scan must take its autograd form when
    D is the only input that requires a gradient (mutant T14: D left out of ``needs_grad``,
    so the output silently had no graph)."""
    x, dt, A, B, C, D = _ssd_inputs(length=19)
    d_leaf = D.clone().requires_grad_()
    out = ssd_scan_torch(x, dt, A, B, C, d_leaf, chunk_size=8)
    assert out.requires_grad
    torch.testing.assert_close(out, _ssd_recurrence(x, dt, A, B, C, D), **EXACT)
    grad = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (d_grad, ) = torch.autograd.grad(out, d_leaf, grad)
    torch.testing.assert_close(d_grad, (grad * x).sum(dim=(0, 1, 3)), **EXACT)


def test_ssd_graph_form_with_growing_heads(monkeypatch):
    """Under graph capture the decays are not known to be <= 0, so the general masked decay
    must be used: heads with A > 0 (outside the Mamba-2 contract) still follow the recurrence
    (mutant T18: the <= 0 clamp in the graph form zeroes their growth)."""
    x, dt, A, B, C, D = _ssd_inputs(length=70, a_range=(0.01, 0.05))
    A = A * torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    monkeypatch.setattr(ssd_torch_impl, 'capturing_graph', lambda: True)
    with torch.no_grad():
        out = ssd_scan_torch(x, dt, A, B, C, D, chunk_size=16)
    torch.testing.assert_close(out, _ssd_recurrence(x, dt, A, B, C, D), **EXACT)


@pytest.mark.parametrize('length,chunk_size', [(1, 8), (45, 8), (130, 256)])
@pytest.mark.parametrize('form', ['inference', 'autograd', 'graph'])
def test_ssd_forms_follow_the_recurrence_on_ragged_lengths(monkeypatch, form, length,
                                                           chunk_size):
    """Every form of the torch scan against the fp64 recurrence written here (not the package's
    own oracle), grouped B / C (H = 4, G = 2), ragged last chunks (130 tokens: chunks of 64)."""
    args = _ssd_inputs(length=length)
    ref = _ssd_recurrence(*args)
    if form == 'graph':
        monkeypatch.setattr(ssd_torch_impl, 'capturing_graph', lambda: True)
    if form == 'autograd':
        out = ssd_scan_torch(args[0].clone().requires_grad_(), *args[1:],
                             chunk_size=chunk_size)
    else:
        with torch.no_grad():
            out = ssd_scan_torch(*args, chunk_size=chunk_size)
    torch.testing.assert_close(out, ref, **EXACT)


def test_ssd_naive_oracle_follows_the_recurrence():
    """The package's sequential oracle itself, in fp64 and grouped layout."""
    args = _ssd_inputs(length=23)
    torch.testing.assert_close(ssd_scan_naive(*args), _ssd_recurrence(*args), **EXACT)
    torch.testing.assert_close(ssd_scan_naive(*args[:5]), _ssd_recurrence(*args[:5]), **EXACT)


def test_ssd_naive_accumulates_half_inputs_in_fp32():
    """bf16 inputs: the oracle sums in fp32 and rounds once, so it is within one bf16 ulp of
    the fp64 recurrence on the same (rounded) inputs (mutant S05: bf16 accumulation drifts by
    ~200 ulps over 64 tokens)."""
    args = [t.bfloat16() for t in _ssd_inputs(batch=1, length=64, a_range=(0.01, 0.05))]
    out = ssd_scan_naive(*args)
    assert out.dtype == torch.bfloat16
    ref = _ssd_recurrence(*args)
    err = (out.double() - ref).abs()
    assert bool((err <= 2**-7 * ref.abs() + 1e-4).all()), float((err / ref.abs()).max())


def test_ssd_rejects_misshaped_a_and_d():
    """A and D of shape (1,) would broadcast over the heads; both must be (heads,) (mutants S06
    and S07 let them through, the torch form then broadcast D silently)."""
    x, dt, A, B, C, D = _ssd_inputs(length=5)
    for scan in (ssd_scan_torch, ssd_scan_naive):
        with pytest.raises(ValueError, match=r'D must be \(heads,\)'):
            scan(x, dt, A, B, C, D[:1])
        with pytest.raises(ValueError, match=r'A must be \(heads,\)'):
            scan(x, dt, A[:1], B, C, D)


# ------------------------------------------------------------------------ linear attention
#: Large enough that ``+ eps`` vs ``+ M eps`` on the unscaled sums (or eps inside the product
#: with phi(q)) changes the output far beyond the tolerance.
BIG_EPS = 0.5


def _phi(x: torch.Tensor, feature_map: str) -> torch.Tensor:
    """The feature maps written out: ELU + 1, or ReLU."""
    x = x.double()
    if feature_map == 'elu':
        return torch.where(x > 0, x + 1.0, torch.exp(x))
    return x.clamp(min=0.0)


def _linear_attention_fp64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature_map: str,
                           eps: float) -> torch.Tensor:
    """phi(Q) (phi(K)^T V) / (phi(Q) sum_j phi(k_j) + M eps) in fp64, row by row."""
    phi_q, phi_k, v64 = _phi(q, feature_map), _phi(k, feature_map), v.double()
    m = k.shape[-2]
    num = phi_q @ (phi_k.transpose(-2, -1) @ v64)
    den = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1) + m * eps
    return num / den


def _qkv(n: int, m: int, d: int, e: int, seed: int = 0, v_dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, n, d, generator=gen)
    k = torch.randn(2, 3, m, d, generator=gen)
    v = torch.randn(2, 3, m, e, generator=gen).to(v_dtype)
    return q, k, v


# (N, M, d, e, v dtype, chunk): in-output forward, query-streaming forward (cross, d != e,
# bf16 v), ragged chunks.
LA_CASES = [
    pytest.param(21, 21, 6, 6, torch.float32, None, id='in-output'),
    pytest.param(21, 21, 6, 6, torch.float32, 8, id='in-output-chunked'),
    pytest.param(21, 13, 6, 6, torch.float32, 5, id='cross-chunked'),
    pytest.param(21, 21, 6, 4, torch.float32, None, id='d!=e'),
    pytest.param(21, 21, 6, 6, torch.bfloat16, 8, id='bf16-v-chunked'),
]


@pytest.mark.parametrize('feature_map', ['elu', 'relu'])
@pytest.mark.parametrize('n,m,d,e,v_dtype,chunk', LA_CASES)
def test_linear_attention_eps_is_on_the_mean_normaliser(feature_map, n, m, d, e, v_dtype,
                                                        chunk):
    """out = phi(Q) S / (phi(Q) z + eps) with S, z the 1/M-scaled sums, i.e. M eps on the raw
    sums (mutants A04 / A05: the 1/M scale dropped in the streaming / in-output forward)."""
    q, k, v = _qkv(n, m, d, e, v_dtype=v_dtype)
    in_output = _can_run_in_output(q, k, v)
    assert in_output == (n == m and d == e and v_dtype == torch.float32)
    want = _linear_attention_fp64(q, k, v, feature_map, BIG_EPS)
    out = linear_attention_torch(q, k, v, feature_map, eps=BIG_EPS, chunk_size=chunk)
    assert out.dtype == v_dtype
    tol = dict(rtol=1e-5, atol=1e-5) if v_dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(out.double(), want, **tol)
    # The eps really is visible at this size: without the 1/M scale the result moves.
    no_scale = _linear_attention_fp64(q, k, v, feature_map, BIG_EPS / m)
    assert (no_scale - want).abs().max() > 1e-3


@pytest.mark.parametrize('feature_map', ['elu', 'relu'])
def test_linear_attention_graph_and_naive_eps_placement(feature_map):
    """The graph form and the O(N^2) reference with the same large eps (mutants A06: eps added
    to z before the product with phi(q); L01: eps not scaled by M in the explicit map)."""
    q, k, v = _qkv(17, 11, 5, 4)
    want = _linear_attention_fp64(q, k, v, feature_map, BIG_EPS)
    torch.testing.assert_close(linear_attention_graph(q, k, v, feature_map, eps=BIG_EPS).double(),
                               want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(linear_attention_naive(q, k, v, feature_map, eps=BIG_EPS).double(),
                               want, rtol=1e-5, atol=1e-5)
    attn = linear_attention_map_naive(q, k, feature_map, eps=BIG_EPS)
    torch.testing.assert_close((attn.double() @ v.double()), want, rtol=1e-5, atol=1e-5)


def test_linear_attention_graph_zero_feature_rows_are_zero():
    """ReLU queries that are all <= 0: numerator 0, normaliser exactly eps, so the row is 0 in
    the graph form too (mutant A06 gave 0 / 0 = NaN)."""
    q, k, v = _qkv(9, 7, 5, 4)
    q[..., 2, :] = -(q[..., 2, :].abs() + 0.1)
    out = linear_attention_graph(q, k, v, 'relu', eps=1e-6)
    assert torch.isfinite(out).all()
    assert torch.count_nonzero(out[..., 2, :]) == 0
    torch.testing.assert_close(out.double(), _linear_attention_fp64(q, k, v, 'relu', 1e-6),
                               rtol=1e-5, atol=1e-5)


def test_linear_attention_rejects_mismatched_leading_dims():
    """q with batch 2 and k / v with batch 1 would broadcast in the graph form's matmuls; every
    torch entry point must name the shapes instead (mutant L03)."""
    q, k, v = _qkv(6, 6, 4, 4)
    k1, v1 = k[:1], v[:1]
    for fn in (lambda: linear_attention_graph(q, k1, v1, 'elu'),
               lambda: linear_attention_torch(q, k1, v1, 'elu')):
        with pytest.raises(ValueError, match='leading'):
            fn()


# -------------------------------------------------------------------- InLine / MHLA / grid
def test_inline_map_in_cross_attention():
    """A_ij = (s / M) q_i.k_j + (1 - s q_i.kbar) / M with M keys != N queries: rows sum to 1
    (mutant I01: divided by the query count)."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 2, 9, 4, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 2, 5, 4, generator=gen, dtype=torch.float64)
    s, m = 0.4, 5
    kbar = k.mean(dim=-2, keepdim=True)
    want = (s / m) * (q @ k.transpose(-2, -1)) + (1 - s * (q @ kbar.transpose(-2, -1))) / m
    attn = inline_attention_map(q, k, s)
    assert attn.shape == (2, 2, 9, 5)
    torch.testing.assert_close(attn.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 2, 9), rtol=1e-5, atol=1e-5)


def test_mhla_map_with_negative_normalisers():
    """Signed features (identity map) make some normalisers negative; the implied map divides
    by ``den - eps`` there, as the O(N) path does (mutant M02: ``den + eps`` everywhere)."""
    hw, grid, p = (3, 4), (2, 2), 1
    n = p + hw[0] * hw[1]
    gen = torch.Generator().manual_seed(4)
    phi_q = torch.randn(1, 2, n, 3, generator=gen, dtype=torch.float64)
    phi_k = torch.randn(1, 2, n, 3, generator=gen, dtype=torch.float64)
    v = torch.randn(1, 2, n, 2, generator=gen, dtype=torch.float64)
    mixing = torch.rand(2, 4, 4, generator=gen, dtype=torch.float64) + 0.5
    eps = 0.05
    block_of = token_block_index(hw, grid, p)
    weights = torch.ones(2, n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            a, b = int(block_of[i]), int(block_of[j])
            if a >= 0 and b >= 0:
                weights[:, i, j] = mixing[:, a, b]
    scores = weights * (phi_q @ phi_k.transpose(-2, -1))
    den = scores.sum(-1, keepdim=True) / n
    assert bool((den < 0).any()) and bool((den > 0).any())
    safe = torch.where(den >= 0, den + eps, den - eps)
    want = scores / (n * safe)
    attn = mhla_attention_map(phi_q.float(), phi_k.float(), block_of, mixing.float(), eps)
    torch.testing.assert_close(attn.double(), want, rtol=1e-5, atol=1e-5)
    out = mhla_attention(phi_q.float(), phi_k.float(), v.float(), block_token_indices(hw, grid, p),
                         p, mixing.float(), eps)
    torch.testing.assert_close(out.double(), want @ v, rtol=1e-5, atol=1e-5)


def test_patch_grid_rejects_a_negative_prefix_count():
    """``num_prefix_tokens = -1`` with ``h * w - 1`` tokens adds up but is no layout (mutant P03
    accepted it and the grid then read the wrong tokens)."""
    assert check_patch_grid('op', 13, (3, 4), 1) == (3, 4)
    with pytest.raises(ValueError, match='num_prefix_tokens=-1'):
        check_patch_grid('op', 11, (3, 4), -1)
