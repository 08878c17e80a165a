"""LayerDecayOptimWrapperConstructor: learning rates follow the backbone's get_layer_depth."""
import pytest
import torch.nn as nn

from mmlinvit.backbones import VisionTransformer
from mmlinvit.engine.optimizers import LayerDecayOptimWrapperConstructor

TINY = dict(embed_dims=16, num_layers=3, num_heads=2, mlp_hidden_dims=32)


class TinySegmentor(nn.Module):
    """A backbone with get_layer_depth plus a head outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = VisionTransformer(TINY, img_size=32, patch_size=8, out_type='featmap')
        self.head = nn.Conv2d(16, 4, 1)


class Distiller(nn.Module):
    """The backbone one level deeper, as in DistillationModel (student.backbone)."""

    def __init__(self) -> None:
        super().__init__()
        self.student = TinySegmentor()


def _build(model: nn.Module, rate: float = 0.5, **extra):
    ctor = LayerDecayOptimWrapperConstructor(
        dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.0, weight_decay=0.1)),
        paramwise_cfg=dict(layer_decay_rate=rate, **extra))
    return ctor(model).optimizer


@pytest.mark.parametrize('rate', [0.5, 0.8])
def test_lr_follows_get_layer_depth(rate):
    model = TinySegmentor()
    optimizer = _build(model, rate)
    lr_of = {}
    wd_of = {}
    for group in optimizer.param_groups:
        for name in group['param_names']:
            lr_of[name] = group['lr']
            wd_of[name] = group['weight_decay']
    params = dict(model.named_parameters())
    assert set(lr_of) == set(params)
    total = TINY['num_layers'] + 2
    for name, param in params.items():
        if name.startswith('backbone.'):
            depth, num = model.backbone.get_layer_depth(name, 'backbone.')
        else:
            depth, num = total - 1, total
        assert num == total
        assert lr_of[name] == pytest.approx(rate**(total - 1 - depth)), name
        no_decay = param.ndim == 1 or 'pos_embed' in name or 'cls_token' in name
        assert wd_of[name] == (0.0 if no_decay else 0.1), name
    # The depth order is strict: embeddings < block 0 < ... < head.
    assert lr_of['backbone.patch_embed.proj.weight'] < lr_of['backbone.blocks.0.attn.qkv.weight']
    assert lr_of['backbone.blocks.0.attn.qkv.weight'] < lr_of['backbone.blocks.2.mlp.fc1.weight']
    assert lr_of['backbone.blocks.2.mlp.fc1.weight'] < lr_of['head.weight'] == 1.0


def test_nested_backbone_path():
    model = Distiller()
    optimizer = _build(model, 0.5, backbone='student.backbone')
    by_name = {n: g['lr'] for g in optimizer.param_groups for n in g['param_names']}
    assert by_name['student.backbone.cls_token'] == pytest.approx(0.5**4)
    assert by_name['student.head.weight'] == 1.0


def test_frozen_parameters_are_left_out():
    """A frozen teacher beside the student is not given to the optimizer (as mmpretrain)."""
    model = Distiller()
    model.teacher = VisionTransformer(TINY, img_size=32, patch_size=8)
    model.teacher.requires_grad_(False)
    optimizer = _build(model, 0.5, backbone='student.backbone')
    names = [n for g in optimizer.param_groups for n in g['param_names']]
    assert names and not any(n.startswith('teacher.') for n in names)
    assert sorted(names) == sorted(n for n, _ in model.student.named_parameters(prefix='student'))


def test_first_depth_names_put_head_parameters_at_the_embeddings_lr():
    """ViT-Adapter's Mask2Former recipe: query / level embeddings at layer 0."""
    model = TinySegmentor()
    model.query_embed = nn.Embedding(4, 16)
    optimizer = _build(model, 0.5, first_depth_names=['query_embed'])
    lr_of = {n: g['lr'] for g in optimizer.param_groups for n in g['param_names']}
    wd_of = {n: g['weight_decay'] for g in optimizer.param_groups for n in g['param_names']}
    assert lr_of['query_embed.weight'] == lr_of['backbone.cls_token'] == pytest.approx(0.5**4)
    assert wd_of['query_embed.weight'] == 0.1  # a 2-D weight keeps its weight decay
    assert lr_of['head.weight'] == 1.0
    with pytest.raises(KeyError, match=r"first_depth_names \['level_embed'\] match no"):
        _build(model, 0.5, first_depth_names=['query_embed', 'level_embed'])


def test_missing_backbone_and_rate_are_clear_errors():
    with pytest.raises(AttributeError, match='student.backbone'):
        _build(TinySegmentor(), 0.5, backbone='student.backbone')
    model = TinySegmentor()
    model.backbone = nn.Linear(2, 2)  # no get_layer_depth
    with pytest.raises(TypeError, match='get_layer_depth'):
        _build(model)
    with pytest.raises(KeyError, match='layer_decay_rate'):
        LayerDecayOptimWrapperConstructor(
            dict(optimizer=dict(type='AdamW', lr=1.0)), paramwise_cfg=dict())


def test_registered_for_configs():
    from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS, DefaultScope
    with DefaultScope.overwrite_default_scope('mmseg'):
        ctor = OPTIM_WRAPPER_CONSTRUCTORS.build(
            dict(type='mmlinvit.LayerDecayOptimWrapperConstructor',
                 optim_wrapper_cfg=dict(optimizer=dict(type='AdamW', lr=1.0)),
                 paramwise_cfg=dict(layer_decay_rate=0.9)))
    assert isinstance(ctor, LayerDecayOptimWrapperConstructor)
