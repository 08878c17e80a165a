"""Registers mmlinvit's config scopes as soon as mmengine's config module is imported.

``import mmlinvit`` must stay free of OpenMMLab (the low-level layers import with torch alone),
yet ``_base_ = ['mmseg::...']`` / ``['mmlinvit::...']`` should work in Python after
``import mmlinvit``.  :func:`install` therefore adds a meta-path finder that waits for
``mmengine.config`` to be imported (by anyone, at any later time) and then calls
:func:`mmlinvit.config_scopes.register_config_scopes`.  If ``mmengine.config`` is already
imported, the scopes are registered at once.  Nothing is imported that the user did not import.
"""
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Optional, Sequence

_TRIGGER = 'mmengine.config'


def _register() -> None:
    scopes = sys.modules.get('mmlinvit.config_scopes')
    if scopes is not None and not hasattr(scopes, 'register_config_scopes'):
        # ``mmlinvit.config_scopes`` imported mmengine.config itself (it was the first import
        # of the process): importing it again here is circular; it registers at its end.
        return
    from mmlinvit.config_scopes import register_config_scopes
    register_config_scopes()


class _RegisterAfterExec(importlib.abc.Loader):
    """Runs the original loader, then registers the scopes."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _register()


class ConfigScopeFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder that wraps the loader of ``mmengine.config`` (and nothing else).

    It asks the other finders for the spec and answers nothing while it is asking, so that a
    second finder of this kind (another copy of mmlinvit loaded in the process, e.g. an
    installed one and a source tree on ``PYTHONPATH``) does not ask it back without end.
    """

    def __init__(self) -> None:
        self._searching = False

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None
                  ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != _TRIGGER or self._searching:
            return None
        self._searching = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, 'find_spec'):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None:
                        spec.loader = _RegisterAfterExec(spec.loader)
                    return spec
            return None
        finally:
            self._searching = False


def install() -> None:
    """Registers now if ``mmengine.config`` is loaded, else once it is (idempotent)."""
    if _TRIGGER in sys.modules:
        _register()
        return
    if not any(isinstance(f, ConfigScopeFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, ConfigScopeFinder())
