"""Mutation round 21: the kernel linear-attention operators and the operator base class (the
Mamba-2 mixer, the causal depthwise convolution, the RMS norms and the feature maps were
mutated too; the existing suite killed every valid, non-equivalent mutant there).

Each test below failed on at least one single-line change of
``mmlinvit/layers/attention/base.py`` that the rest of the suite (rounds 8-20 included) let
pass, or is marked FINDING (it failed on the original ``kernel_linear.py``).  References, all
independent of the code under test:

* kernel attention: A_ij = phi(q_i).phi(k_j) / (sum_l phi(q_i).phi(k_l) + N eps) written in
  float64, and what float arithmetic does to ELU + 1 / Hedgehog features far from 0;
* the operator base: the documented contract of ``build_attention_operator``'s defaults, the
  shape of a meta-device map, the float64 formula for the O(N^2) reference's projection.
"""
import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.usefixtures('one_thread')


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# =========================================================================== kernel operators
@pytest.mark.parametrize('kind', ['elu', 'hedgehog'])
def test_zero_eps_never_turns_underflowing_features_into_nan(kind: str) -> None:
    """FINDING (fails on the original ``kernel_linear.py``): ``check_eps`` let ``eps=0`` through
    for ELU + 1 and Hedgehog because their features are > 0 "everywhere".  In float arithmetic
    they are not: in fp32 (the accumulation dtype of the kernels) ELU(x) + 1 is exactly 0 for
    x <= -18 (exp(-18) = 1.5e-8 is below half an ulp of 1), and Hedgehog's two softmax halves of
    a query and of every key with logits +-60 meet only in entries of size exp(-120) = 0 in
    fp32.  The normaliser phi(q).z is then 0 and ``eps=0`` gives 0 / 0 = NaN for the whole
    row, where any eps > 0 gives the finite 0.  An ``eps=0`` must be refused at build time (or
    give a finite output)."""
    from mmlinvit.layers.attention.kernel_linear import (HedgehogLinearAttention,
                                                         KernelLinearAttention)
    assert float(F.elu(torch.tensor(-18.0)) + 1.0) == 0.0  # the fp32 underflow itself
    if kind == 'elu':
        build = lambda: KernelLinearAttention(8, 2, feature_map='elu', eps=0.0,  # noqa: E731
                                              backend='torch')
        q = torch.full((1, 2, 3, 4), -30.0)
        k = torch.randn(1, 2, 5, 4, generator=_gen(0))
    else:
        build = lambda: HedgehogLinearAttention(4, 2, feature_dims=2, eps=0.0,  # noqa: E731
                                                backend='torch')
        q = torch.tensor([60.0, -60.0]).expand(1, 2, 3, 2).contiguous()
        k = torch.tensor([-60.0, 60.0]).expand(1, 2, 5, 2).contiguous()
    v = torch.randn(1, 2, 5, k.shape[-1], generator=_gen(1))
    try:
        op = build()
    except ValueError as err:
        assert 'eps must be > 0' in str(err)
        return
    with torch.no_grad():
        assert torch.isfinite(op.mix(q, k, v, None, 0)).all()
        assert torch.isfinite(op.map_from_qk(q, k, None, 0)).all()


# =========================================================================== operator base
@pytest.mark.parametrize('name', ['elu', 'hedgehog', 'identity'])
def test_attention_map_of_a_meta_operator_is_a_meta_tensor_of_the_map_shape(name: str) -> None:
    """``attention_map`` takes the plain path for meta tensors (shape-only analysis of a model
    built on ``torch.device('meta')``): a (B, H, N, N) meta map comes back, inside and outside
    autocast (mutant: the meta check dropped, ``torch.is_autocast_enabled('meta')`` raised
    "unknown device type for autocast")."""
    from mmlinvit.layers.attention import build_attention_operator
    with torch.device('meta'):
        op = build_attention_operator(name, 8, 2)
        x = torch.empty(3, 5, 8)
    got = op.attention_map(x)
    assert got.device.type == 'meta' and tuple(got.shape) == (3, 2, 5, 5)


def test_a_config_may_override_every_default_the_caller_passes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``build_attention_operator(cfg, C, H, **defaults)``: "extra keyword defaults the config
    may override" -- a key given both as a default and in the config is the config's, also for
    an operator that takes it through ``**kwargs`` (not named in a signature, so not in the
    option check's list); the registry entry is removed afterwards (mutant: the defaults' keys
    were not exempt from the unknown-option check and the config was refused)."""
    from mmlinvit.layers.attention import ATTENTION_OPERATORS, build_attention_operator
    from mmlinvit.layers.attention.base import AttentionOperator

    class Round21KwargsOperator(AttentionOperator):
        """An operator reading ``temperature`` from ``**kwargs``."""

        def __init__(self, embed_dims: int, num_heads: int, **kwargs) -> None:
            self.temperature = kwargs.pop('temperature', 1.0)
            super().__init__(embed_dims, num_heads, **kwargs)

    monkeypatch.setitem(ATTENTION_OPERATORS._entries, 'round21_kwargs', Round21KwargsOperator)
    op = build_attention_operator(dict(type='round21_kwargs', temperature=0.5), 8, 2,
                                  temperature=2.0)
    assert op.temperature == 0.5
    assert build_attention_operator('round21_kwargs', 8, 2, temperature=2.0).temperature == 2.0


@pytest.mark.parametrize('dtype', [torch.float64, torch.bfloat16])
def test_reference_forward_of_a_non_fp32_operator_projects_in_the_values_dtype(
        dtype: torch.dtype) -> None:
    """``forward_reference`` = project(map @ V) with the map's fp32 product brought back to the
    dtype of V before the projection: an fp64 or bf16 operator (no autocast) gets a result in
    its dtype equal to the float64 formula A_ij = phi(q_i).phi(k_j) / (sum_l phi(q_i).phi(k_l)
    + N eps), phi = ELU + 1 (mutant: the fp32 product went into the fp64 / bf16 ``proj`` and
    ``F.linear`` refused the mixed dtypes)."""
    from mmlinvit.layers.attention import build_attention_operator
    op = build_attention_operator(dict(type='elu', eps=0.01), 8, 2).to(dtype).eval()
    x = torch.randn(2, 5, 8, generator=_gen(3)).to(dtype)
    with torch.no_grad():
        got = op.forward_reference(x)
        w = {name: t.double() for name, t in op.state_dict().items()}
        qkv = (x.double() @ w['qkv.weight'].t() + w['qkv.bias']).reshape(2, 5, 3, 2, 4)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        scores = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1)
        attn = scores / (scores.sum(-1, keepdim=True) + 5 * 0.01)
        merged = (attn @ v).transpose(1, 2).reshape(2, 5, 8)
        want = merged @ w['proj.weight'].t() + w['proj.bias']
    assert got.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float64 else dict(rtol=0.05, atol=0.02)
    torch.testing.assert_close(got.double(), want, **tol)

