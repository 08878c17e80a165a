"""tools/analysis/peak_memory_vit.py: the forward's own memory, not the process's history.

Children run with the exact-RSS allocator environment and the peak is measured around the
forward alone; memory allocated and freed before the forward (a checkpoint load, say) must
not be reported as forward memory.  Token counts follow the corner-padded patch grid.
"""
import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

from mmlinvit.utils.benchmarking import run_json_child

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / 'tools' / 'analysis' / 'peak_memory_vit.py'
# ViT-T/16 at 72 x 72: ceil(72 / 16) = 5 patches a side (the model pads to 80), + class token.
CHILD_ARGS = ['--arch', 't', '--img-size', '72', '--patch-size', '16', '--threads', '1']
TOKENS = 5 * 5 + 1

pytestmark = pytest.mark.skipif(not sys.platform.startswith('linux'),
                                reason='reads /proc/self/status')


def _load_tool():
    spec = importlib.util.spec_from_file_location('mmlinvit_tool_peak_memory_vit', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_memory_freed_before_the_forward_is_not_forward_memory(tmp_path):
    """256 MiB allocated (one 128 MiB tensor + 256 tensors of 512 KiB, below the mmap
    threshold) and freed after the model is built, as a checkpoint load would: the memory
    child reports what the forward adds (a few MiB), not the 256 MiB transient."""
    script = tmp_path / 'child_with_transient.py'
    script.write_text(textwrap.dedent(f"""
        import importlib.util, json, sys
        import torch
        import mmlinvit.backbones as backbones
        spec = importlib.util.spec_from_file_location('pm', {str(TOOL)!r})
        tool = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tool)
        build = backbones.VisionTransformer

        def build_then_load(*args, **kwargs):
            model = build(*args, **kwargs)
            big = torch.ones(128 * 2**18)  # 128 MiB of fp32, touched
            small = [torch.ones(2**17) for _ in range(256)]  # 256 x 512 KiB
            del big, small
            return model

        backbones.VisionTransformer = build_then_load
        args = tool.parse_args(['--child-attn', 'elu', '--child-phase', 'memory'] +
                               {CHILD_ARGS!r})
        print(json.dumps(tool.run_child(args)))
    """))
    result = run_json_child([sys.executable, str(script)], threads=1, root=str(ROOT),
                            exact_memory=True, timeout=300)
    assert result['num_tokens'] == TOKENS
    assert 'reset via /proc/self/clear_refs' in result['memory_method'], \
        result['memory_method']
    assert 0.0 <= result['forward_mb'] < 50.0, result
    assert result['output_finite']


def test_parent_runs_memory_and_time_children(capsys, tmp_path):
    """The tool's own subprocesses: memory measured under EXACT_RSS_ENV, time separately."""
    tool = _load_tool()
    out = tmp_path / 'rows.json'
    rows = tool.run_parent(tool.parse_args(['--attn', 'softmax', '--json-out', str(out)] +
                                           CHILD_ARGS))
    assert len(rows) == 1
    row = rows[0]
    assert row['num_tokens'] == TOKENS
    assert 'EXACT_RSS_ENV' in row['memory_method'], row['memory_method']
    assert 0.0 <= row['forward_mb'] < 50.0
    assert row['peak_rss_mb'] > row['params_mb']
    assert row['forward_s'] > 0.0 and row['output_finite']
    assert json.loads(out.read_text())[0]['num_tokens'] == TOKENS
    assert 'softmax (default)' in capsys.readouterr().out
