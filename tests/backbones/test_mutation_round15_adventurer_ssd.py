"""Mutation round 15: the Mamba-2 SSD scan, its dispatcher, the mixer and Adventurer.

Most tests fail on a one-line change of ``mmlinvit/ops/ssd/torch_impl.py``,
``mmlinvit/ops/ssd/dispatch.py``, ``mmlinvit/layers/mamba2.py`` or
``mmlinvit/backbones/adventurer.py`` that the rest of the suite let through (ids of the
round-15 audit in the docstrings); the impulse response, the ``ssd_minimal`` comparison on
ragged lengths and the log check also pin what other files see only through the Triton
interpreter or at other tolerances.  References:

* the scan: state-spaces/mamba ``ssd_minimal.py`` semantics written here as a plain loop over
  tokens in float64 (``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = C_t h_t + D x_t``,
  zero initial state), and closed forms of an impulse response (``y_t = exp(A sum dt) C_t .
  B_0 dt_0 x_0``) that pin the log-decay floor (exp(-80)) of the within-chunk weights;
* the documented memory contract of the torch scan (chunks of at most ``INFERENCE_CHUNK``
  tokens without autograd, ``chunks_per_step`` chunks per vectorised step, the inference step
  sized to ``INFERENCE_STEP_BYTES``), counted with spies, and its argument checks;
* the dispatcher: the ``MMLINVIT_SSD_BACKEND`` variable, the log line of each choice, the
  explicit ``'auto'``;
* the mixer: the Mamba-2 block layout (official ``Mamba2.__init__``: ``conv_bias`` /
  ``bias`` reach ``conv1d`` / ``out_proj``, ``dt_min == dt_max`` allowed, A_init_range
  strictly positive), the forwarding of ``chunk_size`` / ``chunks_per_step`` /
  ``ssd_backend`` to the scan, the accelerator form of the causal convolution (run on CPU
  through a tensor subclass that reports a CUDA device), the input check;
* Adventurer helpers: flip indices (negative / repeated), ``describe_flips``, the flip
  record's comparison, the ``'small'`` alias, a custom ``mlp_hidden_dims``, non-square
  position grids, ``num_heads``.
"""
import logging
import math
from typing import Any, Iterator, List, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from mmlinvit.backbones.adventurer import (Adventurer, FlipScheduleMismatchError,
                                           describe_flips, flip_block_indices)
from mmlinvit.layers import mamba2 as mamba2_module
from mmlinvit.layers.mamba2 import Mamba2Mixer
from mmlinvit.ops.ssd import SSD_BACKEND_ENV_VAR, select_ssd_backend, ssd_scan, ssd_scan_torch
from mmlinvit.ops.ssd import dispatch as ssd_dispatch
from mmlinvit.ops.ssd import torch_impl

from call_spy import CallSpy
from ssd_fp64 import reference_scan

pytestmark = pytest.mark.usefixtures('one_thread')

TINY_ARCH = dict(embed_dims=32, num_layers=4)
TINY_MIXER = dict(d_state=8, headdim=16, chunk_size=16)


# --------------------------------------------------------------------------------- helpers
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def ssd_inputs(length: int, heads: int = 4, groups: int = 2, headdim: int = 3, d_state: int = 5,
               batch: int = 2, seed: int = 0,
               dtype: torch.dtype = torch.float64) -> Tuple[torch.Tensor, ...]:
    """x, dt, A, B, C, D at Mamba-2 scales: dt = softplus(.) > 0, A < 0, B / C ~ N^-1/2."""
    g = _gen(seed)
    x = torch.randn(batch, length, heads, headdim, generator=g, dtype=dtype)
    dt = F.softplus(torch.randn(batch, length, heads, generator=g, dtype=dtype) - 1.0)
    A = -torch.rand(heads, generator=g, dtype=dtype) * 3 - 0.2
    B = torch.randn(batch, length, groups, d_state, generator=g, dtype=dtype) / d_state**0.5
    C = torch.randn(batch, length, groups, d_state, generator=g, dtype=dtype) / d_state**0.5
    D = torch.randn(heads, generator=g, dtype=dtype)
    return x, dt, A, B, C, D



@pytest.fixture
def no_ssd_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MMLINVIT_SSD_BACKEND`` unset for the test (set first so that it is restored)."""
    monkeypatch.setenv(SSD_BACKEND_ENV_VAR, '')
    monkeypatch.delenv(SSD_BACKEND_ENV_VAR)


@pytest.fixture
def mmlinvit_log() -> Iterator[List[str]]:
    """INFO messages of the ``mmlinvit`` logger during the test (level and handler restored)."""
    logger = logging.getLogger('mmlinvit')
    messages: List[str] = []

    class _Handler(logging.Handler):

        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = _Handler(logging.INFO)
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


# ==================================================================== SSD scan: numerics
@pytest.mark.parametrize('grad', [False, True], ids=['inference', 'autograd'])
def test_impulse_response_decays_to_the_log_floor(grad: bool) -> None:
    """One input at token 0, A dt = -2 per token, one chunk of 64 tokens: y_t = dt_0 e^(-2t)
    (C_t . B_0) x_0 to 1e-9 relative while 2t < 80 (mutant T05: a floor of -10 instead of
    -80 gave e^-10 for every 2t > 10), and never more than the floor's e^-80 further on."""
    length = 64
    x = torch.zeros(1, length, 1, 1, dtype=torch.float64)
    x[0, 0, 0, 0] = 1.0
    dt = torch.full((1, length, 1), 2.0, dtype=torch.float64)
    A = -torch.ones(1, dtype=torch.float64)
    B = torch.randn(1, length, 1, 4, generator=_gen(1), dtype=torch.float64)
    C = torch.randn(1, length, 1, 4, generator=_gen(2), dtype=torch.float64)
    if grad:
        x.requires_grad_(True)
    with torch.set_grad_enabled(grad):
        y = ssd_scan_torch(x, dt, A, B, C, chunk_size=64)[0, :, 0, 0].detach()
    overlap = 2.0 * (C[0, :, 0] * B[0, 0, 0]).sum(-1)  # dt_0 (C_t . B_0) x_0
    t = torch.arange(length, dtype=torch.float64)
    torch.testing.assert_close(y[:40], torch.exp(-2 * t[:40]) * overlap[:40], rtol=1e-9,
                               atol=0.0)
    assert (y[40:].abs() <= math.exp(-80) * overlap[40:].abs() * (1 + 1e-9)).all()


@pytest.mark.parametrize('length, chunk_size, step', [(23, 8, None), (23, 8, 2), (70, 64, None),
                                                      (130, 48, 1)])
@pytest.mark.parametrize('grad', [False, True], ids=['inference', 'autograd'])
def test_scan_follows_ssd_minimal_on_lengths_the_chunk_does_not_divide(
        length: int, chunk_size: int, step: Optional[int], grad: bool) -> None:
    """Any length: the last chunk is padded with dt = 0 tokens; the states crossing every
    chunk boundary (the next chunk's initial state) follow the recurrence."""
    x, dt, A, B, C, D = ssd_inputs(length)
    if grad:
        x.requires_grad_(True)
    with torch.set_grad_enabled(grad):
        got = ssd_scan_torch(x, dt, A, B, C, D, chunk_size=chunk_size, chunks_per_step=step)
    torch.testing.assert_close(got.detach(), reference_scan(x.detach(), dt, A, B, C, D),
                               rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize('grad', [False, True], ids=['inference', 'autograd'])
def test_negative_steps_take_the_general_decay(grad: bool) -> None:
    """A < 0 everywhere but some dt < 0 (log decays > 0, outside the Mamba-2 contract): the
    <= 0 fast path applies only when A <= 0 AND dt >= 0 (mutant T25: dt was not checked and
    the growing decays were clamped to 1)."""
    x, dt, A, B, C, D = ssd_inputs(21)
    dt = dt.clone()
    dt[:, 5:12, 1] = -0.3
    if grad:
        x.requires_grad_(True)
    with torch.set_grad_enabled(grad):
        got = ssd_scan_torch(x, dt, A, B, C, D, chunk_size=8)
    torch.testing.assert_close(got.detach(), reference_scan(x.detach(), dt, A, B, C, D),
                               rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize('grad', [False, True], ids=['inference', 'autograd'])
def test_empty_sequence_gives_an_empty_output(grad: bool) -> None:
    """L = 0: an empty (batch, 0, H, P) output in x's dtype, as the recurrence gives
    (mutant T27: the early return removed, a zero-step chunk loop raised)."""
    x, dt, A, B, C, D = ssd_inputs(0)
    if grad:
        x.requires_grad_(True)
    with torch.set_grad_enabled(grad):
        y = ssd_scan_torch(x, dt, A, B, C, D, chunk_size=8)
    assert y.shape == (2, 0, 4, 3) and y.dtype == torch.float64


def test_autograd_form_returns_the_input_dtype() -> None:
    """bf16 inputs with autograd: y in bf16 like the inference form and the oracle (mutant
    T30: the fp32 accumulator was returned)."""
    x, dt, A, B, C, D = ssd_inputs(19, dtype=torch.float32)
    x16 = x.bfloat16().requires_grad_(True)
    y = ssd_scan_torch(x16, dt, A, B.bfloat16(), C.bfloat16(), D, chunk_size=8)
    assert y.dtype == torch.bfloat16
    with torch.no_grad():
        assert ssd_scan_torch(x16, dt, A, B.bfloat16(), C.bfloat16(), D,
                              chunk_size=8).dtype == torch.bfloat16
    want = reference_scan(x16.detach(), dt, A, B.bfloat16(), C.bfloat16(), D)
    torch.testing.assert_close(y.detach().double(), want, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize('bad', [0, -1, 1.5])
def test_chunks_per_step_must_be_a_positive_int(bad: Any) -> None:
    """``chunks_per_step`` None or a positive int; 0 is refused, not read as None (mutant
    T26)."""
    with pytest.raises(ValueError, match='chunks_per_step must be None or a positive int'):
        ssd_scan_torch(*ssd_inputs(9), chunks_per_step=bad)


# ============================================================ SSD scan: memory contract
def test_autograd_scan_runs_chunks_per_step_chunks_at_a_time(monkeypatch) -> None:
    """With autograd, ``chunks_per_step`` chunks form one vectorised step: ceil(chunks /
    step) calls of the block scan (mutant T36: always one step, all chunks at once)."""
    spy = CallSpy(torch_impl._scan_chunk_block)
    monkeypatch.setattr(torch_impl, '_scan_chunk_block', spy)
    x, dt, A, B, C, D = ssd_inputs(37)  # 5 chunks of 8
    x.requires_grad_(True)
    ssd_scan_torch(x, dt, A, B, C, D, chunk_size=8, chunks_per_step=2)
    assert [call[0][0].shape[1] for call in spy.calls] == [2, 2, 1]
    spy.calls.clear()
    ssd_scan_torch(x, dt, A, B, C, D, chunk_size=8)
    assert [call[0][0].shape[1] for call in spy.calls] == [5]


def test_inference_chunks_are_capped_at_inference_chunk(monkeypatch) -> None:
    """Without autograd the scan works in chunks of min(chunk_size, INFERENCE_CHUNK) tokens
    (mutant T39: max, i.e. the 256-token chunk)."""
    spy = CallSpy(torch_impl._chunked_inputs)
    monkeypatch.setattr(torch_impl, '_chunked_inputs', spy)
    x, dt, A, B, C, D = ssd_inputs(150, heads=2, groups=1)
    with torch.no_grad():
        ssd_scan_torch(x, dt, A, B, C, D, chunk_size=256)
        assert {call[0][7] for call in spy.calls} == {torch_impl.INFERENCE_CHUNK}
        spy.calls.clear()
        ssd_scan_torch(x, dt, A, B, C, D, chunk_size=16)
        assert {call[0][7] for call in spy.calls} == {16}


def test_inference_step_fills_inference_step_bytes(monkeypatch) -> None:
    """Chunks per inference step: as many as keep the (batch, step, H, Q, Q + N) fp32 operand
    within INFERENCE_STEP_BYTES: with room for exactly 3 chunks, steps of 3, 3, 1 (mutant T22:
    the operand counted one byte per element, steps of 7); with room for none, one chunk per
    step (mutant T23: zero chunks per step)."""
    batch, heads, q, d_state = 2, 4, 8, 5
    per_chunk = batch * heads * q * (q + d_state) * 4  # bytes, fp32
    spy = CallSpy(torch_impl._chunked_inputs)
    monkeypatch.setattr(torch_impl, '_chunked_inputs', spy)
    x, dt, A, B, C, D = ssd_inputs(53, heads=heads, d_state=d_state, batch=batch)  # 7 chunks
    want = reference_scan(x, dt, A, B, C, D)
    for budget, steps in ((3 * per_chunk + 7, [3, 3, 1]), (per_chunk - 1, [1] * 7)):
        monkeypatch.setattr(torch_impl, 'INFERENCE_STEP_BYTES', budget)
        spy.calls.clear()
        with torch.no_grad():
            got = ssd_scan_torch(x, dt, A, B, C, D, chunk_size=q)
        assert [call[0][6] for call in spy.calls] == steps
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)


class _LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out, )):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def test_inference_buffers_never_exceed_the_chunks_there_are() -> None:
    """``chunks_per_step`` larger than the number of chunks: the kept (batch, step, H, Q,
    Q + N) buffers hold the 3 chunks of a 20-token scan, not 100 (mutant T14: sized by the
    request)."""
    x, dt, A, B, C, D = ssd_inputs(20, heads=2, groups=1, headdim=3, d_state=4, batch=1)
    with torch.no_grad(), _LargestTensor() as mode:
        got = ssd_scan_torch(x, dt, A, B, C, D, chunk_size=8, chunks_per_step=100)
    assert mode.numel <= 3 * 2 * 8 * (8 + 4)
    torch.testing.assert_close(got, reference_scan(x, dt, A, B, C, D), rtol=1e-10, atol=1e-11)


# =========================================================================== SSD dispatch
def test_environment_variable_forces_the_backend(monkeypatch) -> None:
    """``MMLINVIT_SSD_BACKEND`` is read when no ``backend`` is given (mutant S12: another
    variable name was read, so the variable did nothing); the argument wins over it."""
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    monkeypatch.setattr(ssd_dispatch, 'triton_kernel_available', lambda: True)
    args = ssd_inputs(6, dtype=torch.float32)
    monkeypatch.setenv('MMLINVIT_SSD_BACKEND', 'triton')
    assert select_ssd_backend(*args) == 'triton'
    assert select_ssd_backend(*args, backend='torch') == 'torch'
    monkeypatch.setenv('MMLINVIT_SSD_BACKEND', 'torch')
    assert select_ssd_backend(*args) == 'torch'


def test_explicit_auto_is_accepted(no_ssd_env) -> None:
    """``backend='auto'`` is the documented 'not forced' (mutant S13: refused as unknown)."""
    args = ssd_inputs(6)
    assert select_ssd_backend(*args, backend='auto') == 'torch'
    torch.testing.assert_close(ssd_scan(*args, chunk_size=4, backend='auto'),
                               reference_scan(*args), rtol=1e-10, atol=1e-11)


def test_each_choice_is_logged_once_with_its_reason(monkeypatch, mmlinvit_log,
                                                    no_ssd_env) -> None:
    """'SSD scan backend: <name> (<reason>)' once per distinct choice on the ``mmlinvit``
    logger (mutants S02: forced choices were not logged; S11: a forced Triton was logged as
    torch)."""
    monkeypatch.setattr(ssd_dispatch, '_logged_choices', set())
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    monkeypatch.setattr(ssd_dispatch, 'triton_kernel_available', lambda: True)
    args = ssd_inputs(6, dtype=torch.float32)
    for _ in range(2):
        select_ssd_backend(*args, backend='torch')
        select_ssd_backend(*args, backend='naive')
        select_ssd_backend(*args, backend='triton')
        select_ssd_backend(*args)
    assert mmlinvit_log == [
        'SSD scan backend: torch (forced)', 'SSD scan backend: naive (forced)',
        'SSD scan backend: triton (forced)', 'SSD scan backend: torch (auto: cpu tensors)'
    ]


# =========================================================================== Mamba2Mixer
def _randomise(module: torch.nn.Module, seed: int) -> None:
    g = _gen(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)


def test_conv_and_out_proj_biases_follow_their_flags() -> None:
    """Mamba-2: ``conv1d`` has a bias iff ``conv_bias``, ``out_proj`` iff ``bias`` (mutants
    M16, M17: the flags were dropped); without a conv bias the CPU convolution is the bare
    causal sum sum_k w[k] xBC[t - (K - 1) + k]."""
    mixer = Mamba2Mixer(8, d_state=2, headdim=4, conv_bias=False, bias=True)
    assert mixer.conv1d.bias is None and mixer.out_proj.bias is not None
    assert mixer.in_proj.bias is not None
    _randomise(mixer, 0)
    u = torch.randn(2, 7, 8, generator=_gen(1))
    with torch.no_grad():
        xbc = F.linear(u, *mixer._in_proj_rows(1)).double()
        weight = mixer.conv1d.weight.double()[:, 0]
        taps = weight.shape[-1]
        padded = F.pad(xbc, (0, 0, taps - 1, 0))
        want = sum(weight[:, k] * padded[:, k:k + u.shape[1]] for k in range(taps))
        torch.testing.assert_close(mixer.conv_input(u).double(), want, rtol=1e-5, atol=1e-6)


class _ReportsCuda(torch.Tensor):
    """A CPU tensor that says it lives on ``cuda:0``: runs the accelerator branch of
    :meth:`Mamba2Mixer.conv_input` (bmm / baddbmm + ``nn.Conv1d``) on a machine without GPU."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device('cuda', 0)


@pytest.mark.parametrize('bias', [False, True])
def test_accelerator_conv_branch_is_causal_and_cropped(bias: bool) -> None:
    """The ``nn.Conv1d`` form (padding K - 1, right pad dropped): out[t] = b + sum_k w[k]
    xBC[t - (K - 1) + k], the CPU form's values (mutants M26: the left outputs dropped;
    M27: padding K)."""
    mixer = Mamba2Mixer(8, d_state=2, headdim=4, bias=bias)
    _randomise(mixer, 2)
    u = torch.randn(2, 9, 8, generator=_gen(3))
    with torch.no_grad():
        xbc = F.linear(u, *mixer._in_proj_rows(1)).double()
        weight = mixer.conv1d.weight.double()[:, 0]
        taps = weight.shape[-1]
        padded = F.pad(xbc, (0, 0, taps - 1, 0))
        want = mixer.conv1d.bias.double() + sum(weight[:, k] * padded[:, k:k + u.shape[1]]
                                                for k in range(taps))
        got = mixer.conv_input(u.as_subclass(_ReportsCuda)).as_subclass(torch.Tensor)
    assert got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_mixer_forwards_its_scan_options(monkeypatch) -> None:
    """``chunk_size``, ``chunks_per_step`` and ``ssd_backend`` reach ``ssd_scan`` (mutants
    M18, M19, M20: the defaults were passed); values against the recurrence."""
    spy = CallSpy(mamba2_module.ssd_scan)
    monkeypatch.setattr(mamba2_module, 'ssd_scan', spy)
    mixer = Mamba2Mixer(8, d_state=2, headdim=4, chunk_size=8, chunks_per_step=3,
                        ssd_backend='naive')
    mixer(torch.randn(1, 5, 8, generator=_gen(0)))
    kwargs = spy.calls[0][1]
    assert (kwargs['chunk_size'], kwargs['chunks_per_step'], kwargs['backend']) == (8, 3, 'naive')


def test_forced_triton_mixer_on_cpu_is_refused(monkeypatch) -> None:
    """``ssd_backend='triton'`` reaches the dispatcher: CPU tensors without the interpreter
    are refused by name (mutant M19: the mixer ran the torch scan instead)."""
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    monkeypatch.setattr(ssd_dispatch, 'triton_kernel_available', lambda: True)
    mixer = Mamba2Mixer(8, d_state=2, headdim=4, ssd_backend='triton')
    with pytest.raises(RuntimeError, match="backend='triton' needs CUDA tensors"):
        mixer(torch.randn(1, 5, 8))


def test_constant_dt_init_is_allowed() -> None:
    """``dt_min == dt_max`` (a constant initial step, as the official code allows): every
    softplus(dt_bias) is that step (mutant M04: refused)."""
    mixer = Mamba2Mixer(8, d_state=2, headdim=4, dt_min=0.01, dt_max=0.01)
    torch.testing.assert_close(F.softplus(mixer.dt_bias.detach().double()),
                               torch.full((4, ), 0.01, dtype=torch.float64), rtol=1e-5, atol=0.0)


def test_a_init_range_must_be_positive() -> None:
    """A = -exp(A_log) with A_log = log(U[A_init_range]): a zero low end gives log(0) = -inf
    (official assert ``A_init_range[0] > 0``; mutant M03: 0 accepted)."""
    with pytest.raises(ValueError, match='A_init_range'):
        Mamba2Mixer(8, d_state=2, headdim=4, A_init_range=(0.0, 16.0))


def test_mixer_refuses_a_wrong_token_width() -> None:
    """(B, L, C) with C != d_model is named (mutant M25: a matmul error deep inside)."""
    mixer = Mamba2Mixer(8, d_state=2, headdim=4)
    with pytest.raises(ValueError, match=r'Mamba2Mixer expects \(batch, L, 8\), got \(1, 5, 6\)'):
        mixer(torch.randn(1, 5, 6))


# ============================================================================= Adventurer
def test_flip_indices_refuse_negative_and_merge_repeats() -> None:
    """Explicit flip indices are block numbers 0..depth-1: -1 is refused (mutant A03: it was
    kept, a block that does not exist); repeats count once, sorted (mutant A27)."""
    with pytest.raises(IndexError, match=r'\[-1\] are out of range for 4 blocks'):
        flip_block_indices([-1, 2], 4)
    assert flip_block_indices([3, 1, 3], 4) == [1, 3]


def test_describe_flips_names_every_matching_schedule() -> None:
    """Without a given name, every schedule giving these indices at this depth is named
    (mutant A26: none was)."""
    assert describe_flips([1, 3], 4) == "[1, 3] (flip_schedule='paper')"
    assert describe_flips([2, 3], 4) == "[2, 3] (flip_schedule='official')"
    assert describe_flips([], 4) == "[] (flip_schedule='none')"
    # depth 3: 'paper' flips [1], 'official' flips [2]; [0] is neither
    assert describe_flips([0], 3) == '[0]'
    assert describe_flips([2, 3], 4, 'custom') == "[2, 3] (flip_schedule='custom')"


def test_flip_record_compares_blocks_not_counts() -> None:
    """Weights flipped in blocks 0, 3 are refused by a model flipping 1, 3 (the same number
    of flips; mutant A29 compared counts)."""
    model = Adventurer(arch=TINY_ARCH, img_size=32, mixer_cfg=TINY_MIXER)
    model.check_training_record('flipped_blocks', torch.tensor([False, True, False, True]))
    with pytest.raises(FlipScheduleMismatchError, match=r'\[0, 3\]'):
        model.check_training_record('flipped_blocks', torch.tensor([True, False, False, True]))


def test_small_alias_and_num_heads() -> None:
    """``'small'`` is ``'s'`` (512 channels; mutant A19); ``num_heads`` is the Mamba-2 head
    count d_inner / headdim = 2 * 512 / 64 (mutant A20: headdim)."""
    with torch.device('meta'):
        model = Adventurer('small')
    assert (model.arch, model.embed_dims, model.num_heads) == ('s', 512, 16)


def test_custom_arch_mlp_hidden_dims_is_used() -> None:
    """A custom arch's ``mlp_hidden_dims`` sizes every SwiGLU (mutant A17: 2.5 C always)."""
    with torch.device('meta'):
        model = Adventurer(arch=dict(TINY_ARCH, mlp_hidden_dims=48), img_size=32,
                           mixer_cfg=TINY_MIXER)
    assert {blk.mlp.w1.out_features for blk in model.layers} == {48}


def test_non_square_grid_keeps_its_learned_positions() -> None:
    """img_size (64, 32): a 4 x 2 (rows x cols) grid, whose learned positions are used as
    they are at that input size (mutant A18: rows and cols swapped, the grid resampled)."""
    torch.manual_seed(0)
    model = Adventurer(arch=TINY_ARCH, img_size=(64, 32), mixer_cfg=TINY_MIXER).eval()
    assert model.pos_grid == (4, 2)
    torch.testing.assert_close(model.patch_pos_embed((4, 2)), model.pos_embed[:, :-1])


def test_bad_chunk_settings_are_refused_by_every_backend_and_at_build_time():
    """``chunks_per_step=True`` ran as 1 (``check_chunk_size`` refuses a bool on purpose);
    ``chunk_size=0`` ran on the naive backend though the torch one refuses it, and a
    ``Mamba2Mixer(chunk_size=0)`` was built and failed at its first forward."""
    from mmlinvit.layers.mamba2 import Mamba2Mixer
    from mmlinvit.ops.ssd import ssd_scan
    from mmlinvit.ops.ssd.torch_impl import ssd_scan_torch
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 5, 2, 4, generator=g)
    dt = torch.rand(1, 5, 2, generator=g)
    A = -torch.rand(2, generator=g)
    B = torch.randn(1, 5, 1, 3, generator=g)
    C = torch.randn(1, 5, 1, 3, generator=g)
    with pytest.raises(ValueError, match='chunks_per_step must be None or a positive int'):
        ssd_scan_torch(x, dt, A, B, C, chunk_size=2, chunks_per_step=True)
    for backend in ('naive', 'torch'):
        with pytest.raises(ValueError, match='chunk_size must be a positive int, got 0'):
            ssd_scan(x, dt, A, B, C, chunk_size=0, backend=backend)
    with pytest.raises(ValueError, match='chunk_size must be a positive int, got 0'):
        Mamba2Mixer(d_model=16, d_state=4, headdim=8, chunk_size=0)
