"""Per-sample random streams for the training data pipeline, so that resuming is exact.

mmengine draws random augmentation (RandomResize, RandomCrop, RandomFlip...) from the global
``random`` / ``numpy`` / ``torch`` streams of whichever process runs the pipeline: the main
process with ``num_workers=0``, else each worker, seeded once at start-up from (seed, rank,
worker id).  A resumed run restarts those streams - its workers are new, prefetch ahead, and
the main-process state is re-seeded - so from the first resumed iteration on it augments
differently from the uninterrupted run.

Here every sample's pipeline runs under its own streams, seeded from
``(seed, epoch, global position of the sample in the sampler's stream)``:

* :class:`SampleSeedSampler` wraps the configured sampler (``InfiniteSampler``,
  ``DefaultSampler``...) and yields ``(index, sample_seed)`` pairs; it forwards ``set_epoch``
  and (when the wrapped sampler has it) ``skip``, which mmengine's ``IterBasedTrainLoop``
  calls on resume, so positions continue where the interrupted run stopped;
* :class:`SampleSeedDataset` wraps the dataset: ``dataset[(index, sample_seed)]`` seeds
  ``random``, ``numpy`` and torch's CPU generator, runs ``dataset[index]`` and puts the
  caller's streams back (so, with ``num_workers=0``, the main process' streams that feed the
  model - dropout, drop-path - are untouched).

A sample's augmentation is then a function of the seed and its position only: it is the same
after ``--resume``, for any ``num_workers`` and whatever the prefetching, and with the global
position ``p * world_size + rank`` a sample keeps its augmentation when the same global batch
is split over another number of processes.  This replaces mmengine's per-worker streams (a
documented deviation; the augmentation distribution is unchanged).  ``tools/train.py`` wraps
every training loader this way (``exact_resume = False`` in a config switches it off); the
main-process streams are saved and restored by :class:`~mmlinvit.engine.hooks.RandomStateHook`.
"""
import contextlib
import random
from typing import Any, Iterator, Optional, Tuple, Union

import numpy as np
import torch
from mmengine.dist import get_dist_info, sync_random_seed
from torch.utils.data import Dataset, IterableDataset, Sampler

from mmlinvit.registry import DATA_SAMPLERS, DATASETS


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """The 32-bit seed of the sample at global ``position`` of ``epoch`` in a run seeded ``seed``.

    Args:
        seed: The run's seed.
        epoch: The sampler's epoch (0 for iteration-based training).
        position: Global position in the sampler stream (``p * world_size + rank``).

    Returns:
        A seed for ``random`` / ``numpy`` / ``torch``.
    """
    entropy = [int(seed) % 2**64, int(epoch), int(position)]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


@contextlib.contextmanager
def seeded_streams(seed: int) -> Iterator[None]:
    """Seeds ``random``, ``numpy`` and torch's CPU generator; restores the old states after.

    Args:
        seed: The seed of this block.
    """
    py_state = random.getstate()
    np_state = np.random.get_state()
    torch_state = torch.random.get_rng_state()
    random.seed(seed)
    np.random.seed(seed)
    torch.random.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.random.set_rng_state(torch_state)


@DATASETS.register_module()
class SampleSeedDataset(Dataset):
    """Runs each sample's pipeline under a seed chosen by :class:`SampleSeedSampler`.

    ``dataset[(index, seed)]`` returns ``dataset.dataset[index]`` computed under
    :func:`seeded_streams`; a plain ``dataset[index]`` is passed through unseeded.  Other
    attributes (``metainfo``, ``get_data_info``...) are those of the wrapped dataset.

    Args:
        dataset: The dataset, or its config.
    """

    def __init__(self, dataset: Union[dict, Dataset]) -> None:
        if isinstance(dataset, dict):
            dataset = DATASETS.build(dataset)  # in the default scope (mmseg / mmpretrain)
        if isinstance(dataset, IterableDataset):
            raise TypeError(f'{type(dataset).__name__} is an IterableDataset: it has no '
                            f'sample positions to seed; set exact_resume = False in the config')
        self.dataset = dataset

    def full_init(self) -> None:
        """Fully initialises the wrapped dataset (mmengine's lazy init)."""
        if hasattr(self.dataset, 'full_init'):
            self.dataset.full_init()

    @property
    def metainfo(self) -> dict:
        """The wrapped dataset's meta information."""
        return getattr(self.dataset, 'metainfo', {})

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Union[int, Tuple[int, int]]) -> Any:
        if isinstance(key, tuple):
            index, seed = key
            with seeded_streams(seed):
                return self.dataset[index]
        return self.dataset[key]

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found on the wrapper itself.
        if name == 'dataset' or name.startswith('__'):
            raise AttributeError(name)
        return getattr(self.dataset, name)


class SampleSeedSampler(Sampler):
    """Yields ``(index, sample_seed)`` for every index of the wrapped sampler.

    Build it with :func:`build_sample_seed_sampler` (``type='mmlinvit.SampleSeedSampler'``),
    which returns :class:`SkippableSampleSeedSampler` when the wrapped sampler can ``skip``.

    Args:
        sampler: The wrapped sampler.
        seed: The run's seed (``None``: one seed shared by all ranks is drawn).
    """

    def __init__(self, sampler: Sampler, seed: Optional[int] = None) -> None:
        self.sampler = sampler
        self.seed = sync_random_seed() if seed is None else int(seed)
        self.rank, self.world_size = get_dist_info()
        self.epoch = 0
        self._start = 0

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        start, self._start = self._start, 0
        for position, index in enumerate(self.sampler, start):
            global_position = position * self.world_size + self.rank
            yield int(index), sample_seed(self.seed, self.epoch, global_position)

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch (part of every sample seed) and forwards it to the wrapped sampler."""
        self.epoch = epoch
        if hasattr(self.sampler, 'set_epoch'):
            self.sampler.set_epoch(epoch)


class SkippableSampleSeedSampler(SampleSeedSampler):
    """:class:`SampleSeedSampler` of a sampler with ``skip`` (mmengine's ``InfiniteSampler``)."""

    def skip(self, num_samples: int) -> None:
        """Fast-forwards to absolute per-rank position ``num_samples`` (mmengine's resume)."""
        self.sampler.skip(num_samples)
        self._start = num_samples


@DATA_SAMPLERS.register_module(name='SampleSeedSampler')
def build_sample_seed_sampler(dataset: Dataset, sampler: dict,
                              seed: Optional[int] = None) -> SampleSeedSampler:
    """Builds ``sampler`` (a sampler config) for ``dataset`` and wraps it.

    Args:
        dataset: The (wrapped) dataset.
        sampler: Config of the sampler to wrap, e.g. ``dict(type='InfiniteSampler')``.
        seed: The run's seed (mmengine passes it as for any sampler).

    Returns:
        The wrapper, with ``skip`` when the wrapped sampler has it.
    """
    inner = DATA_SAMPLERS.build(sampler, default_args=dict(dataset=dataset, seed=seed))
    seed = getattr(inner, 'seed', seed)
    cls = SkippableSampleSeedSampler if hasattr(inner, 'skip') else SampleSeedSampler
    return cls(inner, seed)
