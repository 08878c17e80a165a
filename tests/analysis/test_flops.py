"""FLOP counter against hand-computed closed forms (FLOPs = 2 x MACs) on tiny models."""
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mmlinvit.analysis import (FlopCounter, analytic_vit_flops, attention_flops,
                               block_gemm_flops, count_flops, sdpa_flops)
from mmlinvit.backbones import VIT_SIZES, VisionTransformer
from mmlinvit.ops.linear_attention import triton_available

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(embed_dims=32, num_layers=2, num_heads=4, mlp_hidden_dims=128)
IMG_HW = (32, 48)  # 4 x 6 patches of 8 px, N = 25 with the class token
PATCH = 8


def _tiny_vit(operator: str, device: str) -> VisionTransformer:
    with torch.device(device):
        return VisionTransformer(TINY, attn_cfg=operator, img_size=32, patch_size=PATCH).eval()


@pytest.mark.parametrize('device', ['cpu', 'meta'])
@pytest.mark.parametrize('operator', ['softmax', 'elu', 'relu', 'identity', 'inline'])
def test_counted_equals_exact_closed_form(operator, device):
    model = _tiny_vit(operator, device)
    images = torch.randn(1, 3, *IMG_HW, device=device)
    counted = count_flops(model, images)
    n = (IMG_HW[0] // PATCH) * (IMG_HW[1] // PATCH) + 1
    d_model, depth, heads, hidden = (TINY['embed_dims'], TINY['num_layers'], TINY['num_heads'],
                                     TINY['mlp_hidden_dims'])
    # Hand-written: patch conv, per layer qkv + proj + fc1 + fc2, token mixing.
    patch_embed = 2 * (n - 1) * 3 * PATCH * PATCH * d_model
    gemms = depth * (2 * n * d_model * 3 * d_model + 2 * n * d_model * d_model +
                     2 * 2 * n * d_model * hidden)
    head_dims = d_model // heads
    if operator == 'softmax':
        mixing = depth * 4 * n * n * d_model
    else:  # state K^T V, Q S, normaliser mat-vec
        mixing = depth * (4 * n * head_dims * d_model + 2 * n * d_model)
    assert counted.total == patch_embed + gemms + mixing
    assert analytic_vit_flops(IMG_HW, PATCH, d_model, depth, heads, hidden,
                              operator).total == counted.total
    assert counted.by_op['aten.convolution'] == patch_embed


def test_vit_b16_parts_match_issue_convention():
    """Per-op parts equal 24 N D^2 (GEMMs) and 4 N^2 D / 4 N d D (+2 N D) per layer exactly."""
    dims = VIT_SIZES['b']
    n, d_model, depth = 197, dims['embed_dims'], dims['num_layers']
    counts = {}
    for op in ('softmax', 'elu'):
        with torch.device('meta'):
            model = VisionTransformer('b', family='deit', attn_cfg=op).eval()
            counts[op] = count_flops(model, torch.empty(1, 3, 224, 224))
    assert counts['softmax'].by_op['aten.addmm'] == depth * 24 * n * d_model**2
    sdpa = sum(v for k, v in counts['softmax'].by_op.items() if 'attention' in k or 'bmm' in k)
    assert sdpa == depth * 4 * n * n * d_model
    mixing = sum(v for k, v in counts['elu'].by_op.items() if 'bmm' in k)
    assert mixing == depth * (4 * n * 64 * d_model + 2 * n * d_model)
    ref = analytic_vit_flops(224, 16, d_model, depth, 12, dims['mlp_hidden_dims'], 'softmax')
    assert ref.reference_total == depth * (24 * n * d_model**2 + 4 * n * n * d_model)
    assert counts['softmax'].total / ref.reference_total == pytest.approx(1.0, abs=0.01)


def test_cpu_sdpa_is_counted():
    q, k, v = torch.randn(2, 3, 10, 8), torch.randn(2, 3, 12, 8), torch.randn(2, 3, 12, 5)
    with FlopCounter() as counter:
        F.scaled_dot_product_attention(q, k, v)
    assert counter.total == sdpa_flops(q.shape, k.shape, v.shape) == 2 * 6 * 10 * 12 * (8 + 5)


class _ToyFunction(torch.autograd.Function):
    """Does a real matmul inside; its FLOPs must come from the registered formula only."""

    @staticmethod
    def forward(ctx, a, b):
        return a @ b

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError


def test_autograd_function_formula_replaces_inner_count():
    a, b = torch.randn(4, 5), torch.randn(5, 6)
    with FlopCounter(function_formulas={_ToyFunction: lambda x, y: 7}) as counter:
        _ToyFunction.apply(a, b)
        torch.mm(a, b)
    assert counter.by_op['_ToyFunction'] == 7
    assert counter.total == 7 + 2 * 4 * 5 * 6
    assert 'apply' not in _ToyFunction.__dict__  # restored
    with FlopCounter() as plain:
        _ToyFunction.apply(a, b)
    assert plain.total == 2 * 4 * 5 * 6  # unregistered: whatever aten ops it issues


def test_bad_inputs_have_clear_errors():
    with pytest.raises(KeyError, match='available'):
        attention_flops('ttt', 10, 32, 4)
    with pytest.raises(TypeError, match='autograd.Function'):
        FlopCounter(function_formulas={torch.nn.Linear: lambda *a: 0})
    with pytest.raises(RuntimeError, match='before'):
        FlopCounter().result()


def test_block_gemm_closed_form():
    assert block_gemm_flops(10, 8, 32) == 24 * 10 * 8 * 8


@pytest.mark.skipif(not triton_available(), reason='triton is not installed')
def test_triton_function_counted_like_torch_path(tmp_path):
    """The Triton autograd Function (interpreter on CPU) counts exactly as the torch path."""
    script = textwrap.dedent(f"""
        import torch
        from mmlinvit.analysis import analytic_vit_flops, count_flops
        from mmlinvit.backbones import VisionTransformer
        arch = dict(embed_dims=16, num_layers=1, num_heads=2, mlp_hidden_dims=64)
        for op in ('elu', 'inline'):
            model = VisionTransformer(arch, attn_cfg=op, img_size=16, patch_size=8).eval()
            c = count_flops(model, torch.randn(1, 3, 16, 24))
            assert '_FusedLinearAttention' in c.by_op, c.by_op
            expected = analytic_vit_flops((16, 24), 8, 16, 1, 2, 64, op).total
            assert c.total == expected, (c.total, expected)
        print('ok')
    """)
    env = dict(os.environ, TRITON_INTERPRET='1', MMLINVIT_LINEAR_ATTN_BACKEND='triton')
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(ROOT), env.get('PYTHONPATH')]))
    proc = subprocess.run([sys.executable, '-c', script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and 'ok' in proc.stdout, proc.stderr[-3000:]


def test_count_flops_tool_prints_convention_and_ratio(capsys):
    spec = importlib.util.spec_from_file_location('count_flops',
                                                  ROOT / 'tools/analysis/count_flops.py')
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    rows = tool.main(['--models', 'vit-b16', '--sizes', '224', '1024', '--no-adventurer'])
    printed = capsys.readouterr().out
    assert 'FLOPs = 2 x MACs' in printed
    assert [(r['size'], r['operator']) for r in rows] == [('224', 'softmax'), ('224', 'elu'),
                                                          ('1024', 'softmax'), ('1024', 'elu')]
    for row in rows:
        assert row['counted'] == row['exact']
    assert rows[3]['ratio_counted'] == pytest.approx(1319.6 / 710.5, rel=1e-3)
    assert rows[3]['ratio_analytic'] == pytest.approx(
        (24 * 4097 * 768**2 + 4 * 4097**2 * 768) / (24 * 4097 * 768**2 + 4 * 4097 * 64 * 768))
