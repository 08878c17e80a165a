"""Mutation audit, round 20: the non-causal linear attention kernels (torch and Triton) and
:mod:`mmlinvit.ops.triton_utils`, on branches, defaults and numeric details that the rest of
the suite let through.

Each test failed on at least one single-line change of the code under test (ids of the
round-20 audit, named in the docstrings) and passes on the unmodified code.  Every expected
value comes from an fp64 oracle written here from the contract the modules document::

    out_i = phi(q_i) S / (phi(q_i) z + eps),  S = phi(K)^T V / M,  z = mean_j phi(k_j)

(ELU + 1, ReLU or identity features), differentiated by ``torch.autograd`` in fp64, or is
worked out by hand; none is a pasted output of the code under test.  Guarded here:

* Triton kernels (CPU interpreter, tiny ragged shapes): the caller's ``eps`` in the forward
  and in the backward kernel, the default ``eps = 1e-6``, ReLU's derivative at exactly 0
  (0, as autograd's), the batch strides of every kernel (batch > 1 with token-major views),
  the InLine scale check, the 16-bit dot option refused for bf16 in the interpreter;
* the torch path (:func:`linear_attention_torch` and the graph form
  :func:`linear_attention_graph`): the default ``eps = 1e-6`` and the output in the dtype of
  ``v`` for mixed input dtypes;
* :mod:`mmlinvit.ops.triton_utils`: the log-once memory keyed by (backend, reason), the
  interpreter switched off after the kernels' import, the interpreter problem raised by the
  device check, ``TRITON_INTERPRET`` unset meaning off, and the capability of the inputs'
  own CUDA device (not the current one) in the ``auto`` choice;
* FINDING (round 20): integer q / k / v refused by the shared input check with a clear
  error (fails on the unfixed ``mmlinvit/ops/linear_attention/checks.py``).
"""
import math
from types import ModuleType
from typing import Callable, Dict, Optional, Set, Tuple

import pytest
import torch
import torch.nn.functional as F
# Imported before mmlinvit: it switches the Triton interpreter on while triton is not imported.
from triton_testing import (import_kernels, only_in_parent, requires_triton, run_here,
                            run_in_interpreter_subprocess)

from mmlinvit.ops import triton_utils
from mmlinvit.ops.linear_attention import linear_attention_graph, linear_attention_torch

from test_mutation_round16_ops import _mmlinvit_log

pytestmark = pytest.mark.usefixtures('one_thread')

FEATURES: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    'elu': lambda x: F.elu(x) + 1.0,
    'relu': F.relu,
    'identity': lambda x: x,
}


def _oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature_map: str,
            eps: float) -> torch.Tensor:
    """phi(Q) S / (phi(Q) z + eps) in fp64, S = phi(K)^T V / M, z = mean phi(K)."""
    phi = FEATURES[feature_map]
    pq, pk, v64 = phi(q.double()), phi(k.double()), v.double()
    m = k.shape[-2]
    s = pk.transpose(-2, -1) @ v64 / m
    z = pk.mean(dim=-2).unsqueeze(-1)
    return (pq @ s) / (pq @ z + eps)


def _check_against_oracle(fn: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, feature_map: str, eps: float,
                          call_eps: Optional[float] = -1.0, rtol: float = 1e-4,
                          atol: float = 1e-5, seed: int = 0) -> None:
    """Output and q/k/v gradients of ``fn`` against the fp64 oracle (fp64 autograd).

    Args:
        fn: ``fn(q, k, v, feature_map[, eps])``.
        call_eps: eps passed to ``fn``; ``-1`` passes ``eps``, None omits it (the default).
    """
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    if call_eps is None:
        out = fn(*leaves, feature_map)
    else:
        out = fn(*leaves, feature_map, eps if call_eps == -1.0 else call_eps)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = _oracle(*ref_leaves, feature_map, eps)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=rtol, atol=atol)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(seed))
    got = torch.autograd.grad(out, leaves, grad.to(out.dtype))
    want = torch.autograd.grad(ref, ref_leaves, grad.double())
    for name, a, b in zip('qkv', got, want):
        torch.testing.assert_close(a.double(), b, rtol=rtol, atol=atol, msg=name)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ============================================================================ Triton kernels
@requires_triton
@only_in_parent
def test_kernels_in_interpreter_subprocess() -> None:
    run_in_interpreter_subprocess(__file__)


@pytest.fixture(scope='module')
def kernels() -> Tuple[ModuleType, torch.device]:
    """The fused module and the device its kernels run on (CPU = interpreter)."""
    return import_kernels('mmlinvit.ops.linear_attention.triton_kernel')


@requires_triton
@run_here
@pytest.mark.parametrize('feature_map', ['relu', 'elu'])
def test_triton_eps_reaches_forward_and_backward(kernels, feature_map: str) -> None:
    """Mutants K04 / K05 (the output / the backward kernel used 1e-6 instead of the caller's
    eps): with eps = 0.5 and small features the normaliser is dominated by eps, so its value
    shows in the output and in every gradient.  Ragged N != M, d != e."""
    fused, device = kernels
    q = 0.3 * _randn(1, 2, 37, 20, seed=1) - 0.2
    k = 0.3 * _randn(1, 2, 45, 20, seed=2) - 0.2
    v = _randn(1, 2, 45, 12, seed=3)
    q, k, v = (t.to(device) for t in (q, k, v))
    _check_against_oracle(fused.linear_attention_triton, q, k, v, feature_map, 0.5)


@requires_triton
@run_here
def test_triton_default_eps_is_1e_6(kernels) -> None:
    """Mutant K13 (default eps 1e-5): ReLU features of size ~1e-6 make phi(q).z comparable
    to eps, so the default is visible: the call without eps equals the oracle at 1e-6 and
    differs from it at 1e-5 by far more than the tolerance."""
    fused, device = kernels
    q = 1e-6 * _randn(1, 1, 19, 16, seed=4).abs()
    k = _randn(1, 1, 23, 16, seed=5)
    v = _randn(1, 1, 23, 16, seed=6)
    want = _oracle(q, k, v, 'relu', 1e-6)
    assert (want - _oracle(q, k, v, 'relu', 1e-5)).abs().max() > 0.05 * want.abs().max()
    _check_against_oracle(fused.linear_attention_triton, q.to(device), k.to(device),
                          v.to(device), 'relu', 1e-6, call_eps=None)


@requires_triton
@run_here
def test_triton_relu_derivative_is_zero_at_zero(kernels) -> None:
    """Mutant K01 (``x >= 0`` in the ReLU derivative): inputs with exact zeros (integers in
    [-2, 2]); autograd's relu'(0) is 0, so those q / k entries get no gradient."""
    fused, device = kernels
    gen = torch.Generator().manual_seed(7)
    q = torch.randint(-2, 3, (1, 2, 21, 16), generator=gen).float()
    k = torch.randint(-2, 3, (1, 2, 21, 16), generator=gen).float()
    k[..., 0] = 1.0  # every key has a positive feature: z > 0 in every head
    q[..., 0] = 1.0
    v = _randn(1, 2, 21, 16, seed=8)
    assert (q == 0).sum() > 50 and (k == 0).sum() > 50
    q, k, v = (t.to(device) for t in (q, k, v))
    _check_against_oracle(fused.linear_attention_triton, q, k, v, 'relu', 1e-6)


@requires_triton
@run_here
@pytest.mark.parametrize('feature_map', ['elu', 'inline'])
def test_triton_batch_and_head_strides(kernels, feature_map: str) -> None:
    """Mutants K10 / K11 (the output / the backward-q kernel's batch offset replaced by
    ``bh * stride_h``) and K17 (batch and head of a program swapped): batch 2 x 3 heads,
    q / k / v as views of one token-major (B, N, 3, H, d) projection, as the attention layers
    pass them; every other kernel test has batch 1, where a wrong batch stride is invisible.
    (The same change on dk / dv is not observable: they are allocated contiguous.)"""
    fused, device = kernels
    b, h, n, d = 2, 3, 29, 16
    qkv = _randn(b, n, 3, h, d, seed=9).to(device)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, N, d) views
    if feature_map == 'elu':
        _check_against_oracle(fused.linear_attention_triton, q, k, v, 'elu', 1e-6)
        return
    scale = d**-0.5
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fused.inline_attention_triton(*leaves, scale)
    qd, kd, vd = ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    # InLine: s q_i (K^T V / M) + (1 - s q_i . kbar) vbar
    ref = (scale * qd @ (kd.transpose(-1, -2) @ vd / n) +
           (1 - scale * qd @ kd.mean(-2).unsqueeze(-1)) * vd.mean(-2, keepdim=True))
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-4, atol=1e-5)
    grad = _randn(*ref.shape, seed=10)
    got = torch.autograd.grad(out, leaves, grad)
    want = torch.autograd.grad(ref, ref_leaves, grad.double())
    for name, a, bb in zip('qkv', got, want):
        torch.testing.assert_close(a.double(), bb, rtol=1e-4, atol=1e-5, msg=name)


@requires_triton
@run_here
@pytest.mark.parametrize('scale', [math.nan, math.inf, -math.inf])
def test_triton_inline_refuses_a_non_finite_scale(kernels, scale: float) -> None:
    """Mutant K14 (no check): a NaN / inf scale would silently give a NaN output."""
    fused, device = kernels
    q = _randn(1, 1, 4, 16, seed=11).to(device)
    with pytest.raises(ValueError, match='InLine scale must be finite'):
        fused.inline_attention_triton(q, q, q, scale)


@requires_triton
@run_here
def test_triton_16bit_dots_are_refused_for_bf16_in_the_interpreter(kernels) -> None:
    """Mutants K22 (bf16 accepted), K23 (see below): with the sweep option on, 16-bit dot
    operands are taken for fp16 (and, compiled, bf16) inputs of one dtype, never for bf16 in the interpreter,
    whose bf16 dots are wrong (the option's documented exception)."""
    fused, device = kernels
    cfg = fused._LaunchConfig(16, 16, device, 'ieee')
    cfg.dot_16bit = True
    half = torch.zeros(1, 1, 2, 16, dtype=torch.float16)
    bf16 = half.bfloat16()
    assert cfg.forward_dot_16bit(half, half, half)
    assert cfg.forward_dot_16bit(bf16, bf16, bf16) is (not fused.INTERPRETED)
    # mixed dtypes never (mutant K23, one-dtype rule dropped: a set's pop then decides)
    assert not cfg.forward_dot_16bit(half, bf16, half)
    assert not cfg.forward_dot_16bit(half, half, half.float())
    cfg.dot_16bit = False
    assert not cfg.forward_dot_16bit(half, half, half)


# ============================================================================ torch path
@pytest.mark.parametrize('fn', [linear_attention_torch, linear_attention_graph],
                         ids=['chunked', 'graph'])
def test_torch_default_eps_is_1e_6(fn: Callable[..., torch.Tensor]) -> None:
    """Mutants T25 / T26 (default eps 1e-5 on the chunked / the graph form): called without
    eps, both forms equal the oracle at the documented 1e-6, in a case (ReLU features ~1e-6)
    where 1e-5 moves the output by more than 5%.

    The q gradient (~3e5) is the difference of two fp32 terms of that size, each rounded:
    both forms land 0.8-1.1e-4 (relative) from the float64 oracle depending on the BLAS
    build, so the check allows 1e-3 (the eps mutants move the output by 5%)."""
    q = 1e-6 * _randn(2, 2, 19, 16, seed=12).abs()
    k, v = _randn(2, 2, 23, 16, seed=13), _randn(2, 2, 23, 8, seed=14)
    want = _oracle(q, k, v, 'relu', 1e-6)
    assert (want - _oracle(q, k, v, 'relu', 1e-5)).abs().max() > 0.05 * want.abs().max()
    _check_against_oracle(fn, q, k, v, 'relu', 1e-6, call_eps=None, rtol=1e-3)


@pytest.mark.parametrize('fn', [linear_attention_torch, linear_attention_graph],
                         ids=['chunked', 'graph'])
@pytest.mark.parametrize('q_dtype,v_dtype', [(torch.float32, torch.float16),
                                             (torch.bfloat16, torch.float32)])
def test_output_has_the_dtype_of_v(fn: Callable[..., torch.Tensor], q_dtype: torch.dtype,
                                   v_dtype: torch.dtype) -> None:
    """Mutants T29 / T34 (the output cast to the dtype of q): both forms document an output
    in the dtype of ``v``; the values are the fp64 oracle on the same (rounded) inputs,
    rounded once to that dtype."""
    q = _randn(1, 2, 13, 8, seed=15).to(q_dtype)
    k = _randn(1, 2, 11, 8, seed=16).to(q_dtype)
    v = _randn(1, 2, 11, 8, seed=17).to(v_dtype)
    out = fn(q, k, v, 'elu')
    assert out.dtype == v_dtype
    want = _oracle(q, k, v, 'elu', 1e-6).to(v_dtype)
    tol = 2e-3 if v_dtype == torch.float16 else 1e-5
    torch.testing.assert_close(out.double(), want.double(), rtol=tol, atol=tol)


# ============================================================================ triton_utils
def test_each_reason_of_a_backend_is_logged_once() -> None:
    """Mutant U04 (the memory keyed by backend and operation): a choice is remembered by
    (backend, reason), so the same backend chosen for another reason is logged too, and
    each pair only once."""
    logged: Set[Tuple[str, str]] = set()
    with _mmlinvit_log() as messages:
        for _ in range(2):
            triton_utils.log_choice_once(logged, 'SSD scan', 'torch', 'auto: cpu tensors')
            triton_utils.log_choice_once(logged, 'SSD scan', 'torch', 'forced')
    assert messages == ['SSD scan backend: torch (auto: cpu tensors)',
                        'SSD scan backend: torch (forced)']
    assert logged == {('torch', 'auto: cpu tensors'), ('torch', 'forced')}


def test_interpreter_problem_names_an_interpreter_switched_off_later(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant U01 (second check dropped): triton's library decorated for the interpreter
    (its ``tl`` functions are ``InterpretedFunction``) but ``knobs.runtime.interpret`` off
    now (``TRITON_INTERPRET`` unset after the import): the kernels would be launched as
    compiled code on CPU tensors, so the problem is named; with it on there is none."""
    triton = pytest.importorskip('triton')
    if getattr(triton, 'knobs', None) is None:
        pytest.skip('triton < 3.4 has no knobs')
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    def dummy(x):  # never called
        return x

    monkeypatch.setattr(tl.standard, 'sum', InterpretedFunction(dummy))
    monkeypatch.setattr(triton.knobs.runtime, 'interpret', False)
    problem = triton_utils.interpreter_problem()
    assert problem is not None and 'was unset after the kernels were imported' in problem
    monkeypatch.setattr(triton.knobs.runtime, 'interpret', True)
    assert triton_utils.interpreter_problem() is None


def test_interpreted_kernels_refuse_a_broken_interpreter(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Mutant U03 (the interpreter problem ignored): CPU tensors for interpreted kernels
    pass only when the interpreter can run; otherwise the problem is raised, named."""
    monkeypatch.setattr(triton_utils, 'interpreter_problem', lambda: 'the reason')
    with pytest.raises(RuntimeError, match='cannot run the Triton interpreter: the reason'):
        triton_utils.check_kernel_device(torch.device('cpu'), True, 'Triton')
    monkeypatch.setattr(triton_utils, 'interpreter_problem', lambda: None)
    triton_utils.check_kernel_device(torch.device('cpu'), True, 'Triton')


def test_triton_interpret_unset_means_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant U08 (unset read as '1'): without ``TRITON_INTERPRET`` the interpreter is off
    (triton's own default)."""
    monkeypatch.setenv('TRITON_INTERPRET', '')
    monkeypatch.delenv('TRITON_INTERPRET')
    assert triton_utils.triton_interpreter_enabled() is False
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    assert triton_utils.triton_interpreter_enabled() is False


def test_auto_reads_the_capability_of_the_inputs_device(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """Mutant U09 (the current device's capability read instead): on a machine with an
    sm_90 ``cuda:0`` and an sm_75 ``cuda:1``, inputs on ``cuda:1`` stay on torch and
    inputs on ``cuda:0`` do not."""
    capabilities = {0: (9, 0), 1: (7, 5), None: (9, 0)}
    monkeypatch.setattr(torch.cuda, 'get_device_capability',
                        lambda device=None: capabilities[device])
    monkeypatch.setattr(torch.version, 'hip', None)
    assert triton_utils.accelerator_unsupported_reason(torch.device('cuda', 0)) is None
    reason = triton_utils.accelerator_unsupported_reason(torch.device('cuda', 1))
    assert reason is not None and 'compute capability 7.5 < 8.0' in reason


# ============================================================================ FINDING
@pytest.mark.parametrize('which', [0, 1, 2])
def test_integer_inputs_are_refused_with_the_reason(which: int) -> None:
    """FINDING (round 20; fails on the unfixed ``checks.py``): the shared input check took
    integer q / k / v.  With integer values the chunked torch path (what ``auto`` picks on
    CPU) stopped with torch's internal ``result type Float can't be cast to the desired
    output type Long``, while the graph form and InLine returned the fp32 result truncated
    to integers (``[0, 0]`` where the formula gives ``[0.337, 0.214]``).  Every backend
    documents fp32 / fp16 / bf16 inputs (the Triton kernels already refuse others by name);
    the shared check now refuses them with a ValueError naming the tensor and its dtype."""
    from mmlinvit.ops.linear_attention import inline_attention_torch
    tensors = [torch.ones(1, 1, 3, 4) for _ in range(3)]
    tensors[which] = tensors[which].long()
    name = 'qkv'[which]
    for fn in (lambda q, k, v: linear_attention_torch(q, k, v, 'elu'),
               lambda q, k, v: linear_attention_graph(q, k, v, 'elu'),
               lambda q, k, v: inline_attention_torch(q, k, v, 0.5)):
        with pytest.raises(ValueError, match=f'{name} has dtype torch.int64'):
            fn(*tensors)
