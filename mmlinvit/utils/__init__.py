"""Small utilities shared by every layer of mmlinvit.

``name_registry`` needs only the standard library; ``benchmarking`` (the tools' timing, size
parsing and error helpers) needs torch and is imported on its own
(``from mmlinvit.utils.benchmarking import ...``).
"""
from .name_registry import NameRegistry

__all__ = ['NameRegistry']
