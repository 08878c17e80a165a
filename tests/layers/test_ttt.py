"""ViT^3 TTT: the operator and its block against the paper's formulas written in this file.

The references below follow ViT^3 (LeapLabTHU/ViTTT ``ttt_block.py`` / ``vittt.py``): fused
``qkv: Linear(C, 3C + 3d)`` and ``proj: Linear(C + d, C)`` assembled from the operator's
weights, inner gradients by ``torch.autograd`` of the inner loss
``l = -scale * mean_tokens(sum_channels(f(k) * v))`` (scale 9^-0.5), per-column /
per-kernel clipping ``g / (||g|| + 1)``, one step with lr 1, two inner weights for the
simplified SwiGLU ``(q W1) * silu(q W2)``, an unfold-based depthwise conv for the 3x3 branch,
and a block ``x = x + cpe(x)`` before ``norm1``.  Nothing here calls the operator's helpers.
"""
import pytest
import torch
import torch.nn.functional as F

from mmlinvit.backbones import VisionTransformer
from mmlinvit.converters import load_pretrained
from mmlinvit.converters.loading import OPERATOR_EXTRA_KEY
from mmlinvit.layers import TransformerBlock
from mmlinvit.layers.attention import ATTENTION_OPERATORS, build_attention_operator
from mmlinvit.ops.ttt import depthwise_conv_inner_step, simplified_swiglu_inner_step
from mmlinvit.transfer import transfer_weights

C, HEADS = 64, 4  # head dim 16: d ** -0.5 = 0.25 is far from ViT^3's 9 ** -0.5
D = C // HEADS
SCALE = 9**-0.5
# (hw_shape, num_prefix_tokens): non-square, ragged, a 1 x 1 grid, and prefix tokens.
GRIDS = [((3, 5), 0), ((4, 7), 0), ((5, 4), 0), ((1, 1), 0), ((2, 3), 1), ((4, 3), 2)]
EXTRA_NAMES = {'inner_w1', 'inner_w2', 'conv_qkv.weight', 'conv_qkv.bias', 'conv_inner_weight',
               'conv_proj.weight', 'cpe.weight', 'cpe.bias'}


# ---------------------------------------------------------------------- references
def column_clip(g):
    """ViT^3: g / (g.norm(dim=-2) + 1), i.e. each column of the (d_in, d_out) gradient."""
    return g / (g.pow(2).sum(dim=-2, keepdim=True).sqrt() + 1.0)


def frobenius_clip(g):
    """The per-matrix clipping the paper does NOT use (to show the tests can tell them apart)."""
    return g / (g.pow(2).sum(dim=(-2, -1), keepdim=True).sqrt() + 1.0)


def kernel_clip(g):
    """ViT^3's 3x3 branch: each channel's kernel by its own Frobenius norm."""
    return g / (g.pow(2).sum(dim=(-2, -1), keepdim=True).sqrt() + 1.0)


def swiglu_step_reference(k, v, w1, w2, scale=SCALE, lr=1.0, clip=column_clip,
                          create_graph=False):
    """W1', W2' (B, H, d, d): autograd of l = -scale * mean_n sum_c (f(k) * v) per sample/head."""
    b = k.shape[0]
    with torch.enable_grad():
        w1s = w1.unsqueeze(0).repeat(b, 1, 1, 1)
        w2s = w2.unsqueeze(0).repeat(b, 1, 1, 1)
        if not w1s.requires_grad:
            w1s.requires_grad_(True)
            w2s.requires_grad_(True)
        v_hat = (k @ w1s) * F.silu(k @ w2s)
        loss = -(v_hat * v).sum(-1).mean(-1) * scale  # (B, H): one loss per sample and head
        g1, g2 = torch.autograd.grad(loss.sum(), (w1s, w2s), create_graph=create_graph)
    return w1s - lr * clip(g1), w2s - lr * clip(g2)


def swiglu_branch_reference(q, k, v, w1, w2, **kwargs):
    w1n, w2n = swiglu_step_reference(k, v, w1, w2, **kwargs)
    return (q @ w1n) * F.silu(q @ w2n)


def per_sample_dwconv(x, weight):
    """'Same' depthwise cross-correlation by unfold: x (B, c, h, w), weight (B, c, 3, 3)."""
    b, c, h, w = x.shape
    cols = F.unfold(x.reshape(b * c, 1, h, w), kernel_size=3, padding=1)  # (B c, 9, h w)
    return torch.einsum('nkp,nk->np', cols, weight.reshape(b * c, 9)).reshape(b, c, h, w)


def conv_step_reference(k, v, weight, scale=SCALE, lr=1.0, create_graph=False):
    """Per-sample kernels (B, c, 3, 3): autograd of l = -scale * mean_hw(conv(k, w) * v)."""
    b = k.shape[0]
    with torch.enable_grad():
        ws = weight.unsqueeze(0).repeat(b, 1, 1, 1)
        if not ws.requires_grad:
            ws.requires_grad_(True)
        loss = -(per_sample_dwconv(k, ws) * v).mean(dim=(-2, -1)) * scale  # (B, c)
        (g, ) = torch.autograd.grad(loss.sum(), ws, create_graph=create_graph)
    return ws - lr * kernel_clip(g)


def vittt_attention_reference(op, x, hw, prefix, create_graph=False):
    """ViT^3's TTT.forward on normalised tokens, with the fused qkv / proj of the paper."""
    b, n, c = x.shape
    h, w = hw
    d = c // op.num_heads
    qkv_w = torch.cat([op.qkv.weight, op.conv_qkv.weight])  # (3C + 3d, C)
    qkv_b = torch.cat([op.qkv.bias, op.conv_qkv.bias])
    q1, k1, v1, q2, k2, v2 = (x @ qkv_w.T + qkv_b).split([c, c, c, d, d, d], dim=-1)

    def heads(t):
        return t.reshape(b, n, op.num_heads, d).transpose(1, 2)

    def grid(t):
        return t[:, prefix:].reshape(b, h, w, d).permute(0, 3, 1, 2)

    x1 = swiglu_branch_reference(heads(q1), heads(k1), heads(v1), op.inner_w1, op.inner_w2,
                                 create_graph=create_graph)
    x1 = x1.transpose(1, 2).reshape(b, n, c)
    w3 = conv_step_reference(grid(k2), grid(v2), op.conv_inner_weight,
                             create_graph=create_graph)
    x2 = per_sample_dwconv(grid(q2), w3).permute(0, 2, 3, 1).reshape(b, h * w, d)
    x2 = torch.cat([x2.new_zeros(b, prefix, d), x2], dim=1)  # prefix tokens: no grid term
    proj_w = torch.cat([op.proj.weight, op.conv_proj.weight], dim=1)  # (C, C + d)
    return torch.cat([x1, x2], dim=-1) @ proj_w.T + op.proj.bias


def cpe_reference(cpe, x, hw, prefix):
    """x + depthwise 3x3 conv (with bias) of the patch tokens; prefix tokens unchanged."""
    b, _, c = x.shape
    h, w = hw
    g = x[:, prefix:].reshape(b, h, w, c).permute(0, 3, 1, 2)
    pos = per_sample_dwconv(g, cpe.weight.reshape(c, 3, 3).expand(b, c, 3, 3))
    pos = pos + cpe.bias.view(1, c, 1, 1)
    pos = pos.permute(0, 2, 3, 1).reshape(b, h * w, c)
    return x + torch.cat([pos.new_zeros(b, prefix, c), pos], dim=1)


def vittt_block_reference(blk, x, hw, prefix):
    """ViT^3 Block.forward: cpe first, then pre-norm TTT and MLP residuals."""
    x = cpe_reference(blk.attn.cpe, x, hw, prefix)
    x = x + vittt_attention_reference(blk.attn, blk.norm1(x), hw, prefix)
    return x + blk.mlp(blk.norm2(x))


def perturbed(module, std=0.5, seed=0):
    """Inner weights large enough that the clipping is far from the identity."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith(('inner_w1', 'inner_w2', 'conv_inner_weight')):
                p.copy_(std * torch.randn(p.shape, generator=gen))
            elif name.endswith(('cpe.weight', 'cpe.bias', 'proj.bias', 'qkv.bias')):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return module


def max_err(a, b):
    return (a - b).abs().max().item()


# ---------------------------------------------------------------------- math core
def test_swiglu_inner_step_is_the_clipped_gradient_step_of_the_reference_loss():
    gen = torch.Generator().manual_seed(1)
    k, v = (torch.randn(2, 3, 11, 6, generator=gen) * 2 for _ in range(2))
    w1, w2 = (0.5 * torch.randn(3, 6, 6, generator=gen) for _ in range(2))
    new = simplified_swiglu_inner_step(k, v, w1, w2, SCALE, 1.0)
    ref = swiglu_step_reference(k, v, w1, w2)
    for got, want in zip(new, ref):
        assert got.shape == (2, 3, 6, 6)
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
    # The tests can tell the clipping rules and loss scales apart at this size.
    assert max_err(ref[0], swiglu_step_reference(k, v, w1, w2, clip=frobenius_clip)[0]) > 1e-2
    assert max_err(ref[0], swiglu_step_reference(k, v, w1, w2, scale=6**-0.5)[0]) > 1e-2


def test_conv_inner_step_is_the_clipped_gradient_step_of_the_reference_loss():
    gen = torch.Generator().manual_seed(2)
    for h, w in [(3, 5), (4, 7), (1, 1), (6, 2)]:
        k, v = (torch.randn(2, 5, h, w, generator=gen) * 2 for _ in range(2))
        weight = 0.5 * torch.randn(5, 3, 3, generator=gen)
        got = depthwise_conv_inner_step(k, v, weight, SCALE, 1.0)
        torch.testing.assert_close(got, conv_step_reference(k, v, weight).detach(), rtol=1e-5,
                                   atol=1e-6)


# ---------------------------------------------------------------------- operator
def test_defaults_and_shapes_are_vittts():
    op = build_attention_operator('ttt', C, HEADS)
    assert op.inner_lr == 1.0 and op.inner_loss_scale == pytest.approx(1 / 3)
    params = dict(op.named_parameters())
    assert set(params) == EXTRA_NAMES | {'qkv.weight', 'qkv.bias', 'proj.weight', 'proj.bias'}
    assert params['inner_w1'].shape == params['inner_w2'].shape == (HEADS, D, D)
    assert params['conv_inner_weight'].shape == (D, 3, 3)
    # ViT^3's fused widths: qkv Linear(C, 3C + 3d), proj Linear(C + d, C) (bias once).
    assert params['qkv.weight'].shape[0] + params['conv_qkv.weight'].shape[0] == 3 * C + 3 * D
    assert params['proj.weight'].shape[1] + params['conv_proj.weight'].shape[1] == C + D
    assert op.conv_proj.bias is None
    assert params['cpe.weight'].shape == (C, 1, 3, 3) and params['cpe.bias'].shape == (C, )
    assert not op.has_attention_map and not op.has_qk_form
    with pytest.raises(NotImplementedError):
        op.attention_map(torch.randn(1, 4, C), (2, 2), 0)


@pytest.mark.parametrize('hw,prefix', GRIDS)
def test_operator_matches_vittt_formulas(hw, prefix):
    op = perturbed(build_attention_operator('ttt', C, HEADS)).eval()
    x = 2 * torch.randn(2, hw[0] * hw[1] + prefix, C, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = op(x, hw, prefix)
    ref = vittt_attention_reference(op, x, hw, prefix).detach()
    assert out.shape == x.shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-5)


def test_outer_gradients_match_the_reference():
    """Backprop through the inner step: every parameter's gradient equals the reference's."""
    op = perturbed(build_attention_operator('ttt', C, HEADS)).train()
    hw, prefix = (3, 4), 1
    x = torch.randn(2, 13, C, generator=torch.Generator().manual_seed(4))
    target = torch.randn(2, 13, C, generator=torch.Generator().manual_seed(5))
    names = [n for n, _ in op.named_parameters() if not n.startswith('cpe.')]
    params = [p for n, p in op.named_parameters() if not n.startswith('cpe.')]
    got = torch.autograd.grad((op(x, hw, prefix) * target).sum(), params)
    ref = vittt_attention_reference(op, x, hw, prefix, create_graph=True)
    want = torch.autograd.grad((ref * target).sum(), params)
    for name, g, r in zip(names, got, want):
        assert r.abs().max() > 0, name
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize('training', [False, True])
def test_each_sample_starts_from_the_learned_weights(training):
    op = perturbed(build_attention_operator('ttt', C, HEADS)).train(training)
    hw, prefix = (3, 5), 1
    x = torch.randn(3, 16, C)
    out = op(x, hw, prefix)
    other = x.clone()
    other[1:] = 5.0 * torch.randn(2, 16, C)
    torch.testing.assert_close(op(other, hw, prefix)[0], out[0])
    torch.testing.assert_close(op(x[2:], hw, prefix)[0], out[2])
    torch.testing.assert_close(op(x, hw, prefix), out)  # nothing kept across calls


def test_ablation_options():
    x = torch.randn(2, 16, C)
    cfg = dict(type='ttt', conv_branch=False, positional_conv=False, inner_loss_scale=0.25,
               inner_lr=0.5)
    op = perturbed(build_attention_operator(cfg, C, HEADS))
    assert {n for n, _ in op.named_parameters()} == {'qkv.weight', 'qkv.bias', 'proj.weight',
                                                      'proj.bias', 'inner_w1', 'inner_w2'}
    assert op.pre_attention(x, None, 0) is x
    q1, k1, v1 = (x @ op.qkv.weight.T + op.qkv.bias).reshape(2, 16, 3, HEADS, D).permute(
        2, 0, 3, 1, 4)
    ref = swiglu_branch_reference(q1, k1, v1, op.inner_w1, op.inner_w2, scale=0.25, lr=0.5)
    ref = ref.transpose(1, 2).reshape(2, 16, C) @ op.proj.weight.T + op.proj.bias
    torch.testing.assert_close(op(x, None, 0), ref.detach(), rtol=1e-5, atol=2e-5)


def test_needs_a_matching_grid():
    op = build_attention_operator('ttt', C, HEADS)
    x = torch.randn(1, 16, C)
    for fn in (op, op.pre_attention):
        with pytest.raises(ValueError, match='hw_shape'):
            fn(x, None, 1)
        with pytest.raises(ValueError, match='imply'):
            fn(x, (4, 4), 1)


# ---------------------------------------------------------------------- block
@pytest.mark.parametrize('hw,prefix', GRIDS)
def test_block_applies_positional_conv_before_norm1(hw, prefix):
    blk = perturbed(TransformerBlock(C, HEADS, 2 * C, attn_cfg='ttt')).eval()
    x = torch.randn(2, hw[0] * hw[1] + prefix, C, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        out = blk(x, hw, prefix)
        attn = blk.forward_attn(x, hw, prefix)
    ref = vittt_block_reference(blk, x, hw, prefix).detach()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-5)
    ref_attn = vittt_attention_reference(blk.attn, blk.norm1(cpe_reference(
        blk.attn.cpe, x, hw, prefix)), hw, prefix).detach()
    torch.testing.assert_close(attn, ref_attn, rtol=1e-5, atol=2e-5)
    # the hook point blocks[i].attn sees norm1(x + cpe(x)) and returns the attention output
    seen = {}
    handle = blk.attn.register_forward_hook(lambda m, a, o: seen.update(inp=a[0], out=o))
    with torch.no_grad():
        blk(x, hw, prefix)
    handle.remove()
    torch.testing.assert_close(seen['out'], ref_attn, rtol=1e-5, atol=2e-5)


def test_softmax_block_is_unchanged_by_the_pre_attention_step():
    blk = TransformerBlock(C, HEADS, 2 * C, attn_cfg='softmax').eval()
    x = torch.randn(2, 13, C)
    with torch.no_grad():
        ref = x + blk.attn(blk.norm1(x), (3, 4), 1)
        ref = ref + blk.mlp(blk.norm2(ref))
        torch.testing.assert_close(blk(x, (3, 4), 1), ref)
    assert not any('cpe' in n for n, _ in blk.named_parameters())


def test_gradients_reach_every_block_parameter():
    blk = perturbed(TransformerBlock(C, HEADS, 2 * C, attn_cfg='ttt')).train()
    x = torch.randn(2, 4 * 7 + 1, C, requires_grad=True)
    blk(x, (4, 7), 1).square().mean().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, p in blk.named_parameters():
        assert p.grad is not None, f'no gradient for {name}'
        assert torch.isfinite(p.grad).all(), f'non-finite gradient for {name}'
        assert p.grad.abs().sum() > 0, f'zero gradient for {name}'


# ---------------------------------------------------------------------- backbone / transfer
TINY = dict(embed_dims=C, num_layers=2, num_heads=HEADS, mlp_hidden_dims=2 * C)
PAPER = dict(family='deit', img_size=32, patch_size=8, pos_embed_type='sincos',
             with_cls_token=False, out_type='avg_featmap')  # seed 000's TTT setting


def test_backbone_keeps_the_documented_init():
    torch.manual_seed(0)
    model = VisionTransformer(TINY, attn_cfg='ttt', **PAPER)
    attn = model.blocks[0].attn
    assert isinstance(attn, ATTENTION_OPERATORS.get('ttt'))
    for p in (attn.inner_w1, attn.inner_w2, attn.conv_inner_weight, attn.conv_qkv.weight):
        assert 0.015 < p.std().item() < 0.025  # truncated normal, std 0.02
    assert attn.conv_qkv.bias.abs().max() == 0
    # cpe: PyTorch's default Conv2d init, U(-1/3, 1/3) for a 3x3 depthwise kernel (fan-in 9)
    assert attn.cpe.weight.abs().max() <= 1 / 3 and attn.cpe.weight.std() > 0.1
    assert attn.cpe.bias.abs().max() <= 1 / 3 and attn.cpe.bias.abs().max() > 0
    out = model(torch.randn(2, 3, 32, 40))[0]  # 4 x 5 grid
    assert out.shape == (2, C) and torch.isfinite(out).all()


def ttt_extra_keys(num_layers=2):
    return {f'blocks.{i}.attn.{n}' for i in range(num_layers) for n in EXTRA_NAMES}


@pytest.mark.parametrize('strategy', ['random', 'copy', 'mlp_copy', 'full_copy'])
def test_transfer_from_softmax_initialises_and_reports_ttt_parameters(strategy):
    teacher = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8)
    student = VisionTransformer(TINY, attn_cfg='ttt', **PAPER)
    extras = ttt_extra_keys()
    assert set(student.state_dict()) - set(teacher.state_dict()) == extras
    before = {k: v.clone() for k, v in student.state_dict().items()}
    report = transfer_weights(student, teacher, strategy)
    assert report.student_only == extras
    assert extras <= report.initialized
    for key in extras:
        assert torch.equal(student.state_dict()[key], before[key]), key
    if strategy in ('copy', 'full_copy'):
        assert torch.equal(student.blocks[1].attn.qkv.weight, teacher.blocks[1].attn.qkv.weight)


@pytest.mark.parametrize('strategy', ['mimetic', 'impulse'])
def test_structured_inits_refuse_ttt(strategy, tmp_path):
    teacher = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8)
    student = VisionTransformer(TINY, attn_cfg='ttt', **PAPER)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    options = dict(cache_dir=str(tmp_path)) if strategy == 'impulse' else {}
    with pytest.raises(ValueError, match=r"operator 'ttt'.*has_qk_form=False"):
        transfer_weights(student, teacher, strategy, **options)
    for key, value in student.state_dict().items():
        assert torch.equal(value, before[key])


def test_softmax_checkpoint_loads_with_ttt_extras_reported_missing():
    teacher = VisionTransformer(TINY, family='deit', img_size=32, patch_size=8,
                                pos_embed_type='sincos', with_cls_token=False,
                                out_type='avg_featmap')
    student = VisionTransformer(TINY, attn_cfg='ttt', **PAPER)
    assert all(OPERATOR_EXTRA_KEY.match(k) for k in ttt_extra_keys())
    cpe = student.blocks[0].attn.cpe.weight.detach().clone()
    report = load_pretrained(student, teacher.state_dict(), layout='timm', strict=True)
    assert set(report.missing) == ttt_extra_keys()
    assert torch.equal(student.blocks[0].attn.cpe.weight, cpe)
    assert torch.equal(student.blocks[1].attn.qkv.weight, teacher.blocks[1].attn.qkv.weight)
