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


SECOND_COPY = """
import importlib.util, sys
import mmlinvit
from mmlinvit import _config_scope_hook
spec = importlib.util.spec_from_file_location('second_copy_hook', _config_scope_hook.__file__)
second = importlib.util.module_from_spec(spec)
spec.loader.exec_module(second)
second.install()  # another copy's finder (another class): both are on sys.meta_path
assert sum(type(f).__name__ == 'ConfigScopeFinder' for f in sys.meta_path) == 2
import mmengine.config
from mmengine.config import utils
assert utils.MODULE2PACKAGE.get('mmlinvit') == 'mmlinvit', utils.MODULE2PACKAGE
print('OK')
"""


def test_two_copies_of_the_hook_do_not_ask_each_other_without_end(tmp_path):
    """Two copies of mmlinvit in one process (an installed one and a source tree on
    PYTHONPATH) each install a finder; they asked each other for ``mmengine.config`` until a
    RecursionError."""
    proc = subprocess.run([sys.executable, '-c', SECOND_COPY], cwd=str(tmp_path),
                          env=dict(os.environ), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and 'OK' in proc.stdout, proc.stderr[-2000:]
