"""Smoke runs of the op benchmark (memory / speed ratios side by side) and the ONNX benchmark."""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_attention_op_benchmark_prints_memory_and_speed_ratios(monkeypatch, capsys):
    tool = _load(ROOT / 'tools/analysis/benchmark_attention_op.py', 'bench_op_under_test')
    monkeypatch.setattr(sys, 'argv', ['x', '--device', 'cpu', '--tokens', '65', '1025',
                                      '--repeats', '1', '--heads', '2', '--threads', '1',
                                      '--graph-path', '--backward'])
    tool.main()
    out = capsys.readouterr().out
    for column in ('speed sdpa/la', 'mem la/sdpa', 'la-graph MiB', 'f+b mem', 'f+b speed'):
        assert column in out
    lines = [line.split() for line in out.splitlines() if line.strip().startswith(('65 ', '1025 '))]
    assert len(lines) == 2 and all(line[-1].endswith('x') for line in lines)


def test_cpu_peak_bytes_sees_memory_freed_inside_one_op():
    # A temporary allocated and freed inside a single op (here: a matmul's output consumed by
    # sum) must count; the replay of every allocator event sees it.
    import torch
    tool = _load(ROOT / 'tools/analysis/benchmark_attention_op.py', 'bench_op_under_test2')
    a = torch.randn(512, 512)
    peak = tool.cpu_peak_bytes(lambda: (a @ a).sum())
    assert peak >= 512 * 512 * 4


def test_onnx_benchmark_tiny(capsys):
    pytest.importorskip('onnxruntime')
    pytest.importorskip('onnxscript')
    tool = _load(ROOT / 'tools/deployment/benchmark_onnx.py', 'bench_onnx_under_test')
    rows = tool.main(['--arch', 'tiny', '--sizes', '32', '--repeats', '1', '--threads', '1'])
    assert len(rows) == 1
    row = rows[0]
    for name in ('teacher-softmax', 'vit-elu', 'adventurer'):
        assert row[f'{name} ort ms'] > 0
        assert row[f'{name} max abs err'] < 1e-4 * max(1.0, row[f'{name} max abs ref'])
    out = capsys.readouterr().out
    assert 'vit-elu ratio' in out and 'adventurer ratio' in out


def test_compiled_cases_in_one_process_are_all_compiled(monkeypatch):
    """benchmark_backbones --compile in one process (CUDA, --cpu-memory inprocess): after
    dynamo's recompile limit (8 variants of the shared code objects) the later cases ran eager
    and their times were reported as compiled.  Every case must hand graphs to the compiler."""
    import torch
    from torch._dynamo.testing import CompileCounter

    from mmlinvit.backbones import LinearVisionTransformer
    tool = _load(ROOT / 'tools/analysis/benchmark_backbones.py', 'bench_backbones_under_test')
    counters = []
    real_compile = torch.compile

    def counting_compile(model, **kwargs):
        counters.append(CompileCounter())
        return real_compile(model, backend=counters[-1], dynamic=kwargs.get('dynamic'))

    monkeypatch.setattr(torch, 'compile', counting_compile)
    for operator in ('elu', 'relu', 'inline'):
        torch.manual_seed(0)
        model = LinearVisionTransformer(dict(embed_dims=16, num_layers=1, num_heads=2,
                                             mlp_hidden_dims=32), img_size=16, patch_size=8,
                                        attn_cfg=operator, check_operator_setting=False,
                                        out_type='featmap').eval()
        for size in (16, 24, 32, 40):
            tool.measure_compiled(model, (size, size), torch.device('cpu'), torch.float32,
                                  repeats=1, max_seconds=1.0)
    assert len(counters) == 12 and all(c.frame_count >= 1 for c in counters), [
        c.frame_count for c in counters]
