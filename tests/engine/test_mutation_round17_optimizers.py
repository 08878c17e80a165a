"""The optimizer-wrapper constructors of :mod:`mmlinvit.engine.optimizers` on branches that no
other test reached (mutation round 17): each test below failed on at least one single-line
change of the module that the rest of the suite let pass.

Guarded here, each against an independent reference (a hand-worked value or formula, torch's
own optimizer defaults, mmengine's ``DefaultOptimWrapperConstructor``):

* ``LayerDecayOptimWrapperConstructor``: the error for a missing ``layer_decay_rate``; a
  user's ``no_weight_decay_names`` (accepted, replacing the defaults, matched as fragments
  anywhere in the name); ``lr`` = base lr x ``lr_scale`` with a base lr other than 1;
  ``first_depth_names`` matched inside nested head names, never moving a backbone parameter;
  the groups' names and their depth order whatever the module order; the DEBUG summary;
  FINDING: without ``weight_decay`` in the optimizer config the decayed groups keep the
  optimizer's own default (as mmengine's and mmpretrain's constructors), not 0;
* ``FrozenAwareOptimWrapperConstructor``: mmcv's deformable-convolution offsets keep
  mmengine's ``dcn_offset_lr_mult`` / bias rules (``is_dcn_module`` handed on); a second call
  of the same constructor reports only its own model.
"""
import contextlib
import inspect
import logging
from typing import Dict, Iterator, List, Tuple

import pytest
import torch
import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.optim import DefaultOptimWrapperConstructor

from mmlinvit.backbones import VisionTransformer
from mmlinvit.engine.optimizers import (FrozenAwareOptimWrapperConstructor,
                                        LayerDecayOptimWrapperConstructor)

from train_testing import captured_log

#: A 2-block ViT: depths 0 (stem), 1, 2 (blocks), 3 (final norm, head) -> 4 depths.
TINY = dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32)
NUM_DEPTHS = TINY['num_layers'] + 2


def _vit() -> VisionTransformer:
    return VisionTransformer(TINY, img_size=16, patch_size=8, out_type='featmap')


class Segmentor(nn.Module):
    """A backbone with ``get_layer_depth`` and a head outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = _vit()
        self.head = nn.Conv2d(16, 4, 1)


def _build(model: nn.Module, lr: float = 1.0, weight_decay: float = 0.1, **paramwise):
    optimizer = dict(type='AdamW', lr=lr)
    if weight_decay is not None:
        optimizer['weight_decay'] = weight_decay
    ctor = LayerDecayOptimWrapperConstructor(dict(type='OptimWrapper', optimizer=optimizer),
                                             paramwise_cfg=dict(paramwise))
    return ctor(model).optimizer


def _per_name(optimizer, key: str) -> Dict[str, float]:
    return {n: g[key] for g in optimizer.param_groups for n in g['param_names']}


def _expected_depth(name: str) -> int:
    """Depth by hand: stem 0, ``backbone.blocks.i`` i + 1, everything else the last."""
    if name.startswith(('backbone.cls_token', 'backbone.pos_embed', 'backbone.patch_embed')):
        return 0
    if name.startswith('backbone.blocks.'):
        return int(name.split('.')[2]) + 1
    return NUM_DEPTHS - 1


@contextlib.contextmanager
def debug_log() -> Iterator[List[str]]:
    """The current MMLogger's messages at DEBUG or above inside the block (its level is put
    back afterwards)."""
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        with captured_log(logging.DEBUG) as messages:
            yield messages
    finally:
        logger.setLevel(level)


# ------------------------------------------------------------------ layer-wise lr decay
def test_missing_rate_error_names_the_key_and_an_example():
    """The ``KeyError`` tells where the rate goes, with an example value."""
    with pytest.raises(KeyError, match=r'needs paramwise_cfg\.layer_decay_rate \(e\.g\. '
                                       r'paramwise_cfg=dict\(layer_decay_rate=0\.9\)\)'):
        LayerDecayOptimWrapperConstructor(dict(optimizer=dict(type='AdamW', lr=1.0)),
                                          paramwise_cfg=dict(backbone='backbone'))


def test_user_no_weight_decay_names_replace_the_defaults_as_fragments():
    """``no_weight_decay_names`` is a documented key: its fragments (matched anywhere in the
    name, ``attn.qkv`` inside ``backbone.blocks.0.attn.qkv.weight``) train without weight
    decay and replace the defaults (``pos_embed`` / ``cls_token`` are then decayed); 1-D
    parameters never are."""
    model = Segmentor()
    wd = _per_name(_build(model, layer_decay_rate=0.5,
                          no_weight_decay_names=['attn.qkv', 'head']), 'weight_decay')
    for name, param in model.named_parameters():
        no_decay = param.ndim == 1 or 'attn.qkv' in name or name.startswith('head.')
        assert wd[name] == (0.0 if no_decay else 0.1), name
    assert wd['backbone.blocks.0.attn.qkv.weight'] == wd['head.weight'] == 0.0
    assert wd['backbone.pos_embed'] == wd['backbone.cls_token'] == 0.1


@pytest.mark.parametrize('lr', [0.02, 3.0])
def test_lr_is_the_base_lr_times_the_scale(lr: float):
    """With a base lr other than 1: ``lr_scale = rate ** (num_depths - 1 - depth)`` (mmseg /
    mmpretrain) and ``lr = base_lr * lr_scale`` for every parameter."""
    model = Segmentor()
    optimizer = _build(model, lr=lr, layer_decay_rate=0.6)
    for group in optimizer.param_groups:
        for name in group['param_names']:
            scale = 0.6**(NUM_DEPTHS - 1 - _expected_depth(name))
            assert group['lr_scale'] == pytest.approx(scale), name
            assert group['lr'] == pytest.approx(lr * scale), name


def test_first_depth_names_match_fragments_of_nested_head_names():
    """``first_depth_names=['query_embed']`` places ``decode_head.query_embed.weight`` (the
    name Mask2Former gives it) at depth 0: a fragment, not a prefix of the full name."""
    model = Segmentor()
    model.decode_head = nn.Module()
    model.decode_head.query_embed = nn.Embedding(3, 16)
    model.decode_head.proj = nn.Linear(16, 4)
    lr = _per_name(_build(model, layer_decay_rate=0.5, first_depth_names=['query_embed']), 'lr')
    assert lr['decode_head.query_embed.weight'] == pytest.approx(0.5**(NUM_DEPTHS - 1))
    assert lr['decode_head.proj.weight'] == 1.0


def test_first_depth_names_never_move_a_backbone_parameter():
    """A fragment that also occurs in backbone names (``qkv``: a head's ``qkv`` and every
    block's ``attn.qkv``) moves only the parameters outside the backbone; the blocks keep the
    depth of ``get_layer_depth``."""
    model = Segmentor()
    model.qkv = nn.Linear(16, 48)
    lr = _per_name(_build(model, layer_decay_rate=0.5, first_depth_names=['qkv']), 'lr')
    assert lr['qkv.weight'] == lr['qkv.bias'] == pytest.approx(0.5**(NUM_DEPTHS - 1))
    for block in range(TINY['num_layers']):
        assert lr[f'backbone.blocks.{block}.attn.qkv.weight'] == pytest.approx(
            0.5**(NUM_DEPTHS - 1 - (block + 1))), block


class HeadFirst(nn.Module):
    """The head registered before the backbone (its parameters come first)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Conv2d(16, 4, 1)
        self.backbone = _vit()


def test_groups_are_named_by_depth_and_decay_and_ordered_by_depth():
    """mmseg's group names ``layer_<depth>_decay`` / ``layer_<depth>_no_decay``, one group per
    (depth, decay) pair, in depth order (the stem first, the head last) whatever order the
    modules were registered in."""
    model = HeadFirst()
    optimizer = _build(model, layer_decay_rate=0.5)
    expected = []
    for depth in range(NUM_DEPTHS):
        expected += [f'layer_{depth}_decay', f'layer_{depth}_no_decay']
    assert [g['group_name'] for g in optimizer.param_groups] == expected
    for group in optimizer.param_groups:
        for name in group['param_names']:
            param = model.get_parameter(name)
            no_decay = param.ndim == 1 or name in ('backbone.cls_token', 'backbone.pos_embed')
            kind = 'no_decay' if no_decay else 'decay'
            assert group['group_name'] == f'layer_{_expected_depth(name)}_{kind}', name


def test_debug_summary_lists_groups_with_their_lr_scale():
    """One DEBUG line: the rate, the backbone path and, per group in depth order, its size and
    its lr scale (not its lr: the base lr here is 2)."""
    model = Segmentor()
    with debug_log() as messages:
        _build(model, lr=2.0, layer_decay_rate=0.5)
    lines = [m for m in messages if m.startswith('Layer-wise lr decay')]
    # depth 0: patch_embed.proj.weight | cls_token, pos_embed, patch_embed.proj.bias;
    # blocks: qkv, proj, fc1, fc2 weights | 2 norms x 2, 4 biases; depth 3: norm (2), head.
    assert lines == ['Layer-wise lr decay 0.5 over backbone: '
                     'layer_0_decay: 1 params x0.125, layer_0_no_decay: 3 params x0.125, '
                     'layer_1_decay: 4 params x0.25, layer_1_no_decay: 8 params x0.25, '
                     'layer_2_decay: 4 params x0.5, layer_2_no_decay: 8 params x0.5, '
                     'layer_3_decay: 1 params x1, layer_3_no_decay: 3 params x1'], lines


def test_finding_decayed_groups_keep_the_optimizers_default_weight_decay():
    """FINDING (fails on the code before the round-17 fix): an optimizer config without
    ``weight_decay`` (``dict(type='AdamW', lr=...)``) gave every group weight decay 0, where
    mmengine's and mmpretrain's constructors leave the optimizer's own default (AdamW: 0.01)
    on the weights.  Now the decayed groups keep that default; the no-decay groups stay 0."""
    default = inspect.signature(torch.optim.AdamW).parameters['weight_decay'].default
    assert default > 0
    model = Segmentor()
    wd = _per_name(_build(model, weight_decay=None, layer_decay_rate=0.5), 'weight_decay')
    theirs = DefaultOptimWrapperConstructor(
        dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.0)),
        dict(bias_lr_mult=1.0))(model).optimizer
    mmengine_wd = {id(p): g['weight_decay'] for g in theirs.param_groups for p in g['params']}
    for name, param in model.named_parameters():
        if param.ndim == 1 or name in ('backbone.cls_token', 'backbone.pos_embed'):
            assert wd[name] == 0.0, name
        else:
            assert wd[name] == default == mmengine_wd[id(param)], name


# ------------------------------------------------------------ frozen-aware constructor
def _by_param(wrapper) -> Dict[int, Tuple[float, float]]:
    return {id(p): (g['lr'], g['weight_decay'])
            for g in wrapper.optimizer.param_groups for p in g['params']}


def test_deformable_conv_offsets_follow_mmengines_rules():
    """mmcv's ``ModulatedDeformConv2dPack``: mmengine hands ``is_dcn_module`` to the
    offset convolution, which takes ``dcn_offset_lr_mult`` and keeps its bias decay; the
    same lr and weight decay per parameter as mmengine's constructor (a frozen stem beside
    it)."""
    from mmcv.ops import ModulatedDeformConv2dPack
    model = nn.Module()
    model.stem = nn.Conv2d(3, 4, 1)
    model.stem.requires_grad_(False)
    model.dcn = ModulatedDeformConv2dPack(4, 4, 3, padding=1)
    cfg = dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1, weight_decay=0.01))
    paramwise = dict(dcn_offset_lr_mult=0.5, bias_decay_mult=0.0)
    theirs = _by_param(DefaultOptimWrapperConstructor(dict(cfg), dict(paramwise))(model))
    ours = _by_param(FrozenAwareOptimWrapperConstructor(dict(cfg), dict(paramwise))(model))
    assert ours == theirs
    offset = model.dcn.conv_offset
    assert ours[id(offset.weight)] == (pytest.approx(0.05), 0.01)
    assert ours[id(offset.bias)] == (pytest.approx(0.05), 0.01)
    assert ours[id(model.dcn.bias)] == (pytest.approx(0.1), 0.0)


def test_a_second_call_reports_only_its_own_model():
    """The same constructor used twice (two models): each summary counts that model's frozen
    parameters only."""
    def model_with_frozen(count: int) -> nn.Module:
        model = nn.Module()
        model.frozen = nn.ModuleList([nn.Linear(2, 2) for _ in range(count)])
        model.frozen.requires_grad_(False)
        model.trained = nn.Linear(2, 2)
        return model

    ctor = FrozenAwareOptimWrapperConstructor(
        dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1, weight_decay=0.01)),
        dict(bias_decay_mult=0.0))
    for count in (1, 2):
        with captured_log(logging.INFO) as messages:
            ctor(model_with_frozen(count))
        summary = [m for m in messages if m.startswith('Not optimised')]
        assert summary == [f'Not optimised (requires_grad=False): {2 * count} parameter '
                           f'tensors of frozen ({2 * count})'], summary


def test_frozen_parameters_of_partly_trained_list_entries_are_collapsed():
    """Each list entry trains its bias but not its weight (mmengine warns per weight):
    ``trunk.0.weight`` and ``trunk.1.weight`` are reported as one ``trunk.*.weight`` entry."""
    model = nn.Module()
    model.trunk = nn.ModuleList([nn.Linear(2, 2) for _ in range(2)])
    for entry in model.trunk:
        entry.weight.requires_grad_(False)
    with captured_log(logging.INFO) as messages:
        FrozenAwareOptimWrapperConstructor(
            dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1, weight_decay=0.01)),
            dict(bias_decay_mult=0.0))(model)
    summary = [m for m in messages if m.startswith('Not optimised')]
    assert summary == ['Not optimised (requires_grad=False): 2 parameter tensors of '
                       'trunk.*.weight (2)'], summary


def test_two_digit_list_indices_are_collapsed():
    """Entries ``trunk.0`` .. ``trunk.10`` frozen whole (``trunk.11`` trained): one
    ``trunk.*`` entry, ``trunk.10`` included."""
    model = nn.Module()
    model.trunk = nn.ModuleList([nn.Linear(1, 1) for _ in range(12)])
    for entry in model.trunk[:11]:
        entry.requires_grad_(False)
    with captured_log(logging.INFO) as messages:
        FrozenAwareOptimWrapperConstructor(
            dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1, weight_decay=0.01)),
            dict(bias_decay_mult=0.0))(model)
    summary = [m for m in messages if m.startswith('Not optimised')]
    assert summary == ['Not optimised (requires_grad=False): 22 parameter tensors of '
                       'trunk.* (22)'], summary
