"""Optimizer-wrapper constructors."""
from .frozen_aware_constructor import FrozenAwareOptimWrapperConstructor
from .layer_decay_constructor import LayerDecayOptimWrapperConstructor

__all__ = ['FrozenAwareOptimWrapperConstructor', 'LayerDecayOptimWrapperConstructor']
