"""Mutation round 15: attention operators, the transformer block, norms and position embeddings.

Written for single-change mutants of ``mmlinvit/layers/attention/{base,kernel_linear,mhla,
inline,ttt}.py`` and ``mmlinvit/layers/{transformer,norm,pos_embed}.py`` that the earlier tests
(round 9 included) did not kill: build-time validation (head split, Hedgehog / MHLA options,
activation and MLP names, norm groups, sin-cos width, grid records), the operator-settings record
the backbone compares when loading, the operator config check of ``build_attention_operator``,
documented defaults (eps, inner step, layer scale, norm eps) and numeric details.  References
are written out here in float64 from the published formulas (kernel linear attention, InLine,
MHLA's block-mixed map, ViT^3's init, MoCo-v3's sin-cos embedding, Mamba-2's gated RMSNorm), the
classes of timm (LayerScale, DropPath), or the documented values; never outputs of the code
under test.

Three tests (docstrings start with FINDING) guard fixes of real bugs and fail on the code before
them: ``DropPath(1.0)`` gave NaN (timm: 0), MHLA's ``mixing_tau <= 0`` built a NaN / inverted
block mixing silently, and an operator ``type`` given as a class got a garbled "unknown
operator" error.
"""
import math
from typing import Tuple

import pytest
import torch
import torch.nn.functional as F

from mmlinvit.layers.attention import build_attention_operator
from attention_fp64 import assert_close64, project64, qkv64, randomise_, tokens
from mmlinvit.layers.attention.base import AttentionOperator

C, HEADS = 32, 4  # head_dims 8
D = C // HEADS


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors: one intra-op thread is fastest on the shared cores."""


# ---------------------------------------------------------------------- fp64 references
def parsed_settings(record: str) -> dict:
    """``'name=value ...'`` parsed as the backbone's loading check parses it."""
    return dict(item.split('=', 1) for item in record.split())


# ---------------------------------------------------------------------- base
def test_embed_dims_not_divisible_by_heads_is_refused_at_build():
    """C = 30 cannot be split into 4 heads: a ValueError naming both numbers, not a reshape
    error at the first forward."""
    with pytest.raises(ValueError, match=r'embed_dims \(30\) must be divisible by num_heads '
                       r'\(4\)'):
        AttentionOperator(30, 4)


def test_settings_record_names_every_recorded_setting_without_spaces():
    """The backbone saves ``settings_record()`` and compares it item by item (split on blanks,
    then on the first '='): every recorded setting must be there, one blank-free item each
    (``(2, 2)`` must become ``(2,2)``), values as ``repr``."""
    op = build_attention_operator(dict(type='mhla', block_grid=(2, 3), eps_placement='sum',
                                       feature_eps=1e-6, eps=1e-3), C, HEADS)
    assert parsed_settings(op.settings_record()) == {
        'block_grid': '(2,3)', 'feature_map': "'relu'", 'feature_eps': '1e-06',
        'eps_placement': "'sum'", 'eps': '0.001'}
    ttt = build_attention_operator(dict(type='ttt', inner_lr=0.5, inner_loss_scale=0.25), C,
                                   HEADS)
    assert parsed_settings(ttt.settings_record()) == {'inner_lr': '0.5',
                                                      'inner_loss_scale': '0.25'}
    assert build_attention_operator('softmax', C, HEADS).settings_record() == ''
    for name in ('elu', 'relu', 'hedgehog', 'identity'):
        op = build_attention_operator(dict(type=name, eps=1e-3), C, HEADS)
        assert parsed_settings(op.settings_record()) == {'eps': '0.001'}, name


def test_scoped_operator_type_gets_the_option_check():
    """``type='mmlinvit.elu'`` (the mmengine scope prefix) is the ``elu`` operator: its options
    apply, and an option of another operator is named with the fix, as for the bare name (not
    left to ``__init__``'s bare "unexpected keyword argument")."""
    op = build_attention_operator(dict(type='mmlinvit.elu', eps=0.1), C, HEADS)
    assert op.feature_map == 'elu' and op.eps == 0.1
    with pytest.raises(TypeError, match=r"\['block_grid'\] are not options of the "
                       r"'mmlinvit.elu' operator"):
        build_attention_operator(dict(type='mmlinvit.elu', block_grid=2), C, HEADS)


def test_operator_type_given_as_a_class_gets_a_clear_error():
    """FINDING (fails on the original ``base.py``): operators are built by registered name;
    ``type=ELULinearAttention`` (a class, as mmengine's pure-Python configs write it) must say
    so and list the names, not report an unknown operator ``"ELULinearAttention'>"`` (the
    tail of ``str(cls)``).  Needs the check in ``build_attention_operator``."""
    from mmlinvit.layers.attention.kernel_linear import ELULinearAttention
    with pytest.raises(TypeError, match=r"type must be the registered name of an operator "
                       r"\(elu, .*\), got <class '.*ELULinearAttention'>"):
        build_attention_operator(dict(type=ELULinearAttention, eps=0.1), C, HEADS)


def test_base_options_inherited_through_kwargs_are_accepted():
    """``qkv_bias`` / ``proj_bias`` / dropouts are options of every operator (handed on through
    ``**kwargs`` to :class:`AttentionOperator`), also when the config names them itself."""
    for name in ('elu', 'relu', 'hedgehog', 'inline', 'mhla', 'ttt', 'identity'):
        op = build_attention_operator(dict(type=name, qkv_bias=False, proj_bias=False,
                                           attn_drop=0.25, proj_drop=0.5), C, HEADS)
        assert op.qkv.bias is None and op.proj.bias is None
        assert op.attn_drop.p == 0.25 and op.proj_drop.p == 0.5


# ---------------------------------------------------------------------- kernel operators
@pytest.mark.parametrize('name,phi', [('elu', lambda t: F.elu(t) + 1), ('relu', F.relu)])
def test_kernel_attention_map_uses_the_operators_eps(name: str, phi):
    """A_ij = phi(q_i).phi(k_j) / (sum_l phi(q_i).phi(k_l) + N eps) (module docstring), with
    the operator's ``eps`` (0.5: visible; rows then sum to less than 1)."""
    op = randomise_(build_attention_operator(dict(type=name, eps=0.5), C, HEADS)).eval()
    x = tokens((2, 7, C))
    q, k, _ = qkv64(op, x)
    scores = phi(q) @ phi(k).transpose(-2, -1)
    expected = scores / (scores.sum(-1, keepdim=True) + 7 * 0.5)
    with torch.no_grad():
        assert_close64(op.attention_map(x), expected)


def test_hedgehog_attention_map_uses_the_operators_eps():
    """Hedgehog's map: the kernel map of phi(x) = [softmax(x W), softmax(-x W)] (queries with
    ``feature_q``, keys with ``feature_k``) and the operator's ``eps`` (0.5, N eps on the sum)."""
    op = randomise_(build_attention_operator(dict(type='hedgehog', feature_dims=5, eps=0.5),
                                             C, HEADS), std=0.5).eval()
    x = tokens((2, 7, C))
    q, k, _ = qkv64(op, x)

    def phi(t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        logits = t @ weight.double()
        return torch.cat([logits.softmax(-1), (-logits).softmax(-1)], dim=-1)

    scores = phi(q, op.feature_q) @ phi(k, op.feature_k).transpose(-2, -1)
    expected = scores / (scores.sum(-1, keepdim=True) + 7 * 0.5)
    with torch.no_grad():
        assert_close64(op.attention_map(x), expected)


@pytest.mark.parametrize('cfg,match', [
    (dict(type='hedgehog', feature_dims=0), 'feature_dims must be >= 1, got 0'),
    (dict(type='hedgehog', feature_init='zeros'), "Unknown Hedgehog feature_init 'zeros'"),
])
def test_bad_hedgehog_options_fail_at_build_time(cfg: dict, match: str):
    """A Hedgehog map without features, or an init that does not exist, is refused when the
    operator is built (not a silent empty map / a default init)."""
    with pytest.raises(ValueError, match=match):
        build_attention_operator(cfg, C, HEADS)


@pytest.mark.parametrize('feature_map', ['identity', 'hedgehog', 'softmax'])
def test_kernel_operator_refuses_a_map_that_is_not_positive(feature_map: str):
    """:class:`KernelLinearAttention` divides by phi(q) z + eps, which only the positive maps
    (ELU + 1, ReLU) keep > 0: any other map is refused, naming the operators to use."""
    from mmlinvit.layers.attention.kernel_linear import KernelLinearAttention
    with pytest.raises(ValueError, match="needs a positive feature map, 'elu' or 'relu'"):
        KernelLinearAttention(C, HEADS, feature_map=feature_map)


def test_kernel_operators_default_eps_is_one_in_a_million():
    """The documented normaliser epsilon of kernel linear attention (``+1e-6``, reference notes
    and the operators' docs) is the default of every kernel operator: with q . kbar = 1e-3
    exactly (identity map) the row is divided by 1e-3 + 1e-6; ELU / ReLU: N eps on the sum."""
    ops = {name: build_attention_operator(name, C, HEADS)
           for name in ('elu', 'relu', 'hedgehog', 'identity')}
    assert {name: op.eps for name, op in ops.items()} == {
        'elu': 1e-6, 'relu': 1e-6, 'hedgehog': 1e-6, 'identity': 1e-6}
    # identity: one key / query pair with q . kbar = 1e-3 and v = 1 -> out = 1e-3 / (1e-3 + eps)
    op = ops['identity']
    q = torch.zeros(1, 1, 1, D, dtype=torch.float64)
    q[..., 0] = 1e-3
    k = torch.zeros(1, 1, 1, D, dtype=torch.float64)
    k[..., 0] = 1.0
    v = torch.ones(1, 1, 1, D, dtype=torch.float64)
    out = op.mix(q.float(), k.float(), v.float(), None, 0)
    torch.testing.assert_close(out.double(), v * 1e-3 / (1e-3 + 1e-6), rtol=1e-5, atol=0)


# ---------------------------------------------------------------------- MHLA
def mhla_reference64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_of: torch.Tensor,
                     mixing: torch.Tensor, eps_on_sum: float
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Block-mixed ReLU linear attention written out in float64 (module docstring):
    A_ij = m_{a(i), b(j)} phi(q_i).phi(k_j) / safe(sum_l m_{a(i), b(l)} phi(q_i).phi(k_l)),
    ``safe(t) = t + e sign(t)`` (sign(0) = +1) with ``e = eps_on_sum`` on the summed
    normaliser; returns (map, map @ v)."""
    scores = F.relu(q) @ F.relu(k).transpose(-2, -1)  # (B, H, N, N)
    weights = mixing[block_of][:, block_of]  # (N, N)
    num = weights * scores
    den = num.sum(-1, keepdim=True)
    safe = torch.where(den >= 0, den + eps_on_sum, den - eps_on_sum)
    attn = num / safe
    return attn, attn @ v


@pytest.mark.parametrize('eps_placement', ['mean', 'sum'])
def test_mhla_eps_placement_in_the_linear_path_and_the_map(eps_placement: str):
    """``eps`` (0.5: visible) enters the normaliser averaged over the N tokens (``'mean'``: N eps
    on the sum) or summed over them (``'sum'``: eps on the sum, the public code), in the O(N)
    path and in the explicit map alike; a learned mixing matrix (2 x 2 blocks of a 4 x 4
    grid, row-major block ids)."""
    n, eps = 16, 0.5
    op = randomise_(build_attention_operator(
        dict(type='mhla', eps=eps, eps_placement=eps_placement, local_kernel_size=0), C,
        HEADS)).eval()
    with torch.no_grad():  # a learned matrix, kept positive: well-conditioned rows
        op.block_mixing.abs_().add_(0.1)
    x = tokens((2, n, C))
    q, k, v = qkv64(op, x)
    rows, cols = torch.meshgrid(torch.arange(4), torch.arange(4), indexing='ij')
    block_of = ((rows // 2) * 2 + cols // 2).flatten()
    eps_on_sum = eps * n if eps_placement == 'mean' else eps
    attn, out = mhla_reference64(q, k, v, block_of, op.block_mixing.double(), eps_on_sum)
    with torch.no_grad():
        assert_close64(op.attention_map(x, (4, 4), 0), attn)
        assert_close64(op(x, (4, 4), 0), project64(op, out))


@pytest.mark.parametrize('option,value,match', [
    ('block_grid', (2, 0), 'block_grid must be a positive int or'),
    ('block_grid', 0, 'block_grid must be a positive int or'),
    ('feature_eps', True, 'feature_eps must be a finite number >= 0'),
    ('feature_eps', float('inf'), 'feature_eps must be a finite number >= 0'),
    ('feature_eps', float('nan'), 'feature_eps must be a finite number >= 0'),
    ('local_kernel_size', 4, 'local_kernel_size must be odd'),
    ('mixing_init', 'uniform', "Unknown mixing_init 'uniform'"),
])
def test_mhla_bad_options_are_named_at_build_time(option: str, value, match: str):
    """An empty block axis, a boolean / non-finite ``feature_eps``, an even local kernel or an
    unknown init are refused with the option named (not an empty block / a NaN feature map)."""
    with pytest.raises(ValueError, match=match):
        build_attention_operator({'type': 'mhla', option: value}, C, HEADS)


@pytest.mark.parametrize('tau', [0.0, -1.0, float('nan'), float('inf')])
def test_mhla_softmax_init_refuses_a_non_positive_temperature(tau: float):
    """FINDING (fails on the original ``mhla.py``): m_a = softmax_b(-d_ab / tau) needs a finite
    tau > 0; the original built tau = 0 into an all-NaN ``block_mixing`` (-0 / 0 on the
    diagonal; every output NaN) and tau < 0 into an inverted init (the own block the
    smallest weight), silently.  Needs the check in ``MultiHeadLinearAttention.__init__``."""
    with pytest.raises(ValueError, match='mixing_tau must be a finite number > 0'):
        build_attention_operator(dict(type='mhla', mixing_tau=tau), C, HEADS)
    # the public inits do not use tau: no check there
    build_attention_operator(dict(type='mhla', mixing_tau=tau, mixing_init='cos'), C, HEADS)


def test_mhla_default_softmax_init_has_temperature_one():
    """Default ``mixing_tau = 1`` (module docstring: "own block 0.51" on the 2 x 2 grid):
    m_a = softmax_b(-|c_a - c_b|), distances 0, 1, 1, sqrt(2) in block units."""
    op = build_attention_operator('mhla', C, HEADS)
    dists = torch.tensor([0.0, 1.0, 1.0, math.sqrt(2.0)], dtype=torch.float64)
    own = (torch.exp(-dists) / torch.exp(-dists).sum())[0].item()
    assert abs(own - 0.51) < 0.01
    assert op.block_mixing[0, 0].item() == pytest.approx(own, rel=1e-6)
    assert op.block_mixing[3, 3].item() == pytest.approx(own, rel=1e-6)


def test_mhla_init_extra_parameters_resets_the_public_norms():
    """``init_extra_parameters`` (module docstring: what a softmax checkpoint leaves the
    operator's own parameters at) puts ``input_norm`` back to weight 1 / bias 0 and
    ``q_norm`` / ``k_norm`` back to weight 1, and the block mixing back to its init."""
    op = randomise_(build_attention_operator(dict(type='mhla', input_norm=True, qk_norm=True),
                                             C, HEADS))
    op.init_extra_parameters()
    for weight in (op.input_norm.weight, op.q_norm.weight, op.k_norm.weight):
        assert torch.equal(weight, torch.ones(C))
    assert torch.equal(op.input_norm.bias, torch.zeros(C))
    dists = torch.tensor([0.0, 1.0, 1.0, math.sqrt(2.0)])
    torch.testing.assert_close(op.block_mixing[0].detach(), (-dists).softmax(0))


# ---------------------------------------------------------------------- InLine
def gelu64(t: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU, as ``nn.GELU()`` of the InLine reference code."""
    return 0.5 * t * (1 + torch.erf(t / math.sqrt(2.0)))


def grouped_pointwise64(x: torch.Tensor, conv: torch.nn.Conv1d, groups: int) -> torch.Tensor:
    """A grouped 1 x 1 Conv1d on (B, C_in) vectors: block-diagonal matmul per group, + bias."""
    w = conv.weight.double()[..., 0]  # (C_out, C_in / groups)
    c_out, c_in_g = w.shape
    c_out_g = c_out // groups
    outs = [x[:, g * c_in_g:(g + 1) * c_in_g] @ w[g * c_out_g:(g + 1) * c_out_g].T
            for g in range(groups)]
    return torch.cat(outs, dim=1) + conv.bias.double()


def test_inline_with_local_residual_and_prefix_token_equals_the_formula():
    """InLine (s = d^-1/2, all N tokens, prefix included): out_i = s q_i (K^T V / N)
    + (1 - s q_i.kbar) vbar, plus, on the patch tokens only, a 3 x 3 depthwise 'same'
    convolution of V whose kernel (channel c: rows [9 c, 9 c + 9) row-major) is G(mean of ALL
    tokens of x), G = grouped 1 x 1 conv, exact GELU, grouped 1 x 1 conv (``num_heads``
    groups).  Tokens with an offset make the GELU's exact form visible."""
    op = randomise_(build_attention_operator(dict(type='inline', local_residual=True), C,
                                             HEADS)).eval()
    hw, prefix = (3, 4), 1
    n = prefix + 12
    x = tokens((2, n, C)) + 1.5
    q, k, v = qkv64(op, x)
    s = D**-0.5
    kbar, vbar = k.mean(-2, keepdim=True), v.mean(-2, keepdim=True)
    attn = s * q @ (k.transpose(-2, -1) @ v / n) + (1 - s * q @ kbar.transpose(-2, -1)) * vbar
    gen = op.local_kernel_generator
    hidden = gelu64(grouped_pointwise64(x.double().mean(1), gen[0], HEADS))
    kernels = grouped_pointwise64(hidden, gen[2], HEADS).reshape(2, C, 3, 3)
    v_grid = v[:, :, prefix:].transpose(1, 2).reshape(2, 12, C).transpose(1, 2).reshape(2, C, *hw)
    pad = F.pad(v_grid, (1, 1, 1, 1))
    local = sum(pad[..., i:i + hw[0], j:j + hw[1]] * kernels[..., i, j, None, None]
                for i in range(3) for j in range(3))  # (B, C, h, w)
    local = local.flatten(2).reshape(2, HEADS, D, 12).transpose(-2, -1)  # (B, H, 12, d)
    expected = attn + F.pad(local, (0, 0, prefix, 0))
    with torch.no_grad():
        assert_close64(op(x, hw, prefix), project64(op, expected), tol=2e-5)
        assert_close64(op.forward_reference(x, hw, prefix), project64(op, expected), tol=2e-5)


# ---------------------------------------------------------------------- TTT
def test_ttt_init_extra_parameters_restores_vittts_init():
    """``init_extra_parameters`` (what a softmax checkpoint's transfer calls) re-draws every
    extra parameter of ViT^3: truncated normal std 0.02 for ``inner_w1`` / ``inner_w2`` /
    ``conv_inner_weight`` / ``conv_qkv.weight`` / ``conv_proj.weight``, zero ``conv_qkv.bias``,
    and PyTorch's default Conv2d init for ``cpe`` (kaiming-uniform a = sqrt(5): weights and
    bias in U(-1/3, 1/3) for the 9-tap depthwise kernel), whatever the values before."""
    op = build_attention_operator('ttt', 64, 4)  # d = 16: enough entries for the std checks
    with torch.no_grad():
        for p in op.parameters():
            p.fill_(5.0)
    op.init_extra_parameters()
    for name in ('inner_w1', 'inner_w2', 'conv_inner_weight', 'conv_qkv.weight',
                 'conv_proj.weight'):
        p = op.get_parameter(name)
        assert 0.015 < p.std().item() < 0.025, name
        assert p.abs().max().item() <= 2.0, name
    assert torch.equal(op.conv_qkv.bias, torch.zeros_like(op.conv_qkv.bias))
    bound = 1 / 3
    for p in (op.cpe.weight, op.cpe.bias):
        assert p.abs().max().item() <= bound
        assert p.abs().max().item() > 0.8 * bound
    assert op.qkv.weight.eq(5.0).all()  # softmax-named parameters are not touched


@pytest.mark.parametrize('hw,prefix', [((2, 5), 0), ((4, 3), 2)])
def test_ttt_positional_conv_on_a_non_square_grid(hw: Tuple[int, int], prefix: int):
    """``pre_attention``: x + cpe(x) on the row-major h x w patch grid (3 x 3 depthwise
    cross-correlation, zero 'same' padding, with bias); prefix tokens unchanged."""
    op = randomise_(build_attention_operator('ttt', C, HEADS))
    h, w = hw
    x = tokens((2, prefix + h * w, C))
    grid = x[:, prefix:].double().reshape(2, h, w, C).permute(0, 3, 1, 2)
    pad = F.pad(grid, (1, 1, 1, 1))
    weight = op.cpe.weight.double()[:, 0]  # (C, 3, 3)
    conv = sum(pad[..., i:i + h, j:j + w] * weight[:, i, j, None, None]
               for i in range(3) for j in range(3)) + op.cpe.bias.double()[:, None, None]
    expected = x.double().clone()
    expected[:, prefix:] += conv.flatten(2).transpose(1, 2)
    with torch.no_grad():
        assert_close64(op.pre_attention(x, hw, prefix), expected)


# ---------------------------------------------------------------------- block pieces
def test_layer_scale_and_drop_path_defaults_are_timms():
    """``LayerScale(dims)`` starts at timm's / DINOv2's 1e-5; ``DropPath(p)`` is the identity in
    evaluation whatever p and scales kept samples by 1 / (1 - p) in training (timm's
    ``DropPath`` with ``scale_by_keep=True``, same seed, same mask)."""
    from timm.layers import DropPath as TimmDropPath
    from timm.layers import LayerScale as TimmLayerScale

    from mmlinvit.layers.transformer import DropPath, LayerScale
    torch.testing.assert_close(LayerScale(16).gamma.detach(),
                               TimmLayerScale(16).gamma.detach(), rtol=1e-6, atol=0)
    x = tokens((64, 3, 4))
    assert torch.equal(DropPath(0.5).eval()(x), x)
    torch.manual_seed(3)
    ours = DropPath(0.25).train()(x)
    torch.manual_seed(3)
    theirs = TimmDropPath(0.25).train()(x)
    torch.testing.assert_close(ours, theirs)


def test_swiglu_mlp_equals_timms_packed_swiglu():
    """``SwiGLUMlp`` is DINOv2's ``SwiGLUFFN`` / timm's ``SwiGLUPacked`` (same ``fc1`` / ``fc2``
    keys): fc1's first half is gated by SiLU, its second half multiplies, fc2 projects back."""
    from timm.layers import SwiGLUPacked

    from mmlinvit.layers.transformer import SwiGLUMlp
    ours = randomise_(SwiGLUMlp(C, 24)).eval()
    theirs = SwiGLUPacked(C, 48).eval()
    theirs.load_state_dict(ours.state_dict())
    x = tokens((2, 5, C))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x))


def test_drop_path_with_probability_one_drops_to_zero_as_timm():
    """FINDING (fails on the original ``DropPath``): with ``drop_prob = 1`` every sample's
    branch is dropped, so the output is 0 (timm's ``drop_path`` skips the 1 / keep scaling
    when keep = 0); the original computed ``x * 0 / 0`` = NaN for every entry.  Needs the fix
    in ``mmlinvit/layers/transformer.py`` (``DropPath.forward``)."""
    from timm.layers import DropPath as TimmDropPath

    from mmlinvit.layers.transformer import DropPath
    x = tokens((4, 3, 2))
    out = DropPath(1.0).train()(x)
    assert torch.equal(out, torch.zeros_like(x))
    torch.testing.assert_close(out, TimmDropPath(1.0).train()(x))


@pytest.mark.parametrize('kwargs,error,match', [
    (dict(mlp_type='moe'), KeyError, "Unknown mlp_type 'moe'"),
    (dict(act='relu6'), KeyError, "Unknown activation 'relu6'"),
])
def test_block_refuses_unknown_mlp_type_and_activation(kwargs: dict, error, match: str):
    """A typo in ``mlp_type`` / ``act`` is named at build time (not an AttributeError at the
    first forward, nor a silently different MLP)."""
    from mmlinvit.layers import TransformerBlock
    with pytest.raises(error, match=match):
        TransformerBlock(C, HEADS, 2 * C, **kwargs)


def test_quick_gelu_and_silu_activations():
    """``quick_gelu`` is OpenAI CLIP's x * sigmoid(1.702 x); ``silu`` is x * sigmoid(x)."""
    from mmlinvit.layers.transformer import build_activation
    x = torch.linspace(-4, 4, 81, dtype=torch.float64)
    torch.testing.assert_close(build_activation('quick_gelu')(x), x * torch.sigmoid(1.702 * x))
    torch.testing.assert_close(build_activation('silu')(x), x * torch.sigmoid(x))
    torch.testing.assert_close(build_activation('gelu')(x), gelu64(x))


# ---------------------------------------------------------------------- RMS norms
def test_norm_defaults_are_mamba2s():
    """Defaults: eps 1e-5 (Mamba's RMSNorm), one group over all channels, and the gate before
    the normalisation (``norm_before_gate=False``, the Mamba-2 default of the docstring):
    rmsnorm(x * silu(z)); small tokens make eps visible."""
    from mmlinvit.layers.norm import GatedRMSNorm, RMSNorm
    x, z = 0.003 * tokens((3, 16)), tokens((3, 16), seed=2)

    def rms(t: torch.Tensor) -> torch.Tensor:
        return t / (t.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()

    with torch.no_grad():
        assert_close64(RMSNorm(16)(x), rms(x.double()))
        assert_close64(GatedRMSNorm(16)(x, z), rms(x.double() * F.silu(z.double())))


def test_gated_rms_norm_group_size_must_divide_dims():
    """10 channels cannot be split into groups of 4: refused with both numbers."""
    from mmlinvit.layers.norm import GatedRMSNorm
    with pytest.raises(ValueError, match=r'dims \(10\) must be a multiple of group_size \(4\)'):
        GatedRMSNorm(10, group_size=4)


# ---------------------------------------------------------------------- position embeddings
def test_position_embedding_inputs_are_validated():
    """An unknown ``pos_interp`` mode, a sin-cos width not divisible by 4 and a grid record
    that disagrees with the row count are refused (not a silent fallback / a short embedding
    / a wrong grid)."""
    from mmlinvit.layers.pos_embed import (checkpoint_pos_grid, resample_pos_grid,
                                           sincos_pos_embed_2d)
    with pytest.raises(KeyError, match="Unknown pos_interp 'bilinear'"):
        resample_pos_grid(tokens((1, 12, 4)), (3, 4), (4, 4), 'bilinear')
    with pytest.raises(ValueError, match='dims % 4 == 0, got 6'):
        sincos_pos_embed_2d((2, 2), 6)
    with pytest.raises(ValueError, match='records a 4x8 position grid'):
        checkpoint_pos_grid(30, (4, 8))
    assert checkpoint_pos_grid(32, (4, 8)) == (4, 8)
    with pytest.raises(ValueError, match='no square grid'):
        checkpoint_pos_grid(32)
    assert checkpoint_pos_grid(36) == (6, 6)


def test_sincos_default_temperature_is_ten_thousand():
    """MoCo-v3 / MAE: omega_i = 1 / 10000^(i / (dims / 4)); row r, column c ->
    [sin(r omega), cos(r omega), sin(c omega), cos(c omega)]."""
    from mmlinvit.layers.pos_embed import sincos_pos_embed_2d
    dims, (h, w) = 16, (3, 5)
    omega = 1.0 / 10000.0**(torch.arange(4, dtype=torch.float64) / 4)
    rows = torch.arange(h, dtype=torch.float64).repeat_interleave(w)[:, None] * omega
    cols = torch.arange(w, dtype=torch.float64).repeat(h)[:, None] * omega
    expected = torch.cat([rows.sin(), rows.cos(), cols.sin(), cols.cos()], dim=1)[None]
    assert_close64(sincos_pos_embed_2d((h, w), dims), expected)
