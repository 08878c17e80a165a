"""Mutation round 21: distillation losses, patch-grid ops, position and patch embeddings
(third pass).

Each test here fails on a one-line change of the code under test that rounds 8 to 20 let
through.  References are independent of the code under test: formulas written out in float64
Python, hand-computed values, or the real timm / mmpretrain functions run in the test.

Guarded:

* ``AttentionMapLoss``: with ``mode='kl', patch_tokens_only=True`` a patch row with a tiny
  (but non-zero) mass is renormalised with the ``eps`` clamp, not a larger one; entries just
  below zero are refused in ``'kl'`` mode; 16-bit maps are compared in float32; maps of
  broadcastable but different shapes are refused.
* ``MaskedPredictionLoss``: the Smooth L1 of 16-bit features is computed in float32.
* ``token_records_mse``: a non-tensor record is named as the student's or the teacher's.
* ``resample_pos_grid``: the default mode is plain bicubic (mmpretrain ``resize_pos_embed``),
  16-bit grids are resampled in float32 and returned in their dtype (timm
  ``resample_abs_pos_embed``).
* ``corner_pad``: returns its input itself when nothing needs padding (documented).
* ``checkpoint_pos_grid``: FINDING, a recorded grid with negative sides is refused (it
  passed the row-count check and failed later with torch's "invalid shape dimension").
"""
import math
import re

import pytest
import torch

from mmlinvit.distill.losses import (AttentionMapLoss, FeatureMSELoss, MaskedPredictionLoss,
                                     token_records_mse)
from mmlinvit.layers.patch_embed import corner_pad
from mmlinvit.layers.pos_embed import checkpoint_pos_grid, resample_pos_grid


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _smooth_l1(d: float, beta: float) -> float:
    """Smooth L1 of one difference (Fast R-CNN / ``torch.nn.SmoothL1Loss``)."""
    d = abs(d)
    return 0.5 * d * d / beta if d < beta else d - 0.5 * beta


# ------------------------------------------------------------------ attention-map loss
def test_attention_map_kl_renormalises_a_tiny_patch_row_with_eps() -> None:
    """Class token first on both sides; the student's patch row holds only 2e-5 of its mass.
    Renormalised (sum clamped at ``eps = 1e-8``) it is [0.5, 0.5], the teacher's patch row:
    KL 0.  A larger clamp (1e-3) would leave [0.01, 0.01] and cost log(50) per row."""
    student = torch.tensor([[[[0.5, 0.25, 0.25], [1 - 2e-5, 1e-5, 1e-5], [0.2, 0.4, 0.4]]]],
                           dtype=torch.float64)
    teacher = torch.tensor([[[[0.5, 0.25, 0.25], [0.0, 0.5, 0.5], [0.2, 0.4, 0.4]]]],
                           dtype=torch.float64)
    loss = AttentionMapLoss(mode='kl', patch_tokens_only=True)(student, teacher, (1, 0), (1, 0))
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    # and a real difference on the tiny row still counts: student patch row [3e-5, 1e-5]
    student[0, 0, 1, 1:] = torch.tensor([3e-5, 1e-5], dtype=torch.float64)
    want = (0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)) / 2
    loss = AttentionMapLoss(mode='kl', patch_tokens_only=True)(student, teacher, (1, 0), (1, 0))
    assert loss.item() == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize('mode', ['mse', 'kl'])
def test_attention_map_of_bf16_maps_is_computed_in_float32(mode: str) -> None:
    """bf16 maps (recorded under AMP) give the float64 value of those bf16 entries to float32
    accuracy; reducing in bf16 (8 bits of mantissa) is off by ~1e-3 relative."""
    s = torch.softmax(_randn(2, 2, 24, 24, seed=1), -1).bfloat16()
    t = torch.softmax(_randn(2, 2, 24, 24, seed=2), -1).bfloat16()
    s64, t64 = s.double(), t.double()
    if mode == 'mse':
        want = (s64 - t64).pow(2).mean().item()
    else:
        want = (t64 * (t64.clamp_min(1e-8).log() - s64.clamp_min(1e-8).log())).sum(-1).mean().item()
    got = AttentionMapLoss(mode=mode)(s, t)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(want, rel=2e-5)


@pytest.mark.parametrize('side', ['student', 'teacher'])
def test_attention_map_kl_refuses_slightly_negative_entries(side: str) -> None:
    """An InLine row may sum to one with a single entry only just below zero (-1e-6): it is a
    signed map all the same (its log is undefined), refused in ``'kl'`` mode, not clamped."""
    signed = torch.tensor([[[[0.5, 0.5 + 1e-6, -1e-6], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]]]])
    plain = torch.full((1, 1, 3, 3), 1 / 3)
    student, teacher = (signed, plain) if side == 'student' else (plain, signed)
    with pytest.raises(ValueError, match=f'the {side} map has negative entries'):
        AttentionMapLoss(mode='kl')(student, teacher)


@pytest.mark.parametrize('mode', ['mse', 'kl'])
def test_attention_map_refuses_broadcastable_shapes(mode: str) -> None:
    """A one-head student map against a four-head teacher (or one image against two) would
    broadcast silently in ``(s - t)`` / ``t * log s``: both shapes are named instead."""
    full = torch.full((2, 4, 3, 3), 1 / 3)
    for student, teacher in ((full[:, :1], full), (full, full[:1])):
        with pytest.raises(ValueError, match=r'AttentionMapLoss block 0: student shape '
                           + re.escape(str(tuple(student.shape)))):
            AttentionMapLoss(mode=mode)(student, teacher)


# ------------------------------------------------------------ masked-prediction loss
def test_masked_prediction_of_bf16_features_is_computed_in_float32() -> None:
    """Smooth L1 of bf16 features at the masked patches, averaged in float32: the float64
    value of the bf16 entries to ~1e-6 (a bf16 mean is ~1e-3 off)."""
    s = _randn(2, 16, 64, seed=3).bfloat16()
    t = _randn(2, 16, 64, seed=4).bfloat16()
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[0, ::2] = True
    mask[1, 1::3] = True
    s64, t64 = s.double().tolist(), t.double().tolist()
    values = [_smooth_l1(a - b, 1.0) for i in range(2) for j in range(16) if mask[i, j]
              for a, b in zip(s64[i][j], t64[i][j])]
    want = sum(values) / len(values)
    got = MaskedPredictionLoss()(s, t, mask)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(want, rel=2e-6)


# --------------------------------------------------------------- token-record MSE
def test_token_record_losses_name_the_student_or_teacher_record_in_type_errors() -> None:
    """The token-record losses pass no argument names to ``record_pairs``: its defaults
    ('the student record' / 'the teacher record') say which side got a non-tensor."""
    good = torch.zeros(1, 2, 3)
    with pytest.raises(TypeError, match=r'^the student record must be a tensor or a '
                       r'non-empty sequence of tensors, got str'):
        token_records_mse('x', good, False, (0, 0), (0, 0), 'mean', 'what')
    with pytest.raises(TypeError, match=r'^the teacher record must be a tensor'):
        FeatureMSELoss()(good, [good, None])


# -------------------------------------------------------------- position embeddings
def test_resample_pos_grid_defaults_to_mmpretrains_plain_bicubic() -> None:
    """Without ``mode`` the grid is resampled like mmpretrain's ``resize_pos_embed``
    (bicubic, ``align_corners=False``, no antialias), on a non-square grid (downsampling
    one side, where the antialiased kernel differs most)."""
    from mmpretrain.models.utils import resize_pos_embed
    pos = _randn(1, 4 * 6, 8, seed=5)
    want = resize_pos_embed(pos, (4, 6), (7, 3), mode='bicubic', num_extra_tokens=0)
    torch.testing.assert_close(resample_pos_grid(pos, (4, 6), (7, 3)), want,
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('mode,antialias', [('bicubic', False), ('bicubic_antialias', True)])
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_resample_pos_grid_of_16bit_grids_matches_timm(mode: str, antialias: bool,
                                                       dtype: torch.dtype) -> None:
    """timm's ``resample_abs_pos_embed`` resamples a 16-bit grid in float32 and casts the
    result back to the grid's dtype: the same values, bit for bit, and the same dtype."""
    from timm.layers import resample_abs_pos_embed
    pos = _randn(1, 3 * 5, 8, seed=6).to(dtype)
    want = resample_abs_pos_embed(pos, [6, 4], [3, 5], num_prefix_tokens=0,
                                  interpolation='bicubic', antialias=antialias)
    got = resample_pos_grid(pos, (3, 5), (6, 4), mode)
    assert got.dtype == dtype == want.dtype
    assert torch.equal(got, want)


def test_checkpoint_pos_grid_refuses_negative_recorded_sides() -> None:
    """FINDING (fails on the code before the round-21 fix in ``layers/pos_embed.py``): a
    record of (-4, -8) multiplies to the 32 patch rows, passed, and loading then failed in
    ``resample_pos_grid`` with torch's "invalid shape dimension -4"; the record must be
    named, as for a record that disagrees with the row count."""
    with pytest.raises(ValueError, match=r'records a -4x-8 position grid'):
        checkpoint_pos_grid(32, (-4, -8))
    with pytest.raises(ValueError, match=r'records a -1x-32 position grid'):
        checkpoint_pos_grid(32, (-1, -32))
    assert checkpoint_pos_grid(32, (4, 8)) == (4, 8)
    assert checkpoint_pos_grid(7, (7, 1)) == (7, 1)


# ----------------------------------------------------------------- patch embedding
def test_corner_pad_returns_the_input_itself_when_it_divides() -> None:
    """Documented: ``x`` itself (no copy) when H and W divide by p; otherwise zero rows /
    columns at the bottom / right."""
    x = _randn(1, 2, 4, 6, seed=8)
    assert corner_pad(x, 2) is x
    padded = corner_pad(x, 4)
    assert padded.shape == (1, 2, 4, 8)
    assert torch.equal(padded[..., :6], x) and not padded[..., 6:].any()


def test_a_misspelt_pos_interp_is_refused_when_the_model_is_built():
    """FINDING: ``pos_interp='bicubc'`` built and ran at the native size, failing only on the
    first input of another size (``resample_pos_grid`` returned early before checking the
    mode); now refused at build time, naming the modes."""
    from mmlinvit.backbones import VisionTransformer
    arch = dict(embed_dims=16, num_layers=1, num_heads=2, mlp_hidden_dims=32)
    with pytest.raises(KeyError, match="Unknown pos_interp 'bicubc'.*bicubic"):
        VisionTransformer(arch, family='deit', img_size=32, patch_size=16, pos_interp='bicubc')
    pos = torch.randn(1, 4, 8)
    with pytest.raises(KeyError, match="Unknown pos_interp 'bicubc'"):
        resample_pos_grid(pos, (2, 2), (2, 2), 'bicubc')
    assert resample_pos_grid(pos, (2, 2), (2, 2), 'bicubic') is pos
