"""A dependency-free name -> class registry.

The low-level parts of mmlinvit (operators, transfer strategies) must import with torch
alone, so they cannot use mmengine's ``Registry``.  ``NameRegistry`` gives them the same
``register_module`` / ``build`` shape, and the OpenMMLab integration layer mirrors every
entry into mmengine's registries (see :mod:`mmlinvit.registry`).
"""
from typing import Any, Callable, Dict, Optional, Union


class NameRegistry:
    """Maps names to classes (or factories) and builds them from config dicts.

    Args:
        kind: What the registry holds, used in error messages (e.g. ``'attention operator'``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: Dict[str, Callable] = {}

    def register_module(self, name: Optional[str] = None,
                        module: Optional[Callable] = None) -> Callable:
        """Registers ``module`` under ``name``; usable as a decorator.

        Args:
            name: Registered name; defaults to the class name.
            module: The class to register (when not used as a decorator).
        """

        def _register(cls: Callable) -> Callable:
            key = name or cls.__name__
            if key in self._entries and self._entries[key] is not cls:
                raise KeyError(f'{self.kind} {key!r} is already registered '
                               f'to {self._entries[key]!r}')
            self._entries[key] = cls
            return cls

        if module is not None:
            return _register(module)
        return _register

    @property
    def plural(self) -> str:
        """``kind`` in the plural, for messages (``'strategy'`` -> ``'strategies'``)."""
        if self.kind.endswith('y') and self.kind[-2:-1] not in tuple('aeiou'):
            return self.kind[:-1] + 'ies'
        return self.kind + 's'

    @property
    def names(self) -> list:
        """Sorted registered names."""
        return sorted(self._entries)

    def items(self):
        """(name, class) pairs."""
        return self._entries.items()

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def get(self, name: str) -> Callable:
        """Returns the class registered as ``name``.

        Raises:
            KeyError: naming the unknown entry and listing the registered ones.
            TypeError: ``name`` is not a string (e.g. a class given as ``type``).
        """
        if not isinstance(name, str):
            raise TypeError(f'A {self.kind} type must be the registered name of one (one of '
                            f'{", ".join(self.names)}), got {name!r}')
        if name.startswith('mmlinvit.'):
            name = name[len('mmlinvit.'):]
        if name not in self._entries:
            raise KeyError(f'Unknown {self.kind} {name!r}. Registered {self.plural}: '
                           f'{", ".join(self.names)}.')
        return self._entries[name]

    def build(self, cfg: Union[str, dict], **defaults: Any) -> Any:
        """Builds an entry from ``'name'`` or ``dict(type='name', **kwargs)``.

        Args:
            cfg: The name or a config dict with a ``type`` key.
            **defaults: Keyword arguments used where ``cfg`` does not set them.
        """
        if isinstance(cfg, str):
            cfg = dict(type=cfg)
        if not isinstance(cfg, dict) or 'type' not in cfg:
            raise TypeError(f'A {self.kind} config must be a name or a dict with '
                            f'a "type" key, got {cfg!r}')
        kwargs = dict(defaults)
        kwargs.update({k: v for k, v in cfg.items() if k != 'type'})
        return self.get(cfg['type'])(**kwargs)
