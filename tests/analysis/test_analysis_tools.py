"""Attention / activation maps, and smoke runs of the visualisation and benchmark tools."""
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from mmlinvit.analysis import (activation_similarity_maps, capture_attention_inputs,
                               query_attention_maps, upsample_map)
from mmlinvit.backbones import VisionTransformer

ROOT = Path(__file__).resolve().parents[2]
ADVENTURER_EXISTS = (ROOT / 'mmlinvit/backbones/adventurer.py').exists()
TINY = dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32)
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'


def _load_tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / 'tools' / 'analysis' / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiny_vit(operator: str) -> VisionTransformer:
    return VisionTransformer(TINY, attn_cfg=operator, img_size=32, patch_size=8).eval()


def test_softmax_query_map_is_the_softmax_row():
    model = _tiny_vit('softmax')
    images = torch.randn(2, 3, 24, 32)  # 3 x 4 patches
    maps = query_attention_maps(model, images, query=(1, 2), layers=[-1])
    assert set(maps) == {1} and maps[1].shape == (2, 3, 4)
    x, hw, prefix = capture_attention_inputs(model, images, [1])[1]
    attn = model.blocks[1].attn
    q, k, _ = attn.split_qkv(x)
    probs = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)
    expected = probs[:, :, prefix + 1 * 4 + 2, prefix:].mean(1).reshape(2, 3, 4)
    torch.testing.assert_close(maps[1], expected)
    head1 = query_attention_maps(model, images, (1, 2), [1], head=1)[1]
    torch.testing.assert_close(head1, probs[:, 1, prefix + 6, prefix:].reshape(2, 3, 4))


def test_linear_map_rows_sum_to_one_with_prefix():
    model = _tiny_vit('elu')
    images = torch.randn(1, 3, 32, 32)
    maps = query_attention_maps(model, images, (0, 0), [0, 1])
    x, hw, prefix = capture_attention_inputs(model, images, [0])[0]
    full = model.blocks[0].attn.attention_map(x, hw, prefix).mean(1)
    torch.testing.assert_close(maps[0].sum() + full[0, prefix, 0], torch.tensor(1.0))


def test_map_errors_are_clear():
    images = torch.randn(1, 3, 32, 32)
    with pytest.raises(IndexError, match='outside the 4 x 4 patch grid'):
        query_attention_maps(_tiny_vit('softmax'), images, (4, 0), [0])
    with pytest.raises(ValueError, match='no attention map'):
        query_attention_maps(_tiny_vit('ttt'), images, (0, 0), [0])
    with pytest.raises(IndexError, match='out of range'):
        query_attention_maps(_tiny_vit('softmax'), images, (0, 0), [5])


def test_upsample_map_of_a_padded_grid_lands_on_its_patches():
    """A 300-pixel-wide image at patch 16 has a 19-column grid padded to 304 pixels: the last
    column covers pixels 288..299 (stretched over 300 pixels, it covered 285..299)."""
    grid = torch.zeros(14, 19)
    grid[:, 18] = 1.0
    up = upsample_map(grid, (224, 300), patch_size=16)
    assert up.shape == (224, 300)
    assert torch.nonzero(up[0]).flatten().tolist() == list(range(288, 300))
    with pytest.raises(ValueError, match='does not cover'):
        upsample_map(grid, (224, 320), patch_size=16)


def test_upsample_map_nearest_blocks():
    grid = torch.arange(6.0).reshape(2, 3)
    up = upsample_map(grid, (4, 6))
    assert up.shape == (4, 6) and up[3, 5] == 5.0 and up[0, 0] == 0.0


@pytest.mark.skipif(not ADVENTURER_EXISTS, reason='Adventurer backbone not present')
def test_adventurer_activation_map_is_one_at_query():
    from mmlinvit.backbones.adventurer import Adventurer
    model = Adventurer(dict(embed_dims=32, num_layers=2), patch_size=8,
                       mixer_cfg=dict(d_state=8, headdim=16)).eval()
    maps = activation_similarity_maps(model, torch.randn(1, 3, 24, 32), (2, 1), [0, -1])
    assert set(maps) == {0, 1} and maps[1].shape == (1, 3, 4)
    assert maps[1][0, 2, 1].item() == pytest.approx(1.0, abs=1e-5)
    assert maps[0].abs().max() <= 1.0 + 1e-5


@pytest.mark.skipif(not ADVENTURER_EXISTS, reason='Adventurer backbone not present')
def test_compared_pairs_share_width_and_patch_size():
    """Each compared pair is a ViT and the Adventurer of its width, on the ViT's patch grid
    (built on the meta device: no weights are allocated)."""
    from mmlinvit.analysis import COMPARED_MODELS
    widths = {'vit-b16': (768, 16), 'vit-l14': (1024, 14)}  # ViT-B/16, ViT-L/14
    assert set(COMPARED_MODELS) == set(widths)
    for key, pair in COMPARED_MODELS.items():
        with torch.device('meta'):
            vit = pair.build_vit('elu')
            adventurer = pair.build_adventurer(pair.patch_size)
        assert (vit.embed_dims, pair.patch_size) == widths[key]
        assert pair.vit_dims['embed_dims'] == vit.embed_dims == adventurer.embed_dims
        assert vit.patch_size == adventurer.patch_size == pair.patch_size


def test_visualize_attention_writes_png(tmp_path):
    tool = _load_tool('visualize_attention')
    out = tmp_path / 'maps.png'
    tool.main(['--model', 'tiny', '--img-size', '64', '--students', 'elu', 'inline',
               '--query', '1', '2', '--out', str(out)])
    assert out.read_bytes()[:8] == PNG_SIGNATURE


def test_speed_ratios_interleave_the_models_and_divide_by_counted_flops(capsys):
    """One process, round-robin calls: every model is called once per round after one counted
    call, and the quotient is speed / FLOP ratio against the softmax row."""
    tool = _load_tool('speed_ratios')
    counts = {}
    originals = {}

    def counting(name):
        def forward(self, *args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return originals[name](self, *args, **kwargs)
        return forward

    build = tool.build_models

    def build_counted(*args, **kwargs):
        models = build(*args, **kwargs)
        for name, model in models.items():
            cls = type(name, (type(model), ), {})
            originals[name] = type(model).forward
            cls.forward = counting(name)
            model.__class__ = cls
        return models

    tool.build_models = build_counted
    rows = tool.main(['--model', 'tiny', '--sizes', '64', '--rounds', '3', '--threads', '1'])
    assert [r['model'] for r in rows] == ['softmax', 'elu'] + (['adventurer'] if
                                                              ADVENTURER_EXISTS else [])
    assert all(n == 1 + 3 for n in counts.values()), counts  # counted call + 3 rounds
    base = rows[0]
    assert base['speed'] == base['flop'] == '1.00x' and base['quotient'] == '1.00'
    for row in rows[1:]:
        speed, flop = float(row['speed'][:-1]), float(row['flop'][:-1])
        q, h = float(row['quotient']), 0.005  # all three printed to 2 decimals
        assert (speed - h) / (flop + h) - h <= q <= (speed + h) / (flop - h) + h
    assert 'interleaved rounds' in capsys.readouterr().out


def test_benchmark_backbones_tiny_run_writes_png(tmp_path, capsys):
    tool = _load_tool('benchmark_backbones')
    rows = tool.main(['--tiny', '--sizes', '32', '64', '--operators', 'elu', '--repeats', '1',
                      '--cpu-memory', 'inprocess', '--out-dir', str(tmp_path)])
    assert (tmp_path / 'benchmark_backbones.png').read_bytes()[:8] == PNG_SIGNATURE
    assert (tmp_path / 'benchmark_backbones.json').exists()
    ops = [r['operator'] for r in rows]
    assert ops[:2] == ['softmax', 'elu'] and ('adventurer' in ops) == ADVENTURER_EXISTS
    assert len(rows) == 2 * len(set(ops))
    for row in rows:
        assert 'error' not in row, row
        for scope in ('op', 'backbone'):
            assert row[scope]['ms'] > 0 and row[scope]['mib'] >= 0 and row[scope]['gflops'] > 0
    printed = capsys.readouterr().out
    assert 'backbone x' in printed and 'FLOP x' in printed


def test_benchmark_backbones_case_subprocess():
    """The default CPU path: one case measured in a fresh interpreter."""
    tool = _load_tool('benchmark_backbones')
    args = tool.parse_args(['--tiny', '--scopes', 'backbone'])
    args.dtype = 'float32'
    row = tool.run_case_subprocess(args, 'tiny', 'elu', (32, 32), repeats=1)
    assert 'error' not in row, row
    assert row['tokens'] == 5 and row['backbone']['ms'] > 0 and 'op' not in row
    assert row['memory_method'].startswith('fresh subprocess per case')
