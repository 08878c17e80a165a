"""Token counts of the analysis tools follow the corner-padded patch grid the models run on.

A 200 x 200 image with 16-pixel patches is padded to 208 x 208: ceil(200 / 16) = 13 patches a
side, 13 * 13 + 1 = 170 tokens with the class token (not 12 * 12 + 1 = 145).
"""
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SIZE = (200, 200)
TOKENS = 13 * 13 + 1


def _load_tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f'mmlinvit_tool_{name}',
                                                  ROOT / 'tools' / 'analysis' / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize('operator', ['softmax', 'adventurer'])
def test_benchmark_backbones_tokens_and_op_scope_use_the_padded_grid(operator):
    tool = _load_tool('benchmark_backbones')
    result = tool.measure_case('tiny', operator, SIZE, ['op'], torch.device('cpu'),
                               torch.float32, repeats=1, max_seconds=0.1, phases=('time', ))
    assert result['tokens'] == TOKENS
    if operator == 'softmax':  # the op scope attends over the same tokens: 4 N^2 D
        assert result['op']['gflops'] * 1e9 == pytest.approx(4 * TOKENS**2 * 64, rel=1e-9)


def test_count_flops_adventurer_tokens():
    tool = _load_tool('count_flops')
    _, tokens = tool.count_adventurer(SIZE, 'meta')
    assert tokens == TOKENS


def test_benchmark_adventurer_tokens():
    assert _load_tool('benchmark_adventurer').token_count(SIZE) == TOKENS


def test_visualize_attention_default_query_is_the_padded_grid_centre():
    # 216 / 16 = 13.5: the model's grid is 14 x 14 (centre 7), a floored one 13 x 13 (6).
    assert _load_tool('visualize_attention').default_query((216, 216), 16) == (7, 7)
    assert _load_tool('visualize_attention').default_query((224, 160), 16) == (7, 5)
