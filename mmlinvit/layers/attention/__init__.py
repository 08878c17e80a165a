"""Attention operators with a shared block-level interface (torch only).

Importing this package registers every operator in ``ATTENTION_OPERATORS``: ``softmax``
(teacher), kernel linear attention ``elu`` / ``relu`` / ``hedgehog`` / ``identity``, ``inline``,
``mhla`` and ``ttt``.
"""
from mmlinvit.ops.signed_normaliser import signed_safe_denominator
from .base import (ATTENTION_OPERATORS, KERNEL_BACKEND_CHOICES, AttentionOperator,
                   build_attention_operator, check_kernel_backend)
from .inline import InLineAttention
from .kernel_linear import (ELULinearAttention, HedgehogLinearAttention, IdentityLinearAttention,
                            KernelLinearAttention, ReLULinearAttention)
from .mhla import MultiHeadLinearAttention
from .softmax import SoftmaxAttention
from .ttt import TestTimeTrainingAttention

__all__ = [
    'ATTENTION_OPERATORS', 'AttentionOperator', 'build_attention_operator', 'SoftmaxAttention',
    'KERNEL_BACKEND_CHOICES', 'check_kernel_backend',
    'KernelLinearAttention', 'ELULinearAttention', 'ReLULinearAttention',
    'HedgehogLinearAttention', 'IdentityLinearAttention', 'signed_safe_denominator',
    'InLineAttention', 'MultiHeadLinearAttention', 'TestTimeTrainingAttention'
]
