"""Mutation round 20: the SSD scan (torch, naive, Triton kernels) and the Adventurer backbone.

Each test fails on a one-line change of ``mmlinvit/ops/ssd/torch_impl.py``,
``mmlinvit/ops/ssd/naive.py``, ``mmlinvit/ops/ssd/triton_kernel.py`` or
``mmlinvit/backbones/adventurer.py`` that the rest of the suite let through (ids of the
round-20 audit in the docstrings), or pins a reimplemented behaviour against an independent
reference.  References:

* the scan: state-spaces/mamba ``ssd_minimal.py`` semantics written here as a float64 loop
  over tokens (``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = C_t h_t + D x_t``,
  zero initial state; head h reads B / C group ``h // (H // G)``), differentiated by autograd
  for the gradients of the Triton kernels (run in the Triton CPU interpreter on tiny ragged
  shapes when there is no GPU);
* the documented execution contract of :func:`ssd_scan_torch`: no autograd means the inference
  form (chunks of ``INFERENCE_CHUNK`` tokens, steps within the default
  ``INFERENCE_STEP_BYTES`` = 4 MiB worked out by hand), a captured graph means out-of-place
  ops only and 16-bit inputs accumulated in fp32, and the differentiable form run in place
  sizes its workspace by the chunks that exist;
* the Triton kernels' documented input contract (any strides; ``TRITON_INTERPRET=1`` still set
  at launch for interpreted kernels).  A bug found in this round (strided ``A`` / ``D`` read
  without their stride) has its test here, marked in the docstring;
* Adventurer: the floor ``img_size // patch_size`` of the official ``PatchEmbed`` grid (timm's
  ``PatchEmbed`` run in the test), the flip record's description at the checkpoint's own
  depth, and the named error of a custom arch dict without ``num_layers``.
"""
import importlib
import re
from types import ModuleType
from typing import List, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from mmlinvit.backbones.adventurer import Adventurer, FlipScheduleMismatchError
from mmlinvit.ops.ssd import ssd_scan_torch
from mmlinvit.ops.ssd import torch_impl

from call_spy import CallSpy
from test_mutation_round15_adventurer_ssd import _LargestTensor

pytestmark = pytest.mark.usefixtures('one_thread')

TINY_ARCH = dict(embed_dims=32, num_layers=4)
TINY_MIXER = dict(d_state=8, headdim=16, chunk_size=16)


# --------------------------------------------------------------------------------- helpers
def ssd_inputs(length: int, heads: int = 4, groups: int = 2, headdim: int = 3, d_state: int = 5,
               batch: int = 2, seed: int = 0,
               dtype: torch.dtype = torch.float64) -> List[torch.Tensor]:
    """x, dt, A, B, C, D at Mamba-2 scales: dt = softplus(.) > 0, A < 0, B / C ~ N^-1/2."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, heads, headdim, generator=g, dtype=torch.float64)
    dt = F.softplus(torch.randn(batch, length, heads, generator=g, dtype=torch.float64) - 1.0)
    A = -torch.rand(heads, generator=g, dtype=torch.float64) * 3 - 0.2
    B = torch.randn(batch, length, groups, d_state, generator=g, dtype=torch.float64)
    C = torch.randn(batch, length, groups, d_state, generator=g, dtype=torch.float64)
    D = torch.randn(heads, generator=g, dtype=torch.float64)
    return [t.to(dtype) for t in (x, dt, A, B / d_state**0.5, C / d_state**0.5, D)]


def recurrence(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
               C: torch.Tensor, D: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``ssd_minimal.py``'s recurrence, one token at a time, in float64 (differentiable).

    Head h reads B / C group ``h // (H // G)``; the state (batch, H, P, N) starts at zero.
    """
    x, dt, A, B, C = (t.double() for t in (x, dt, A, B, C))
    batch, length, heads, headdim = x.shape
    group_of_head = torch.arange(heads) // (heads // B.shape[2])
    b_h, c_h = B[:, :, group_of_head], C[:, :, group_of_head]  # (batch, L, H, N)
    state = x.new_zeros(batch, heads, headdim, B.shape[3])
    ys = []
    for t in range(length):
        decay = torch.exp(dt[:, t] * A)[:, :, None, None]
        state = decay * state + (dt[:, t, :, None, None] * x[:, t, :, :, None] *
                                 b_h[:, t, :, None, :])
        ys.append((state * c_h[:, t, :, None, :]).sum(-1))
    y = torch.stack(ys, dim=1) if ys else x.new_zeros(x.shape)
    if D is not None:
        y = y + D.double()[None, None, :, None] * x
    return y


class _MutatingOps(TorchDispatchMode):
    """Records every op that writes into one of its arguments (in place or ``out=``)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: List[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(a.alias_info is not None and a.alias_info.is_write
               for a in func._schema.arguments):
            self.names.append(str(func))
        return func(*args, **(kwargs or {}))


# ============================================================ SSD torch: execution contract
def test_no_grad_takes_the_inference_form_even_for_inputs_that_require_grad(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``torch.no_grad()`` nothing is recorded, so leaf inputs that require grad still
    take the inference form (chunks of ``INFERENCE_CHUNK`` tokens; mutant T13:
    ``requires_grad`` alone chose the 256-token differentiable form)."""
    spy = CallSpy(torch_impl._chunked_inputs)
    monkeypatch.setattr(torch_impl, '_chunked_inputs', spy)
    x, dt, A, B, C, D = ssd_inputs(150, heads=2, groups=1)
    with torch.no_grad():
        y = ssd_scan_torch(x.requires_grad_(True), dt, A, B, C, D, chunk_size=256)
    assert spy.calls and {call[0][7] for call in spy.calls} == {64}
    assert not y.requires_grad
    torch.testing.assert_close(y, recurrence(x.detach(), dt, A, B, C, D), rtol=1e-10,
                               atol=1e-11)


def test_default_inference_step_is_4_mib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Default ``INFERENCE_STEP_BYTES`` = 4 MiB: with 64 heads, Q = 64 and N = 64 one chunk's
    fp32 (H, Q, Q + N) operand is 64 * 64 * 128 * 4 B = 2 MiB, so 2 chunks per step; 5 chunks
    run as steps of 2, 2, 1 (mutant T29: a 4 GiB budget ran all 5 at once)."""
    spy = CallSpy(torch_impl._chunked_inputs)
    monkeypatch.setattr(torch_impl, '_chunked_inputs', spy)
    args = ssd_inputs(5 * 64 - 3, heads=64, groups=1, headdim=1, d_state=64, batch=1,
                      dtype=torch.float32)
    with torch.no_grad():
        ssd_scan_torch(*args, chunk_size=64)
    assert [call[0][6] for call in spy.calls] == [2, 2, 1]


def test_differentiable_form_in_place_sizes_its_workspace_by_the_chunks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``INFERENCE_FORM = False`` runs the chunked form in place; with ``chunks_per_step``
    (100) above the 3 chunks of a 20-token scan its (batch, step, G, R, Q, Q) workspace holds
    3 chunks (3 * 2 heads * 8 * 8 = 384 elements, the largest tensor), not 100 (mutant T14)."""
    monkeypatch.setattr(torch_impl, 'INFERENCE_FORM', False)
    x, dt, A, B, C, D = ssd_inputs(20, heads=2, groups=1, headdim=3, d_state=4, batch=1)
    with torch.no_grad(), _LargestTensor() as mode:
        y = ssd_scan_torch(x, dt, A, B, C, D, chunk_size=8, chunks_per_step=100)
    assert mode.numel <= 3 * 2 * 8 * 8
    torch.testing.assert_close(y, recurrence(x, dt, A, B, C, D), rtol=1e-10, atol=1e-11)


def test_captured_graph_form_writes_no_tensor_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a graph is captured the scan uses out-of-place ops only (the module docstring:
    no kept buffers, no ``out=``, no slice updates), on ragged chunks, with the recurrence's
    values (mutant T25: the buffered inference form ran while capturing)."""
    monkeypatch.setattr(torch_impl, 'capturing_graph', lambda: True)
    x, dt, A, B, C, D = ssd_inputs(19)
    with torch.no_grad(), _MutatingOps() as mode:
        y = ssd_scan_torch(x, dt, A, B, C, D, chunk_size=8)
    assert mode.names == []
    torch.testing.assert_close(y, recurrence(x, dt, A, B, C, D), rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize('graph', [True, False], ids=['captured-graph', 'inference'])
def test_inference_forms_keep_16bit_inputs_in_fp32_and_return_their_dtype(
        monkeypatch: pytest.MonkeyPatch, graph: bool) -> None:
    """bf16 x / B / C (fp32 dt, A, D as the mixer passes them) without autograd, in the
    captured-graph and the buffered inference forms: y in bf16 (mutant T19: the graph form
    returned its fp32 accumulator) and within one bf16 rounding of the float64 recurrence on
    the rounded inputs, as an fp32 scan rounded once gives (mutants T21 / T22: the graph /
    buffered form accumulated in bf16)."""
    monkeypatch.setattr(torch_impl, 'capturing_graph', lambda: graph)
    x, dt, A, B, C, D = ssd_inputs(96, heads=2, groups=1, headdim=8, d_state=16, batch=1,
                                   dtype=torch.float32)
    A = A / 30.0  # slow decays: the state carries many tokens across the chunks
    x, B, C = x.bfloat16(), B.bfloat16(), C.bfloat16()
    with torch.no_grad():
        y = ssd_scan_torch(x, dt, A, B, C, D, chunk_size=16)
    assert y.dtype == torch.bfloat16
    want = recurrence(x, dt, A, B, C, D)
    # one bf16 rounding (8 significant bits) is at most 2^-8 relative; fp32 sums add ~1e-7
    bound = want.abs() * 2.0**-8 + 1e-5 * want.abs().max()
    assert ((y.double() - want).abs() <= bound).all()


# ============================================================ Triton kernels vs ssd_minimal
def _kernels() -> Tuple[ModuleType, torch.device]:
    """The Triton kernel module and its device: CPU in the interpreter (``tests/conftest.py``
    sets ``TRITON_INTERPRET=1`` before anything imports triton when there is no GPU)."""
    pytest.importorskip('triton')
    module = importlib.import_module('mmlinvit.ops.ssd.triton_kernel')
    if module.INTERPRETED:
        return module, torch.device('cpu')
    if not torch.cuda.is_available():
        pytest.skip('triton was imported without TRITON_INTERPRET=1 and there is no GPU')
    return module, torch.device('cuda')


@pytest.fixture(scope='module')
def kernels() -> Tuple[ModuleType, torch.device]:
    return _kernels()


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want||."""
    return ((got.detach().cpu().double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize('length, chunk_size, heads, groups, batch, with_d',
                         [(13, 8, 2, 1, 2, True), (7, 4, 4, 2, 1, False)])
def test_triton_forward_and_gradients_follow_the_recurrence(
        kernels: Tuple[ModuleType, torch.device], length: int, chunk_size: int, heads: int,
        groups: int, batch: int, with_d: bool) -> None:
    """fp32 kernels on ragged chunks (13 tokens in chunks of 8, 7 in chunks of 4), heads
    sharing B/C groups, P = 5 and N = 6 (not powers of two): y and the gradients of x, dt, A,
    B, C (and D) against autograd through the float64 recurrence, to fp32 accuracy."""
    kernel, device = kernels
    inputs = ssd_inputs(length, heads=heads, groups=groups, headdim=5, d_state=6, batch=batch,
                        seed=5, dtype=torch.float32)
    if not with_d:
        inputs[5] = None
    leaves = [None if t is None else t.to(device).requires_grad_(True) for t in inputs]
    ref_leaves = [None if t is None else t.double().requires_grad_(True) for t in inputs]
    y = kernel.ssd_scan_triton(*leaves, chunk_size=chunk_size)
    want = recurrence(*ref_leaves)
    assert y.dtype == torch.float32 and y.shape == want.shape
    assert _rel(y, want) < 2e-6
    dy = torch.randn(want.shape, generator=torch.Generator().manual_seed(9),
                     dtype=torch.float64)
    present = [i for i, t in enumerate(leaves) if t is not None]
    got = torch.autograd.grad(y, [leaves[i] for i in present], dy.float().to(device))
    ref = torch.autograd.grad(want, [ref_leaves[i] for i in present], dy)
    for i, g, r in zip(present, got, ref):
        name = 'x dt A B C D'.split()[i]
        assert g.dtype == torch.float32, name
        # dA sums every token's terms, which cancel: fp32 loses a few more digits there
        assert _rel(g, r) < (2e-4 if name == 'A' else 2e-5), (name, _rel(g, r))


def test_triton_kernels_refuse_an_interpreter_switched_off_at_launch(
        kernels: Tuple[ModuleType, torch.device], monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels decorated for the interpreter need ``TRITON_INTERPRET=1`` still set when they
    run (module docstring): unset, the call names the variable (mutant K14: the device check
    was skipped and the launch went on without it)."""
    kernel, _ = kernels
    if not kernel.INTERPRETED:
        pytest.skip('compiled kernels: the interpreter switch does not apply')
    args = ssd_inputs(5, heads=2, groups=1, batch=1, dtype=torch.float32)
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    with pytest.raises(RuntimeError, match='TRITON_INTERPRET=1 was unset'):
        kernel.ssd_scan_triton(*args, chunk_size=4)



def test_triton_kernels_read_strided_a_and_d_views(kernels: Tuple[ModuleType, torch.device]
                                                    ) -> None:
    """BUG FOUND IN ROUND 20 (fails on the code before the fix): the kernels read ``A[h]`` and
    ``D[h]`` as ``A + h`` / ``D + h`` with no stride, so (H,) views with stride 2 (the
    kernel docstring promises any strides) gave y off by ~340 with no error; the fix copies
    them contiguous in ``ssd_scan_triton``.  Values and gradients (through the views, to
    their bases) against the float64 recurrence."""
    kernel, device = kernels
    x, dt, A, B, C, D = [t.to(device) for t in ssd_inputs(7, heads=2, groups=1, headdim=4,
                                                          d_state=4, batch=1,
                                                          dtype=torch.float32)]
    # every other entry of a (2H,) base holds the real value, the others a decoy
    a_base = torch.stack([A, torch.full_like(A, -50.0)], dim=1).flatten().requires_grad_(True)
    d_base = torch.stack([D, torch.full_like(D, 100.0)], dim=1).flatten().requires_grad_(True)
    a_view, d_view = a_base[::2], d_base[::2]
    assert a_view.stride() == (2, ) and torch.equal(a_view, A) and torch.equal(d_view, D)
    y = kernel.ssd_scan_triton(x, dt, a_view, B, C, d_view, chunk_size=4)
    ref_a, ref_d = A.cpu().double().requires_grad_(True), D.cpu().double().requires_grad_(True)
    want = recurrence(x.cpu(), dt.cpu(), ref_a, B.cpu(), C.cpu(), ref_d)
    assert _rel(y, want) < 2e-6
    dy = torch.randn(want.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    ga, gd = torch.autograd.grad(y, [a_base, d_base], dy.float().to(device))
    wa, wd = torch.autograd.grad(want, [ref_a, ref_d], dy)
    assert _rel(ga[::2], wa) < 2e-5 and _rel(gd[::2], wd) < 2e-5
    assert torch.count_nonzero(ga[1::2]) == 0 and torch.count_nonzero(gd[1::2]) == 0


# ============================================================================= Adventurer
def test_position_grid_is_the_floor_of_img_size_over_patch_size() -> None:
    """The learned position grid is the patch grid of the official model's ``PatchEmbed``
    (Vim / timm: ``img_size // patch_size`` per side, checked against timm's): 40 x 56 pixels
    in 16-pixel patches is a 2 x 3 grid, 6 patch positions + the class position (mutant A20:
    rounded up, a 3 x 4 grid)."""
    from timm.layers import PatchEmbed as TimmPatchEmbed
    official = TimmPatchEmbed(img_size=(40, 56), patch_size=16, in_chans=3, embed_dim=32)
    with torch.device('meta'):
        model = Adventurer(arch=TINY_ARCH, img_size=(40, 56), mixer_cfg=TINY_MIXER)
    assert official.grid_size == (2, 3)
    assert model.pos_grid == official.grid_size
    assert tuple(model.pos_embed.shape) == (1, 2 * 3 + 1, 32)


def test_flip_record_of_another_depth_is_described_at_its_own_depth() -> None:
    """A 6-block checkpoint flipped in blocks 1, 3, 5 ('paper' at depth 6) refused by a
    4-block model: the message names the checkpoint's schedule at ITS depth (mutant A11: the
    model's depth was used, where [1, 3, 5] is no schedule)."""
    model = Adventurer(arch=TINY_ARCH, img_size=32, mixer_cfg=TINY_MIXER,
                       flip_schedule='official')
    record = torch.tensor([False, True, False, True, False, True])
    with pytest.raises(FlipScheduleMismatchError,
                       match=r"blocks \[1, 3, 5\] \(flip_schedule='paper'\)"):
        model.check_training_record('flipped_blocks', record)


@pytest.mark.parametrize('arch, missing', [(dict(embed_dims=32), "['num_layers']"),
                                           (dict(num_layers=2), "['embed_dims']")])
def test_custom_arch_names_every_missing_key(arch: dict, missing: str) -> None:
    """A custom arch dict without ``num_layers`` is refused naming it, like one without
    ``embed_dims`` (mutant A15: only ``embed_dims`` was checked and a bare
    ``KeyError: 'num_layers'`` came from deep in the constructor)."""
    with pytest.raises(KeyError, match='Custom Adventurer arch dict is missing ' +
                       re.escape(missing)):
        Adventurer(arch=arch, img_size=32, mixer_cfg=TINY_MIXER)
