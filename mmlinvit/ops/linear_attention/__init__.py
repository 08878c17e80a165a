"""Non-causal kernel linear attention: O(N^2) reference, O(N) PyTorch path, Triton kernel.

The Triton kernels live in :mod:`.fused`, which imports triton and is therefore not imported
here; :func:`linear_attention` / :func:`inline_attention` load it when they choose it.
"""
from .dispatch import (BACKEND_ENV_VAR, inline_attention, linear_attention, select_backend,
                       triton_available)
from .naive import linear_attention_map_naive, linear_attention_naive
from .torch_impl import (inline_attention_torch, linear_attention_chunked, linear_attention_graph,
                         linear_attention_torch)

__all__ = [
    'linear_attention', 'inline_attention', 'select_backend', 'triton_available',
    'BACKEND_ENV_VAR', 'linear_attention_naive', 'linear_attention_map_naive',
    'linear_attention_torch', 'linear_attention_chunked', 'linear_attention_graph',
    'inline_attention_torch'
]
