"""Mutation round 19: Impulse init and the transformer block pieces (Mimetic / patch grid: none).

Written for single-change mutants of ``mmlinvit/transfer/{mimetic,impulse}.py``,
``mmlinvit/layers/transformer.py`` and ``mmlinvit/ops/patch_grid.py`` that the earlier tests
(rounds 8 to 18 included) let pass (every Mimetic and patch-grid mutant of this round was
already caught, so none of the tests below is about them).  Guarded, each against an
independent reference:

* Impulse: the window check for negative sides, the reported grid (rows first) and the
  minimum peak fraction (recomputed in float64 from the bank), ``steps >= 1``, the N(0, 1/C)
  start of the bank fit, the cache key of cross-entropy banks (no ``fit_loss`` entry), LN(P)
  with the eps of ``norm1``;
* transformer pieces: ``DropPath`` draws and scales exactly as timm's ``drop_path`` (same
  generator state), p = 1 drops everything without NaN, eval mode is the identity;
  ``LayerScale`` defaults to timm / DINOv2's 1e-5; the block's LayerNorm eps is DINOv2's 1e-6;
  ``build_activation('silu')`` is SiLU.
"""
import hashlib
import json
import math
import os
from typing import Tuple

import pytest
import timm.layers
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.layers import TransformerBlock
from mmlinvit.layers.transformer import DropPath, LayerScale, build_activation
from mmlinvit.transfer import transfer_weights
from mmlinvit.transfer.impulse import (ImpulseInit, fit_impulse_bank, impulse_shifts,
                                       load_or_fit_impulse_bank)

from test_mutation_round10_transfer import _targets

TINY = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors: one intra-op thread is fastest on the shared cores."""


def _impulse_student(**kwargs) -> VisionTransformer:
    """A student Impulse accepts: no prefix tokens, sin-cos positions, average pooling."""
    cfg = dict(attn_cfg='softmax', with_cls_token=False, pos_embed_type='sincos',
               out_type='avg_featmap', img_size=(16, 24), patch_size=8)
    cfg.update(kwargs)
    return VisionTransformer(dict(TINY), **cfg)


# ---------------------------------------------------------------------- impulse
@pytest.mark.parametrize('window', [-1, -3, 0, 2])
def test_impulse_window_must_be_positive_and_odd(window: int):
    """-1 is odd in Python (``-1 % 2 == 1``) yet no window: it would give no shift at all."""
    with pytest.raises(ValueError, match='positive odd'):
        impulse_shifts(window)


def test_impulse_fit_starts_from_lecun_normal_weights():
    """With lr 0 the bank keeps its initial weights: N(0, 1/C) (LeCun normal for a C -> d
    map, so that t W_q has unit-scale entries for unit-scale LN(P)); 1/C would start every map
    almost uniform."""
    c = 64
    tokens = torch.randn(6, c, generator=torch.Generator().manual_seed(0))
    bank = fit_impulse_bank(tokens, (2, 3), 16, impulse_shifts(3), steps=1, lr=0.0, seed=4)
    for key in ('wq', 'wk'):
        weights = bank[key].double()
        assert weights.shape == (9, c, 16)
        assert abs(float(weights.mean())) < 0.05 / math.sqrt(c)
        assert float(weights.std()) == pytest.approx(1.0 / math.sqrt(c), rel=0.05)


def test_cross_entropy_bank_keys_keep_their_pre_fit_loss_form(tmp_path):
    """The cache key of a cross-entropy bank is SHA-256 of the sorted JSON of (version 1,
    shape, grid, head_dims, window, steps, lr, seed) then the float32 bytes of LN(P), with no
    ``fit_loss`` entry, so banks cached before ``fit_loss`` existed are still found."""
    tokens = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    meta = dict(version=1, shape=[6, 8], grid=[2, 3], head_dims=4, window=3, steps=2, lr=0.01,
                seed=5)
    digest = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    digest.update(tokens.numpy().tobytes())
    bank = load_or_fit_impulse_bank(tokens, (2, 3), 4, 3, 2, 0.01, 5, str(tmp_path))
    assert os.path.basename(bank['cache_file']) == f'impulse_{digest.hexdigest()[:24]}.pt'


def test_impulse_position_tokens_use_the_eps_of_norm1():
    """LN(P) is the blocks' ``norm1`` at initialisation, eps included (float64 reference)."""
    student = _impulse_student()
    for block in student.blocks:
        block.norm1.eps = 0.5  # large, so that the default 1e-5 would be far off
    got = ImpulseInit(use_cache=False).position_tokens(student).double()
    pos = student.patch_pos_embed((2, 3), torch.device('cpu'), torch.float64)[0].double()
    mean = pos.mean(-1, keepdim=True)
    var = ((pos - mean)**2).mean(-1, keepdim=True)
    assert torch.allclose(got, (pos - mean) / torch.sqrt(var + 0.5), atol=1e-5)


def _fp64_peak(attn: torch.Tensor, grid: Tuple[int, int], shift: Tuple[int, int]) -> float:
    """Fraction of in-grid queries whose map row has its maximum at the target key."""
    hits = [int(attn[q].argmax()) == key for q, key in enumerate(_targets(grid, shift))
            if key >= 0]
    return sum(hits) / len(hits)


def test_impulse_report_names_the_grid_rows_first_and_the_worst_peak_fraction():
    """A 2 x 3 grid is reported as [2, 3]; the minimum over shifts of the peak fraction,
    recomputed in float64 from the bank, is what ``fit_peak_fraction_min`` says."""
    student = _impulse_student()
    strategy = ImpulseInit(steps=5, lr=0.05, seed=0, use_cache=False)
    tokens = strategy.position_tokens(student)
    bank = load_or_fit_impulse_bank(tokens, (2, 3), 16, 3, 5, 0.05, 0, None)
    t = tokens.double()
    peaks = []
    for s, shift in enumerate(bank['shifts']):
        attn = ((t @ bank['wq'][s].double()) @ (t @ bank['wk'][s].double()).T / 4.0)
        peaks.append(_fp64_peak(attn, (2, 3), shift))
    assert min(peaks) < max(peaks)  # five steps do not fit every shift: min is meaningful
    report = transfer_weights(student, _impulse_student(), strategy)
    assert report.details['grid'] == [2, 3]
    assert report.details['fit_peak_fraction_min'] == pytest.approx(min(peaks))


def test_impulse_needs_at_least_one_step():
    """No Adam step means no fit: refused when the strategy is built."""
    with pytest.raises(ValueError, match='steps must be positive'):
        ImpulseInit(steps=0, use_cache=False)


# ---------------------------------------------------------------------- transformer pieces
@pytest.mark.parametrize('p', [0.3, 0.7])
def test_drop_path_equals_timm_drop_path(p: float):
    """Same generator state, same per-sample mask, same 1 / keep scaling as timm (up to the
    rounding of the order of the product)."""
    x = torch.randn(16, 3, 4)
    module = DropPath(p).train()
    torch.manual_seed(11)
    got = module(x)
    torch.manual_seed(11)
    expected = timm.layers.drop_path(x, p, training=True, scale_by_keep=True)
    assert torch.allclose(got, expected, rtol=1e-6, atol=0.0)  # x * m / k vs x * (m / k)
    assert torch.equal(got == 0, expected == 0)
    assert torch.equal(module.eval()(x), x)  # eval: identity


def test_drop_path_of_one_drops_everything_without_nan():
    """p = 1: keep = 0, every sample dropped, zeros (timm does not divide by 0 either)."""
    x = torch.randn(4, 3, 2)
    got = DropPath(1.0).train()(x)
    assert torch.equal(got, torch.zeros_like(x))
    assert 'drop_prob=1.0' in repr(DropPath(1.0))


def test_layer_scale_default_is_timm_and_dinov2():
    """timm's ``LayerScale(dim)`` and DINOv2's ``LayerScale`` start gamma at 1e-5."""
    ours, theirs = LayerScale(8), timm.layers.LayerScale(8)
    assert torch.equal(ours.gamma.detach(), theirs.gamma.detach())


def test_block_layer_norm_eps_is_dinov2s():
    """ViT / DINOv2 blocks use ``partial(nn.LayerNorm, eps=1e-6)``."""
    block = TransformerBlock(16, 2, 32)
    assert block.norm1.eps == 1e-6 and block.norm2.eps == 1e-6


def test_silu_activation_is_silu():
    x = torch.linspace(-4, 4, 33, dtype=torch.float64)
    assert torch.allclose(build_activation('silu')(x), x * torch.sigmoid(x))
