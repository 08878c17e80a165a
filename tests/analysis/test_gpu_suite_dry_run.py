"""tools/analysis/gpu_suite.py --dry-run: every section at tiny sizes in the Triton interpreter.

The dry run's correctness checks are real (interpreted Triton kernels vs the fp32 PyTorch
paths, forward and backward); its timings are not.  This proves the GPU script runs end to
end - kernels, timing loops, backbones, JSON and PNG - before a GPU is available.  The checks
themselves (mmlinvit.analysis.kernel_checks) are shown to fail a wrong kernel.
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from types import SimpleNamespace

import pytest
import torch

from mmlinvit.analysis.kernel_checks import check_linear_attention, check_ssd

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'

CPU = torch.device('cpu')
needs_triton = pytest.mark.skipif(importlib.util.find_spec('triton') is None,
                                  reason='the dry run interprets the Triton kernels: needs triton')


def test_checks_pass_the_reference_and_fail_a_wrong_kernel():
    """The checks' verdicts, with the PyTorch paths standing in for the kernels (no triton)."""
    from mmlinvit.ops.linear_attention import inline_attention_torch, linear_attention_torch
    from mmlinvit.ops.ssd import ssd_scan_torch
    exact = SimpleNamespace(linear_attention_triton=linear_attention_torch,
                            inline_attention_triton=inline_attention_torch)
    for mode in ('elu', 'inline'):
        row = check_linear_attention(exact, mode, 17, 23, 2, 8, 6, torch.float32, mode, CPU)
        assert row['ok'] == 'PASS' and max(row[k] for k in ('out', 'dq', 'dk', 'dv')) < 1e-6
    # 1 % too large an output (and its gradients): 1e-2 > the fp32 bound 1e-4
    wrong = SimpleNamespace(
        linear_attention_triton=lambda q, k, v, mode: 1.01 * linear_attention_torch(q, k, v, mode))
    row = check_linear_attention(wrong, 'wrong', 17, 23, 2, 8, 6, torch.float32, 'elu', CPU)
    assert row['ok'] == 'FAIL' and row['out'] == pytest.approx(0.01, rel=1e-3)
    ssd = SimpleNamespace(ssd_scan_triton=ssd_scan_torch)
    row = check_ssd(ssd, 'exact', 1, 20, 2, 4, 1, 8, 8, torch.float32, CPU)
    assert row['ok'] == 'PASS' and max(row[k] for k in ('y', 'dx', 'dA', 'dD')) < 1e-5
    shifted = SimpleNamespace(ssd_scan_triton=lambda x, dt, A, B, C, D, chunk_size: ssd_scan_torch(
        x, dt, A, B, C, D + 0.05, chunk_size=chunk_size))
    row = check_ssd(shifted, 'wrong D', 1, 20, 2, 4, 1, 8, 8, torch.float32, CPU)
    assert row['ok'] == 'FAIL' and row['y'] > 1e-3


@needs_triton
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


@needs_triton
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
