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


#: Names of mmengine's checkpoint initialiser: registered as ``'Pretrained'``, its class is
#: ``PretrainedInit`` (what a pure-Python config gives as ``type``).
PRETRAINED_INIT_NAMES = ('Pretrained', 'PretrainedInit')


def is_pretrained_init(init_cfg: Any) -> bool:
    """Whether ``init_cfg`` is mmengine's ``Pretrained`` initialiser (it loads a file), spelled
    as a name, a scoped name (``'mmengine.Pretrained'``) or the class.

    Args:
        init_cfg: One ``init_cfg`` entry (anything: only a dict can be one).
    """
    return (isinstance(init_cfg, dict)
            and config_type_name(init_cfg.get('type')) in PRETRAINED_INIT_NAMES)
