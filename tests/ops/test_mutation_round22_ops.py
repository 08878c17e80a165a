"""Token-mixing ops on branches that the rest of the suite let pass (mutation round 22): each
test below failed on at least one single-line change of the op that no other test caught.

Guarded here, each against an oracle written in this file (``torch.autograd`` of the inner
loss through ``F.conv2d``, per-sample ``F.conv2d`` loops, fp64 formulas) or a hand-worked
expectation, never against the op's own helpers:

* ViT^3 TTT (:mod:`mmlinvit.ops.ttt`): the depthwise-conv inner step and the per-sample
  convolution keep ``'same'`` padding ``ks // 2`` for every odd kernel size the functions
  accept (the shipped operator uses 3 x 3, where ``ks // 3`` gives the same padding);
* MHLA (:mod:`mmlinvit.ops.mhla`): the ``'cos'`` mixing init (the public MHLA code's class
  default) against the public ``BlockDistanceConv`` transform ``cos(d / max(d) * pi / 4)``
  with columns summing to 1, written out here in fp64, on grids whose largest centre
  distance is 1 as well; the token lists of the blocks on an empty patch grid (h = 0, which
  the patch-grid check accepts) against the documented ``nonzero(token_block_index == b)``;
* torch linear attention (:mod:`mmlinvit.ops.linear_attention.torch_impl`): an explicit
  ``chunk_size`` is the chunk of the backward too (the documented memory bound; automatic
  sizing would take whole short sequences), recorded by spies, values against fp64;
* SSD (:mod:`mmlinvit.ops.ssd.torch_impl`): the public ``decay_matrix`` back-propagates
  (its default out-of-place form), against fp64 autograd of direct segment sums;
  ``chunks_per_step`` must be None or a positive int: 0, a bool and a float are refused
  with the documented ValueError (0 used to fall back silently to "all chunks"); a scan
  in grad mode whose inputs need no gradient takes the inference form (spied);
* backend helpers (:mod:`mmlinvit.ops.triton_utils`): the documented kernel limit
  ``d, e <= 128`` as a number (the existing checks compare with the constant itself).
"""
import math
from typing import Any, List, Tuple

import pytest
import torch
import torch.nn.functional as F

from mmlinvit.ops.linear_attention import linear_attention_torch, torch_impl
from mmlinvit.ops.mhla import block_centre_mixing_cos, block_token_indices, token_block_index
from mmlinvit.ops.ssd import decay_matrix, ssd_scan_naive, ssd_scan_torch
from mmlinvit.ops.ssd import torch_impl as ssd_torch_impl
from mmlinvit.ops.triton_utils import kernel_limits_reason
from mmlinvit.ops.ttt import depthwise_conv_inner_step, per_sample_depthwise_conv

pytestmark = pytest.mark.usefixtures('one_thread')

VIT3_SCALE = 9**-0.5


# ============================================================================ ViT^3 TTT
def _conv_step_autograd(k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor, scale: float,
                        lr: float) -> torch.Tensor:
    """Per-sample kernels after one clipped step, by autograd of ViT^3's inner loss
    ``-scale * mean_hw(conv(k, w) * v)`` through ``F.conv2d`` ('same' zero padding)."""
    b, c, h, w = k.shape
    ks = weight.shape[-1]
    kernels = []
    for i in range(b):
        wi = weight.detach().clone().requires_grad_(True)
        out = F.conv2d(k[i:i + 1], wi.unsqueeze(1), padding=ks // 2, groups=c)
        loss = -(out * v[i:i + 1]).mean(dim=(-2, -1)).sum() * scale
        (g, ) = torch.autograd.grad(loss, wi)
        norm = g.pow(2).sum(dim=(-2, -1), keepdim=True).sqrt()
        kernels.append(wi.detach() - lr * g / (norm + 1.0))
    return torch.stack(kernels)


@pytest.mark.parametrize('ks,hw', [(5, (4, 6)), (7, (3, 5)), (5, (2, 2))])
def test_conv_inner_step_keeps_same_padding_for_larger_kernels(ks: int,
                                                               hw: Tuple[int, int]) -> None:
    """Kernels larger than ViT^3's 3 x 3 (the function takes any odd size): the taps reach
    ``ks // 2`` pixels each way (``ks // 3`` is 1 for 3 x 3 and 5 x 5 alike)."""
    gen = torch.Generator().manual_seed(7)
    k, v = (2 * torch.randn(2, 3, *hw, generator=gen) for _ in range(2))
    weight = 0.5 * torch.randn(3, ks, ks, generator=gen)
    got = depthwise_conv_inner_step(k, v, weight, VIT3_SCALE, 1.0)
    assert got.shape == (2, 3, ks, ks)
    torch.testing.assert_close(got, _conv_step_autograd(k, v, weight, VIT3_SCALE, 1.0),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('ks', [3, 5])
def test_per_sample_conv_is_a_same_padded_conv_per_sample(ks: int) -> None:
    """Each sample convolved with its own kernels, output on the input grid."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(3, 4, 5, 6, generator=gen)
    weight = torch.randn(3, 4, ks, ks, generator=gen)
    got = per_sample_depthwise_conv(x, weight)
    want = torch.cat([F.conv2d(x[i:i + 1], weight[i].unsqueeze(1), padding=ks // 2, groups=4)
                      for i in range(3)])
    assert got.shape == x.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# ================================================================================== MHLA
def _public_cos_init(gh: int, gw: int) -> torch.Tensor:
    """Public MHLA ``BlockDistanceConv(transform='cos')._apply_transform`` in fp64: block
    centres (row + 0.5, col + 0.5), ``mat = cos(d / max(d) * pi / 4)``, then
    ``mat / mat.sum(dim=0, keepdim=True)``."""
    centres = [(i + 0.5, j + 0.5) for i in range(gh) for j in range(gw)]
    dist = torch.tensor([[math.dist(a, b) for b in centres] for a in centres],
                        dtype=torch.float64)
    mat = torch.cos(dist / dist.max() * math.pi / 4)
    return mat / mat.sum(dim=0, keepdim=True)


@pytest.mark.parametrize('grid', [(1, 2), (2, 1), (2, 3), (3, 3), (1, 4)])
def test_cos_mixing_init_matches_the_public_transform(grid: Tuple[int, int]) -> None:
    """(1, 2) / (2, 1): a largest distance of exactly 1 is still divided out (only a single
    block, distance 0, gets the all-ones matrix)."""
    got = block_centre_mixing_cos(grid)
    assert got.dtype == torch.float32 and got.shape == (grid[0] * grid[1], ) * 2
    torch.testing.assert_close(got.double(), _public_cos_init(*grid), rtol=0, atol=1e-6)


@pytest.mark.parametrize('hw,grid', [((0, 3), (2, 1)), ((3, 0), (1, 2)), ((0, 0), (2, 2))])
def test_blocks_of_an_empty_grid_are_empty(hw: Tuple[int, int], grid: Tuple[int, int]) -> None:
    """No patch, two prefix tokens: every block's token list is empty, as the documented
    ``nonzero(token_block_index(...) == b)`` (an index would point past the sequence)."""
    block_of = token_block_index(hw, grid, 2)
    assert block_of.tolist() == [-1, -1]
    got = block_token_indices(hw, grid, 2)
    want = [torch.nonzero(block_of == b).flatten() for b in range(grid[0] * grid[1])]
    assert [t.tolist() for t in got] == [t.tolist() for t in want] == [[]] * len(want)


# ============================================================== torch linear attention
def _chunk_spies(monkeypatch: pytest.MonkeyPatch) -> List[Tuple[str, int]]:
    """Records (stage, chunk argument) of every chunked stage of the torch linear attention."""
    calls: List[Tuple[str, int]] = []

    def spy(name: str, pos: int) -> None:
        fn = getattr(torch_impl, name)

        def wrapped(*args: Any) -> Any:
            calls.append((name, args[pos]))
            return fn(*args)
        monkeypatch.setattr(torch_impl, name, wrapped)

    for name, pos in (('_key_states', 3), ('_queries_forward', 4), ('_forward_in_output', 5),
                      ('_queries_backward', 5), ('_keys_backward', 4)):
        spy(name, pos)
    return calls


def _linear_attention64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        eps: float = 1e-6) -> torch.Tensor:
    """ELU+1 linear attention in fp64: phi(q) (phi(K)^T V / M) / (phi(q) . mean phi(k) + eps)."""
    pq, pk, v64 = F.elu(q.double()) + 1, F.elu(k.double()) + 1, v.double()
    num = pq @ (pk.transpose(-2, -1) @ v64) / k.shape[-2]
    return num / (pq @ pk.mean(dim=-2).unsqueeze(-1) + eps)


@pytest.mark.parametrize('n,m', [(23, 17), (20, 20)])
def test_an_explicit_chunk_size_is_kept_by_forward_and_backward(
        monkeypatch: pytest.MonkeyPatch, n: int, m: int) -> None:
    """``chunk_size=7`` is the chunk of every stage, the backward included (automatic sizing
    would take the whole short sequence); (20, 20) is the in-output forward."""
    calls = _chunk_spies(monkeypatch)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, n, 8, generator=gen).requires_grad_()
    k = torch.randn(2, 3, m, 8, generator=gen).requires_grad_()
    v = torch.randn(2, 3, m, 8, generator=gen).requires_grad_()
    out = linear_attention_torch(q, k, v, 'elu', chunk_size=7)
    out.backward(torch.ones_like(out))
    forward = [('_forward_in_output', 7)] if n == m else [('_key_states', 7),
                                                          ('_queries_forward', 7)]
    assert calls == forward + [('_queries_backward', 7), ('_keys_backward', 7)]
    torch.testing.assert_close(out.detach().double(), _linear_attention64(q, k, v), rtol=1e-5,
                               atol=1e-6)


# =================================================================================== SSD
def _decay64(log_decay: torch.Tensor) -> torch.Tensor:
    """exp(a_{j+1} + ... + a_i) for i >= j, 0 above the diagonal, by direct fp64 sums."""
    a = log_decay.double()
    q = a.shape[-1]
    out = torch.zeros(a.shape + (q, ), dtype=torch.float64)
    for i in range(q):
        for j in range(i + 1):
            out[..., i, j] = a[..., j + 1:i + 1].sum(dim=-1).exp()
    return out


def test_decay_matrix_is_differentiable() -> None:
    """The default (out-of-place) form back-propagates to the log decays: the gradient of
    ``sum(W * decay)`` equals the fp64 autograd of the direct sums."""
    gen = torch.Generator().manual_seed(4)
    a = (-torch.rand(2, 6, generator=gen, dtype=torch.float64)).requires_grad_()
    weight = torch.randn(2, 6, 6, generator=gen, dtype=torch.float64)
    (got, ) = torch.autograd.grad((decay_matrix(a) * weight).sum(), a)
    a0 = a.detach().clone().requires_grad_()
    (want, ) = torch.autograd.grad((_decay64(a0) * weight).sum(), a0)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)



@pytest.mark.parametrize('chunks_per_step', [0, -2, True, 2.0])
@pytest.mark.parametrize('grad', [False, True])
def test_chunks_per_step_must_be_a_positive_int(chunks_per_step: Any, grad: bool) -> None:
    """Refused on the inference and the autograd path alike, before any work."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 10, 2, 4, generator=gen).requires_grad_(grad)
    dt, a = torch.rand(1, 10, 2, generator=gen), -torch.rand(2, generator=gen)
    b, c = (torch.randn(1, 10, 1, 4, generator=gen) for _ in range(2))
    with pytest.raises(ValueError, match='chunks_per_step must be None or a positive int'):
        ssd_scan_torch(x, dt, a, b, c, chunk_size=4, chunks_per_step=chunks_per_step)



def test_grad_mode_without_grad_inputs_takes_the_inference_form(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Eval outside ``torch.no_grad()``: nothing needs a gradient, so the scan runs the
    inference form (as under ``no_grad``), not the autograd form; values match the oracle."""
    calls: List[int] = []
    inference = ssd_torch_impl._scan_inference

    def spy(*args: Any) -> torch.Tensor:
        calls.append(1)
        return inference(*args)
    monkeypatch.setattr(ssd_torch_impl, '_scan_inference', spy)
    gen = torch.Generator().manual_seed(6)
    x, b, c = (torch.randn(1, 10, 2, 4, generator=gen) for _ in range(3))
    dt, a = torch.rand(1, 10, 2, generator=gen), -torch.rand(2, generator=gen)
    b, c = b[:, :, :1], c[:, :, :1]
    with torch.enable_grad():
        out = ssd_scan_torch(x, dt, a, b, c, chunk_size=4)
    assert calls == [1] and out.grad_fn is None
    torch.testing.assert_close(out.double(), ssd_scan_naive(x.double(), dt.double(), a.double(),
                                                            b.double(), c.double()),
                               rtol=1e-5, atol=1e-6)


# ======================================================================== triton_utils
def test_kernel_limit_is_the_documented_128() -> None:
    """The kernels document ``d, e <= 128``: 128 fits, 129 is refused and named."""
    fp32 = torch.zeros(1)
    assert kernel_limits_reason({'d': 128, 'e': 128}, [('q', fp32)]) is None
    assert kernel_limits_reason({'d': 64, 'e': 129}, [('q', fp32)]) == (
        "head dims / state size {'e': 129}, supported <= 128")

