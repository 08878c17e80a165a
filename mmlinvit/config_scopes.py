"""Cross-package config inheritance: ``_base_ = ['mmseg::...']``, ``['mmlinvit::...']``.

mmengine resolves ``scope::path`` bases through ``mmengine.config.utils.MODULE2PACKAGE``, a
map from the scope (import name) to the pip distribution whose installed files hold
``<module>/.mim/configs``.  Its built-in entries name the upstream distributions
(``mmseg -> mmsegmentation``), so with the maintained OneDL forks (``onedl-mmsegmentation``,
``onedl-mmpretrain``, ``onedl-mmdetection``) ``mmseg::`` fails with "mmsegmentation is not
installed".  :func:`register_config_scopes` points each scope at the distribution that is
actually installed (:data:`SCOPE_DISTRIBUTIONS`, first installed candidate wins) and adds the
``mmlinvit`` scope, whose configs ship inside the package as ``mmlinvit/.mim/configs`` (copied
by ``setup.py`` into wheels, a symbolic link to the repository's ``configs/`` in editable
installs) together with ``mmlinvit/.mim/model-index.yml``.

Scope of inherited mmlinvit configs.  mmengine tags every typed dict of a ``scope::`` base with
``_scope_=<scope>`` so that it is built in that package's registries.  mmlinvit's configs are
not written for an ``mmlinvit`` registry tree: they name mmseg / mmpretrain components plainly
and mmlinvit ones as ``mmlinvit.X`` under their own ``default_scope``.  So a ``mmlinvit::``
base is tagged with the ``default_scope`` the base config itself declares (``'mmseg'`` or
``'mmpretrain'``), exactly as an ``mmseg::`` base is tagged ``'mmseg'``; a base without a
``default_scope`` (e.g. ``mmlinvit::_base_/models/upernet_vit.py``) is left untagged and is
built in the inheriting config's scope.  This is done by wrapping
``mmengine.config.Config._get_cfg_path`` once (:func:`register_config_scopes`).

Called as soon as both ``mmlinvit`` and ``mmengine.config`` are imported (in either order:
:mod:`mmlinvit._config_scope_hook`), on importing this module, and by every tool before a
config is read.  Plain ``import mmlinvit`` imports no OpenMMLab package itself.
"""
import os.path as osp
from importlib.metadata import PackageNotFoundError, distribution
from typing import Callable, Dict, Optional, Tuple

from mmengine.config import Config
from mmengine.config import utils as config_utils
from mmengine.utils import get_installed_path

#: scope -> pip distributions that provide it, preferred first (the OneDL forks are the
#: pinned stack; the upstream names keep working for users of the original packages).
SCOPE_DISTRIBUTIONS: Dict[str, Tuple[str, ...]] = {
    'mmseg': ('onedl-mmsegmentation', 'mmsegmentation'),
    'mmpretrain': ('onedl-mmpretrain', 'mmpretrain'),
    'mmdet': ('onedl-mmdetection', 'mmdet'),
}

#: The scope of this package's shipped configs.
MMLINVIT_SCOPE = 'mmlinvit'

_WRAPPED_MARK = '_mmlinvit_scope_wrapper'


def installed_distribution(candidates: Tuple[str, ...]) -> Optional[str]:
    """The first of ``candidates`` that is an installed pip distribution.

    Args:
        candidates: Distribution names, preferred first.

    Returns:
        The installed name, or None when none is installed.
    """
    for name in candidates:
        try:
            distribution(name)
        except PackageNotFoundError:
            continue
        return name
    return None


class ConfigsNotInstalledError(FileNotFoundError):
    """``mmlinvit::`` bases read from a checkout that was not installed (the message says how)."""


def mmlinvit_config_root() -> str:
    """Directory that ``mmlinvit::PATH`` bases are read from (``<package>/.mim/configs``).

    Returns:
        The directory.

    Raises:
        ConfigsNotInstalledError: The package was not installed through ``setup.py`` (e.g. only
            put on ``PYTHONPATH``), so its configs are not linked / copied into the package.
    """
    package_dir = get_installed_path(config_utils.MODULE2PACKAGE[MMLINVIT_SCOPE])
    mim = osp.join(package_dir, '.mim')
    missing = [p for p in (osp.join(mim, 'configs'), osp.join(mim, 'model-index.yml'))
               if not osp.exists(p)]
    if missing:
        raise ConfigsNotInstalledError(
            f'mmlinvit:: configs are not installed: {missing} missing. They are put there by '
            f"mmlinvit's setup.py: reinstall with `pip install -e <mmlinvit repo>` (editable, "
            f'links the repository configs) or `pip install <mmlinvit repo>` (copies them), '
            f'e.g. `bash tools/install.sh`.')
    return osp.join(mim, 'configs')


def _declared_default_scope(path: str) -> Optional[str]:
    """``default_scope`` of a config file (after its own bases), or None."""
    cfg = Config.fromfile(path, import_custom_modules=False, format_python_code=False)
    return cfg.get('default_scope', None)


def _wrap_get_cfg_path(original: Callable[[str, str], Tuple[str, Optional[str]]]) -> Callable:
    """Wraps ``Config._get_cfg_path`` so ``mmlinvit::`` bases get their declared scope."""

    def get_cfg_path(cfg_path: str, filename: str) -> Tuple[str, Optional[str]]:
        if cfg_path.partition('::')[0] == MMLINVIT_SCOPE and '::' in cfg_path:
            mmlinvit_config_root()  # clear error when the configs are not installed
            path, _ = original(cfg_path, filename)
            return path, _declared_default_scope(path)
        return original(cfg_path, filename)

    setattr(get_cfg_path, _WRAPPED_MARK, original)
    return get_cfg_path


def register_config_scopes() -> Dict[str, str]:
    """Lets ``scope::path`` bases of mmseg, mmpretrain, mmdet and mmlinvit resolve.

    Idempotent.  For every scope in :data:`SCOPE_DISTRIBUTIONS` with an installed candidate,
    sets ``mmengine.config.utils.MODULE2PACKAGE[scope]`` to it (the dict mmengine's config,
    registry and inferencer code share); scopes with no installed candidate are left as they
    are, so mmengine's own "X is not installed" error names the upstream package.  Adds
    ``MODULE2PACKAGE['mmlinvit'] = 'mmlinvit'``.  Also wraps
    ``Config._get_cfg_path`` once so ``mmlinvit::`` bases are built in their declared
    ``default_scope`` (module docstring).

    Returns:
        The scopes registered here, scope -> distribution.
    """
    registered = {}
    for scope, candidates in SCOPE_DISTRIBUTIONS.items():
        dist = installed_distribution(candidates)
        if dist is not None:
            config_utils.MODULE2PACKAGE[scope] = dist
            registered[scope] = dist
    # This module runs, so the package is importable; mmengine finds an importable module
    # that is no pip distribution (a PYTHONPATH checkout) through ``find_spec``, where
    # :func:`mmlinvit_config_root` then explains that the configs are not installed.
    config_utils.MODULE2PACKAGE[MMLINVIT_SCOPE] = 'mmlinvit'
    registered[MMLINVIT_SCOPE] = 'mmlinvit'
    current = Config.__dict__['_get_cfg_path']
    current = current.__func__ if isinstance(current, staticmethod) else current
    if not hasattr(current, _WRAPPED_MARK):
        Config._get_cfg_path = staticmethod(_wrap_get_cfg_path(current))
    return registered


# Importing this module registers (see the module docstring); when this module's own import of
# mmengine.config fired the hook of ``import mmlinvit``, the hook left it to this line.
register_config_scopes()
