"""Per-query attention maps of ViT operators and activation maps of Adventurer (torch only).

For a query patch at grid position (row, col):

* :func:`query_attention_maps` returns, per chosen layer of a
  :class:`~mmlinvit.backbones.VisionTransformer`, the row of that layer's (B, H, N, N)
  attention map for the query token, restricted to the patch tokens and reshaped to the
  (h, w) grid: the softmax map for the teacher, the *implied* map of a linear operator
  (``AttentionOperator.attention_map``: kernel LA, InLine, MHLA...) for the student.  Heads are
  averaged, or one head is taken.  The map is built from the operator's own input (the block's
  normalised tokens, captured by a forward pre-hook on ``blocks[i].attn``), so it is exactly
  the map the operator applies in that forward.  Building it is O(N^2) (analysis only).
* :func:`activation_similarity_maps` returns, per chosen block of an
  :class:`~mmlinvit.backbones.adventurer.Adventurer` (which has no attention map), the cosine
  similarity of the query patch's residual-stream feature after that block to every patch.

Maps of signed operators (InLine, identity) can be negative; nothing is clipped here.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.hooks import RemovableHandle

from mmlinvit.backbones.outputs import resolve_out_indices
from mmlinvit.layers.patch_embed import patch_grid


def _check_query(hw_shape: Tuple[int, int], row: int, col: int) -> int:
    """Raster index of patch (row, col) on an (h, w) grid, with a clear error."""
    h, w = hw_shape
    if not (0 <= row < h and 0 <= col < w):
        raise IndexError(f'query patch (row={row}, col={col}) is outside the {h} x {w} patch '
                         f'grid; use 0 <= row < {h} and 0 <= col < {w}')
    return row * w + col


def _run_hooked(model: nn.Module, images: torch.Tensor, handles: List[RemovableHandle]) -> None:
    """Runs ``model(images)`` without gradients, then removes the hooks ``handles``."""
    try:
        with torch.no_grad():
            model(images)
    finally:
        for handle in handles:
            handle.remove()


def capture_attention_inputs(model: nn.Module, images: torch.Tensor,
                             layers: Sequence[int]) -> Dict[int, Tuple[torch.Tensor, tuple, int]]:
    """Runs ``model(images)`` and records each chosen block's attention-operator input.

    Args:
        model: A VisionTransformer-like module with ``blocks[i].attn`` operators.
        images: (B, 3, H, W) images.
        layers: Block indices (negative allowed).

    Returns:
        ``{layer: (x, hw_shape, num_prefix_tokens)}`` with x the (B, N, C) normalised tokens.
    """
    blocks = getattr(model, 'blocks', None)
    if blocks is None:
        raise TypeError(f'{type(model).__name__} has no `blocks` with attention operators; '
                        'attention maps need a VisionTransformer (use '
                        'activation_similarity_maps for Adventurer)')
    indices = resolve_out_indices(layers, len(blocks), 'layers')
    captured: Dict[int, Tuple[torch.Tensor, tuple, int]] = {}

    def make_hook(layer: int):

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            names = ('x', 'hw_shape', 'num_prefix_tokens')
            values = dict(zip(names, args))
            values.update({k: v for k, v in kwargs.items() if k in names})
            captured[layer] = (values['x'].detach(), values.get('hw_shape'),
                               int(values.get('num_prefix_tokens', 0)))

        return hook

    handles = [
        blocks[layer].attn.register_forward_pre_hook(make_hook(layer), with_kwargs=True)
        for layer in indices
    ]
    _run_hooked(model, images, handles)
    return captured


def query_attention_maps(model: nn.Module,
                         images: torch.Tensor,
                         query: Tuple[int, int],
                         layers: Sequence[int],
                         head: Optional[int] = None) -> Dict[int, torch.Tensor]:
    """Attention of one query patch to every patch, per layer, on the patch grid.

    Args:
        model: VisionTransformer whose chosen blocks' operators have an attention map.
        images: (B, 3, H, W) images.
        query: (row, col) of the query patch on the patch grid.
        layers: Block indices (negative allowed).
        head: Head index, or ``None`` for the mean over heads.

    Returns:
        ``{layer: (B, h, w) float32 map}``; entry (r, c) is the weight the query gives to
        patch (r, c) (prefix tokens dropped, so a row sums to 1 minus their share).
    """
    captured = capture_attention_inputs(model, images, layers)
    maps = {}
    for layer, (x, hw_shape, num_prefix) in captured.items():
        attn = model.blocks[layer].attn
        if not attn.has_attention_map:
            raise ValueError(f'layer {layer}: the {type(attn).__name__} operator has no '
                             f'attention map (has_attention_map=False); pick operators such as '
                             f"'softmax', 'elu', 'relu', 'inline' or 'mhla'")
        if hw_shape is None:
            raise ValueError(f'layer {layer}: the operator was called without hw_shape, so the '
                             'patch grid is unknown')
        q_index = num_prefix + _check_query(tuple(hw_shape), *query)
        with torch.no_grad():
            full = attn.attention_map(x, hw_shape, num_prefix).float()  # (B, H, N, N)
        if head is not None and not 0 <= head < full.shape[1]:
            raise IndexError(f'head {head} is out of range for {full.shape[1]} heads')
        row = full[:, :, q_index, num_prefix:]  # (B, H, h*w)
        row = row.mean(dim=1) if head is None else row[:, head]
        maps[layer] = row.reshape(row.shape[0], hw_shape[0], hw_shape[1])
    return maps


def activation_similarity_maps(model: nn.Module, images: torch.Tensor, query: Tuple[int, int],
                               blocks: Sequence[int]) -> Dict[int, torch.Tensor]:
    """Cosine similarity of the query patch's feature to every patch, per Adventurer block.

    Args:
        model: An Adventurer (``layers[i]`` blocks on ``[patches, cls]`` tokens, class last).
        images: (B, 3, H, W) images.
        query: (row, col) of the query patch.
        blocks: Block indices (negative allowed).

    Returns:
        ``{block: (B, h, w) float32 map}`` in [-1, 1] (1 at the query itself).
    """
    layers = getattr(model, 'layers', None)
    patch_embed = getattr(model, 'patch_embed', None)
    if layers is None or patch_embed is None:
        raise TypeError(f'{type(model).__name__} has no `layers` / `patch_embed`; activation '
                        'maps here expect an Adventurer backbone')
    indices = resolve_out_indices(blocks, len(layers), 'blocks')
    outputs: Dict[int, torch.Tensor] = {}

    def make_hook(block: int):

        def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
            outputs[block] = out.detach()

        return hook

    _run_hooked(model, images,
                [layers[block].register_forward_hook(make_hook(block)) for block in indices])
    p = patch_embed.patch_size
    hw_shape = patch_grid(images.shape[-2:], p)
    q_index = _check_query(hw_shape, *query)
    maps = {}
    for block, tokens in outputs.items():
        patches = tokens[:, :-1].float()  # class token is last
        sim = F.cosine_similarity(patches, patches[:, q_index:q_index + 1], dim=-1)
        maps[block] = sim.reshape(sim.shape[0], hw_shape[0], hw_shape[1])
    return maps


def upsample_map(grid_map: torch.Tensor, image_hw: Tuple[int, int],
                 mode: str = 'nearest', patch_size: Optional[int] = None) -> torch.Tensor:
    """(h, w) or (B, h, w) patch-grid map -> the same at image resolution (for overlays).

    Args:
        grid_map: Map on the patch grid.
        image_hw: (H, W) output size.
        mode: ``'nearest'`` (patch blocks) or ``'bilinear'``.
        patch_size: The model's patch size.  An image whose sides are not multiples of it was
            padded at the bottom / right to the grid: the map is upsampled to the padded size
            ``(h * patch, w * patch)`` and cropped to ``image_hw``, so each patch lands on its
            pixels (stretching the grid over the image shifted the last column by up to a
            patch).  ``None``: stretched to ``image_hw``.
    """
    squeeze = grid_map.dim() == 2
    t = grid_map.float().reshape((1, 1) + tuple(grid_map.shape[-2:])) if squeeze else \
        grid_map.float().unsqueeze(1)
    kwargs = {} if mode == 'nearest' else dict(align_corners=False)
    size = tuple(image_hw)
    if patch_size is not None:
        size = (t.shape[-2] * patch_size, t.shape[-1] * patch_size)
        if size[0] < image_hw[0] or size[1] < image_hw[1]:
            raise ValueError(f'a {t.shape[-2]}x{t.shape[-1]} grid of {patch_size}-pixel patches '
                             f'does not cover a {image_hw[0]}x{image_hw[1]} image')
    out = F.interpolate(t, size=size, mode=mode, **kwargs)[:, 0, :image_hw[0], :image_hw[1]]
    return out[0] if squeeze else out
