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
from torch.utils.flop_counter import FlopCounterMode

from mmlinvit.analysis import (FlopCounter, analytic_vit_flops, attention_flops,
                               block_gemm_flops, count_flops, sdpa_flops,
                               ssd_scan_function_flops)
from mmlinvit.backbones import VIT_SIZES, VisionTransformer
from mmlinvit.layers.mamba2 import Mamba2Mixer
from mmlinvit.ops.linear_attention import triton_available
from mmlinvit.ops.ssd import ssd_scan, torch_impl

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
    elif operator == 'inline':  # centred state K_c^T V, Q S_c (no mat-vec)
        mixing = depth * 4 * n * head_dims * d_model
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


def _ssd_hand_flops(batch: int, length: int, heads: int, headdim: int, groups: int,
                    d_state: int, chunk: int) -> int:
    """Matmuls of the chunked SSD scan, written out: tokens padded to whole chunks; per chunk
    the scores C B^T per group, scores x (dt x) per head, each chunk's own state B^T (dt x)
    per head and the read-out C h of the entering state per head (2 x MACs each)."""
    padded = -(-length // chunk) * chunk
    chunks = padded // chunk
    scores = groups * chunks * chunk * chunk * d_state
    apply_scores = heads * chunks * chunk * chunk * headdim
    own_state = heads * chunks * chunk * d_state * headdim
    read_state = heads * chunks * chunk * d_state * headdim
    return 2 * batch * (scores + apply_scores + own_state + read_state)


def _ssd_inputs(device: str = 'cpu', batch: int = 2, length: int = 150, heads: int = 4,
                headdim: int = 8, groups: int = 2, d_state: int = 8):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, length, heads, headdim, generator=gen)
    dt = torch.rand(batch, length, heads, generator=gen) * 0.1
    A = -torch.rand(heads, generator=gen)
    B = torch.randn(batch, length, groups, d_state, generator=gen)
    C = torch.randn(batch, length, groups, d_state, generator=gen)
    return [t.to(device) for t in (x, dt, A, B, C)] + [torch.ones(heads, device=device)]


@pytest.mark.parametrize('device', ['cpu', 'meta'])
def test_ssd_scan_counted_at_configured_chunk(device):
    """The torch SSD scan counts at its chunk_size with and without gradients (the inference
    form's 64-token chunks are not what is counted), equal to the hand-written matmuls."""
    x, dt, A, B, C, D = _ssd_inputs(device)
    assert torch_impl.INFERENCE_CHUNK < 128  # the case below differs from the inference form
    for chunk in (16, 64, 128, 256):
        expected = _ssd_hand_flops(2, 150, 4, 8, 2, 8, chunk)
        assert ssd_scan_function_flops(x, dt, A, B, C, D, chunk) == expected
        with torch.no_grad(), FlopCounter() as counter:
            ssd_scan(x, dt, A, B, C, D, chunk_size=chunk, backend='torch')
        assert counter.total == expected, (chunk, counter.by_op)
        if device == 'cpu':
            xg = x.clone().requires_grad_()
            with FlopCounter() as grad_counter:
                ssd_scan(xg, dt, A, B, C, D, chunk_size=chunk, backend='torch')
            assert grad_counter.total == expected, chunk
    assert torch_impl.INFERENCE_FORM is True  # restored
    # Opting out counts the form that runs: the inference form's chunks of <= 64 tokens.
    with torch.no_grad(), FlopCounter(ssd_chunk_form=False) as counter:
        ssd_scan(x, dt, A, B, C, D, chunk_size=256, backend='torch')
    assert counter.total == _ssd_hand_flops(2, 150, 4, 8, 2, 8, torch_impl.INFERENCE_CHUNK)
    with pytest.raises(ZeroDivisionError), FlopCounter():
        1 / 0
    assert torch_impl.INFERENCE_FORM is True


def test_mamba2_mixer_counts_scan_at_its_chunk_size():
    """A Mamba-2 mixer (chunk 128) counts its projections + the scan at chunk 128 on CPU, and
    the same on meta tensors: the depthwise conv1d counts zero on both (on CPU it is shifted
    multiply-adds, element-wise; on meta tensors and CUDA an ``nn.Conv1d``, which upstream's
    rules count)."""
    dim, d_state, headdim, length, chunk = 32, 16, 16, 100, 128
    d_inner, heads = 2 * dim, 2 * dim // headdim
    counts = {}
    for device in ('cpu', 'meta'):
        with torch.device(device):
            mixer = Mamba2Mixer(dim, d_state=d_state, headdim=headdim, chunk_size=chunk,
                                ssd_backend='torch').eval()
            counts[device] = count_flops(mixer, torch.randn(1, length, dim))
    in_proj = 2 * length * dim * (2 * d_inner + 2 * d_state + heads)
    out_proj = 2 * length * d_inner * dim
    scan = _ssd_hand_flops(1, length, heads, headdim, 1, d_state, chunk)
    assert counts['cpu'].total == in_proj + out_proj + scan, counts['cpu'].by_op
    assert counts['meta'].total == counts['cpu'].total, (counts['meta'].by_op,
                                                          counts['cpu'].by_op)


def test_only_depthwise_conv1d_counts_zero_forward_and_backward():
    """Other convolutions (patch embeddings, MHLA / TTT 2-D depthwise convs, dense conv1d)
    keep upstream's count, in the forward and the backward."""
    x1 = torch.randn(2, 8, 20, requires_grad=True)
    x2 = torch.randn(2, 8, 6, 6, requires_grad=True)
    x3 = torch.randn(2, 1, 20, requires_grad=True)
    for conv, x, expected in [(torch.nn.Conv1d(8, 8, 4, groups=8, padding=3), x1, 0),
                              (torch.nn.Conv1d(8, 8, 4, padding=3), x1, 2 * 2 * 23 * 8 * 8 * 4),
                              (torch.nn.Conv2d(8, 8, 3, groups=8, padding=1), x2,
                               2 * 2 * 36 * 8 * 9),
                              # weights of shape (C, 1, k) that are not depthwise
                              (torch.nn.Conv1d(1, 8, 4), x3, 2 * 2 * 17 * 8 * 4),
                              (torch.nn.ConvTranspose1d(8, 1, 4), x1, 2 * 2 * 20 * 8 * 4)]:
        with FlopCounter() as counter:
            conv(x)
        assert counter.total == expected, (conv, counter.by_op)
        with FlopCounter() as counter:
            conv(x).sum().backward()
        with FlopCounterMode(display=False) as upstream:
            conv(x).sum().backward()
        assert counter.total == (0 if expected == 0 else upstream.get_total_flops()), (
            conv, counter.by_op)
        assert expected == 0 or upstream.get_total_flops() > expected  # a backward was run


@pytest.mark.skipif(not triton_available(), reason='triton is not installed')
def test_triton_ssd_function_counted_like_torch_path():
    """The Triton SSD-scan Function (interpreter on CPU) counts the hand-written matmuls at its
    chunk size, as the torch autograd form does; a mixer counts the same on both backends."""
    script = textwrap.dedent("""
        import torch
        from mmlinvit.analysis import FlopCounter, count_flops
        from mmlinvit.layers.mamba2 import Mamba2Mixer
        from mmlinvit.ops.ssd import ssd_scan
        def hand(batch, length, heads, headdim, groups, d_state, chunk):
            chunks = -(-length // chunk)
            per_chunk = (groups * chunk * chunk * d_state + heads * chunk * chunk * headdim
                         + 2 * heads * chunk * d_state * headdim)
            return 2 * batch * chunks * per_chunk
        g = torch.Generator().manual_seed(0)
        b, L, H, P, G, N = 2, 40, 4, 8, 2, 8
        x = torch.randn(b, L, H, P, generator=g); dt = torch.rand(b, L, H, generator=g) * .1
        A = -torch.rand(H, generator=g); D = torch.ones(H)
        B = torch.randn(b, L, G, N, generator=g); C = torch.randn(b, L, G, N, generator=g)
        for chunk in (16, 64):
            with torch.no_grad(), FlopCounter() as tri:
                y = ssd_scan(x, dt, A, B, C, D, chunk_size=chunk, backend='triton')
            assert set(tri.by_op) == {'_SSDScanTriton'}, tri.by_op
            xg = x.clone().requires_grad_()
            with FlopCounter() as ref:
                y_ref = ssd_scan(xg, dt, A, B, C, D, chunk_size=chunk, backend='torch')
            torch.testing.assert_close(y, y_ref.detach(), rtol=1e-4, atol=1e-4)
            expected = hand(b, L, H, P, G, N, chunk)
            assert tri.total == ref.total == expected, (chunk, tri.total, ref.total, expected)
        counts = {}
        for backend in ('torch', 'triton'):
            torch.manual_seed(0)
            mixer = Mamba2Mixer(32, d_state=16, headdim=16, chunk_size=16,
                                ssd_backend=backend).eval()
            counts[backend] = count_flops(mixer, torch.randn(1, 40, 32))
        assert '_SSDScanTriton' in counts['triton'].by_op, counts['triton'].by_op
        assert counts['triton'].total == counts['torch'].total, counts
        print('ok')
    """)
    env = dict(os.environ, TRITON_INTERPRET='1')
    env.pop('MMLINVIT_SSD_BACKEND', None)
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


@pytest.mark.parametrize('operator', ['softmax', 'elu'])
def test_training_step_counts_the_same_on_cpu_and_meta(operator):
    """Forward + backward: CPU's SDPA backward (its own aten op) counted 0, so a training step
    of the softmax model counted 2x its attention FLOPs less on CPU than on meta tensors."""
    counts = {}
    for device in ('cpu', 'meta'):
        torch.manual_seed(0)
        model = _tiny_vit(operator, device).train()
        images = torch.randn(2, 3, *IMG_HW, device=device)
        with FlopCounter() as counter:
            model(images)[0].float().sum().backward()
        counts[device] = counter.total
    assert counts['cpu'] == counts['meta'], counts
    forward = count_flops(_tiny_vit(operator, 'cpu'), torch.randn(2, 3, *IMG_HW)).total
    assert counts['cpu'] > 2 * forward  # the backward is counted (about 2x the forward)


@pytest.mark.skipif(not triton_available(), reason='triton is not installed')
def test_triton_functions_count_their_backward_like_the_torch_path():
    """The Triton Functions' backward kernels were counted 0: a training step of a linear
    model counted 1x its attention where the torch path counted 3x."""
    script = textwrap.dedent("""
        import torch
        from mmlinvit.analysis import FlopCounter
        from mmlinvit.ops.linear_attention import inline_attention, linear_attention
        from mmlinvit.ops.ssd import ssd_scan
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 37, 16, generator=g) for _ in range(3))
        ops = {'elu': lambda *t, backend: linear_attention(*t, 'elu', backend=backend),
               'inline': lambda *t, backend: inline_attention(*t, 0.25, backend=backend)}
        for feature_map, op in ops.items():
            totals = {}
            for backend in ('torch', 'triton'):
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                with FlopCounter() as counter:
                    op(*leaves, backend=backend).sum().backward()
                totals[backend] = counter.total
                if backend == 'triton':
                    assert counter.by_op['_FusedLinearAttention.backward'] > 0, counter.by_op
            assert totals['torch'] == totals['triton'], (feature_map, totals)
        b, L, H, P, G, N = 1, 40, 2, 8, 1, 8
        x = torch.randn(b, L, H, P, generator=g); dt = torch.rand(b, L, H, generator=g) * .1
        A = -torch.rand(H, generator=g); D = torch.ones(H)
        B = torch.randn(b, L, G, N, generator=g); C = torch.randn(b, L, G, N, generator=g)
        totals = {}
        for backend in ('torch', 'triton'):
            leaves = [t.clone().requires_grad_() for t in (x, dt, A, B, C, D)]
            with FlopCounter() as counter:
                ssd_scan(*leaves, chunk_size=16, backend=backend).sum().backward()
            totals[backend] = counter.total
        assert totals['torch'] == totals['triton'], totals
        print('ok')
    """)
    env = dict(os.environ, TRITON_INTERPRET='1')
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(ROOT), env.get('PYTHONPATH')]))
    proc = subprocess.run([sys.executable, '-c', script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and 'ok' in proc.stdout, proc.stderr[-3000:]
