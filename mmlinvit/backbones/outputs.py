"""Output conventions shared by the ViT and Adventurer backbones (torch only)."""
from typing import List, Sequence, Tuple, Union

import torch

#: Output formats: all tokens (B, N, C), the class token (B, C), mean of the patch tokens
#: (B, C), the patch tokens as an NCHW map, or DINOv2's linear-evaluation input
#: (``'cls_avg'``, see :func:`combine_outputs`).
OUT_TYPES = ('raw', 'cls_token', 'avg_featmap', 'featmap', 'cls_avg')

#: Output formats that read the class token.
CLS_OUT_TYPES = ('cls_token', 'cls_avg')


def check_out_type(out_type: str) -> None:
    """Raises a KeyError listing :data:`OUT_TYPES` for an unknown ``out_type``."""
    if out_type not in OUT_TYPES:
        raise KeyError(f'Unknown out_type {out_type!r}; available: {OUT_TYPES}')


def check_output_setting(out_type: str, out_indices: Sequence[int], num_layers: int,
                         has_cls_token: bool, norm_all_outputs: bool) -> None:
    """Refuses ``out_type`` settings that cannot give what they name.

    ``'cls_avg'`` needs a class token, and every block it reads normalised by the final
    norm (as DINOv2's ``get_intermediate_layers(..., norm=True)``): with more than one
    ``out_indices`` entry, or one that is not the last block, ``norm_all_outputs=True``.

    Args:
        out_type: One of :data:`OUT_TYPES`.
        out_indices: Resolved (non-negative) block indices.
        num_layers: Number of blocks.
        has_cls_token: Whether the model has a class token.
        norm_all_outputs: Whether every returned block is normalised.

    Raises:
        ValueError: naming the setting that fixes it.
    """
    check_out_type(out_type)
    if out_type in CLS_OUT_TYPES and not has_cls_token:
        raise ValueError(
            f'out_type={out_type!r} reads the class token, but this model has none '
            f'(with_cls_token=False, e.g. the MHLA / TTT paper setting); use '
            f"out_type='avg_featmap' (mean of the patch tokens), or build the model with "
            f'with_cls_token=True')
    if out_type != 'cls_avg':
        return
    if not norm_all_outputs and list(out_indices) != [num_layers - 1]:
        raise ValueError(
            f"out_type='cls_avg' with out_indices={list(out_indices)} reads blocks before the "
            f'last one, which are returned unnormalised unless norm_all_outputs=True; '
            f"DINOv2's linear evaluation (get_intermediate_layers(..., norm=True)) applies the "
            f'final norm to every block it reads: set norm_all_outputs=True')


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
        out_type: One of :data:`OUT_TYPES`.  ``'cls_avg'`` gives one block's
            ``[class token, mean of the patch tokens]`` (B, 2 * C), which
            :func:`combine_outputs` merges over the returned blocks.
        cls_index: Position of the class token (0 for ViT, -1 for Adventurer).
        patch_slice: Where the patch tokens are in the sequence (registers and class token
            excluded).
        hw_shape: (h, w) patch grid, for ``'featmap'``.
    """
    if out_type == 'raw':
        return tokens
    if out_type == 'cls_token':
        return tokens[:, cls_index]
    patches = tokens[:, patch_slice]
    if out_type == 'avg_featmap':
        return patches.mean(dim=1)
    if out_type == 'cls_avg':
        return torch.cat([tokens[:, cls_index], patches.mean(dim=1)], dim=-1)
    b, _, c = patches.shape
    return patches.transpose(1, 2).reshape(b, c, hw_shape[0], hw_shape[1])


def combine_outputs(outs: Sequence[torch.Tensor], out_type: str) -> Tuple[torch.Tensor, ...]:
    """The backbone's return value from the formatted outputs of the ``out_indices`` blocks.

    Every ``out_type`` but ``'cls_avg'`` returns one tensor per block.  ``'cls_avg'`` returns
    ONE tensor, DINOv2's linear-classifier input (``create_linear_input(x_tokens_list,
    use_n_blocks=len(outs), use_avgpool=True)`` of ``dinov2/eval/linear.py``, and the hub's
    ``dinov2_vit*14_lc`` heads):
    ``cat([cls_1, ..., cls_n, mean(patch tokens of block n)])``, (B, (n + 1) * C), the
    blocks in depth order, so that a head reading the last feature (mmpretrain's
    ``LinearClsHead``, ``in_channels=(n + 1) * C``) gets it.

    Args:
        outs: Formatted outputs (:func:`format_tokens`), in depth order.
        out_type: One of :data:`OUT_TYPES`.

    Returns:
        The tuple the backbone's ``forward`` returns.
    """
    if out_type != 'cls_avg':
        return tuple(outs)
    c = outs[-1].shape[-1] // 2
    return (torch.cat([out[:, :c] for out in outs] + [outs[-1][:, c:]], dim=-1), )
