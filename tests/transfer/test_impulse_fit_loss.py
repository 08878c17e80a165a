"""Impulse init with the paper's fitting loss (``fit_loss='mse'``).

The paper fits the softmax map to the impulse matrix by MSE; the MSE here is written from
that definition (one-hot rows at the shifted key, all-zero rows where the shift leaves the
grid) and compared with the loss the fit reports after a zero-learning-rate run.
"""
import pytest
import torch

from mmlinvit.layers.pos_embed import sincos_pos_embed_2d
from mmlinvit.transfer.impulse import ImpulseInit, fit_impulse_bank, load_or_fit_impulse_bank

GRID = (4, 4)
SHIFTS = [(0, 0), (-1, 1), (1, 0)]


def tokens() -> torch.Tensor:
    pos = sincos_pos_embed_2d(GRID, 32)[0]
    return torch.nn.functional.layer_norm(pos, (32, ))


def test_mse_fit_reports_the_paper_loss_and_learns_the_impulses():
    t = tokens()
    frozen = fit_impulse_bank(t, GRID, 16, SHIFTS, steps=1, lr=0.0, seed=3, fit_loss='mse')
    # independent MSE at the (unchanged) initial weights
    attn = ((t @ frozen['wq']) @ (t @ frozen['wk']).transpose(1, 2) * 16**-0.5).softmax(-1)
    target = torch.zeros(len(SHIFTS), 16, 16)
    for s, (dy, dx) in enumerate(SHIFTS):
        for r in range(4):
            for c in range(4):
                if 0 <= r + dy < 4 and 0 <= c + dx < 4:
                    target[s, r * 4 + c, (r + dy) * 4 + c + dx] = 1.0
    assert frozen['loss'] == pytest.approx((attn - target).square().mean().item(), rel=1e-5)
    fitted = fit_impulse_bank(t, GRID, 16, SHIFTS, steps=300, lr=1e-2, seed=3, fit_loss='mse')
    assert fitted['loss'] < 0.5 * frozen['loss']
    assert min(fitted['peak']) > 0.9


def test_fit_loss_is_part_of_the_cache_key_and_of_the_options(tmp_path):
    t = tokens()
    ce = load_or_fit_impulse_bank(t, GRID, 16, 3, 5, 1e-2, 0, str(tmp_path))
    mse = load_or_fit_impulse_bank(t, GRID, 16, 3, 5, 1e-2, 0, str(tmp_path), fit_loss='mse')
    assert not mse['cache_hit'] and ce['cache_file'] != mse['cache_file']
    assert not torch.equal(ce['wq'], mse['wq'])
    assert ImpulseInit(fit_loss='mse').options()['fit_loss'] == 'mse'
    with pytest.raises(ValueError, match='fit_loss'):
        ImpulseInit(fit_loss='l1')
