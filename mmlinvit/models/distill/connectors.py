"""Connectors: small trainable maps applied to student records before a loss."""
from typing import List, Union

import torch
import torch.nn as nn

from mmlinvit.registry import MODELS

Record = Union[torch.Tensor, List[torch.Tensor]]


@MODELS.register_module()
class LinearConnector(nn.Module):
    """A learned linear projection of the last dimension (student width -> teacher width).

    It lives in the distillation model (``connectors.<name>.*`` checkpoint keys), not in the
    student, so it is dropped with the distillation wrapper: the exported backbone is the
    ``student.*`` part only.

    Args:
        in_channels: Student width.
        out_channels: Teacher width.
        bias: Whether the projection has a bias.
    """

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True) -> None:
        super().__init__()
        if not isinstance(in_channels, int) or not isinstance(out_channels, int):
            raise TypeError(f'LinearConnector needs integer in_channels (student width) and '
                            f'out_channels (teacher width), got {in_channels!r} and '
                            f'{out_channels!r}')
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.linear = nn.Linear(in_channels, out_channels, bias=bias)
        nn.init.trunc_normal_(self.linear.weight, std=0.02)
        if bias:
            nn.init.zeros_(self.linear.bias)

    def _apply_one(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_channels:
            raise ValueError(f'LinearConnector expects width {self.in_channels}, got a record '
                             f'of shape {tuple(x.shape)}')
        return self.linear(x)

    def forward(self, x: Record) -> Record:
        """Projects a tensor, or each tensor of a list (one per block / stage)."""
        if isinstance(x, (list, tuple)):
            return [self._apply_one(t) for t in x]
        return self._apply_one(x)
