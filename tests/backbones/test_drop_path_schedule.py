"""The stochastic-depth (drop-path) schedule of the ViT backbones.

Guards the per-block drop-path rates of :class:`mmlinvit.VisionTransformer` and
:class:`mmlinvit.LinearVisionTransformer`.  timm's ``VisionTransformer`` and mmpretrain's
``VisionTransformer`` both use ``dpr = torch.linspace(0, drop_path_rate, depth)``: block 0 is
never dropped and the last block gets the full ``drop_path_rate`` (stochastic depth, Huang et
al. 2016, "linear decay rule").  A reversed or shifted schedule trains a different model with no
error and no visible change in the loss curve (mutation-audit survivor m18: ``i`` ->
``depth - 1 - i`` passed every test), so the schedule is pinned here, for directly built
backbones and for the backbones of every config that sets a non-zero ``drop_path_rate``
(built with the config's depth, operator and family, only narrower).
"""
import copy
import glob
import os.path as osp
from typing import Any, Iterator, List, Tuple

import pytest
import torch
from mmengine.config import Config

import mmlinvit.registry  # noqa: F401  (mmlinvit:: config scopes)
from mmlinvit.backbones.arch_zoo import VIT_SIZES
from mmlinvit.backbones.vit import LinearVisionTransformer, VisionTransformer
from mmlinvit.engine.preflight import clear_checkpoints

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG_ROOT = osp.join(REPO, 'configs')
VIT_TYPES = ('VisionTransformer', 'LinearVisionTransformer')


def _reference_schedule(rate: float, depth: int) -> List[float]:
    """timm / mmpretrain: ``[x.item() for x in torch.linspace(0, drop_path_rate, depth)]``."""
    return torch.linspace(0, rate, depth, dtype=torch.float64).tolist()


def _block_rates(backbone) -> Tuple[List[float], List[float]]:
    """drop_prob of every block's attention and MLP residual branches, in block order."""
    return ([blk.drop_path1.drop_prob for blk in backbone.blocks],
            [blk.drop_path2.drop_prob for blk in backbone.blocks])


def _assert_schedule(backbone, rate: float, depth: int) -> None:
    want = _reference_schedule(rate, depth)
    attn_rates, mlp_rates = _block_rates(backbone)
    assert len(backbone.blocks) == depth
    assert attn_rates == pytest.approx(want, rel=1e-9, abs=1e-12), 'drop_path1 schedule'
    assert mlp_rates == pytest.approx(want, rel=1e-9, abs=1e-12), 'drop_path2 schedule'
    if depth > 1 and rate > 0:
        assert attn_rates[0] == 0.0 and attn_rates[-1] == pytest.approx(rate)
        assert all(a < b for a, b in zip(attn_rates, attn_rates[1:])), 'must increase'


def _tiny_arch(num_layers: int) -> dict:
    return dict(embed_dims=32, num_layers=num_layers, num_heads=2, mlp_hidden_dims=64)


@pytest.mark.parametrize('cls', [VisionTransformer, LinearVisionTransformer])
@pytest.mark.parametrize('depth,rate', [(1, 0.3), (2, 0.1), (4, 0.3), (5, 0.2), (12, 0.1),
                                        (7, 0.0)])
def test_schedule_is_linspace_from_zero_to_the_rate(cls, depth, rate):
    backbone = cls(arch=_tiny_arch(depth), img_size=32, patch_size=16, drop_path_rate=rate)
    _assert_schedule(backbone, rate, depth)


def test_drop_path_is_active_only_where_the_schedule_says():
    """Training mode: block 0 (rate 0) is the identity on its residual, the last is not."""
    backbone = LinearVisionTransformer(arch=_tiny_arch(3), img_size=32, patch_size=16,
                                       drop_path_rate=0.5)
    backbone.train()
    x = torch.ones(64, 2, 4)
    torch.manual_seed(0)
    assert torch.equal(backbone.blocks[0].drop_path1(x), x)
    dropped = backbone.blocks[-1].drop_path1(x)
    assert (dropped[:, 0, 0] == 0).any() and (dropped[:, 0, 0] == 2.0).any()


# ------------------------------------------------------------------------------------------
# Backbones as the configs build them
# ------------------------------------------------------------------------------------------


def _vit_backbones(node: Any, where: str) -> Iterator[Tuple[str, dict]]:
    """Every (Linear)VisionTransformer config under ``node`` with its dotted location."""
    if isinstance(node, dict):
        if str(node.get('type', '')).split('.')[-1] in VIT_TYPES:
            yield where, node
            return
        for key, value in node.items():
            yield from _vit_backbones(value, f'{where}.{key}')
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _vit_backbones(value, f'{where}[{i}]')


def _config_backbones() -> List[Tuple[str, str, dict]]:
    """(config, location, backbone cfg) of every ViT backbone with a non-zero drop_path_rate."""
    found = []
    paths = sorted(glob.glob(osp.join(CONFIG_ROOT, '**', '*.py'), recursive=True))
    for path in paths:
        rel = osp.relpath(path, CONFIG_ROOT)
        if rel.startswith('_base_'):
            continue
        model = Config.fromfile(path).to_dict().get('model', {})
        for where, backbone in _vit_backbones(model, 'model'):
            if backbone.get('drop_path_rate', 0.0):
                found.append((rel, where, backbone))
    return found


CONFIG_BACKBONES = _config_backbones()


def test_configs_with_stochastic_depth_are_found():
    """The recipes that train with drop-path (DeiT-B students, DINOv2-L / AdaLA segmentation and
    the AdaLA linear head) are all covered below."""
    rels = {rel for rel, _, _ in CONFIG_BACKBONES}
    assert any(r.startswith('copy_mlp_distill_attn/') for r in rels)
    assert any(r.startswith('segmentation/') for r in rels)
    assert any(r.startswith('adala/') for r in rels)
    types = {str(b['type']).split('.')[-1] for _, _, b in CONFIG_BACKBONES}
    assert types == set(VIT_TYPES)


@pytest.mark.parametrize('rel,where,backbone_cfg', CONFIG_BACKBONES,
                         ids=[f'{rel}:{where}' for rel, where, _ in CONFIG_BACKBONES])
def test_config_backbone_schedule(rel, where, backbone_cfg):
    cfg = copy.deepcopy(backbone_cfg)
    clear_checkpoints(cfg, where)
    arch = cfg.get('arch', 'b')
    depth = (VIT_SIZES[arch] if isinstance(arch, str) else arch)['num_layers']
    cfg['arch'] = _tiny_arch(depth)  # the config's depth, a narrow width (fast to build)
    # The class the config names, called with the config's arguments (what MODELS.build does;
    # the registry itself is left out: its first lookup imports mmpretrain / mmseg, ~5 s).
    cls = {'VisionTransformer': VisionTransformer,
           'LinearVisionTransformer': LinearVisionTransformer}[str(cfg.pop('type')).split('.')[-1]]
    backbone = cls(**cfg)
    _assert_schedule(backbone, float(backbone_cfg['drop_path_rate']), depth)
