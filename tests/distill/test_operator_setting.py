"""Switching the operator keeps the paper's setting, or says why not.

Seed 000 runs MHLA and TTT without a class token, with sin-cos position embeddings and
average pooling, and distils patch tokens only.  The backbone takes that setting where the
arguments are unset (with a warning naming it), refuses given values outside it with the
cfg-options that fix them, and keeps the family defaults for every other operator.
"""
import copy
import os.path as osp
import warnings

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope

from mmlinvit.backbones import LinearVisionTransformer, VisionTransformer
from mmlinvit.models.distill import DistillationConfigError
from mmlinvit.registry import MODELS

from distill_testing import CONFIGS, shrink_config

TINY = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
DEIT_CIFAR = 'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-t-elu_8xb64-300e_cifar10-224x224.py'


@pytest.mark.parametrize('operator', ['mhla', 'ttt'])
def test_unset_arguments_take_the_paper_setting_with_a_warning(operator):
    with pytest.warns(UserWarning, match=r"with_cls_token=False, pos_embed_type='sincos', "
                                         r"out_type='avg_featmap'"):
        model = LinearVisionTransformer(TINY, attn_cfg=operator, img_size=32, patch_size=8)
    assert not model.with_cls_token and model.cls_token is None and model.num_prefix_tokens == 0
    assert model.pos_embed_type == 'sincos' and model.pos_embed is None
    assert model.out_type == 'avg_featmap'
    out = model(torch.randn(2, 3, 32, 32))[0]
    assert out.shape == (2, 32)
    # the given paper setting builds silently
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        VisionTransformer(TINY, attn_cfg=operator, img_size=32, patch_size=8,
                          with_cls_token=False, pos_embed_type='sincos', out_type='featmap')


def test_a_hybrid_stack_with_mhla_takes_its_setting():
    with pytest.warns(UserWarning, match='mhla'):
        model = VisionTransformer(TINY, attn_cfg=['softmax', 'mhla'], img_size=32, patch_size=8)
    assert not model.with_cls_token and model.pos_embed_type == 'sincos'


@pytest.mark.parametrize('given, fix', [
    (dict(with_cls_token=True), '--cfg-options model.student.backbone.with_cls_token=False '),
    (dict(with_cls_token=True, out_type='cls_token'),
     'model.student.backbone.with_cls_token=False model.student.backbone.out_type=avg_featmap'),
    (dict(pos_embed_type='learned'), 'model.student.backbone.pos_embed_type=sincos'),
    (dict(with_cls_token=True, out_type='cls_token', pos_embed_type='learned'),
     'model.student.backbone.with_cls_token=False '
     'model.student.backbone.pos_embed_type=sincos '
     'model.student.backbone.out_type=avg_featmap'),
])
def test_given_values_outside_the_setting_fail_with_the_fix(given, fix):
    with pytest.raises(ValueError, match='mhla') as err:
        VisionTransformer(TINY, attn_cfg='mhla', img_size=32, patch_size=8, **given)
    assert fix in str(err.value) and 'check_operator_setting=False' in str(err.value)
    # a deliberate deviation builds, with a warning
    with pytest.warns(UserWarning, match='check_operator_setting=False'):
        model = VisionTransformer(TINY, attn_cfg='mhla', img_size=32, patch_size=8,
                                  check_operator_setting=False, **given)
    for key, value in given.items():
        assert getattr(model, key) == value


@pytest.mark.parametrize('operator', ['softmax', 'elu', 'relu', 'inline'])
def test_other_operators_keep_the_family_defaults(operator):
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        model = VisionTransformer(TINY, attn_cfg=operator, img_size=32, patch_size=8)
    assert model.with_cls_token and model.pos_embed_type == 'learned'
    assert model.out_type == 'cls_token'
    no_cls = VisionTransformer(TINY, attn_cfg=operator, img_size=32, patch_size=8,
                               with_cls_token=False)
    assert no_cls.out_type == 'avg_featmap'


def _recipe_model(options):
    cfg = Config.fromfile(osp.join(CONFIGS, DEIT_CIFAR))
    cfg.merge_from_dict(options)
    shrink_config(cfg, data_root='unused', work_dir='unused')
    model = copy.deepcopy(cfg.model.to_dict())
    model['data_preprocessor'] = cfg.data_preprocessor.to_dict()  # as the Runner does
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return MODELS.build(model)


def test_cfg_options_operator_switch_on_the_deit_recipe():
    # attn_cfg=mhla alone: the student takes the paper's backbone setting, and the
    # build-time dry run asks for patch-token distillation (student 16 tokens, teacher 17)
    with pytest.warns(UserWarning, match='sincos'):
        with pytest.raises(DistillationConfigError, match='patch_tokens_only=True'):
            _recipe_model({'model.student.backbone.attn_cfg': 'mhla'})
    with pytest.warns(UserWarning, match='sincos'):
        model = _recipe_model({'model.student.backbone.attn_cfg': 'mhla',
                               'model.distill_losses.attn_out.loss.patch_tokens_only': True})
    backbone = model.student_backbone()
    assert (backbone.with_cls_token, backbone.pos_embed_type, backbone.out_type) == (
        False, 'sincos', 'avg_featmap')
    # a config that insists on the DeiT setting for MHLA is refused with the fix
    with pytest.raises(ValueError, match='model.student.backbone.with_cls_token=False'):
        _recipe_model({'model.student.backbone.attn_cfg': 'mhla',
                       'model.student.backbone.with_cls_token': True})
