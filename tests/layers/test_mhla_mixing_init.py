"""MHLA's ``mixing_init='cos'`` is the public MHLA code's block-mixing init.

The reference is written here from the public code's ``BlockDistanceConv(transform='cos')``:
block centres (i + 0.5, j + 0.5), Euclidean distances d, cos(d / max(d) * pi / 4), each column
(input block of the 1 x 1 conv weight [out, in]) divided by its sum.
"""
import math

import pytest
import torch

from mmlinvit.layers.attention import build_attention_operator


def public_cos_init(gh: int, gw: int) -> torch.Tensor:
    centres = [(i + 0.5, j + 0.5) for i in range(gh) for j in range(gw)]
    n = len(centres)
    dist = torch.zeros(n, n, dtype=torch.float64)
    for a in range(n):
        for b in range(n):
            dist[a, b] = math.dist(centres[a], centres[b])
    mat = torch.cos(dist / dist.max() * math.pi / 4)
    return mat / mat.sum(dim=0, keepdim=True)


@pytest.mark.parametrize('grid', [(2, 2), (3, 3), (2, 3)])
def test_cos_mixing_init_matches_the_public_code(grid):
    op = build_attention_operator(dict(type='mhla', block_grid=grid, mixing_init='cos'), 32, 2)
    expected = public_cos_init(*grid).float()
    torch.testing.assert_close(op.block_mixing.detach(), expected, rtol=0, atol=1e-6)
    per_head = build_attention_operator(
        dict(type='mhla', block_grid=grid, mixing_init='cos', per_head_mixing=True), 32, 2)
    torch.testing.assert_close(per_head.block_mixing.detach(), expected.expand(2, -1, -1),
                               rtol=0, atol=1e-6)


def test_default_mixing_init_is_unchanged_and_bad_names_fail():
    default = build_attention_operator('mhla', 32, 2)
    own = default.block_mixing.detach().diagonal()
    assert own.min() > 0.5  # softmax(-d): own block 0.505 on 2 x 2 blocks
    cos = build_attention_operator(dict(type='mhla', mixing_init='cos'), 32, 2)
    assert cos.block_mixing.detach().diagonal().max() < 0.3  # 0.2935
    with pytest.raises(ValueError, match="available: \\('softmax', 'cos', 'linear'\\)"):
        build_attention_operator(dict(type='mhla', mixing_init='exp'), 32, 2)
