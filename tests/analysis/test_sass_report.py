"""The kernels' machine code for sm_90, compiled here without a GPU (tools/analysis/sass_report.py).

Guards the H200 finding: bf16 tiles were read and written one 2-byte element per instruction
(``LDG.E.U16`` / ``STG.E.U16``: feature masks the compiler could not prove constant) and are
now 16-byte accesses; the linear-attention kernels do not spill in the forward.
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _nvidia_tools() -> bool:
    spec = importlib.util.find_spec('triton')
    if spec is None or spec.origin is None:
        return False
    return (Path(spec.origin).parent / 'backends' / 'nvidia' / 'bin' / 'cuobjdump').exists()


@pytest.mark.skipif(not _nvidia_tools(), reason="needs triton's NVIDIA back end (cuobjdump)")
def test_bf16_tiles_use_16_byte_global_accesses(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(ROOT), env.get('PYTHONPATH')]))
    out = tmp_path / 'sass.json'
    proc = subprocess.run([sys.executable, str(ROOT / 'tools/analysis/sass_report.py'),
                           '--json', str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = json.loads(out.read_text())['bf16']
    matmul_kernels = [r for rows in reports.values() for r in rows if r['counts'].get('HGMMA')]
    names = {r['kernel'] for r in matmul_kernels}
    assert {'_state_kernel', '_output_kernel', '_bwd_q_kernel', '_bwd_kv_kernel',
            '_chunk_state_kernel', '_chunk_scan_fwd_kernel', '_chunk_scan_bwd_dx_kernel',
            '_chunk_scan_bwd_dc_kernel'} <= names, names
    for r in matmul_kernels:
        counts = r['counts']
        scalar = {k: v for k, v in counts.items()
                  if k.split('.')[0] in ('LDG', 'STG', 'LDGSTS') and k.endswith('.U16')}
        assert not scalar, (r['kernel'], scalar)
        assert counts.get('LDG.128', 0) + counts.get('LDGSTS.128', 0) > 0, r
    for r in reports['linear_attention']:
        if r['kernel'] in ('_state_kernel', '_output_kernel'):
            assert r['stack'] == 0, r
