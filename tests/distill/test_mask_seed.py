"""ViT-Linearizer patch masks follow the run seed (audit s11 seeding F1).

The masks of step s on rank r were a function of ``patch_masking.seed`` only (config constant
0), so runs with other ``randomness.seed`` drew identical masks at every step; and the seed
formula ``seed * 1_000_003 + step * 1_009 + rank`` gave (step s, rank r + 1009) the masks of
(step s + 1, rank r).
"""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import set_random_seed

from mmlinvit.distill import PatchMasking, sample_patch_mask
from mmlinvit.engine.sample_seeding import sample_seed
from mmlinvit.registry import MODELS

from distill_testing import CONFIGS, IMG_SIZE
from test_distillation_model import linearizer_model


def _masks(run_seed, steps=3, **patch_masking):
    """The masks of the first ``steps`` steps of a model built under mmengine's run seed."""
    set_random_seed(run_seed)  # what the Runner does before it builds the model
    model = MODELS.build(linearizer_model(patch_masking=dict(ratio=0.75, **patch_masking)))
    model.train()
    x = torch.zeros(2, 3, IMG_SIZE, IMG_SIZE)
    return torch.stack([model._sample_patch_mask(x, advance=True) for _ in range(steps)])


def test_masks_follow_the_run_seed():
    seed0, again, seed1 = _masks(0), _masks(0), _masks(1)
    assert torch.equal(seed0, again)  # one run seed: the same masks, every step
    for step in range(seed0.shape[0]):  # another run seed: other masks at every step
        assert not torch.equal(seed0[step], seed1[step]), step


def test_an_explicit_seed_fixes_the_masks():
    fixed0, fixed1 = _masks(0, seed=5), _masks(1, seed=5)
    assert torch.equal(fixed0, fixed1)
    assert not torch.equal(fixed0, _masks(0, seed=6))
    masking = PatchMasking(seed=5)
    assert masking.seed == 5 and not masking.seed_from_run


def test_default_seed_is_read_at_build_time():
    """Resolved once, at build: later re-seeding (per-rank streams, per-sample streams) of the
    process does not change the masks of a built model."""
    torch.manual_seed(3)
    masking = PatchMasking()
    assert masking.seed_from_run and masking.seed == 3
    torch.manual_seed(4)
    x = torch.zeros(2, 3, 16, 16)
    assert torch.equal(masking.sample(x, 4, step=2), sample_patch_mask(2, 16, 0.75, 3, 2))


def test_recipe_masks_follow_the_run_seed():
    cfg = Config.fromfile(osp.join(CONFIGS, '_base_', 'models', 'linearizer_clip-b16.py'))
    assert 'seed' not in cfg.model.patch_masking, cfg.model.patch_masking


@pytest.mark.parametrize('seed', [0, 7])
def test_steps_and_ranks_do_not_alias(seed):
    """(step s, rank r + 1009) drew the masks of (step s + 1, rank r)."""
    for step, rank in [(0, 0), (4, 1)]:
        assert not torch.equal(sample_patch_mask(2, 64, 0.5, seed, step, rank + 1009),
                               sample_patch_mask(2, 64, 0.5, seed, step + 1, rank))
        # nor (seed + 1, rank r) with (seed, rank r + 1_000_003)
        assert not torch.equal(sample_patch_mask(2, 64, 0.5, seed + 1, step, rank),
                               sample_patch_mask(2, 64, 0.5, seed, step, rank + 1_000_003))


def test_mask_streams_are_their_own_domain():
    """The mask generator's seed is none of the per-sample augmentation seeds of the run."""
    from mmlinvit.distill.patch_masking import mask_stream_seed
    for seed in (0, 1):
        mask_seeds = {mask_stream_seed(seed, s, r) for s in range(8) for r in range(4)}
        assert len(mask_seeds) == 32
        samples = {sample_seed(seed, e, p) for e in range(8) for p in range(8)}
        low_words = {m & 0xFFFFFFFF for m in mask_seeds} | {m >> 32 for m in mask_seeds}
        assert not samples & (mask_seeds | low_words)
