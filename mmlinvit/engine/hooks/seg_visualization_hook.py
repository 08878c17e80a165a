"""mmseg's ``SegVisualizationHook`` whose test-time drawing honours ``interval``."""
from typing import Sequence

from mmseg.engine.hooks import SegVisualizationHook as MMSegVisualizationHook

from mmlinvit.registry import HOOKS


@HOOKS.register_module()
class SegVisualizationHook(MMSegVisualizationHook):
    """Draws every ``interval``-th test sample (mmseg's hook draws all of them in testing and
    reads ``interval`` only in validation).  ``tools/test.py --show-dir D --interval N`` uses
    it for mmseg configs; with ``interval=1`` it draws what mmseg's hook draws.

    Args:
        *args: mmseg ``SegVisualizationHook`` arguments.
        **kwargs: mmseg ``SegVisualizationHook`` keyword arguments.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(self.interval, bool) or not isinstance(self.interval, int) or \
                self.interval < 1:
            raise ValueError(f'SegVisualizationHook: interval must be a positive integer (draw '
                             f'every interval-th sample; tools/test.py --interval N), got '
                             f'{self.interval!r}')
        self._test_seen = 0

    def after_test_iter(self, runner, batch_idx: int, data_batch: dict,
                        outputs: Sequence) -> None:
        kept = []
        for sample in outputs:
            if self._test_seen % self.interval == 0:
                kept.append(sample)
            self._test_seen += 1
        if kept:
            super().after_test_iter(runner, batch_idx, data_batch, kept)
