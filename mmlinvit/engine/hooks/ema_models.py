"""The averaged models of a runner's ``EMAHook`` instances.

Hooks that must see what a checkpoint will hold (``CheckFiniteHook``) or keep it consistent
over processes (``SyncNormStatsHook``) look at these too: with mmengine's ``EMAHook`` the
checkpoint's ``state_dict`` is the averaged model.
"""
from typing import List

import torch.nn as nn
from mmengine.hooks import EMAHook


def ema_modules(runner) -> List[nn.Module]:
    """The averaged modules of the runner's ``EMAHook`` instances (built in ``before_run``).

    Args:
        runner: The runner.

    Returns:
        One module per ``EMAHook`` that has built its averaged model.
    """
    return [hook.ema_model.module for hook in runner.hooks
            if isinstance(hook, EMAHook) and hasattr(hook, 'ema_model')]
