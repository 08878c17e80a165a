"""The per-sample random streams of tools/train.py's training loaders
(mmlinvit.engine.sample_seeding), built through mmengine's Runner.build_dataloader."""
import random
import subprocess
import sys
import textwrap

import numpy as np
import torch
from mmengine.registry import init_default_scope
from mmengine.runner import Runner

from train_testing import REPO

SEED = 3


class RandomValues(torch.utils.data.Dataset):
    """Sample i: (i, a python, a numpy and a torch random number) - an augmentation stand-in."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int):
        return index, random.random(), float(np.random.rand()), float(torch.rand(()))


def _loader(num_workers: int = 0):
    init_default_scope('mmseg')
    cfg = dict(batch_size=2, num_workers=num_workers,
               dataset=dict(type='mmlinvit.SampleSeedDataset', dataset=RandomValues()),
               sampler=dict(type='mmlinvit.SampleSeedSampler',
                            sampler=dict(type='InfiniteSampler', shuffle=True)),
               collate_fn=dict(type=list))
    loader = Runner.build_dataloader(cfg, seed=SEED)
    # workers' base seed from a private generator, as RandomStateHook sets it for training
    loader.generator = torch.Generator().manual_seed(0)
    return loader


def _take(loader, num_batches: int):
    iterator = iter(loader)
    return [sample for _ in range(num_batches) for sample in next(iterator)]


def _global_states():
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()


def test_each_sample_draws_from_its_own_seed():
    before = _global_states()
    samples = _take(_loader(), 3)
    assert _global_states() == before  # the main process' streams are untouched
    # reference: InfiniteSampler's order, and per sample the streams seeded from
    # SeedSequence(seed, epoch 0, position)
    order = torch.randperm(6, generator=torch.Generator().manual_seed(SEED)).tolist()
    for position, (index, py, nv, tv) in enumerate(samples):
        assert index == order[position]
        seed = int(np.random.SeedSequence([SEED, 0, position]).generate_state(1)[0])
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        assert (py, nv, tv) == (random.random(), float(np.random.rand()), float(torch.rand(())))


def test_samples_do_not_depend_on_workers_or_resume():
    reference = _take(_loader(), 6)  # two passes over the data set
    assert _take(_loader(num_workers=2), 6) == reference
    resumed = _loader(num_workers=2)
    resumed.sampler.skip(8)  # what IterBasedTrainLoop does when resuming at iteration 4
    assert _take(resumed, 2) == reference[8:]


def test_wrappers_resolve_from_a_fresh_interpreter():
    script = textwrap.dedent("""
        import sys
        import torch
        from mmengine.registry import DATA_SAMPLERS, DATASETS, init_default_scope
        assert 'mmlinvit' not in sys.modules
        init_default_scope('mmseg')
        class Four(torch.utils.data.Dataset):
            def __len__(self):
                return 4
        dataset = DATASETS.build(dict(type='mmlinvit.SampleSeedDataset', dataset=Four()))
        sampler = DATA_SAMPLERS.build(dict(type='mmlinvit.SampleSeedSampler',
            sampler=dict(type='InfiniteSampler')), default_args=dict(dataset=dataset, seed=0))
        print(type(dataset).__name__, type(sampler).__name__)
    """)
    proc = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ['SampleSeedDataset', 'SkippableSampleSeedSampler']


def test_train_tool_wraps_the_loader_once_and_can_be_switched_off():
    from mmengine.config import Config

    from mmlinvit.engine.launch import add_training_safeguards
    loader = dict(dataset=dict(type='BaseSegDataset'), sampler=dict(type='InfiniteSampler'))
    cfg = Config(dict(train_dataloader=loader, custom_hooks=[dict(type='EMAHook')]))
    add_training_safeguards(cfg)
    add_training_safeguards(cfg)  # a dumped config trained again
    assert cfg.train_dataloader.dataset == dict(type='mmlinvit.SampleSeedDataset',
                                                dataset=loader['dataset'])
    assert cfg.train_dataloader.sampler == dict(type='mmlinvit.SampleSeedSampler',
                                                sampler=loader['sampler'])
    assert [h['type'] for h in cfg.custom_hooks] == [
        'EMAHook', 'mmlinvit.CheckFiniteHook', 'mmlinvit.SyncNormStatsHook',
        'mmlinvit.RandomStateHook']
    off = Config(dict(train_dataloader=loader, exact_resume=False))
    add_training_safeguards(off)
    assert off.train_dataloader.dataset == loader['dataset']
    # the per-rank streams stay (RandomStateHook without saving / restoring states)
    assert [h['type'] for h in off.custom_hooks] == ['mmlinvit.CheckFiniteHook',
                                                     'mmlinvit.SyncNormStatsHook',
                                                     'mmlinvit.RandomStateHook']
    assert off.custom_hooks[-1]['save_states'] is False
