"""Triton SSD scan against the PyTorch scan (forward and gradients of x, dt, A, B, C, D).

With a GPU the compiled kernels are tested on CUDA tensors.  Without one they run in the
Triton CPU interpreter, which needs ``TRITON_INTERPRET=1`` in the environment *before triton is
imported* and while the kernels run.  ``tests/conftest.py`` (and :mod:`triton_testing`, when
triton is not imported yet) set it; when something else already imported triton without it, the
kernel tests are re-run in a fresh interpreter subprocess by
:func:`test_kernels_in_interpreter_subprocess`.

References are the chunked PyTorch scan in fp64 on the same (rounded) inputs, i.e. the exact
algebra, so the bounds measure the kernels' own error.  Sizes are tiny (B <= 2, H <= 4).
"""
from types import ModuleType
from typing import List, Optional, Sequence, Tuple

import pytest
import torch
import torch.nn.functional as F
# Imported before mmlinvit: it switches the Triton interpreter on while triton is not imported.
from triton_testing import (allow_interpreter_dispatch, collect_backend_log, import_kernels,
                            only_in_parent, requires_triton, run_here,
                            run_in_interpreter_subprocess)

from mmlinvit.layers.mamba2 import Mamba2Mixer
from mmlinvit.ops.ssd import (SSD_BACKEND_ENV_VAR, select_ssd_backend, ssd_scan,
                              ssd_scan_torch, ssd_scan_naive)
from mmlinvit.ops.ssd import dispatch
from mmlinvit.ops.ssd.checks import kernel_unsupported_reason

pytestmark = requires_triton

NAMES = ('x', 'dt', 'A', 'B', 'C', 'D')


@only_in_parent
def test_kernels_in_interpreter_subprocess():
    run_in_interpreter_subprocess(__file__)


@pytest.fixture(scope='module')
def kernels() -> Tuple[ModuleType, torch.device]:
    """The kernel module and the device its kernels run on (CPU = interpreter)."""
    return import_kernels('mmlinvit.ops.ssd.triton_kernel')


@pytest.fixture
def interpreter_env(monkeypatch, kernels) -> torch.device:
    """Lets dispatch force 'triton' on CPU tensors when the kernels are interpreted."""
    return allow_interpreter_dispatch(monkeypatch, kernels)


def make_inputs(batch: int, length: int, heads: int, headdim: int, groups: int, d_state: int,
                a_range: Tuple[float, float] = (1.0, 16.0), seed: int = 0) -> List[torch.Tensor]:
    """fp64 SSD inputs at Mamba-2 scales (dt = softplus(.), A < 0, B/C ~ N^-1/2)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = randn(batch, length, heads, headdim)
    dt = F.softplus(randn(batch, length, heads) - 1.0)
    A = -(torch.rand(heads, generator=gen, dtype=torch.float64) * (a_range[1] - a_range[0]) +
          a_range[0])
    B = randn(batch, length, groups, d_state) * d_state**-0.5
    C = randn(batch, length, groups, d_state) * d_state**-0.5
    D = randn(heads)
    return [x, dt, A, B, C, D]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / max(||want||, 1e-3): absolute for (near) zero references.

    E.g. dA at L = 1 is exactly 0 (y_0 does not depend on A) and comes out as ~1e-8.
    """
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-3)).item()


def check_against_reference(kernel, inputs64: Sequence[Optional[torch.Tensor]], chunk_size: int,
                            device: torch.device, dtypes: Sequence[torch.dtype],
                            tol: float, tol_da: float) -> None:
    """Kernel on inputs cast to ``dtypes`` vs the fp64 chunked scan of the same values."""
    cast = [None if t is None else t.to(dt) for t, dt in zip(inputs64, dtypes)]
    leaves = [None if t is None else t.to(device).requires_grad_() for t in cast]
    ref_leaves = [None if t is None else t.double().requires_grad_() for t in cast]
    out = kernel.ssd_scan_triton(*leaves, chunk_size=chunk_size)
    ref = ssd_scan_torch(*ref_leaves, chunk_size=chunk_size)
    assert out.dtype == cast[0].dtype and out.shape == ref.shape
    assert rel_err(out.cpu(), ref) <= tol, ('y', rel_err(out.cpu(), ref))

    grad = torch.randn(ref.shape, dtype=torch.float64)
    present = [i for i, t in enumerate(leaves) if t is not None]
    got = torch.autograd.grad(out, [leaves[i] for i in present], grad.to(out))
    want = torch.autograd.grad(ref, [ref_leaves[i] for i in present], grad)
    for i, g, w in zip(present, got, want):
        assert g.dtype == leaves[i].dtype and g.shape == leaves[i].shape, NAMES[i]
        bound = tol_da if NAMES[i] == 'A' else tol
        assert rel_err(g.cpu(), w) <= bound, (NAMES[i], rel_err(g.cpu(), w))


FP32 = (torch.float32, ) * 6


@pytest.mark.parametrize('length,chunk_size,batch,heads,groups', [
    (1, 16, 1, 2, 1),
    (63, 16, 2, 4, 2),
    (63, 32, 1, 4, 4),
    (200, 16, 1, 2, 1),
    (200, 32, 2, 4, 2),
])
@run_here
def test_fp32_forward_and_gradients_ragged(kernels, length, chunk_size, batch, heads, groups):
    kernel, device = kernels
    inputs = make_inputs(batch, length, heads, 16, groups, 16, a_range=(0.1, 8.0))
    # dA sums O(L) terms that cancel: the fp32 torch path has the same ~1e-4 error.
    check_against_reference(kernel, inputs, chunk_size, device, FP32, 2e-5, 1e-3)


@pytest.mark.parametrize('a_range', [(1.0, 16.0), (0.01, 0.1)])
@run_here
def test_strong_and_weak_decay(kernels, a_range):
    """Mamba-2 init range (states die within a chunk) and slow decay (states cross chunks)."""
    kernel, device = kernels
    inputs = make_inputs(1, 100, 2, 8, 1, 16, a_range=a_range)
    check_against_reference(kernel, inputs, 32, device, FP32, 2e-5, 1e-3)


@run_here
def test_matches_sequential_oracle(kernels):
    kernel, device = kernels
    x, dt, A, B, C, D = [t.float().to(device) for t in make_inputs(1, 45, 4, 8, 2, 16,
                                                                   a_range=(0.1, 4.0))]
    out = kernel.ssd_scan_triton(x, dt, A, B, C, D, chunk_size=16)
    torch.testing.assert_close(out.cpu(), ssd_scan_naive(x.cpu(), dt.cpu(), A.cpu(), B.cpu(),
                                                         C.cpu(), D.cpu()), rtol=1e-5, atol=1e-5)


@run_here
def test_non_power_of_two_sizes_without_d(kernels):
    """P = 24, N = 20 and chunk 24 are masked up to power-of-two tiles; D omitted."""
    kernel, device = kernels
    inputs = make_inputs(1, 70, 2, 24, 1, 20, a_range=(0.1, 4.0))
    inputs[5] = None
    check_against_reference(kernel, inputs, 24, device, FP32, 2e-5, 1e-3)


@run_here
def test_largest_head_and_state(kernels):
    kernel, device = kernels
    inputs = make_inputs(1, 40, 1, 128, 1, 128, a_range=(0.1, 4.0))
    check_against_reference(kernel, inputs, 32, device, FP32, 2e-5, 1e-3)


@pytest.mark.parametrize('dtype,tol', [(torch.float16, 2e-3), (torch.bfloat16, 1.5e-2)])
@run_here
def test_half_precision_inputs(kernels, dtype, tol):
    """16-bit x, B, C (fp32 dt, A, D as in the mixer); fp32 math on the rounded values."""
    kernel, device = kernels
    inputs = make_inputs(1, 63, 4, 16, 2, 16, a_range=(0.1, 4.0))
    dtypes = (dtype, torch.float32, torch.float32, dtype, dtype, torch.float32)
    check_against_reference(kernel, inputs, 16, device, dtypes, tol, 1e-3 + tol)


@pytest.mark.parametrize('split', [True, False])
@run_here
def test_split_gradient_products(kernels, monkeypatch, split):
    """The hi + lo split of the dt / A gradient products (forced on or off) is the same
    algebra: bf16 inputs and dy, every gradient against the fp64 scan on the rounded values."""
    kernel, device = kernels
    base = kernel._LaunchConfig

    class Forced(base):

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.split_grad_dots = split

    monkeypatch.setattr(kernel, '_LaunchConfig', Forced)
    inputs = make_inputs(1, 75, 4, 16, 2, 16, a_range=(0.1, 4.0), seed=3)
    dtypes = (torch.bfloat16, torch.float32, torch.float32, torch.bfloat16, torch.bfloat16,
              torch.float32)
    check_against_reference(kernel, inputs, 32, device, dtypes, 1.5e-2, 1e-2)


@run_here
def test_all_fp16_inputs(kernels):
    kernel, device = kernels
    inputs = make_inputs(1, 50, 2, 16, 1, 16, a_range=(0.1, 4.0))
    check_against_reference(kernel, inputs, 16, device, (torch.float16, ) * 6, 2e-3, 5e-3)


@run_here
def test_strided_views_as_in_the_mixer(kernels):
    """x, B, C split from one projection (non-contiguous), a transposed upstream gradient."""
    kernel, device = kernels
    batch, length, heads, headdim, d_state = 1, 37, 2, 8, 16
    xbc = torch.randn(batch, length, heads * headdim + 2 * d_state, device=device,
                      requires_grad=True)
    dt = F.softplus(torch.randn(batch, length, heads, device=device) - 1.0)
    A = -torch.rand(heads, device=device) * 4.0
    D = torch.randn(heads, device=device)
    grad = torch.randn(batch, heads, length, headdim, device=device).transpose(1, 2)

    def scan(fn, xbc_in):
        x, b, c = torch.split(xbc_in, [heads * headdim, d_state, d_state], dim=-1)
        return fn(x.reshape(batch, length, heads, headdim), dt, A,
                  b.reshape(batch, length, 1, d_state), c.reshape(batch, length, 1, d_state), D,
                  chunk_size=16)

    out = scan(kernel.ssd_scan_triton, xbc)
    (got, ) = torch.autograd.grad(out, xbc, grad)
    ref = scan(ssd_scan_torch, xbc)
    (want, ) = torch.autograd.grad(ref, xbc, grad)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@run_here
def test_partial_requires_grad_and_empty_sequence(kernels):
    kernel, device = kernels
    x, dt, A, B, C, D = [t.float().to(device) for t in make_inputs(1, 20, 2, 8, 1, 16)]
    x.requires_grad_()
    out = kernel.ssd_scan_triton(x, dt, A, B, C, D, chunk_size=16)
    (gx, ) = torch.autograd.grad(out.sum(), x)
    (want, ) = torch.autograd.grad(ssd_scan_torch(x, dt, A, B, C, D, chunk_size=16).sum(), x)
    torch.testing.assert_close(gx, want, rtol=1e-4, atol=1e-5)
    empty = kernel.ssd_scan_triton(x[:, :0], dt[:, :0], A, B[:, :0], C[:, :0], D)
    assert empty.shape == (1, 0, 2, 8)


@run_here
def test_double_backward_raises_and_empty_batch(kernels):
    """A second derivative through the kernels is refused: it came back as a constant (a
    gradient penalty on it counted as 0).  An empty batch crashed the backward pass."""
    kernel, device = kernels
    x, dt, A, B, C, D = [t.float().to(device) for t in make_inputs(1, 20, 2, 8, 1, 16)]
    x.requires_grad_()
    (gx, ) = torch.autograd.grad(kernel.ssd_scan_triton(x, dt, A, B, C, D).square().sum(), x,
                                 create_graph=True)
    with pytest.raises(RuntimeError, match='once_differentiable|second derivative|twice'):
        gx.square().sum().backward()
    empty = [t[:0] for t in (x, dt)] + [A] + [t[:0] for t in (B, C)] + [D]
    empty[0] = empty[0].detach().requires_grad_()
    # auto sends it to torch on a GPU too (it reached the kernels, whose backward crashed)
    assert 'empty batch' in kernel_unsupported_reason(*empty)
    out = ssd_scan(*empty, chunk_size=16)
    assert out.shape == (0, 20, 2, 8)
    out.sum().backward()
    assert empty[0].grad.shape == empty[0].shape
    assert kernel.ssd_scan_triton(*empty).shape == (0, 20, 2, 8)


@run_here
def test_kernel_rejects_unsupported_inputs(kernels):
    kernel, device = kernels
    x, dt, A, B, C, D = [t.float().to(device) for t in make_inputs(1, 8, 2, 8, 1, 16)]
    with pytest.raises(ValueError, match='<= 128'):
        kernel.ssd_scan_triton(torch.zeros(1, 8, 2, 130, device=device), dt, A, B, C, D)
    with pytest.raises(ValueError, match='dtype'):
        kernel.ssd_scan_triton(x.double(), dt, A, B, C, D)
    with pytest.raises(ValueError, match='chunk_size'):
        kernel.ssd_scan_triton(x, dt, A, B, C, D, chunk_size=0)
    with pytest.raises(ValueError, match='multiple of the number of B/C groups'):
        kernel.ssd_scan_triton(x, dt, A, B.expand(-1, -1, 3, -1), C.expand(-1, -1, 3, -1), D)


# ------------------------------------------------------------------------------------------
# Dispatch to the kernel
# ------------------------------------------------------------------------------------------


@run_here
def test_dispatch_env_switch_and_log_once(monkeypatch, interpreter_env):
    device = interpreter_env
    args = [t.float().to(device) for t in make_inputs(1, 30, 2, 8, 1, 16)]
    with collect_backend_log(monkeypatch, dispatch) as messages:
        monkeypatch.setenv(SSD_BACKEND_ENV_VAR, 'triton')
        outs = [ssd_scan(*args, chunk_size=16) for _ in range(2)]
        monkeypatch.setenv(SSD_BACKEND_ENV_VAR, 'torch')
        ref = ssd_scan(*args, chunk_size=16)
        # The argument beats the environment.
        forced = ssd_scan(*args, chunk_size=16, backend='triton')
        monkeypatch.setenv(SSD_BACKEND_ENV_VAR, 'auto')
        expected_auto = 'triton' if device.type == 'cuda' else 'torch'
        assert select_ssd_backend(*args) == expected_auto
        monkeypatch.delenv(SSD_BACKEND_ENV_VAR)
        assert select_ssd_backend(*args) == expected_auto
        monkeypatch.setenv(SSD_BACKEND_ENV_VAR, 'cuda')
        with pytest.raises(ValueError, match='available'):
            ssd_scan(*args)
    for out in outs + [forced]:
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert sum('triton (forced)' in m for m in messages) == 1, messages
    assert sum('torch (forced)' in m for m in messages) == 1, messages
    assert sum('auto' in m for m in messages) == 1, messages


@run_here
def test_dispatch_refuses_cpu_without_interpreter_and_bad_inputs(monkeypatch, interpreter_env):
    device = interpreter_env
    args = [t.float().to(device) for t in make_inputs(1, 10, 2, 8, 1, 16)]
    with pytest.raises(ValueError, match='head dims / state size'):
        x = torch.zeros(1, 10, 2, 160, device=device)
        ssd_scan(x, *args[1:], backend='triton')
    with pytest.raises(ValueError, match='dtype'):
        ssd_scan(*[t.double() for t in args], backend='triton')
    cpu_args = [t.cpu() for t in args]
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    with pytest.raises(RuntimeError, match='TRITON_INTERPRET'):
        ssd_scan(*cpu_args, backend='triton')


@run_here
def test_mixer_with_triton_backend(interpreter_env):
    """The Mamba-2 mixer gives the same outputs and parameter gradients on both scans."""
    device = interpreter_env
    ref = Mamba2Mixer(16, d_state=8, headdim=8, ngroups=2, chunk_size=16,
                      ssd_backend='torch').to(device)
    fast = Mamba2Mixer(16, d_state=8, headdim=8, ngroups=2, chunk_size=16,
                       ssd_backend='triton').to(device)
    fast.load_state_dict(ref.state_dict())
    u = torch.randn(2, 21, 16, device=device)
    out, want = fast(u), ref(u)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    out.pow(2).sum().backward()
    want.pow(2).sum().backward()
    for (name, p), q in zip(fast.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
