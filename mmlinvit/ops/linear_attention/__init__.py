"""Non-causal kernel linear attention: O(N^2) reference, O(N) PyTorch path, Triton kernel."""
from .dispatch import inline_attention, linear_attention
from .naive import linear_attention_map_naive, linear_attention_naive
from .torch_impl import linear_attention_torch

__all__ = [
    'linear_attention', 'inline_attention', 'linear_attention_naive',
    'linear_attention_map_naive', 'linear_attention_torch'
]
