"""Training options that must know about gradient accumulation, and the AMP device check.

``optim_wrapper.accumulative_counts = k`` makes one optimizer step out of k iterations, so the
effective batch is ``world_size x batch_size x k``.  Three mmengine mechanisms count
iterations, not optimizer steps, and would silently train something else:

* ``auto_scale_lr`` scales the lr by ``world_size x batch_size / base_batch_size`` (k left
  out; mmengine PR #1080 is still open): the lr is k times too low.  Here the base batch is
  divided by k, so the ratio is that of the effective batch (as the official Adventurer and
  DeiT code compute it), and the log says so.  The recipe's base is kept in the config
  (``recipe_base_batch_size``), so the config mmengine saves in the work dir scales right when
  it is run again with another k.
* ``EMAHook`` updates after every iteration: k updates per optimizer step, a horizon k times
  shorter than the configured momentum says.  Between two steps the weights do not change, so
  k updates with momentum ``1 - (1 - m)^(1/k)`` equal one with ``m``: the warning gives that.
* a checkpoint written inside an accumulation window loses the gradients accumulated so far
  on ``--resume`` (mmengine warns only then): warned at the start when the checkpoint
  interval (in iterations) is not a multiple of k, and (``AtomicCheckpointHook``) when epoch
  checkpoints are taken and the iterations per epoch are not a multiple of k.
* iteration-based runs: ``max_iters``, the schedulers' ``begin`` / ``end`` and the intervals
  count iterations, so a recipe accumulated over k iterations makes k times fewer optimizer
  steps (160k iterations at k = 8: 20k steps, the warm-up over in 187): warned, with the
  factor to apply.

:func:`check_amp_device` fails at once when ``AmpOptimWrapper`` cannot run (mmengine refuses
CPU-only machines only after the model and data are built).
"""
import logging
from typing import Any, List, Optional

from mmengine.config import Config
from mmengine.logging import print_log

from mmlinvit.utils.config_types import config_type_name

#: mmengine ``EMAHook`` default momentum (``ExponentialMovingAverage``).
EMA_DEFAULT_MOMENTUM = 0.0002



class AmpDeviceError(ValueError):
    """``--amp`` on a machine without a device mmengine's ``AmpOptimWrapper`` runs on."""

def accumulative_counts(cfg: Config) -> int:
    """``optim_wrapper.accumulative_counts`` of a config (1 when unset).

    Args:
        cfg: The config.
    """
    wrapper = cfg.get('optim_wrapper', None) or {}
    return int(wrapper.get('accumulative_counts', 1) or 1)


def _ema_hooks(cfg: Config) -> List[dict]:
    return [h for h in (cfg.get('custom_hooks', None) or [])
            if isinstance(h, dict) and config_type_name(h.get('type')) == 'EMAHook']


def ema_momentum_per_iteration(momentum: float, counts: int) -> float:
    """The per-iteration EMA momentum that equals ``momentum`` per optimizer step.

    Args:
        momentum: The wanted momentum per optimizer step (mmengine convention: the weight
            of the new parameters).
        counts: Iterations per optimizer step (``accumulative_counts``).
    """
    return 1.0 - (1.0 - momentum)**(1.0 / counts)


def adapt_to_accumulation(cfg: Config) -> Config:
    """Makes ``auto_scale_lr`` count the accumulated batch, and warns about the EMA momentum
    and checkpoints inside an accumulation window (see the module docstring).

    Args:
        cfg: The prepared training config, changed in place.

    Returns:
        The same config.
    """
    counts = accumulative_counts(cfg)
    _scale_base_batch(cfg, counts)
    if counts <= 1:
        return cfg
    for hook in _ema_hooks(cfg):
        momentum = float(hook.get('momentum', EMA_DEFAULT_MOMENTUM))
        print_log(
            f'EMAHook updates after every iteration, i.e. {counts} times per optimizer step '
            f'with accumulative_counts={counts}: momentum {momentum} then acts as '
            f'{1 - (1 - momentum)**counts:.3g} per step (a {counts}x shorter horizon). For '
            f'{momentum} per optimizer step, set the hook\'s momentum to '
            f'{ema_momentum_per_iteration(momentum, counts):.6g} (--cfg-options '
            f'custom_hooks.<index>.momentum=...).', logger='current', level=logging.WARNING)
    max_iters = (cfg.get('train_cfg', None) or {}).get('max_iters', None)
    if max_iters is not None:
        print_log(f'train_cfg.max_iters={max_iters} counts iterations, not optimizer steps: '
                  f'with accumulative_counts={counts} the run makes {-(-max_iters // counts)} '
                  f'optimizer steps, and the param_scheduler begin / end (warm-up, poly decay) '
                  f'and the validation / checkpoint intervals count iterations too. To keep a '
                  f'recipe\'s number of updates while accumulating its batch over {counts} '
                  f'iterations, multiply max_iters, every scheduler begin / end and the '
                  f'intervals by {counts}.', logger='current', level=logging.WARNING)
    interval = _iteration_checkpoint_interval(cfg)
    if interval is not None and interval % counts:
        print_log(f'Checkpoints every {interval} iterations fall inside accumulation windows '
                  f'of {counts} iterations: a --resume from one of them loses the gradients '
                  f'accumulated since the last optimizer step (resume is then not exact). Use '
                  f'a checkpoint interval that is a multiple of {counts}.', logger='current',
                  level=logging.WARNING)
    return cfg


#: Where ``auto_scale_lr`` keeps the recipe's base batch once it is divided by k (a config
#: mmengine saves in the work dir and a user reruns must scale against the recipe again).
RECIPE_BASE_KEY = 'recipe_base_batch_size'


def _scale_base_batch(cfg: Config, counts: int) -> None:
    """Sets ``auto_scale_lr.base_batch_size`` to the recipe's base batch / ``counts``.

    The recipe's base is kept beside it (:data:`RECIPE_BASE_KEY`), so that a config saved by
    an earlier run (already divided by its k) and run again with another k (1 included) is
    scaled against the recipe, not against the earlier run's quotient.  A ``base_batch_size``
    changed by hand since (it no longer equals recipe / k of that run) is the new recipe.
    """
    scale = cfg.get('auto_scale_lr', None)
    if not scale or not scale.get('enable', False):
        return
    base = scale['base_batch_size']
    recipe = scale.get(RECIPE_BASE_KEY, None)
    applied = scale.get('_accumulation_applied', None)
    if recipe is not None and isinstance(applied, (int, float)) and not isinstance(
            applied, bool) and base == recipe / applied:
        base = recipe
    elif applied is True:  # saved by an earlier mmlinvit: the recipe's base is not known
        print_log(f'auto_scale_lr.base_batch_size={base} was divided by the accumulative_counts '
                  f'of the run that saved this config; it is used as it is (right only when '
                  f'that run\'s accumulative_counts equals this one, {counts}). Set '
                  f'auto_scale_lr.base_batch_size to the recipe\'s batch and drop '
                  f'auto_scale_lr._accumulation_applied to scale against the recipe.',
                  logger='current', level=logging.WARNING)
        return
    if counts <= 1:
        if base != scale['base_batch_size']:
            print_log(f'auto_scale_lr: base_batch_size {scale["base_batch_size"]} of the '
                      f'earlier run (accumulative_counts={applied}) restored to the '
                      f'recipe\'s {base} (accumulative_counts=1)', logger='current')
        scale['base_batch_size'] = base
        scale.pop(RECIPE_BASE_KEY, None)
        scale.pop('_accumulation_applied', None)
        return
    scale['base_batch_size'] = base / counts
    scale[RECIPE_BASE_KEY] = base
    scale['_accumulation_applied'] = counts
    print_log(f'auto_scale_lr: effective batch = world_size x batch_size x '
              f'accumulative_counts ({counts}); the lr is scaled against base_batch_size '
              f'{base} through {base} / {counts}', logger='current')


def _iteration_checkpoint_interval(cfg: Config) -> Optional[int]:
    """The ``CheckpointHook`` interval when it counts iterations, else None."""
    hook = (cfg.get('default_hooks', None) or {}).get('checkpoint', None)
    if not hook or hook.get('by_epoch', True):
        return None
    interval = hook.get('interval', -1)
    return int(interval) if interval and interval > 0 else None


def check_amp_device(cfg: Any) -> None:
    """Refuses ``AmpOptimWrapper`` where mmengine cannot run it, before anything is built.

    Args:
        cfg: The prepared training config.

    Raises:
        AmpDeviceError: ``optim_wrapper.type`` is ``AmpOptimWrapper`` (``--amp``) and no
            CUDA / NPU / MLU / MUSA device is available.
    """
    wrapper = cfg.get('optim_wrapper', None) or {}
    if config_type_name(wrapper.get('type')) != 'AmpOptimWrapper':
        return
    # the functions mmengine's AmpOptimWrapper asserts with, looked up at call time
    from mmengine.optim.optimizer import amp_optimizer_wrapper as amp
    if not (amp.is_cuda_available() or amp.is_npu_available() or amp.is_mlu_available()
            or amp.is_musa_available()):
        raise AmpDeviceError('--amp (optim_wrapper.type="AmpOptimWrapper") needs a CUDA, NPU, MLU '
                         'or MUSA device: mmengine refuses CPU-only machines. Train in fp32 '
                         'here (drop --amp).')
