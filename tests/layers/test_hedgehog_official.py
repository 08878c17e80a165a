"""The ``'hedgehog'`` operator against the OFFICIAL LoLCATS / Hedgehog code (random weights).

The reference is the ``hedgehog`` entry of
``tests/fixtures/hedgehog_mimetic_official_reference.pt``, written by
``tests/fixtures/make_hedgehog_mimetic_references.py`` from HazyResearch/lolcats (``FeatureMap``
+ ``SoftmaxDim`` + ``FeatureMapMLP`` and ``LolcatsLinearAttention``, ``quadratic_attention``;
the kwargs of the released pure-linear config; see that script for what is official and what it
composes).  The official weights are mapped onto mmlinvit's operator by
the key mapping written out below.

What is compared:

* the feature map phi(x) = [softmax(x W_h), softmax(-x W_h)] (per-head W of shape (H, d, F), no
  bias, no temperature, no input scaling, positive half first) on the official q / k;
* the non-causal map, output and the gradients (q, k, v and both feature-map weights) against
  the official ``quadratic_attention(..., causal=False)``;
* the whole official module, unmodified (causal, as LoLCATS is for LMs): its row ``n - 1`` is the
  non-causal output of query ``n - 1`` over the first ``n`` tokens, i.e. mmlinvit's operator run
  on ``x[:, :n]``; untied and tied (``tie_qk_kernels`` = ``share_feature_map``) feature maps;
* the identity init (official ``FeatureMapMLP(zero_init=True)``).

Conventions that differ (so the comparisons set them explicitly):

* eps: LoLCATS adds ``eps = 1e-12`` to the normaliser summed over the N keys; mmlinvit (default
  ``eps = 1e-6``) adds it to that sum divided by N.  The comparisons build mmlinvit with
  ``eps = 1e-12 / N`` (the same epsilon).  With mmlinvit's default the outputs differ by about
  3e-5 here (relative ``N * 1e-6 / (phi(q) . sum phi(k))``, the normaliser being ~0.03 N):
  :func:`test_default_eps_is_a_different_convention` records it.
* LoLCATS clamps the features at ``eps = 1e-12`` (``.clamp(min=eps)``); mmlinvit does not.  Each
  softmax half sums to 1, so the clamp moves a normaliser by at most 2F * 1e-12 relative: no
  measurable effect (the stored features have no entry below 1e-9).
* Init: every released LoLCATS config has ``zero_init: false``, i.e. ``kaiming_uniform_`` (random,
  |W| <= sqrt(6 / (d F)) = 0.077); mmlinvit's default is the identity ``eye(d, F)``, which is
  LoLCATS' ``zero_init=True`` option (equal, checked below); ``feature_init='kaiming_uniform'``
  gives the released default (README, "Deviations from the papers").
* LoLCATS' optional feature-map ``bias`` (off in the configs) is one scalar per head added to
  every logit: it cancels in both softmaxes, so mmlinvit has no bias without loss of generality.
"""
from typing import Dict

import pytest
import torch

from mmlinvit.layers.attention import build_attention_operator
from official_golden import load_generator, load_golden, max_error

TOL = 1e-5


GEN = load_generator('make_hedgehog_mimetic_references')
C, HEADS, D, F = GEN.EMBED_DIMS, GEN.NUM_HEADS, GEN.HEAD_DIMS, GEN.FEATURE_DIMS


@pytest.fixture(scope='module')
def golden() -> dict:
    return load_golden('hedgehog_mimetic_official_reference.pt')['hedgehog']


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors: one intra-op thread is fastest on the shared cores."""


def map_official(official: Dict[str, torch.Tensor], tied: bool) -> Dict[str, torch.Tensor]:
    """Official ``LolcatsLinearAttention`` keys -> mmlinvit ``'hedgehog'`` keys.

    ``q_proj`` / ``k_proj`` / ``v_proj`` are the q / k / v row blocks of the fused ``qkv``
    (weights and biases), ``o_proj`` is ``proj``, ``feature_map_{q,k}.mlp.layer`` (H, d, F) are
    ``feature_{q,k}`` as they are; tied, ``feature_map_k`` is ``feature_map_q`` (one tensor).
    """
    expected = {f'{n}_proj.{p}' for n in 'qkvo' for p in ('weight', 'bias')}
    expected |= {'feature_map_q.mlp.layer', 'feature_map_k.mlp.layer'}
    assert set(official) == expected, sorted(official)
    mapped = {
        'qkv.weight': torch.cat([official[f'{n}_proj.weight'] for n in 'qkv']),
        'qkv.bias': torch.cat([official[f'{n}_proj.bias'] for n in 'qkv']),
        'proj.weight': official['o_proj.weight'],
        'proj.bias': official['o_proj.bias'],
        'feature_q': official['feature_map_q.mlp.layer'],
    }
    if tied:
        assert torch.equal(official['feature_map_k.mlp.layer'], mapped['feature_q'])
    else:
        mapped['feature_k'] = official['feature_map_k.mlp.layer']
    return mapped


def build_hedgehog(golden: dict, tied: bool = False, tokens: int = None):
    """mmlinvit's operator with the official weights and the official epsilon for ``tokens``
    keys (``eps / N``: mmlinvit adds eps to the 1/N-scaled normaliser)."""
    cfg = golden['config']
    tokens = cfg['tokens'] if tokens is None else tokens
    op = build_attention_operator(
        dict(type='hedgehog', feature_dims=cfg['feature_dims'], share_feature_map=tied,
             eps=cfg['attn_eps'] / tokens, backend='torch'),
        cfg['embed_dims'], cfg['num_heads'], qkv_bias=True)
    mapped = map_official(golden['tied' if tied else 'untied']['state_dict'], tied)
    own = op.state_dict()
    assert sorted(own) == sorted(mapped), (sorted(own), sorted(mapped))
    for key, value in mapped.items():
        assert own[key].shape == value.shape, (key, own[key].shape, value.shape)
    op.load_state_dict(mapped, strict=True)
    return op.eval()


def golden_input(golden: dict) -> torch.Tensor:
    cfg = golden['config']
    x = GEN.reference_tokens((cfg['batch'], cfg['tokens'], cfg['embed_dims']), cfg['input_seed'])
    assert x.double().sum().item() == cfg['input_sum'].item()
    return x


# ---------------------------------------------------------------------- feature map
def test_feature_map_equals_official(golden):
    """phi(q), phi(k) = the official ``feature_map_q(q)``, ``feature_map_k(k)`` (per-head W, no
    scaling of q / k, softmax over the F features, [positive, negative] order)."""
    nc = golden['untied']['noncausal']
    op = build_hedgehog(golden)
    with torch.no_grad():
        phi_q, phi_k = op.feature_maps(nc['q'], nc['k'])
    errors = dict(phi_q=max_error(phi_q[:1], nc['phi_q']), phi_k=max_error(phi_k[:1], nc['phi_k']))
    assert max(errors.values()) <= 1e-6, errors


def test_reference_is_not_trivial(golden):
    """Controls: peaked softmaxes (not ~1/F everywhere), different q / k maps, causal rows
    that differ from the full-sequence output, and the two official paths agree."""
    nc = golden['untied']['noncausal']
    assert nc['phi_q'].max() > 0.5 and nc['phi_k'].max() > 0.5
    assert (nc['phi_q'].min() > 1e-9) and (nc['phi_k'].min() > 1e-9)  # clamp inactive
    sd = golden['untied']['state_dict']
    assert (sd['feature_map_q.mlp.layer'] - sd['feature_map_k.mlp.layer']).abs().max() > 0.5
    assert golden['untied']['paths_agree'] <= 1e-6
    full = golden['untied']['causal']
    assert max_error(full[:, :-1], full[:, -1:].expand_as(full[:, :-1])) > 0.1


# ---------------------------------------------------------------------- non-causal
def test_noncausal_output_map_and_gradients_equal_official(golden):
    """Official ``quadratic_attention(phi_q, phi_k, v, causal=False)`` (map a / (a.sum + 1e-12),
    output) and the gradients of ``(out * cot).sum()`` through the official feature maps."""
    nc = golden['untied']['noncausal']
    cfg = golden['config']
    op = build_hedgehog(golden)
    q, k, v = (nc[n].clone().requires_grad_(True) for n in 'qkv')
    out = op.mix(q, k, v, None, 0)
    with torch.no_grad():
        attn_map = op.map_from_qk(nc['q'], nc['k'], None, 0)
    cot = GEN.reference_tokens(tuple(out.shape), cfg['cot_seed'])
    (out * cot).sum().backward()
    errors = dict(output=max_error(out, nc['out']), map=max_error(attn_map, nc['map']),
                  q_grad=max_error(q.grad, nc['q_grad']),
                  k_grad=max_error(k.grad, nc['k_grad']),
                  v_grad=max_error(v.grad, nc['v_grad']),
                  feature_q_grad=max_error(op.feature_q.grad, nc['feature_q_grad']),
                  feature_k_grad=max_error(op.feature_k.grad, nc['feature_k_grad']))
    assert max(errors.values()) <= TOL, errors


def test_head_split_equals_official_process_qkv(golden):
    """mmlinvit's fused-qkv head split = the official ``process_qkv`` (q_proj ... view(b, l, H, d)
    .transpose(1, 2), RoPE the identity)."""
    nc = golden['untied']['noncausal']
    op = build_hedgehog(golden)
    with torch.no_grad():
        q, k, v = op.split_qkv(golden_input(golden))
    errors = {n: max_error(t, nc[n]) for n, t in zip('qkv', (q, k, v))}
    assert max(errors.values()) <= 1e-6, errors


# ---------------------------------------------------------------------- official module
@pytest.mark.parametrize('tied', [False, True], ids=['untied', 'tied'])
def test_official_causal_module_rows_equal_mmlinvit_on_prefixes(golden, tied):
    """The unmodified official module (qkv projections, feature maps, causal ``linear_attention``
    with its eps on the summed normaliser, ``o_proj``): row n - 1 = mmlinvit on x[:, :n]."""
    x = golden_input(golden)
    causal = golden['tied' if tied else 'untied']['causal']
    op = build_hedgehog(golden, tied)
    errors = []
    with torch.no_grad():
        for n in range(1, x.shape[1] + 1):
            op.eps = golden['config']['attn_eps'] / n
            errors.append(max_error(op(x[:, :n], None, 0)[:, -1], causal[:, n - 1]))
    assert max(errors) <= TOL, max(errors)


def test_default_eps_is_a_different_convention(golden):
    """mmlinvit's default eps (1e-6 on the 1/N-scaled normaliser) vs LoLCATS' 1e-12 on the sum:
    a visible but small difference (bounded here by 1e-4; about 3e-5)."""
    nc = golden['untied']['noncausal']
    op = build_hedgehog(golden)
    op.eps = 1e-6
    assert op.eps == build_attention_operator('hedgehog', C, HEADS).eps
    with torch.no_grad():
        error = max_error(op.mix(nc['q'], nc['k'], nc['v'], None, 0), nc['out'])
    assert TOL < error <= 1e-4, error


# ---------------------------------------------------------------------- init
@pytest.mark.parametrize('feature_dims', GEN.INIT_FEATURE_DIMS)
def test_identity_init_equals_official_zero_init(golden, feature_dims):
    """mmlinvit's default init = LoLCATS ``FeatureMapMLP(zero_init=True)`` (``eye_`` per head,
    rectangular: d = 16 -> F = 64 pads, F = 8 truncates)."""
    expected = golden['init'][f'zero_init_f{feature_dims}']
    op = build_attention_operator(dict(type='hedgehog', feature_dims=feature_dims), C, HEADS)
    assert torch.equal(op.feature_q.detach(), expected)
    assert torch.equal(op.feature_k.detach(), expected)


def test_released_lolcats_init_is_an_option(golden):
    """Every released LoLCATS config uses ``zero_init: false``: ``kaiming_uniform_``, random
    with |W| <= sqrt(6 / (d F)).  mmlinvit's default is the identity (documented deviation);
    ``feature_init='kaiming_uniform'`` draws as LoLCATS does: same bound, same spread."""
    init = golden['init']
    assert init['default_max_abs'] <= init['default_bound']  # the official draw: in the bound
    default = build_attention_operator(dict(type='hedgehog', feature_dims=F), C, HEADS)
    assert torch.equal(default.feature_q.detach(), torch.eye(D, F).expand(HEADS, D, F))
    op = build_attention_operator(dict(type='hedgehog', feature_dims=F,
                                       feature_init='kaiming_uniform'), C, HEADS)
    for weight in (op.feature_q, op.feature_k):
        assert weight.abs().max() <= init['default_bound']
        assert weight.abs().max() > 0.9 * init['default_bound']  # uniform over the whole bound
        assert (weight - torch.eye(D, F)).abs().max() > 0.5
    with pytest.raises(ValueError, match=r"available: \('identity', 'kaiming_uniform'\)"):
        build_attention_operator(dict(type='hedgehog', feature_init='zeros'), C, HEADS)
