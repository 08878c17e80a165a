"""Inference reuses the resampled position grid while the parameter is unchanged, and never
serves a stale one: after optimizer steps, load_state_dict, dtype moves, a replaced
parameter, or with autograd on (training), the grid is resampled again."""
import copy
import pickle

import pytest
import torch

import mmlinvit.backbones.base as base
from mmlinvit.backbones import Adventurer, VisionTransformer

TINY = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)


@pytest.fixture
def resample_calls(monkeypatch):
    calls = []
    real = base.resample_pos_grid

    def counting(*args, **kwargs):
        calls.append(args[3] if len(args) > 3 else kwargs.get('mode'))
        return real(*args, **kwargs)

    monkeypatch.setattr(base, 'resample_pos_grid', counting)
    return calls


def fresh_grid(model, hw):
    """The resampled grid computed from scratch (no cache)."""
    return base.resample_pos_grid(model.patch_rows(model.pos_embed).detach(), model.pos_grid,
                                  hw, model.pos_interp)


@pytest.mark.parametrize('build', [
    lambda: VisionTransformer(TINY, family='dinov2', img_size=56, num_reg_tokens=4),
    lambda: VisionTransformer(TINY, family='dinov2', img_size=56),
    lambda: Adventurer(dict(embed_dims=32, num_layers=2), img_size=32, patch_size=8,
                       mixer_cfg=dict(d_state=16, headdim=16, chunk_size=16)),
])
def test_inference_reuses_the_grid_until_the_parameter_changes(build, resample_calls):
    model = build().eval()
    x = torch.randn(1, 3, 80, 96)
    with torch.no_grad():
        first = model(x)[0]
        second = model(x)[0]
    assert len(resample_calls) == 1
    torch.testing.assert_close(second, first, rtol=0, atol=0)

    # An optimizer step changes pos_embed in place (version counter): resampled again.
    opt = torch.optim.SGD([model.pos_embed], lr=1.0)
    model.pos_embed.grad = torch.randn_like(model.pos_embed)
    opt.step()
    hw = model.patch_embed(x)[1]
    with torch.no_grad():
        grid = model.learned_patch_pos_embed(hw)
    assert len(resample_calls) == 2
    torch.testing.assert_close(grid, fresh_grid(model, hw), rtol=0, atol=0)

    # load_state_dict copies into the parameter: resampled again, with the loaded values.
    other = build()
    model.load_state_dict(other.state_dict())
    with torch.no_grad():
        grid = model.learned_patch_pos_embed(hw)
    torch.testing.assert_close(grid, fresh_grid(other, hw), rtol=0, atol=0)

    # A replaced parameter object (same shape) is never served the old grid.
    model.pos_embed = torch.nn.Parameter(torch.randn_like(model.pos_embed))
    with torch.no_grad():
        grid = model.learned_patch_pos_embed(hw)
    torch.testing.assert_close(grid, fresh_grid(model, hw), rtol=0, atol=0)

    # Another dtype: its own grid, in that dtype.
    model.double()
    with torch.no_grad():
        grid = model.learned_patch_pos_embed(hw)
    assert grid.dtype == torch.float64
    torch.testing.assert_close(grid, fresh_grid(model, hw), rtol=0, atol=0)


def test_training_resamples_with_autograd(resample_calls):
    model = VisionTransformer(TINY, family='dinov2', img_size=56, out_type='featmap').train()
    x = torch.randn(1, 3, 70, 84)
    weight = torch.randn(1, 32, 5, 6)
    (model(x)[0] * weight).sum().backward()
    (model(x)[0] * weight).sum().backward()
    assert len(resample_calls) == 2
    assert model.pos_embed.grad is not None and model.pos_embed.grad.abs().sum() > 0


def test_native_grid_is_never_resampled(resample_calls):
    model = VisionTransformer(TINY, family='dinov2', img_size=56).eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 56, 56))
    assert resample_calls == []


def test_copies_and_pickles_do_not_share_a_stale_grid():
    model = VisionTransformer(TINY, family='dinov2', img_size=56).eval()
    x = torch.randn(1, 3, 70, 84)
    with torch.no_grad():
        model(x)
        twin = copy.deepcopy(model)
        twin.pos_embed.add_(1.0)
        reference = VisionTransformer(TINY, family='dinov2', img_size=56).eval()
        reference.load_state_dict(twin.state_dict())
        torch.testing.assert_close(twin(x)[0], reference(x)[0], rtol=0, atol=0)
        restored = pickle.loads(pickle.dumps(model))
        torch.testing.assert_close(restored(x)[0], model(x)[0], rtol=0, atol=0)
