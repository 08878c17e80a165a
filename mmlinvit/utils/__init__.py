"""Small torch-free utilities shared by every layer of mmlinvit."""
from .name_registry import NameRegistry

__all__ = ['NameRegistry']
