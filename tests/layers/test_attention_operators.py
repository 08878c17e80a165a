"""The linear attention operator zoo: O(N) paths vs O(N^2) references, maps, backbone use.

ViT^3's TTT (no attention map) takes part in the generic tests here; its formulas are checked
in test_ttt.py.
"""
import pytest
import torch
import torch.nn.functional as F

from mmlinvit.backbones import LinearVisionTransformer, VisionTransformer
from mmlinvit.converters import CheckpointMismatchError
from mmlinvit.layers.attention import ATTENTION_OPERATORS, build_attention_operator
from mmlinvit.ops.mhla import block_centre_mixing, patch_block_index
from mmlinvit.ops.patch_grid import depthwise_conv2d, depthwise_conv2d_reference

C, HEADS = 32, 4  # head_dims 8

OPERATOR_CFGS = {
    'elu': dict(type='elu'),
    'relu': dict(type='relu'),
    'hedgehog': dict(type='hedgehog', feature_dims=8),
    'hedgehog_shared': dict(type='hedgehog', feature_dims=5, share_feature_map=True),
    'identity': dict(type='identity'),
    'inline': dict(type='inline'),
    'inline_local': dict(type='inline', local_residual=True),
    'mhla': dict(type='mhla'),
    'mhla_per_head_2x3': dict(type='mhla', per_head_mixing=True, block_grid=(2, 3)),
    # The public MHLA code's choices (all but its normaliser; tests/layers/
    # test_operators_official.py checks them against the official module).
    'mhla_public': dict(type='mhla', input_norm=True, qk_norm=True, mixing_init='linear',
                        feature_eps=1e-6, eps_placement='sum'),
    'ttt': dict(type='ttt'),
    'ttt_no_conv': dict(type='ttt', conv_branch=False),
}
#: Operators with an explicit N x N map and an O(N^2) ``forward_reference``.
MAP_OPERATORS = sorted(name for name, cfg in OPERATOR_CFGS.items()
                       if ATTENTION_OPERATORS.get(cfg['type']).has_attention_map)
# (hw_shape, num_prefix_tokens): odd / ragged token counts, non-square grids, prefix tokens.
GRIDS = [((3, 5), 0), ((3, 5), 1), ((4, 7), 2), ((5, 4), 1), ((1, 1), 1)]


def build(name: str) -> torch.nn.Module:
    """An operator in eval mode with its extra parameters moved away from their init."""
    op = build_attention_operator(OPERATOR_CFGS[name], C, HEADS).eval()
    with torch.no_grad():
        for pname, p in op.named_parameters():
            if pname.startswith(('qkv.', 'proj.')):
                continue
            if pname == 'block_mixing':  # keep the mixing positive (a valid attention)
                p.add_(0.3 * torch.rand_like(p))
            else:
                p.add_(0.2 * torch.randn_like(p))
    return op


def condition_identity(op: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The identity map's normaliser q_i.mean(k) must be far from 0 for a 1e-5 comparison
    (it is ill-conditioned by design): share q/k weights and give the tokens a common mean."""
    with torch.no_grad():
        op.qkv.weight[C:2 * C] = op.qkv.weight[:C]
        op.qkv.bias[C:2 * C] = op.qkv.bias[:C]
    return x + 3.0


# ---------------------------------------------------------------------- O(N) vs O(N^2)
@pytest.mark.parametrize('hw,prefix', GRIDS)
@pytest.mark.parametrize('name', MAP_OPERATORS)
def test_linear_path_matches_quadratic_reference(name, hw, prefix):
    op = build(name)
    x = torch.randn(2, hw[0] * hw[1] + prefix, C)
    if name == 'identity':
        x = condition_identity(op, x)
    with torch.no_grad():
        out = op(x, hw, prefix)
        ref = op.forward_reference(x, hw, prefix)
    assert out.shape == x.shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('name', sorted(OPERATOR_CFGS))
def test_gradients_reach_every_parameter(name):
    op = build(name).train()
    hw, prefix = (3, 5), 1
    x = torch.randn(2, 16, C, requires_grad=True)
    # pre_attention: the block-level step before norm1 (identity except TTT's x + cpe(x))
    op(op.pre_attention(x, hw, prefix), hw, prefix).square().mean().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for pname, p in op.named_parameters():
        assert p.grad is not None, f'{name}: no gradient for {pname}'
        assert torch.isfinite(p.grad).all(), f'{name}: non-finite gradient for {pname}'
        assert p.grad.abs().sum() > 0, f'{name}: zero gradient for {pname}'


# ---------------------------------------------------------------------- precision / safety
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('name', sorted(OPERATOR_CFGS))
def test_low_precision_inputs_accumulate_in_fp32(name, dtype):
    """Sums over 257 tokens of k^T v reach ~1e5 (> fp16 max): only fp32 accumulation survives."""
    op = build(name)
    hw, prefix = (16, 16), 1
    n = hw[0] * hw[1] + prefix
    q = (0.5 + 0.1 * torch.rand(2, HEADS, n, C // HEADS)).to(dtype)
    k = (3.0 + torch.rand(2, HEADS, n, C // HEADS)).to(dtype)
    v = (100.0 + torch.rand(2, HEADS, n, C // HEADS)).to(dtype)
    out = op.mix(q, k, v, hw, prefix)
    ref = op.mix(q.float(), k.float(), v.float(), hw, prefix)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


@pytest.mark.parametrize('name', sorted(OPERATOR_CFGS))
def test_bfloat16_module_forward_is_finite(name):
    op = build(name).to(torch.bfloat16)
    hw, prefix = (3, 5), 1
    x = torch.randn(2, 16, C)
    if name == 'identity':
        x = condition_identity(op, x)
    out = op(x.to(torch.bfloat16), hw, prefix)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    ref = op.float()(x, hw, prefix)
    torch.testing.assert_close(out.float(), ref, rtol=0.1, atol=0.1 * ref.abs().max().item())


@pytest.mark.parametrize('name', ['relu', 'mhla'])
def test_relu_all_negative_queries_stay_finite(name):
    op = build(name)
    hw, prefix = (3, 5), 1
    shape = (2, HEADS, 16, C // HEADS)
    q, k, v = -torch.rand(shape) - 0.1, torch.randn(shape), torch.randn(shape)
    out = op.mix(q, k, v, hw, prefix)
    assert torch.isfinite(out).all()
    if name == 'relu':  # phi(q) == 0: numerator and normaliser vanish, output is exactly 0
        assert out.abs().max() == 0


def test_identity_normaliser_never_divides_by_zero():
    op = build_attention_operator('identity', C, HEADS)
    shape = (1, HEADS, 6, C // HEADS)
    k = torch.randn(shape)
    k = torch.cat([k[:, :, :3], -k[:, :, :3]], dim=2)  # mean(k) == 0 exactly -> q.kbar == 0
    out = op.mix(torch.randn(shape), k, torch.randn(shape), None, 0)
    assert torch.isfinite(out).all()


# ---------------------------------------------------------------------- maps
@pytest.mark.parametrize('hw,prefix', GRIDS)
def test_inline_rows_sum_to_one_and_can_be_negative(hw, prefix):
    op = build('inline')
    attn = op.attention_map(torch.randn(2, hw[0] * hw[1] + prefix, C), hw, prefix)
    torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:-1]), rtol=0, atol=1e-5)
    if attn.shape[-1] >= 8:  # signed: some weights are negative
        assert attn.min() < 0


@pytest.mark.parametrize('per_head', [False, True])
@pytest.mark.parametrize('hw,prefix', [((14, 14), 0), ((7, 5), 0), ((5, 7), 1), ((1, 3), 0),
                                       ((9, 4), 2), ((2, 2), 0)])
def test_mhla_rows_sum_to_one(hw, prefix, per_head):
    op = build_attention_operator(dict(type='mhla', per_head_mixing=per_head), C, HEADS)
    with torch.no_grad():
        op.block_mixing.add_(0.5 * torch.rand_like(op.block_mixing))
        # Shift the queries so phi(q_i).z is far above eps (otherwise rows sum to
        # den / (den + eps), and to 0 where all ReLU features of q_i vanish).
        op.qkv.bias[:C] += 1.0
    attn = op.attention_map(torch.randn(2, hw[0] * hw[1] + prefix, C), hw, prefix)
    torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:-1]), rtol=0, atol=1e-5)
    assert attn.min() >= 0


def test_mhla_identity_mixing_is_block_local():
    op = build_attention_operator('mhla', C, HEADS)
    with torch.no_grad():
        op.block_mixing.copy_(torch.eye(4))
    hw = (5, 6)
    attn = op.attention_map(torch.randn(1, 30, C), hw, 0)
    block = patch_block_index(hw, (2, 2))
    outside = block[:, None] != block[None, :]
    assert attn[..., outside].abs().max() == 0
    assert attn[..., ~outside].min() >= 0


def test_mhla_normaliser_is_invariant_to_row_scaling_of_the_mixing():
    """out_i = phi(q_i) sum_b m_ab KV_b / phi(q_i) sum_b m_ab z_b: scaling row a of m by c_a > 0
    cancels.  The public code (mixing the per-query normalisers) does not have this property."""
    op = build('mhla')
    op.local_conv = None  # attention term only
    op.eps = 1e-12  # isolate the normaliser from the epsilon
    hw = (6, 6)
    q, k, v = (torch.randn(2, HEADS, 36, C // HEADS) for _ in range(3))
    q = q.abs() + 0.1  # phi(q) > 0 everywhere
    base = op.mix(q, k, v, hw, 0)
    with torch.no_grad():
        op.block_mixing.mul_(torch.tensor([0.5, 2.0, 3.0, 7.0])[:, None])
    torch.testing.assert_close(op.mix(q, k, v, hw, 0), base, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('hw,blocks,sizes', [((14, 14), (2, 2), [49] * 4),
                                             ((5, 7), (2, 2), [6, 8, 9, 12]),
                                             ((1, 3), (2, 2), [0, 0, 1, 2])])
def test_mhla_block_split_any_grid(hw, blocks, sizes):
    block = patch_block_index(hw, blocks)
    assert torch.bincount(block, minlength=4).tolist() == sizes


def test_mhla_mixing_init_from_block_centre_distance():
    m = block_centre_mixing((2, 2))
    torch.testing.assert_close(m.sum(-1), torch.ones(4))
    # 2 x 2 blocks: distances 0, 1, 1, sqrt(2) from block 0 -> softmax(-d)
    expected = torch.tensor([0.0, 1.0, 1.0, 2.0**0.5]).neg().softmax(-1)
    torch.testing.assert_close(m[0], expected)
    off_diagonal = m - torch.diag(m.diagonal())
    assert (m.diagonal() > off_diagonal.max(dim=-1).values).all()


MHLA_PUBLIC_OPTIONS = {k: v for k, v in OPERATOR_CFGS['mhla_public'].items() if k != 'type'}


def test_mhla_public_options_are_off_by_default():
    """The seed paper's setting is unchanged: no extra norms or parameters, relu, eps on the
    mean-scaled normaliser."""
    op = build_attention_operator('mhla', C, HEADS)
    assert op.input_norm is None and op.q_norm is None and op.k_norm is None
    assert op.feature_eps == 0.0 and op.eps_placement == 'mean' and op.mixing_init == 'softmax'
    assert sorted(k for k in op.state_dict() if not k.startswith(('qkv.', 'proj.'))) == [
        'block_mixing', 'local_conv.bias', 'local_conv.weight']
    public = build_attention_operator(OPERATOR_CFGS['mhla_public'], C, HEADS)
    assert sorted(k for k in public.state_dict() if not k.startswith(('qkv.', 'proj.'))) == [
        'block_mixing', 'input_norm.bias', 'input_norm.weight', 'k_norm.weight',
        'local_conv.bias', 'local_conv.weight', 'q_norm.weight']
    assert public.input_norm.eps == 1e-5 and public.q_norm.eps is None  # nn defaults


@pytest.mark.parametrize('option,value,match', [
    ('mixing_init', 'exp', r"available: \('softmax', 'cos', 'linear'\)"),
    ('eps_placement', 'total', r"available: \('mean', 'sum'\)"),
    ('feature_eps', -1e-6, 'feature_eps must be a finite number >= 0'),
    ('feature_eps', float('nan'), 'feature_eps must be a finite number >= 0'),
    ('input_norm', 'yes', 'input_norm must be True or False'),
    ('qk_norm', 1, 'qk_norm must be True or False'),
    ('feature_map', 'identity', r"valid: \('relu', 'elu'\)"),
])
def test_mhla_bad_options_fail_at_build_time(option, value, match):
    with pytest.raises(ValueError, match=match):
        build_attention_operator(dict(type='mhla', **{option: value}), C, HEADS)


def test_mhla_public_options_compute_what_they_say():
    """input_norm: LayerNorm before qkv; qk_norm: RMSNorm over all C channels of q and k before
    the head split; feature_eps: phi + eps; eps_placement='sum': eps / N on the mean-scaled
    normaliser (explicit map against the formulas)."""
    op = build('mhla_public')
    hw, n = (4, 5), 20
    x = torch.randn(2, n, C)
    with torch.no_grad():
        q, k, v = op.split_qkv(x)
        xn = F.layer_norm(x, (C, ), op.input_norm.weight, op.input_norm.bias, 1e-5)
        q_ref, k_ref, v_ref = F.linear(xn, op.qkv.weight, op.qkv.bias).chunk(3, dim=-1)
        q_ref = F.rms_norm(q_ref, (C, ), op.q_norm.weight)
        k_ref = F.rms_norm(k_ref, (C, ), op.k_norm.weight)
        for got, ref in ((q, q_ref), (k, k_ref), (v, v_ref)):
            torch.testing.assert_close(got, ref.unflatten(-1, (HEADS, -1)).transpose(1, 2))
        attn = op.attention_map(x, hw, 0)
        phi_q, phi_k = F.relu(q) + 1e-6, F.relu(k) + 1e-6
        weights = op.token_mixing_weights(n, hw, 0, x.device)
        scores = weights * (phi_q @ phi_k.transpose(-2, -1))
        expected = scores / (scores.sum(-1, keepdim=True) + op.eps)  # eps on the sum
    torch.testing.assert_close(attn, expected, rtol=1e-5, atol=1e-7)


def test_mhla_feature_eps_and_eps_placement_matter_for_dead_queries():
    """A query with no positive ReLU feature reads 0 without ``feature_eps`` and an average of
    V with it, and there the eps placement changes the result (N * eps vs eps on the sum)."""
    hw = (4, 4)
    shape = (1, HEADS, 16, C // HEADS)
    q = torch.randn(shape)
    q[:, :, 0] = -q[:, :, 0].abs() - 0.1  # query 0: dead in every head
    k, v = torch.randn(shape), torch.randn(shape)

    def mix(**options):
        return build_attention_operator(dict(type='mhla', local_kernel_size=0, **options), C,
                                        HEADS).mix(q, k, v, hw, 0)[:, :, 0]

    assert mix().abs().max() == 0
    with_eps = mix(feature_eps=1e-6, eps_placement='sum')
    assert with_eps.abs().max() > 0.05
    assert (mix(feature_eps=1e-6) - with_eps).abs().max() > 0.01
    torch.testing.assert_close(mix(feature_eps=1e-6, eps=1e-6 / 16), with_eps)


def test_mhla_linear_mixing_init():
    """``'linear'``: 1 - d / max d, columns summing to 1 (the public code's
    ``BlockDistanceConv(transform='linear')``); 1 x 1 grid: 1."""
    m = build_attention_operator(dict(type='mhla', mixing_init='linear'), C, HEADS).block_mixing
    d = torch.tensor([0.0, 1.0, 1.0, 2.0**0.5])
    col = 1 - d / 2.0**0.5
    torch.testing.assert_close(m.detach()[:, 0], col / col.sum())
    torch.testing.assert_close(m.detach().sum(0), torch.ones(4))
    one = build_attention_operator(dict(type='mhla', mixing_init='linear', block_grid=1), C,
                                   HEADS)
    assert torch.equal(one.block_mixing.detach(), torch.ones(1, 1))


MHLA_VIT = dict(embed_dims=64, num_layers=2, num_heads=2, mlp_hidden_dims=128)
MHLA_TOKENS = dict(with_cls_token=False, pos_embed_type='sincos', out_type='avg_featmap')


def mhla_vit(attn_cfg, pretrained: str = None) -> VisionTransformer:
    return VisionTransformer(MHLA_VIT, family='deit', img_size=32, patch_size=8,
                             attn_cfg=attn_cfg, pretrained=pretrained, **MHLA_TOKENS)


def test_mhla_public_options_in_vision_transformer_and_checkpoint_round_trip(tmp_path):
    """``attn_cfg=dict(type='mhla', ...)`` with the public options trains, and a checkpoint of
    it (norm parameters included) loads back with every key."""
    cfg = OPERATOR_CFGS['mhla_public']
    model = mhla_vit(cfg)
    model.init_weights()
    attn = model.blocks[1].attn
    assert attn.input_norm is not None and attn.q_norm is not None and attn.feature_eps == 1e-6
    assert torch.equal(attn.q_norm.weight, torch.ones(64))
    out = model(torch.randn(2, 3, 32, 40))[0]
    assert out.shape == (2, 64) and torch.isfinite(out).all()
    out.square().mean().backward()
    for name in ('input_norm.weight', 'input_norm.bias', 'q_norm.weight', 'k_norm.weight'):
        assert attn.get_parameter(name).grad.abs().sum() > 0, name
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    path = str(tmp_path / 'mhla_public.pth')
    torch.save(model.state_dict(), path)
    loaded = mhla_vit(cfg, pretrained=path)
    loaded.init_weights()
    assert loaded.load_report.missing == [] and loaded.load_report.initialised == {}
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(x)[0], model.eval()(x)[0])
    # A plain MHLA checkpoint (operator parameters, but no norms) does not fit: an error.
    torch.save(mhla_vit('mhla').state_dict(), str(tmp_path / 'mhla.pth'))
    with pytest.raises(CheckpointMismatchError, match='input_norm'):
        mhla_vit(cfg, pretrained=str(tmp_path / 'mhla.pth')).init_weights()


def test_softmax_checkpoint_into_mhla_public_initialises_and_reports_the_norms(tmp_path):
    teacher = VisionTransformer(MHLA_VIT, family='deit', img_size=32, patch_size=8, **MHLA_TOKENS)
    path = str(tmp_path / 'softmax.pth')
    torch.save(teacher.state_dict(), path)
    student = mhla_vit(OPERATOR_CFGS['mhla_public'], pretrained=path)
    with torch.no_grad():  # moved away from the init: the load must re-initialise nothing
        for blk in student.blocks:
            blk.attn.q_norm.weight.fill_(2.0)
    student.init_weights()
    report = student.load_report
    extras = [f'blocks.{i}.attn.{name}' for i in range(2)
              for name in ('block_mixing', 'input_norm.bias', 'input_norm.weight',
                           'k_norm.weight', 'local_conv.bias', 'local_conv.weight',
                           'q_norm.weight')]
    assert sorted(report.initialised) == sorted(extras) == sorted(report.missing)
    assert all('softmax counterpart' in reason for reason in report.initialised.values())
    assert torch.equal(student.blocks[0].attn.q_norm.weight, torch.full((64, ), 2.0))
    assert torch.equal(student.blocks[1].attn.qkv.weight, teacher.blocks[1].attn.qkv.weight)
    fresh = mhla_vit(OPERATOR_CFGS['mhla_public'])  # the operator's init: unit norms
    assert torch.equal(fresh.blocks[0].attn.input_norm.weight, torch.ones(64))
    assert torch.equal(fresh.blocks[0].attn.input_norm.bias, torch.zeros(64))


def test_depthwise_conv_matches_shift_reference():
    x = torch.randn(2, 6, 4, 5)
    for weight in (torch.randn(6, 5, 5), torch.randn(2, 6, 3, 3)):
        bias = torch.randn(6)
        torch.testing.assert_close(depthwise_conv2d(x, weight, bias),
                                   depthwise_conv2d_reference(x, weight, bias))


# ---------------------------------------------------------------------- errors / registry
def test_unknown_operator_lists_registered_names():
    with pytest.raises(KeyError) as err:
        build_attention_operator('not_an_operator', C, HEADS)
    for name in ('elu', 'relu', 'hedgehog', 'identity', 'inline', 'mhla', 'ttt', 'softmax'):
        assert name in str(err.value)
    with pytest.raises(KeyError, match='mhla'):
        VisionTransformer(dict(embed_dims=C, num_layers=1, num_heads=HEADS, mlp_hidden_dims=C),
                          attn_cfg='not_an_operator')


@pytest.mark.parametrize('name', ['mhla', 'ttt', 'inline_local'])
def test_spatial_operators_need_a_matching_grid(name):
    op = build(name)
    x = torch.randn(1, 16, C)
    with pytest.raises(ValueError, match='hw_shape'):
        op(x, None, 1)
    with pytest.raises(ValueError, match='imply'):
        op(x, (4, 4), 1)


# ---------------------------------------------------------------------- backbone
TINY = dict(embed_dims=64, num_layers=2, num_heads=2, mlp_hidden_dims=128)


@pytest.mark.parametrize('attn', sorted(set(ATTENTION_OPERATORS.names) - {'softmax'}) +
                         ['hybrid'])
def test_operators_plug_into_vision_transformer(attn):
    spatial_no_cls = attn in ('mhla', 'ttt')
    kwargs = (dict(pos_embed_type='sincos', with_cls_token=False, out_type='avg_featmap')
              if spatial_no_cls else dict(out_type='cls_token'))
    attn_cfg = ['softmax', 'elu'] if attn == 'hybrid' else attn
    model = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8, attn_cfg=attn_cfg,
                              **kwargs)
    teacher = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8, **kwargs)
    missing, unexpected = model.load_state_dict(teacher.state_dict(), strict=False)
    assert not unexpected  # every softmax checkpoint key has a home
    assert all(key.split('.')[2] == 'attn' for key in missing), missing
    out = model(torch.randn(2, 3, 32, 40))[0]  # 4 x 5 grid
    assert out.shape == (2, 64) and torch.isfinite(out).all()
    out.square().mean().backward()
    assert model.blocks[0].attn.qkv.weight.grad is not None


def test_linear_vision_transformer_defaults_to_elu_and_loads_softmax_weights():
    student = LinearVisionTransformer(TINY, family='deit', img_size=32, patch_size=8)
    assert all(cfg == 'elu' for cfg in student.attn_cfgs)
    assert all(type(blk.attn) is ATTENTION_OPERATORS.get('elu') for blk in student.blocks)
    teacher = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8)
    student.load_state_dict(teacher.state_dict(), strict=True)
    assert isinstance(student.blocks[0].attn, ATTENTION_OPERATORS.get('elu'))
    assert student(torch.randn(1, 3, 32, 32))[0].shape == (1, 64)
