"""Attention operators with a shared block-level interface (torch only).

Importing this package registers every operator in ``ATTENTION_OPERATORS``: ``softmax``
(teacher), kernel linear attention ``elu`` / ``relu`` / ``hedgehog`` / ``identity``, ``inline``,
``mhla`` and ``ttt``.
"""
from .base import ATTENTION_OPERATORS, AttentionOperator, build_attention_operator
from .inline import InLineAttention
from .kernel_linear import (ELULinearAttention, HedgehogLinearAttention, IdentityLinearAttention,
                            KernelLinearAttention, ReLULinearAttention, signed_safe_denominator)
from .mhla import MultiHeadLinearAttention
from .softmax import SoftmaxAttention
from .ttt import TestTimeTrainingAttention

__all__ = [
    'ATTENTION_OPERATORS', 'AttentionOperator', 'build_attention_operator', 'SoftmaxAttention',
    'KernelLinearAttention', 'ELULinearAttention', 'ReLULinearAttention',
    'HedgehogLinearAttention', 'IdentityLinearAttention', 'signed_safe_denominator',
    'InLineAttention', 'MultiHeadLinearAttention', 'TestTimeTrainingAttention'
]
