"""Switches off or ramps distillation terms at given iterations / epochs."""
import logging
from typing import Optional, Sequence, Union

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.runner import IterBasedTrainLoop

from mmlinvit.registry import HOOKS


@HOOKS.register_module()
class DistillLossScheduleHook(Hook):
    """Scales distillation terms of a ``DistillationModel`` over training (mmrazor's
    ``StopDistillHook``, generalised to ramps).

    The factor at position t (iteration, or epoch with ``by_epoch=True``) is
    ``start_factor`` before ``begin``, ``end_factor`` from ``end`` on and linear in between;
    ``end=None`` (or ``end == begin``) is a switch at ``begin``.  The factor multiplies the
    term's weighted loss (``distill.loss_<term>``); the logged gap is unaffected.  The factor
    is recomputed from the runner's position every step, so resuming reproduces it exactly.

    Examples::

        # stop the attention term after 10 epochs
        dict(type='mmlinvit.DistillLossScheduleHook', terms='attn_out', by_epoch=True,
             begin=10, start_factor=1.0, end_factor=0.0)
        # ramp the masked-prediction term in over the first 1000 iterations
        dict(type='mmlinvit.DistillLossScheduleHook', terms=['mask'], begin=0, end=1000,
             start_factor=0.0, end_factor=1.0)

    Args:
        terms: Term name(s) in the model's ``distill_losses``.
        begin: Position where the change starts.
        end: Position where it is complete (``None``: a switch at ``begin``).
        start_factor: Factor before ``begin``.
        end_factor: Factor from ``end`` on.
        by_epoch: Count epochs instead of iterations.
    """

    priority = 'NORMAL'

    def __init__(self,
                 terms: Union[str, Sequence[str]],
                 begin: int,
                 end: Optional[int] = None,
                 start_factor: float = 1.0,
                 end_factor: float = 0.0,
                 by_epoch: bool = False) -> None:
        self.terms = [terms] if isinstance(terms, str) else list(terms)
        if not self.terms:
            raise ValueError('DistillLossScheduleHook needs at least one term')
        end = begin if end is None else end
        if begin < 0 or end < begin:
            raise ValueError(f'DistillLossScheduleHook needs 0 <= begin <= end, got '
                             f'begin={begin}, end={end}')
        self.begin = begin
        self.end = end
        self.start_factor = float(start_factor)
        self.end_factor = float(end_factor)
        self.by_epoch = by_epoch

    def factor(self, position: int) -> float:
        """The factor at an iteration / epoch."""
        if position < self.begin:
            return self.start_factor
        if position >= self.end:
            return self.end_factor
        frac = (position - self.begin) / (self.end - self.begin)
        return self.start_factor + frac * (self.end_factor - self.start_factor)

    @staticmethod
    def _model(runner):
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        if not callable(getattr(model, 'set_distill_scale', None)):
            raise TypeError(f'DistillLossScheduleHook needs a mmlinvit.DistillationModel, the '
                            f'runner trains a {type(model).__name__}')
        return model

    def _apply(self, runner, position: int) -> None:
        model = self._model(runner)
        value = self.factor(position)
        for term in self.terms:
            model.set_distill_scale(term, value)
            runner.message_hub.update_scalar(f'train/distill.scale_{term}', value)

    def before_train(self, runner) -> None:
        """Checks the terms exist (KeyError lists the model's terms) and the unit of the
        positions, and sets the factor.

        Raises:
            ValueError: ``by_epoch=True`` in an iteration-based loop (its epoch stays 0: the
                factor would never change).
        """
        if self.by_epoch and isinstance(runner.train_loop, IterBasedTrainLoop):
            raise ValueError(
                f'DistillLossScheduleHook(by_epoch=True, begin={self.begin}) in an '
                f'iteration-based loop ({type(runner.train_loop).__name__}), whose epoch stays '
                f'0: the factor would stay {self.start_factor}. Give begin / end in '
                f'iterations with by_epoch=False.')
        length = runner.max_epochs if self.by_epoch else runner.max_iters
        if self.begin >= length:
            unit = 'epochs' if self.by_epoch else 'iterations'
            print_log(f'DistillLossScheduleHook: begin={self.begin} is not before the run\'s '
                      f'end ({length} {unit}): {self.terms} keep the factor '
                      f'{self.start_factor} for the whole run.', logger='current',
                      level=logging.WARNING)
        self._apply(runner, runner.epoch if self.by_epoch else runner.iter)

    def before_train_epoch(self, runner) -> None:
        if self.by_epoch:
            self._apply(runner, runner.epoch)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if not self.by_epoch:
            self._apply(runner, runner.iter)
