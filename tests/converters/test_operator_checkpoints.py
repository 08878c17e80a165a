"""Operator parameters (MHLA block mixing, Hedgehog feature maps, TTT inner weights...) at load.

* From a checkpoint of the same operator, a missing one is an error listing the keys (it used
  to be re-initialised without a word).
* From a softmax checkpoint they are expected to be absent: they keep the operator's init and
  the load report lists them, in a log line visible at default verbosity.
* A DINOv2 checkpoint without a mask token (timm's layouts) loads; the token is initialised
  and reported.

Which keys are "operator parameters" is decided here independently of the loader: the keys of
a student that a softmax model of the same architecture does not have.
"""
import logging
import os
import subprocess
import sys
from typing import Dict, List

import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.converters import CheckpointMismatchError, load_pretrained

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPERATORS = ('mhla', 'hedgehog', 'ttt')
ARCH = dict(embed_dims=96, num_layers=2, num_heads=3, mlp_hidden_dims=192)
TOKENS = dict(with_cls_token=False, pos_embed_type='sincos', out_type='avg_featmap')


def build(attn_cfg, pretrained: str = None) -> VisionTransformer:
    # The operators' paper setting (no class token, sin-cos positions) for every model, the
    # softmax one included, so that checkpoints differ in their attention parameters only.
    return VisionTransformer(ARCH, family='deit', img_size=64, attn_cfg=attn_cfg,
                             pretrained=pretrained, **TOKENS)


def randomise_(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))


def operator_keys(attn_cfg) -> List[str]:
    """Student keys without a softmax counterpart (same architecture, softmax attention)."""
    softmax = set(build('softmax').state_dict())
    keys = [k for k in build(attn_cfg).state_dict() if k not in softmax]
    assert keys, f'{attn_cfg} has no operator parameters'
    return keys


def save(state: Dict[str, torch.Tensor], path) -> str:
    torch.save(state, str(path))
    return str(path)


@pytest.mark.parametrize('op', OPERATORS)
def test_missing_operator_parameters_of_the_same_operator_are_an_error(op, tmp_path):
    trained = build(op)
    randomise_(trained, seed=1)
    extras = operator_keys(op)
    # Each block loses the first of its operator parameters (block_mixing, feature_k, ...).
    first = sorted(k.split('.attn.', 1)[1] for k in extras)[0]
    dropped = [k for k in extras if k.endswith('.attn.' + first)]
    assert len(dropped) == ARCH['num_layers']
    state = {k: v for k, v in trained.state_dict().items() if k not in dropped}
    student = build(op, pretrained=save(state, tmp_path / f'{op}_student.pth'))
    before = {k: v.clone() for k, v in student.state_dict().items()}
    with pytest.raises(CheckpointMismatchError) as info:
        student.init_weights()
    msg = str(info.value)
    assert f'missing keys ({len(dropped)}): blocks.{{0-1}}.attn.{first}' in msg
    assert 'attention-operator parameters' in msg and 'attn_cfg' in msg
    assert all(torch.equal(v, student.state_dict()[k]) for k, v in before.items())
    # Complete, the same checkpoint loads every tensor, the operator's included.
    full = build(op, pretrained=save(trained.state_dict(), tmp_path / 'full.pth'))
    full.init_weights()
    assert full.load_report.missing == [] and full.load_report.initialised == {}
    for key in extras:
        assert torch.equal(full.state_dict()[key], trained.state_dict()[key]), key


@pytest.mark.parametrize('op', OPERATORS)
def test_softmax_checkpoint_initialises_and_reports_operator_parameters(op, tmp_path, caplog):
    teacher = build('softmax')
    randomise_(teacher, seed=2)
    student = build(op, pretrained=save(teacher.state_dict(), tmp_path / 'teacher.pth'))
    extras = operator_keys(op)
    init = {k: student.state_dict()[k].clone() for k in extras}
    with caplog.at_level(logging.WARNING):
        student.init_weights()
    report = student.load_report
    assert sorted(report.initialised) == sorted(extras) == sorted(report.missing)
    assert all('softmax counterpart' in reason for reason in report.initialised.values())
    for key in extras:
        assert torch.equal(student.state_dict()[key], init[key]), key  # operator init kept
    assert torch.equal(student.blocks[1].attn.qkv.weight, teacher.blocks[1].attn.qkv.weight)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    first = sorted(k.split('.attn.', 1)[1] for k in extras)[0]
    assert f'blocks.{{0-1}}.attn.{first}' in warnings[0]
    assert 'keep their init' in warnings[0] and 'teacher.pth' in warnings[0]
    assert 'missing (left at init)' in report.format()


def test_hybrid_checkpoint_blocks_without_operator_parameters_come_from_softmax(tmp_path):
    """Per block: a checkpoint block with no operator parameters was softmax (progressive
    linearization), one with some of them must have all."""
    trained = build(['softmax', 'mhla'])
    randomise_(trained, seed=3)
    path = save(trained.state_dict(), tmp_path / 'hybrid.pth')
    student = build('mhla', pretrained=path)
    student.init_weights()
    assert sorted(student.load_report.initialised) == [
        'blocks.0.attn.block_mixing', 'blocks.0.attn.local_conv.bias',
        'blocks.0.attn.local_conv.weight']
    assert torch.equal(student.blocks[1].attn.block_mixing, trained.blocks[1].attn.block_mixing)
    state = trained.state_dict()
    del state['blocks.1.attn.local_conv.weight']
    with pytest.raises(CheckpointMismatchError, match=r'missing keys \(1\): '
                       r'blocks.1.attn.local_conv.weight'):
        load_pretrained(build('mhla'), state)


def test_initialised_operator_parameters_are_logged_at_default_verbosity(tmp_path):
    """A fresh interpreter with no logging configured shows the line (stderr)."""
    script = f'''
import torch
from mmlinvit.backbones import VisionTransformer
arch, tokens = {ARCH!r}, {TOKENS!r}
teacher = VisionTransformer(arch, family='deit', img_size=64, **tokens)
torch.save(teacher.state_dict(), {str(tmp_path / 'softmax.pth')!r})
student = VisionTransformer(arch, family='deit', img_size=64, attn_cfg='mhla', **tokens,
                            pretrained={str(tmp_path / 'softmax.pth')!r})
student.init_weights()
'''
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
    proc = subprocess.run([sys.executable, '-c', script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 'blocks.{0-1}.attn.block_mixing' in proc.stderr, proc.stderr
    assert 'keep their init' in proc.stderr


def test_dinov2_checkpoint_without_mask_token_loads_and_says_so(tmp_path, caplog):
    """timm's vit_*_dinov2 layouts have no mask token: family defaults still load them."""
    source = VisionTransformer(ARCH, family='dinov2', img_size=56, num_reg_tokens=4,
                               with_mask_token=False, out_type='raw')
    randomise_(source, seed=4)
    path = save(source.state_dict(), tmp_path / 'vit_small_patch14_reg4_dinov2.pth')
    model = VisionTransformer(ARCH, family='dinov2', img_size=56, num_reg_tokens=4,
                              pretrained=path, out_type='raw')
    assert model.mask_token is not None
    with caplog.at_level(logging.WARNING):
        model.init_weights()
    assert list(model.load_report.initialised) == ['mask_token']
    assert torch.equal(model.mask_token, torch.zeros(1, ARCH['embed_dims']))
    assert any('mask_token' in r.getMessage() and r.levelno >= logging.WARNING
               for r in caplog.records)
    x = torch.randn(1, 3, 56, 70)
    with torch.no_grad():
        assert torch.equal(model.eval()(x)[0], source.eval()(x)[0])
    # The rest of the key check is unchanged: another missing token is still an error.
    state = dict(source.state_dict())
    del state['reg_token']
    with pytest.raises(CheckpointMismatchError, match=r'missing keys \(1\): reg_token'):
        load_pretrained(model, state)


def test_dinov2_mask_token_is_dropped_by_a_model_without_one(tmp_path):
    """Fine-tuning configs build DINOv2 without the mask token (no gradient would reach it):
    the official checkpoint's token is dropped, listed as such, and nothing else changes."""
    source = VisionTransformer(ARCH, family='dinov2', img_size=56, num_reg_tokens=4,
                               out_type='raw')
    randomise_(source, seed=5)
    assert 'mask_token' in source.state_dict()
    path = save(source.state_dict(), tmp_path / 'dinov2_vits14_reg4.pth')
    model = VisionTransformer(ARCH, family='dinov2', img_size=56, num_reg_tokens=4,
                              with_mask_token=False, pretrained=path, out_type='raw')
    model.init_weights()
    assert 'mask_token' not in model.state_dict()
    assert list(model.load_report.dropped) == ['mask_token']
    assert model.load_report.unexpected == [] and model.load_report.missing == []
    x = torch.randn(1, 3, 56, 70)
    with torch.no_grad():
        assert torch.equal(model.eval()(x)[0], source.eval()(x)[0])
