"""Importing mmlinvit after mmengine.config registers its config scopes.

The subprocess keeps PYTHONPATH, so it runs the tree under test (tests/test_config_scope_hook.py
drops it and runs the installed mmlinvit)."""
import os
import subprocess
import sys

CODE = """
import mmengine.config
from mmengine.config import utils
assert 'mmlinvit' not in utils.MODULE2PACKAGE
import mmlinvit
assert utils.MODULE2PACKAGE.get('mmlinvit') == 'mmlinvit', utils.MODULE2PACKAGE
print('OK')
"""


def test_import_mmlinvit_after_mmengine_config_registers_the_scopes(tmp_path):
    proc = subprocess.run([sys.executable, '-c', CODE], cwd=str(tmp_path), env=dict(os.environ),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and 'OK' in proc.stdout, proc.stderr[-2000:]
