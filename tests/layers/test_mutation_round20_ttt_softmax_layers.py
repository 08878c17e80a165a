"""Mutation round 20: TTT / softmax operators, patch embedding, RMS norms (second pass).

Written for single-change mutants of ``mmlinvit/layers/attention/{ttt,softmax}.py`` and
``mmlinvit/layers/{patch_embed,norm,checkpointing}.py`` that the earlier tests (rounds 9 and
15, ``test_ttt.py``, ``test_operators_official.py``) did not kill: TTT's ``extra_repr``, the
patch embedding's defaults and its padding when only one side needs it (against timm's
``PatchEmbed(dynamic_img_pad=True)``), the gated RMS norm's in-place path on a non-contiguous
input with more rows than one CPU chunk and its group-size check, and the
``with_cp`` rule for a partly frozen block.  (Softmax attention's mutants were all killed by
the earlier tests.)  References are timm's classes run here, float64 formulas written here, or
documented values; never outputs of the code under test.
"""
from typing import Tuple

import pytest
import torch
import torch.nn.functional as F

from attention_fp64 import assert_close64, randomise_, tokens
from mmlinvit.layers.attention import build_attention_operator
from mmlinvit.layers.checkpointing import checkpoint_active
from mmlinvit.layers.norm import GatedRMSNorm
from mmlinvit.layers.patch_embed import PatchEmbed, patch_grid

C, HEADS = 32, 4  # head_dims 8


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors: one intra-op thread is fastest on the shared cores."""


def rms64(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim in float64."""
    x = x.double()
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


# ---------------------------------------------------------------------- TTT
@pytest.mark.parametrize('conv_branch,positional_conv', [(True, True), (False, False),
                                                         (True, False)])
def test_ttt_extra_repr_names_its_ablation_switches(conv_branch: bool, positional_conv: bool):
    """``extra_repr`` reports the two ablation switches as given (what a printed model shows)."""
    op = build_attention_operator(dict(type='ttt', conv_branch=conv_branch,
                                       positional_conv=positional_conv), C, HEADS)
    text = repr(op)
    assert f'conv_branch={conv_branch}' in text
    assert f'positional_conv={positional_conv}' in text
    assert 'inner_lr=1.0' in text and 'inner_loss_scale=0.3333' in text


# ---------------------------------------------------------------------- patch embedding
def test_patch_embed_defaults_are_timms():
    """``PatchEmbed()`` is timm's default ViT-B/16 patch embedding: 3 -> 768 channels, 16 x 16
    patches, stride 16, with a bias."""
    from timm.layers import PatchEmbed as TimmPatchEmbed
    ours, theirs = PatchEmbed(), TimmPatchEmbed()
    assert ours.proj.weight.shape == theirs.proj.weight.shape == (768, 3, 16, 16)
    assert ours.proj.stride == theirs.proj.stride
    assert ours.proj.bias is not None and theirs.proj.bias is not None


@pytest.mark.parametrize('hw', [(8, 11), (13, 8), (8, 8), (9, 15)])
def test_patch_embed_equals_timms_dynamic_padding(hw: Tuple[int, int]):
    """Equal to timm's ``PatchEmbed(dynamic_img_pad=True)`` with the same weights, also when
    only one of H, W needs padding; grid ``(ceil(H / 4), ceil(W / 4))``."""
    from timm.layers import PatchEmbed as TimmPatchEmbed
    ours = randomise_(PatchEmbed(3, 6, 4))
    theirs = TimmPatchEmbed(None, 4, 3, 6, strict_img_size=False, dynamic_img_pad=True)
    theirs.load_state_dict(ours.state_dict())
    img = tokens((2, 3, *hw))
    with torch.no_grad():
        out, out_hw = ours(img)
        expected = theirs(img)
    grid = (-(-hw[0] // 4), -(-hw[1] // 4))
    assert tuple(out_hw) == grid == patch_grid(hw, 4)
    torch.testing.assert_close(out, expected)


# ---------------------------------------------------------------------- RMS norms
@pytest.mark.parametrize('norm_before_gate', [False, True])
def test_in_place_gated_rms_norm_on_a_non_contiguous_input(norm_before_gate: bool):
    """``consume=True`` without autograd on a (B, N, C) fp32 input whose B and N axes are
    swapped (not viewable as rows without a copy), 2 x 300 tokens (CPU chunks of 256, 256 and
    88 tokens, the last one partial): Mamba-2's gated RMSNorm per group of 4 channels, every
    token normalised."""
    norm = randomise_(GatedRMSNorm(8, eps=1e-3, group_size=4,
                                   norm_before_gate=norm_before_gate))
    x = 0.2 * tokens((300, 2, 8), seed=4).transpose(0, 1)  # (2, 300, 8), non-contiguous
    z = tokens((2, 300, 8), seed=5)
    assert not x.is_contiguous()
    gate = F.silu(z.double())
    w = norm.weight.double()
    if norm_before_gate:
        expected = rms64(x.double().reshape(2, 300, 2, 4), 1e-3).reshape(2, 300, 8) * w * gate
    else:
        expected = rms64((x.double() * gate).reshape(2, 300, 2, 4),
                         1e-3).reshape(2, 300, 8) * w
    with torch.no_grad():
        out = norm(x, z.clone(), consume=True)
    assert_close64(out, expected)


@pytest.mark.parametrize('group_size', [0, -4])
def test_gated_rms_norm_refuses_a_non_positive_group_size(group_size: int):
    """A group size below one is refused at build time with the documented ValueError (not a
    ZeroDivisionError, nor -4 accepted because 8 % -4 == 0 and a reshape error later)."""
    with pytest.raises(ValueError, match=r'dims \(8\) must be a multiple of group_size'):
        GatedRMSNorm(8, group_size=group_size)


# ---------------------------------------------------------------------- with_cp rule
def test_checkpoint_active_for_a_partly_frozen_block():
    """One trainable parameter is enough (documented: "the block has a trainable parameter"):
    a block with a frozen bias but a trainable weight is checkpointed for an input without a
    gradient; with both frozen it is not."""
    block = torch.nn.Linear(4, 4).train()
    block.bias.requires_grad_(False)
    x = torch.randn(2, 4)
    assert checkpoint_active(block, x, True)
    block.weight.requires_grad_(False)
    assert not checkpoint_active(block, x, True)
