"""mmlinvit's OpenMMLab registries (scope ``mmlinvit``), children of mmengine's root registries.

Configs that keep ``default_scope='mmseg'`` or ``'mmpretrain'`` can name any mmlinvit component
as ``type='mmlinvit.X'`` without ``custom_imports``: mmengine imports ``mmlinvit.registry`` for
the ``mmlinvit`` scope, and each registry imports its ``locations`` lazily on first lookup.
Only registries that hold something are defined (``tests/test_registry.py`` checks that every
one resolves its locations and is non-empty); mmlinvit uses mmseg's / mmpretrain's metrics,
transforms and model wrappers as they are.
"""
from mmengine.registry import DATA_SAMPLERS as MMENGINE_DATA_SAMPLERS
from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS as MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.registry import Registry

from .log_forwarding import install as _install_log_forwarding

_install_log_forwarding()

#: Backbones, attention operators, distillation losses (all registered by
#: :mod:`mmlinvit.models.register`), the distillation model, connectors, segmentors.
MODELS = Registry('model', parent=MMENGINE_MODELS, scope='mmlinvit', locations=['mmlinvit.models'])
#: Training hooks (distillation-loss schedules, ...).
HOOKS = Registry('hook', parent=MMENGINE_HOOKS, scope='mmlinvit', locations=['mmlinvit.engine'])
#: Optimizer wrapper constructors (layer-wise learning-rate decay).
OPTIM_WRAPPER_CONSTRUCTORS = Registry('optimizer wrapper constructor',
                                      parent=MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS, scope='mmlinvit',
                                      locations=['mmlinvit.engine'])
#: Datasets (tools/train.py's per-sample seeding wrapper, mmlinvit.engine.sample_seeding).
DATASETS = Registry('dataset', parent=MMENGINE_DATASETS, scope='mmlinvit',
                    locations=['mmlinvit.engine'])
#: Data samplers (tools/train.py's per-sample seeding wrapper, mmlinvit.engine.sample_seeding).
DATA_SAMPLERS = Registry('data sampler', parent=MMENGINE_DATA_SAMPLERS, scope='mmlinvit',
                         locations=['mmlinvit.engine'])

# ``_base_ = ['mmseg::...']`` etc. with the OneDL pip names, and ``mmlinvit::`` bases.
from mmlinvit.config_scopes import register_config_scopes  # noqa: E402

register_config_scopes()
