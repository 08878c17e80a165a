"""Output conventions shared by the ViT and Adventurer backbones (torch only)."""
from typing import List, Sequence, Tuple, Union

import torch

#: Output formats: all tokens (B, N, C), the class token (B, C), mean of the patch tokens
#: (B, C), or the patch tokens as an NCHW map.
OUT_TYPES = ('raw', 'cls_token', 'avg_featmap', 'featmap')


def check_out_type(out_type: str) -> None:
    """Raises a KeyError listing :data:`OUT_TYPES` for an unknown ``out_type``."""
    if out_type not in OUT_TYPES:
        raise KeyError(f'Unknown out_type {out_type!r}; available: {OUT_TYPES}')


def resolve_out_indices(out_indices: Union[int, Sequence[int]],
                        num_layers: int,
                        name: str = 'out_indices') -> List[int]:
    """Non-negative block indices from ``out_indices`` (negative counts from the end).

    Args:
        out_indices: One index or a sequence of indices.
        num_layers: Number of blocks.
        name: The argument's name, for the error message.

    Raises:
        IndexError: naming the entry that is out of range.
    """
    if isinstance(out_indices, int):
        out_indices = [out_indices]
    resolved = []
    for idx in out_indices:
        real = idx + num_layers if idx < 0 else idx
        if not 0 <= real < num_layers:
            raise IndexError(f'{name} entry {idx} is out of range for {num_layers} layers')
        resolved.append(real)
    return resolved


def format_tokens(tokens: torch.Tensor, out_type: str, cls_index: int, patch_slice: slice,
                  hw_shape: Tuple[int, int]) -> torch.Tensor:
    """Turns (B, N, C) tokens into ``out_type``.

    Args:
        tokens: All tokens of one block output.
        out_type: One of :data:`OUT_TYPES`.
        cls_index: Position of the class token (0 for ViT, -1 for Adventurer).
        patch_slice: Where the patch tokens are in the sequence.
        hw_shape: (h, w) patch grid, for ``'featmap'``.
    """
    if out_type == 'raw':
        return tokens
    if out_type == 'cls_token':
        return tokens[:, cls_index]
    patches = tokens[:, patch_slice]
    if out_type == 'avg_featmap':
        return patches.mean(dim=1)
    b, _, c = patches.shape
    return patches.transpose(1, 2).reshape(b, c, hw_shape[0], hw_shape[1])
