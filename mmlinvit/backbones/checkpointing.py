"""Activation checkpointing of backbone blocks (``with_cp``, as in mmseg / mmpretrain ViTs).

A checkpointed block keeps only its input during the forward pass and recomputes its
activations in the backward pass (:func:`torch.utils.checkpoint.checkpoint` with
``use_reentrant=False``, RNG state preserved so dropout / drop-path masks are identical), so
training memory per block drops from all activations to one (B, N, C) tensor at the cost of
one extra block forward.  It is applied only where it saves something: the module is in
training mode, autograd is recording and the block has a trainable parameter or a
gradient-carrying input (frozen blocks and ``torch.no_grad`` / eval forwards run plainly).

Hooks and checkpointing: the backward pass re-runs the block, so forward PRE-hooks of the
block and of its submodules run again; forward hooks run again only for submodules that
finish before the recomputation stops (it stops early, once every saved tensor is rebuilt).
Recorders that overwrite their record (as :mod:`mmlinvit.distill.recorders` do) are
unaffected: the losses were computed before the backward pass; a hook that accumulates would
see some modules twice.
"""
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from mmlinvit.layers.checkpointing import checkpoint_active

__all__ = ['checkpoint_active', 'run_block']


def run_block(block: nn.Module, x: torch.Tensor, *args: Any, with_cp: bool = False) -> Any:
    """``block(x, *args)``, checkpointed when :func:`checkpoint_active` says so.

    Args:
        block: The block.
        x: Token input (B, N, C).
        *args: Further positional arguments of the block (grid, prefix count...).
        with_cp: The backbone's ``with_cp`` switch.

    Returns:
        The block's output.
    """
    if checkpoint_active(block, x, with_cp):
        return checkpoint(block, x, *args, use_reentrant=False)
    return block(x, *args)
