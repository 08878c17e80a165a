"""Mutation round 20: the ViT backbone (``vit.py``) and the token-backbone plumbing
(``base.py``), second pass.

Each test here fails on a one-line change of ``mmlinvit/backbones/{vit,base}.py`` that the
rest of the suite let through (the mutation audit of round 20).  References:

* mmpretrain's ``VisionTransformer`` (installed, independent code) built with
  ``final_norm=False`` and ``qkv_bias=False``, with the same random weights loaded through the
  ``'mmpretrain'`` layout: the outputs of every block;
* DINOv2's masking rule (``prepare_tokens_with_masks``: ``torch.where(masks.unsqueeze(-1),
  mask_token.to(x.dtype).unsqueeze(0), x)``), written out here: a mask token given by the
  caller replaces the masked patches, in the tokens' dtype;
* hand-stated rules of the docstrings that no library computes: the inference cache of the
  resampled grid serves a frozen backbone run with autograd on (a linear probe), a patch mask
  of another batch size is refused instead of broadcast, ``forward_tokens`` checkpoints its
  blocks with ``with_cp``, ``LinearVisionTransformer`` defaults to the ``'elu'`` operator, a
  custom arch names every missing key, a position grid of another width is reported with
  the checkpoint's shape;
* a bug this audit found (marked "Bug (round 20)"): an unrecorded square position grid loaded
  into a non-square model grid of the same row count was not resampled (mmpretrain's
  ``resize_pos_embed`` is the reference); fixed with ``TokenBackbone.on_model_grid``.
"""
from typing import List

import pytest
import torch
import torch.nn as nn

import mmlinvit.backbones.base as base
from mmlinvit.backbones import LinearVisionTransformer, VisionTransformer
from mmlinvit.layers.attention import ATTENTION_OPERATORS

from test_mutation_round10_vit import _randomise_
from test_mutation_round15_vit_base import DEPTH, MMP_ARCH, OUR_ARCH, WIDTH, _vit

mmpretrain_backbones = pytest.importorskip('mmpretrain.models.backbones')


# ------------------------------------------------------------------ fidelity to mmpretrain
def test_no_final_norm_and_no_qkv_bias_match_mmpretrain() -> None:
    """``final_norm=False`` (MAE-style fine-tuning backbones) returns the last block's tokens
    as they are, and ``qkv_bias=False`` builds the QKV projections without biases, as
    mmpretrain's ``VisionTransformer(final_norm=False, qkv_bias=False)``: the same weights give
    the same outputs for both blocks, at the training grid and a non-square one."""
    from mmlinvit.converters import load_pretrained
    torch.manual_seed(0)
    ref = mmpretrain_backbones.VisionTransformer(
        arch=dict(MMP_ARCH), img_size=32, patch_size=16, final_norm=False, qkv_bias=False,
        out_type='raw', out_indices=[0, 1])
    _randomise_(ref)
    ref.eval()
    ours = _vit(final_norm=False, qkv_bias=False, out_type='raw', out_indices=[0, 1]).eval()
    assert isinstance(ours.norm, nn.Identity)
    assert all(blk.attn.qkv.bias is None for blk in ours.blocks)
    load_pretrained(ours, ref.state_dict(), layout='mmpretrain')
    for hw in ((32, 32), (48, 80)):
        x = torch.randn(2, 3, *hw)
        with torch.no_grad():
            want, got = ref(x), ours(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-5)


# ------------------------------------------------------------------ position-grid cache
def test_a_frozen_backbone_reuses_the_grid_with_autograd_on(monkeypatch) -> None:
    """``learned_patch_pos_embed``: the grid is resampled per call only when autograd tracks
    the parameter (``torch.is_grad_enabled() and pos.requires_grad``).  A frozen backbone
    (a linear probe) runs with autograd on for its head, but its ``pos_embed`` needs no
    gradient: the cached grid is reused, and it equals a fresh resampling."""
    calls: List[tuple] = []
    real = base.resample_pos_grid

    def counting(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(base, 'resample_pos_grid', counting)
    torch.manual_seed(0)
    model = _vit(out_type='featmap').requires_grad_(False).eval()
    x = torch.randn(1, 3, 48, 80)
    assert torch.is_grad_enabled()
    first = model(x)[0]
    second = model(x)[0]
    assert len(calls) == 1
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    fresh = real(model.patch_rows(model.pos_embed), model.pos_grid, (3, 5), model.pos_interp)
    torch.testing.assert_close(model.learned_patch_pos_embed((3, 5)), fresh, rtol=0, atol=0)


# ------------------------------------------------------------------ masking
def test_a_given_mask_token_replaces_masked_patches_in_the_tokens_dtype() -> None:
    """DINOv2's rule with a caller's token (distillation passes the teacher's): masked patch
    tokens become ``mask_token.to(tokens.dtype)``, the others are kept; a float32 token on
    bfloat16 tokens gives bfloat16 tokens (no promotion of the whole sequence)."""
    torch.manual_seed(0)
    model = VisionTransformer(dict(OUR_ARCH), family='dinov2', img_size=28)
    assert model.mask_token is not None  # zeros: the given token must win
    tokens = torch.randn(2, 4, WIDTH).to(torch.bfloat16)
    mask = torch.tensor([[True, False, False, True], [False, True, False, False]])
    token = torch.randn(1, WIDTH)
    out = model.mask_patches(tokens, mask, token)
    assert out.dtype == torch.bfloat16
    want = tokens.clone()
    want[mask] = token.to(torch.bfloat16).expand(int(mask.sum()), -1)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_a_patch_mask_of_another_batch_is_refused() -> None:
    """``patch_mask`` must be (batch, h * w): a (1, h * w) mask for a batch of 2 would
    broadcast silently (every image masked as the first), so it is refused."""
    model = VisionTransformer(dict(OUR_ARCH), family='dinov2', img_size=28)
    tokens = torch.randn(2, 4, WIDTH)
    with pytest.raises(ValueError, match=r'patch_mask must be \(batch, h \* w\) = \(2, 4\)'):
        model.mask_patches(tokens, torch.ones(1, 4, dtype=torch.bool))


# ------------------------------------------------------------------ activation checkpointing
def test_forward_tokens_checkpoints_the_blocks() -> None:
    """``with_cp`` holds for ``forward_tokens`` (the distillation and DINOv2-feature path) as
    for ``forward``: in training with autograd every block is run once more in backward."""
    torch.manual_seed(0)
    model = _vit(with_cp=True).train()
    phase = ['forward']
    calls: List[str] = []
    for blk in model.blocks:
        blk.register_forward_pre_hook(lambda *_: calls.append(phase[0]))
    tokens, hw = model.forward_tokens(torch.randn(2, 3, 32, 32))
    assert hw == (2, 2)
    phase[0] = 'backward'
    (tokens * torch.linspace(-1, 1, tokens.numel()).reshape(tokens.shape)).sum().backward()
    assert calls == ['forward'] * DEPTH + ['backward'] * DEPTH


# ------------------------------------------------------------------ loading
def test_a_position_grid_of_another_width_is_reported_with_its_shape() -> None:
    """The position-grid hook leaves a ``pos_embed`` of another width to ``load_state_dict``
    (its docstring), which reports the checkpoint's own shape: a 3 x 3 grid of width 64 for
    a width-32 model of grid 2 x 2 is named as (1, 10, 64), not resampled first to a
    (1, 5, 64) tensor that the message would then show."""
    state = dict(_vit().state_dict())
    state['pos_embed'] = torch.zeros(1, 1 + 9, 2 * WIDTH)
    state.pop('pos_embed_grid')
    with pytest.raises(RuntimeError,
                       match=r'size mismatch for pos_embed: copying a param with shape '
                             r'torch\.Size\(\[1, 10, 64\]\)'):
        _vit().load_state_dict(state, strict=False)


# ------------------------------------------------------------------ construction rules
def test_the_linear_student_defaults_to_the_elu_operator() -> None:
    """``LinearVisionTransformer``'s documented default ``attn_cfg`` is ``'elu'`` (ViT-AdaLA's
    student operator) in every block."""
    model = LinearVisionTransformer(dict(OUR_ARCH), img_size=32, patch_size=16)
    assert model.attn_cfgs == ['elu'] * DEPTH
    elu = ATTENTION_OPERATORS.get('elu')
    assert all(type(blk.attn) is elu for blk in model.blocks)


def test_a_custom_arch_names_every_missing_key() -> None:
    """A custom arch dict without ``mlp_hidden_dims`` is refused with the missing key named
    (not a bare ``KeyError: 'mlp_hidden_dims'`` from deep in ``__init__``)."""
    arch = {k: v for k, v in OUR_ARCH.items() if k != 'mlp_hidden_dims'}
    with pytest.raises(KeyError, match=r"Custom arch dict is missing \['mlp_hidden_dims'\]"):
        VisionTransformer(arch, img_size=32, patch_size=16)


# ------------------------------------------------------------------ bug (round 20)
@pytest.mark.parametrize('loader', ['load_state_dict', 'load_pretrained', 'transfer_weights'])
def test_an_unrecorded_square_grid_is_resampled_to_a_non_square_model_grid(loader: str) -> None:
    """Bug (round 20; fails on the unmodified code): a checkpoint without ``pos_embed_grid``
    (official releases, mmlinvit files from before the record) has a square grid (the
    documented rule of ``checkpoint_pos_grid`` and ``OPTIONAL_CHECKPOINT_KEYS``).  Its 4 x 4
    grid loaded into a model of grid 2 x 8 (the same 16 rows: any 1:4 model grid has a
    square count, e.g. 14 x 56 = 28 x 28) was copied as it is, the square rows read as a
    2 x 8 grid, with no word; every other grid size is resampled.  The reference is
    mmpretrain's ``resize_pos_embed`` (bicubic, the model's ``pos_interp='bicubic'``) from
    4 x 4 to 2 x 8; the class row is kept."""
    from mmpretrain.models.utils import resize_pos_embed

    from mmlinvit.converters import load_pretrained
    from mmlinvit.transfer import transfer_weights
    torch.manual_seed(0)
    source = VisionTransformer(dict(OUR_ARCH), family='deit', img_size=64, patch_size=16,
                               pos_interp='bicubic')  # 4 x 4 grid
    _randomise_(source)
    state = {k: v for k, v in source.state_dict().items() if k != 'pos_embed_grid'}
    model = VisionTransformer(dict(OUR_ARCH), family='deit', img_size=(32, 128), patch_size=16,
                              pos_interp='bicubic')  # 2 x 8 grid, the same 16 rows
    assert model.pos_embed.shape == source.pos_embed.shape
    want = resize_pos_embed(source.pos_embed.detach(), (4, 4), (2, 8), mode='bicubic',
                            num_extra_tokens=1)
    if loader == 'load_state_dict':
        model.load_state_dict(state)
    elif loader == 'load_pretrained':
        load_pretrained(model, dict(state))
    else:
        transfer_weights(model, dict(state), 'full_copy')
    torch.testing.assert_close(model.pos_embed.detach(), want, rtol=1e-5, atol=1e-5)
