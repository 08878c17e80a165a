"""Mutation round 19: MHLA and InLine (``mmlinvit/{ops,layers/attention}/{mhla,inline}.py``).

Guards single-change mutants the earlier rounds left alive: the block partition of uneven
grids (row / column edges at ``floor(i * h / gh)``, the module docstring), prefix tokens in a
non-square, per-head-mixed MHLA (prefix keys in every block with weight 1, prefix queries
global), the O(N) path against the explicit map's float64 formula, the local branch's bias,
the documented defaults and validation (eps 1e-6, positive feature maps only), ``extra_repr``
of the public options, and InLine's map when the keys are not the queries (1 / M, M keys).

References are written here in float64 from the published formulas (MHLA's block-mixed map
with its sign-safe normaliser; InLine's A_ij = (s / M) q_i.k_j + (1 / M)(1 - s q_i.kbar)),
block edges worked out by hand, or PyTorch's own ``F.conv2d``; never outputs of the code under
test.
"""
import math
from typing import List, Tuple

import pytest
import torch
import torch.nn.functional as F

from attention_fp64 import assert_close64, project64, qkv64, randomise_, tokens
from mmlinvit.layers.attention import build_attention_operator
from mmlinvit.ops.inline import inline_attention_map
from mmlinvit.ops.mhla import block_token_indices, patch_block_index, token_block_index

C, HEADS = 32, 4  # head_dims 8
D = C // HEADS


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors: one intra-op thread is fastest on the shared cores."""


# ---------------------------------------------------------------------- references
def block_of_axis(n: int, g: int) -> List[int]:
    """Block of each of ``n`` positions for ``g`` blocks with edges ``floor(i * n / g)``:
    the largest i whose edge is <= the position (written with the edges themselves)."""
    edges = [math.floor(i * n / g) for i in range(g)]
    return [max(i for i in range(g) if edges[i] <= y) for y in range(n)]


def block_ids64(hw: Tuple[int, int], grid: Tuple[int, int], prefix: int) -> torch.Tensor:
    """Row-major block id of every token, -1 for the prefix tokens."""
    rows, cols = block_of_axis(hw[0], grid[0]), block_of_axis(hw[1], grid[1])
    ids = [r * grid[1] + c for r in rows for c in cols]
    return torch.tensor([-1] * prefix + ids)


def mhla_map64(q: torch.Tensor, k: torch.Tensor, block_of: torch.Tensor, mixing: torch.Tensor,
               eps_on_sum: float) -> torch.Tensor:
    """MHLA's map in float64: A_ij = w_ij phi(q_i).phi(k_j) / safe(sum_l w_il ...), ReLU phi,
    w_ij = m_{a(i), b(j)} (per head when ``mixing`` is (H, nb, nb)), 1 where i or j is a prefix
    token; ``safe(t) = t + e sign(t)`` with sign(0) = +1."""
    n = block_of.numel()
    if mixing.dim() == 2:
        mixing = mixing[None]
    weights = torch.ones(mixing.shape[0], n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            if block_of[i] >= 0 and block_of[j] >= 0:
                weights[:, i, j] = mixing[:, block_of[i], block_of[j]]
    num = weights * (F.relu(q) @ F.relu(k).transpose(-2, -1))
    den = num.sum(-1, keepdim=True)
    return num / torch.where(den >= 0, den + eps_on_sum, den - eps_on_sum)


# ---------------------------------------------------------------------- block partition
@pytest.mark.parametrize('hw,grid', [((5, 7), (2, 3)), ((7, 3), (3, 2)), ((3, 5), (2, 4))])
def test_uneven_grid_partition_follows_the_floor_edges(hw: Tuple[int, int],
                                                       grid: Tuple[int, int]):
    """Rows of a 5-row grid in 2 blocks: edges 0, floor(5 / 2) = 2, so rows 0-1 / 2-4 (not
    0-2 / 3-4); columns likewise; the per-token ids, the id of the patch grid and the token
    lists of every block (used by the O(N) path) all agree with the edges."""
    prefix = 2
    expected = block_ids64(hw, grid, prefix)
    assert block_of_axis(5, 2) == [0, 0, 1, 1, 1]  # the hand-worked case
    assert torch.equal(patch_block_index(hw, grid), expected[prefix:])
    assert torch.equal(token_block_index(hw, grid, prefix), expected)
    lists = block_token_indices(hw, grid, prefix)
    assert len(lists) == grid[0] * grid[1]
    for b, idx in enumerate(lists):
        assert torch.equal(idx, torch.nonzero(expected == b).flatten()), b


def test_more_blocks_than_rows_leaves_empty_blocks():
    """A 2 x 3 grid split into 3 x 3 blocks: row edges 0, 0, 1 (rows 0 -> block row 1, row 1
    -> block row 2), so block row 0 is empty; its token lists are empty."""
    lists = block_token_indices((2, 3), (3, 3), 0)
    assert [idx.numel() for idx in lists] == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert torch.equal(lists[3], torch.tensor([0]))
    assert torch.equal(lists[8], torch.tensor([5]))


# ---------------------------------------------------------------------- MHLA forward / map
@pytest.mark.parametrize('per_head', [False, True])
def test_mhla_uneven_grid_with_prefix_equals_the_float64_map(per_head: bool):
    """5 x 7 patches, 2 prefix tokens, 2 x 3 blocks (uneven), a learned positive mixing
    (shared or per head), no local branch: the explicit map and the O(N) output equal the
    float64 formula (prefix keys weight 1 in every row, prefix queries read all keys)."""
    hw, grid, prefix = (5, 7), (2, 3), 2
    n = prefix + hw[0] * hw[1]
    op = randomise_(build_attention_operator(
        dict(type='mhla', block_grid=grid, per_head_mixing=per_head, local_kernel_size=0,
             eps=1e-3), C, HEADS)).eval()
    with torch.no_grad():  # asymmetric, positive: well-conditioned rows, transposes visible
        op.block_mixing.abs_().add_(0.05)
    x = tokens((2, n, C))
    q, k, v = qkv64(op, x)
    attn = mhla_map64(q, k, block_ids64(hw, grid, prefix), op.block_mixing.double(), 1e-3 * n)
    with torch.no_grad():
        assert_close64(op.attention_map(x, hw, prefix), attn, tol=2e-5)
        assert_close64(op(x, hw, prefix), project64(op, attn @ v), tol=2e-5)


def test_mhla_local_branch_has_its_bias_and_none_without_it():
    """The local branch is ``nn.Conv2d(C, C, 5, padding=2, groups=C)`` *with* bias (public
    ``lepe``), zero on the prefix token; ``local_kernel_size=0`` has no branch and no
    reference term.  Reference: PyTorch's ``F.conv2d`` on V's grid in float64."""
    hw, prefix = (3, 4), 1
    op = randomise_(build_attention_operator('mhla', C, HEADS)).eval()
    assert op.local_conv.bias is not None and op.local_conv.bias.shape == (C, )
    x = tokens((2, prefix + 12, C))
    _, _, v = qkv64(op, x)
    grid = v[:, :, prefix:].transpose(1, 2).reshape(2, 12, C).transpose(1, 2).reshape(2, C, *hw)
    conv = F.conv2d(grid, op.local_conv.weight.double(), op.local_conv.bias.double(), padding=2,
                    groups=C)
    local = conv.flatten(2).reshape(2, HEADS, D, 12).transpose(-2, -1)
    expected = F.pad(local, (0, 0, prefix, 0))
    with torch.no_grad():
        op.block_mixing.abs_().add_(0.05)  # well-conditioned rows
        q, k, _ = qkv64(op, x)
        attn = mhla_map64(q, k, block_ids64(hw, (2, 2), prefix), op.block_mixing.double(),
                          1e-6 * (prefix + 12))
        _, _, v32 = op.split_qkv(x)
        assert_close64(op.local_term_reference(x, v32, hw, prefix), expected)
        assert_close64(op(x, hw, prefix), project64(op, attn @ v + expected), tol=2e-5)
    no_local = build_attention_operator(dict(type='mhla', local_kernel_size=0), C, HEADS)
    assert no_local.local_conv is None
    assert no_local.local_term_reference(x, v32, hw, prefix) is None


def test_mhla_default_eps_and_positive_feature_maps_only():
    """Documented defaults: ``eps=1e-6`` on the mean normaliser, ReLU features, 'softmax'
    init; a feature map that is not positive (identity, or InLine's signed one) is refused."""
    op = build_attention_operator('mhla', C, HEADS)
    assert op.eps == 1e-6 and op.feature_map == 'relu' and op.mixing_init == 'softmax'
    assert op.eps_placement == 'mean' and op.feature_eps == 0.0
    for name in ('identity', 'softmax'):
        with pytest.raises(ValueError, match='MHLA needs a positive feature map'):
            build_attention_operator(dict(type='mhla', feature_map=name), C, HEADS)


def test_mhla_extra_repr_names_the_public_options():
    """``feature_eps`` and a non-default ``eps_placement`` show in the repr; defaults do not."""
    text = build_attention_operator(dict(type='mhla', feature_eps=1e-6, eps_placement='sum'),
                                    C, HEADS).extra_repr()
    assert 'feature_eps=1e-06' in text and "eps_placement='sum'" in text
    plain = build_attention_operator('mhla', C, HEADS).extra_repr()
    assert 'feature_eps' not in plain and 'eps_placement' not in plain


# ---------------------------------------------------------------------- InLine
def test_inline_map_with_fewer_keys_than_queries_uses_one_over_m():
    """InLine's map for N = 6 queries and M = 4 keys: A_ij = (s / M) q_i.k_j
    + (1 / M)(1 - s q_i.kbar), kbar the mean of the M keys; rows sum to 1."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, HEADS, 6, D, generator=gen)
    k = torch.randn(2, HEADS, 4, D, generator=gen)
    s = D**-0.5
    q64, k64 = q.double(), k.double()
    kbar = k64.mean(-2, keepdim=True)
    expected = (s / 4) * q64 @ k64.transpose(-2, -1) + (1 - s * q64 @ kbar.transpose(-2, -1)) / 4
    got = inline_attention_map(q, k, s)
    assert got.shape == (2, HEADS, 6, 4)
    assert_close64(got, expected)
    assert_close64(got.sum(-1), torch.ones(2, HEADS, 6, dtype=torch.float64))


def test_inline_local_term_reference_only_with_the_local_residual():
    """Without ``local_residual`` InLine has no local term (``None``) and ``forward_reference``
    is the map times V; with it, the reference local term is non-zero on patches only."""
    hw, prefix = (2, 3), 1
    x = tokens((1, prefix + 6, C))
    plain = randomise_(build_attention_operator('inline', C, HEADS)).eval()
    _, _, v = plain.split_qkv(x)
    assert plain.local_term_reference(x, v, hw, prefix) is None
    local = randomise_(build_attention_operator(dict(type='inline', local_residual=True), C,
                                                HEADS)).eval()
    with torch.no_grad():
        _, _, v = local.split_qkv(x)
        term = local.local_term_reference(x, v, hw, prefix)
    assert term.shape == (1, HEADS, prefix + 6, D)
    assert torch.equal(term[:, :, :prefix], torch.zeros(1, HEADS, prefix, D))
    assert term[:, :, prefix:].abs().min() > 0


# ---------------------------------------------------------------------- findings
@pytest.mark.parametrize('block_grid', [(2.7, 2), 2.5, True, (True, 2), '22'])
def test_mhla_non_integer_block_grid_is_refused(block_grid):
    """FINDING (fails on the original ``layers/attention/mhla.py``): ``block_grid`` must be a
    positive int or two of them.  The original truncated ``(2.7, 2)`` to a 2 x 2 grid and read
    the string ``'22'`` as (2, 2) and ``True`` as 1 x 1, silently, and ``2.5`` failed with
    "'float' object is not iterable"; now a ValueError naming ``block_grid``."""
    with pytest.raises(ValueError, match='block_grid must be a positive int or'):
        build_attention_operator(dict(type='mhla', block_grid=block_grid), C, HEADS)


def test_mhla_per_head_mixing_must_be_a_bool():
    """FINDING (fails on the original ``layers/attention/mhla.py``): ``per_head_mixing='no'``
    built one mixing matrix per head (a truthy string), silently; ``input_norm`` and ``qk_norm``
    were already checked to be True / False.  Now the same ValueError; the bools still work."""
    with pytest.raises(ValueError, match='MHLA option per_head_mixing must be True or False'):
        build_attention_operator(dict(type='mhla', per_head_mixing='no'), C, HEADS)
    for flag, shape in ((False, (4, 4)), (True, (HEADS, 4, 4))):
        op = build_attention_operator(dict(type='mhla', per_head_mixing=flag), C, HEADS)
        assert tuple(op.block_mixing.shape) == shape
