"""The error raised for distillation configs that cannot work (at build time).

Defined in the torch-only :mod:`mmlinvit.distill.errors` (recorders raise it too) and
re-exported here, so both import paths name one class.
"""
from mmlinvit.distill.errors import DistillationConfigError

__all__ = ['DistillationConfigError']
