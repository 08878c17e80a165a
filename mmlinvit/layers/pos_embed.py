"""Position embeddings: family-specific resampling of learned grids and 2-D sin-cos."""
import math
from typing import Any, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F

#: Resampling conventions of learned position-embedding grids.
#: ``bicubic``: DeiT / MAE fine-tuning code, mmpretrain, mmseg (``size=``, align_corners=False,
#: no antialias).
#: ``bicubic_antialias``: timm's ``resample_abs_pos_embed`` (``dynamic_img_size`` and checkpoint
#: resizing): the same call with ``antialias=True``, which differs even when upsampling (the
#: antialiased kernel is PIL's cubic, a = -0.5, instead of a = -0.75).
#: ``dinov2``: the DINOv2 hub models without registers (``interpolate_offset=0.1``,
#: ``interpolate_antialias=False``: ``scale_factor=(h + 0.1) / H``, bicubic, no antialias).
#: ``dinov2_reg``: the DINOv2 hub models with registers, ``dinov2_vit{s,b,l,g}14_reg``
#: (``interpolate_offset=0.0``, ``interpolate_antialias=True``: ``size=(h, w)``, bicubic,
#: antialias); numerically the same call as ``bicubic_antialias``.
POS_INTERP_MODES = ('bicubic', 'bicubic_antialias', 'dinov2', 'dinov2_reg')


def check_pos_interp(mode: str) -> None:
    """Refuses a ``pos_interp`` that is not one of :data:`POS_INTERP_MODES`.

    Raises:
        KeyError: naming the mode and the available ones.
    """
    if mode not in POS_INTERP_MODES:
        raise KeyError(f'Unknown pos_interp {mode!r}; available: {POS_INTERP_MODES}')


def resample_pos_grid(pos: torch.Tensor, src_hw: Tuple[int, int], dst_hw: Tuple[int, int],
                      mode: str = 'bicubic') -> torch.Tensor:
    """Resamples a patch position grid.

    Args:
        pos: (1, Hs * Ws, C) patch position embeddings (no prefix positions).
        src_hw: (Hs, Ws) grid the embeddings were learned on.
        dst_hw: (Hd, Wd) target grid.
        mode: One of :data:`POS_INTERP_MODES`.

    Returns:
        (1, Hd * Wd, C) in the dtype of ``pos``.
    """
    check_pos_interp(mode)
    if tuple(src_hw) == tuple(dst_hw):
        return pos
    dtype = pos.dtype
    c = pos.shape[-1]
    grid = pos.float().reshape(1, src_hw[0], src_hw[1], c).permute(0, 3, 1, 2)
    if mode == 'dinov2':
        scale = (float(dst_hw[0] + 0.1) / src_hw[0], float(dst_hw[1] + 0.1) / src_hw[1])
        grid = F.interpolate(grid, scale_factor=scale, mode='bicubic', antialias=False)
        if tuple(grid.shape[-2:]) != tuple(dst_hw):
            raise RuntimeError(f'DINOv2 interpolation produced {tuple(grid.shape[-2:])}, '
                               f'expected {tuple(dst_hw)}')
    else:
        grid = F.interpolate(grid, size=dst_hw, mode='bicubic', align_corners=False,
                             antialias=mode in ('bicubic_antialias', 'dinov2_reg'))
    return grid.permute(0, 2, 3, 1).reshape(1, dst_hw[0] * dst_hw[1], c).to(dtype)


def sincos_pos_embed_2d(hw_shape: Tuple[int, int], dims: int, temperature: float = 10000.0,
                        device=None, dtype=torch.float32) -> torch.Tensor:
    """Fixed 2-D sin-cos position embedding (MoCo-v3's ``build_2d_sincos_position_embedding``
    layout).

    The first half of the channels encodes the row (h) coordinate, the second half the
    column (w) coordinate; each half is [sin, cos] over ``dims // 4`` frequencies.  (MAE's
    ``get_2d_sincos_pos_embed`` puts the column half first: the same values with the halves
    swapped, which matters only for weights trained with one of them; this embedding is
    computed, never loaded.)

    Args:
        hw_shape: (h, w) grid.
        dims: Embedding width; must be divisible by 4.
        temperature: Frequency base.
        device: Output device.
        dtype: Output dtype.

    Returns:
        (1, h * w, dims).
    """
    if dims % 4 != 0:
        raise ValueError(f'sin-cos position embedding needs dims % 4 == 0, got {dims}')
    h, w = hw_shape
    gy, gx = torch.meshgrid(torch.arange(h, device=device, dtype=torch.float32),
                            torch.arange(w, device=device, dtype=torch.float32), indexing='ij')
    quarter = dims // 4
    omega = 1.0 / temperature**(torch.arange(quarter, device=device, dtype=torch.float32) / quarter)
    oy = gy.reshape(-1, 1) * omega
    ox = gx.reshape(-1, 1) * omega
    emb = torch.cat([oy.sin(), oy.cos(), ox.sin(), ox.cos()], dim=1)
    return emb.unsqueeze(0).to(dtype)


#: Name of the training record (a (2,) int64 buffer of the backbones) that keeps the (rows,
#: cols) grid of a checkpoint's learned ``pos_embed``: the row count alone does not say it once
#: models are trained at non-square sizes (a 16 x 64 grid has the 32 x 32 grid's 1024 rows).
POS_GRID_RECORD = 'pos_embed_grid'


def recorded_pos_grid(state_dict: Mapping[str, Any], prefix: str = ''
                      ) -> Optional[Tuple[int, int]]:
    """The (rows, cols) a state dict records for its position grid (``prefix`` +
    :data:`POS_GRID_RECORD`), or ``None`` when it has no well-formed record."""
    value = state_dict.get(prefix + POS_GRID_RECORD)
    if not isinstance(value, torch.Tensor) or value.numel() != 2:
        return None
    rows, cols = (int(v) for v in value.reshape(-1).tolist())
    return rows, cols


def checkpoint_pos_grid(num_patches: int,
                        recorded: Optional[Tuple[int, int]] = None) -> Tuple[int, int]:
    """The (rows, cols) grid of the ``num_patches`` patch rows of a checkpoint ``pos_embed``.

    Args:
        num_patches: Number of patch positions (class / register rows excluded).
        recorded: The grid the checkpoint records (:func:`recorded_pos_grid`: mmlinvit
            files); without it the grid must be square (official releases are).

    Returns:
        ``(rows, cols)``.

    Raises:
        ValueError: naming the cause and the fix, when the record disagrees with the row
            count or a grid without record is not square.
    """
    if recorded is not None:
        rows, cols = recorded
        if rows <= 0 or cols <= 0 or rows * cols != num_patches:
            raise ValueError(f'The checkpoint records a {rows}x{cols} position grid '
                             f'({POS_GRID_RECORD}) but its pos_embed has {num_patches} patch '
                             f'positions: the file is inconsistent (edited by hand?)')
        return rows, cols
    side = int(math.isqrt(num_patches))
    if side * side != num_patches:
        raise ValueError(
            f'A checkpoint pos_embed with {num_patches} patch positions is no square grid, and '
            f'the checkpoint has no {POS_GRID_RECORD} record saying its shape (files of other '
            f'code, or of mmlinvit before the record): it was learned at a non-square image '
            f'size, which cannot be read off the row count. Build the model with that img_size '
            f'(e.g. img_size=(512, 1024) for a 32x64 grid at patch 16), or add the record to '
            f'the state dict: state_dict[{POS_GRID_RECORD!r}] = torch.tensor([rows, cols]).')
    return side, side
