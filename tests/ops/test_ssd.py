"""Mamba-2 SSD scan: chunked PyTorch path vs the sequential oracle, and the Mamba2Mixer."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from mmlinvit.layers.mamba2 import Mamba2Mixer
from mmlinvit.layers.norm import GatedRMSNorm, RMSNorm
from mmlinvit.ops.ssd import (decay_matrix, segment_sums, ssd_scan, ssd_scan_torch,
                              ssd_scan_naive, triton_kernel_available)


def make_inputs(batch=2, length=20, heads=4, headdim=8, groups=2, d_state=16,
                a_range=(1.0, 16.0), dtype=torch.float32, seed=0):
    """Generated SSD inputs at realistic scales (dt = softplus(.), A < 0, B/C ~ N^-1/2)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    x = randn(batch, length, heads, headdim)
    dt = F.softplus(randn(batch, length, heads) - 1.0)
    A = -(torch.rand(heads, generator=g, dtype=torch.float64) * (a_range[1] - a_range[0])
          + a_range[0])
    B = randn(batch, length, groups, d_state) * d_state**-0.5
    C = randn(batch, length, groups, d_state) * d_state**-0.5
    D = randn(heads)
    return [t.to(dtype) for t in (x, dt, A, B, C, D)]


# Strong decay (Mamba-2 init range) and weak decay (state survives many chunks).
DECAYS = [(1.0, 16.0), (0.01, 0.1)]


@pytest.mark.parametrize('a_range', DECAYS)
@pytest.mark.parametrize('chunk_size', [16, 64])
@pytest.mark.parametrize('length', [1, 7, 63, 200])
def test_chunked_matches_sequential_oracle_fp32(length, chunk_size, a_range):
    args = make_inputs(length=length, a_range=a_range)
    ref = ssd_scan_naive(*args)
    out = ssd_scan_torch(*args, chunk_size=chunk_size)
    assert out.dtype == torch.float32 and out.shape == args[0].shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('length,chunk_size', [(37, 8), (64, 16), (5, 16)])
def test_chunked_is_exact_in_fp64(length, chunk_size):
    """The algebra itself (not fp32 rounding): agreement to ~1e-12 in fp64."""
    args = make_inputs(length=length, a_range=(0.01, 0.5), dtype=torch.float64)
    out = ssd_scan_torch(*args, chunk_size=chunk_size)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ssd_scan_naive(*args), rtol=1e-10, atol=1e-10)


def test_no_decay_closed_form():
    """A -> 0, dt = 1: y_t = C_t . sum_{s<=t} x_s B_s^T, checked without the oracle."""
    x, _, _, B, C, _ = make_inputs(batch=1, length=45, heads=2, groups=1, dtype=torch.float64)
    dt = torch.ones(1, 45, 2, dtype=torch.float64)
    A = torch.zeros(2, dtype=torch.float64)
    states = torch.cumsum(torch.einsum('blhp,bln->blhpn', x, B[:, :, 0]), dim=1)
    expected = torch.einsum('blhpn,bln->blhp', states, C[:, :, 0])
    for chunk_size in (4, 16, 64):
        torch.testing.assert_close(ssd_scan_torch(x, dt, A, B, C, chunk_size=chunk_size),
                                   expected, rtol=1e-10, atol=1e-10)


def test_chunk_size_invariance():
    args = make_inputs(length=150, a_range=(0.01, 1.0))
    ref = ssd_scan_torch(*args, chunk_size=256)
    for chunk_size in (1, 3, 16, 64, 149, 150, 151):
        torch.testing.assert_close(ssd_scan_torch(*args, chunk_size=chunk_size), ref,
                                   rtol=1e-5, atol=1e-5)
    for step in (1, 2, 7):
        torch.testing.assert_close(
            ssd_scan_torch(*args, chunk_size=16, chunks_per_step=step),
            ssd_scan_torch(*args, chunk_size=16), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('groups', [1, 2, 4])
def test_groups_match_oracle_and_repeated_heads(groups):
    x, dt, A, B, C, D = make_inputs(length=33, heads=4, groups=groups, a_range=(0.1, 2.0))
    out = ssd_scan_torch(x, dt, A, B, C, D, chunk_size=8)
    torch.testing.assert_close(out, ssd_scan_naive(x, dt, A, B, C, D), rtol=1e-5, atol=1e-5)
    # Grouped B/C == per-head B/C where head h reads group h // (H // G).
    per_head = 4 // groups
    full = ssd_scan_torch(x, dt, A, B.repeat_interleave(per_head, dim=2),
                            C.repeat_interleave(per_head, dim=2), D, chunk_size=8)
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-5)


def test_heads_are_independent():
    x, dt, A, B, C, D = make_inputs(length=25, heads=4, groups=4)
    out = ssd_scan_torch(x, dt, A, B, C, D, chunk_size=8)
    for h in range(4):
        single = ssd_scan_torch(x[:, :, h:h + 1], dt[:, :, h:h + 1], A[h:h + 1],
                                  B[:, :, h:h + 1], C[:, :, h:h + 1], D[h:h + 1], chunk_size=8)
        torch.testing.assert_close(out[:, :, h:h + 1], single, rtol=1e-5, atol=1e-5)


def test_d_skip():
    x, dt, A, B, C, D = make_inputs(length=19)
    without = ssd_scan_torch(x, dt, A, B, C, None, chunk_size=8)
    with_d = ssd_scan_torch(x, dt, A, B, C, D, chunk_size=8)
    torch.testing.assert_close(with_d - without, D[None, None, :, None] * x, rtol=1e-5,
                               atol=1e-5)
    torch.testing.assert_close(with_d, ssd_scan_naive(x, dt, A, B, C, D), rtol=1e-5, atol=1e-5)


def test_causal():
    x, dt, A, B, C, D = make_inputs(length=40)
    out = ssd_scan_torch(x, dt, A, B, C, D, chunk_size=16)
    x2, B2 = x.clone(), B.clone()
    x2[:, 21:] += 1.0
    B2[:, 21:] -= 1.0
    out2 = ssd_scan_torch(x2, dt, A, B2, C, D, chunk_size=16)
    torch.testing.assert_close(out2[:, :21], out[:, :21])
    assert not torch.allclose(out2[:, 21:], out[:, 21:])


def test_gradients_match_oracle():
    args = make_inputs(batch=1, length=21, heads=2, groups=1, d_state=4, headdim=3,
                       a_range=(0.1, 2.0), dtype=torch.float64)
    grads = []
    for fn in (ssd_scan_naive, lambda *a: ssd_scan_torch(*a, chunk_size=8)):
        leaves = [t.clone().requires_grad_(True) for t in args]
        fn(*leaves).sin().sum().backward()
        grads.append([t.grad for t in leaves])
    for g_naive, g_chunk in zip(*grads):
        assert torch.isfinite(g_chunk).all()
        torch.testing.assert_close(g_chunk, g_naive, rtol=1e-9, atol=1e-9)


def test_segment_sums():
    a = torch.randn(2, 6, dtype=torch.float64)
    seg = segment_sums(a)
    for i in range(6):
        for j in range(6):
            if j > i:
                assert seg[0, i, j] == float('-inf')
            else:
                torch.testing.assert_close(seg[1, i, j], a[1, j + 1:i + 1].sum())


def test_segment_sums_stay_accurate_for_large_cumulative_sums():
    """fp32 seg vs fp64 truth when |cumsum| reaches ~600: a plain fp32 difference of
    cumulative sums is off by ~5e-5 here; the hi/lo difference by ~1e-7."""
    a = -(torch.rand(4, 256, dtype=torch.float64) * 5)
    truth = segment_sums(a)
    lower = torch.ones(256, 256, dtype=torch.bool).tril()
    seg = segment_sums(a.float()).double()
    rel = ((seg - truth).abs() / (1 + truth.abs()))[..., lower]
    assert rel.max() < 1e-6
    decay = decay_matrix(a.float())
    assert (decay[..., ~lower] == 0).all()
    torch.testing.assert_close(decay.double(), truth.exp(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(decay_matrix(a.float(), inplace=True), decay, rtol=1e-6,
                               atol=1e-7)


def test_strong_decay_large_chunks_gradients_finite():
    """Decays far below exp(-80) and long chunks: no inf / NaN in forward or backward."""
    x, dt, A, B, C, D = make_inputs(batch=1, length=130, heads=2, groups=1, d_state=4,
                                    headdim=4)
    dt = dt + 2.0
    A = torch.full_like(A, -16.0)
    leaves = [t.clone().requires_grad_(True) for t in (x, dt, A, B, C, D)]
    out = ssd_scan_torch(*leaves, chunk_size=128)
    torch.testing.assert_close(out, ssd_scan_naive(x, dt, A, B, C, D), rtol=1e-5, atol=1e-5)
    (out * 1e3).pow(2).sum().backward()
    for t in leaves:
        assert torch.isfinite(t.grad).all()


class _MaxNumel(TorchDispatchMode):
    """Records the largest tensor any op produces."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out, )):
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return out


def test_memory_is_linear_in_length():
    """No L x L tensor: the largest temporary grows linearly with L (chunk 16)."""
    peaks = []
    for length in (512, 1024):
        args = make_inputs(batch=1, length=length, heads=2, headdim=4, groups=1, d_state=4)
        with torch.no_grad(), _MaxNumel() as mode:
            ssd_scan_torch(*args, chunk_size=16)
        peaks.append(mode.max_numel)
        # (chunks, H, Q, Q + N) = L * H * (Q + N) << L * L
        assert mode.max_numel <= 2 * length * (16 + 4)
    assert peaks[1] <= 2 * peaks[0]


def test_dispatch_backends_and_errors():
    args = make_inputs(length=13)
    torch.testing.assert_close(ssd_scan(*args, chunk_size=4), ssd_scan_torch(*args,
                                                                               chunk_size=4))
    torch.testing.assert_close(ssd_scan(*args, backend='naive'), ssd_scan_naive(*args))
    # Same exception types as ops.linear_attention for the same mistakes.
    with pytest.raises(ValueError, match='available'):
        ssd_scan(*args, backend='cuda')
    if not triton_kernel_available():
        with pytest.raises(RuntimeError, match='triton_kernel'):
            ssd_scan(*args, backend='triton')
    x, dt, A, B, C, D = args
    with pytest.raises(ValueError, match='multiple of the number of B/C groups'):
        ssd_scan(x, dt, A, B[:, :, :1].expand(-1, -1, 3, -1), C[:, :, :1].expand(-1, -1, 3, -1))
    with pytest.raises(ValueError, match='dt must be'):
        ssd_scan(x, dt[:, :-1], A, B, C)
    with pytest.raises(ValueError, match='chunk_size'):
        ssd_scan(*args, chunk_size=0)


# ---------------------------------------------------------------------------------- layers
def small_mixer(**kwargs):
    cfg = dict(d_state=8, headdim=8, chunk_size=8)
    cfg.update(kwargs)
    return Mamba2Mixer(16, **cfg)


def test_mixer_gradients_reach_every_parameter():
    mixer = small_mixer(ngroups=2)
    out = mixer(torch.randn(2, 19, 16))
    assert out.shape == (2, 19, 16)
    out.pow(2).sum().backward()
    for name, p in mixer.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_mixer_shapes_and_defaults():
    mixer = Mamba2Mixer(64)
    assert (mixer.d_state, mixer.d_conv, mixer.expand, mixer.headdim, mixer.ngroups,
            mixer.chunk_size) == (64, 4, 2, 64, 1, 256)
    assert mixer.nheads == 2 and mixer.d_inner == 128
    # in_proj rows: z (128), x (128), B (64), C (64), dt (2)
    assert mixer.in_proj.weight.shape == (128 + 128 + 2 * 64 + 2, 64)
    assert mixer.in_proj.bias is None and mixer.out_proj.bias is None
    assert mixer.conv1d.weight.shape == (256, 1, 4) and mixer.conv1d.bias is not None
    with pytest.raises(ValueError, match='headdim'):
        Mamba2Mixer(10, headdim=64)
    with pytest.raises(ValueError, match='ngroups'):
        Mamba2Mixer(64, headdim=16, ngroups=3)


def test_mixer_init_follows_mamba2():
    mixer = Mamba2Mixer(256, headdim=8)  # 64 heads
    dt = F.softplus(mixer.dt_bias.detach())
    assert dt.min() >= 1e-3 * (1 - 1e-4) and dt.max() <= 0.1 * (1 + 1e-4)
    a = mixer.A_log.detach().exp()
    assert a.min() >= 1.0 and a.max() <= 16.0
    assert a.std() > 1.0  # spread over the range, not constant
    torch.testing.assert_close(mixer.D.detach(), torch.ones(64))
    log_dt = dt.log()
    assert log_dt.min() < math.log(0.005) and log_dt.max() > math.log(0.02)  # log-uniform


def test_mixer_dt_limit_and_backends_agree():
    mixer = small_mixer(dt_limit=(0.01, 0.05))
    dt = mixer.step_sizes(torch.randn(2, 5, mixer.nheads) * 10)
    assert dt.min() >= 0.01 and dt.max() <= 0.05
    u = torch.randn(1, 23, 16)
    ref = small_mixer(ssd_backend='naive')
    fast = small_mixer(ssd_backend=None)
    fast.load_state_dict(ref.state_dict())
    torch.testing.assert_close(fast(u), ref(u), rtol=1e-5, atol=1e-5)


def test_mixer_is_causal():
    mixer = small_mixer()
    u = torch.randn(1, 30, 16)
    u2 = u.clone()
    u2[:, 17:] = torch.randn(1, 13, 16)
    torch.testing.assert_close(mixer(u2)[:, :17], mixer(u)[:, :17])


def test_rms_norms():
    x, z = torch.randn(3, 5, 12), torch.randn(3, 5, 12)
    norm = RMSNorm(12, eps=1e-5)
    norm.weight.data.uniform_(0.5, 1.5)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), expected)
    gated = GatedRMSNorm(12, group_size=4)
    gated.weight.data.uniform_(0.5, 1.5)
    g = (x * F.silu(z)).reshape(3, 5, 3, 4)
    expected = (g / torch.sqrt(g.pow(2).mean(-1, keepdim=True) + 1e-5)).reshape(3, 5, 12)
    torch.testing.assert_close(gated(x, z), expected * gated.weight)
    after = GatedRMSNorm(12, norm_before_gate=True)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * F.silu(z)
    torch.testing.assert_close(after(x, z), expected)
    with pytest.raises(ValueError, match='group_size'):
        GatedRMSNorm(12, group_size=5)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_inference_steps_bound_memory_without_changing_the_result(monkeypatch, dtype):
    """Without gradients the scan runs a few chunks at a time (INFERENCE_STEP_BYTES) and
    writes into one output; the result is the one-step result and the oracle's."""
    from mmlinvit.ops.ssd import torch_impl
    x, dt, A, B, C, D = (t.to(dtype) for t in make_inputs(2, 77, 4, 8, 2, 16))
    with torch.no_grad():
        one_step = torch_impl.ssd_scan_torch(x, dt, A, B, C, D, chunk_size=8,
                                             chunks_per_step=100)
        # (batch 2, H 4, Q 8, Q + N 24) fp32 per chunk: two chunks per step
        monkeypatch.setattr(torch_impl, 'INFERENCE_STEP_BYTES', 2 * (2 * 4 * 8 * 24 * 4))
        assert torch_impl._inference_chunks_per_step(2, 4, 8, 16, 10) == 2
        stepped = torch_impl.ssd_scan_torch(x, dt, A, B, C, D, chunk_size=8)
    assert stepped.dtype == dtype
    torch.testing.assert_close(stepped, one_step, rtol=0, atol=0)
    ref = ssd_scan_naive(*(t.double() for t in (x, dt, A, B, C, D)))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(stepped.double(), ref, rtol=tol, atol=tol)


def _differentiable_form(monkeypatch):
    """Routes no-autograd scans through the chunked (differentiable) form, in place."""
    from mmlinvit.ops.ssd import torch_impl
    monkeypatch.setattr(torch_impl, 'INFERENCE_FORM', False)


@pytest.mark.parametrize('groups', [1, 2])
@pytest.mark.parametrize('length,chunk_size', [(1, 256), (63, 16), (64, 64), (200, 256),
                                               (333, 64)])
def test_inference_form_is_exact_in_fp64_and_matches_the_chunked_form(
        monkeypatch, length, chunk_size, groups):
    """The inference form (chunks of <= INFERENCE_CHUNK tokens, one [W | E] @ [X ; S]
    product per chunk and head) against the oracle in fp64, and against the differentiable
    chunked form in fp32, with and without D."""
    from mmlinvit.ops.ssd import torch_impl
    args = make_inputs(batch=2, length=length, heads=4, headdim=8, groups=groups, d_state=16,
                       a_range=(0.05, 2.0), dtype=torch.float64)
    with torch.no_grad():
        out = torch_impl.ssd_scan_torch(*args, chunk_size=chunk_size)
        torch.testing.assert_close(out, ssd_scan_naive(*args), rtol=1e-10, atol=1e-10)
        no_d = torch_impl.ssd_scan_torch(*args[:5], chunk_size=chunk_size)
        torch.testing.assert_close(no_d, ssd_scan_naive(*args[:5]), rtol=1e-10, atol=1e-10)
        fast = torch_impl.ssd_scan_torch(*(t.float() for t in args), chunk_size=chunk_size)
        _differentiable_form(monkeypatch)
        chunked = torch_impl.ssd_scan_torch(*(t.float() for t in args), chunk_size=chunk_size)
    torch.testing.assert_close(fast, chunked, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('groups', [1, 2])
@pytest.mark.parametrize('length,chunk_size', [(1, 256), (63, 16), (200, 256), (333, 64)])
def test_graph_inference_form_is_exact_in_fp64(monkeypatch, length, chunk_size, groups):
    """The captured-graph inference form (whole-tensor ops, unrolled state loop) against the
    oracle in fp64, with and without D, and against the eager inference form in fp32."""
    from mmlinvit.ops.ssd import torch_impl
    args = make_inputs(batch=2, length=length, heads=4, headdim=8, groups=groups, d_state=16,
                       a_range=(0.05, 2.0), dtype=torch.float64)
    with torch.no_grad():
        eager = torch_impl.ssd_scan_torch(*(t.float() for t in args), chunk_size=chunk_size)
        monkeypatch.setattr(torch_impl, 'capturing_graph', lambda: True)
        out = torch_impl.ssd_scan_torch(*args, chunk_size=chunk_size)
        no_d = torch_impl.ssd_scan_torch(*args[:5], chunk_size=chunk_size)
        graph = torch_impl.ssd_scan_torch(*(t.float() for t in args), chunk_size=chunk_size)
    torch.testing.assert_close(out, ssd_scan_naive(*args), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(no_d, ssd_scan_naive(*args[:5]), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(graph, eager, rtol=1e-5, atol=1e-5)


def test_inference_form_with_positive_decays_and_mixer_strided_views():
    """Outside the Mamba-2 contract (A > 0 for some heads: the general masked decay) and with
    x / B / C as the mixer passes them (channel-major views of one xBC buffer)."""
    x, dt, A, B, C, D = make_inputs(batch=2, length=90, heads=4, headdim=8, groups=1,
                                    d_state=16, a_range=(0.01, 0.05), dtype=torch.float64)
    A = A * torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)  # two growing heads
    xbc = torch.cat([x.flatten(2), B.flatten(2), C.flatten(2)], dim=-1)
    xbc = xbc.transpose(1, 2).contiguous().transpose(1, 2).float()  # token stride 1
    xs, bs, cs = torch.split(xbc, [32, 16, 16], dim=-1)
    with torch.no_grad():
        out = ssd_scan_torch(xs.reshape(2, 90, 4, 8), dt.float(), A.float(),
                             bs.reshape(2, 90, 1, 16), cs.reshape(2, 90, 1, 16), D.float(),
                             chunk_size=256)
    torch.testing.assert_close(out.double(), ssd_scan_naive(x, dt, A, B, C, D), rtol=1e-4,
                               atol=1e-4)


def test_nonpositive_decay_fast_path_equals_the_masked_form():
    """With every log decay <= 0 one clamp(FLOOR, 0) replaces the causal multiply + floor."""
    from mmlinvit.ops.ssd import torch_impl
    log_decay = -torch.rand(2, 3, 64, dtype=torch.float64) * 3.0
    log_decay[0, 0, 10:20] = 0.0  # dt = 0 tokens (padding)
    for inplace in (False, True):
        fast = torch_impl._unmasked_decay(log_decay.clone(), inplace, nonpositive=True)
        slow = torch_impl._unmasked_decay(log_decay.clone(), inplace, nonpositive=False)
        torch.testing.assert_close(fast, slow, rtol=1e-15, atol=0)
    x, dt, A, B, C, D = make_inputs(length=40)
    assert torch_impl._decays_known_nonpositive(A, dt)
    assert not torch_impl._decays_known_nonpositive(-A, dt)  # outside the contract: general
    assert not torch_impl._decays_known_nonpositive(A.to('meta'), dt.to('meta'))
