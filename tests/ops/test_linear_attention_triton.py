"""Triton linear attention kernels against the PyTorch references (forward and gradients).

With a GPU the compiled kernels are tested on CUDA tensors.  Without one they run in the
Triton CPU interpreter, which needs ``TRITON_INTERPRET=1`` in the environment *before triton is
imported* and while the kernels run (triton decorates its own library at import).
:mod:`triton_testing` sets it when triton is not imported yet; when something else (e.g. timm ->
torch._dynamo) already imported triton without it, the kernel tests are re-run in a fresh
interpreter subprocess by :func:`test_kernels_in_interpreter_subprocess`.  Sizes are tiny (B=1,
H<=2).
"""
from types import ModuleType
from typing import Tuple

import pytest
import torch
# Imported before mmlinvit: it switches the Triton interpreter on while triton is not imported.
from triton_testing import (allow_interpreter_dispatch, collect_backend_log, import_kernels,
                            only_in_parent, requires_triton, run_here,
                            run_in_interpreter_subprocess)

from mmlinvit.ops.feature_maps import get_feature_map
from mmlinvit.ops.linear_attention import (BACKEND_ENV_VAR, inline_attention,
                                           inline_attention_torch, linear_attention,
                                           linear_attention_torch, select_backend)
from mmlinvit.ops.linear_attention import dispatch

pytestmark = requires_triton


@only_in_parent
def test_kernels_in_interpreter_subprocess():
    run_in_interpreter_subprocess(__file__)


@pytest.fixture(scope='module')
def kernels() -> Tuple[ModuleType, torch.device]:
    """The fused module and the device its kernels run on (CPU = interpreter)."""
    return import_kernels('mmlinvit.ops.linear_attention.triton_kernel')


@pytest.fixture
def interpreter_env(monkeypatch, kernels):
    """Lets dispatch force 'triton' on CPU tensors when the kernels are interpreted."""
    return allow_interpreter_dispatch(monkeypatch, kernels)


def _qkv(n: int, m: int, d: int, e: int, device: torch.device, heads: int = 2,
         dtype: torch.dtype = torch.float32):
    q = torch.randn(1, heads, n, d, device=device).to(dtype).requires_grad_()
    k = torch.randn(1, heads, m, d, device=device).to(dtype).requires_grad_()
    v = torch.randn(1, heads, m, e, device=device).to(dtype).requires_grad_()
    return q, k, v


def _reference(q, k, v, feature_map: str, eps: float = 1e-6):
    phi = get_feature_map(feature_map)
    return linear_attention_torch(phi(q.float()), phi(k.float()), v, 'identity', eps)


def _check(out, ref, inputs, ref_inputs, atol: float, rtol: float) -> None:
    grad = torch.randn_like(ref)
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)
    got = torch.autograd.grad(out, inputs, grad.to(out.dtype), retain_graph=True)
    want = torch.autograd.grad(ref, ref_inputs, grad)
    for name, a, b in zip('qkv', got, want):
        assert a.dtype == b.dtype, name
        torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol, msg=name)


@pytest.mark.parametrize('n', [1, 63, 197, 1025])
@run_here
def test_elu_forward_and_gradients_ragged(kernels, n):
    fused, device = kernels
    q, k, v = _qkv(n, n, 64, 64, device, heads=2 if n < 1025 else 1)
    out = fused.linear_attention_triton(q, k, v, 'elu')
    _check(out, _reference(q, k, v, 'elu'), (q, k, v), (q, k, v), 1e-5, 1e-4)


@pytest.mark.parametrize('target,n', [(1, 1025), (3, 197), (4, 449), (8, 449)])
@run_here
def test_output_kernel_tiles_per_program(kernels, monkeypatch, target, n):
    """Several query tiles per output program (the last program's tail masked), ELU and
    InLine, against the torch path; ``target`` programs over 2 heads."""
    fused, device = kernels
    base = fused._LaunchConfig

    class Tiled(base):

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.target_programs_out = target

    monkeypatch.setattr(fused, '_LaunchConfig', Tiled)
    cfg = Tiled(64, 48, device, 'ieee')
    per_program, programs = cfg.output_tiling(n, 2)
    assert per_program > 1 and per_program * programs * cfg.block_out >= n
    q, k, v = _qkv(n, n + 7, 64, 48, device)
    out = fused.linear_attention_triton(q, k, v, 'elu')
    _check(out, _reference(q, k, v, 'elu'), (q, k, v), (q, k, v), 1e-5, 1e-4)
    out = fused.inline_attention_triton(q, k, v, 0.05)
    _check(out, inline_attention_torch(q, k, v, 0.05), (q, k, v), (q, k, v), 1e-5, 1e-4)


@pytest.mark.parametrize('feature_map,n,m,d,e', [
    ('elu', 63, 197, 16, 16),
    ('elu', 197, 63, 48, 40),
    ('relu', 197, 197, 128, 128),
    ('relu', 63, 63, 24, 72),
    ('identity', 197, 130, 64, 48),
])
@run_here
def test_feature_maps_and_head_dims(kernels, feature_map, n, m, d, e):
    fused, device = kernels
    q, k, v = _qkv(n, m, d, e, device, heads=1)
    if feature_map == 'identity':
        # Pre-mapped features (as a Hedgehog caller passes them): mixed signs, positive mean.
        qi, ki = 0.5 * q + 1.0, 0.5 * k + 1.0
        out = fused.linear_attention_triton(qi, ki, v, 'identity')
        ref = _reference(qi, ki, v, 'identity')
    else:
        out = fused.linear_attention_triton(q, k, v, feature_map)
        ref = _reference(q, k, v, feature_map)
    _check(out, ref, (q, k, v), (q, k, v), 1e-5, 1e-4)


@run_here
def test_relu_zero_features_stay_finite(kernels):
    fused, device = kernels
    q, k, v = _qkv(70, 70, 32, 32, device, heads=1)
    q_neg = -q.abs() - 0.1  # relu(q) == 0: numerator and normaliser are 0, eps protects
    out = fused.linear_attention_triton(q_neg, k, v, 'relu')
    ref = _reference(q_neg, k, v, 'relu')
    assert torch.isfinite(out).all() and torch.count_nonzero(out) == 0
    _check(out, ref, (q, k, v), (q, k, v), 1e-5, 1e-4)


@pytest.mark.parametrize('n,m,d', [(63, 63, 48), (1025, 1025, 64), (1, 5, 16)])
@run_here
def test_inline_forward_and_gradients(kernels, n, m, d):
    fused, device = kernels
    q, k, v = _qkv(n, m, d, d, device, heads=1)
    out = fused.inline_attention_triton(q, k, v, d**-0.5)
    _check(out, inline_attention_torch(q, k, v, d**-0.5), (q, k, v), (q, k, v), 1e-5, 1e-4)


@run_here
def test_inline_with_large_shared_means_keeps_fp32(kernels):
    """Trained-ViT activations (q / k x10 with shared means): s q S and (1 - s q.kbar) vbar
    cancel; the kernels work on the centred state, forward and dq within 5e-6 of fp64 (the
    cancelling form: ~3e-5 in fp32, ~1e-2 with TF32 dots on a GPU)."""
    fused, device = kernels
    gen = torch.Generator().manual_seed(0)
    n, d = 2049, 64
    q, k = ((torch.randn(1, 2, n, d, generator=gen) + 1.0) * 10.0 for _ in range(2))
    v = torch.randn(1, 2, n, d, generator=gen) + 0.5
    s = d**-0.5
    q, k, v = (t.to(device).requires_grad_() for t in (q, k, v))
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    qd, kd, vd = leaves
    ref = (s * qd @ (kd.transpose(-1, -2) @ vd / n) +
           (1 - s * qd @ kd.mean(-2).unsqueeze(-1)) * vd.mean(-2, keepdim=True))
    out = fused.inline_attention_triton(q, k, v, s)
    grad = torch.randn(out.shape, generator=gen).to(device)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, leaves, grad.double())

    def rel(a, b):
        return float((a.double().cpu() - b).norm() / b.norm())

    assert rel(out, ref.detach()) < 5e-6
    for name, a, b in zip('qkv', got, want):
        assert rel(a, b) < 5e-6, name


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@run_here
def test_half_precision_inputs(kernels, dtype):
    fused, device = kernels
    q, k, v = _qkv(197, 197, 64, 64, device, dtype=dtype)
    out = fused.linear_attention_triton(q, k, v, 'elu')
    assert out.dtype == dtype
    ref = _reference(q, k, v, 'elu')  # fp32 math on the same 16-bit inputs, rounded to dtype
    tol = 1e-2 if dtype == torch.float16 else 2e-2
    if dtype == torch.float16:
        _check(out, ref, (q, k, v), (q, k, v), tol, tol)
    else:  # bf16: forward only (the interpreter has to upcast before every tl.dot)
        torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize('feature_map,n,m,d,e', [('elu', 197, 130, 64, 64),
                                                  ('elu', 1025, 1025, 48, 40),
                                                  ('inline', 63, 197, 64, 64)])
@run_here
def test_forward_dots_on_16bit_operands(kernels, monkeypatch, feature_map, n, m, d, e):
    """The sweep option ``dot_16bit`` (16-bit dot operands, fp32 accumulation) on fp16
    inputs (the interpreter's fp16 dots are exact): against fp32 math on the same inputs,
    with and without the option, ragged shapes, forward and backward."""
    fused, device = kernels
    base = fused._LaunchConfig

    class Dot16(base):

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.dot_16bit = True

    q, k, v = _qkv(n, m, d, e, device, heads=2, dtype=torch.float16)
    assert Dot16(d, e, device, 'ieee').forward_dot_16bit(q, k, v)
    assert not Dot16(d, e, device, 'ieee').forward_dot_16bit(q, k, v.float())
    if feature_map == 'inline':
        scale = d**-0.5
        ref = inline_attention_torch(q.float(), k.float(), v.float(), scale)
        run = lambda: fused.inline_attention_triton(q, k, v, scale)  # noqa: E731
    else:
        ref = _reference(q.float(), k.float(), v.float(), feature_map)
        run = lambda: fused.linear_attention_triton(q, k, v, feature_map)  # noqa: E731
    default = run()
    monkeypatch.setattr(fused, '_LaunchConfig', Dot16)
    out = run()
    assert out.dtype == torch.float16
    scale_ref = ref.abs().max().item()
    err16 = (out.float() - ref).abs().max().item() / scale_ref
    err_default = (default.float() - ref).abs().max().item() / scale_ref
    # operands rounded to fp16 (11 bits): within a few output roundings of fp32 operands
    assert err16 < 4e-3 and err_default < 2e-3, (err16, err_default)
    assert not torch.equal(out, default)  # the option changes the path
    # the backward kernels are unchanged; they read the state the 16-bit forward saved
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad.float())
    for name, a, b in zip('qkv', got, want):
        assert a.dtype == b.dtype == torch.float16, name
        torch.testing.assert_close(a.float(), b.float(), atol=1e-3, rtol=1e-2, msg=name)


@run_here
def test_fp16_sums_do_not_overflow(kernels):
    fused, device = kernels
    n = 1025  # an fp16 sum of phi(k) v = 6 * 30 over 1025 tokens would overflow
    q = torch.full((1, 1, 4, 16), 5.0, dtype=torch.float16, device=device)
    k = torch.full((1, 1, n, 16), 5.0, dtype=torch.float16, device=device)
    v = torch.full((1, 1, n, 8), 30.0, dtype=torch.float16, device=device)
    out = fused.linear_attention_triton(q, k, v, 'elu')
    torch.testing.assert_close(out.float(), torch.full_like(out, 30.0).float(), atol=0.0,
                               rtol=1e-3)


@run_here
def test_strided_views_and_mixed_requires_grad(kernels):
    fused, device = kernels
    qkv = torch.randn(1, 97, 3, 2, 32, device=device, requires_grad=True)  # (B, N, 3, H, d)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    grad = torch.randn(1, 97, 2, 32, device=device).transpose(1, 2)  # non-contiguous grad
    out = fused.linear_attention_triton(q, k, v, 'elu')
    (got, ) = torch.autograd.grad(out, qkv, grad)
    (want, ) = torch.autograd.grad(_reference(q, k, v, 'elu'), qkv, grad)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@run_here
def test_double_backward_raises_and_empty_batch(kernels):
    """A second derivative through the kernels is refused: it came back as a constant (a
    gradient penalty on it counted as 0).  An empty batch returns an empty output."""
    fused, device = kernels
    q, k, v = (t.requires_grad_() for t in _qkv(9, 9, 8, 8, device, heads=1))
    (gq, ) = torch.autograd.grad(fused.linear_attention_triton(q, k, v, 'elu').square().sum(),
                                 q, create_graph=True)
    with pytest.raises(RuntimeError, match='once_differentiable|second derivative|twice'):
        gq.square().sum().backward()
    empty = [t[:0].detach().requires_grad_() for t in (q, k, v)]
    out = fused.linear_attention_triton(*empty, 'elu')
    assert out.shape == (0, 1, 9, 8)
    out.sum().backward()
    assert all(t.grad is not None and t.grad.shape == t.shape for t in empty)


@run_here
def test_kernel_rejects_unsupported_inputs(kernels):
    fused, device = kernels
    q, k, v = _qkv(8, 8, 16, 16, device, heads=1)
    with pytest.raises(ValueError, match='head dims'):
        fused.linear_attention_triton(q, k, torch.randn(1, 1, 8, 130, device=device))
    with pytest.raises(ValueError, match='dtype'):
        fused.linear_attention_triton(q.double(), k, v)
    with pytest.raises(ValueError, match='available'):
        fused.linear_attention_triton(q, k, v, 'softplus')


# ------------------------------------------------------------------------------------------
# Dispatch to the kernel
# ------------------------------------------------------------------------------------------


@run_here
def test_dispatch_env_switch_and_log_once(monkeypatch, interpreter_env):
    device = interpreter_env
    with collect_backend_log(monkeypatch, dispatch) as messages:
        q, k, v = _qkv(40, 40, 16, 16, device, heads=1)
        monkeypatch.setenv(BACKEND_ENV_VAR, 'triton')
        outs = [linear_attention(q, k, v, 'relu') for _ in range(2)]
        monkeypatch.setenv(BACKEND_ENV_VAR, 'torch')
        ref = linear_attention(q, k, v, 'relu')
        monkeypatch.delenv(BACKEND_ENV_VAR)
        expected_auto = 'triton' if device.type == 'cuda' else 'torch'
        assert select_backend(q, k, v) == expected_auto
    for out in outs:
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    triton_logs = [m for m in messages if 'triton (forced)' in m]
    assert len(triton_logs) == 1, messages
    assert sum('torch (forced)' in m for m in messages) == 1, messages


@run_here
def test_dispatch_inline_and_unsupported(monkeypatch, interpreter_env):
    device = interpreter_env
    q, k, v = _qkv(33, 33, 16, 16, device, heads=1)
    out = inline_attention(q, k, v, 0.25, backend='triton')
    torch.testing.assert_close(out, inline_attention_torch(q, k, v, 0.25), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match='head dim'):
        linear_attention(q, k, torch.randn(1, 1, 33, 200, device=device), backend='triton')
