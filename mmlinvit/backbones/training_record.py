"""What a backbone's weights were trained with, saved beside them and checked when they load.

Some choices change what a backbone computes without changing a single parameter name or
shape: the attention operator of a ViT block (ELU+1, ReLU and softmax attention all own the
same ``qkv`` / ``proj``), the blocks of an Adventurer that scan the patches in reverse.  A
checkpoint trained with one choice loads without complaint into a model built with another,
which then computes features its weights were not trained for: a silently wrong model.

A *training record* is a small persistent buffer holding such a choice.  It is saved in every
checkpoint of the model (runner checkpoints, exported students, ``state_dict()``), and a
``load_state_dict`` pre-hook compares a checkpoint's record with the model's before anything
is copied, on every loading path (``pretrained=`` through :mod:`mmlinvit.converters`,
mmengine's ``load_checkpoint`` / ``--resume``, plain ``load_state_dict``).  A checkpoint
without the record (official releases, mmlinvit files from before the record) loads as it
is: the model's own record is filled in.

This module only holds the plumbing and the encoding of names; what is recorded and when two
records disagree is decided by the backbones.
"""
from typing import List, Sequence

import torch

#: Bytes per name in :func:`encode_names` (zero-padded ASCII).
NAME_BYTES = 32
#: Record of each block's attention-operator settings (:meth:`AttentionOperator.settings_record`).
OPERATOR_SETTINGS_RECORD = 'operator_settings'
#: Bytes per block of :data:`OPERATOR_SETTINGS_RECORD`.
SETTINGS_BYTES = 128
#: Record of a ViT's MLP activation (one encoded name).
MLP_ACT_RECORD = 'mlp_act'


class TrainingRecordMismatchError(ValueError):
    """A checkpoint's weights were trained with another setting than the model's."""


def encode_names(names: Sequence[str], width: int = NAME_BYTES) -> torch.Tensor:
    """Names as a (len(names), width) uint8 tensor of zero-padded ASCII.

    Args:
        names: ASCII names of at most ``width`` characters.
        width: Bytes per name (:data:`NAME_BYTES` by default).

    Returns:
        The encoded names.
    """
    rows = []
    for name in names:
        raw = name.encode('ascii')
        if len(raw) > width:
            raise ValueError(f'{name!r} is longer than the {width} bytes a training record '
                             f'keeps per name')
        rows.append(list(raw) + [0] * (width - len(raw)))
    return torch.tensor(rows, dtype=torch.uint8).reshape(len(rows), width)


def decode_names(encoded: torch.Tensor) -> List[str]:
    """The names of :func:`encode_names`."""
    return [bytes(int(b) for b in row if int(b)).decode('ascii', errors='replace')
            for row in encoded.to(torch.uint8).cpu().reshape(-1, encoded.shape[-1])]


def describe_blocks(indices: Sequence[int]) -> str:
    """Block indices as ranges: ``[0, 1, 2, 5]`` -> ``'0-2, 5'``."""
    parts, run = [], []
    for i in sorted(indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(f'{run[0]}-{run[-1]}' if len(run) > 1 else f'{run[0]}')
        run = [i]
    if run:
        parts.append(f'{run[0]}-{run[-1]}' if len(run) > 1 else f'{run[0]}')
    return ', '.join(parts)
