"""The per-sample seed is sample_seed(seed, epoch, global position): set_epoch must
change the epoch part (new augmentation every epoch), and skip(n) (mmengine's iteration resume)
must continue the positions at n (the interrupted run's augmentation)."""
from mmengine.dataset import DefaultSampler, InfiniteSampler

from mmlinvit.engine.sample_seeding import (SampleSeedSampler, SkippableSampleSeedSampler,
                                            sample_seed)


def test_set_epoch_changes_every_sample_seed():
    sampler = SampleSeedSampler(DefaultSampler(list(range(6)), shuffle=False, seed=7), seed=7)
    first = [s for _, s in sampler]
    assert first == [sample_seed(7, 0, p) for p in range(6)]
    sampler.set_epoch(1)
    second = [s for _, s in sampler]
    assert second == [sample_seed(7, 1, p) for p in range(6)]
    assert not set(first) & set(second)


def test_skip_continues_the_positions():
    sampler = SkippableSampleSeedSampler(InfiniteSampler(list(range(6)), shuffle=False, seed=7),
                                         seed=7)
    sampler.skip(4)
    it = iter(sampler)
    got = [next(it) for _ in range(3)]
    assert got == [(i % 6, sample_seed(7, 0, i)) for i in (4, 5, 6)]
