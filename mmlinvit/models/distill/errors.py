"""The error raised for distillation configs that cannot work (at build time)."""


class DistillationConfigError(ValueError):
    """A distillation config names something missing or incompatible.

    Raised while the :class:`~mmlinvit.models.distill.DistillationModel` is built, before
    any training step, with the offending names (recorders, modules, loss arguments, shapes)
    in the message.
    """
