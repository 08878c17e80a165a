"""Stops a run whose loaded checkpoint does not give the model its weights: ``tools/test.py``
before it evaluates a model the checkpoint does not cover, ``tools/train.py`` before it trains
a backbone that ``load_from`` gave nothing."""
from typing import Any, Dict

from mmengine.hooks import Hook
from mmengine.model import BaseTTAModel, is_model_wrapper

from mmlinvit.registry import HOOKS

from ..checkpoint_coverage import check_checkpoint_covers, check_training_load_from


@HOOKS.register_module()
class CheckpointCoverageHook(Hook):
    """Refuses a loaded checkpoint that misses weights of the model.

    mmengine's runner loads ``load_from`` with ``strict=False``; this hook sees the checkpoint
    just before it is copied into the model (``after_load_checkpoint``) and raises
    :class:`~mmlinvit.engine.checkpoint_coverage.CheckpointCoverageError` when weights that
    the model needs are absent (:func:`~mmlinvit.engine.checkpoint_coverage.check_checkpoint_covers`).
    ``tools/test.py`` adds it unless the config sets ``check_checkpoint_coverage = False``.

    With ``mode='train'`` (``tools/train.py`` adds it for ``load_from`` when not resuming) it
    refuses only a trainable backbone without ``pretrained=`` that the checkpoint gives less
    than half of its weights
    (:func:`~mmlinvit.engine.checkpoint_coverage.check_training_load_from`): fine-tuning with
    a new head stays allowed.

    Args:
        source: What the checkpoint is, for the message (e.g. its path).
        mode: ``'test'`` (every weight) or ``'train'``.
    """

    priority = 'VERY_HIGH'

    def __init__(self, source: str = 'the checkpoint', mode: str = 'test') -> None:
        if mode not in ('test', 'train'):
            raise ValueError(f"mode must be 'test' or 'train', got {mode!r}")
        self.source = source
        self.mode = mode

    def after_load_checkpoint(self, runner: Any, checkpoint: Dict[str, Any]) -> None:
        """Checks the checkpoint against the (unwrapped) model."""
        model = runner.model
        # DDP wrappers and test-time-augmentation wrappers (--tta) hold the model as .module
        while is_model_wrapper(model) or isinstance(model, BaseTTAModel):
            model = model.module
        if self.mode == 'train':
            check_training_load_from(model, checkpoint, self.source)
        else:
            check_checkpoint_covers(model, checkpoint, self.source)
