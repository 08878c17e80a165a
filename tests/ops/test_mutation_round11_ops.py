"""Mutation audit, round 11: the ops layer around the two big kernels.

Most tests were written against a mutant of :mod:`mmlinvit.ops` that the rest of the suite
let through (ids from the round-11 audit, named in the docstrings); the feature-map, patch-grid
and meta-device checks pin down by hand what other files catch only through whole-layer
outputs or FLOP counts.  Three groups:

* backend choice (``linear_attention`` / ``ssd`` dispatchers and :mod:`.triton_utils`): what
  ``auto`` does on a CUDA device with inputs the kernels cannot take, what a forced
  ``'triton'`` refuses, and what the dispatchers forward to the kernels.  No kernel runs
  here: the CUDA device is simulated (its capability replaced, as in
  ``test_auto_backend_devices``) and the Triton kernel modules are replaced by recording
  stand-ins;
* the O(N^2) / sequential references (``naive.py``) against formulas written here
  independently (explicit loops, and the quadratic "dual" form of the SSD scan), and the
  input checks whose absence lets wrong shapes broadcast silently;
* the small operators (feature maps, patch-grid layouts and convolutions, identity-map
  attention, causal convolution, MHLA, graph-capture detection) against hand computations.
"""
import sys
import types
from typing import Any, Callable, List, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F

from mmlinvit.ops import graph_capture
from mmlinvit.ops.causal_conv import causal_depthwise_conv1d
from mmlinvit.ops.feature_maps import get_feature_map
from mmlinvit.ops.graph_capture import capturing_graph
from mmlinvit.ops.identity_attention import (identity_linear_attention,
                                             identity_linear_attention_map)
from mmlinvit.ops.linear_attention import (BACKEND_ENV_VAR, check_linear_attention_inputs,
                                           inline_attention, inline_attention_torch,
                                           linear_attention, linear_attention_graph,
                                           linear_attention_map_naive, linear_attention_naive,
                                           linear_attention_torch)
from mmlinvit.ops.linear_attention import dispatch as la_dispatch
from mmlinvit.ops.linear_attention import kernel_unsupported_reason as la_unsupported_reason
from mmlinvit.ops.linear_attention import select_backend
from mmlinvit.ops.mhla import block_token_indices, mhla_attention
from mmlinvit.ops.patch_grid import (depthwise_conv2d, depthwise_conv2d_reference, grid_to_heads,
                                     heads_to_grid)
from mmlinvit.ops.precision import autocast_disabled
from mmlinvit.ops.ssd import (SSD_BACKEND_ENV_VAR, check_chunk_size, check_ssd_inputs, ssd_scan,
                              ssd_scan_naive, ssd_scan_torch, select_ssd_backend,
                              triton_kernel_available)
from mmlinvit.ops.ssd import dispatch as ssd_dispatch
from mmlinvit.ops.ssd import kernel_unsupported_reason as ssd_unsupported_reason
from mmlinvit.ops.triton_utils import (KERNEL_MAX_HEAD_DIM, backend_from_env, check_forced_triton,
                                       check_kernel_device, choose_auto_backend, device_guard,
                                       dot_precision, kernel_limits_reason, requested_backend,
                                       triton_interpreter_enabled)

pytestmark = pytest.mark.usefixtures('one_thread')

CUDA = torch.device('cuda', 0)
META = torch.device('meta')
FP32 = dict(rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------- helpers
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _qkv(n: int = 7, m: int = 7, d: int = 4, e: int = 4, batch: int = 2, heads: int = 2,
         seed: int = 0, dtype: torch.dtype = torch.float32) -> Tuple[torch.Tensor, ...]:
    """Random (batch, heads, tokens, dim) queries, keys and values."""
    gen = _gen(seed)
    q = torch.randn(batch, heads, n, d, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, heads, m, d, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, heads, m, e, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _ssd_args(batch: int = 1, length: int = 9, heads: int = 2, headdim: int = 8,
              groups: int = 1, d_state: int = 16, seed: int = 0,
              dtype: torch.dtype = torch.float32) -> List[torch.Tensor]:
    """x, dt, A, B, C, D in the documented layouts (dt > 0, A < 0)."""
    gen = _gen(seed)
    x = torch.randn(batch, length, heads, headdim, generator=gen, dtype=torch.float64)
    dt = F.softplus(torch.randn(batch, length, heads, generator=gen, dtype=torch.float64) - 1)
    A = -(torch.rand(heads, generator=gen, dtype=torch.float64) * 1.5 + 0.05)
    B = torch.randn(batch, length, groups, d_state, generator=gen, dtype=torch.float64) * 0.3
    C = torch.randn(batch, length, groups, d_state, generator=gen, dtype=torch.float64) * 0.3
    D = torch.randn(heads, generator=gen, dtype=torch.float64)
    return [t.to(dtype) for t in (x, dt, A, B, C, D)]


def _phi_fp64(x: torch.Tensor, feature_map: str) -> torch.Tensor:
    """The feature maps written out in fp64: ELU + 1, ReLU or the identity."""
    x = x.double()
    if feature_map == 'elu':
        return torch.where(x > 0, x + 1.0, torch.exp(x))
    if feature_map == 'relu':
        return torch.where(x > 0, x, torch.zeros_like(x))
    return x


def _linear_attention_loops(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature_map: str,
                            eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """A_ij = phi(q_i).phi(k_j) / (sum_l phi(q_i).phi(k_l) + M eps) entry by entry, and A V.

    Returns:
        (map, output), both fp64.
    """
    phi_q, phi_k, v64 = _phi_fp64(q, feature_map), _phi_fp64(k, feature_map), v.double()
    *lead, n, _ = phi_q.shape
    m = phi_k.shape[-2]
    attn = torch.zeros(*lead, n, m, dtype=torch.float64)
    for i in range(n):
        scores = [(phi_q[..., i, :] * phi_k[..., j, :]).sum(-1) for j in range(m)]
        total = sum(scores) + m * eps
        for j in range(m):
            attn[..., i, j] = scores[j] / total
    return attn, attn @ v64


def _ssd_dual_form(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: Optional[torch.Tensor]) -> torch.Tensor:
    """The scan in its quadratic (state-space dual) form, fp64, no recurrence:

    ``y_t = sum_{s <= t} (C_t . B_s) exp(A sum_{r=s+1}^{t} dt_r) dt_s x_s + D x_t``, head h
    reading group ``h // (H // G)``.
    """
    x, dt, A, B, C = (t.double() for t in (x, dt, A, B, C))
    batch, length, heads, _ = x.shape
    per_group = heads // B.shape[2]
    y = torch.zeros_like(x)
    for h in range(heads):
        g = h // per_group
        for t in range(length):
            for s in range(t + 1):
                decay = torch.exp(A[h] * dt[:, s + 1:t + 1, h].sum(dim=1))  # (batch,)
                weight = (C[:, t, g] * B[:, s, g]).sum(-1) * decay * dt[:, s, h]
                y[:, t, h] += weight[:, None] * x[:, s, h]
            if D is not None:
                y[:, t, h] += D[h].double() * x[:, t, h]
    return y


@pytest.fixture
def no_backend_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither dispatcher is forced by the environment."""
    monkeypatch.delenv(BACKEND_ENV_VAR, raising=False)
    monkeypatch.delenv(SSD_BACKEND_ENV_VAR, raising=False)


@pytest.fixture
def simulated_cuda(monkeypatch: pytest.MonkeyPatch, no_backend_env) -> List[Tuple[str, str]]:
    """Both dispatchers' ``auto`` choice sees an sm_90 CUDA device with the kernels installed.

    The CPU tensors stand in for CUDA tensors: only the device handed to
    :func:`choose_auto_backend` is replaced; the inputs' unsupported reasons are the
    dispatchers' own.

    Returns:
        The (backend, reason) pairs the choice logs.
    """
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, 'hip', None)
    logged: List[Tuple[str, str]] = []

    def on_cuda(device: torch.device, kernel_available: Callable[[], bool],
                unsupported_reason: Callable[[], Optional[str]],
                log_choice: Callable[[str, str], None]) -> str:
        assert device.type == 'cpu'
        return choose_auto_backend(CUDA, lambda: True, unsupported_reason,
                                   lambda backend, reason: logged.append((backend, reason)))

    monkeypatch.setattr(la_dispatch, 'choose_auto_backend', on_cuda)
    monkeypatch.setattr(ssd_dispatch, 'choose_auto_backend', on_cuda)
    return logged


@pytest.fixture
def interpreter_allowed(monkeypatch: pytest.MonkeyPatch, no_backend_env) -> None:
    """A forced ``'triton'`` on CPU tensors passes the device check (``TRITON_INTERPRET=1``),
    with triton and the SSD kernel module reported installed; nothing imports triton."""
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    monkeypatch.setattr(la_dispatch, 'triton_available', lambda: True)
    monkeypatch.setattr(ssd_dispatch, 'triton_kernel_available', lambda: True)


class _Recorder:
    """A stand-in kernel function: records its arguments and returns a marker tensor."""

    def __init__(self, result: torch.Tensor) -> None:
        self.calls: List[Tuple[Any, ...]] = []
        self.result = result

    def __call__(self, *args: Any) -> torch.Tensor:
        self.calls.append(args)
        return self.result


# ================================================================ linear attention dispatch
def test_auto_on_cuda_takes_the_kernels_only_for_inputs_they_can_take(simulated_cuda):
    """``auto`` on a CUDA device: supported inputs go to Triton; keys in fp64 or values wider
    than :data:`KERNEL_MAX_HEAD_DIM` stay on torch (mutant LD03: the auto path ignored the
    inputs' limits and would send them to the kernels)."""
    q, k, v = _qkv(d=16, e=16)
    assert select_backend(q, k, v) == 'triton'
    assert simulated_cuda[-1] == ('triton', 'auto: CUDA tensors and triton installed')
    assert select_backend(q, k.double(), v) == 'torch'
    assert 'k has dtype torch.float64' in simulated_cuda[-1][1]
    wide_v = torch.zeros(2, 2, 7, KERNEL_MAX_HEAD_DIM + 2)
    assert select_backend(q, k, wide_v) == 'torch'
    assert str(KERNEL_MAX_HEAD_DIM + 2) in simulated_cuda[-1][1]


def test_forced_triton_checks_every_input(interpreter_allowed):
    """A forced ``'triton'`` names the input the kernels cannot take, whichever it is
    (mutant LD02: only q was checked, so fp64 keys / values reached the kernels)."""
    q, k, v = _qkv(d=16, e=16)
    assert select_backend(q, k, v, backend='triton') == 'triton'
    with pytest.raises(ValueError, match='k has dtype torch.float64'):
        select_backend(q, k.double(), v, backend='triton')
    with pytest.raises(ValueError, match='v has dtype torch.float64'):
        select_backend(q, k, v.double(), backend='triton')


def test_forced_triton_forwards_feature_map_and_eps(monkeypatch, interpreter_allowed):
    """The dispatcher hands the kernel the caller's feature map and eps, and InLine's scale
    (mutant LD07: eps dropped, so the kernel silently used its default 1e-6; LD08: forced
    InLine ran the torch path instead of the kernel)."""
    q, k, v = _qkv(d=16, e=16)
    linear = _Recorder(torch.full((1, ), 1.0))
    inline = _Recorder(torch.full((1, ), 2.0))
    fake = types.SimpleNamespace(linear_attention_triton=linear, inline_attention_triton=inline)
    monkeypatch.setattr(la_dispatch, '_triton_module', lambda: fake)
    assert linear_attention(q, k, v, 'relu', eps=0.25, backend='triton') is linear.result
    (args, ) = linear.calls
    assert args[3:] == ('relu', 0.25) and all(a is b for a, b in zip(args[:3], (q, k, v)))
    assert inline_attention(q, k, v, 0.3, backend='triton') is inline.result
    (args, ) = inline.calls
    assert args[3] == 0.3 and all(a is b for a, b in zip(args[:3], (q, k, v)))


def test_inline_attention_honours_its_backend_argument(monkeypatch):
    """``backend='torch'`` wins over ``MMLINVIT_LINEAR_ATTN_BACKEND=triton`` for InLine too
    (mutant LD11: InLine ignored the argument, so a config's ``backend='torch'`` raised on
    CPU under a global ``triton`` setting)."""
    monkeypatch.setenv(BACKEND_ENV_VAR, 'triton')
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    q, k, v = _qkv(n=6, m=5, d=4, e=3)
    s = 0.4
    out = inline_attention(q, k, v, s, backend='torch')
    q64, k64, v64 = q.double(), k.double(), v.double()
    kbar = k64.mean(dim=-2, keepdim=True)
    attn = (s / 5) * (q64 @ k64.transpose(-2, -1)) + (1 - s * q64 @ kbar.transpose(-2, -1)) / 5
    want = attn @ v64
    torch.testing.assert_close(out.double(), want, **FP32)


def test_captured_graphs_take_the_graph_form_with_the_callers_eps(monkeypatch, no_backend_env):
    """While a graph is captured the dispatcher runs :func:`linear_attention_graph` (not the
    chunked autograd Function) with the caller's eps (mutants LD05: eager form under capture;
    LD06: eps dropped on the graph form)."""
    calls = []

    def graph_spy(*args, **kwargs):
        calls.append(args)
        return linear_attention_graph(*args, **kwargs)

    def chunked_forbidden(*args, **kwargs):
        raise AssertionError('the chunked form must not run while a graph is captured')

    monkeypatch.setattr(la_dispatch, 'capturing_graph', lambda: True)
    monkeypatch.setattr(la_dispatch, 'linear_attention_graph', graph_spy)
    monkeypatch.setattr(la_dispatch, 'linear_attention_torch', chunked_forbidden)
    q, k, v = _qkv(n=6, m=9, d=4, e=3)
    out = linear_attention(q, k, v, 'relu', eps=0.5)
    assert len(calls) == 1
    _, want = _linear_attention_loops(q, k, v, 'relu', 0.5)
    torch.testing.assert_close(out.double(), want, **FP32)


def test_default_feature_map_is_elu_and_default_eps_is_1e_6(no_backend_env):
    """``linear_attention(q, k, v)`` and the reference are ELU + 1 with eps = 1e-6 (mutants
    LD10 / LN06: a ReLU default; LD09: eps 1e-5).  The eps is visible with ReLU features of
    size ~1e-7, where phi(q).z is comparable to it."""
    q, k, v = _qkv(n=5, m=6, d=4, e=3, seed=1)
    _, want = _linear_attention_loops(q, k, v, 'elu', 1e-6)
    torch.testing.assert_close(linear_attention(q, k, v).double(), want, **FP32)
    torch.testing.assert_close(linear_attention_naive(q, k, v).double(), want, **FP32)
    tiny_q = 1e-7 * (torch.rand(2, 2, 5, 4, generator=_gen(2)) + 0.5)
    pos_k = torch.rand(2, 2, 6, 4, generator=_gen(3)) + 0.5
    _, want = _linear_attention_loops(tiny_q, pos_k, v, 'relu', 1e-6)
    _, other = _linear_attention_loops(tiny_q, pos_k, v, 'relu', 1e-5)
    assert (want - other).abs().max() > 1e-2  # the default is observable here
    torch.testing.assert_close(linear_attention(tiny_q, pos_k, v, 'relu').double(), want,
                               rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(linear_attention_naive(tiny_q, pos_k, v, 'relu').double(), want,
                               rtol=1e-4, atol=1e-6)


def test_unknown_feature_map_is_refused_before_the_backend_choice(monkeypatch):
    """A misspelt feature map is reported as such even when the requested backend cannot run
    here (mutant LD12: validation left to the backends, so forcing ``'triton'`` on CPU
    reported the device instead of the name)."""
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    q, k, v = _qkv()
    for backend in ('triton', 'torch', None):
        with pytest.raises(ValueError, match="Unknown feature map 'softplus'; available"):
            linear_attention(q, k, v, 'softplus', backend=backend)


# ================================================================= linear attention checks
def test_inputs_of_rank_two_are_refused():
    """q, k, v must be (..., tokens, dim) with at least one leading dim (mutant LC01)."""
    q, k, v = (t[0, 0] for t in _qkv())
    for call in (lambda: check_linear_attention_inputs(q, k, v),
                 lambda: linear_attention_torch(q, k, v, 'elu'),
                 lambda: linear_attention_graph(q, k, v, 'elu')):
        with pytest.raises(ValueError, match='equal rank >= 3'):
            call()


def test_values_with_other_leading_dims_are_refused():
    """Only v with batch 1 (q, k with batch 2) would broadcast in the products; the torch
    entry points name the shapes instead (mutant LC02: only k's leading dims were checked)."""
    q, k, v = _qkv()
    for call in (lambda: linear_attention_torch(q, k, v[:1], 'elu'),
                 lambda: linear_attention_graph(q, k, v[:1], 'elu'),
                 lambda: inline_attention_torch(q, k, v[:1], 0.5)):
        with pytest.raises(ValueError, match='leading'):
            call()


def test_kernel_limits_cover_every_linear_attention_input():
    """The kernels' reason covers empty queries, the value width, the value dtype and the
    rank of v (mutants LC03, LC04, LC05, LC06: each of them went unchecked)."""
    q, k, v = _qkv(d=16, e=16)
    assert la_unsupported_reason(q, k, v) is None
    assert la_unsupported_reason(q[:, :, :0], k, v) == 'empty token dimension'
    wide = la_unsupported_reason(q, k, torch.zeros(2, 2, 7, KERNEL_MAX_HEAD_DIM + 1))
    assert wide is not None and "'e': 129" in wide
    assert 'v has dtype torch.float64' in la_unsupported_reason(q, k, v.double())
    assert la_unsupported_reason(q, k, v[0]) == 'inputs are not 4-D (B, H, N, d)'


# ================================================================== linear attention naive
@pytest.mark.parametrize('feature_map', ['elu', 'relu', 'identity'])
def test_naive_map_entry_by_entry(feature_map):
    """The O(N^2) reference against A_ij computed entry by entry (cross attention, eps
    large enough to matter); for the signed identity map the normaliser is divided as it is,
    negative rows included (mutant LN07: |row sum| in the naive map)."""
    q, k, v = _qkv(n=5, m=7, d=3, e=2, seed=4)
    if feature_map == 'identity':
        k = k + 0.8  # row sums of both signs, away from zero
    eps = 0.05
    want_map, want_out = _linear_attention_loops(q, k, v, feature_map, eps)
    if feature_map == 'identity':
        sums = _phi_fp64(q, 'identity') @ _phi_fp64(k, 'identity').sum(-2).unsqueeze(-1)
        assert bool((sums < -0.2).any()) and bool((sums > 0.2).any())
        assert float((sums + 7 * eps).abs().min()) > 0.05
    torch.testing.assert_close(linear_attention_map_naive(q, k, feature_map, eps).double(),
                               want_map, **FP32)
    torch.testing.assert_close(linear_attention_naive(q, k, v, feature_map, eps).double(),
                               want_out, **FP32)


def test_naive_applies_the_feature_map_in_fp32_to_half_inputs():
    """bf16 q / k: the reference maps them in fp32 (ELU + 1 of the bf16 values), so it equals
    the fp64 formula on the same values to fp32 rounding (mutant LN01: phi computed in bf16
    and then widened, ~4e-3 relative error)."""
    q, k, v = _qkv(n=6, m=8, d=8, e=4, seed=5)
    q16, k16 = q.bfloat16(), k.bfloat16()
    _, want = _linear_attention_loops(q16, k16, v, 'elu', 1e-6)
    out = linear_attention_naive(q16, k16, v, 'elu')
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, **FP32)


# ============================================================================ SSD dispatch
def test_ssd_naive_backend_runs_the_sequential_oracle(monkeypatch, no_backend_env):
    """``backend='naive'`` selects and runs :func:`ssd_scan_naive` (mutants SD01: 'naive'
    treated as auto, i.e. torch; SD06: the naive choice ran the chunked scan)."""
    args = _ssd_args()
    assert select_ssd_backend(*args, backend='naive') == 'naive'
    calls = []

    def naive_spy(*a):
        calls.append(a)
        return ssd_scan_naive(*a)

    monkeypatch.setattr(ssd_dispatch, 'ssd_scan_naive', naive_spy)
    torch.testing.assert_close(ssd_scan(*args, backend='naive'), ssd_scan_naive(*args))
    assert len(calls) == 1


def test_ssd_environment_accepts_only_auto_torch_triton(monkeypatch):
    """``MMLINVIT_SSD_BACKEND=naive`` is refused: the oracle is chosen per call only
    (mutant SD02 let the environment switch a whole model to the O(L) Python loop)."""
    monkeypatch.setenv(SSD_BACKEND_ENV_VAR, 'naive')
    with pytest.raises(ValueError, match=r"MMLINVIT_SSD_BACKEND='naive' is not a SSD scan "
                       r"backend; available: \['auto', 'torch', 'triton'\]"):
        select_ssd_backend(*_ssd_args())


def test_ssd_kernel_is_unavailable_without_its_module(monkeypatch):
    """Triton installed but the kernel module missing: not available, and forcing it is a
    clear error (mutants SD03: only triton was looked up; SD10: the forced check did the
    same)."""
    monkeypatch.setattr(ssd_dispatch, 'triton_available', lambda: True)
    monkeypatch.setattr(ssd_dispatch, 'TRITON_KERNEL_MODULE', 'mmlinvit.ops.ssd.no_such_kernel')
    assert not triton_kernel_available()
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    with pytest.raises(RuntimeError, match="backend='triton' was requested but triton is not"):
        select_ssd_backend(*_ssd_args(), backend='triton')


def test_ssd_auto_on_cuda_respects_every_input(simulated_cuda):
    """``auto`` on a CUDA device keeps torch for a state size over the limit, fp64 C or fp64
    D (mutant SD05: the auto path ignored the inputs)."""
    x, dt, A, B, C, D = _ssd_args()
    assert select_ssd_backend(x, dt, A, B, C, D) == 'triton'
    big_state = torch.zeros(1, 9, 1, KERNEL_MAX_HEAD_DIM + 2)
    assert select_ssd_backend(x, dt, A, big_state, big_state, D) == 'torch'
    assert select_ssd_backend(x, dt, A, B, C.double(), D) == 'torch'
    assert select_ssd_backend(x, dt, A, B, C, D.double()) == 'torch'
    assert 'D has dtype torch.float64' in simulated_cuda[-1][1]


def test_ssd_forced_triton_checks_d(interpreter_allowed):
    """A forced ``'triton'`` refuses an fp64 D by name (mutant SD04: D left out)."""
    x, dt, A, B, C, D = _ssd_args()
    assert select_ssd_backend(x, dt, A, B, C, D, backend='triton') == 'triton'
    with pytest.raises(ValueError, match='D has dtype torch.float64'):
        select_ssd_backend(x, dt, A, B, C, D.double(), backend='triton')


def test_ssd_dispatch_forwards_chunking(monkeypatch, interpreter_allowed):
    """The kernel gets the caller's chunk size; the torch scan gets chunk_size (default 256,
    Mamba-2's) and chunks_per_step (mutants SD07, SD08, SD09)."""
    args = _ssd_args()
    kernel = _Recorder(torch.zeros(1))
    module = types.ModuleType('mmlinvit_round11_fake_ssd_kernel')
    module.ssd_scan_triton = kernel
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(ssd_dispatch, 'TRITON_KERNEL_MODULE', module.__name__)
    assert ssd_scan(*args, chunk_size=32, backend='triton') is kernel.result
    assert kernel.calls[0][6:] == (32, )
    seen = []

    def torch_spy(*a, **kw):
        seen.append(kw)
        return ssd_scan_torch(*a, **kw)

    monkeypatch.setattr(ssd_dispatch, 'ssd_scan_torch', torch_spy)
    ssd_scan(*args, backend='torch', chunks_per_step=2)
    ssd_scan(*args, chunk_size=4, backend='torch')
    assert seen == [dict(chunk_size=256, chunks_per_step=2),
                    dict(chunk_size=4, chunks_per_step=None)]


# ============================================================================== SSD checks
def test_ssd_checks_refuse_shapes_that_would_broadcast_or_be_cut():
    """B / C with L + 1 tokens were silently cut to L by the oracle, dt with one head
    broadcast over the heads, zero groups divided by zero (mutants SC01, SC02, SC09, SC03)."""
    x, dt, A, B, C, D = _ssd_args(length=6, heads=2)
    longer = torch.zeros(1, 7, 1, 16)
    cases = [((x, dt, A, longer, longer, D), r'B must be \(batch, L, groups, d_state\)'),
             ((x, dt, A, B, longer[:, :7], D), 'C must have the shape of B'),
             ((x, dt[..., :1], A, B, C, D), r'dt must be \(batch, L, heads\)'),
             ((x, dt, A, B[:, :, :0], C[:, :, :0], D), 'multiple of the number of B/C groups')]
    for inputs, match in cases:
        for call in (check_ssd_inputs, ssd_scan_naive, ssd_scan_torch):
            with pytest.raises(ValueError, match=match):
                call(*inputs)


@pytest.mark.parametrize('chunk_size', [True, 8.0, 0, -1])
def test_ssd_chunk_size_must_be_a_positive_int(chunk_size):
    """``True`` is an int to Python but no chunk size (mutant SC04 accepted it as 1)."""
    with pytest.raises(ValueError, match='chunk_size must be a positive int'):
        check_chunk_size(chunk_size)
    with pytest.raises(ValueError, match='chunk_size must be a positive int'):
        ssd_scan_torch(*_ssd_args(), chunk_size=chunk_size)


def test_ssd_kernel_limits_cover_every_input():
    """The reason names the state size, an empty sequence, and the dtypes of C and D
    (mutants SC05, SC07, SC08, SC06)."""
    x, dt, A, B, C, D = _ssd_args()
    assert ssd_unsupported_reason(x, dt, A, B, C, D) is None
    big = torch.zeros(1, 9, 1, KERNEL_MAX_HEAD_DIM + 1)
    assert "'N': 129" in ssd_unsupported_reason(x, dt, A, big, big, D)
    assert ssd_unsupported_reason(x[:, :0], dt[:, :0], A, B[:, :0], C[:, :0], D) == \
        'empty batch or sequence'
    assert 'C has dtype torch.float64' in ssd_unsupported_reason(x, dt, A, B, C.double(), D)
    assert 'D has dtype torch.float64' in ssd_unsupported_reason(x, dt, A, B, C, D.double())


# =============================================================================== SSD naive
@pytest.mark.parametrize('heads,groups', [(4, 2), (3, 1), (2, 2)])
def test_ssd_naive_equals_the_quadratic_dual_form(heads, groups):
    """The sequential oracle against the scan's quadratic form (a formula without any
    recurrence), fp64, with and without D."""
    args = _ssd_args(batch=2, length=11, heads=heads, groups=groups, headdim=3, d_state=4,
                     seed=6, dtype=torch.float64)
    torch.testing.assert_close(ssd_scan_naive(*args), _ssd_dual_form(*args), rtol=1e-10,
                               atol=1e-10)
    torch.testing.assert_close(ssd_scan_naive(*args[:5]), _ssd_dual_form(*args[:5], None),
                               rtol=1e-10, atol=1e-10)


def test_ssd_naive_on_an_empty_sequence():
    """L = 0 gives an empty output of the input's shape (mutant SN07: stacking no tokens)."""
    x, dt, A, B, C, D = (t[:, :0] if t.dim() > 1 else t for t in _ssd_args())
    out = ssd_scan_naive(x, dt, A, B, C, D)
    assert out.shape == x.shape and out.dtype == x.dtype


# ============================================================================ triton_utils
def test_dot_precision_rules(monkeypatch):
    """IEEE in the interpreter; any fp32 operand keeps IEEE unless torch allows TF32; 16-bit
    operands only use TF32 (mutants TU01, TU02, TU03)."""
    fp32, bf16 = torch.zeros(1), torch.zeros(1, dtype=torch.bfloat16)
    assert dot_precision(True, fp32) == 'ieee'
    assert dot_precision(True, bf16) == 'ieee'
    monkeypatch.setattr(torch.backends.cuda.matmul, 'allow_tf32', False)
    assert dot_precision(False, fp32) == 'ieee'
    assert dot_precision(False, bf16, fp32) == 'ieee'
    assert dot_precision(False, bf16, bf16) == 'tf32'
    monkeypatch.setattr(torch.backends.cuda.matmul, 'allow_tf32', True)
    assert dot_precision(False, bf16, fp32) == 'tf32'


def test_device_guard_selects_the_inputs_cuda_device():
    """Launches on ``cuda:1`` inputs need ``cuda:1`` current (mutant TU04: no guard)."""
    guard = device_guard(torch.device('cuda', 1))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    assert not isinstance(device_guard(torch.device('cpu')), torch.cuda.device)


def test_kernel_device_check():
    """Interpreted kernels refuse CUDA tensors, compiled ones refuse CPU tensors, each with
    the fix (mutants TU14, TU15)."""
    with pytest.raises(RuntimeError, match='unset TRITON_INTERPRET for CUDA'):
        check_kernel_device(CUDA, True, 'Triton SSD')
    with pytest.raises(RuntimeError, match='the Triton SSD kernels need CUDA tensors'):
        check_kernel_device(torch.device('cpu'), False, 'Triton SSD')
    check_kernel_device(CUDA, False, 'Triton SSD')


@pytest.mark.parametrize('value,expected', [(' Triton ', 'triton'), ('TORCH', 'torch'),
                                            ('', 'auto'), ('  ', 'auto'), (None, 'auto')])
def test_backend_environment_values(monkeypatch, value, expected):
    """The environment variable is case- and space-insensitive and empty means auto
    (mutants TU05: case kept; TU06: empty read as 'torch', which would disable the kernels)."""
    if value is None:
        monkeypatch.delenv(SSD_BACKEND_ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(SSD_BACKEND_ENV_VAR, value)
    assert backend_from_env(SSD_BACKEND_ENV_VAR) == expected
    assert requested_backend(None, ('auto', 'torch', 'triton'), SSD_BACKEND_ENV_VAR,
                             ('auto', 'torch', 'triton'), 'SSD scan') == expected


@pytest.mark.parametrize('value,expected', [('1', True), ('true', True), ('On', True),
                                            (' yes ', True), ('0', False), ('false', False),
                                            ('', False)])
def test_triton_interpret_values(monkeypatch, value, expected):
    """The truthy spellings triton itself accepts (mutant TU16: only '1')."""
    monkeypatch.setenv('TRITON_INTERPRET', value)
    assert triton_interpreter_enabled() is expected


def test_auto_choice_without_triton_or_off_cuda():
    """``auto`` keeps torch when the kernels are not installed (on CUDA) and for any non-CUDA
    device, e.g. meta tensors of shape tracing (mutants TU08, TU09)."""
    logged: List[Tuple[str, str]] = []
    assert choose_auto_backend(CUDA, lambda: False, lambda: None,
                               lambda *pair: logged.append(pair)) == 'torch'
    assert logged[-1] == ('torch', 'auto: triton is not installed')
    assert choose_auto_backend(META, lambda: True, lambda: None,
                               lambda *pair: logged.append(pair)) == 'torch'
    assert logged[-1] == ('torch', 'auto: meta tensors')


def test_forced_triton_refuses_non_cuda_devices(monkeypatch):
    """Without the interpreter a forced ``'triton'`` needs CUDA tensors, not just non-CPU
    ones (mutant TU10 let meta tensors through)."""
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    with pytest.raises(RuntimeError, match=r"needs CUDA tensors \(got meta\)"):
        check_forced_triton(META, True, lambda: None, 'linear attention')


def test_kernel_limits_boundaries():
    """Head dims up to and including 128 fit; every tensor's dtype is checked, not only the
    first; all inputs on one device (mutants TU11, TU13, TU12)."""
    fp32 = torch.zeros(1)
    assert kernel_limits_reason({'d': KERNEL_MAX_HEAD_DIM}, [('q', fp32)]) is None
    assert kernel_limits_reason({'d': KERNEL_MAX_HEAD_DIM + 1}, [('q', fp32)]) is not None
    assert kernel_limits_reason({'d': 8}, [('q', fp32), ('k', fp32.double())]) == (
        "k has dtype torch.float64; the kernels take ['torch.float32', 'torch.float16', "
        "'torch.bfloat16']")
    assert kernel_limits_reason({'d': 8}, [('q', fp32), ('k', torch.zeros(1, device=META))]) \
        == "inputs are on different devices: ['cpu', 'meta']"


# =========================================================================== graph capture
def test_capturing_graph_detects_tracing_and_exports(monkeypatch):
    """jit tracing, ONNX export and torch.export count as captures; eager does not (mutants
    GC01, GC02, GC04)."""
    assert capturing_graph() is False
    seen: List[bool] = []

    def record(x: torch.Tensor) -> torch.Tensor:
        seen.append(capturing_graph())
        return x + 1

    torch.jit.trace(record, torch.zeros(2), check_trace=False)
    assert seen == [True]
    monkeypatch.setattr(torch.onnx, 'is_in_onnx_export', lambda: True)
    assert capturing_graph() is True
    monkeypatch.setattr(torch.onnx, 'is_in_onnx_export', lambda: False)
    monkeypatch.setattr(torch.compiler, 'is_exporting', lambda: True)
    assert capturing_graph() is True


def test_capturing_graph_under_torch_compile():
    """dynamo traces ``capturing_graph()`` as True, so the whole-tensor forms are compiled
    (mutant GC03: ``is_compiling`` left out)."""

    def pick(x: torch.Tensor) -> torch.Tensor:
        return x + 1 if graph_capture.capturing_graph() else x - 1

    torch._dynamo.reset()
    compiled = torch.compile(pick, fullgraph=True, backend='eager')
    assert torch.equal(compiled(torch.zeros(3)), torch.ones(3))
    assert torch.equal(pick(torch.zeros(3)), -torch.ones(3))


# ============================================================================ feature maps
def test_feature_maps_are_the_textbook_functions():
    """ELU + 1 = x + 1 for x > 0 and exp(x) otherwise; ReLU exactly 0 below 0 (mutants FM01 /
    FM05: ELU of x + 1, ELU with alpha 0.5; FM02: ReLU floored at 1e-6)."""
    x = torch.tensor([-30.0, -3.0, -1.0, -0.25, 0.0, 1e-8, 0.5, 2.0, 40.0], dtype=torch.float64)
    torch.testing.assert_close(get_feature_map('elu')(x), _phi_fp64(x, 'elu'), rtol=1e-15,
                               atol=1e-15)
    assert torch.equal(get_feature_map('relu')(x), _phi_fp64(x, 'relu'))
    assert torch.equal(get_feature_map('identity')(x), x)


# ============================================================================== precision
def test_autocast_guard_is_a_no_op_on_meta_tensors():
    """Shape / FLOP tracing on meta tensors runs the guarded references (mutant PR01: an
    autocast context for the meta device, which has no autocast backend)."""
    q, k, v = (torch.empty(1, 2, 5, 4, device=META) for _ in range(3))
    with autocast_disabled(META):
        pass
    out = linear_attention_naive(q, k, v)
    assert out.shape == (1, 2, 5, 4) and out.device.type == 'meta'
    assert identity_linear_attention(q, k, v, 1e-6).shape == (1, 2, 5, 4)


# ============================================================================= patch grid
def test_heads_to_grid_and_back_by_hand():
    """Channel ``head * d + i`` at pixel (y, x) holds token ``prefix + y * w + x`` of that
    head, on a non-square grid; the inverse puts zero rows first for the prefix tokens
    (mutants PG01: grid transposed; PG02: zero rows appended; PG03: channel order i * H + head)."""
    b, nh, d, (h, w), p = 2, 3, 2, (2, 5), 2
    t = torch.randn(b, nh, p + h * w, d, generator=_gen(7))
    grid = heads_to_grid(t, (h, w), p)
    assert grid.shape == (b, nh * d, h, w)
    for head in range(nh):
        for i in range(d):
            for y in range(h):
                for x in range(w):
                    assert grid[:, head * d + i, y, x].tolist() == \
                        t[:, head, p + y * w + x, i].tolist()
    back = grid_to_heads(grid, nh, p)
    assert back.shape == t.shape
    assert torch.equal(back[:, :, p:], t[:, :, p:])
    assert torch.count_nonzero(back[:, :, :p]) == 0


def _depthwise_by_hand(x: torch.Tensor, weight: torch.Tensor,
                       bias: Optional[torch.Tensor]) -> torch.Tensor:
    """out[b, c, y, x] = sum_ij w[(b,) c, i, j] x[b, c, y + i - k//2, x + j - k//2] + bias[c]."""
    b, c, h, w = x.shape
    k = weight.shape[-1]
    kernels = weight if weight.dim() == 4 else weight.expand(b, c, k, k)
    out = torch.zeros(b, c, h, w, dtype=torch.float64)
    for y in range(h):
        for xx in range(w):
            for i in range(k):
                for j in range(k):
                    yy, xj = y + i - k // 2, xx + j - k // 2
                    if 0 <= yy < h and 0 <= xj < w:
                        out[:, :, y, xx] += kernels[:, :, i, j].double() * x[:, :, yy, xj].double()
    if bias is not None:
        out += bias.double().view(1, c, 1, 1)
    return out


@pytest.mark.parametrize('per_sample', [False, True])
@pytest.mark.parametrize('with_bias', [False, True])
def test_depthwise_convolutions_by_hand(per_sample, with_bias):
    """Both depthwise convolutions against the sum written out, asymmetric 3 x 3 kernels on
    a non-square grid, static and per-sample, with and without bias (mutants PG04: the
    per-sample path dropped the bias; PG05: kernel transposed in the reference)."""
    gen = _gen(8)
    x = torch.randn(2, 3, 4, 5, generator=gen)
    weight = torch.randn(*((2, ) if per_sample else ()), 3, 3, 3, generator=gen)
    bias = torch.randn(3, generator=gen) if with_bias else None
    want = _depthwise_by_hand(x, weight, bias)
    torch.testing.assert_close(depthwise_conv2d(x, weight, bias).double(), want, **FP32)
    torch.testing.assert_close(depthwise_conv2d_reference(x, weight, bias).double(), want,
                               **FP32)


# =========================================================================== causal conv
def test_causal_conv_gradient_when_only_the_bias_requires_it():
    """dL/dbias_c = sum_{b, t} g[b, c, t]: the autograd form must run when only the bias
    needs a gradient (mutant CC01: bias left out of needs_grad, no graph built)."""
    gen = _gen(9)
    x = torch.randn(2, 4, 10, generator=gen)
    weight = torch.randn(4, 1, 3, generator=gen)
    bias = torch.randn(4, generator=gen).requires_grad_()
    out = causal_depthwise_conv1d(x, weight, bias)
    assert out.requires_grad
    grad = torch.randn(out.shape, generator=gen)
    (got, ) = torch.autograd.grad(out, bias, grad)
    torch.testing.assert_close(got, grad.sum(dim=(0, 2)))


def test_causal_conv_refuses_weights_and_biases_that_are_not_depthwise():
    """weight (C, 2, K) would be silently cut to its first input channel, a (1,) bias
    broadcast over the channels (mutants CC02, CC06)."""
    x = torch.randn(1, 4, 6)
    with pytest.raises(ValueError, match=r'weight \(C, 1, K\)'):
        causal_depthwise_conv1d(x, torch.randn(4, 2, 3))
    with pytest.raises(ValueError, match=r'bias must be \(4,\)'):
        causal_depthwise_conv1d(x, torch.randn(4, 1, 3), torch.randn(1))


# ================================================================== identity-map attention
def test_identity_attention_in_cross_attention():
    """out_i = q_i (K^T V / M) / safe(q_i.kbar) with M keys != N queries, and the map's rows
    (mutants IA01: K^T V divided by N; IA02: the map's normaliser scaled by N); bf16 values
    give a bf16 output (IA03)."""
    q, k, v = _qkv(n=6, m=9, d=3, e=2, seed=10, dtype=torch.float64)
    k = k + 0.7
    eps = 0.05
    kbar = k.mean(dim=-2)
    den = (q * kbar[..., None, :]).sum(-1, keepdim=True)
    safe = torch.where(den >= 0, den + eps, den - eps)
    want_map = (q @ k.transpose(-2, -1)) / (9 * safe)
    want = want_map @ v
    torch.testing.assert_close(identity_linear_attention(q, k, v, eps).double(), want, **FP32)
    torch.testing.assert_close(identity_linear_attention_map(q, k, eps).double(), want_map,
                               **FP32)
    assert identity_linear_attention(q, k, v.bfloat16(), eps).dtype == torch.bfloat16


# ==================================================================================== MHLA
def test_mhla_refuses_a_mixing_matrix_of_another_block_count():
    """Four blocks of tokens with a 2-block mixing matrix is a configuration error named as
    such (mutant MH07: the check removed, an opaque matmul shape error instead)."""
    hw, grid = (4, 4), (2, 2)
    phi = torch.rand(1, 2, 16, 3)
    with pytest.raises(ValueError, match='4 blocks of tokens for a 2-block mixing matrix'):
        mhla_attention(phi, phi, torch.randn(1, 2, 16, 2), block_token_indices(hw, grid, 0), 0,
                       torch.eye(2)[None], 1e-6)
