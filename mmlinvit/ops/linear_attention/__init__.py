"""Non-causal kernel linear attention: O(N^2) oracle, O(N) PyTorch path, Triton kernel.

The layout of :mod:`mmlinvit.ops.ssd`: ``naive`` / ``torch_impl`` / ``triton_kernel`` /
``checks`` / ``dispatch``, functions ``<op>_naive``, ``<op>_torch``, ``<op>_triton`` with one
contract.  The Triton kernels live in :mod:`.triton_kernel`, which imports triton and is
therefore not imported here; :func:`linear_attention` / :func:`inline_attention` load it when
they choose it.
"""
from .checks import (check_feature_map, check_linear_attention_inputs,
                     kernel_unsupported_reason)
from .dispatch import (BACKEND_ENV_VAR, BACKENDS, inline_attention, linear_attention,
                       select_backend, triton_available)
from .naive import linear_attention_map_naive, linear_attention_naive
from .torch_impl import inline_attention_torch, linear_attention_graph, linear_attention_torch

__all__ = [
    'linear_attention', 'inline_attention', 'select_backend', 'triton_available',
    'BACKEND_ENV_VAR', 'BACKENDS', 'linear_attention_naive', 'linear_attention_map_naive',
    'linear_attention_torch', 'linear_attention_graph', 'inline_attention_torch',
    'check_linear_attention_inputs', 'check_feature_map', 'kernel_unsupported_reason'
]
