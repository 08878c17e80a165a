"""The class name a config ``type`` entry names, however the config spells it."""
from typing import Any


def config_type_name(type_: Any) -> str:
    """The class name a config ``type`` names, without its scope.

    Args:
        type_: A config's ``type`` value: a registered name (``'UPerHead'``), a scoped one
            (``'mmseg.UPerHead'``) or the class itself (pure-Python configs).

    Returns:
        ``'UPerHead'`` for each of those; ``''`` for anything else (a missing type).
    """
    if isinstance(type_, type):
        return type_.__name__
    return type_.split('.')[-1] if isinstance(type_, str) else ''
