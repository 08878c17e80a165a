"""mmlinvit: turn pretrained softmax ViTs into linear-complexity vision models."""
from ._config_scope_hook import install as _install_config_scope_hook

__version__ = '0.1.0'

# `mmseg::` / `mmpretrain::` / `mmdet::` / `mmlinvit::` config bases work after `import
# mmlinvit`; registration happens when (and only if) mmengine's config module is imported.
_install_config_scope_hook()
