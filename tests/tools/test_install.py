"""tools/install.sh: a second run installs nothing; the onedl-mmcv build prints its progress.

The first test runs the real script against the environment running the tests, only when that
environment was made by install.sh for the current pins (its stamp exists): then the script
must take the fast path - no pip call - and return in seconds.  The second test feeds the
script's progress filter the output of a real ninja build.
"""
import hashlib
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import time

import pytest

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
INSTALL = osp.join(REPO, 'tools', 'install.sh')


def _stamp(venv: str) -> str:
    with open(osp.join(REPO, 'tools', 'requirements', 'stack.txt'), 'rb') as f:
        digest = hashlib.sha1(f.read()).hexdigest()[:12]
    return osp.join(venv, f'.mmlinvit-stack-{digest}')


def test_second_install_run_installs_nothing():
    venv = sys.prefix
    if not osp.isfile(_stamp(venv)):
        pytest.skip('the test environment was not made by tools/install.sh for these pins')
    env = dict(os.environ, MMLINVIT_VENV=venv)
    start = time.monotonic()
    proc = subprocess.run(['bash', INSTALL], capture_output=True, text=True, env=env,
                          timeout=300)
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith('[install]')]
    assert lines == [f'[install] stack already installed in {venv}',
                     f'[install] ready: {venv}/bin/python'], proc.stderr[-3000:]
    assert took < 60, took  # about 0.5 s on an idle 2-core machine


def _progress_filter_script(log_file: str) -> str:
    """install.sh's helpers and mmcv_progress, cut out of the script itself."""
    with open(INSTALL) as f:
        text = f.read()
    helpers = [line for line in text.splitlines()
               if line.startswith(('log() {', 'elapsed() {'))]
    body = re.search(r'^mmcv_progress\(\) \{\n.*?^\}\n', text, re.S | re.M)
    assert len(helpers) == 2 and body, 'install.sh lost log / elapsed / mmcv_progress'
    return '\n'.join(['set -euo pipefail', *helpers, f'MMCV_LOG={log_file}', body.group(0)])


def test_mmcv_build_progress_lines(tmp_path):
    ninja = shutil.which('ninja', path=osp.dirname(sys.executable)) or shutil.which('ninja')
    if ninja is None:
        pytest.skip('ninja is not installed')
    (tmp_path / 'build.ninja').write_text(
        'rule cc\n  command = touch $out\n' +
        ''.join(f'build obj{i}.o: cc\n' for i in range(5)))
    script = _progress_filter_script(str(tmp_path / 'build.log'))
    # ninja as torch's BuildExtension runs it under `pip -v` (output not a terminal), then a
    # failing pip: the filter must report progress and keep the failure.
    script += (f"\n( cd {tmp_path} && echo '  Running command Building wheel' && "
               f"NINJA_STATUS='[%f/%t] ' {ninja} -v -j 2 && "
               "echo '  Created wheel for onedl-mmcv: filename=x.whl' && exit 7 ) 2>&1 "
               "| mmcv_progress || echo \"pipeline failed: $?\"\n")
    proc = subprocess.run(['bash', '-c', script], capture_output=True, text=True, timeout=60)
    progress = [line for line in proc.stderr.splitlines() if 'objects compiled' in line]
    assert [re.search(r'(\d+)/(\d+) objects', line).groups() for line in progress] == [
        (str(i), '5') for i in range(1, 6)]
    assert all(re.search(r'\d+m\d\ds elapsed$', line) for line in progress)
    assert 'Created wheel for onedl-mmcv' in proc.stderr
    assert 'pipeline failed: 7' in proc.stdout
    assert 'Running command Building wheel' in (tmp_path / 'build.log').read_text()
