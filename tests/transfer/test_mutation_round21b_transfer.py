"""Mutation round 21 (second pass): Impulse's fit and cache, transfer pairing guards, records.

Written for single-change mutants of ``mmlinvit/transfer/{base,impulse,mimetic}.py`` and
``mmlinvit/backbones/{operator_setting,arch_zoo,training_record}.py`` that the earlier tests
(rounds 8 to 21 included) let pass.  Guarded, each against an independent reference:

* Impulse: the bank fit over many steps is ``torch.optim.Adam`` (betas 0.9 / 0.999, eps 1e-8)
  on the cross-entropy written out here, also in the small-gradient regime where the place of
  ``eps`` (outside the square root) matters;
* Impulse cache: the window, the number of steps and the grid (rows x cols of the same
  tokens) are part of the key of a cached bank (a bank of other shifts / another fit is
  never loaded: the loaded bank equals a fresh fit); a cache folder that does not exist yet
  is created;
* pairing: a non-tensor entry of a teacher state dict (a checkpoint wrapper's ``meta``) is
  refused with the documented ``TypeError`` naming the key, not an ``AttributeError`` from
  ``.detach()``; a
  teacher position grid of the same size but another layout (2x4 vs 4x2) is resampled as
  torch's bicubic ``interpolate`` does, not copied row for row;
* reports: ``TransferReport.summary`` gives the size of each set (counted here by hand);
* training records: ``encode_names([])`` is the documented ``(0, width)`` tensor;
* arch zoo: an unknown family is a ``KeyError`` naming the available ones (docstring); every
  LayerNorm eps of the MAE family is mmpretrain's ``MAEViT`` one, of DeiT / DINOv2 timm's
  ``VisionTransformer`` one (1e-6).
"""
import re
from pathlib import Path
from typing import List, Sequence, Tuple

import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.backbones.arch_zoo import VIT_FAMILIES, family_defaults
from mmlinvit.backbones.training_record import NAME_BYTES, encode_names
from mmlinvit.transfer import transfer_weights
from mmlinvit.transfer.base import TransferReport
from mmlinvit.transfer.impulse import fit_impulse_bank, impulse_shifts, load_or_fit_impulse_bank

TINY = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
COMMON = dict(img_size=32, patch_size=8)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors: one intra-op thread."""


# ---------------------------------------------------------------------- Impulse fit
def _ce_fp64(tokens: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, grid: Tuple[int, int],
             shifts: Sequence[Tuple[int, int]], head_dims: int) -> torch.Tensor:
    """Cross-entropy of softmax(t Wq Wk^T t^T / sqrt(d)) at the in-grid targets (hand loop)."""
    h, w = grid
    log_prob = ((tokens @ wq) @ (tokens @ wk).transpose(1, 2) / head_dims**0.5).log_softmax(-1)
    terms: List[torch.Tensor] = []
    for s, (dy, dx) in enumerate(shifts):
        for r in range(h):
            for c in range(w):
                if 0 <= r + dy < h and 0 <= c + dx < w:
                    terms.append(log_prob[s, r * w + c, (r + dy) * w + c + dx])
    return -torch.stack(terms).mean()


@pytest.mark.parametrize('token_scale', [1.0, 0.03])
def test_impulse_fit_is_torch_adam_over_many_steps(token_scale: float):
    """40 steps of the written-out Adam equal ``torch.optim.Adam(betas=(0.9, 0.999),
    eps=1e-8)`` from the same start (the lr-0 bank).  Over 40 steps a second-moment decay of
    0.99 drifts by ~1e-2; with small tokens (gradients ~1e-4) ``sqrt(v + eps)`` instead of
    ``sqrt(v) + eps`` drifts too."""
    grid, shifts, d, lr, steps = (3, 3), [(0, 1), (1, -1), (0, 0)], 4, 0.02, 40
    tokens = torch.randn(9, 16, generator=torch.Generator().manual_seed(0)) * token_scale
    init = fit_impulse_bank(tokens, grid, d, shifts, steps=1, lr=0.0, seed=3)
    fitted = fit_impulse_bank(tokens, grid, d, shifts, steps=steps, lr=lr, seed=3)
    params = [init['wq'].double().requires_grad_(True), init['wk'].double().requires_grad_(True)]
    optim = torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    for _ in range(steps):
        optim.zero_grad()
        _ce_fp64(tokens.double(), params[0], params[1], grid, shifts, d).backward()
        optim.step()
    torch.testing.assert_close(fitted['wq'].double(), params[0].detach(), atol=2e-5, rtol=0)
    torch.testing.assert_close(fitted['wk'].double(), params[1].detach(), atol=2e-5, rtol=0)
    assert (fitted['wq'] - init['wq']).abs().max() > 0.3  # it did move


# ---------------------------------------------------------------------- pairing guards
def test_a_non_tensor_teacher_entry_is_refused_naming_the_key():
    """``_teacher_state`` documents a ``TypeError`` naming the entry and the fix (pass the
    state dict, not the checkpoint wrapper) for any value that is not a tensor."""
    teacher = VisionTransformer(TINY, **COMMON)
    state = {k: v for k, v in teacher.state_dict().items()
             if k not in VisionTransformer.TRAINING_RECORDS}
    state['meta'] = dict(epoch=3)
    with pytest.raises(TypeError, match=r"'meta' is a dict, not a tensor"):
        transfer_weights(VisionTransformer(TINY, **COMMON), state, 'full_copy')


def test_a_transposed_position_grid_of_the_same_size_is_resampled():
    """Teacher grid 2x4, student grid 4x2: both ``pos_embed`` are (1, 1 + 8, C), yet token
    ``k`` of the teacher sits at (k // 4, k % 4) and of the student at (k // 2, k % 2); the
    pairing rule pairs a learned grid of another size by resampling it (module docstring).
    Reference: torch's bicubic ``interpolate`` of the teacher grid, class position kept."""
    torch.manual_seed(0)
    teacher = VisionTransformer(TINY, img_size=(16, 32), patch_size=8)
    with torch.no_grad():
        teacher.pos_embed.normal_()
    student = VisionTransformer(TINY, img_size=(32, 16), patch_size=8)
    report = transfer_weights(student, teacher, 'full_copy')
    assert 'pos_embed' in report.adapted and '2x4' in report.adapted['pos_embed']
    grid = teacher.pos_embed[:, 1:].reshape(1, 2, 4, -1).permute(0, 3, 1, 2)
    expected = torch.nn.functional.interpolate(grid, size=(4, 2), mode='bicubic',
                                               align_corners=False)
    expected = expected.permute(0, 2, 3, 1).reshape(1, 8, -1)
    assert not torch.allclose(student.pos_embed[:, 1:], teacher.pos_embed[:, 1:])
    torch.testing.assert_close(student.pos_embed[:, 1:], expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(student.pos_embed[:, :1], teacher.pos_embed[:, :1])


# ---------------------------------------------------------------------- Impulse cache
def _bank_args(rows: int = 3, cols: int = 3) -> dict:
    tokens = torch.randn(rows * cols, 16, generator=torch.Generator().manual_seed(1))
    return dict(tokens=tokens, grid=(rows, cols), head_dims=4, window=3, steps=1, lr=1e-2,
                seed=0)


@pytest.mark.parametrize('change', ['window', 'steps', 'grid'])
def test_window_steps_and_grid_are_part_of_the_impulse_cache_key(tmp_path: Path, change: str):
    """A bank cached for a 3x3 window / 1 step / a 3x4 grid is not loaded for a 5x5 window /
    3 steps / the same tokens on a 4x3 grid: the bank returned is a fresh fit of the new
    inputs (``fit_impulse_bank`` run here without any cache)."""
    args = _bank_args(3, 4) if change == 'grid' else _bank_args()
    first = load_or_fit_impulse_bank(cache_dir=str(tmp_path), **args)
    assert first['cache_hit'] is False
    assert load_or_fit_impulse_bank(cache_dir=str(tmp_path), **args)['cache_hit'] is True
    other = dict(args, **dict(window=dict(window=5), steps=dict(steps=3),
                              grid=dict(grid=(4, 3)))[change])
    bank = load_or_fit_impulse_bank(cache_dir=str(tmp_path), **other)
    assert bank['cache_hit'] is False and bank['cache_file'] != first['cache_file']
    shifts = impulse_shifts(other['window'])
    assert bank['shifts'] == shifts and bank['wq'].shape[0] == len(shifts)
    fresh = fit_impulse_bank(other['tokens'], other['grid'], other['head_dims'], shifts,
                             other['steps'], other['lr'], other['seed'])
    assert torch.equal(bank['wq'], fresh['wq']) and torch.equal(bank['wk'], fresh['wk'])


def test_a_missing_cache_folder_is_created(tmp_path: Path):
    """``cache_dir`` need not exist (the default ``~/.cache/mmlinvit/impulse`` does not on a
    fresh machine): the bank is stored there and read back."""
    cache = tmp_path / 'not' / 'yet'
    bank = load_or_fit_impulse_bank(cache_dir=str(cache), **_bank_args())
    assert Path(bank['cache_file']).parent == cache and Path(bank['cache_file']).is_file()
    assert load_or_fit_impulse_bank(cache_dir=str(cache), **_bank_args())['cache_hit'] is True


# ---------------------------------------------------------------------- reports, records, zoo
def test_report_summary_gives_the_size_of_each_set():
    """``summary``: "one line: strategy and the size of each set" (sizes counted by hand)."""
    report = TransferReport('mimetic', copied={'a', 'b'}, initialized={'c', 'd', 'e'},
                            student_only={'e'}, strategy_initialized={'c', 'd'},
                            no_counterpart={'x', 'y', 'z', 'w', 'v'},
                            skipped={'p', 'q', 'r', 's'})
    summary = report.summary()
    assert summary.startswith('mimetic:')
    found = {label.strip(): int(n) for label, n in re.findall(
        r'(copied|initialized|strategy-set|student-only|teacher skipped|'
        r'teacher without counterpart) (\d+)', summary)}
    assert found == {'copied': 2, 'initialized': 3, 'strategy-set': 2, 'student-only': 1,
                     'teacher skipped': 4, 'teacher without counterpart': 5}


def test_encoding_no_names_gives_an_empty_table_of_the_record_width():
    assert encode_names([]).shape == (0, NAME_BYTES)
    assert encode_names([], width=8).shape == (0, 8)


def test_an_unknown_family_names_the_available_ones():
    with pytest.raises(KeyError, match=r"Unknown ViT family 'vit'.*'clip'.*'deit'"):
        family_defaults('vit')
    assert family_defaults('deit') == VIT_FAMILIES['deit']
    assert family_defaults('deit') is not VIT_FAMILIES['deit']


@pytest.mark.parametrize('family', ['mae', 'deit', 'dinov2'])
def test_family_layer_norm_eps_is_the_reference_implementations(family: str):
    """Every LayerNorm of a ``family`` model has the eps of the reference implementation:
    mmpretrain's ``MAEViT`` for MAE, timm's ``VisionTransformer`` for DeiT and DINOv2."""
    import timm.models.vision_transformer as timm_vit
    if family == 'mae':
        from mmpretrain.models import MAEViT
        reference = MAEViT(arch=dict(embed_dims=32, num_layers=1, num_heads=2,
                                     feedforward_channels=64), img_size=32, patch_size=8)
    else:
        reference = timm_vit.VisionTransformer(img_size=32, patch_size=8, embed_dim=32,
                                               depth=1, num_heads=2)
    expected = {m.eps for m in reference.modules() if isinstance(m, torch.nn.LayerNorm)}
    assert len(expected) == 1
    ours = VisionTransformer(dict(embed_dims=32, num_layers=1, num_heads=2, mlp_hidden_dims=64),
                             family=family, img_size=32, patch_size=8)
    got = {m.eps for m in ours.modules() if isinstance(m, torch.nn.LayerNorm)}
    assert got == expected
