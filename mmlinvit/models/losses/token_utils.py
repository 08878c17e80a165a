"""Token bookkeeping, re-exported from :mod:`mmlinvit.distill.losses.token_utils`."""
from mmlinvit.distill.losses.token_utils import (TensorOrSeq, TokenLayout, as_tensor_list,
                                                 check_layout, check_same_length,
                                                 check_same_shape, patch_tokens,
                                                 reduce_over_records)

__all__ = [
    'TensorOrSeq', 'TokenLayout', 'as_tensor_list', 'check_layout', 'check_same_length',
    'check_same_shape', 'patch_tokens', 'reduce_over_records'
]
