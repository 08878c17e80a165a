"""`import mmlinvit` alone makes OneDL and mmlinvit config scopes work, without importing OpenMMLab."""
import os
import subprocess
import sys
import textwrap

SCRIPT = """
import sys
import mmlinvit
assert not [m for m in sys.modules if m.split('.')[0] in
            ('mmengine', 'mmcv', 'mmseg', 'mmpretrain', 'mmdet')], 'import mmlinvit loaded OpenMMLab'
from mmengine.config import Config
open('user_seg.py', 'w').write(
    "_base_ = ['mmseg::vit/vit_deit-s16_upernet_8xb2-80k_ade20k-512x512.py']\\n")
open('user_demo.py', 'w').write(
    "_base_ = ['mmlinvit::demo/upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py']\\n")
seg = Config.fromfile('user_seg.py')
demo = Config.fromfile('user_demo.py')
print('OK', seg.model.backbone.type, demo.model.backbone.type)
"""


def _run(tmp_path, code):
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=600)


def test_scopes_work_after_plain_import_mmlinvit(tmp_path):
    proc = _run(tmp_path, SCRIPT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'OK VisionTransformer mmlinvit.LinearVisionTransformer' in proc.stdout


def test_scopes_register_when_mmengine_was_imported_first(tmp_path):
    code = 'import mmengine.config\n' + SCRIPT.replace(
        "assert not [m for m in sys.modules if m.split('.')[0] in\n"
        "            ('mmengine', 'mmcv', 'mmseg', 'mmpretrain', 'mmdet')], "
        "'import mmlinvit loaded OpenMMLab'\n", '')
    proc = _run(tmp_path, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'OK VisionTransformer' in proc.stdout


def test_config_scopes_module_as_the_first_import(tmp_path):
    """The README's `from mmlinvit.config_scopes import register_config_scopes` as a process's
    first import failed with a circular ImportError (the hook re-imported the half-loaded
    module); it works, and the scopes resolve without calling it."""
    code = ('from mmlinvit.config_scopes import register_config_scopes\n'
            'from mmengine.config import Config\n' + SCRIPT.split('import Config\n', 1)[1])
    proc = _run(tmp_path, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'OK VisionTransformer mmlinvit.LinearVisionTransformer' in proc.stdout
    again = _run(tmp_path, 'import mmlinvit.config_scopes as s\n'
                           'print(sorted(s.register_config_scopes()))')
    assert again.returncode == 0 and "'mmlinvit'" in again.stdout, again.stderr[-3000:]
