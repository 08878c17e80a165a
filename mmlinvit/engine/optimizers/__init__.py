"""Optimizer-wrapper constructors."""
from .layer_decay_constructor import LayerDecayOptimWrapperConstructor

__all__ = ['LayerDecayOptimWrapperConstructor']
