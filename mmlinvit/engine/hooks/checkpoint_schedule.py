"""Whether the runner's ``CheckpointHook`` saves a checkpoint at the current step.

Hooks that must act *before* a checkpoint is written (and before ``CheckpointHook`` rotates
old ones away with ``max_keep_ckpts``) run with a higher priority in the same stage and ask
:func:`checkpoint_due`; the test mirrors ``CheckpointHook.after_train_iter`` /
``after_train_epoch`` (interval, ``save_begin``, ``save_last``).
"""
from typing import List

from mmengine.hooks import CheckpointHook


def checkpoint_hooks(runner) -> List[CheckpointHook]:
    """The runner's ``CheckpointHook`` instances (usually one).

    Args:
        runner: The runner.
    """
    return [hook for hook in runner.hooks if isinstance(hook, CheckpointHook)]


def checkpoint_due(runner, stage: str) -> bool:
    """Whether a ``CheckpointHook`` of ``runner`` saves at the end of this iteration / epoch.

    Args:
        runner: The runner, inside ``after_train_iter`` or ``after_train_epoch``.
        stage: ``'iter'`` or ``'epoch'``.

    Returns:
        True when a checkpoint will be written in this stage.
    """
    for hook in checkpoint_hooks(runner):
        interval = hook.interval
        if stage == 'iter' and not hook.by_epoch:
            if (interval > 0 and hook.every_n_train_iters(runner, interval, hook.save_begin)) \
                    or (hook.save_last and hook.is_last_train_iter(runner)):
                return True
        if stage == 'epoch' and hook.by_epoch:
            if (interval > 0 and hook.every_n_epochs(runner, interval, hook.save_begin)) \
                    or (hook.save_last and hook.is_last_train_epoch(runner)):
                return True
    return False
