"""``type='mmlinvit.X'`` resolves from mmseg- and mmpretrain-scoped configs without imports.

Each check runs in a fresh interpreter so that nothing has imported mmlinvit beforehand.
"""
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


def test_low_level_layers_import_without_openmmlab():
    code = ('import sys, mmlinvit.ops, mmlinvit.layers, mmlinvit.backbones; '
            'bad = [m for m in sys.modules if m.split(".")[0] in '
            '("mmengine", "mmcv", "mmseg", "mmpretrain", "mmdet")]; '
            'assert not bad, bad; print("OK")')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
