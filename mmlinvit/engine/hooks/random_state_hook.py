"""Saves every process' random streams in checkpoints and restores them on resume.

With the data pipeline on per-sample streams (:mod:`mmlinvit.engine.sample_seeding`), what
remains are the streams of the training processes themselves: python ``random``, numpy, torch
CPU and CUDA generators, which feed dropout, drop-path, random masking and anything else the
model or a hook draws.  mmengine re-seeds them when a run is resumed; this hook puts back the
exact states of the interrupted run instead.
"""
import logging
import random
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_dist_info
from mmengine.hooks import Hook
from mmengine.logging import print_log

from mmlinvit.registry import HOOKS

from .checkpoint_schedule import checkpoint_due

#: Key of the random states in a runner checkpoint.
CHECKPOINT_KEY = 'mmlinvit_random_states'

#: First spawn-key word of the per-rank process streams: keeps their seeds apart from the
#: per-sample augmentation seeds (:func:`mmlinvit.engine.sample_seeding.sample_seed`, which
#: ``rank_stream_seed(seed, r)`` equalled for epoch ``r``, position 0) and the patch masks.
RANK_STREAM_TAG = 0x72616E6B  # 'rank'


def capture_random_state() -> Dict[str, Any]:
    """This process' python / numpy / torch (CPU, current CUDA device) generator states."""
    state = dict(python=random.getstate(), numpy=np.random.get_state(),
                 torch=torch.random.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state()
    return state


def restore_random_state(state: Dict[str, Any]) -> None:
    """Puts back states captured by :func:`capture_random_state`.

    Args:
        state: The captured states (tensors may have been mapped to another device).
    """
    random.setstate(state['python'])
    np.random.set_state(state['numpy'])
    torch.random.set_rng_state(state['torch'].cpu())
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state['cuda'].cpu())


@HOOKS.register_module()
class RandomStateHook(Hook):
    """Stores the random states of all ranks in each checkpoint; restores them on resume.

    * ``before_train``: gives every data loader of the run its own ``torch.Generator``, so
      that starting an iterator (which draws the workers' base seed) does not consume the
      global torch stream - otherwise the resumed run, which starts its iterator at another
      point, would be one draw off.
    * ``after_train_iter`` / ``after_train_epoch``: when a checkpoint is due and several
      processes train, the states of all ranks are gathered (checkpoints are written by rank
      0 only).
    * ``before_save_checkpoint``: writes them under ``checkpoint['mmlinvit_random_states']``.
    * ``after_load_checkpoint`` + the first ``before_train_iter`` of a resumed run: each rank
      gets its state back, right where the interrupted run would have continued.
    * the first ``before_train_iter`` of a run that is not resumed, with several processes:
      each rank's streams are re-seeded from (run seed, rank) (:func:`rank_stream_seed`), so
      that dropout, drop-path, Mixup / CutMix draws differ between ranks, as the official DeiT /
      DINOv2 / Adventurer / timm code seeds ``seed + rank`` (mmengine's shared seed made every
      rank draw the same masks for its part of the batch; its ``diff_rank_seed`` also reseeds
      the sampler, whose data order then cannot be reproduced).  The data order and the
      per-sample augmentation streams keep the shared seed.
    * the first ``before_train_iter`` of a resumed run whose checkpoint holds no state for this
      rank (written without this hook, by another number of processes, or a ``save_best``
      checkpoint of a multi-process run): a warning, and this rank's streams are seeded from
      (run seed, rank, resumed iteration), with any number of processes, so the ranks still
      draw differently and the resumed part does not replay the streams of iteration 1 (mmengine
      re-seeded every rank with the run seed).

    Args:
        rank_streams: Re-seed the process streams per rank (above); ``False`` keeps mmengine's
            identical streams on every rank (config key ``rank_random_streams = False``).
        save_states: Save the states in checkpoints, restore them on resume and give the data
            loaders private generators (``exact_resume``); ``False`` only seeds the rank
            streams at the first iteration of every run, fresh or resumed (from (run seed,
            rank, iteration)), for configs with ``exact_resume = False``.
    """

    priority = 'ABOVE_NORMAL'

    def __init__(self, rank_streams: bool = True, save_states: bool = True) -> None:
        self.rank_streams = rank_streams
        self.save_states = save_states
        self._gathered: Optional[Tuple[Tuple[int, int], List[Dict[str, Any]]]] = None
        self._pending: Optional[Dict[str, Any]] = None
        self._pending_iter: Optional[int] = None
        self._started = False

    # ------------------------------------------------------------------ data loaders
    def before_train(self, runner) -> None:
        """Gives the train / val loaders private generators for their workers' base seeds."""
        if not self.save_states:
            return
        loaders = [runner.train_dataloader]
        val_loop = runner.val_loop  # built by Runner.train() before this stage
        if val_loop is not None and hasattr(val_loop, 'dataloader'):
            loaders.append(val_loop.dataloader)
        for offset, loader in enumerate(loaders):
            if isinstance(loader, torch.utils.data.DataLoader) and loader.generator is None:
                loader.generator = torch.Generator().manual_seed(int(runner.seed) + offset)

    # ------------------------------------------------------------------ saving
    def _gather_if_saving(self, runner, stage: str) -> None:
        _, world_size = get_dist_info()
        if self.save_states and world_size > 1 and checkpoint_due(runner, stage):
            self._gathered = ((runner.epoch, runner.iter), all_gather_object(
                capture_random_state()))

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: Any = None,
                         outputs: Optional[dict] = None) -> None:
        """Gathers all ranks' states when an iteration checkpoint follows."""
        self._gather_if_saving(runner, 'iter')

    def after_train_epoch(self, runner) -> None:
        """Gathers all ranks' states when an epoch checkpoint follows."""
        self._gather_if_saving(runner, 'epoch')

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Stores the states of every rank (``None`` for ranks not gathered at this step)."""
        if not self.save_states:
            return
        _, world_size = get_dist_info()
        if world_size == 1:
            states: List[Optional[Dict[str, Any]]] = [capture_random_state()]
        elif self._gathered is not None and self._gathered[0] == (runner.epoch, runner.iter):
            states = list(self._gathered[1])
        else:  # e.g. a save_best checkpoint after validation: only rank 0 is here
            states = [capture_random_state()] + [None] * (world_size - 1)
        checkpoint[CHECKPOINT_KEY] = dict(world_size=world_size, states=states)

    # ------------------------------------------------------------------ resuming
    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Keeps the states of a loaded checkpoint until the first resumed iteration."""
        if not self.save_states:
            return
        self._pending = checkpoint.get(CHECKPOINT_KEY)
        self._pending_iter = checkpoint.get('meta', {}).get('iter')
        if self._pending is None:
            self._pending = dict(missing=True)

    def before_train_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        """Restores this rank's state at the first iteration after a resume; at the first
        iteration of a fresh multi-process run, or of a resumed run without this rank's state,
        seeds this rank's own streams."""
        first, self._started = not self._started, True
        pending, self._pending = self._pending, None
        resumed = (pending is not None and self._pending_iter is not None
                   and runner.iter == self._pending_iter)
        if first and not resumed and self.rank_streams:
            self._seed_rank_streams(runner)
        if not resumed:
            return  # a fresh run, load_from (fine-tuning from a checkpoint), or no save_states
        rank, world_size = get_dist_info()
        if pending.get('missing'):
            why = ('The resumed checkpoint has no random states (written without '
                   'mmlinvit.RandomStateHook)')
        elif pending['world_size'] != world_size or pending['states'][rank] is None:
            why = (f'The resumed checkpoint holds the random states of '
                   f'{pending["world_size"]} process(es), not of rank {rank} of {world_size}')
        else:
            restore_random_state(pending['states'][rank])
            return
        if self.rank_streams:
            seed = self._seed_rank_streams(runner, any_world_size=True)
            then = (f'the random streams of rank {rank} are seeded with {seed} from (run seed '
                    f'{runner.seed}, rank {rank}, iteration {runner.iter}) instead')
        else:
            then = 'its random draws restart from the run seed (rank_random_streams = False)'
        print_log(f'{why}: {then}; dropout, drop-path and other random draws of the model '
                  f'differ from an uninterrupted run from here on.',
                  logger='current', level=logging.WARNING)

    @staticmethod
    def _seed_rank_streams(runner, any_world_size: bool = False) -> Optional[int]:
        """Seeds this rank's python / numpy / torch streams from (run seed, rank, iteration);
        with one process only when ``any_world_size``.  Returns the seed (None: not seeded)."""
        rank, world_size = get_dist_info()
        if world_size == 1 and not any_world_size:
            return None
        seed = rank_stream_seed(int(runner.seed), rank, int(runner.iter))
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)  # CPU and every CUDA device
        print_log(f'Random streams of rank {rank} seeded with {seed} (run seed {runner.seed}, '
                  f'rank {rank}, iteration {runner.iter}); data order and augmentation keep '
                  f'the run seed', logger='current')
        return seed


def rank_stream_seed(seed: int, rank: int, iteration: int = 0) -> int:
    """The 32-bit seed of rank ``rank``'s process streams in a run seeded with ``seed``, from
    iteration ``iteration`` on (0: a fresh run; else a resumed one without saved states).

    ``SeedSequence(seed, spawn_key=(RANK_STREAM_TAG, rank, iteration))``: a domain of its own,
    apart from the per-sample seeds ``SeedSequence([seed, epoch, position])`` (the former
    ``SeedSequence([seed, rank])`` equalled the seed of sample 0 of epoch ``rank``, numpy
    ignoring trailing zero words).

    Args:
        seed: The run seed (taken modulo 2**64).
        rank: The process rank.
        iteration: The iteration the streams start at.
    """
    sequence = np.random.SeedSequence(int(seed) % 2**64,
                                      spawn_key=(RANK_STREAM_TAG, int(rank), int(iteration)))
    return int(sequence.generate_state(1)[0])
