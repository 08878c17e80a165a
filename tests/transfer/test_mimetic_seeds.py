"""Mimetic init: other run seeds share no per-layer draws (audit s11 seeding F2).

Layer i drew from ``manual_seed(seed + i)``, so run seed s + 1 got run seed s's layers shifted
by one (layer i of seed 1 == layer i + 1 of seed 0, bitwise) in every multi-seed study.
"""
import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.transfer import mimetic_targets, transfer_weights

ARCH = dict(embed_dims=16, num_layers=4, num_heads=2, mlp_hidden_dims=32)
COMMON = dict(img_size=16, patch_size=4)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors: one intra-op thread."""


def _mimetic_qkv(run_seed=None, **options):
    """qkv weights of every block after a Mimetic init under torch's seed ``run_seed``."""
    if run_seed is not None:
        torch.manual_seed(run_seed)
    teacher = VisionTransformer(ARCH, **COMMON)
    student = VisionTransformer(ARCH, attn_cfg='elu', **COMMON)
    report = transfer_weights(student, teacher, 'mimetic', **options)
    return [b.attn.qkv.weight.detach().clone() for b in student.blocks], report


@pytest.mark.parametrize('shift', [1, 2])
def test_run_seeds_share_no_layers(shift):
    base, report = _mimetic_qkv(0)
    other, other_report = _mimetic_qkv(shift)
    assert report.details['seed'] == 0 and other_report.details['seed'] == shift
    for i in range(len(base)):
        for j in range(len(other)):
            assert not torch.equal(other[j], base[i]), (f'seed {shift} layer {j} == seed 0 '
                                                        f'layer {i}')


def test_explicit_seeds_share_no_layers():
    three, _ = _mimetic_qkv(seed=3)
    four, _ = _mimetic_qkv(seed=4)
    assert not any(torch.equal(a, b) for a in three for b in four)
    again, _ = _mimetic_qkv(run_seed=9, seed=3)  # an explicit seed is reproducible
    assert all(torch.equal(a, b) for a, b in zip(three, again))


def test_layers_draw_from_their_layer_generator():
    """Layer i's targets are those of ``layer_generator(seed, i)``: the q.k^T product of a
    single-head layer of full rank is its target."""
    from mmlinvit.transfer.mimetic import layer_generator
    arch = dict(ARCH, num_heads=1)
    teacher = VisionTransformer(arch, **COMMON)
    student = VisionTransformer(arch, attn_cfg='elu', **COMMON)
    transfer_weights(student, teacher, 'mimetic', seed=11)
    for i, block in enumerate(student.blocks):
        qk, _ = mimetic_targets(16, 1, 0.7, 0.7, 0.4, 0.4, layer_generator(11, i))
        w = block.attn.qkv.weight.detach().double()
        torch.testing.assert_close(w[:16].T @ w[16:32], qk[0], atol=1e-4, rtol=1e-4)


def test_layer_generators_are_distinct():
    from mmlinvit.transfer.mimetic import layer_generator
    draws = {(s, i): torch.randn(4, generator=layer_generator(s, i)) for s in range(4)
             for i in range(4)}
    keys = list(draws)
    for a in range(len(keys)):
        for b in range(a + 1, len(keys)):
            assert not torch.equal(draws[keys[a]], draws[keys[b]]), (keys[a], keys[b])
    # a seed wider than 32 bits is not (low word, high word) of another pair
    assert not torch.equal(torch.randn(4, generator=layer_generator(5 + 2**32, 0)),
                           torch.randn(4, generator=layer_generator(5, 1)))
