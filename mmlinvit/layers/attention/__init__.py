"""Attention operators with a shared block-level interface (torch only)."""
from .base import ATTENTION_OPERATORS, AttentionOperator, build_attention_operator
from .softmax import SoftmaxAttention

__all__ = [
    'ATTENTION_OPERATORS', 'AttentionOperator', 'build_attention_operator', 'SoftmaxAttention'
]
