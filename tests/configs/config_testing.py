"""Config-test helpers: every config file, and models built from configs cheaply.

:func:`shrink_width` divides every backbone's width by ``WIDTH_DIVISOR`` and keeps everything
else (depth, family, operator, patch size, token layout, recorders, losses), so distillation
configs, whose build runs a dry forward, build on 2 CPU cores.
"""
import copy
import glob
import os.path as osp
from typing import Any, Dict, List, Tuple

import yaml
from mmengine.config import Config

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


def metafile_parameters() -> Dict[str, int]:
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


def model_config(rel: str) -> Tuple[Config, dict]:
    """The config of ``configs/<rel>`` and its model config as the Runner builds it (the
    top-level data_preprocessor filled in), with checkpoint paths cleared."""
    cfg = Config.fromfile(osp.join(CONFIG_ROOT, rel))
    model = copy.deepcopy(cfg.model)
    # mmengine's Runner gives the model the config's data_preprocessor when it has none
    if cfg.get('data_preprocessor', None) is not None:
        model.setdefault('data_preprocessor', copy.deepcopy(cfg.data_preprocessor))
    clear_checkpoints(model)
    return cfg, model


def build_shrunk_model(rel: str) -> Tuple[Config, Any]:
    """The config of ``configs/<rel>`` and its model built as the Runner would, every
    backbone's width divided by ``WIDTH_DIVISOR`` (:func:`shrink_width`); a distillation
    model's build-time dry run uses the student's own size.

    Returns:
        (config, model) with the model's default scope initialised.
    """
    from mmengine.registry import MODELS, init_default_scope
    cfg, model_cfg = model_config(rel)
    init_default_scope(cfg.default_scope)
    shrink_width(model_cfg)
    if model_cfg['type'] in DISTILLATION_TYPES:
        model_cfg['check_input_size'] = None
    return cfg, MODELS.build(model_cfg)
