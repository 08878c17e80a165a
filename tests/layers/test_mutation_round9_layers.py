"""Mutation round 9: the attention layers and transformer building blocks against formulas.

Written for single-change mutants of ``mmlinvit/layers`` that the other tests missed (session
15, round 9): dropout placement in the operators (TTT's two branches too) and the block, the
bias flags, the kernel / identity / Hedgehog operators' ``eps`` and q / k roles, Hedgehog's
kaiming init, MHLA's mixing init (``mixing_tau``) and public norms, TTT's conv branch
(``inner_lr``, ``qkv_bias``), the pre-norm block's ``norm_eps`` and layer scales, DropPath's keep
probability, position-embedding resampling, patch padding, RMS norms and the ``with_cp`` rule.
The references are written out here in float64 from the published formulas (timm attention,
kernel linear attention, Hedgehog's feature map, ViT^3's inner step, Keys' cubic / PIL's
antialiased cubic, LayerNorm, Mamba-2's gated RMSNorm); the block tests call the operator
itself only for the attention term, which the operator tests check.
"""
import math
from typing import Tuple

import pytest
import torch
import torch.nn.functional as F

from mmlinvit.layers import TransformerBlock
from mmlinvit.layers.attention import build_attention_operator
from mmlinvit.layers.checkpointing import checkpoint_active
from mmlinvit.layers.norm import GatedRMSNorm, RMSNorm
from mmlinvit.layers.patch_embed import PatchEmbed, patch_grid
from mmlinvit.layers.pos_embed import (POS_GRID_RECORD, POS_INTERP_MODES, recorded_pos_grid,
                                       resample_pos_grid)
from attention_fp64 import (assert_close64, heads64, project64, qkv64, randomise_,
                            tokens)
from mmlinvit.layers.transformer import DropPath, Mlp

C, HEADS = 32, 4  # head_dims 8
D = C // HEADS


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors: one intra-op thread is fastest on the shared cores."""


# ---------------------------------------------------------------------- fp64 references
# ---------------------------------------------------------------------- base / softmax
@pytest.mark.parametrize('qkv_bias,proj_bias', [(True, True), (False, False), (True, False)])
def test_softmax_operator_is_scaled_dot_product_attention(qkv_bias: bool, proj_bias: bool):
    """timm's Attention: proj(softmax(q k^T / sqrt(d)) v), q, k, v the three C-row blocks of
    ``qkv``; the bias flags remove the biases; the map is the softmax of the scaled scores."""
    op = build_attention_operator('softmax', C, HEADS, qkv_bias=qkv_bias,
                                  proj_bias=proj_bias).eval()
    randomise_(op)
    assert (op.qkv.bias is None) == (not qkv_bias)
    assert (op.proj.bias is None) == (not proj_bias)
    x = tokens((2, 7, C))
    q, k, v = qkv64(op, x)
    attn = (q @ k.transpose(-2, -1) / D**0.5).softmax(dim=-1)
    with torch.no_grad():
        assert_close64(op(x), project64(op, attn @ v))
        assert_close64(op.attention_map(x), attn)


@pytest.mark.parametrize('cfg', ['softmax', 'elu', 'inline', 'mhla', 'ttt'])
def test_attention_dropout_acts_before_the_output_projection(cfg: str):
    """``attn_drop`` drops the mixed tokens (every branch of TTT too; softmax: every
    probability) before ``proj``: with p = 1 the training output is ``proj``'s bias alone;
    ``proj_drop`` p = 1 gives zeros."""
    x = tokens((2, 1 + 3 * 4, C))
    op = randomise_(build_attention_operator(cfg, C, HEADS, attn_drop=1.0)).train()
    with torch.no_grad():
        out = op(x, (3, 4), 1)
    torch.testing.assert_close(out, op.proj.bias.detach().expand_as(out))
    op = randomise_(build_attention_operator(cfg, C, HEADS, proj_drop=1.0)).train()
    with torch.no_grad():
        assert op(x, (3, 4), 1).abs().max() == 0


def test_softmax_attention_dropout_drops_probabilities_as_timm():
    """Softmax ``attn_drop`` acts on the attention probabilities (timm / mmpretrain, SDPA's
    ``dropout_p``), not on the output: with v = 1 in every channel, each query's output in a
    head is (sum of its kept probabilities) / (1 - p), the same in all d channels of that
    head; output dropout would zero channels one by one.  Evaluation keeps every token."""
    op = build_attention_operator('softmax', C, HEADS, attn_drop=0.5)
    randomise_(op)
    with torch.no_grad():
        op.qkv.weight[2 * C:].zero_()
        op.qkv.bias[2 * C:].fill_(1.0)  # v = 1
        op.proj.weight.copy_(torch.eye(C))
        op.proj.bias.zero_()
    x = tokens((2, 40, C))
    torch.manual_seed(0)
    with torch.no_grad():
        out = op.train()(x).reshape(2, 40, HEADS, D)
        torch.testing.assert_close(out, out[..., :1].expand_as(out))  # equal across channels
        values = out[..., 0]
        assert not torch.isin(values, torch.tensor([0.0, 2.0])).all()  # sums, not 0 or 1/(1-p)
        assert abs(values.mean().item() - 1.0) < 0.1  # unbiased
        torch.testing.assert_close(op.eval()(x), torch.ones(2, 40, C))


# ---------------------------------------------------------------------- kernel operators
@pytest.mark.parametrize('name,phi', [('elu', lambda t: F.elu(t) + 1), ('relu', F.relu)])
def test_fixed_map_operators_use_their_eps(name: str, phi):
    """out_i = phi(q_i) S / (phi(q_i) z + eps), S = phi(K)^T V / N, z = mean phi(K), with the
    operator's own ``eps`` (0.3 here, large enough to matter)."""
    op = randomise_(build_attention_operator(dict(type=name, eps=0.3, backend='torch'),
                                             C, HEADS)).eval()
    x = tokens((2, 9, C))
    q, k, v = qkv64(op, x)
    fq, fk = phi(q), phi(k)
    n = x.shape[1]
    s = fk.transpose(-2, -1) @ v / n
    z = fk.mean(dim=-2, keepdim=True).transpose(-2, -1)
    expected = (fq @ s) / (fq @ z + 0.3)
    with torch.no_grad():
        assert_close64(op(x), project64(op, expected))


@pytest.mark.parametrize('eps', [1e-6, 0.5])
def test_identity_operator_queries_read_the_key_summaries(eps: float):
    """Identity map: out_i = q_i (K^T V / N) / safe(q_i . kbar), safe(t) = t + eps sign(t),
    with the operator's ``eps``; q and k come from different weights here (their roles differ)."""
    op = randomise_(build_attention_operator(dict(type='identity', eps=eps), C, HEADS)).eval()
    x = tokens((2, 9, C)) + 2.0
    q, k, v = qkv64(op, x)
    n = x.shape[1]
    den = q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1)
    assert den.abs().min() > 1e-2  # well-conditioned rows for a 1e-4 comparison
    expected = (q @ (k.transpose(-2, -1) @ v / n)) / (den + eps * torch.where(den >= 0, 1, -1))
    with torch.no_grad():
        assert_close64(op(x), project64(op, expected), tol=1e-4)


@pytest.mark.parametrize('share', [False, True])
def test_hedgehog_operator_equals_the_feature_map_formula(share: bool):
    """Hedgehog / LoLCATS: phi(x) = [softmax(x W), softmax(-x W)] per head (queries with
    ``feature_q``, keys with ``feature_k`` unless shared), then kernel linear attention
    phi(q_i) S / (phi(q_i) z + eps) with the operator's ``eps`` (0.2 here)."""
    op = randomise_(build_attention_operator(
        dict(type='hedgehog', feature_dims=5, share_feature_map=share, eps=0.2,
             backend='torch'), C, HEADS), std=0.5).eval()
    x = tokens((2, 9, C))
    q, k, v = qkv64(op, x)

    def phi(t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        logits = t @ weight.double()  # (B, H, N, d) @ (H, d, F)
        return torch.cat([logits.softmax(-1), (-logits).softmax(-1)], dim=-1)

    fq = phi(q, op.feature_q)
    fk = phi(k, op.feature_q if share else op.feature_k)
    n = x.shape[1]
    expected = (fq @ (fk.transpose(-2, -1) @ v / n)) / (
        fq @ fk.mean(dim=-2, keepdim=True).transpose(-2, -1) + 0.2)
    with torch.no_grad():
        assert_close64(op(x), project64(op, expected))


def test_hedgehog_kaiming_init_has_the_kaiming_bound():
    """``feature_init='kaiming_uniform'`` (LoLCATS' released configs): U(-b, b) with
    b = sqrt(6 / fan_in), fan_in = head_dims * feature_dims for the (H, d, F) weight."""
    op = build_attention_operator(dict(type='hedgehog', feature_dims=8,
                                       feature_init='kaiming_uniform'), C, HEADS)
    bound = (6 / (D * 8))**0.5
    for weight in (op.feature_q, op.feature_k):
        assert 0.9 * bound < weight.abs().max().item() <= bound


# ---------------------------------------------------------------------- MHLA
def centre_distance_softmax(block_grid: Tuple[int, int], tau: float) -> torch.Tensor:
    """m_ab = softmax_b(-|c_a - c_b| / tau), block centres (row + 0.5, col + 0.5), row-major."""
    gh, gw = block_grid
    centres = torch.tensor([(r + 0.5, c + 0.5) for r in range(gh) for c in range(gw)],
                           dtype=torch.float64)
    dist = (centres[:, None] - centres[None]).pow(2).sum(-1).sqrt()
    return (-dist / tau).softmax(dim=-1)


@pytest.mark.parametrize('block_grid,expected_grid', [(2, (2, 2)), (3, (3, 3)), ((2, 3), (2, 3))])
@pytest.mark.parametrize('tau', [1.0, 0.4])
def test_mhla_block_mixing_init_follows_grid_and_tau(block_grid, expected_grid, tau: float):
    """An int ``block_grid`` n is n x n; the default init is the centre-distance softmax at
    ``mixing_tau`` (row a: query block, column b: key block)."""
    op = build_attention_operator(dict(type='mhla', block_grid=block_grid, mixing_tau=tau),
                                  C, HEADS)
    assert op.block_grid == expected_grid
    assert_close64(op.block_mixing.detach(), centre_distance_softmax(expected_grid, tau))


def test_mhla_input_norm_and_qk_norm_are_the_public_norms():
    """``input_norm``: LayerNorm(C) (eps 1e-5, affine) before ``qkv``; ``qk_norm``: RMSNorm over
    all C channels of q (``q_norm.weight``) and of k (``k_norm.weight``), eps = fp32 machine
    eps, before the head split.  Tokens with a small spread make the LayerNorm eps visible."""
    op = randomise_(build_attention_operator(dict(type='mhla', input_norm=True, qk_norm=True),
                                             C, HEADS))
    x = 3e-3 * tokens((2, 6, C))
    x64 = x.double()
    mu = x64.mean(-1, keepdim=True)
    var = (x64 - mu).pow(2).mean(-1, keepdim=True)
    normed = ((x64 - mu) / (var + 1e-5).sqrt() * op.input_norm.weight.double()
              + op.input_norm.bias.double())
    q, k, v = (normed @ op.qkv.weight.double().T + op.qkv.bias.double()).split(C, dim=-1)
    eps = torch.finfo(torch.float32).eps

    def rms(t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return t / (t.pow(2).mean(-1, keepdim=True) + eps).sqrt() * weight.double()

    expected = (rms(q, op.q_norm.weight), rms(k, op.k_norm.weight), v)
    with torch.no_grad():
        got = op.split_qkv(x)
    for actual, reference in zip(got, expected):
        assert_close64(actual, heads64(reference, HEADS), tol=1e-4)


# ---------------------------------------------------------------------- block pieces
def test_drop_path_keeps_each_sample_with_the_keep_probability():
    """timm DropPath(p): a sample survives with probability 1 - p (4000 draws, p = 0.25)."""
    drop = DropPath(0.25).train()
    torch.manual_seed(0)
    out = drop(torch.ones(4000, 2, 3))
    kept = (out[:, 0, 0] != 0).double().mean().item()
    assert abs(kept - 0.75) < 0.03, kept


def test_mlp_drops_after_the_activation_and_after_fc2():
    """timm Mlp: fc1 -> act -> dropout -> fc2 -> dropout (the same seeded draws in order)."""
    mlp = randomise_(Mlp(C, 2 * C, drop=0.5)).train()
    x = tokens((2, 5, C))
    torch.manual_seed(3)
    out = mlp(x)
    torch.manual_seed(3)
    hidden = F.dropout(F.gelu(x @ mlp.fc1.weight.T + mlp.fc1.bias), 0.5, training=True)
    expected = F.dropout(hidden @ mlp.fc2.weight.T + mlp.fc2.bias, 0.5, training=True)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize('mlp_type', ['mlp', 'swiglu'])
def test_block_drop_rate_reaches_attention_projection_and_mlp(mlp_type: str):
    """``drop_rate`` is the attention ``proj_drop`` and the MLP dropout: at 1.0 both residual
    branches are zero in training, so the block returns its input."""
    blk = randomise_(TransformerBlock(C, HEADS, 2 * C, attn_cfg='elu', mlp_type=mlp_type,
                                      drop_rate=1.0)).train()
    x = tokens((2, 6, C))
    with torch.no_grad():
        torch.testing.assert_close(blk(x), x)


def layer_norm64(x: torch.Tensor, norm: torch.nn.LayerNorm, eps: float) -> torch.Tensor:
    """LayerNorm over the last dim in float64 with ``norm``'s affine parameters and ``eps``."""
    x = x.double()
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    return (x - mu) / (var + eps).sqrt() * norm.weight.double() + norm.bias.double()


def test_block_is_pre_norm_with_its_eps_and_both_layer_scales():
    """x' = x + g1 * attn(LN1(x)); out = x' + g2 * fc2(gelu(fc1(LN2(x')))), LayerNorms with
    ``norm_eps`` (0.05 here: visible), ``g1`` / ``g2`` the two LayerScale vectors."""
    blk = randomise_(TransformerBlock(C, HEADS, 2 * C, attn_cfg='elu', norm_eps=0.05,
                                      layer_scale_init=0.5)).eval()
    x = tokens((2, 6, C))
    with torch.no_grad():
        attn = blk.attn(layer_norm64(x, blk.norm1, 0.05).float()).double()
        mid = x.double() + blk.ls1.gamma.double() * attn
        hidden = F.gelu(layer_norm64(mid, blk.norm2, 0.05) @ blk.mlp.fc1.weight.double().T
                        + blk.mlp.fc1.bias.double())
        mlp = hidden @ blk.mlp.fc2.weight.double().T + blk.mlp.fc2.bias.double()
        assert_close64(blk(x), mid + blk.ls2.gamma.double() * mlp, tol=1e-4)


def test_forward_attn_applies_pre_attention_and_optional_layer_scale():
    """``forward_attn`` = attn(norm1(x + cpe(x))) for TTT (cpe: 3 x 3 depthwise conv with bias
    on the patch grid, prefix token unchanged), times ``ls1.gamma`` with ``with_layer_scale``."""
    blk = randomise_(TransformerBlock(C, HEADS, 2 * C, attn_cfg='ttt',
                                      layer_scale_init=0.5)).eval()
    hw, prefix = (3, 4), 1
    x = tokens((2, prefix + 12, C))
    grid = x[:, prefix:].double().reshape(2, 3, 4, C).permute(0, 3, 1, 2)
    pad = F.pad(grid, (1, 1, 1, 1))
    weight = blk.attn.cpe.weight.double().reshape(C, 3, 3)
    conv = sum(pad[:, :, i:i + 3, j:j + 4] * weight[:, i, j].view(1, C, 1, 1)
               for i in range(3) for j in range(3)) + blk.attn.cpe.bias.double().view(1, C, 1, 1)
    shifted = x.double() + F.pad(conv.flatten(2).transpose(1, 2), (0, 0, prefix, 0))
    with torch.no_grad():
        expected = blk.attn(blk.norm1(shifted.float()), hw, prefix).double()
        assert_close64(blk.forward_attn(x, hw, prefix), expected)
        assert_close64(blk.forward_attn(x, hw, prefix, with_layer_scale=True),
                       expected * blk.ls1.gamma.double())


# ---------------------------------------------------------------------- position embeddings
def keys_cubic(t: float, a: float) -> float:
    """Keys' cubic convolution kernel with parameter ``a``."""
    t = abs(t)
    if t <= 1:
        return (a + 2) * t**3 - (a + 3) * t**2 + 1
    if t < 2:
        return a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a
    return 0.0


def bicubic_matrix(n_in: int, n_out: int, src_per_dst: float) -> torch.Tensor:
    """(n_out, n_in) weights of align_corners=False bicubic (a = -0.75, edge taps clamped):
    output i reads source coordinate (i + 0.5) * src_per_dst - 0.5."""
    w = torch.zeros(n_out, n_in, dtype=torch.float64)
    for i in range(n_out):
        src = (i + 0.5) * src_per_dst - 0.5
        f = math.floor(src)
        for m in range(-1, 3):
            w[i, min(max(f + m, 0), n_in - 1)] += keys_cubic(m - (src - f), -0.75)
    return w


def antialiased_cubic_matrix(n_in: int, n_out: int) -> torch.Tensor:
    """(n_out, n_in) weights of PIL's antialiased cubic (a = -0.5, support stretched by
    max(n_in / n_out, 1), each row normalised to sum 1)."""
    scale = n_in / n_out
    stretch = max(scale, 1.0)
    w = torch.tensor([[keys_cubic((j + 0.5 - (i + 0.5) * scale) / stretch, -0.5)
                       for j in range(n_in)] for i in range(n_out)], dtype=torch.float64)
    return w / w.sum(dim=1, keepdim=True)


@pytest.mark.parametrize('mode', ['bicubic', 'bicubic_antialias', 'dinov2', 'dinov2_reg'])
@pytest.mark.parametrize('src_hw,dst_hw', [((3, 5), (6, 4)), ((4, 6), (3, 9))])
def test_resample_pos_grid_equals_separable_cubic_formula(mode: str, src_hw, dst_hw):
    """Each mode's documented convention on non-square grids (row-major tokens): plain bicubic
    (``size=``), antialiased cubic (timm, DINOv2 with registers) and DINOv2's
    ``scale_factor=(h + 0.1) / H`` (the source step is H / (h + 0.1), not H / h)."""
    c = 3
    pos = tokens((1, src_hw[0] * src_hw[1], c))
    grid = pos.double().reshape(src_hw[0], src_hw[1], c)
    if mode == 'bicubic':
        rows, cols = (bicubic_matrix(s, d, s / d) for s, d in zip(src_hw, dst_hw))
    elif mode == 'dinov2':
        rows, cols = (bicubic_matrix(s, d, s / (d + 0.1)) for s, d in zip(src_hw, dst_hw))
    else:
        rows, cols = (antialiased_cubic_matrix(s, d) for s, d in zip(src_hw, dst_hw))
    expected = torch.einsum('ih,jw,hwc->ijc', rows, cols, grid).reshape(1, -1, c)
    assert_close64(resample_pos_grid(pos, src_hw, dst_hw, mode), expected)


@pytest.mark.parametrize('mode', POS_INTERP_MODES)
def test_resample_pos_grid_is_the_identity_on_the_native_grid(mode: str):
    """Every convention returns the learned grid unchanged at its own size (DINOv2's
    ``interpolate_pos_encoding`` returns early too, before its 0.1 offset)."""
    pos = tokens((1, 12, 4))
    assert resample_pos_grid(pos, (3, 4), (3, 4), mode) is pos


def test_malformed_pos_grid_record_is_ignored():
    """A record that is not exactly two numbers is no record (``None``)."""
    for value in (torch.tensor([4, 4, 4]), torch.tensor([16]), [4, 4]):
        assert recorded_pos_grid({POS_GRID_RECORD: value}) is None
    assert recorded_pos_grid({'b.' + POS_GRID_RECORD: torch.tensor([[2, 8]])}, 'b.') == (2, 8)


# ---------------------------------------------------------------------- patch embedding
@pytest.mark.parametrize('hw', [(5, 7), (4, 6), (7, 4)])
def test_patch_embed_pads_bottom_right_and_patchifies_row_major(hw):
    """Token (r, c) = sum of W * pixels of rows [p r, p r + p) and columns [p c, p c + p) of the
    image zero-padded at the bottom / right to multiples of p, plus the bias; grid
    (ceil(H / p), ceil(W / p)), tokens row-major."""
    p, cin, dims = 2, 3, 5
    embed = randomise_(PatchEmbed(cin, dims, p))
    img = tokens((2, cin, *hw))
    grid = (-(-hw[0] // p), -(-hw[1] // p))
    padded = torch.zeros(2, cin, grid[0] * p, grid[1] * p, dtype=torch.float64)
    padded[:, :, :hw[0], :hw[1]] = img.double()
    patches = padded.reshape(2, cin, grid[0], p, grid[1], p).permute(0, 2, 4, 1, 3, 5)
    weight = embed.proj.weight.double()  # (dims, cin, p, p)
    expected = torch.einsum('brsiyx,oiyx->brso', patches, weight) + embed.proj.bias.double()
    with torch.no_grad():
        out, out_hw = embed(img)
    assert tuple(out_hw) == grid == patch_grid(hw, p)
    assert_close64(out, expected.reshape(2, grid[0] * grid[1], dims))


# ---------------------------------------------------------------------- RMS norms
def rms64(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim in float64."""
    x = x.double()
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


@pytest.mark.parametrize('eps', [1e-5, 1e-2])
def test_rms_norm_uses_its_eps(eps: float):
    """y = x / sqrt(mean(x^2) + eps) * weight; small tokens make eps visible."""
    norm = randomise_(RMSNorm(16, eps=eps))
    x = 0.01 * tokens((3, 5, 16))
    with torch.no_grad():
        assert_close64(norm(x), rms64(x, eps) * norm.weight.double())


def test_rms_norm_normalises_low_precision_inputs_in_fp32():
    """bf16 tokens: the output is the exact formula rounded once to bf16 (statistics in fp32);
    normalising in bf16 itself is off by one or more units in the last place in many entries."""
    x = (3 * tokens((64, 256))).bfloat16()
    expected = rms64(x, 1e-5).bfloat16()
    out = RMSNorm(256)(x)
    assert out.dtype == torch.bfloat16
    mismatch = (out != expected).double().mean().item()
    assert mismatch < 0.01, mismatch


@pytest.mark.parametrize('norm_before_gate', [False, True])
@pytest.mark.parametrize('consume', [False, True])
def test_gated_rms_norm_equals_the_mamba2_formula(norm_before_gate: bool, consume: bool):
    """Mamba-2 RMSNormGated: rmsnorm(x * silu(z)) * w (``norm_before_gate=False``) or
    rmsnorm(x) * w * silu(z), normalised per group of 4 channels, eps 0.01; ``consume`` (the
    in-place path, 600 rows: more than one CPU chunk) gives the same values."""
    norm = randomise_(GatedRMSNorm(16, eps=1e-2, group_size=4, norm_before_gate=norm_before_gate))
    x, z = 0.1 * tokens((2, 300, 16), seed=1), tokens((2, 300, 16), seed=2)
    gate = F.silu(z.double())
    w = norm.weight.double()
    if norm_before_gate:
        expected = rms64(x.reshape(2, 300, 4, 4), 1e-2).reshape(2, 300, 16) * w * gate
    else:
        expected = rms64((x.double() * gate).reshape(2, 300, 4, 4), 1e-2).reshape(2, 300, 16) * w
    with torch.no_grad():
        out = norm(x.clone(), z.clone(), consume=consume)
    assert_close64(out, expected)


def test_gated_rms_norm_consume_is_ignored_under_autograd():
    """With autograd on, ``consume=True`` must leave the caller's tensors alone and give the
    formula's value and gradient."""
    norm = randomise_(GatedRMSNorm(8, eps=1e-5))
    x = tokens((3, 8)).requires_grad_(True)
    z = tokens((3, 8), seed=2)
    x_before, z_before = x.detach().clone(), z.clone()
    out = norm(x, z, consume=True)
    out.square().sum().backward()
    assert torch.equal(x.detach(), x_before) and torch.equal(z, z_before)
    x64 = x_before.double().requires_grad_(True)
    ref = rms64(x64 * F.silu(z.double()), 1e-5) * norm.weight.double()
    ref.square().sum().backward()
    assert_close64(out.detach(), ref.detach())
    assert_close64(x.grad, x64.grad)


# ---------------------------------------------------------------------- with_cp rule
def test_checkpoint_active_truth_table():
    """Checkpoint only with ``with_cp``, in training, with autograd on, and only where the
    block has a trainable parameter or its input carries a gradient."""
    block = torch.nn.Linear(4, 4).train()
    x = torch.randn(2, 4)
    x_grad = torch.randn(2, 4, requires_grad=True)
    assert checkpoint_active(block, x, True)
    assert not checkpoint_active(block, x, False)
    with torch.no_grad():
        assert not checkpoint_active(block, x_grad, True)
    assert not checkpoint_active(block.eval(), x_grad, True)
    block.train().requires_grad_(False)
    assert not checkpoint_active(block, x, True)  # frozen block, no input gradient
    assert checkpoint_active(block, x_grad, True)  # frozen block, gradient flows through it


# ---------------------------------------------------------------------- TTT conv branch
def dwconv3x3_64(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """'Same' zero-padded depthwise cross-correlation, x (B, c, h, w), weight (B, c, 3, 3)."""
    h, w = x.shape[-2:]
    pad = F.pad(x, (1, 1, 1, 1))
    return sum(pad[..., i:i + h, j:j + w] * weight[..., i, j, None, None]
               for i in range(3) for j in range(3))


@pytest.mark.parametrize('qkv_bias', [True, False])
@pytest.mark.parametrize('inner_lr,scale', [(1.0, 9**-0.5), (0.5, 0.25)])
def test_ttt_conv_branch_is_one_closed_form_clipped_step(qkv_bias: bool, inner_lr: float,
                                                         scale: float):
    """ViT^3 branch 2 in closed form: q, k, v = the d-channel blocks of ``conv_qkv`` (bias only
    with ``qkv_bias``) on the patch grid; G_c = -scale / (h w) * corr(k_c, v_c) (3 x 3 lags);
    w' = w - inner_lr * G / (||G_c||_F + 1); out = dwconv(q, w'); prefix rows zero."""
    op = randomise_(build_attention_operator(
        dict(type='ttt', inner_lr=inner_lr, inner_loss_scale=scale), C, HEADS,
        qkv_bias=qkv_bias))
    assert (op.conv_qkv.bias is None) == (not qkv_bias)
    hw, prefix = (3, 4), 1
    x = tokens((2, prefix + 12, C))
    y = x[:, prefix:].double() @ op.conv_qkv.weight.double().T
    if qkv_bias:
        y = y + op.conv_qkv.bias.double()
    q, k, v = (t.transpose(1, 2).reshape(2, D, *hw) for t in y.split(D, dim=-1))
    kpad = F.pad(k, (1, 1, 1, 1))
    corr = torch.stack([torch.stack([(kpad[..., i:i + 3, j:j + 4] * v).sum((-2, -1))
                                     for j in range(3)], -1) for i in range(3)], -2)
    grad = -scale / 12 * corr  # (B, d, 3, 3)
    clipped = grad / (grad.pow(2).sum((-2, -1), keepdim=True).sqrt() + 1)
    w_new = op.conv_inner_weight.double() - inner_lr * clipped
    out = dwconv3x3_64(q, w_new).flatten(2).transpose(1, 2)
    expected = torch.cat([out.new_zeros(2, prefix, D), out], dim=1)
    with torch.no_grad():
        assert_close64(op.conv_branch_output(x, hw, prefix), expected)
