"""Every file under ``configs/`` loads, and every config's model builds.

How the models are built cheaply (about 1 s per config on 2 CPU cores, with the real
structure: every ``type`` resolved, every constructor argument checked):

* Configs whose build runs nothing (mmseg / mmpretrain task models, Mask2Former included) are
  built **at full size on** ``torch.device('meta')``: parameters get shapes but no storage
  and no initialisation, so DINOv2-L with Mask2Former costs no memory.  Their parameter
  count must equal the ``Parameters`` of the model index (``configs/**/metafile.yml``,
  counted by ``tools/analysis/count_flops.py``).
* ``mmlinvit.DistillationModel`` configs run a build-time forward of teacher, student and
  every loss (the dry run), which the meta device cannot execute (data-dependent shapes in
  MHLA, ``torch.autocast`` in the linear-attention kernels).  They are built on the CPU
  with one documented override, :func:`shrink_width`: every backbone keeps its depth,
  family, operator, patch size and token layout, and only its width is divided by
  ``WIDTH_DIVISOR`` (heads and MLP with it); the module widths that are copies of a backbone
  width (``in_channels`` / ``out_channels`` / ``embed_dim`` of heads, necks, connectors) follow.
  Recorders, block indices, teacher forcing, weight transfer and the dry run itself then run
  as configured.  Checkpoint paths are cleared in both cases (no file is read).

The configs' runtime builds (Runner, data) are covered by the recipe tests
(tests/segmentation, tests/distill, tests/linearizer) on generated data.
"""
import copy
import glob
import os.path as osp
from typing import Any, Dict, List

import pytest
import torch
import yaml
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope

import mmlinvit.registry  # noqa: F401  (mmseg:: / mmlinvit:: config scopes)
from mmlinvit.backbones.adventurer import ADVENTURER_SIZES
from mmlinvit.backbones.arch_zoo import VIT_SIZES
from mmlinvit.engine.preflight import clear_checkpoints

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG_ROOT = osp.join(REPO, 'configs')
ALL_FILES = sorted(osp.relpath(p, CONFIG_ROOT)
                   for p in glob.glob(osp.join(CONFIG_ROOT, '**', '*.py'), recursive=True))
MODEL_CONFIGS = [rel for rel in ALL_FILES if not rel.startswith('_base_')]
DISTILLATION_TYPES = ('mmlinvit.DistillationModel', 'DistillationModel')
BACKBONE_TYPES = ('VisionTransformer', 'LinearVisionTransformer', 'Adventurer')
#: Width divisor of :func:`shrink_width` (ViT-L 1024 -> 128, ViT-B 768 -> 96, DeiT-T 192 -> 24).
WIDTH_DIVISOR = 8
#: Keys whose integer values are module widths (a copy of a backbone width where they match).
WIDTH_KEYS = ('in_channels', 'out_channels', 'embed_dim')


def _metafile_parameters() -> Dict[str, int]:
    """Config path (relative to configs/) -> ``Parameters`` of the model index."""
    with open(osp.join(REPO, 'model-index.yml')) as f:
        imports = yaml.safe_load(f)['Import']
    params = {}
    for meta in imports:
        with open(osp.join(REPO, meta)) as f:
            for model in yaml.safe_load(f)['Models']:
                params[osp.relpath(model['Config'], 'configs')] = model['Metadata']['Parameters']
    return params


def _backbones(node: Any) -> List[dict]:
    """Every mmlinvit backbone config under ``node`` (depth first)."""
    found, stack = [], [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict) and str(item.get('type', '')).split('.')[-1] in BACKBONE_TYPES:
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
    return found


def _map_widths(node: Any, widths: Dict[int, int]) -> None:
    """Replaces backbone widths in ``WIDTH_KEYS`` values (ints or lists) outside backbones."""
    if isinstance(node, dict):
        if str(node.get('type', '')).split('.')[-1] in BACKBONE_TYPES:
            return
        for key, value in node.items():
            if key in WIDTH_KEYS and isinstance(value, int) and value in widths:
                node[key] = widths[value]
            elif key in WIDTH_KEYS and isinstance(value, (list, tuple)):
                node[key] = [widths.get(v, v) for v in value]
            else:
                _map_widths(value, widths)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _map_widths(value, widths)


def shrink_width(model_cfg: dict) -> Dict[int, int]:
    """Divides every backbone's width by ``WIDTH_DIVISOR`` in place; keeps everything else.

    A backbone's ``arch`` size name becomes the equivalent dict (same ``num_layers``) with
    ``embed_dims`` / ``mlp_hidden_dims`` divided and at least one head; widths copied into
    heads, necks and connectors (``WIDTH_KEYS``) are mapped the same way, so a teacher and a
    student of equal width stay equal.

    Returns:
        Original width -> shrunk width.
    """
    widths: Dict[int, int] = {}
    for backbone in _backbones(model_cfg):
        arch = backbone.get('arch', 'b')
        adventurer = str(backbone['type']).split('.')[-1] == 'Adventurer'
        sizes = ADVENTURER_SIZES if adventurer else VIT_SIZES
        arch = dict(sizes[arch]) if isinstance(arch, str) else dict(arch)
        arch.pop('_delete_', None)
        small = arch['embed_dims'] // WIDTH_DIVISOR
        widths[arch['embed_dims']] = small
        arch['embed_dims'] = small
        if 'num_heads' in arch:
            arch['num_heads'] = max(1, arch['num_heads'] // WIDTH_DIVISOR)
        if 'mlp_hidden_dims' in arch:
            arch['mlp_hidden_dims'] //= WIDTH_DIVISOR
        backbone['arch'] = arch
    _map_widths(model_cfg, widths)
    return widths


def _model_config(rel: str) -> Config:
    cfg = Config.fromfile(osp.join(CONFIG_ROOT, rel))
    model = copy.deepcopy(cfg.model)
    # mmengine's Runner gives the model the config's data_preprocessor when it has none
    if cfg.get('data_preprocessor', None) is not None:
        model.setdefault('data_preprocessor', copy.deepcopy(cfg.data_preprocessor))
    clear_checkpoints(model)
    return cfg, model


def test_every_config_file_is_found():
    assert 'adala_dinov2_ade20k.py' in MODEL_CONFIGS
    assert len(MODEL_CONFIGS) == len(_metafile_parameters())  # each one is indexed
    assert any(rel.startswith('_base_/models/') for rel in ALL_FILES)


@pytest.mark.parametrize('rel', [r for r in ALL_FILES if r.startswith('_base_')])
def test_base_file_loads(rel):
    cfg = Config.fromfile(osp.join(CONFIG_ROOT, rel))
    assert len(cfg.keys()) > 0


@pytest.mark.parametrize('rel', MODEL_CONFIGS)
def test_config_builds(rel):
    cfg, model_cfg = _model_config(rel)
    init_default_scope(cfg.default_scope)
    if model_cfg['type'] in DISTILLATION_TYPES:
        widths = shrink_width(model_cfg)
        assert widths, 'a distillation config without an mmlinvit backbone'
        model = MODELS.build(model_cfg)  # CPU: runs the build-time dry run
        assert model.teacher is not None
        student = model.student_backbone()
        assert student.embed_dims in widths.values()
    else:
        with torch.device('meta'):
            model = MODELS.build(model_cfg)
        params = sum(p.numel() for p in model.parameters())
        assert params == _metafile_parameters()[rel], 'parameters differ from the model index'
    assert isinstance(model, torch.nn.Module)


def test_width_override_keeps_the_structure():
    """shrink_width changes widths only: depth, indices, operators and key set are kept."""
    rel = 'linearizer/vit-linearizer_clip-b16_adventurer-b_16xb64-300e_in1k-224x224.py'
    _, original = _model_config(rel)
    shrunk = copy.deepcopy(original)
    assert shrink_width(shrunk) == {768: 96}
    assert shrunk['student']['arch'] == dict(embed_dims=96, num_layers=12)
    assert shrunk['teacher']['arch'] == dict(embed_dims=96, num_layers=12, num_heads=1,
                                             mlp_hidden_dims=384)
    assert shrunk['connectors']['proj']['out_channels'] == 96
    for side in ('student_recorders', 'teacher_recorders', 'distill_losses',
                 'patch_masking', 'teacher_input_norm'):
        assert shrunk[side] == original[side], side


def test_adala_entry_file_is_reachable_as_mmlinvit_scope(tmp_path):
    """The short entry file is the adala/ config, so other repositories can inherit it."""
    user = tmp_path / 'my_adala.py'
    user.write_text("_base_ = ['mmlinvit::adala/"
                    "mask2former_adala-dinov2-l-elu_8xb2-160k_ade20k-518x518.py']\n"
                    "model = dict(decode_head=dict(num_classes=21))\n")
    cfg = Config.fromfile(str(user))
    entry = Config.fromfile(osp.join(CONFIG_ROOT, 'adala_dinov2_ade20k.py'))
    assert cfg.model.backbone == entry.model.backbone
    assert cfg.model.decode_head.num_classes == 21 and cfg.default_scope == 'mmseg'


def test_teacher_segmentation_config_does_not_inherit_the_student():
    """The softmax teacher's recipe stands alone; the AdaLA student is built from it."""
    teacher = osp.join(CONFIG_ROOT, 'segmentation',
                       'mask2former_dinov2-l_8xb2-160k_ade20k-518x518.py')
    bases = Config._get_base_files(teacher)
    assert not any('adala' in b for b in bases), bases
    cfg = Config.fromfile(teacher)
    assert cfg.model.backbone.type == 'mmlinvit.VisionTransformer'
    assert cfg.model.backbone.attn_cfg == 'softmax'


def test_one_base_for_the_adala_stage3_backbone():
    """Each Stage-3 config takes its backbone from _base_/models/adala-dinov2-l-elu.py."""
    base = Config.fromfile(osp.join(CONFIG_ROOT, '_base_', 'models', 'adala-dinov2-l-elu.py'))
    stage3 = [rel for rel in MODEL_CONFIGS if 'adala-dinov2-l-elu' in rel]
    assert len(stage3) >= 5
    for rel in stage3:
        cfg = Config.fromfile(osp.join(CONFIG_ROOT, rel))
        backbone = cfg.model.backbone
        for key, value in base.adala_backbone.items():
            assert backbone[key] == value, (rel, key)
        assert cfg.missing_path_hints == base.adala_missing_path_hints, rel
        with open(osp.join(CONFIG_ROOT, rel)) as f:
            text = f.read()
        assert 'LinearVisionTransformer' not in text, f'{rel} pastes the backbone again'
