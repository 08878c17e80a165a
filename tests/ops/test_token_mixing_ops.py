"""The token-mixing maths moved out of the attention layers, against formulas written here.

Covers :mod:`mmlinvit.ops.signed_normaliser`, :mod:`mmlinvit.ops.identity_attention`,
:mod:`mmlinvit.ops.inline`, :mod:`mmlinvit.ops.mhla` and ``hedgehog_feature``.
"""
import pytest
import torch

from mmlinvit.ops.feature_maps import hedgehog_feature
from mmlinvit.ops.identity_attention import (identity_linear_attention,
                                             identity_linear_attention_map)
from mmlinvit.ops.inline import inline_attention_map
from mmlinvit.ops.linear_attention import inline_attention
from mmlinvit.ops.mhla import (block_token_indices, mhla_attention, mhla_attention_map,
                               patch_block_index, token_block_index)
from mmlinvit.ops.signed_normaliser import signed_safe_denominator


FP32 = dict(rtol=1e-5, atol=1e-5)


def _qkv(b=2, h=2, n=7, d=4, e=3, dtype=torch.float64):
    return (torch.randn(b, h, n, d, dtype=dtype), torch.randn(b, h, n, d, dtype=dtype),
            torch.randn(b, h, n, e, dtype=dtype))


def test_signed_safe_denominator_values():
    den = torch.tensor([-2.0, -1e-9, 0.0, 1e-9, 3.0], dtype=torch.float64)
    out = signed_safe_denominator(den, 0.5)
    torch.testing.assert_close(out, torch.tensor([-2.5, -0.5 - 1e-9, 0.5, 0.5 + 1e-9, 3.5],
                                                 dtype=torch.float64))
    assert bool((out.abs() >= 0.5).all())


def test_identity_linear_attention_matches_formula():
    q, k, v = _qkv()
    eps = 1e-3
    n = k.shape[-2]
    out = torch.zeros_like(v)
    for i in range(n):
        den = (q[:, :, i] * k.mean(dim=2)).sum(-1, keepdim=True)
        safe = torch.where(den >= 0, den + eps, den - eps)
        num = torch.einsum('bhd,bhjd,bhje->bhe', q[:, :, i], k, v) / n
        out[:, :, i] = num / safe
    # The ops accumulate in fp32 (inputs here are fp64, the formula is evaluated in fp64).
    torch.testing.assert_close(identity_linear_attention(q, k, v, eps), out, **FP32)
    attn = identity_linear_attention_map(q, k, eps)
    assert attn.dtype == torch.float32
    torch.testing.assert_close(attn.double() @ v, out, **FP32)


def test_inline_map_matches_formula_and_linear_path():
    q, k, v = _qkv()
    s = 0.37
    n = k.shape[-2]
    kbar = k.mean(dim=2, keepdim=True)
    expected = (s / n) * (q @ k.transpose(-2, -1)) + (1 - s * (q @ kbar.transpose(-2, -1))) / n
    attn = inline_attention_map(q, k, s)
    assert attn.dtype == torch.float32
    torch.testing.assert_close(attn.double(), expected, **FP32)
    torch.testing.assert_close(attn.sum(-1), torch.ones_like(attn.sum(-1)))
    out = inline_attention(q.float(), k.float(), v.float(), s, backend='torch')
    torch.testing.assert_close(out.double(), expected @ v, **FP32)


@pytest.mark.parametrize('hw,grid,p', [((3, 5), (2, 2), 2), ((7, 5), (3, 2), 0),
                                       ((2, 5), (3, 4), 1), ((16, 16), (4, 4), 5),
                                       ((1, 1), (2, 2), 0), ((37, 37), (4, 4), 1)])
def test_block_token_indices_equal_the_block_index_groups(hw, grid, p):
    """The static index lists (no nonzero / item: one graph under torch.compile) group the
    tokens as token_block_index does, empty blocks (a grid smaller than the blocks) included."""
    block_of = token_block_index(hw, grid, p)
    got = block_token_indices(hw, grid, p)
    assert len(got) == grid[0] * grid[1]
    for b, idx in enumerate(got):
        assert torch.equal(idx, torch.nonzero(block_of == b).flatten()), b


def test_mhla_attention_matches_dense_formula_with_prefix_tokens():
    hw, grid, p = (3, 5), (2, 2), 2
    n = p + hw[0] * hw[1]
    block_of = token_block_index(hw, grid, p)
    assert block_of[:p].tolist() == [-1] * p
    assert torch.equal(block_of[p:], patch_block_index(hw, grid))
    phi_q = torch.rand(2, 3, n, 4).double()
    phi_k = torch.rand(2, 3, n, 4).double()
    v = torch.randn(2, 3, n, 5).double()
    mixing = torch.rand(3, 4, 4).double()  # per head, positive
    eps = 1e-4
    out = torch.zeros_like(v)
    for hd in range(3):
        for i in range(n):
            num = torch.zeros(2, 5, dtype=torch.float64)
            den = torch.zeros(2, 1, dtype=torch.float64)
            for j in range(n):
                a, bj = int(block_of[i]), int(block_of[j])
                w = 1.0 if a < 0 or bj < 0 else mixing[hd, a, bj]
                score = w * (phi_q[:, hd, i] * phi_k[:, hd, j]).sum(-1, keepdim=True)
                num += score * v[:, hd, j]
                den += score
            out[:, hd, i] = (num / n) / (den / n + eps)
    # The layer passes fp32 features and mixing (the ops accumulate in fp32).
    f32 = [t.float() for t in (phi_q, phi_k, v)]
    got = mhla_attention(*f32, block_token_indices(hw, grid, p), p, mixing.float(), eps)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), out, **FP32)
    attn = mhla_attention_map(f32[0], f32[1], block_of, mixing.float(), eps)
    torch.testing.assert_close(attn.double() @ v, out, **FP32)


def test_hedgehog_feature_matches_formula():
    x = torch.randn(2, 3, 5, 4)
    weight = torch.randn(3, 4, 6)
    logits = torch.einsum('bhnd,hdf->bhnf', x, weight)
    expected = torch.cat([logits.softmax(-1), (-logits).softmax(-1)], dim=-1)
    out = hedgehog_feature(x, weight)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out.sum(-1), torch.full((2, 3, 5), 2.0))
