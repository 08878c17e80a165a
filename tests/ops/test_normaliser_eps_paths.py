"""The normaliser eps of the torch linear attention on the query-streaming path.

Guards the placement of eps in ``den = phi(Q) z + eps`` inside
:func:`mmlinvit.ops.linear_attention.torch_impl._queries_forward`.  The contract of every backend
(:mod:`mmlinvit.ops.linear_attention.naive`) is::

    out_i = phi(q_i) S / (phi(q_i) z + eps),  S = phi(K)^T V / M,  z = mean_j phi(k_j)

With the ReLU feature map a query whose entries are all <= 0 has phi(q_i) = 0, so the numerator
is 0 and the denominator is exactly eps: the output row must be 0.  Writing the normaliser as
``phi(q_i) (z + eps)`` instead gives 0 / 0 = NaN for that row, and differs by
``eps * (sum phi(q_i) - 1)`` elsewhere, far below the usual tolerances (mutation-audit survivor
m03).  The existing zero-feature test runs fp32 self-attention on CPU, which takes the
in-output forward (:func:`_forward_in_output`, with its own eps), so this file drives the inputs
that :func:`_ChunkedLinearAttention.forward` sends to ``_queries_forward`` instead:

* ``v`` in bf16 / fp16 (AMP): ``_can_run_in_output`` needs an fp32 ``v``;
* cross attention (query and key counts differ, N != M);
* self-attention shapes with a value width different from the query width (d != e);
* explicit small chunks, so the zero row sits inside a later, ragged chunk.

Each case asserts a finite output, the zero row exactly 0, equality with the O(N^2) reference
``linear_attention_naive`` and with an fp64 formula written here, and the same for the q / k / v
gradients (the backward, ``_queries_backward``, builds its own ``[0, ..., 0, eps]`` bias).
"""
import pytest
import torch

from mmlinvit.ops.linear_attention import (linear_attention, linear_attention_naive,
                                           linear_attention_torch)
from mmlinvit.ops.linear_attention.torch_impl import _can_run_in_output

EPS = 1e-6
#: Query rows whose ReLU features are all zero (one in the first chunk, one in a later one).
ZERO_ROWS = (3, 10)


def _formula_fp64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  eps: float = EPS) -> torch.Tensor:
    """relu(Q) S / (relu(Q) z + eps) in fp64, S = relu(K)^T V / M, z = mean relu(K)."""
    phi_q, phi_k, v64 = q.double().relu(), k.double().relu(), v.double()
    m = k.shape[-2]
    s = phi_k.transpose(-2, -1) @ v64 / m  # (..., d, e)
    z = phi_k.sum(dim=-2, keepdim=True).transpose(-2, -1) / m  # (..., d, 1)
    return (phi_q @ s) / (phi_q @ z + eps)


def _inputs(n: int, m: int, d: int, e: int, v_dtype: torch.dtype, seed: int = 0):
    """Random q, k, v (batch 2, heads 2) with the ZERO_ROWS queries all negative."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, n, d, generator=gen)
    k = torch.randn(2, 2, m, d, generator=gen)
    v = torch.randn(2, 2, m, e, generator=gen).to(v_dtype)
    for row in ZERO_ROWS:
        q[..., row, :] = -(q[..., row, :].abs() + 0.25)  # relu(q_row) == 0 exactly
    return q, k, v


# (N, M, d, e, v dtype, chunk_size): none of these can use the in-output forward.
CASES = [
    pytest.param(16, 16, 8, 8, torch.bfloat16, None, id='self-bf16-v'),
    pytest.param(16, 16, 8, 8, torch.float16, None, id='self-fp16-v'),
    pytest.param(16, 16, 8, 8, torch.bfloat16, 6, id='self-bf16-v-chunked'),
    pytest.param(16, 23, 8, 8, torch.float32, None, id='cross-fp32'),
    pytest.param(16, 9, 8, 8, torch.float32, 7, id='cross-fp32-chunked'),
    pytest.param(16, 16, 8, 5, torch.float32, None, id='self-fp32-d!=e'),
    pytest.param(16, 23, 8, 8, torch.bfloat16, 4, id='cross-bf16-v-chunked'),
]


def _tolerance(dtype: torch.dtype) -> dict:
    """Output tolerance: fp32 math, rounded once to the dtype of ``v``."""
    if dtype == torch.float32:
        return dict(atol=1e-5, rtol=1e-5)
    return dict(atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize('n,m,d,e,v_dtype,chunk', CASES)
def test_zero_feature_query_rows_on_the_query_streaming_forward(n, m, d, e, v_dtype, chunk):
    q, k, v = _inputs(n, m, d, e, v_dtype)
    assert not _can_run_in_output(q, k, v)  # these inputs reach _queries_forward
    if chunk is None:
        out = linear_attention(q, k, v, feature_map='relu', eps=EPS, backend='torch')
    else:
        out = linear_attention_torch(q, k, v, feature_map='relu', eps=EPS, chunk_size=chunk)
    assert out.shape == (2, 2, n, e) and out.dtype == v_dtype
    assert torch.isfinite(out).all(), 'phi(q) = 0 rows must give 0, not 0 / 0'
    for row in ZERO_ROWS:
        assert torch.count_nonzero(out[..., row, :]) == 0, f'row {row} must be exactly 0'
    naive = linear_attention_naive(q, k, v, feature_map='relu', eps=EPS)
    torch.testing.assert_close(out, naive, **_tolerance(v_dtype))
    torch.testing.assert_close(out.double(), _formula_fp64(q, k, v), **_tolerance(v_dtype))


@pytest.mark.parametrize('n,m,d,e,v_dtype,chunk', [
    pytest.param(16, 23, 8, 8, torch.float32, None, id='cross-fp32'),
    pytest.param(16, 9, 8, 8, torch.float32, 7, id='cross-fp32-chunked'),
    pytest.param(16, 16, 8, 5, torch.float32, 6, id='self-fp32-d!=e-chunked'),
])
def test_zero_feature_query_rows_backward(n, m, d, e, v_dtype, chunk):
    q, k, v = _inputs(n, m, d, e, v_dtype, seed=1)
    grad = torch.randn(2, 2, n, e, generator=torch.Generator().manual_seed(2))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = linear_attention_torch(*leaves, feature_map='relu', eps=EPS, chunk_size=chunk)
    got = torch.autograd.grad(out, leaves, grad)

    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    naive = torch.autograd.grad(linear_attention_naive(*ref_leaves, 'relu', EPS), ref_leaves,
                                grad)
    f64_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    f64 = torch.autograd.grad(_formula_fp64(*f64_leaves), f64_leaves, grad.double())

    torch.testing.assert_close(out.double(), _formula_fp64(q, k, v), atol=1e-5, rtol=1e-5)
    for name, g, g_naive, g64 in zip('qkv', got, naive, f64):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g, g_naive, atol=1e-5, rtol=1e-4, msg=name)
        torch.testing.assert_close(g.double(), g64, atol=1e-5, rtol=1e-4, msg=name)
    # relu'(q) = 0 on the zero rows: no gradient reaches those queries.
    for row in ZERO_ROWS:
        assert torch.count_nonzero(got[0][..., row, :]) == 0


def test_zero_feature_query_rows_backward_with_half_values():
    """bf16 v (AMP): the backward of the query-streaming path, against fp64, at bf16 tolerance."""
    q, k, v = _inputs(16, 16, 8, 8, torch.bfloat16, seed=3)
    grad = torch.randn(2, 2, 16, 8, generator=torch.Generator().manual_seed(4)).bfloat16()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = linear_attention(*leaves, feature_map='relu', eps=EPS, backend='torch')
    assert torch.isfinite(out).all()
    got = torch.autograd.grad(out, leaves, grad)
    f64_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    f64 = torch.autograd.grad(_formula_fp64(*f64_leaves), f64_leaves, grad.double())
    for name, g, g64 in zip('qkv', got, f64):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g.double(), g64, atol=3e-2, rtol=3e-2, msg=name)
