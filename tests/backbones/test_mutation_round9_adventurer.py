"""Mutation round 9: the Adventurer backbone and its Mamba-2 mixer, against hand computations.

Each test here fails on a one-line change of ``mmlinvit/layers/mamba2.py`` or
``mmlinvit/backbones/adventurer.py`` that the rest of the suite let through (the mutation
audit of session 15).  The golden test against the public Adventurer code
(``test_adventurer_official.py``) already pins the default forward path; what it cannot see is
guarded here:

* ``Mamba2Mixer`` paths the released models never take: ``in_proj`` biases (``bias=True``),
  ``dt_limit`` clamping, ``norm_before_gate=True``, and the gradients.  The reference is the
  Mamba-2 recurrence written out token by token in float64 from the official formulas
  (state-spaces/mamba ``mamba_split_conv1d_scan_ref``: in_proj rows z, x, B, C, dt; causal
  depthwise conv + SiLU over x, B, C; ``dt = softplus(dt + dt_bias)`` clamped to
  ``dt_limit``; ``A = -exp(A_log)``; ``h_t = exp(dt A) h_{t-1} + dt x_t B_t^T``;
  ``y = C_t h_t + D x_t``; ``layernorm_gated.rms_norm_ref`` in groups of
  ``d_inner / ngroups``; ``out_proj``), and on accelerators the ``nn.Conv1d`` form of the
  causal convolution (runs only where CUDA is available);
* the Mamba-2 initialisation (``MambaCustom.__init__``): ``A = exp(A_log)`` uniform in
  ``A_init_range`` (1, 16), ``D = 1``, ``softplus(dt_bias)`` log-uniform in [1e-3, 1e-1]
  floored at 1e-4, the gated norm's eps 1e-5 and the constructor's argument checks;
* the step sizes in fp32 for 16-bit inputs;
* Adventurer's construction: the ``'large'`` alias, dropout and RMSNorm eps reaching every
  module, stochastic depth on BOTH residual branches, the public init (tokens std 0.02, zero
  patch bias, ``out_proj / sqrt(depth)``), ``forward_stages`` with activation checkpointing
  and its ``num_stages`` check.
"""
import math
from typing import Dict, Optional

import pytest
import torch
import torch.nn.functional as F

from mmlinvit.backbones.adventurer import Adventurer, AdventurerBlock, stage_block_indices
from mmlinvit.layers.mamba2 import Mamba2Mixer

TINY_MIXER = dict(d_state=8, headdim=16, chunk_size=16)


# ------------------------------------------------------------------ float64 Mamba-2 reference
def reference_mamba2(mixer: Mamba2Mixer, u: torch.Tensor,
                     params: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
    """The Mamba-2 mixer written out token by token in float64 (official formulas).

    Args:
        mixer: The module whose hyper-parameters (and, without ``params``, weights) are used.
        u: Tokens (B, L, d_model).
        params: Optional float64 copies of ``mixer.named_parameters()`` (to differentiate).

    Returns:
        (B, L, d_model) in float64.
    """
    p = params or {n: t.detach().double() for n, t in mixer.named_parameters()}
    u = u.double()
    batch, length, _ = u.shape
    d_inner, heads, headdim = mixer.d_inner, mixer.nheads, mixer.headdim
    groups, d_state, taps = mixer.ngroups, mixer.d_state, mixer.d_conv
    zxbcdt = u @ p['in_proj.weight'].t()
    if 'in_proj.bias' in p:
        zxbcdt = zxbcdt + p['in_proj.bias']
    conv_dim = d_inner + 2 * groups * d_state
    z = zxbcdt[..., :d_inner]
    xbc = zxbcdt[..., d_inner:d_inner + conv_dim]
    dt_raw = zxbcdt[..., d_inner + conv_dim:]
    assert dt_raw.shape[-1] == heads
    # causal depthwise convolution: out[t] = bias + sum_k w[k] * in[t - (K - 1) + k]
    weight = p['conv1d.weight'][:, 0]  # (conv_dim, K)
    conv_rows = []
    for t in range(length):
        acc = p['conv1d.bias'].expand(batch, -1).clone() if 'conv1d.bias' in p else \
            torch.zeros(batch, conv_dim, dtype=torch.float64)
        for k in range(taps):
            src = t - (taps - 1) + k
            if src >= 0:
                acc = acc + weight[:, k] * xbc[:, src]
        conv_rows.append(acc)
    xbc = F.silu(torch.stack(conv_rows, dim=1))
    x = xbc[..., :d_inner].reshape(batch, length, heads, headdim)
    b = xbc[..., d_inner:d_inner + groups * d_state].reshape(batch, length, groups, d_state)
    c = xbc[..., d_inner + groups * d_state:].reshape(batch, length, groups, d_state)
    dt = F.softplus(dt_raw + p['dt_bias'])
    low, high = mixer.dt_limit
    dt = dt.clamp(min=low, max=high)
    a = -torch.exp(p['A_log'])
    heads_per_group = heads // groups
    ys = []
    for h in range(heads):
        g = h // heads_per_group
        state = torch.zeros(batch, headdim, d_state, dtype=torch.float64)
        y_h = []
        for t in range(length):
            decay = torch.exp(dt[:, t, h] * a[h])[:, None, None]
            inject = dt[:, t, h][:, None, None] * x[:, t, h][:, :, None] * b[:, t, g][:, None, :]
            state = decay * state + inject
            y_h.append((state * c[:, t, g][:, None, :]).sum(-1) + p['D'][h] * x[:, t, h])
        ys.append(torch.stack(y_h, dim=1))  # (B, L, P)
    y = torch.stack(ys, dim=2).reshape(batch, length, d_inner)
    gate = F.silu(z)
    eps, size = mixer.norm.eps, d_inner // groups
    if not mixer.norm.norm_before_gate:
        y = y * gate
    y = y.reshape(batch, length, groups, size)
    y = (y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + eps)).reshape(batch, length, d_inner)
    y = y * p['norm.weight']
    if mixer.norm.norm_before_gate:
        y = y * gate
    out = y @ p['out_proj.weight'].t()
    if 'out_proj.bias' in p:
        out = out + p['out_proj.bias']
    return out


def randomised_mixer(seed: int = 0, **kwargs) -> Mamba2Mixer:
    """A small mixer whose every parameter is random (biases, norm weight, D, A, dt)."""
    cfg = dict(d_model=8, d_state=3, headdim=4, ngroups=2, chunk_size=4)
    cfg.update(kwargs)
    torch.manual_seed(seed)
    mixer = Mamba2Mixer(**cfg)
    with torch.no_grad():
        for name, param in mixer.named_parameters():
            if name == 'A_log':
                param.copy_(torch.empty_like(param).uniform_(math.log(0.5), math.log(4.0)))
            elif name == 'dt_bias':
                param.copy_(torch.empty_like(param).uniform_(-1.0, 1.0))
            elif name in ('D', 'norm.weight'):
                param.copy_(1 + 0.5 * torch.randn_like(param))
            else:
                param.copy_(0.4 * torch.randn_like(param))
    return mixer


MIXER_CASES = {
    'in_proj_bias': dict(bias=True),
    'dt_limit_high': dict(dt_limit=(0.0, 0.4)),
    'dt_limit_low': dict(dt_limit=(0.9, float('inf'))),
    'norm_before_gate': dict(norm_before_gate=True, bias=True),
}


@pytest.mark.parametrize('case', sorted(MIXER_CASES))
def test_mixer_matches_the_float64_recurrence(case: str) -> None:
    """Options the released models do not use, against the token-by-token recurrence; both
    the autograd and the in-place (no-grad) path, in fp64 throughout (``A = -exp(A_log)`` was
    rounded to fp32 also for fp64 modules: 2e-8 off); the changes it guards move the output by
    more than 1e-2."""
    mixer = randomised_mixer(**MIXER_CASES[case]).double()
    u = torch.randn(2, 9, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = reference_mamba2(mixer, u)
    with torch.enable_grad():
        got = mixer(u)
    torch.testing.assert_close(got.detach(), expected, rtol=1e-11, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(mixer(u), expected, rtol=1e-11, atol=1e-12)


def test_dt_limit_changes_the_output() -> None:
    """Control for the cases above: the clamps are active for these weights."""
    u = torch.randn(2, 9, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    free = randomised_mixer().double()
    for limit in ((0.0, 0.4), (0.9, float('inf'))):
        clamped = randomised_mixer(dt_limit=limit).double()
        with torch.no_grad():
            assert (free(u) - clamped(u)).abs().max() > 1e-3, limit


def test_step_sizes_are_clamped_to_dt_limit() -> None:
    """``dt = clamp(softplus(dt_raw + dt_bias), dt_limit)`` for either bound alone and both."""
    raw = torch.linspace(-6.0, 6.0, 25)[:, None].expand(-1, 4)
    for limit in ((0.0, 0.5), (0.3, float('inf')), (0.3, 0.5)):
        mixer = Mamba2Mixer(8, d_state=2, headdim=4, dt_limit=limit)
        with torch.no_grad():
            mixer.dt_bias.copy_(torch.tensor([-1.0, 0.0, 0.5, 1.0]))
        expected = [[min(max(math.log1p(math.exp(r + b)), limit[0]), limit[1])
                     for b in (-1.0, 0.0, 0.5, 1.0)] for r in raw[:, 0].tolist()]
        got = mixer.step_sizes(raw)
        torch.testing.assert_close(got.double(), torch.tensor(expected, dtype=torch.float64))


def test_step_sizes_of_16bit_inputs_are_computed_in_fp32() -> None:
    """The official kernels take softplus(dt + dt_bias) in fp32: a bf16 ``dt_raw`` gives an
    fp32 dt, exact to fp32 rounding of the bf16 input (bf16 arithmetic is ~100x worse)."""
    mixer = Mamba2Mixer(8, d_state=2, headdim=4)
    with torch.no_grad():
        mixer.dt_bias.copy_(torch.tensor([-4.6, -2.3, 0.1, 1.7]))
    raw = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0)).bfloat16()
    got = mixer.step_sizes(raw)
    assert got.dtype == torch.float32
    expected = F.softplus(raw.double() + mixer.dt_bias.detach().double())
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-9)


def test_mixer_gradients_match_the_float64_recurrence() -> None:
    """Autograd through the mixer (in-place ops are only allowed without autograd) gives the
    gradients of the reference recurrence, for the input and every parameter."""
    mixer = randomised_mixer(bias=True).double()
    u = torch.randn(2, 7, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    weight = torch.randn(2, 7, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    u_ours = u.clone().requires_grad_(True)
    (mixer(u_ours) * weight).sum().backward()
    params = {n: t.detach().clone().requires_grad_(True) for n, t in mixer.named_parameters()}
    u_ref = u.clone().requires_grad_(True)
    (reference_mamba2(mixer, u_ref, params) * weight).sum().backward()
    torch.testing.assert_close(u_ours.grad, u_ref.grad, rtol=1e-10, atol=1e-11)
    for name, param in mixer.named_parameters():
        torch.testing.assert_close(param.grad, params[name].grad, rtol=1e-10, atol=1e-11,
                                   msg=lambda m, n=name: f'{n}: {m}')


@pytest.mark.skipif(not torch.cuda.is_available(), reason='the accelerator conv path')
def test_accelerator_conv_path_is_causal_and_cropped() -> None:
    """On accelerators ``conv_input`` runs ``nn.Conv1d`` (padding K - 1, right pad dropped):
    out[t] = bias + sum_k w[k] in[t - (K - 1) + k], the CPU path's values."""
    mixer = randomised_mixer(bias=True)
    u = torch.randn(2, 9, 8, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        xbc = F.linear(u, *mixer._in_proj_rows(1)).double()
        weight = mixer.conv1d.weight.detach().double()[:, 0]
        taps = weight.shape[-1]
        padded = F.pad(xbc, (0, 0, taps - 1, 0))
        want = mixer.conv1d.bias.detach().double() + sum(
            weight[:, k] * padded[:, k:k + u.shape[1]] for k in range(taps))
        got = mixer.cuda().conv_input(u.cuda()).cpu()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------- Mamba-2 init
def test_mamba2_init_follows_the_official_ranges() -> None:
    """``MambaCustom``: A = exp(A_log) ~ U[1, 16], D = 1, softplus(dt_bias) log-uniform in
    [1e-3, 1e-1] (512 heads: the extremes come close to the bounds)."""
    torch.manual_seed(0)
    mixer = Mamba2Mixer(256, d_state=1, headdim=1)
    assert mixer.nheads == 512
    a = torch.exp(mixer.A_log.detach().double())
    assert 1.0 <= a.min() < 1.3 and 15.7 < a.max() <= 16.0
    assert abs(a.mean().item() - 8.5) < 0.6  # uniform, not log-uniform (mean 5.4)
    torch.testing.assert_close(mixer.D.detach(), torch.ones(512))
    dt = F.softplus(mixer.dt_bias.detach().double())
    assert 1e-3 * (1 - 1e-5) <= dt.min() < 1.2e-3 and 0.085 < dt.max() <= 0.1 * (1 + 1e-5)
    log_dt = dt.log()
    middle = 0.5 * (math.log(1e-3) + math.log(0.1))
    assert abs(log_dt.mean().item() - middle) < 0.2  # log-uniform


def test_mamba2_dt_init_floor() -> None:
    """dt below ``dt_init_floor`` (default 1e-4) is raised to it."""
    torch.manual_seed(0)
    mixer = Mamba2Mixer(256, d_state=1, headdim=1, dt_min=1e-6, dt_max=1e-3)
    dt = F.softplus(mixer.dt_bias.detach().double())
    floored = (dt - 1e-4).abs() < 1e-9
    # log-uniform in [1e-6, 1e-3]: two thirds of the heads lie below 1e-4
    assert 0.55 < floored.double().mean() < 0.8
    assert dt.min() >= 1e-4 * (1 - 1e-6) and dt.max() <= 1e-3 * (1 + 1e-6)


def test_mamba2_gated_norm_eps_is_the_official() -> None:
    """``MambaCustom``'s gated RMSNorm has eps 1e-5: visible on small activations."""
    mixer = Mamba2Mixer(8, d_state=2, headdim=4)
    y = 1e-3 * torch.randn(2, 3, 16, dtype=torch.float64)
    z = torch.randn(2, 3, 16, dtype=torch.float64)
    gated = y * F.silu(z)
    expected = gated / torch.sqrt(gated.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(mixer.norm.double()(y, z), expected)


@pytest.mark.parametrize('kwargs, match', [
    (dict(d_model=8, headdim=3), 'divisible by headdim'),
    (dict(d_model=8, headdim=4, ngroups=0), 'ngroups'),
    (dict(d_model=8, headdim=4, ngroups=3), 'ngroups'),
    (dict(d_model=8, headdim=4, dt_min=0.0), 'dt_min'),
    (dict(d_model=8, headdim=4, A_init_range=(4.0, 2.0)), 'A_init_range'),
])
def test_mixer_rejects_bad_sizes_at_build(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Mamba2Mixer(**kwargs)


def test_mixer_accepts_a_constant_A_init() -> None:
    """``A_init_range[1] >= A_init_range[0]`` (official assert): a constant A is allowed."""
    mixer = Mamba2Mixer(8, d_state=2, headdim=4, A_init_range=(4.0, 4.0))
    torch.testing.assert_close(mixer.A_log.detach(), torch.full((4, ), math.log(4.0)))


# ------------------------------------------------------------------------- Adventurer
def tiny(seed: int = 0, **kwargs) -> Adventurer:
    cfg = dict(arch=dict(embed_dims=32, num_layers=4), img_size=64, mixer_cfg=TINY_MIXER)
    cfg.update(kwargs)
    torch.manual_seed(seed)
    return Adventurer(**cfg).eval()


def test_large_alias_is_the_24_block_model() -> None:
    """``'large'`` is ``'l'``: 1024 channels, 24 blocks (built on ``meta``: no compute)."""
    with torch.device('meta'):
        large = Adventurer('large')
    assert (large.arch, large.embed_dims, large.num_layers) == ('l', 1024, 24)


def test_norm_eps_reaches_every_rmsnorm() -> None:
    """``norm_eps`` of the backbone is the eps of each block's two norms and of ``norm_f``:
    x / sqrt(mean(x^2) + eps) * weight, checked with eps = 0.5 on small inputs."""
    model = tiny(norm_eps=0.5)
    x = 0.1 * torch.randn(2, 5, 32)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 0.5)
    norms = [model.norm_f] + [n for blk in model.layers for n in (blk.norm, blk.norm_mlp)]
    for norm in norms:
        torch.testing.assert_close(norm(x), expected * norm.weight)


def test_drop_rate_reaches_the_embedding_and_every_mlp() -> None:
    """``drop_rate``: dropout after the position embedding and after each SwiGLU."""
    model = tiny(drop_rate=0.5).train()
    x = torch.randn(2, 3, 64, 64)
    torch.manual_seed(0)
    tokens, _ = model.prepare_tokens(x)
    plain, _ = model.eval().prepare_tokens(x)
    zeroed = (tokens == 0)
    assert 0.3 < zeroed.double().mean() < 0.7
    torch.testing.assert_close(tokens[~zeroed], 2 * plain[~zeroed])
    h = torch.randn(2, 5, 32)
    for blk in model.layers:
        blk.mlp.train()
        with torch.no_grad():
            out = blk.mlp(h)
        assert 0.3 < (out == 0).double().mean() < 0.7


def test_drop_path_covers_both_residual_branches() -> None:
    """The public Block: ``x + drop_path(mixer)`` and ``+ drop_path(mlp)``; with both branches
    dropped (a drop path that zeroes its input) a block is the identity."""

    class Zero(torch.nn.Module):

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.zeros_like(x)

    torch.manual_seed(0)
    block = AdventurerBlock(32, 80, mixer_cfg=TINY_MIXER).eval()
    x = torch.randn(2, 6, 32)
    block.drop_path = Zero()
    torch.testing.assert_close(block(x), x)


def test_public_init_scales() -> None:
    """timm trunc_normal(std 0.02) for tokens and positions, zero patch bias, and
    ``mixer.out_proj`` = kaiming_uniform(a=sqrt(5)) / sqrt(depth) (std 1 / sqrt(3 fan_in
    depth)); the MLP's last layer is not rescaled."""
    torch.manual_seed(0)
    depth, dims = 4, 256
    model = Adventurer(dict(embed_dims=dims, num_layers=depth), img_size=256,
                       mixer_cfg=dict(d_state=8, headdim=64))
    for name in ('pos_embed', 'cls_token', 'mask_token'):
        std = getattr(model, name).detach().std().item()
        assert 0.016 < std < 0.024, (name, std)
    assert torch.count_nonzero(model.patch_embed.proj.bias) == 0
    fan_in = 2 * dims
    want = 1 / math.sqrt(3 * fan_in * depth)
    for blk in model.layers:
        std = blk.mixer.out_proj.weight.detach().std().item()
        assert abs(std / want - 1) < 0.05, std
    w3 = model.layers[0].mlp.w3.weight.detach().std().item()
    assert abs(w3 * math.sqrt(3 * int(2.5 * dims)) - 1) < 0.05


def test_forward_stages_checkpoints_blocks_with_with_cp() -> None:
    """``forward_stages`` (the distillation path) honours ``with_cp`` like ``forward``:
    training with gradients, each block runs again in backward."""
    model = tiny(with_cp=True, arch=dict(embed_dims=32, num_layers=2)).train()
    calls = []
    for blk in model.layers:
        blk.register_forward_pre_hook(lambda mod, args: calls.append(1))
    result = model.forward_stages(torch.randn(1, 3, 32, 32), num_stages=2)
    assert len(calls) == 2
    (result.tokens.sum() + sum(s.sum() for s in result.stages)).backward()
    assert len(calls) == 4


def test_stage_count_must_be_positive() -> None:
    with pytest.raises(ValueError, match='num_stages'):
        stage_block_indices(12, 0)
    assert stage_block_indices(12, 1) == [11]
