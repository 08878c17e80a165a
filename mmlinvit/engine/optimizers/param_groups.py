"""Optimizer parameter groups as plain dicts.

mmengine's constructors hand the optimizer its ``params`` inside the ``ConfigDict`` of the
optimizer config, so with a ``paramwise_cfg`` every parameter group is a ``ConfigDict``.
``torch.compile`` (mmengine's ``compile=True``, which compiles ``train_step`` with the
optimizer step in it) cannot trace the optimizer over those: every shipped config stopped at
its first step with "'UserDefinedDictVariable' object has no attribute 'items'", naming
neither compile nor the groups.  Plain dicts hold the same values.
"""
from mmengine.optim import OptimWrapper


def make_param_groups_plain(wrapper: OptimWrapper) -> OptimWrapper:
    """Replaces the optimizer's parameter groups by plain ``dict`` copies (in place).

    Called before any step, so no optimizer state refers to the groups.

    Args:
        wrapper: A freshly built optimizer wrapper.

    Returns:
        The same wrapper.
    """
    optimizer = wrapper.optimizer
    optimizer.param_groups = [
        {key: (list(value) if key == 'params' else value) for key, value in group.items()}
        for group in optimizer.param_groups
    ]
    return wrapper
