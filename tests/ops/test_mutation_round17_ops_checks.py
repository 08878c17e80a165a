"""Mutation audit, round 17: the input checks of the two kernels' families, the small torch
ops around them, GPU-suite sections 0-3 and ``tools/analysis/sass_report.py``.

The tests were written against mutants that the rest of the suite let through (ids from the
round-17 audit, in the docstrings), plus a fidelity check of the causal convolution against
mamba's reference and one finding.  What is guarded:

* :mod:`mmlinvit.ops.ssd.checks` / :mod:`mmlinvit.ops.linear_attention.checks`: each shape
  rule refuses what would otherwise broadcast, be cut or fail later with torch's message, and
  the kernels' limits cover every input (dtype of x / dt / A, key rank, head dim P);
* :mod:`mmlinvit.ops.causal_conv`: the mixer's ``silu(conv)`` against mamba's
  ``causal_conv1d_ref`` semantics written out here entry by entry (depthwise, left padding
  K - 1, bias, SiLU), and a FINDING: bf16 inputs with bf16 weights are summed in fp32 and
  rounded once, as mamba's kernel and ``nn.Conv1d`` do (one rounding per tap before);
* :mod:`mmlinvit.ops.precision`: the autocast guard switches off the tensors' device type;
* GPU-suite sections 0-3 (:mod:`mmlinvit.analysis.gpu_suite.op_sections`): the check cases a
  run schedules and the SSD timing rows, with the kernels replaced by recording stand-ins;
* ``tools/analysis/sass_report.py``: its command line (defaults documented in its usage text,
  the dtype names, the interpreter guard) with the compiler replaced by a stand-in.
"""
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F

from mmlinvit.ops.ssd import check_ssd_inputs
from mmlinvit.ops.ssd import kernel_unsupported_reason as ssd_unsupported_reason
from mmlinvit.ops.triton_utils import KERNEL_MAX_HEAD_DIM

pytestmark = pytest.mark.usefixtures('one_thread')

ROOT = Path(__file__).resolve().parents[2]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ssd_args(batch: int = 1, length: int = 6, heads: int = 2, headdim: int = 3,
              groups: int = 1, d_state: int = 4, seed: int = 0) -> List[torch.Tensor]:
    """x, dt, A, B, C, D in the documented layouts (dt > 0, A < 0), fp32."""
    gen = _gen(seed)
    x = torch.randn(batch, length, heads, headdim, generator=gen)
    dt = F.softplus(torch.randn(batch, length, heads, generator=gen) - 1)
    A = -(torch.rand(heads, generator=gen) + 0.1)
    B = torch.randn(batch, length, groups, d_state, generator=gen) * 0.5
    C = torch.randn(batch, length, groups, d_state, generator=gen) * 0.5
    D = torch.randn(heads, generator=gen)
    return [x, dt, A, B, C, D]


# =============================================================================== SSD checks
@pytest.mark.parametrize('b_shape', [(1, 6, 2), (1, 6, 1, 4, 1)])
def test_ssd_checks_refuse_b_of_another_rank(b_shape: Tuple[int, ...]) -> None:
    """Mutant S02 (``B.ndim != 4`` dropped): a 3-D B (batch, L, d_state) with heads divisible
    by d_state, or a 5-D B, has the right (batch, L) and passed; B must be 4-D."""
    x, dt, A, _, _, D = _ssd_args(heads=2)
    bad = torch.zeros(b_shape)
    with pytest.raises(ValueError, match=r'B must be \(batch, L, groups, d_state\)'):
        check_ssd_inputs(x, dt, A, bad, bad, D)


def test_ssd_checks_refuse_c_with_another_state_size() -> None:
    """Mutant S03 (C compared with B only on (batch, L, groups)): C with d_state 5 against
    B's 4 is refused by name, not left to a matmul deep in the scan."""
    x, dt, A, B, _, D = _ssd_args(d_state=4)
    with pytest.raises(ValueError, match=r'C must have the shape of B \(1, 6, 1, 4\), got '
                       r'\(1, 6, 1, 5\)'):
        check_ssd_inputs(x, dt, A, B, torch.zeros(1, 6, 1, 5), D)


def test_ssd_kernel_limits_cover_the_head_dim() -> None:
    """Mutant S06 (the head dim P left out of the limits): x with P = 129 is outside the
    kernels' register tiles, whatever the state size."""
    x, dt, A, B, C, D = _ssd_args()
    wide = torch.zeros(1, 6, 2, KERNEL_MAX_HEAD_DIM + 1)
    assert ssd_unsupported_reason(wide, dt, A, B, C, D) == (
        f"head dims / state size {{'P': {KERNEL_MAX_HEAD_DIM + 1}}}, supported <= "
        f'{KERNEL_MAX_HEAD_DIM}')
    assert ssd_unsupported_reason(x[..., :1].expand(1, 6, 2, KERNEL_MAX_HEAD_DIM).contiguous(),
                                  dt, A, B, C, D) is None


@pytest.mark.parametrize('which', [0, 1, 2])
def test_ssd_kernel_limits_check_the_dtype_of_x_dt_and_a(which: int) -> None:
    """Mutants S07 (dt and A left out of the dtype check) and S09 (x left out): an fp64 x, dt
    or A cannot go to the kernels, and the reason names it."""
    args = _ssd_args()
    args[which] = args[which].double()
    name = ('x', 'dt', 'A')[which]
    assert ssd_unsupported_reason(*args) == (
        f"{name} has dtype torch.float64; the kernels take ['torch.float32', 'torch.float16', "
        "'torch.bfloat16']")


# ================================================================== linear attention checks
def _qkv(lead: Tuple[int, ...] = (2, 2), n: int = 5, m: int = 7, d: int = 4,
         e: int = 3) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = _gen(1)
    return (torch.randn(*lead, n, d, generator=gen), torch.randn(*lead, m, d, generator=gen),
            torch.randn(*lead, m, e, generator=gen))


@pytest.mark.parametrize('which', ['k', 'v'])
def test_keys_or_values_of_another_rank_are_refused_as_such(which: str) -> None:
    """Mutants L01 / L02 (the rank of k / of v unchecked): q (2, 5, 4) with a 4-D k or v is a
    rank mismatch, reported as one (the mutants reported leading dims, or let a 2-D k pass)."""
    from mmlinvit.ops.linear_attention import check_linear_attention_inputs
    q, k, v = _qkv(lead=(2, ))
    if which == 'k':
        k = k[None]
    else:
        v = v[None]
    with pytest.raises(ValueError, match='with equal rank >= 3'):
        check_linear_attention_inputs(q, k, v)


def test_keys_with_other_leading_dims_are_refused() -> None:
    """Mutant L03 (only v's leading dims compared): keys of batch 1 with queries and values of
    batch 2 broadcast silently in K^T V; the check names the shapes."""
    from mmlinvit.ops.linear_attention import check_linear_attention_inputs, linear_attention
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r'share their leading \(batch, head\) dims; got '
                       r'\(2, 2, 5, 4\), \(1, 2, 7, 4\), \(2, 2, 7, 3\)'):
        check_linear_attention_inputs(q, k[:1], v)
    with pytest.raises(ValueError, match='share their leading'):
        linear_attention(q, k[:1], v, backend='torch')


def test_feature_dims_and_token_counts_are_named() -> None:
    """Mutants L04 (q / k feature dims unchecked), L05 (k / v token counts unchecked) and L06
    (M = 0 accepted: 0 / 0 in the normaliser): each is a ValueError with its own message."""
    from mmlinvit.ops.linear_attention import check_linear_attention_inputs
    q, k, v = _qkv()
    with pytest.raises(ValueError, match='q and k need the same feature dim; got 4 and 3'):
        check_linear_attention_inputs(q, k[..., :3], v)
    with pytest.raises(ValueError, match='k and v need the same token count; got 7 and 6'):
        check_linear_attention_inputs(q, k, v[..., :6, :])
    with pytest.raises(ValueError, match=r'at least one key token \(M >= 1\)'):
        check_linear_attention_inputs(q, k[..., :0, :], v[..., :0, :])
    assert check_linear_attention_inputs(q, k, v) == (2, 2)


def test_kernel_reason_for_empty_or_misshaped_keys() -> None:
    """Mutants L07 (empty keys not a kernel limit), L08 (k's rank unchecked): the reasons the
    dispatcher falls back for; the kernels tile keys of at least one token, 4-D."""
    from mmlinvit.ops.linear_attention import kernel_unsupported_reason
    q, k, v = _qkv(d=16, e=16)
    assert kernel_unsupported_reason(q, k, v) is None
    assert kernel_unsupported_reason(q, k[..., :0, :], v[..., :0, :]) == 'empty token dimension'
    assert kernel_unsupported_reason(q, k[0], v) == 'inputs are not 4-D (B, H, N, d)'


def test_feature_map_check_lists_the_available_names_sorted() -> None:
    """Mutants L10 (a name outside ``available`` let through), L11 (the list unsorted): a
    name in the table passes, a table without it refuses it, and the message lists what is
    available in sorted order."""
    from mmlinvit.ops.linear_attention import check_feature_map
    check_feature_map('identity', ('identity', 'elu'), 'the torch path')
    with pytest.raises(ValueError, match=r"Unknown feature map 'identity' for the Triton "
                       r"kernel; available: \['elu', 'relu'\]$"):
        check_feature_map('identity', ('relu', 'elu'), 'the Triton kernel')


# ============================================================================ causal conv
def _causal_conv1d_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                       activation: Optional[str] = None) -> torch.Tensor:
    """mamba's ``causal_conv1d_ref`` written out entry by entry in fp64, channels first:

    ``out[b, c, t] = bias[c] + sum_k weight[c, k] x[b, c, t - (K - 1) + k]`` (x = 0 before the
    first token), then SiLU ``o * sigmoid(o)`` when ``activation == 'silu'``.

    Args:
        x: (batch, C, L).
        weight: (C, K) (mamba's layout; ``nn.Conv1d``'s (C, 1, K) squeezed).
        bias: Optional (C,).
        activation: None or ``'silu'``.
    """
    x, weight = x.double(), weight.double()
    batch, channels, length = x.shape
    taps = weight.shape[-1]
    out = torch.zeros(batch, channels, length, dtype=torch.float64)
    for t in range(length):
        for k in range(taps):
            src = t - (taps - 1) + k
            if src >= 0:
                out[:, :, t] += weight[:, k] * x[:, :, src]
    if bias is not None:
        out += bias.double()[:, None]
    if activation == 'silu':
        out = out * torch.sigmoid(out)
    return out


@pytest.mark.parametrize('grad', [False, True])
@pytest.mark.parametrize('taps', [1, 2, 4])
def test_matches_mambas_reference_with_silu(grad: bool, taps: int) -> None:
    """The mixer's xBC path ``silu(causal_depthwise_conv1d(...))`` against mamba's reference
    with ``activation='silu'``, token-major and channels-first, with and without autograd,
    lengths shorter than, equal to and longer than the kernel."""
    from mmlinvit.ops.causal_conv import causal_depthwise_conv1d
    gen = _gen(3 + taps)
    for length in (1, taps, 11):
        x = torch.randn(2, 6, length, generator=gen, dtype=torch.float64)
        weight = torch.randn(6, 1, taps, generator=gen, dtype=torch.float64)
        bias = torch.randn(6, generator=gen, dtype=torch.float64)
        want = _causal_conv1d_ref(x, weight[:, 0], bias, 'silu')
        with torch.set_grad_enabled(grad):
            first = causal_depthwise_conv1d(x.clone().requires_grad_(grad), weight, bias)
            last = causal_depthwise_conv1d(x.transpose(1, 2).clone().requires_grad_(grad),
                                           weight, bias, channels_last=True)
        torch.testing.assert_close(F.silu(first), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(F.silu(last).transpose(1, 2), want, rtol=1e-12, atol=1e-12)


# ============================================================================== precision
def test_autocast_guard_switches_off_the_tensors_device_type() -> None:
    """Mutant P02 (always the CPU autocast switched off): the guard for CUDA tensors is a
    disabled ``torch.autocast`` of device type 'cuda' (CPU autocast would leave the CUDA
    matmuls in fp16); for CPU tensors it is the disabled CPU autocast."""
    import warnings

    from mmlinvit.ops.precision import autocast_disabled
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # "CUDA is not available" on a CPU machine
        guard = autocast_disabled(torch.device('cuda', 0))
    assert isinstance(guard, torch.autocast) and guard.device == 'cuda'
    assert not guard._enabled
    cpu_guard = autocast_disabled(torch.device('cpu'))
    assert isinstance(cpu_guard, torch.autocast) and cpu_guard.device == 'cpu'
    with torch.autocast('cpu', dtype=torch.bfloat16):
        with cpu_guard:
            assert not torch.is_autocast_enabled('cpu')
            a = torch.randn(3, 3)
            assert (a @ a).dtype == torch.float32
        assert torch.is_autocast_enabled('cpu')


# ========================================================================= checkpointing
def test_run_block_does_not_checkpoint_by_default() -> None:
    """Mutant B03 (``with_cp`` defaulting to True): like mmseg's ViT (``with_cp=False``),
    ``run_block(block, x)`` runs the block plainly: one call in the forward and backward of
    a trainable block, none recomputed."""
    import inspect

    import torch.nn as nn
    from mmseg.models.backbones import VisionTransformer as SegViT

    from mmlinvit.backbones.checkpointing import run_block
    assert inspect.signature(SegViT).parameters['with_cp'].default is False

    calls: List[int] = []

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(1)
            return torch.tanh(self.fc(x))

    block = Block().train()
    x = torch.randn(2, 4, 3, requires_grad=True)
    run_block(block, x).sum().backward()
    assert len(calls) == 1 and x.grad is not None
    run_block(block, x, with_cp=True).sum().backward()
    assert len(calls) == 3  # checkpointed when asked: recomputed in the backward pass


# ======================================================================= GPU suite 0 - 3
CPU = torch.device('cpu')


class _CheckRecorder:
    """A stand-in for ``check_linear_attention`` / ``check_ssd``: records each case's
    arguments and returns a row naming it; raises for the cases ``fail`` accepts."""

    def __init__(self, kernel_name: str, fail=lambda args: False) -> None:
        self.kernel_name = kernel_name
        self.fail = fail
        self.calls: List[Tuple[Any, ...]] = []

    def __call__(self, kernel: Any, *args: Any) -> Dict[str, object]:
        self.calls.append(args)
        if self.fail(args):
            raise RuntimeError('kernel exploded\nsecond line')
        return {'kernel': self.kernel_name, 'case': args[0], 'ok': True, 'checked': args[:-1]}


def _section_check(monkeypatch: pytest.MonkeyPatch, dry: bool, fail_ssd=lambda args: False):
    from mmlinvit.analysis.gpu_suite import op_sections
    from mmlinvit.analysis.gpu_suite.run import SuiteRun
    from mmlinvit.analysis.gpu_suite.sizes import dry_sizes
    la_kernel, ssd_kernel = object(), object()
    monkeypatch.setattr(op_sections, 'triton_kernels', lambda device: (la_kernel, ssd_kernel))
    la = _CheckRecorder('linear-attn')
    ssd = _CheckRecorder('ssd', fail_ssd)
    monkeypatch.setattr(op_sections, 'check_linear_attention', la)
    monkeypatch.setattr(op_sections, 'check_ssd', ssd)
    run = SuiteRun(CPU, dry=dry)
    sizes = dry_sizes()
    la_rows: List[Dict[str, object]] = []
    ssd_rows: List[Dict[str, object]] = []
    op_sections.section_check(run, sizes, la_rows, ssd_rows)
    return sizes, run, la, ssd, la_rows, ssd_rows


@pytest.mark.parametrize('dry', [True, False])
def test_section_check_schedules_every_documented_case(monkeypatch: pytest.MonkeyPatch,
                                                       dry: bool) -> None:
    """Mutants O05 (``extra_la_cases`` dropped) and O07 (the ragged SSD case's head dim and
    state size swapped): the linear-attention checks are ELU + 1 at every
    ``la_check_tokens`` N in fp32 and bf16, then every ``extra_la_cases`` entry (the
    :class:`Sizes` docstring); the SSD checks are each ``ssd_check_lengths`` L in fp32 and
    bf16, then a bf16 case with 2 groups of 4 heads on a length that is not a multiple of the
    chunk, whose P / N the case's name gives (P48 N40 on the GPU)."""
    sizes, run, la, ssd, la_rows, ssd_rows = _section_check(monkeypatch, dry)
    h, d = sizes.la_heads, sizes.la_head_dim
    want_la = [('elu', n, n, h, d, d, dtype, 'elu') for dtype in (torch.float32, torch.bfloat16)
               for n in sizes.la_check_tokens] + [tuple(c) for c in sizes.extra_la_cases]
    assert [c[:-1] for c in la.calls] == want_la
    assert all(c[-1] == CPU for c in la.calls + ssd.calls)
    s = sizes.ssd_shape
    want_ssd = [('adventurer', 1, length, s['heads'], s['headdim'], s['groups'], s['d_state'],
                 s['chunk'], dtype) for dtype in (torch.float32, torch.bfloat16)
                for length in sizes.ssd_check_lengths]
    assert [c[:-1] for c in ssd.calls[:-1]] == want_ssd
    name, batch, length, heads, headdim, groups, d_state, chunk, dtype, _ = ssd.calls[-1]
    assert (batch, heads, groups, chunk, dtype) == (2, 4, 2, s['chunk'], torch.bfloat16)
    assert length > min(sizes.ssd_check_lengths) and length % chunk != 0
    if dry:
        assert name == 'ragged groups' and headdim > d_state
    else:
        assert (name, headdim, d_state) == ('ragged groups P48 N40', 48, 40)
    assert [r['checked'] for r in la_rows] == [c[:-1] for c in la.calls]
    assert [r['checked'] for r in ssd_rows] == [c[:-1] for c in ssd.calls]
    assert run.result['errors'] == {}


def test_section_check_marks_a_failed_case_error_and_keeps_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant O04 (the ``'ERROR'`` mark inverted): a check that raises leaves its row with
    the case's names, ``ok = 'ERROR'`` and the first line of the message; the rows of the
    cases that passed are what their checks returned, without an ``'ERROR'``."""
    sizes, run, _, _, _, ssd_rows = _section_check(
        monkeypatch, True, fail_ssd=lambda args: args[-2] == torch.bfloat16 and args[0] ==
        'adventurer')
    failed = [r for r in ssd_rows if r.get('ok') == 'ERROR']
    assert failed == [{'kernel': 'ssd', 'case': 'adventurer', 'dtype': 'bfloat16',
                       'error': 'RuntimeError: kernel exploded', 'ok': 'ERROR'}]
    assert [r['ok'] for r in ssd_rows] == [True, 'ERROR', True]
    assert list(run.result['errors']) == ['check ssd adventurer bfloat16']


def test_ssd_vectorised_block_restores_a_false_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant O16 (the switch set back to True, not to what it was): a caller that had the
    inference form off keeps it off after the block."""
    from mmlinvit.analysis.gpu_suite.op_sections import ssd_torch_vectorised
    from mmlinvit.ops.ssd import torch_impl
    monkeypatch.setattr(torch_impl, 'INFERENCE_FORM', False)
    with ssd_torch_vectorised():
        assert torch_impl.INFERENCE_FORM is False
    assert torch_impl.INFERENCE_FORM is False


@pytest.mark.parametrize('dry', [True, False])
def test_section_ssd_times_and_ratios(monkeypatch: pytest.MonkeyPatch, dry: bool) -> None:
    """Mutants O17 (fp32 on the GPU run), O18 (the f+b ratio inverted), O19 (the PyTorch scan
    timed in its CPU inference form) and O24 (the f+b calls without the run's chunk size):
    per L, the Triton scan and the vectorised PyTorch scan get the ``ssd_shape`` inputs in
    bf16 (fp32 in the dry run, :class:`SuiteRun`'s docstring) and the chunk size; eager
    times 2 / 8 ms forward and 5 / 15 ms forward + backward give ratios 4 and 3."""
    from mmlinvit.analysis.gpu_suite import op_sections
    from mmlinvit.analysis.gpu_suite.run import SuiteRun
    from mmlinvit.analysis.gpu_suite.sizes import dry_sizes
    from mmlinvit.ops import ssd as ssd_package
    from mmlinvit.ops.ssd import torch_impl
    seen: List[Tuple[str, torch.dtype, Optional[int], bool]] = []
    real_scan = ssd_package.ssd_scan_torch

    def spy(name: str):
        def scan(*leaves: torch.Tensor, chunk_size: Optional[int] = None) -> torch.Tensor:
            seen.append((name, leaves[0].dtype, chunk_size, torch_impl.INFERENCE_FORM))
            return real_scan(*leaves, chunk_size=chunk_size or 256)
        return scan

    monkeypatch.setattr(op_sections, 'triton_kernels',
                        lambda device: (None, SimpleNamespace(ssd_scan_triton=spy('triton'))))
    monkeypatch.setattr(ssd_package, 'ssd_scan_torch', spy('torch'))
    times = iter([2.0, 8.0, 5.0, 15.0])

    def bench(fn, device, repeats):
        fn()
        return next(times)

    monkeypatch.setattr(op_sections, 'bench_ms', bench)
    monkeypatch.setattr(op_sections, 'try_graph_ms',
                        lambda fn, device, eager_ms=None: (None, 'no CUDA graphs on CPU'))
    sizes = dry_sizes()
    run = SuiteRun(CPU, dry=dry)
    rows: List[Dict[str, object]] = []
    op_sections.section_ssd(run, sizes, rows)
    assert run.result['errors'] == {}, run.result['errors']
    (row, ) = rows
    assert row['L'] == sizes.ssd_bench_lengths[0]
    assert row['torch/triton'] == pytest.approx(4.0)
    assert row['f+b torch/triton'] == pytest.approx(3.0)
    chunk = sizes.ssd_shape['chunk']
    dtype = torch.float32 if dry else torch.bfloat16
    assert [s[:3] for s in seen] == [('triton', dtype, chunk), ('torch', dtype, chunk),
                                     ('triton', dtype, chunk), ('torch', dtype, chunk)]
    assert seen[1][3] is False  # the forward PyTorch timing: vectorised form
    assert torch_impl.INFERENCE_FORM is True


@pytest.mark.parametrize('refusing', ['linear attention', 'SSD'])
def test_triton_kernels_refuses_a_dispatcher_that_would_not_choose_triton(
        monkeypatch: pytest.MonkeyPatch, refusing: str) -> None:
    """Mutant O21 (the SSD dispatcher's choice unchecked): a dispatcher that keeps torch (its
    rules refuse the kernels here) stops the section with its name, for either operator."""
    from mmlinvit.analysis.gpu_suite import op_sections
    from mmlinvit.ops import linear_attention, ssd
    monkeypatch.setattr(linear_attention, 'select_backend', lambda *a, **k: (
        'torch' if refusing == 'linear attention' else 'triton'))
    monkeypatch.setattr(ssd, 'select_ssd_backend', lambda *a, **k: (
        'torch' if refusing == 'SSD' else 'triton'))
    with pytest.raises(RuntimeError, match=f'the {refusing} dispatcher did not choose the '
                       'Triton kernel'):
        op_sections.triton_kernels(CPU)


def _la_section_rows(monkeypatch: pytest.MonkeyPatch, dry: bool, tokens: List[int],
                     times: List[float]):
    """Section 2 with a recording stand-in kernel and fixed eager times (no CUDA graphs),
    the SDPA profiler and availability probes replaced (flash available, cudnn not)."""
    from mmlinvit.analysis.gpu_suite import op_sections
    from mmlinvit.analysis.gpu_suite.run import SuiteRun
    from mmlinvit.analysis.gpu_suite.sizes import dry_sizes
    dtypes: List[torch.dtype] = []

    def kernel(q, k, v, feature_map):
        dtypes.append(q.dtype)
        return (q * 1.0).sum(-1, keepdim=True) * v

    fake = SimpleNamespace(linear_attention_triton=kernel)
    eager = iter(times)
    monkeypatch.setattr(op_sections, 'triton_kernels', lambda device: (fake, fake))
    monkeypatch.setattr(op_sections, 'bench_ms', lambda fn, device, repeats: next(eager))
    monkeypatch.setattr(op_sections, 'try_graph_ms',
                        lambda fn, device, eager_ms=None: (None, 'no CUDA graphs on CPU'))
    monkeypatch.setattr(op_sections, 'attention_kernels', lambda fn, device: {'op': 'x'})
    monkeypatch.setattr(op_sections, 'sdpa_unavailable',
                        lambda fn, backend: None if backend == 'flash' else 'not here')
    sizes = dry_sizes()
    sizes.la_bench_tokens = tokens
    run = SuiteRun(CPU, dry=dry)
    rows: List[Dict[str, object]] = []
    sdpa_rows: List[Dict[str, object]] = []

    def inputs_spy(n, m, h, d, e, dtype, device):
        dtypes.append(dtype)
        from mmlinvit.analysis.kernel_checks import make_qkv
        return make_qkv(n, m, h, d, e, dtype, device)

    monkeypatch.setattr(op_sections, 'make_qkv', inputs_spy)
    op_sections.section_linear_attention(run, sizes, 1e9, rows, sdpa_rows)
    assert run.result['errors'] == {}, run.result['errors']
    return rows, sdpa_rows, dtypes


def test_section_2_compares_each_sdpa_row_with_the_triton_row_of_its_n(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant O15 (every SDPA row divided by the first N's Triton times): eager ms in call
    order per N: triton, triton f+b, torch, flash, flash f+b; N = 16: 2, 5, 8, 3, 9;
    N = 24: 4, 10, 12, 6, 30.  flash / triton is 1.5 then 1.5, f+b 1.8 then 3.0."""
    rows, sdpa_rows, _ = _la_section_rows(monkeypatch, True, [16, 24],
                                          [2.0, 5.0, 8.0, 3.0, 9.0, 4.0, 10.0, 12.0, 6.0, 30.0])
    assert [r['N'] for r in rows] == [16, 24]
    flash = [r for r in sdpa_rows if r['sdpa'] == 'flash']
    assert [r['N'] for r in flash] == [16, 24]
    assert [r['sdpa/triton'] for r in flash] == [pytest.approx(1.5), pytest.approx(1.5)]
    assert [r['f+b sdpa/triton'] for r in flash] == [pytest.approx(1.8), pytest.approx(3.0)]
    assert [r['skipped'] for r in sdpa_rows if r['sdpa'] == 'cudnn'] == ['not here'] * 2
    assert all('BW note' not in r for r in rows)  # a note for CUDA runs only (mutant O12)
    assert [r['BW from'] for r in rows] == ['eager/eager'] * 2


@pytest.mark.parametrize('dry', [True, False])
def test_section_2_inputs_are_bf16_on_the_gpu_run(monkeypatch: pytest.MonkeyPatch,
                                                   dry: bool) -> None:
    """Mutant O23 (fp32 on the GPU run too): the timed inputs are bf16, fp32 only in the dry
    run (:class:`SuiteRun`'s docstring)."""
    _, _, dtypes = _la_section_rows(monkeypatch, dry, [16], [2.0, 5.0, 8.0, 3.0, 9.0])
    want = torch.float32 if dry else torch.bfloat16
    assert dtypes and set(dtypes) == {want}


# ==================================================================== tools/sass_report.py
SASS_TOOL = ROOT / 'tools' / 'analysis' / 'sass_report.py'


def _load_sass_tool(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The tool as a module, loaded with ``TRITON_INTERPRET`` unset (its guard) and with
    ``sys.path`` (which it extends) restored after the test."""
    from mmlinvit.utils.cli import load_script
    monkeypatch.setattr(sys, 'path', list(sys.path))
    monkeypatch.setenv('TRITON_INTERPRET', '')
    monkeypatch.delenv('TRITON_INTERPRET')
    return load_script(str(SASS_TOOL), 'mmlinvit_round17_sass_report_tool')


def test_sass_tool_refuses_the_triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant T01 (the guard dropped): the tool compiles the kernels, which the interpreter
    replaces, so ``TRITON_INTERPRET=1`` stops it at once with the fix."""
    from mmlinvit.utils.cli import load_script
    monkeypatch.setattr(sys, 'path', list(sys.path))
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    with pytest.raises(SystemExit, match='sass_report compiles the kernels: unset '
                       'TRITON_INTERPRET'):
        load_script(str(SASS_TOOL), 'mmlinvit_round17_sass_report_tool')


def _fake_reports(calls: List[Tuple[torch.dtype, int, int]]):
    def kernel_reports(dtype: torch.dtype, tokens: int, arch: int) -> Dict[str, list]:
        calls.append((dtype, tokens, arch))
        return {'linear_attention': [dict(kernel='_state_kernel', regs=168, stack=24,
                                          counts={'LDG.128': 3, 'HGMMA': 2})]}
    return kernel_reports


def test_sass_tool_defaults_are_its_documented_usage(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    """Mutants T03 (another token count) and T04 (``--arch`` not handed on): without options
    the tool reports bf16 for sm_90 at 1000 tokens (its usage text: "bf16, sm_90, 1000
    tokens"); the printed table has the registers, the stack bytes and each count."""
    tool = _load_sass_tool(monkeypatch)
    calls: List[Tuple[torch.dtype, int, int]] = []
    monkeypatch.setattr(tool, 'kernel_reports', _fake_reports(calls))
    assert 'sass_report.py                       # bf16, sm_90, 1000 tokens' in tool.__doc__
    reports = tool.main([])
    assert calls == [(torch.bfloat16, 1000, 90)]
    assert list(reports) == ['bf16']
    out = capsys.readouterr().out.splitlines()
    assert out[0] == 'linear_attention, bf16, sm_90:'
    header, line = out[1].split(), out[2].split()
    assert header == ['kernel', 'regs', 'stack', 'instructions']
    assert line == ['_state_kernel', '168', '24', 'LDG.128:3', 'HGMMA:2']  # mutant T05


def test_sass_tool_dtypes_arch_and_json(monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    """Mutants T02 (fp16 compiled as bf16), T06 (fp16 not a choice) and T04: each ``--dtype``
    name is compiled in its torch dtype, for the ``--arch`` and ``--tokens`` given, and the
    JSON holds the reports under those names."""
    import json
    tool = _load_sass_tool(monkeypatch)
    calls: List[Tuple[torch.dtype, int, int]] = []
    monkeypatch.setattr(tool, 'kernel_reports', _fake_reports(calls))
    out = tmp_path / 'sass.json'
    reports = tool.main(['--dtype', 'fp16', 'fp32', 'bf16', '--arch', '89', '--tokens', '77',
                         '--json', str(out)])
    assert calls == [(torch.float16, 77, 89), (torch.float32, 77, 89),
                     (torch.bfloat16, 77, 89)]
    assert json.loads(out.read_text()) == reports
    assert list(reports) == ['fp16', 'fp32', 'bf16']


@pytest.mark.parametrize('mode', ['no_grad', 'grad', 'capture'])
def test_bf16_weights_and_inputs_are_summed_in_fp32_and_rounded_once(
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """FINDING (fails on the original ``causal_conv.py``): with bf16 x AND bf16 weights (a
    model cast with ``.bfloat16()``) the taps were summed in bf16, one rounding per tap: on
    (2, 256, 512), K = 4 the mean error against the exact sum was 1.8x that of mamba's
    ``causal_conv1d`` kernel and of ``nn.Conv1d`` (the mixer's accelerator path), which
    accumulate in fp32 and round once, and 43 % of the outputs differed from theirs.  The
    result stays bf16 (the documented dtype); each output is within one bf16 rounding
    (relative 2^-8) of the fp64 sum of the bf16 values."""
    from mmlinvit.ops import causal_conv
    if mode == 'capture':
        monkeypatch.setattr(causal_conv, 'capturing_graph', lambda: True)
    gen = _gen(11)
    channels, length, taps = 64, 150, 4
    x = torch.randn(2, channels, length, generator=gen).bfloat16()
    weight = (torch.randn(channels, 1, taps, generator=gen) * 0.5).bfloat16()
    bias = torch.randn(channels, generator=gen).bfloat16()
    want = F.conv1d(x.double(), weight.double(), bias.double(), padding=taps - 1,
                    groups=channels)[..., :length]
    with torch.set_grad_enabled(mode == 'grad'):
        got = causal_conv.causal_depthwise_conv1d(x.requires_grad_(mode == 'grad'), weight,
                                                  bias)
    assert got.dtype == torch.bfloat16
    err = (got.double() - want).abs()
    assert bool((err <= want.abs() * 2.0**-8 + 1e-6).all()), float(err.max())
