"""mmseg's ``Feature2Pyramid`` whose downsampled levels cover every patch of an odd grid."""
import math
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmseg.models.necks import Feature2Pyramid

from mmlinvit.registry import MODELS


class CoveringMaxPool2d(nn.Module):
    """Max pooling by ``factor`` to ``ceil(size / factor)`` cells spread over the whole map.

    On a map whose sides are multiples of ``factor`` this is ``MaxPool2d(factor, factor)``
    (the same values).  On other sides ``MaxPool2d`` rounds the output size down and drops the
    last rows / columns: a 37 x 37 patch grid (518 px at patch 14) gave an 18 x 18 level
    covering 36 x 36 patches, while the pixel decoder, masked attention and UPerNet's
    resizes all take every level to span the whole image (cells up to 13.6 px from where
    they were read).  Here such maps are pooled as ``adaptive_max_pool2d`` to
    ``ceil(size / factor)`` does: windows of ``factor`` or ``factor + 1`` cells spread evenly
    over the map, so every patch is read and each cell stays within half a patch of the
    position the decoder gives it.  The windows are gathered with ``index_select`` (max
    pooling is separable), which ONNX exports; ``adaptive_max_pool2d`` has no ONNX form.

    Args:
        factor: Downsampling factor (2 or 4 in the pyramid).
    """

    def __init__(self, factor: int) -> None:
        super().__init__()
        if factor < 1:
            raise ValueError(f'CoveringMaxPool2d: factor must be >= 1, got {factor}')
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-2:]
        if height % self.factor == 0 and width % self.factor == 0:
            return F.max_pool2d(x, self.factor, self.factor)
        return _window_max(_window_max(x, -2, int(height), self.factor), -1, int(width),
                           self.factor)

    def extra_repr(self) -> str:
        return f'factor={self.factor}'


def _window_max(x: torch.Tensor, dim: int, size: int, factor: int) -> torch.Tensor:
    """Max over ``adaptive_max_pool``'s windows along ``dim`` (``ceil(size / factor)`` cells).

    Cell i reads positions ``floor(i * size / cells)`` to ``ceil((i + 1) * size / cells) - 1``;
    shorter windows repeat their last position (the max is unchanged).
    """
    cells = math.ceil(size / factor)
    if cells * factor == size:
        starts = list(range(0, size, factor))
        ends = [start + factor for start in starts]
    else:
        starts = [i * size // cells for i in range(cells)]
        ends = [-(-(i + 1) * size // cells) for i in range(cells)]
    longest = max(end - start for start, end in zip(starts, ends))
    index = torch.tensor([[min(start + k, end - 1) for k in range(longest)]
                          for start, end in zip(starts, ends)], device=x.device)
    dim = dim % x.ndim
    gathered = x.index_select(dim, index.flatten())
    shape = list(x.shape)
    shape[dim:dim + 1] = [cells, longest]
    return gathered.reshape(shape).amax(dim=dim + 1)


@MODELS.register_module()
class FullGridFeature2Pyramid(Feature2Pyramid):
    """mmseg's ``Feature2Pyramid`` (4x, 2x, 1x, 0.5x of a stride-p ViT map) on any grid.

    The same modules, parameters and checkpoint keys as mmseg's neck, and the same outputs
    when the patch grid's sides are multiples of the downsampling factors (even for 0.5x,
    multiples of 4 for 0.25x).  Its downsampled levels (0.5x, 0.25x) use
    :class:`CoveringMaxPool2d`, so on an odd grid (518 px at patch 14: 37 patches, 1022:
    73; any whole-image test whose side gives an odd patch count) they still cover the whole
    image instead of dropping the last patch row and column.  Use it as
    ``type='mmlinvit.FullGridFeature2Pyramid'``.

    Args:
        embed_dim: Channels of the backbone's feature maps.
        rescales: Scale of each output level (``[4, 2, 1, 0.5]`` or ``[2, 1, 0.5, 0.25]``).
        norm_cfg: Norm of the 4x branch (mmseg's default: SyncBN).
    """

    def __init__(self,
                 embed_dim: int,
                 rescales: Sequence[float] = (4, 2, 1, 0.5),
                 norm_cfg: Optional[dict] = None) -> None:
        super().__init__(embed_dim, list(rescales),
                         dict(type='SyncBN', requires_grad=True) if norm_cfg is None else norm_cfg)
        if hasattr(self, 'downsample_2x'):
            self.downsample_2x = CoveringMaxPool2d(2)
        if hasattr(self, 'downsample_4x'):
            self.downsample_4x = CoveringMaxPool2d(4)
