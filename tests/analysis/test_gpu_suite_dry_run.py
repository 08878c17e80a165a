"""tools/analysis/gpu_suite.py --dry-run: every section at tiny sizes in the Triton interpreter.

The dry run's correctness checks are real (interpreted Triton kernels vs the fp32 PyTorch
paths, forward and backward); its timings are not.  This proves the GPU script runs end to
end - kernels, timing loops, backbones, JSON and PNG - before a GPU is available.
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'

pytestmark = pytest.mark.skipif(importlib.util.find_spec('triton') is None,
                                reason='the dry run interprets the Triton kernels: needs triton')


def test_gpu_suite_dry_run_writes_json_and_png(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET='1', OMP_NUM_THREADS='2')
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(ROOT), env.get('PYTHONPATH')]))
    env.pop('MMLINVIT_LINEAR_ATTN_BACKEND', None)
    env.pop('MMLINVIT_SSD_BACKEND', None)
    proc = subprocess.run([sys.executable, str(ROOT / 'tools/analysis/gpu_suite.py'), '--dry-run',
                           '--out-dir', str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / 'suite.json').read_text())
    assert result['dry_run'] is True and result['correctness_ok'] is True
    checks = result['check_linear_attention'] + result['check_ssd']
    assert all(r['ok'] == 'PASS' for r in checks)
    # fp32 and bf16, forward and all gradients, for both kernels.
    assert {r['dtype'] for r in result['check_linear_attention']} >= {'float32', 'bfloat16'}
    assert {r['dtype'] for r in result['check_ssd']} >= {'float32', 'bfloat16'}
    assert all(r['dq'] >= 0 and r['dv'] >= 0 for r in result['check_linear_attention'])
    assert any(r['case'].startswith('elu cross') for r in result['check_linear_attention'])
    assert len(result['linear_attention']) == 2 and all(
        r['triton ms'] > 0 and r['HBM fwd'] > 0 for r in result['linear_attention'])
    assert len(result['ssd']) == 1 and result['ssd'][0]['triton f+b ms'] > 0
    models = {(r['model'], r['size']) for r in result['backbones']}
    assert ('ViT-L/14 elu', '42x42') in models and ('Adventurer-B', '32x48') in models
    assert (tmp_path / 'suite.png').read_bytes()[:8] == PNG_SIGNATURE
    assert 'correctness PASSED' in proc.stdout


def test_gpu_suite_without_cuda_names_the_dry_run():
    pytest.importorskip('torch')
    import torch
    if torch.cuda.is_available():
        pytest.skip('a GPU is present')
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(ROOT), env.get('PYTHONPATH')]))
    proc = subprocess.run([sys.executable, str(ROOT / 'tools/analysis/gpu_suite.py')], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and '--dry-run' in proc.stderr
