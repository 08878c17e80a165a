"""Activation checkpointing (``with_cp``) of ViT and Adventurer blocks.

Reference: the same model run without checkpointing, for every registered operator and
Adventurer.  Gradients must be bit-equal (dropout and
drop-path masks included, so the RNG state must be replayed in the recomputation), and the
blocks must really be recomputed in the backward pass when ``with_cp`` is on (and only then).
"""
from typing import Callable, Dict, List

import pytest
import torch
import torch.nn as nn

from mmlinvit.backbones import Adventurer, LinearVisionTransformer, VisionTransformer
from mmlinvit.backbones.checkpointing import checkpoint_active
from mmlinvit.layers.attention import ATTENTION_OPERATORS

TINY_VIT = dict(embed_dims=32, num_layers=3, num_heads=2, mlp_hidden_dims=64)
TINY_ADV = dict(embed_dims=32, num_layers=3)
TINY_MIXER = dict(d_state=8, headdim=16, chunk_size=16)


def _vit(attn_cfg: dict) -> Callable[..., nn.Module]:
    cls = LinearVisionTransformer if attn_cfg['type'] != 'softmax' else VisionTransformer
    extra = {} if cls is VisionTransformer else dict(check_operator_setting=False)

    def build(with_cp: bool) -> nn.Module:
        torch.manual_seed(0)
        return cls(TINY_VIT, attn_cfg=dict(attn_cfg), img_size=32, patch_size=8, drop_rate=0.1,
                   drop_path_rate=0.2, out_type='featmap', out_indices=[1, 2], with_cp=with_cp,
                   **extra)

    return build


def _adventurer(with_cp: bool) -> nn.Module:
    torch.manual_seed(0)
    return Adventurer(TINY_ADV, img_size=32, patch_size=8, mixer_cfg=TINY_MIXER, drop_rate=0.1,
                      drop_path_rate=0.2, out_type='featmap', out_indices=[1, 2],
                      with_cp=with_cp)


def _operator_cfg(name: str) -> dict:
    """The operator with every dropout it takes switched on (RNG replayed in recomputation)."""
    cfg = dict(type=name, proj_drop=0.1)
    if name != 'ttt':  # TTT has no attention-weight dropout
        cfg['attn_drop'] = 0.1
    return cfg


#: Every registered operator (softmax included), InLine's local branch, and Adventurer.
BUILDERS: Dict[str, Callable[[bool], nn.Module]] = {
    **{f'vit-{name}': _vit(_operator_cfg(name)) for name in ATTENTION_OPERATORS.names},
    'vit-inline-local': _vit(dict(_operator_cfg('inline'), local_residual=True)),
    'adventurer': _adventurer,
}


def _blocks(model: nn.Module) -> nn.ModuleList:
    return model.layers if isinstance(model, Adventurer) else model.blocks


def _step(model: nn.Module, images: torch.Tensor, calls: List[str]):
    """One training forward/backward with a fixed seed; block calls logged per phase.

    Calls are seen by forward PRE-hooks: the recomputation of a non-reentrant checkpoint stops
    as soon as the saved tensors are rebuilt, before the block's forward hooks would run.
    """
    phase = ['forward']
    handles = [blk.register_forward_pre_hook(lambda *_: calls.append(phase[0]))
               for blk in _blocks(model)]
    torch.manual_seed(123)  # same dropout / drop-path masks in both runs
    outs = model(images)
    loss = sum((o * torch.linspace(-1, 1, o.numel()).reshape(o.shape)).sum() for o in outs)
    phase[0] = 'backward'
    loss.backward()
    for h in handles:
        h.remove()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


@pytest.mark.parametrize('name', sorted(BUILDERS))
def test_with_cp_gives_equal_gradients_and_recomputes(name):
    images = torch.randn(2, 3, 32, 32)
    plain, ckpt = BUILDERS[name](False).train(), BUILDERS[name](True).train()
    calls_plain: List[str] = []
    calls_ckpt: List[str] = []
    loss_plain, grads_plain = _step(plain, images, calls_plain)
    loss_ckpt, grads_ckpt = _step(ckpt, images, calls_ckpt)
    torch.testing.assert_close(loss_ckpt, loss_plain, atol=0.0, rtol=0.0)
    assert grads_ckpt.keys() == grads_plain.keys() and len(grads_plain) > 10
    for key, grad in grads_plain.items():  # the same operations on the same values: exact
        torch.testing.assert_close(grads_ckpt[key], grad, atol=0.0, rtol=0.0, msg=key)
    depth = len(_blocks(plain))
    assert calls_plain == ['forward'] * depth
    # Every block is recomputed once during backward.
    assert calls_ckpt == ['forward'] * depth + ['backward'] * depth


def test_blocks_are_checkpointed_without_reentrance(monkeypatch):
    """Non-reentrant checkpointing: the reentrant form gives a block's parameters no
    gradient when its input needs none (a frozen stem, a teacher-forced input) and drops
    gradients that reach the block other than through its output (distillation recorders)."""
    import mmlinvit.backbones.checkpointing as checkpointing
    seen = []
    real = checkpointing.checkpoint

    def recording(*args, **kwargs):
        seen.append(kwargs.get('use_reentrant'))
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpointing, 'checkpoint', recording)
    for name in sorted(BUILDERS):
        model = BUILDERS[name](True).train()
        out = model(torch.randn(1, 3, 32, 32))
        sum(o.sum() for o in out).backward()
    assert seen and set(seen) == {False}


@pytest.mark.parametrize('name', sorted(BUILDERS))
def test_with_cp_is_inactive_in_eval_no_grad_and_for_frozen_blocks(name):
    model = BUILDERS[name](True)
    images = torch.randn(1, 3, 32, 32)
    calls: List[str] = []
    handles = [blk.register_forward_pre_hook(lambda *_: calls.append('x'))
               for blk in _blocks(model)]
    model.eval()
    (model(images)[-1].sum()).backward()  # eval mode: no recomputation
    with torch.no_grad():
        model.train()(images)  # no autograd: nothing to recompute
    depth = len(_blocks(model))
    assert len(calls) == 2 * depth
    for h in handles:
        h.remove()
    # Frozen blocks fed an input that needs no grad are not checkpointed either.
    block = _blocks(model.train())[0]
    tokens = torch.randn(1, 17, 32)
    assert checkpoint_active(block, tokens, True)
    assert not checkpoint_active(block, tokens, False)
    block.requires_grad_(False)
    assert not checkpoint_active(block, tokens, True)
    assert checkpoint_active(block, tokens.requires_grad_(), True)
