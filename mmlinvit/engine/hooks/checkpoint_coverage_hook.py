"""Stops ``tools/test.py`` before it evaluates a model that its checkpoint does not cover."""
from typing import Any, Dict

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from mmlinvit.registry import HOOKS

from ..checkpoint_coverage import check_checkpoint_covers


@HOOKS.register_module()
class CheckpointCoverageHook(Hook):
    """Refuses a loaded checkpoint that misses weights of the model (evaluation runs).

    mmengine's runner loads ``load_from`` with ``strict=False``; this hook sees the checkpoint
    just before it is copied into the model (``after_load_checkpoint``) and raises
    :class:`~mmlinvit.engine.checkpoint_coverage.CheckpointCoverageError` when weights that
    the model needs are absent (:func:`~mmlinvit.engine.checkpoint_coverage.check_checkpoint_covers`).
    ``tools/test.py`` adds it unless the config sets ``check_checkpoint_coverage = False``.

    Args:
        source: What the checkpoint is, for the message (e.g. its path).
    """

    priority = 'VERY_HIGH'

    def __init__(self, source: str = 'the checkpoint') -> None:
        self.source = source

    def after_load_checkpoint(self, runner: Any, checkpoint: Dict[str, Any]) -> None:
        """Checks the checkpoint against the (unwrapped) model."""
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        check_checkpoint_covers(model, checkpoint, self.source)
