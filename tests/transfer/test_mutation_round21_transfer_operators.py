"""Mutation round 21: weight transfer, the operator setting, the arch zoo and training records.

Written for single-change mutants of ``mmlinvit/transfer/{base,copy_strategies,mimetic,
impulse}.py`` and ``mmlinvit/backbones/{operator_setting,arch_zoo,training_record}.py`` that
the earlier tests (rounds 8 to 20 included) let pass.  Guarded, each against an independent
reference (numpy's ``SeedSequence``, a Gram-Schmidt orthonormalisation written here in
float64, hand-stated rules of the docstrings / README, mmpretrain's and timm's own classes):

* transfer reports: the options of ``mlp_copy`` reach the report (also as Mimetic's
  ``base_options``); the description of an adapted ``pos_embed`` says only what was done
  (no "class position dropped" for a student that keeps its class position, no resampling
  note when the grids agree);
* teacher state dicts: a ``blocks.<name>`` key without a block index is not a block; a
  file without the width keys gets the named layout error;
* Mimetic: a seed past 2**32 is taken modulo 2**64 (as documented), not folded onto a small
  seed;
* Impulse: the per-head rotation is the Haar-random orthogonal matrix of the QR of a
  Gaussian matrix with the signs fixed (Mezzadri 2007), i.e. the Gram-Schmidt basis of the
  drawn matrix; the fit defaults are the README's (200 Adam steps at lr 1e-2);
* training records: names are ASCII (a non-ASCII name is refused);
* FINDING (``test_impulse_refuses_a_window_wider_than_the_grid``, fails on the code before
  the fix in ``mmlinvit/transfer/impulse.py``, ``ImpulseInit.check``): a window whose outer
  shifts no query of the grid can take was fitted silently (unfitted heads, NaN peak
  fraction) instead of being refused;
"""
import math
from typing import List

import numpy as np
import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.backbones.training_record import encode_names
from mmlinvit.transfer import transfer_weights
from mmlinvit.transfer.impulse import ImpulseInit, _random_orthogonal
from mmlinvit.transfer.mimetic import layer_generator

TINY = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
COMMON = dict(img_size=32, patch_size=8)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors: one intra-op thread."""


def _gram_schmidt_fp64(a: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns of ``a`` by classical Gram-Schmidt (positive diagonal of R)."""
    cols: List[torch.Tensor] = []
    for j in range(a.shape[1]):
        v = a[:, j].clone()
        for q in cols:
            v = v - (q @ a[:, j]) * q
        cols.append(v / v.norm())
    return torch.stack(cols, dim=1)


# ---------------------------------------------------------------------- reports
def test_mlp_copy_options_reach_the_report():
    """``include_layer_scale`` is recorded, for ``mlp_copy`` and as Mimetic's base options."""
    teacher = VisionTransformer(TINY, **COMMON)
    student = VisionTransformer(TINY, attn_cfg='elu', **COMMON)
    report = transfer_weights(student, teacher, 'mlp_copy', include_layer_scale=False)
    assert report.options == {'include_layer_scale': False}
    student = VisionTransformer(TINY, attn_cfg='elu', **COMMON)
    report = transfer_weights(student, teacher, 'mimetic', seed=0,
                              base=dict(type='mlp_copy', include_layer_scale=False))
    assert report.options['base'] == 'mlp_copy'
    assert report.options['base_options'] == {'include_layer_scale': False}


def test_adapted_position_grid_notes_say_only_what_was_done():
    """A student with a class token keeps the class position (no "dropped" note); a student
    on the teacher's grid is not resampled (no resampling note)."""
    teacher = VisionTransformer(TINY, **COMMON)  # class token, 4x4 grid
    bigger = VisionTransformer(TINY, attn_cfg='elu', img_size=48, patch_size=8,
                               pos_interp='bicubic')  # class token, 6x6 grid
    report = transfer_weights(bigger, teacher, 'full_copy')
    note = report.adapted['pos_embed']
    assert 'dropped' not in note and '4x4' in note and '6x6' in note
    torch.testing.assert_close(bigger.pos_embed.detach()[:, 0], teacher.pos_embed.detach()[:, 0],
                               rtol=0, atol=0)
    same_grid = VisionTransformer(TINY, attn_cfg='elu', with_cls_token=False,
                                  out_type='avg_featmap', **COMMON)
    report = transfer_weights(same_grid, teacher, 'full_copy')
    note = report.adapted['pos_embed']
    assert 'dropped' in note and 'resampled' not in note and '4x4' not in note


def test_a_teacher_key_under_blocks_without_an_index_is_no_block():
    """Only ``blocks.<int>.`` keys count as blocks: an extra ``blocks.<name>`` entry of a
    teacher state dict is a tensor without counterpart, not a crash of the depth count."""
    teacher = VisionTransformer(TINY, **COMMON)
    state = {k: v for k, v in teacher.state_dict().items()
             if k not in VisionTransformer.TRAINING_RECORDS}
    state['blocks.meta'] = torch.zeros(3)
    student = VisionTransformer(TINY, attn_cfg='elu', **COMMON)
    report = transfer_weights(student, state, 'mlp_copy')
    assert 'blocks.meta' in report.no_counterpart
    assert report.copied == {f'blocks.{i}.{k}' for i in range(2)
                             for k in ('norm2.weight', 'norm2.bias', 'mlp.fc1.weight',
                                       'mlp.fc1.bias', 'mlp.fc2.weight', 'mlp.fc2.bias')}


def test_a_teacher_state_dict_without_width_keys_gets_the_layout_error():
    """Blocks present but neither ``patch_embed.proj.weight`` nor ``blocks.0.norm1.weight``
    (e.g. a file filtered to the attention weights): the named "not in the canonical layout"
    error, not a bare ``KeyError: None``."""
    teacher = VisionTransformer(TINY, **COMMON)
    state = {k: v for k, v in teacher.state_dict().items() if '.attn.' in k}
    student = VisionTransformer(TINY, attn_cfg='elu', **COMMON)
    with pytest.raises(ValueError, match='canonical layout'):
        transfer_weights(student, state, 'copy')


# ---------------------------------------------------------------------- Mimetic
def test_layer_generator_takes_large_seeds_modulo_2_64():
    """Seeds are taken modulo 2**64 (documented): 2**40 + 3 is its own stream, not seed 3's."""
    for seed in (2**40 + 3, 2**64 + 7):
        for layer in (0, 1):
            state = np.random.SeedSequence(seed % 2**64, spawn_key=(layer, )).generate_state(
                1, np.uint64)[0]
            expected = torch.randn(4, generator=torch.Generator().manual_seed(int(state)))
            assert torch.equal(torch.randn(4, generator=layer_generator(seed, layer)), expected)


# ---------------------------------------------------------------------- Impulse
def test_head_rotation_is_the_sign_fixed_qr_of_a_gaussian_draw():
    """Haar-random rotation (Mezzadri 2007): Q of the QR of a Gaussian matrix with R's
    diagonal made positive, which is the Gram-Schmidt basis of the drawn matrix; a plain
    LAPACK Q (signs not fixed) is biased (its first column points against the draw)."""
    for seed in range(4):
        draw = torch.randn(6, 6, generator=torch.Generator().manual_seed(seed),
                           dtype=torch.float64)
        rot = _random_orthogonal(6, torch.Generator().manual_seed(seed))
        torch.testing.assert_close(rot, _gram_schmidt_fp64(draw), rtol=0, atol=1e-10)


def test_impulse_fit_defaults_are_the_documented_200_steps_at_lr_1e_2():
    """README (deviations table): the default fit is 200 Adam steps at lr 1e-2 with the
    cross-entropy loss, every block sharing the per-head weights (the public ``init_once``)."""
    options = ImpulseInit(use_cache=False).options()
    assert (options['steps'], options['lr'], options['fit_loss']) == (200, 1e-2, 'cross_entropy')
    assert options['share_across_layers'] is True


def test_impulse_refuses_a_window_wider_than_the_grid():
    """FINDING of round 21 (fails on the code before the fix in ``ImpulseInit.check``): on a
    2x2 patch grid a 5x5 window has shifts of 2 rows / columns, which no query can take (hand
    rule: shift (dy, dx) has an in-grid key iff |dy| < rows and |dx| < cols).  The old code
    fitted nothing for them, wrote the random start of the bank into every head that drew
    one, and reported ``fit_peak_fraction_min = nan``; it is now refused before anything is
    written.  A 3x3 window on the same grid (every shift reachable) still fits."""
    teacher = VisionTransformer(TINY, img_size=16, patch_size=8)
    student = VisionTransformer(TINY, attn_cfg='softmax', img_size=16, patch_size=8,
                                with_cls_token=False, pos_embed_type='sincos',
                                out_type='avg_featmap')  # 2x2 grid
    unreachable = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
                   if not (abs(dy) < 2 and abs(dx) < 2)]
    assert len(unreachable) == 16  # the ring of the 5x5 window
    before = {k: v.clone() for k, v in student.state_dict().items()}
    with pytest.raises(ValueError, match=r'window=5.*2x2'):
        transfer_weights(student, teacher, 'impulse', window=5, use_cache=False, seed=0, steps=1)
    for key, value in student.state_dict().items():
        assert torch.equal(value, before[key]), key
    report = transfer_weights(student, teacher, 'impulse', window=3, use_cache=False, seed=0,
                              steps=1)
    assert not math.isnan(report.details['fit_peak_fraction_min'])


# ---------------------------------------------------------------------- training records
def test_record_names_must_be_ascii():
    """Names are stored as zero-padded ASCII (documented): a non-ASCII name is refused when
    encoded, not stored as UTF-8 bytes that decode to other characters."""
    assert encode_names(['relu']).tolist()[0][:5] == [ord('r'), ord('e'), ord('l'), ord('u'), 0]
    with pytest.raises(UnicodeEncodeError):
        encode_names(['r\u00e9lu'])


def test_run_seeds_that_differ_above_bit_31_draw_other_inits():
    """``run_seed(None)`` is the run's whole seed: runs seeded ``s`` and ``s + 2**31`` (mmengine
    seeds and ``torch.initial_seed()`` are 64-bit) got the same Mimetic / Impulse draws when it was
    taken modulo 2**31."""
    from mmlinvit.transfer.base import AttentionInitStrategy
    draws = []
    with torch.random.fork_rng(devices=[]):
        for seed in (5, 5 + 2**31):
            torch.manual_seed(seed)
            run = AttentionInitStrategy.run_seed(None)
            assert run == seed
            draws.append(torch.randn(4, generator=layer_generator(run, 0)))
    assert not torch.equal(draws[0], draws[1])
