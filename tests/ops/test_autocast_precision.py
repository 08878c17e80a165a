"""The torch token-mixing paths keep fp32 math under ``torch.autocast`` (``--amp``, CPU bf16 /
fp16 inference), as their docstrings say: autocast lowers matmul-like ops to 16 bits even on
``.float()`` inputs, which made InLine's ``1 - s q.kbar`` cancel in bf16 (0.1-0.7 relative
error at 16k tokens with trained-ViT activations), MHLA's fp16 block sums overflow to inf at
high resolution, and rounded Hedgehog logits, identity-map and TTT inner sums.

Each case compares the output under autocast with the same call without it, on the same fp32
inputs: with the guard they are equal (the math is the same); the sizes are chosen so that the
16-bit math is far off (measured on the unguarded code: errors of 1e-2 to inf).
"""
import pytest
import torch

from mmlinvit.layers.attention.ttt import TestTimeTrainingAttention
from mmlinvit.ops.feature_maps import hedgehog_feature
from mmlinvit.ops.identity_attention import identity_linear_attention
from mmlinvit.ops.linear_attention import inline_attention_torch
from mmlinvit.ops.mhla import block_centre_mixing, block_token_indices, mhla_attention

AUTOCAST_DTYPES = [torch.bfloat16, torch.float16]


def _tokens(n: int, d: int, shift: float, scale: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 2, n, d, generator=gen) + shift) * scale


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _under_autocast(dtype, fn, *args):
    with torch.autocast('cpu', dtype=dtype):
        return fn(*args)


@pytest.mark.parametrize('dtype', AUTOCAST_DTYPES)
def test_inline_keeps_fp32_under_autocast(dtype):
    # large q / k with a shared mean: s q.kbar ~ 1e2, so 1 - s q.kbar cancels
    q, k = _tokens(512, 64, 1.0, 10.0, 0), _tokens(512, 64, 1.0, 10.0, 1)
    v = _tokens(512, 64, 0.5, 1.0, 2)
    want = inline_attention_torch(q, k, v, 64**-0.5)
    got = _under_autocast(dtype, inline_attention_torch, q, k, v, 64**-0.5)
    assert got.dtype == torch.float32
    assert _rel(got, want) < 1e-6


@pytest.mark.parametrize('dtype', AUTOCAST_DTYPES)
def test_mhla_block_sums_stay_finite_and_exact_under_autocast(dtype):
    # 64 x 64 grid in 2 x 2 blocks of 1024 tokens; relu(k) ~ 40, v ~ 2: each block's
    # sum of phi(k) [v, 1] is ~8e4 > 65504, the fp16 maximum
    grid = (64, 64)
    n = grid[0] * grid[1]
    phi_q = torch.relu(_tokens(n, 16, 40.0, 1.0, 0))
    phi_k = torch.relu(_tokens(n, 16, 40.0, 1.0, 1))
    v = _tokens(n, 16, 2.0, 1.0, 2)
    blocks = block_token_indices(grid, (2, 2), 0)
    mixing = block_centre_mixing((2, 2))[None]
    want = mhla_attention(phi_q, phi_k, v, blocks, 0, mixing, 1e-6)
    got = _under_autocast(dtype, mhla_attention, phi_q, phi_k, v, blocks, 0, mixing, 1e-6)
    assert torch.isfinite(got).all()
    assert _rel(got, want) < 1e-6


@pytest.mark.parametrize('dtype', AUTOCAST_DTYPES)
def test_hedgehog_logits_stay_fp32_under_autocast(dtype):
    x = _tokens(256, 32, 0.0, 10.0, 0)
    weight = torch.randn(2, 32, 16, generator=torch.Generator().manual_seed(3))
    want = hedgehog_feature(x, weight)
    got = _under_autocast(dtype, hedgehog_feature, x, weight)
    assert got.dtype == torch.float32 and _rel(got, want) < 1e-6


@pytest.mark.parametrize('dtype', AUTOCAST_DTYPES)
def test_identity_map_attention_keeps_fp32_under_autocast(dtype):
    q, k = _tokens(4096, 32, 1.0, 10.0, 0), _tokens(4096, 32, 1.0, 10.0, 1)
    v = _tokens(4096, 32, 3.0, 10.0, 2)
    want = identity_linear_attention(q, k, v, 1e-6)
    got = _under_autocast(dtype, identity_linear_attention, q, k, v, 1e-6)
    assert torch.isfinite(got).all() and _rel(got, want) < 1e-6


@pytest.mark.parametrize('dtype', AUTOCAST_DTYPES)
def test_ttt_inner_steps_keep_fp32_under_autocast(dtype):
    torch.manual_seed(0)
    layer = TestTimeTrainingAttention(64, 2).eval()
    grid = (16, 16)
    q, k, v = (_tokens(grid[0] * grid[1], 32, 0.5, 3.0, s) for s in range(3))
    with torch.no_grad():
        want = layer.mix(q, k, v, grid, 0)
        got = _under_autocast(dtype, layer.mix, q, k, v, grid, 0)
        x = torch.randn(2, grid[0] * grid[1], 64)
        want_conv = layer.conv_branch_output(x, grid, 0)
        # the conv_qkv projection itself may run in 16 bits; the inner step must not
        got_conv = _under_autocast(dtype, layer.conv_branch_output, x, grid, 0)
    assert _rel(got, want) < 1e-6
    assert _rel(got_conv, want_conv) < 2e-2


def test_inline_fp32_with_large_shared_means_matches_fp64():
    """InLine's s q S + (1 - s q.kbar) vbar cancels when q.kbar is large (trained ViTs): the
    centred state keeps fp32 at 1.8e-6 (3.1e-5 in the cancelling form) against fp64."""
    q, k = _tokens(4096, 64, 1.0, 10.0, 0), _tokens(4096, 64, 1.0, 10.0, 1)
    v = _tokens(4096, 64, 0.5, 1.0, 2)
    s = 64**-0.5
    qd, kd, vd = q.double(), k.double(), v.double()
    ref = (s * qd @ (kd.transpose(-1, -2) @ vd / 4096) +
           (1 - s * qd @ kd.mean(-2).unsqueeze(-1)) * vd.mean(-2, keepdim=True))
    assert _rel(inline_attention_torch(q, k, v, s).double(), ref) < 5e-6


# ---------------------------------------------------------------- explicit attention maps
# ``attention_map()`` is what ``AttentionMapsRecorder`` records for ``AttentionMapLoss``,
# which runs inside autocast under ``--amp``.  Unguarded, the ELU+1 map's fp16 row sums
# overflowed at N = 1025 (88 % of rows exactly 0, the map loss 3,400x too large) and bf16
# scores lost the map's q-gradient (13-26 % off): measured on the code before the guard.
MAP_OPERATORS = [dict(type='softmax'), dict(type='elu'), dict(type='relu'),
                 dict(type='hedgehog', feature_dims=16), dict(type='inline'),
                 dict(type='mhla', block_grid=(2, 2)), dict(type='identity')]


@pytest.mark.parametrize('cfg', MAP_OPERATORS, ids=lambda c: c['type'])
@pytest.mark.parametrize('dtype', AUTOCAST_DTYPES)
def test_attention_maps_are_fp32_under_autocast(cfg, dtype):
    from mmlinvit.layers.attention import build_attention_operator
    side, channels, heads = 32, 64, 2
    op = build_attention_operator(dict(cfg), channels, heads).eval()
    x = torch.randn(1, side * side + 1, channels, generator=torch.Generator().manual_seed(0))
    with torch.autocast('cpu', dtype=dtype):
        q, k, _ = op.split_qkv(x)  # the projections stay in the autocast dtype, as in forward
        got = op.attention_map(x, (side, side), 1)
    want = op.map_from_qk(q.float(), k.float(), (side, side), 1)  # autocast off
    assert got.dtype == torch.float32
    assert torch.isfinite(got).all()
    assert _rel(got, want) < 1e-6


def test_elu_map_rows_do_not_overflow_in_fp16():
    from mmlinvit.layers.attention import build_attention_operator
    side, channels, heads = 32, 128, 2  # N = 1025 tokens, head dim 64
    op = build_attention_operator('elu', channels, heads).eval()
    x = torch.randn(1, side * side + 1, channels, generator=torch.Generator().manual_seed(0))
    with torch.autocast('cpu', dtype=torch.float16):
        rows = op.attention_map(x, (side, side), 1).sum(-1)
    assert torch.allclose(rows, torch.ones_like(rows), atol=1e-4)


@pytest.mark.parametrize('dtype', AUTOCAST_DTYPES)
def test_map_functions_keep_fp32_under_autocast(dtype):
    from mmlinvit.ops.identity_attention import identity_linear_attention_map
    from mmlinvit.ops.inline import inline_attention_map
    from mmlinvit.ops.linear_attention.naive import linear_attention_map_naive
    from mmlinvit.ops.mhla import mhla_attention_map, token_block_index
    q, k = _tokens(1024, 64, 0.5, 1.0, 0), _tokens(1024, 64, 0.5, 1.0, 1)
    blocks = token_block_index((32, 32), (2, 2), 0, q.device)
    mixing = block_centre_mixing((2, 2))[None]
    calls = [(linear_attention_map_naive, (q, k, 'elu', 1e-6)),
             (inline_attention_map, (q, k, 64**-0.5)),
             (identity_linear_attention_map, (q, k, 1e-6)),
             (mhla_attention_map, (torch.relu(q), torch.relu(k), blocks, mixing, 1e-6))]
    for fn, args in calls:
        want = fn(*args)
        got = _under_autocast(dtype, fn, *args)
        assert got.dtype == torch.float32, fn.__name__
        assert _rel(got, want) < 1e-6, fn.__name__
