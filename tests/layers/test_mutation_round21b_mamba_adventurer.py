"""Mutation round 21 (second pass): Mamba-2 mixer, Adventurer outside the scan, backbone
outputs, block checkpointing and the transformer block pieces.

Each test fails on a single-line change of ``mmlinvit/layers/mamba2.py``,
``mmlinvit/backbones/adventurer.py``, ``mmlinvit/backbones/outputs.py``,
``mmlinvit/backbones/checkpointing.py`` or ``mmlinvit/layers/transformer.py`` that the rest of
the suite let through.  Guarded here, each against an independent reference:

* the Mamba-2 mixer against a float64 token-by-token recurrence whose hyper-parameters come
  from the test's own config, never from the module under test (the round-9 reference read
  ``mixer.norm.norm_before_gate`` back from the module, so a mixer that ignored the option
  still matched it);
* the mixer's refusal of an unknown scan backend;
* ``TransformerBlock`` pieces against timm run in the test (``Mlp`` dropout placement,
  ``drop_path``), DINOv2's SwiGLU / LayerScale / LayerNorm-eps defaults, ``drop_rate``
  reaching the attention projection, ``forward_attn`` (``pre_attention``, optional ``ls1``);
* Adventurer helpers by hand: flip / stage index ranges, drop-path schedules, the FFN's
  dropout on the no-grad path, the truncated LeCun init, ``forward_stages(normalize_stages)``;
* output conventions: ``cls_avg`` checks and DINOv2's ``create_linear_input`` written out,
  ``avg_featmap`` over the patch tokens only.
"""
import math
from typing import Dict, Tuple

import pytest
import torch
import torch.nn.functional as F

from mmlinvit.layers.mamba2 import Mamba2Mixer

from ssd_fp64 import reference_scan


# ------------------------------------------------------------------ float64 Mamba-2 reference
def mamba2_reference(p: Dict[str, torch.Tensor], u: torch.Tensor, *, d_inner: int,
                     headdim: int, ngroups: int, d_state: int, d_conv: int,
                     dt_limit: Tuple[float, float], norm_before_gate: bool,
                     eps: float) -> torch.Tensor:
    """Mamba-2 (``mamba_split_conv1d_scan_ref`` + ``rms_norm_ref``) token by token in float64.

    Every hyper-parameter is an argument, so the reference cannot inherit a mistake of the
    module under test.
    """
    u = u.double()
    batch, length, _ = u.shape
    heads = d_inner // headdim
    gn = ngroups * d_state
    conv_dim = d_inner + 2 * gn
    zxbcdt = u @ p['in_proj.weight'].t()
    if 'in_proj.bias' in p:
        zxbcdt = zxbcdt + p['in_proj.bias']
    z = zxbcdt[..., :d_inner]
    xbc = zxbcdt[..., d_inner:d_inner + conv_dim]
    dt_raw = zxbcdt[..., d_inner + conv_dim:]
    assert dt_raw.shape[-1] == heads
    weight = p['conv1d.weight'][:, 0]
    rows = []
    for t in range(length):
        acc = torch.zeros(batch, conv_dim, dtype=torch.float64)
        if 'conv1d.bias' in p:
            acc = acc + p['conv1d.bias']
        for k in range(d_conv):
            src = t - (d_conv - 1) + k
            if src >= 0:
                acc = acc + weight[:, k] * xbc[:, src]
        rows.append(acc)
    xbc = F.silu(torch.stack(rows, dim=1))
    x = xbc[..., :d_inner].reshape(batch, length, heads, headdim)
    b = xbc[..., d_inner:d_inner + gn].reshape(batch, length, ngroups, d_state)
    c = xbc[..., d_inner + gn:].reshape(batch, length, ngroups, d_state)
    dt = F.softplus(dt_raw + p['dt_bias']).clamp(min=dt_limit[0], max=dt_limit[1])
    a = -torch.exp(p['A_log'])
    y = reference_scan(x, dt, a, b, c, p['D'])
    y = y.reshape(batch, length, d_inner)
    gate = F.silu(z)
    if not norm_before_gate:
        y = y * gate
    size = d_inner // ngroups
    yg = y.reshape(batch, length, ngroups, size)
    y = (yg / torch.sqrt(yg.pow(2).mean(-1, keepdim=True) + eps)).reshape(batch, length, d_inner)
    y = y * p['norm.weight']
    if norm_before_gate:
        y = y * gate
    out = y @ p['out_proj.weight'].t()
    if 'out_proj.bias' in p:
        out = out + p['out_proj.bias']
    return out


def random_params(mixer: Mamba2Mixer, seed: int) -> None:
    """Fills every parameter of ``mixer`` with random values (no parameter left at its init)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in mixer.named_parameters():
            r = torch.rand(param.shape, generator=gen, dtype=torch.float64).to(param.dtype)
            if name == 'A_log':
                param.copy_(math.log(0.5) + r * (math.log(4.0) - math.log(0.5)))
            elif name == 'dt_bias':
                param.copy_(2 * r - 1)
            elif name in ('D', 'norm.weight'):
                param.copy_(0.5 + r)
            else:
                param.copy_(0.4 * torch.randn(param.shape, generator=gen,
                                              dtype=torch.float64).to(param.dtype))


@pytest.mark.parametrize('norm_before_gate', [True, False])
def test_mixer_follows_its_own_norm_before_gate_option(norm_before_gate: bool) -> None:
    """``norm_before_gate`` reaches the gated norm: rmsnorm(y) * silu(z) for True, the Mamba-2
    default rmsnorm(y * silu(z)) for False, in groups of d_inner / ngroups (ngroups=2)."""
    cfg = dict(d_model=8, d_state=3, headdim=4, ngroups=2, chunk_size=4, d_conv=3,
               dt_limit=(0.0, 0.6), norm_before_gate=norm_before_gate, bias=True)
    mixer = Mamba2Mixer(**cfg).double()
    random_params(mixer, seed=5)
    u = torch.randn(2, 7, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    params = {n: t.detach() for n, t in mixer.named_parameters()}
    expected = mamba2_reference(params, u, d_inner=16, headdim=4, ngroups=2, d_state=3,
                                d_conv=3, dt_limit=(0.0, 0.6),
                                norm_before_gate=norm_before_gate, eps=1e-5)
    other = mamba2_reference(params, u, d_inner=16, headdim=4, ngroups=2, d_state=3,
                             d_conv=3, dt_limit=(0.0, 0.6),
                             norm_before_gate=not norm_before_gate, eps=1e-5)
    assert (expected - other).abs().max() > 1e-2  # control: the option is visible
    with torch.no_grad():
        torch.testing.assert_close(mixer(u), expected, rtol=1e-10, atol=1e-11)


# ------------------------------------------------------------------ transformer block pieces
def test_mlp_drops_after_the_activation_and_after_fc2_as_timm() -> None:
    """``Mlp(drop=p)`` is timm's ``Mlp``: fc1, act, dropout, fc2, dropout; with the same seed
    both draw the same masks (the timm module runs in the test)."""
    from timm.layers import Mlp as TimmMlp

    from mmlinvit.layers.transformer import Mlp
    ours = Mlp(6, 10, act='gelu', drop=0.4).double().train()
    theirs = TimmMlp(6, 10, act_layer=torch.nn.GELU, drop=0.4).double().train()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(11)
    got = ours(x)
    torch.manual_seed(11)
    want = theirs(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_drop_path_is_timms_per_sample_drop_path() -> None:
    """``DropPath`` draws one Bernoulli(keep) per sample and divides the kept ones by keep,
    as timm's ``drop_path(..., scale_by_keep=True)`` (run in the test, same seed)."""
    from timm.layers import drop_path

    from mmlinvit.layers.transformer import DropPath
    x = torch.randn(64, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    module = DropPath(0.3).train()
    torch.manual_seed(3)
    got = module(x)
    torch.manual_seed(3)
    want = drop_path(x, 0.3, training=True, scale_by_keep=True)
    torch.testing.assert_close(got, want)  # x * m / keep vs x * (m / keep): 1 ulp
    kept = (got != 0).flatten(1)
    assert bool((kept.all(1) | ~kept.any(1)).all())  # whole samples kept or dropped
    assert 0 < int(kept.all(1).sum()) < 64


def test_layer_scale_default_is_dinov2s_1e_5() -> None:
    """DINOv2's ``LayerScale(dim, init_values=1e-5)`` default."""
    from mmlinvit.layers.transformer import LayerScale
    torch.testing.assert_close(LayerScale(4).gamma.detach(), torch.full((4, ), 1e-5))


def test_block_layer_norm_eps_default_is_1e_6() -> None:
    """The block's LayerNorms default to eps 1e-6 (timm / DINOv2 ViTs)."""
    from mmlinvit.layers.transformer import TransformerBlock
    block = TransformerBlock(8, 2, 16)
    assert block.norm1.eps == 1e-6 and block.norm2.eps == 1e-6


def test_swiglu_gates_the_first_half_of_fc1() -> None:
    """DINOv2 ``SwiGLUFFNFused``: ``x1, x2 = w12(x).chunk(2)``; ``w3(silu(x1) * x2)``, written
    out with the weights (fc1 with a bias, as DINOv2's ``w12``)."""
    from mmlinvit.layers.transformer import SwiGLUMlp
    mlp = SwiGLUMlp(4, 6).double()
    assert mlp.fc1.bias is not None
    x = torch.randn(2, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    w, b = mlp.fc1.weight.detach(), mlp.fc1.bias.detach()
    x1 = x @ w[:6].t() + b[:6]
    x2 = x @ w[6:].t() + b[6:]
    want = (x1 * torch.sigmoid(x1) * x2) @ mlp.fc2.weight.detach().t() + mlp.fc2.bias.detach()
    torch.testing.assert_close(mlp(x), want)


def test_block_drop_rate_reaches_the_attention_projection() -> None:
    """``drop_rate`` is the attention operator's ``proj_drop`` too (timm ``Block(proj_drop)``)."""
    from mmlinvit.layers.transformer import TransformerBlock
    block = TransformerBlock(8, 2, 16, drop_rate=0.25)
    assert block.attn.proj_drop.p == 0.25
    assert block.mlp.drop.p == 0.25


def test_forward_attn_applies_pre_attention_and_layer_scale_only_on_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``forward_attn(x)`` is the attention branch of ``forward`` for block input x: the
    operator's ``pre_attention`` first, then attn(norm1(.)); ``ls1`` only with
    ``with_layer_scale=True``."""
    from mmlinvit.layers.transformer import TransformerBlock
    torch.manual_seed(0)
    block = TransformerBlock(8, 2, 16, layer_scale_init=0.5).double().eval()
    with torch.no_grad():
        block.ls1.gamma.copy_(torch.linspace(0.1, 2.0, 8))
    shift = torch.linspace(-1.0, 3.0, 8, dtype=torch.float64)  # not a LayerNorm invariance
    monkeypatch.setattr(block.attn, 'pre_attention', lambda x, hw, n: x + shift)
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = block.attn(block.norm1(x + shift), None, 1)
        torch.testing.assert_close(block.forward_attn(x, None, 1), plain)
        torch.testing.assert_close(block.forward_attn(x, None, 1, with_layer_scale=True),
                                   plain * block.ls1.gamma)


# ------------------------------------------------------------------ Mamba2Mixer build checks
def test_mixer_refuses_an_unknown_scan_backend_at_build() -> None:
    with pytest.raises(ValueError, match="unknown ssd_backend 'nope'"):
        Mamba2Mixer(8, d_state=2, headdim=4, ssd_backend='nope')


# ------------------------------------------------------------------ Adventurer pieces
def test_flip_indices_refuse_the_depth_itself() -> None:
    """Valid block indices are 0 .. depth - 1: index ``depth`` names no block."""
    from mmlinvit.backbones.adventurer import flip_block_indices
    assert flip_block_indices([3, 0], 4) == [0, 3]
    with pytest.raises(IndexError, match=r'\[4\]'):
        flip_block_indices([1, 4], 4)


def test_more_stages_than_blocks_are_refused() -> None:
    from mmlinvit.backbones.adventurer import stage_block_indices
    assert stage_block_indices(4, 4) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match='num_stages'):
        stage_block_indices(4, 5)


@pytest.mark.parametrize('schedule, want', [('official', [0.0, 0.0, 0.1, 0.2]),
                                            ('linear', [0.0, 0.1, 0.2, 0.3])])
def test_drop_path_rates_by_hand(schedule: str, want: list) -> None:
    """Public Adventurer code: ``dpr = [0] + linspace(0, rate, depth)``, block i takes dpr[i];
    timm: ``linspace(0, rate, depth)``; rate 0.3, depth 4, worked out by hand."""
    from mmlinvit.backbones.adventurer import drop_path_rates
    got = drop_path_rates(0.3, 4, schedule)
    assert len(got) == 4
    for g, w in zip(got, want):
        assert abs(g - w) < 1e-12, (got, want)


def test_swiglu_ffn_dropout_also_acts_without_autograd() -> None:
    """In training mode the FFN's dropout acts after ``w3`` on the in-place (no-grad) path
    too: every output is 0 or the undropped value / (1 - p), as ``nn.Dropout``."""
    from mmlinvit.backbones.adventurer import SwiGLUFFN
    torch.manual_seed(0)
    ffn = SwiGLUFFN(6, 10, drop=0.5).double()
    x = torch.randn(4, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    w1, w2, w3 = (getattr(ffn, n) for n in ('w1', 'w2', 'w3'))
    clean = w3(F.silu(w1(x)) * w2(x)).detach()
    ffn.train()
    with torch.no_grad():
        got = ffn(x)
    dropped = got == 0
    assert 0 < int(dropped.sum()) < got.numel()
    torch.testing.assert_close(got[~dropped], 2.0 * clean[~dropped])


def test_patch_projection_init_is_truncated_at_two_of_its_stds() -> None:
    """timm ``lecun_normal_``: normal(std) truncated to [-2 std, 2 std], std = 1 /
    (sqrt(fan_in) * 0.8796); the truncated weights have std 1 / sqrt(fan_in)."""
    from mmlinvit.backbones.adventurer import Adventurer
    torch.manual_seed(0)
    model = Adventurer(dict(embed_dims=64, num_layers=1), img_size=32,
                       mixer_cfg=dict(d_state=4, headdim=16))
    weight = model.patch_embed.proj.weight.detach().double()
    fan_in = 3 * 16 * 16
    std = fan_in**-0.5 / 0.87962566103423978
    assert weight.abs().max() <= 2 * std * (1 + 1e-6)
    assert abs(weight.std().item() * math.sqrt(fan_in) - 1) < 0.03


def test_forward_stages_normalises_stage_features_on_request() -> None:
    """``forward_stages(normalize_stages=True)``: ``norm_f`` of the residual stream after
    each stage's last block, patch tokens only (class token last, excluded), against the
    blocks run one by one."""
    from mmlinvit.backbones.adventurer import Adventurer
    torch.manual_seed(0)
    model = Adventurer(dict(embed_dims=32, num_layers=4), img_size=32, patch_size=8,
                       mixer_cfg=dict(d_state=4, headdim=16, chunk_size=16)).double().eval()
    with torch.no_grad():
        model.norm_f.weight.copy_(torch.linspace(0.5, 2.0, 32))
        model.cls_token.normal_()
        images = torch.randn(2, 3, 32, 32, dtype=torch.float64,
                             generator=torch.Generator().manual_seed(1))
        tokens, _ = model.prepare_tokens(images)
        want = []
        for i, blk in enumerate(model.layers):
            tokens = blk(tokens)
            if i in (1, 3):
                want.append(model.norm_f(tokens)[:, :-1])
        got = model.forward_stages(images, num_stages=2, normalize_stages=True)
        raw = model.forward_stages(images, num_stages=2)
    assert len(got.stages) == 2
    for g, w in zip(got.stages, want):
        torch.testing.assert_close(g, w)
    assert (raw.stages[0] - got.stages[0]).abs().max() > 1e-2  # control: the norm is visible


# ------------------------------------------------------------------ output conventions
def test_cls_avg_without_a_class_token_is_refused() -> None:
    from mmlinvit.backbones.outputs import check_output_setting
    with pytest.raises(ValueError, match='reads the class token'):
        check_output_setting('cls_avg', [1], 2, has_cls_token=False, norm_all_outputs=True)


def test_cls_avg_of_one_earlier_block_needs_norm_all_outputs() -> None:
    """One ``out_indices`` entry that is not the last block is returned unnormalised: refused
    without ``norm_all_outputs`` (DINOv2 normalises every block it reads)."""
    from mmlinvit.backbones.outputs import check_output_setting
    check_output_setting('cls_avg', [2], 3, has_cls_token=True, norm_all_outputs=False)
    check_output_setting('cls_avg', [0], 3, has_cls_token=True, norm_all_outputs=True)
    with pytest.raises(ValueError, match='norm_all_outputs=True'):
        check_output_setting('cls_avg', [0], 3, has_cls_token=True, norm_all_outputs=False)
    # other formats may read unnormalised earlier blocks
    check_output_setting('cls_token', [0, 1], 3, has_cls_token=True, norm_all_outputs=False)


def test_cls_avg_is_dinov2s_linear_input() -> None:
    """``create_linear_input(x_tokens_list, use_n_blocks=n, use_avgpool=True)`` of
    ``dinov2/eval/linear.py``, written out: class tokens of the n blocks in depth order,
    then the mean patch token of the LAST block."""
    from mmlinvit.backbones.outputs import combine_outputs, format_tokens
    gen = torch.Generator().manual_seed(0)
    blocks = [torch.randn(2, 7, 3, generator=gen) for _ in range(3)]  # cls first, 6 patches
    outs = [format_tokens(t, 'cls_avg', 0, slice(1, None), (2, 3)) for t in blocks]
    (got, ) = combine_outputs(outs, 'cls_avg')
    x_tokens_list = [(t[:, 1:], t[:, 0]) for t in blocks]
    output = torch.cat([cls for _, cls in x_tokens_list], dim=-1)
    want = torch.cat((output, torch.mean(x_tokens_list[-1][0], dim=1)), dim=-1)
    torch.testing.assert_close(got, want)


def test_avg_featmap_averages_the_patch_tokens_only() -> None:
    """mmpretrain ``VisionTransformer(out_type='avg_featmap')``: mean of the patch tokens,
    the class token left out (here it is at position 0 and far from the patches)."""
    from mmlinvit.backbones.outputs import format_tokens
    tokens = torch.randn(2, 7, 3, generator=torch.Generator().manual_seed(0))
    tokens[:, 0] += 100.0
    got = format_tokens(tokens, 'avg_featmap', 0, slice(1, None), (2, 3))
    torch.testing.assert_close(got, tokens[:, 1:].mean(dim=1))
