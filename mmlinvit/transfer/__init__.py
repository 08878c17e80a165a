"""Weight transfer from a softmax teacher ViT into a linearized student (torch only).

Strategies (``TRANSFER_STRATEGIES``; CamelCase aliases from the papers in brackets):
``random`` (Random), ``copy`` (Copy), ``mlp_copy`` (MLPCopy), ``full_copy`` (FullCopy),
``mimetic`` (Mimetic), ``impulse`` (Impulse).  Use :func:`transfer_weights`.
"""
from .base import (TRANSFER_STRATEGIES, AttentionInitStrategy, TransferReport, TransferStrategy,
                   TransferStructureError, build_transfer_strategy, check_compatible,
                   check_transfer_structure, pair_state_dicts, transfer_weights,
                   unplaced_tensors)
from .copy_strategies import FullCopy, MLPCopy, QKVCopy, RandomInit
from .impulse import DEFAULT_IMPULSE_CACHE, ImpulseInit, fit_impulse_bank, impulse_peak_fraction
from .mimetic import MimeticInit, mimetic_targets, split_low_rank

__all__ = [
    'TRANSFER_STRATEGIES', 'TransferReport', 'TransferStrategy', 'AttentionInitStrategy',
    'TransferStructureError', 'build_transfer_strategy', 'check_compatible',
    'check_transfer_structure', 'unplaced_tensors', 'pair_state_dicts', 'transfer_weights',
    'RandomInit', 'QKVCopy', 'MLPCopy', 'FullCopy', 'MimeticInit', 'mimetic_targets',
    'split_low_rank', 'ImpulseInit', 'fit_impulse_bank', 'impulse_peak_fraction',
    'DEFAULT_IMPULSE_CACHE'
]
