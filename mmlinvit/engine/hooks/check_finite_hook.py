"""Stops training at the first non-finite loss, gradient norm or parameter, before it is saved.

Without it, a run whose loss turns NaN keeps training (``loss: nan  grad_norm: nan`` in the
log), writes NaN checkpoints and, with ``max_keep_ckpts``, rotates the last good one away.
``tools/train.py`` adds this hook to every run (see :mod:`mmlinvit.engine.launch`).
"""
import math
from typing import Any, Dict, List, Optional

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.optim import AmpOptimWrapper, OptimWrapperDict

from mmlinvit.registry import HOOKS

from ..resume import last_checkpoint_target
from .checkpoint_schedule import checkpoint_due
from .ema_models import ema_modules

#: Message-hub keys where mmengine's optimizer wrappers log the gradient norm / max value.
GRAD_KEYS = ('train/grad_norm', 'train/grad_value')


def _as_float(value: Any) -> Optional[float]:
    """A logged value as a float (the mean of a tensor: NaN / inf anywhere stay visible)."""
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().mean()) if value.numel() else None
    if isinstance(value, (int, float)):
        return float(value)
    return None


def non_finite_tensors(named: Dict[str, torch.Tensor], limit: int = 10) -> List[str]:
    """Names (up to ``limit``) of floating tensors in ``named`` holding NaN or inf.

    One device synchronisation per device, whatever the number of tensors.

    Args:
        named: Tensors by name (parameters, buffers or a state dict).
        limit: At most this many names are returned.

    Returns:
        The names, in ``named``'s order per device.
    """
    floats = [(k, v) for k, v in named.items()
              if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel()]
    if not floats:
        return []
    by_device: Dict[torch.device, List] = {}
    for key, value in floats:
        by_device.setdefault(value.device, []).append((key, value))
    bad: List[str] = []
    for items in by_device.values():
        flags = torch.stack([torch.isfinite(v.detach()).all() for _, v in items])
        if bool(flags.all()):
            continue
        for (key, _), ok in zip(items, flags.tolist()):
            if not ok:
                bad.append(key)
                if len(bad) >= limit:
                    return bad
    return bad


@HOOKS.register_module()
class CheckFiniteHook(Hook):
    """Raises ``FloatingPointError`` at the first non-finite training quantity.

    Checked after every training iteration, before ``CheckpointHook`` (priority
    ``VERY_LOW``) can rotate or write checkpoints:

    * every logged loss term (keys containing ``loss``) and the total loss;
    * the gradient norm the optimizer wrapper computed for ``clip_grad`` (``train/grad_norm``,
      present when ``clip_grad`` is configured).  With ``AmpOptimWrapper`` a non-finite
      gradient norm is allowed: the loss scaler skips that step and lowers its scale; but a
      scale that fell below ``min_loss_scale`` means step after step was skipped (nothing
      trains while checkpoints keep being written), and stops the run (as fairseq's dynamic
      loss scaler does).  The optimizer steps the scaler really takes are counted too, so
      ``max_skipped_steps`` skipped steps in a row also stop it: a static ``loss_scale``
      never falls;
    * all parameters and floating buffers of the model, when a checkpoint is due at this
      iteration / epoch (so a NaN checkpoint is never written and no good one is deleted
      for it).

    ``before_save_checkpoint`` checks the weights once more (any checkpoint, e.g. ``save_best``).

    Args:
        check_params_every_iter: Also check the parameters after every iteration (one
            reduction over all weights per iteration), not only before checkpoints.
        min_loss_scale: With ``AmpOptimWrapper``: stop when a dynamic loss scale falls below
            this (from the default 65536, about 29 skipped steps without a good one between).
        max_skipped_steps: With ``AmpOptimWrapper``: stop after this many optimizer steps in
            a row that the loss scaler skipped (non-finite gradients), whatever the scale.
            Counted for a single ``AmpOptimWrapper`` only; with an ``OptimWrapperDict`` (no
            mmlinvit config uses one) ``min_loss_scale`` still watches each wrapper's scale.
    """

    priority = 'ABOVE_NORMAL'

    def __init__(self, check_params_every_iter: bool = False,
                 min_loss_scale: float = 1e-4, max_skipped_steps: int = 30) -> None:
        self.check_params_every_iter = check_params_every_iter
        self.min_loss_scale = min_loss_scale
        self.max_skipped_steps = max_skipped_steps
        self._grad_lengths: Dict[str, int] = {}
        self._steps_taken = 0
        self._steps_seen = 0
        self._skipped_in_a_row = 0

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _model(runner) -> torch.nn.Module:
        return runner.model.module if is_model_wrapper(runner.model) else runner.model

    @staticmethod
    def _amp(runner) -> bool:
        wrapper = runner.optim_wrapper
        if isinstance(wrapper, OptimWrapperDict):
            return any(isinstance(w, AmpOptimWrapper) for w in wrapper.values())
        return isinstance(wrapper, AmpOptimWrapper)

    @staticmethod
    def _loss_scales(runner) -> List[float]:
        """The current scales of the dynamic loss scalers of the AMP optimizer wrappers."""
        wrapper = runner.optim_wrapper
        wrappers = wrapper.values() if isinstance(wrapper, OptimWrapperDict) else [wrapper]
        scales = []
        for item in wrappers:
            scaler = getattr(item, 'loss_scaler', None) if isinstance(item,
                                                                      AmpOptimWrapper) else None
            if scaler is not None and scaler.is_enabled():
                scales.append(float(scaler.get_scale()))
        return scales

    @staticmethod
    def _last_checkpoint(runner) -> str:
        # the pointer file, not message_hub['last_ckpt']: mmengine sets that one before the
        # checkpoint is written, i.e. to the file being refused in before_save_checkpoint
        last = last_checkpoint_target(runner.work_dir)
        return f'the last checkpoint, {last}, was written before this' if last else \
            'no checkpoint was written yet'

    def _fail(self, runner, what: str, where: str) -> None:
        precision = ('train in bf16 (--amp --cfg-options optim_wrapper.dtype=bfloat16) or fp32 '
                     '(without --amp)' if self._amp(runner) else
                     'try --amp with a dynamic loss scale')
        raise FloatingPointError(
            f'{what} at {where}; training stopped before anything non-finite was saved '
            f'({self._last_checkpoint(runner)}). Lower the learning rate, enable or tighten '
            f'optim_wrapper.clip_grad, {precision}, or check the inputs of the failing term '
            f'(resume from the last checkpoint with --resume).')

    def _count_optimizer_steps(self, runner) -> None:
        """Counts the optimizer steps an AMP loss scaler really takes (it skips
        ``optimizer.step`` when the gradients are not finite)."""
        wrapper = runner.optim_wrapper
        if not isinstance(wrapper, AmpOptimWrapper):
            return
        optimizer = wrapper.optimizer
        original = optimizer.step
        hook = self

        def counted_step(*args: Any, **kwargs: Any) -> Any:
            hook._steps_taken += 1
            return original(*args, **kwargs)

        optimizer.step = counted_step

    def _check_skipped_steps(self, runner, where: str) -> None:
        wrapper = runner.optim_wrapper
        if not isinstance(wrapper, AmpOptimWrapper) or not wrapper.should_update():
            return  # no step due in this iteration (gradient accumulation)
        if self._steps_taken > self._steps_seen:
            self._steps_seen = self._steps_taken
            self._skipped_in_a_row = 0
            return
        self._skipped_in_a_row += 1
        if self._skipped_in_a_row >= self.max_skipped_steps:
            scales = self._loss_scales(runner)
            raise FloatingPointError(
                f'The AMP loss scaler skipped the last {self._skipped_in_a_row} optimizer '
                f'steps in a row (non-finite gradients; loss scale '
                f'{scales[0] if scales else "?"}) at {where}: the weights have stopped '
                f'changing ({self._last_checkpoint(runner)}). A static '
                f'optim_wrapper.loss_scale does not fall: use loss_scale=\'dynamic\', lower '
                f'the learning rate, enable or tighten optim_wrapper.clip_grad, or train in '
                f'bf16 (--amp --cfg-options optim_wrapper.dtype=bfloat16) or fp32, then '
                f'--resume; custom_hooks CheckFiniteHook max_skipped_steps sets the threshold.')

    def _check_params(self, runner, where: str) -> None:
        model = self._model(runner)
        named = dict(model.named_parameters())
        named.update((k, v) for k, v in model.named_buffers() if k not in named)
        bad = non_finite_tensors(named)
        if bad:
            self._fail(runner, f'Non-finite model weights ({", ".join(bad)})', where)

    def _fresh_grad_values(self, runner) -> Dict[str, float]:
        values = {}
        scalars = runner.message_hub.log_scalars
        for key in GRAD_KEYS:
            if key not in scalars:
                continue
            buffer = scalars[key]
            length = len(buffer.data[0])
            fresh = length != self._grad_lengths.get(key) or length >= buffer.max_length
            self._grad_lengths[key] = length
            if fresh:
                values[key.split('/', 1)[1]] = float(buffer.current())
        return values

    # ------------------------------------------------------------------ hook stages
    def before_train(self, runner) -> None:
        """Remembers how many gradient norms are logged already (a resumed message hub)."""
        scalars = runner.message_hub.log_scalars
        self._grad_lengths = {k: len(scalars[k].data[0]) for k in GRAD_KEYS if k in scalars}
        self._count_optimizer_steps(runner)

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: Any = None,
                         outputs: Optional[dict] = None) -> None:
        """Checks the losses, the gradient norm and (before a checkpoint) the weights."""
        where = f'iteration {runner.iter + 1}'
        bad = []
        for key, value in (outputs or {}).items():
            if 'loss' not in key:
                continue
            number = _as_float(value)
            if number is not None and not math.isfinite(number):
                bad.append(f'{key}={number}')
        if bad:
            self._fail(runner, f'Non-finite loss ({", ".join(bad)})', where)
        if not self._amp(runner):
            for name, number in self._fresh_grad_values(runner).items():
                if not math.isfinite(number):
                    self._fail(runner, f'Non-finite gradient ({name}={number}; the loss was '
                               f'finite, so the backward pass overflowed)', where)
        else:
            self._check_skipped_steps(runner, where)
            low = [scale for scale in self._loss_scales(runner) if scale < self.min_loss_scale]
            if low:
                raise FloatingPointError(
                    f'AMP loss scale {low[0]:.3g} fell below min_loss_scale '
                    f'{self.min_loss_scale:g} at {where}: the scaler skipped step after step '
                    f'because the gradients were not finite, so the weights have stopped '
                    f'changing ({self._last_checkpoint(runner)}). Lower the learning rate, '
                    f'enable or tighten optim_wrapper.clip_grad, or train in bf16 '
                    f'(--amp --cfg-options optim_wrapper.dtype=bfloat16) or fp32, then --resume; '
                    f'custom_hooks CheckFiniteHook min_loss_scale sets the threshold.')
        if self.check_params_every_iter or checkpoint_due(runner, 'iter'):
            self._check_params(runner, where)

    def after_train_epoch(self, runner) -> None:
        """Checks the weights before an epoch checkpoint."""
        if checkpoint_due(runner, 'epoch'):
            self._check_params(runner, f'the end of epoch {runner.epoch + 1}')

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Refuses to write a checkpoint whose weights are not finite.

        With mmengine's ``EMAHook`` the averaged weights (which EMAHook puts into the file's
        ``state_dict`` after this hook, at its lower priority) are checked too.
        """
        bad = non_finite_tensors(checkpoint.get('state_dict', {}))
        if 'ema_state_dict' in checkpoint:  # EMAHook ran first: state_dict is the averaged
            bad += non_finite_tensors(checkpoint['ema_state_dict'])
        else:  # an EMAHook puts its averaged weights in after this hook: check them here
            for module in ema_modules(runner):
                bad += [f'{name} (EMA)' for name in non_finite_tensors(module.state_dict())]
        if bad:
            meta = checkpoint.get('meta', {})
            self._fail(runner, f'Non-finite weights in the checkpoint being saved '
                       f'({", ".join(bad)})', f'iteration {meta.get("iter", runner.iter)}')
