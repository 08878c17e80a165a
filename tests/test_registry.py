"""``type='mmlinvit.X'`` resolves from mmseg- and mmpretrain-scoped configs without imports.

Each check runs in a fresh interpreter so that nothing has imported mmlinvit beforehand.
"""
import os
import subprocess
import sys
import textwrap

import pytest

SEG_CFG = """
default_scope = 'mmseg'
model = dict(
    type='EncoderDecoder',
    data_preprocessor=dict(type='SegDataPreProcessor', mean=[0., 0., 0.], std=[1., 1., 1.]),
    backbone=dict(type='mmlinvit.VisionTransformer',
                  arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64),
                  img_size=32, patch_size=8, out_type='featmap', out_indices=[0, 1]),
    decode_head=dict(type='FCNHead', in_channels=32, in_index=1, channels=16, num_convs=1,
                     num_classes=3, norm_cfg=dict(type='BN', requires_grad=True)),
    train_cfg=dict(), test_cfg=dict(mode='whole'))
"""

CLS_CFG = """
default_scope = 'mmpretrain'
model = dict(
    type='ImageClassifier',
    backbone=dict(type='mmlinvit.VisionTransformer',
                  arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64),
                  img_size=32, patch_size=8, out_type='cls_token'),
    head=dict(type='LinearClsHead', num_classes=5, in_channels=32))
"""

SCRIPT = """
import sys
from mmengine.config import Config
from mmengine.registry import init_default_scope
assert 'mmlinvit' not in sys.modules
cfg = Config.fromstring({cfg!r}, file_format='.py')
init_default_scope(cfg.default_scope)
from {scope}.registry import MODELS
import torch
model = MODELS.build(cfg.model)
from mmlinvit.backbones import VisionTransformer
assert isinstance(model.backbone, VisionTransformer), type(model.backbone)
out = model(torch.randn(2, 3, 32, 32), mode='tensor')
print('OK', type(model).__name__)
"""


@pytest.mark.parametrize('scope,cfg', [('mmseg', SEG_CFG), ('mmpretrain', CLS_CFG)])
def test_scoped_name_resolves_without_custom_imports(scope, cfg):
    code = textwrap.dedent(SCRIPT).format(cfg=cfg, scope=scope)
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'OK' in proc.stdout


def test_registry_scope_and_locations():
    from mmlinvit.registry import HOOKS, MODELS, OPTIM_WRAPPER_CONSTRUCTORS
    assert MODELS.scope == HOOKS.scope == OPTIM_WRAPPER_CONSTRUCTORS.scope == 'mmlinvit'
    assert MODELS.get('VisionTransformer') is not None
    from mmengine.registry import MODELS as ROOT
    assert ROOT.get('mmlinvit.VisionTransformer') is MODELS.get('VisionTransformer')


def test_every_registry_has_real_locations_and_entries():
    """Each registry of ``mmlinvit.registry`` imports modules that exist and holds entries.

    The old module also defined ``METRICS`` (locations ``mmlinvit.evaluation``, a package that
    does not exist), and empty ``MODEL_WRAPPERS`` / ``TRANSFORMS``: this test fails on it.
    """
    import importlib.util

    from mmengine.registry import Registry

    import mmlinvit.registry as reg
    registries = {name: obj for name, obj in vars(reg).items()
                  if isinstance(obj, Registry) and obj.scope == 'mmlinvit'}
    assert set(registries) == {'MODELS', 'HOOKS', 'OPTIM_WRAPPER_CONSTRUCTORS', 'DATASETS',
                               'DATA_SAMPLERS'}
    for name, registry in registries.items():
        for location in registry._locations:
            assert importlib.util.find_spec(location) is not None, (name, location)
        registry.import_from_location()
        assert len(registry.module_dict) > 0, f'{name} is empty'


def test_one_registration_module_registers_every_torch_only_class():
    """mmlinvit.models.register puts backbones, operators and losses into MODELS by class name."""
    import mmlinvit.models  # noqa: F401  (performs the registration)
    from mmlinvit.distill import losses
    from mmlinvit.layers.attention import ATTENTION_OPERATORS
    from mmlinvit.models.register import BACKBONES, LOSSES
    from mmlinvit.registry import MODELS
    loss_classes = {getattr(losses, name) for name in losses.__all__
                    if name.endswith('Loss')}
    assert set(LOSSES) == loss_classes  # every torch-only loss, nothing missing
    for cls in (*BACKBONES, *LOSSES, *(c for _, c in ATTENTION_OPERATORS.items())):
        assert MODELS.get(cls.__name__) is cls, cls


#: The torch-only layers (README "Layout"): none of them may import OpenMMLab.
TORCH_ONLY_PACKAGES = ('mmlinvit.ops', 'mmlinvit.layers', 'mmlinvit.backbones',
                       'mmlinvit.converters', 'mmlinvit.transfer', 'mmlinvit.analysis',
                       'mmlinvit.distill')  # distill imports its losses and recorders


@pytest.mark.parametrize('package', TORCH_ONLY_PACKAGES)
def test_low_level_layers_import_without_openmmlab(package):
    code = (f'import sys, {package}; '
            'bad = [m for m in sys.modules if m.split(".")[0] in '
            '("mmengine", "mmcv", "mmseg", "mmpretrain", "mmdet")]; '
            'assert not bad, bad; print("OK")')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


# ----------------------------------------------------------- cross-package config inheritance
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCOPED_BASES = """
import sys
{prelude}
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope
open('seg.py', 'w').write('''
_base_ = ['mmseg::vit/vit_deit-s16_upernet_8xb2-80k_ade20k-512x512.py']
model = dict(
    pretrained=None,
    backbone=dict(_delete_=True, type='mmlinvit.LinearVisionTransformer',
                  arch=dict(embed_dims=32, num_layers=4, num_heads=2, mlp_hidden_dims=64),
                  img_size=32, patch_size=8, out_type='featmap', out_indices=[0, 1, 2, 3]),
    decode_head=dict(in_channels=[32] * 4, channels=16, num_classes=5,
                     norm_cfg=dict(type='BN', requires_grad=True)),
    auxiliary_head=dict(in_channels=32, channels=16, num_classes=5,
                        norm_cfg=dict(type='BN', requires_grad=True)))
''')
open('cls.py', 'w').write("_base_ = ['mmpretrain::_base_/models/vit-base-p16.py']\\n")
open('det.py', 'w').write("_base_ = ['mmdet::_base_/models/faster-rcnn_r50_fpn.py']\\n")
seg = Config.fromfile('seg.py')
assert seg.model._scope_ == 'mmseg', seg.model
assert seg.model.decode_head.type == 'UPerHead'
assert Config.fromfile('cls.py').model.head.type == 'VisionTransformerClsHead'
assert Config.fromfile('det.py').model.type == 'FasterRCNN'
import torch
init_default_scope('mmseg')
model = MODELS.build(seg.model).eval()
from mmlinvit.backbones import LinearVisionTransformer
assert isinstance(model.backbone, LinearVisionTransformer)
out = model(torch.randn(1, 3, 32, 32), mode='tensor')
assert out.shape[1] == 5, out.shape
print('OK')
"""


def _run(code: str, cwd, env, timeout=600):
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=timeout)


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    env.update(extra)
    return env


def test_onedl_scopes_resolve_after_importing_registry(tmp_path):
    """mmseg:: / mmpretrain:: / mmdet:: bases load (OneDL pip names), outside the repo."""
    proc = _run(SCOPED_BASES.format(prelude='import mmlinvit.registry'), tmp_path, _clean_env())
    assert proc.returncode == 0 and 'OK' in proc.stdout, proc.stderr[-3000:]


def test_onedl_scopes_resolve_in_the_tools_config_loader(tmp_path):
    """tools/train.py and tools/test.py read configs through launch.load_config."""
    code = SCOPED_BASES.format(prelude='from mmlinvit.engine.launch import load_config').replace(
        "seg = Config.fromfile('seg.py')", "seg = load_config('seg.py')")
    proc = _run(code, tmp_path, _clean_env())
    assert proc.returncode == 0 and 'OK' in proc.stdout, proc.stderr[-3000:]


def test_scope_registration_is_explicit_and_points_at_installed_distributions():
    from importlib.metadata import distribution
    from importlib.util import find_spec

    from mmengine.config.utils import MODULE2PACKAGE
    from mmengine.utils import get_installed_path

    from mmlinvit.config_scopes import register_config_scopes
    registered = register_config_scopes()
    assert registered == {'mmseg': 'onedl-mmsegmentation', 'mmpretrain': 'onedl-mmpretrain',
                          'mmdet': 'onedl-mmdetection', 'mmlinvit': 'mmlinvit'}
    for scope, dist in registered.items():
        assert MODULE2PACKAGE[scope] == dist
        distribution(dist)  # installed
        # mmengine finds the same directory that `import <scope>` loads
        assert os.path.realpath(get_installed_path(dist)) == os.path.realpath(
            os.path.dirname(find_spec(scope).origin))
    assert register_config_scopes() == registered  # idempotent, wraps once


USER_CONFIG = """
_base_ = ['mmlinvit::demo/upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py']
model = dict(backbone=dict(pretrained=None), decode_head=dict(num_classes=3))
"""

MMLINVIT_SCOPE_SCRIPT = """
import os, sys
import mmlinvit, mmlinvit.registry
print('PACKAGE', os.path.dirname(os.path.realpath(mmlinvit.__file__)))
from mmengine.config import Config
open('user_cfg.py', 'w').write({user!r})
path, scope = Config._get_cfg_path(
    'mmlinvit::demo/upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py', 'x.py')
print('BASE', os.path.realpath(path))
assert scope == 'mmseg', scope
cfg = Config.fromfile('user_cfg.py')
assert cfg.default_scope == 'mmseg'
assert cfg.model._scope_ == 'mmseg' and cfg.model.backbone.type == 'mmlinvit.LinearVisionTransformer'
import torch
from mmengine.registry import MODELS, init_default_scope
init_default_scope(cfg.default_scope)
model = MODELS.build(cfg.model).eval()
out = model(torch.randn(1, 3, 64, 64), mode='tensor')
assert out.shape[1] == 3, out.shape
print('OK')
"""


def test_mmlinvit_scope_editable_install_reads_repository_configs(tmp_path):
    proc = _run(MMLINVIT_SCOPE_SCRIPT.format(user=USER_CONFIG), tmp_path, _clean_env())
    assert proc.returncode == 0 and 'OK' in proc.stdout, proc.stderr[-3000:]
    lines = dict(line.split(' ', 1) for line in proc.stdout.splitlines() if ' ' in line)
    assert lines['BASE'] == os.path.join(REPO, 'configs', 'demo',
                                         'upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py')


def test_mmlinvit_scope_non_editable_install(tmp_path):
    """pip install (a built wheel) ships configs + model index in mmlinvit/.mim."""
    target = tmp_path / 'site'
    pip = subprocess.run(
        [sys.executable, '-m', 'pip', 'install', '-q', '--no-deps', '--no-build-isolation',
         '--disable-pip-version-check', '--target', str(target), REPO],
        capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-3000:]
    mim = target / 'mmlinvit' / '.mim'
    assert (mim / 'model-index.yml').is_file() and not (mim / 'configs').is_symlink()
    assert (mim / 'configs' / 'adala' /
            'vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512.py').is_file()
    work = tmp_path / 'user_repo'
    work.mkdir()
    proc = _run(MMLINVIT_SCOPE_SCRIPT.format(user=USER_CONFIG), work,
                _clean_env(PYTHONPATH=str(target)))
    assert proc.returncode == 0 and 'OK' in proc.stdout, proc.stderr[-3000:]
    lines = dict(line.split(' ', 1) for line in proc.stdout.splitlines() if ' ' in line)
    assert lines['PACKAGE'] == os.path.realpath(target / 'mmlinvit')
    assert lines['BASE'].startswith(os.path.realpath(mim / 'configs'))


def test_mmlinvit_scope_without_installed_configs_fails_clearly(tmp_path):
    """A checkout only on PYTHONPATH has no .mim: the error says how to install."""
    import shutil
    shutil.copytree(os.path.join(REPO, 'mmlinvit'), tmp_path / 'src' / 'mmlinvit',
                    ignore=shutil.ignore_patterns('.mim', '__pycache__'))
    code = ("import mmlinvit.registry\nfrom mmengine.config import Config\n"
            "open('u.py', 'w').write(\"_base_ = "
            "['mmlinvit::_base_/datasets/toy_scenes_64x64.py']\")\n"
            "Config.fromfile('u.py')\n")
    proc = _run(code, tmp_path, _clean_env(PYTHONPATH=str(tmp_path / 'src')))
    assert proc.returncode != 0
    assert 'mmlinvit:: configs are not installed' in proc.stderr
    assert 'pip install -e' in proc.stderr
