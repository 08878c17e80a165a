"""The error raised for distillation set-ups that cannot work (torch only)."""


class DistillationConfigError(ValueError):
    """A distillation set-up names something missing or incompatible.

    Raised while recorders are attached (a module path that does not exist, an index out of
    range, an operator without an attention map) and, in the integration layer, while the
    :class:`~mmlinvit.models.distill.DistillationModel` is built, before any training step,
    with the offending names (recorders, modules, loss arguments, shapes) in the message.
    """
