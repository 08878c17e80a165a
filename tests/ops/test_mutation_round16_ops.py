"""Mutation audit, round 16: branches, defaults and error paths of :mod:`mmlinvit.ops` that the
rest of the suite let through.

Each test failed on at least one single-line change of the operator code (ids from the
round-16 audit, named in the docstrings) and passes on the unmodified code.  Every expected
value is worked out by hand from the documented contract, written here as an fp64 formula, or
taken from the public reference code (MHLA's ``BlockDistanceConv``) transcribed in this file;
none is a pasted output of the code under test.  Guarded here:

* the chunk sizing of the torch linear attention (:func:`chunk_tokens`: the single-chunk
  boundary, the minimum chunk, the fp32 byte count, the ``[1, tokens]`` range) and the chunks
  the forward and backward actually take on CPU, the ``chunk_size`` check, empty queries;
* InLine attention's output dtype (that of ``v``) for 16-bit and mixed inputs;
* backend choice: the log lines of forced choices, no logging while a graph is captured,
  the interpreter checks (triton's ``knobs`` over the environment variable, triton imported
  before ``TRITON_INTERPRET``), the one-device rule of the kernel limits;
* the SSD entry point and input checks (chunk size refused on every backend, a B/C group
  count of 0, empty sequences, x of the wrong rank);
* MHLA's block-mixing inits against the public ``BlockDistanceConv`` transforms and the
  documented softmax init, and the patch-to-block assignment (floor edges);
* the patch-grid check (FINDING: negative sides; that one test fails on the original
  ``mmlinvit/ops/patch_grid.py`` and passes with the fix proposed in the round-16 report).
"""
import contextlib
import logging
import math
from typing import Any, Callable, Iterator, List, Tuple

import pytest
import torch
import torch.nn.functional as F

from mmlinvit.ops.linear_attention import (inline_attention_torch, linear_attention_torch,
                                           torch_impl)
from mmlinvit.ops.linear_attention.torch_impl import chunk_tokens

from triton_testing import _CollectMessages

pytestmark = pytest.mark.usefixtures('one_thread')


# ============================================================ torch linear attention: chunks
@pytest.mark.parametrize('rows,width,tokens,chunk_bytes,expected', [
    # whole buffer (tokens * rows * width * 4 bytes) exactly SINGLE_CHUNK_FACTOR (4) budgets:
    # still one chunk (the docstring's "at most")
    (1, 1, 100, 100, 100),
    (2, 3, 50, 300, 50),  # 50 * 24 = 1200 = 4 * 300
    # one token more: budget // (rows * width * 4) tokens, at least MIN_CHUNK_TOKENS (32)
    (1, 1, 101, 100, 32),  # 100 // 4 = 25 -> 32
    (1, 1, 1000, 400, 100),  # 400 // 4 = 100 > 32
    (2, 3, 51, 3000, 51),  # 51 * 24 = 1224 <= 12000: one chunk
    (2, 3, 1000, 3000, 125),  # 3000 // 24 = 125
    (1, 1, 1000, 40, 32),  # 40 // 4 = 10 -> 32
])
def test_chunk_tokens_by_hand(rows: int, width: int, tokens: int, chunk_bytes: int,
                              expected: int) -> None:
    """Mutants T01 (``<=`` -> ``<`` at the single-chunk boundary), T02 (no
    ``MIN_CHUNK_TOKENS`` floor), T03 (2 bytes per fp32 element)."""
    assert torch_impl.SINGLE_CHUNK_FACTOR == 4 and torch_impl.MIN_CHUNK_TOKENS == 32
    assert chunk_tokens(rows, width, tokens, chunk_bytes) == expected


@pytest.mark.parametrize('tokens', [1, 2, 5])
def test_chunk_tokens_stay_within_the_sequence(tokens: int) -> None:
    """Mutant T04: a short sequence is one chunk of exactly its length (never more)."""
    assert chunk_tokens(4, 16, tokens) == tokens
    assert chunk_tokens(4, 16, tokens, 1) == tokens  # tiny budget: min(tokens, 32)


def test_chunk_tokens_default_budget_is_the_cpu_constant() -> None:
    """``chunk_bytes=None`` means :data:`DEFAULT_CHUNK_BYTES` (256 KiB): rows * width = 256
    floats = 1 KiB per token, so 256 tokens per chunk beyond 4 * 256 tokens."""
    assert torch_impl.DEFAULT_CHUNK_BYTES == 1 << 18
    assert chunk_tokens(16, 16, 4096) == 256
    assert chunk_tokens(16, 16, 1024) == 1024  # exactly 4 budgets: one chunk


# ============================================================================ MHLA inits
def _centre_distances_fp64(gh: int, gw: int) -> torch.Tensor:
    """|c_a - c_b| between block centres (row + 0.5, col + 0.5), row-major blocks, fp64."""
    centres = [(i + 0.5, j + 0.5) for i in range(gh) for j in range(gw)]
    return torch.tensor([[math.dist(a, b) for b in centres] for a in centres],
                        dtype=torch.float64)


def _public_linear_init(gh: int, gw: int) -> torch.Tensor:
    """The public MHLA ``BlockDistanceConv(transform='linear')._apply_transform``:
    ``mat = 1 - d / max(d)``, then ``mat / mat.sum(dim=0, keepdim=True)`` (conv weight
    [out block, in block], so ``mixed_a = sum_b mat[a, b] KV_b``)."""
    dist = _centre_distances_fp64(gh, gw)
    mat = 1.0 - dist / dist.max()
    return mat / mat.sum(dim=0, keepdim=True)


@pytest.mark.parametrize('grid', [(2, 2), (3, 3), (2, 3), (3, 2), (1, 4)])
def test_linear_mixing_init_matches_the_public_transform(grid: Tuple[int, int]) -> None:
    """Mutants M03 (another slope), M04 (rows instead of columns normalised), M06 (another
    centre spacing along the columns): ``block_centre_mixing_linear`` against the public
    code's formula written out above (non-square grids by the same formula)."""
    from mmlinvit.ops.mhla import block_centre_mixing_linear
    got = block_centre_mixing_linear(grid)
    assert got.dtype == torch.float32 and got.shape == (grid[0] * grid[1], ) * 2
    torch.testing.assert_close(got.double(), _public_linear_init(*grid), rtol=0, atol=1e-6)


def test_public_inits_on_a_single_block_are_ones() -> None:
    """Mutant M05 (``max_dist >= 0``): one block has max distance 0, where the public code
    divides 0 by 0; the documented result is the 1 x 1 matrix [[1]] for both public inits."""
    from mmlinvit.ops.mhla import block_centre_mixing_cos, block_centre_mixing_linear
    for init in (block_centre_mixing_cos, block_centre_mixing_linear):
        got = init((1, 1))
        assert torch.equal(got, torch.ones(1, 1)), init.__name__


@pytest.mark.parametrize('grid,tau', [((2, 2), 0.5), ((2, 3), 2.0), ((3, 3), 1.0)])
def test_softmax_mixing_init_by_formula(grid: Tuple[int, int], tau: float) -> None:
    """Mutants M01 (``d * tau``), M02 (softmax over the other dim): row a is
    ``exp(-d_ab / tau) / sum_c exp(-d_ac / tau)``, rows summing to 1."""
    from mmlinvit.ops.mhla import block_centre_mixing
    dist = _centre_distances_fp64(*grid)
    expected = torch.exp(-dist / tau)
    expected = expected / expected.sum(dim=1, keepdim=True)
    got = block_centre_mixing(grid, tau)
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.sum(dim=1), torch.ones(got.shape[0]))


@pytest.mark.parametrize('h,g', [(5, 2), (7, 3), (4, 4), (3, 5), (10, 4), (1, 2)])
def test_patch_block_index_follows_the_floor_edges(h: int, g: int) -> None:
    """Mutants M07 / M08 (another rounding of the row / column owner): block i covers rows
    ``floor(i h / g) <= y < floor((i + 1) h / g)`` as documented, written here as loops."""
    from mmlinvit.ops.mhla import patch_block_index
    edges = [(i * h) // g for i in range(g + 1)]
    owner = [max(i for i in range(g) if edges[i] <= y) for y in range(h)]
    # rows along h (block_grid (g, 1) on an (h, 1) grid) and columns along w ((1, g) on (1, h))
    assert patch_block_index((h, 1), (g, 1)).tolist() == owner
    assert patch_block_index((1, h), (1, g)).tolist() == owner
    # 2-D: row-major block id = row_block * gw + col_block
    got = patch_block_index((h, 3), (g, 2)).view(h, 3)
    col_edges = [(i * 3) // 2 for i in range(3)]
    col_owner = [max(i for i in range(2) if col_edges[i] <= x) for x in range(3)]
    expected = torch.tensor([[owner[y] * 2 + col_owner[x] for x in range(3)] for y in range(h)])
    assert torch.equal(got, expected)


def _phi64(x: torch.Tensor, feature_map: str) -> torch.Tensor:
    """ELU + 1 / ReLU / identity written out in fp64."""
    x = x.double()
    if feature_map == 'elu':
        return torch.where(x > 0, x + 1.0, torch.exp(x))
    if feature_map == 'relu':
        return x.clamp(min=0.0)
    return x


def _linear_attention64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature_map: str,
                        eps: float) -> torch.Tensor:
    """``phi(Q) (phi(K)^T V / M) / (phi(Q) mean_j phi(k_j) + eps)`` in fp64."""
    pq, pk, v64 = _phi64(q, feature_map), _phi64(k, feature_map), v.double()
    m = k.shape[-2]
    num = pq @ (pk.transpose(-2, -1) @ v64) / m
    den = pq @ pk.mean(dim=-2).unsqueeze(-1) + eps
    return num / den


def test_chunk_size_zero_is_refused() -> None:
    """Mutant T12 (``chunk_size < 0``): 0 is not a chunk length; it used to mean "auto" only
    through ``0 or ...`` and must be refused like any value below 1."""
    q = torch.randn(1, 2, 6, 4)
    with pytest.raises(ValueError, match='chunk_size must be >= 1'):
        linear_attention_torch(q, q, q, chunk_size=0)
    with pytest.raises(ValueError, match='chunk_size must be >= 1'):
        linear_attention_torch(q, q, q, chunk_size=-3)


@pytest.mark.parametrize('feature_map', ['elu', 'relu'])
def test_empty_queries_give_an_empty_output_and_gradients(feature_map: str) -> None:
    """Mutant T13 (the key chunk capped by N instead of M): N = 0 queries with M >= 1 keys is
    a valid input (only M >= 1 is required); the result is (..., 0, e), and the keys and
    values get zero gradients (nothing reads them)."""
    q = torch.randn(2, 3, 0, 4, requires_grad=True)
    k = torch.randn(2, 3, 5, 4, requires_grad=True)
    v = torch.randn(2, 3, 5, 6, requires_grad=True)
    out = linear_attention_torch(q, k, v, feature_map)
    assert out.shape == (2, 3, 0, 6) and out.dtype == torch.float32
    out.sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k)) and torch.equal(v.grad, torch.zeros_like(v))
    # with explicit chunks too, and a non-empty sibling call keeps the formula
    out = linear_attention_torch(q.detach(), k.detach(), v.detach(), feature_map, chunk_size=2)
    assert out.shape == (2, 3, 0, 6)
    q1 = torch.randn(2, 3, 3, 4)
    torch.testing.assert_close(
        linear_attention_torch(q1, k.detach(), v.detach(), feature_map).double(),
        _linear_attention64(q1, k.detach(), v.detach(), feature_map, 1e-6), rtol=1e-5,
        atol=1e-6)


def test_auto_chunks_on_cpu_use_the_cpu_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants T14 (the accelerator budget on CPU) and T20 (no re-sizing for the backward):
    cross-attention (the streaming forms) with N = 5000, M = 3000, d = e = 64, one row.

    Forward (DEFAULT_CHUNK_BYTES = 256 KiB): queries are 65 (e + 1) floats = 260 B a token,
    5000 * 260 B > 4 * 256 KiB, so 262144 // 260 = 1008 tokens a chunk; keys 64 floats = 256 B
    a token, 3000 * 256 B <= 1 MiB, one chunk.  Backward (BACKWARD_CHUNK_BYTES = 1 MiB): width
    max(d, e + 1) = 65, 5000 * 260 B and 3000 * 260 B <= 4 MiB, one chunk each.  The values
    follow the fp64 formula whatever the chunks.
    """
    calls: List[Tuple[str, int]] = []
    key_states, queries_forward = torch_impl._key_states, torch_impl._queries_forward
    queries_backward, keys_backward = torch_impl._queries_backward, torch_impl._keys_backward

    def spy(name: str, fn: Callable[..., Any], pos: int) -> Callable[..., Any]:
        """``fn`` recording (name, its chunk argument at ``pos``) on every call."""

        def wrapped(*args: Any) -> Any:
            calls.append((name, args[pos]))
            return fn(*args)
        return wrapped

    monkeypatch.setattr(torch_impl, '_key_states', spy('key_states', key_states, 3))
    monkeypatch.setattr(torch_impl, '_queries_forward', spy('queries', queries_forward, 4))
    monkeypatch.setattr(torch_impl, '_queries_backward', spy('dq', queries_backward, 5))
    monkeypatch.setattr(torch_impl, '_keys_backward', spy('dkv', keys_backward, 4))
    gen = torch.Generator().manual_seed(0)
    q = (torch.randn(1, 1, 5000, 64, generator=gen) * 0.3).requires_grad_()
    k = (torch.randn(1, 1, 3000, 64, generator=gen) * 0.3).requires_grad_()
    v = torch.randn(1, 1, 3000, 64, generator=gen).requires_grad_()
    out = linear_attention_torch(q, k, v, 'elu')
    assert calls == [('key_states', 3000), ('queries', 1008)]
    out.backward(torch.ones_like(out))
    assert calls[2:] == [('dq', 5000), ('dkv', 3000)]
    rows = [0, 1007, 1008, 4999]  # both sides of a chunk edge
    torch.testing.assert_close(out[..., rows, :].double(),
                               _linear_attention64(q[..., rows, :], k, v, 'elu', 1e-6),
                               rtol=1e-5, atol=1e-6)


# ===================================================================== InLine attention
def _inline64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Official InLine: ``s q (K^T V / M) + (1 - s q . kbar) vbar`` in fp64."""
    q, k, v = q.double(), k.double(), v.double()
    m = k.shape[-2]
    kbar, vbar = k.mean(dim=-2, keepdim=True), v.mean(dim=-2, keepdim=True)
    return scale * q @ (k.transpose(-2, -1) @ v) / m + (
        1 - scale * q @ kbar.transpose(-2, -1)) * vbar


@pytest.mark.parametrize('q_dtype,v_dtype', [(torch.float16, torch.float16),
                                             (torch.bfloat16, torch.bfloat16),
                                             (torch.float32, torch.bfloat16),
                                             (torch.bfloat16, torch.float32)])
def test_inline_output_has_the_dtype_of_v(q_dtype: torch.dtype, v_dtype: torch.dtype) -> None:
    """Mutants T17 (no cast back: an fp32 result for 16-bit inputs) and T19 (the dtype of q):
    the documented output dtype is that of ``v``, the values those of the fp64 formula."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, 7, 8, generator=gen).to(q_dtype)
    k = torch.randn(2, 2, 9, 8, generator=gen).to(q_dtype)
    v = torch.randn(2, 2, 9, 5, generator=gen).to(v_dtype)
    out = inline_attention_torch(q, k, v, 8**-0.5)
    assert out.dtype == v_dtype and out.shape == (2, 2, 7, 5)
    torch.testing.assert_close(out.double(), _inline64(q, k, v, 8**-0.5), rtol=2e-2, atol=2e-2)


# ======================================================================== backend choice
@contextlib.contextmanager
def _mmlinvit_log() -> Iterator[List[str]]:
    """INFO messages of the ``mmlinvit`` logger inside the block (level and handlers restored)."""
    log = logging.getLogger('mmlinvit')
    handler, old_level = _CollectMessages(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler.messages
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


def test_forced_choices_are_logged_as_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants D01 (a forced torch logged as 'auto'), D04 (a forced triton not logged): each
    distinct choice is logged once on the ``mmlinvit`` logger, named with its reason.  No
    kernel runs: only the choice is made (CPU tensors with ``TRITON_INTERPRET=1``)."""
    from mmlinvit.ops.linear_attention import BACKEND_ENV_VAR, dispatch, select_backend
    monkeypatch.setattr(dispatch, '_logged_choices', set())
    monkeypatch.setenv(BACKEND_ENV_VAR, '')
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    monkeypatch.setattr(dispatch, 'triton_available', lambda: True)
    q = torch.randn(1, 2, 5, 8)
    with _mmlinvit_log() as messages:
        for _ in range(2):
            assert select_backend(q, q, q, 'torch') == 'torch'
            assert select_backend(q, q, q, 'triton') == 'triton'
    assert messages == ['linear attention backend: torch (forced)',
                        'linear attention backend: triton (forced)']


def test_choices_are_not_logged_while_a_graph_is_captured(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Mutant U03 (no early return): while a graph is captured nothing is logged and nothing
    is remembered, so the first eager call still logs the choice."""
    from mmlinvit.ops import triton_utils
    logged = set()
    monkeypatch.setattr(triton_utils, 'capturing_graph', lambda: True)
    with _mmlinvit_log() as messages:
        triton_utils.log_choice_once(logged, 'SSD scan', 'torch', 'forced')
    assert messages == [] and logged == set()
    monkeypatch.setattr(triton_utils, 'capturing_graph', lambda: False)
    with _mmlinvit_log() as messages:
        triton_utils.log_choice_once(logged, 'SSD scan', 'torch', 'forced')
        triton_utils.log_choice_once(logged, 'SSD scan', 'torch', 'forced')
    assert messages == ['SSD scan backend: torch (forced)']
    assert logged == {('torch', 'forced')}


def test_interpreter_state_is_read_from_triton_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant U09 (the environment variable read instead of ``triton.knobs``): on triton >=
    3.4 ``@triton.jit`` decorates for the interpreter as ``knobs.runtime.interpret`` says,
    whatever ``TRITON_INTERPRET`` says now."""
    triton = pytest.importorskip('triton')
    knobs = getattr(triton, 'knobs', None)
    if knobs is None:
        pytest.skip('triton < 3.4 has no knobs')
    from mmlinvit.ops.triton_utils import interpreter_active
    monkeypatch.setattr(knobs.runtime, 'interpret', False)
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    assert interpreter_active() is False
    monkeypatch.setattr(knobs.runtime, 'interpret', True)
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    assert interpreter_active() is True


def test_interpreter_problem_names_a_triton_imported_too_early(monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """Mutant U10 (first check dropped): compiled (not interpreted) ``tl`` functions mean
    triton was imported before ``TRITON_INTERPRET=1``; that is what the message says."""
    pytest.importorskip('triton')
    import triton.language as tl
    from mmlinvit.ops.triton_utils import interpreter_problem

    def compiled_sum(*args, **kwargs):  # a plain function, not an InterpretedFunction
        raise AssertionError('not called')

    monkeypatch.setattr(tl.standard, 'sum', compiled_sum)
    problem = interpreter_problem()
    assert problem is not None and 'imported before TRITON_INTERPRET=1' in problem


def test_kernel_limits_need_one_device() -> None:
    """Mutant U06 (``len(devices) > 2``): inputs on two devices are outside the kernels'
    limits, with the devices named."""
    from mmlinvit.ops.triton_utils import kernel_limits_reason
    cpu = torch.zeros(2, 4)
    meta = torch.zeros(2, 4, device='meta')
    assert kernel_limits_reason({'d': 4}, [('q', cpu), ('k', cpu)]) is None
    reason = kernel_limits_reason({'d': 4}, [('q', cpu), ('k', meta)])
    assert reason == "inputs are on different devices: ['cpu', 'meta']"


# ============================================================================ SSD entry
def _ssd_args(batch: int = 1, length: int = 6, heads: int = 2, headdim: int = 3,
              groups: int = 1, d_state: int = 4) -> List[torch.Tensor]:
    """x, dt, A, B, C, D in the documented layouts (dt > 0, A < 0), fp32."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(batch, length, heads, headdim, generator=gen)
    dt = F.softplus(torch.randn(batch, length, heads, generator=gen) - 1)
    A = -(torch.rand(heads, generator=gen) + 0.1)
    B = torch.randn(batch, length, groups, d_state, generator=gen) * 0.5
    C = torch.randn(batch, length, groups, d_state, generator=gen) * 0.5
    D = torch.randn(heads, generator=gen)
    return [x, dt, A, B, C, D]


@pytest.mark.parametrize('backend', ['naive', 'torch'])
@pytest.mark.parametrize('chunk_size', [0, -1, 2.0, True])
def test_ssd_scan_refuses_bad_chunk_sizes_on_every_backend(backend: str, chunk_size) -> None:
    """Mutant S01 (no check at the entry point): the naive oracle does not chunk, but the
    entry point refuses what one backend refuses, whichever runs."""
    from mmlinvit.ops.ssd import ssd_scan
    with pytest.raises(ValueError, match='chunk_size must be a positive int'):
        ssd_scan(*_ssd_args(), chunk_size=chunk_size, backend=backend)


def test_ssd_checks_refuse_zero_groups_with_a_value_error() -> None:
    """Mutant K01 (``groups < 1`` dropped): B / C with 0 groups is a ValueError naming the
    group count, not a ZeroDivisionError of ``heads % 0``."""
    from mmlinvit.ops.ssd import check_ssd_inputs
    x, dt, A, B, C, D = _ssd_args()
    empty = B[:, :, :0]
    with pytest.raises(ValueError, match=r'number of B/C groups \(0\)'):
        check_ssd_inputs(x, dt, A, empty, empty, D)


@pytest.mark.parametrize('x_shape', [(1, 6, 2), (1, 6, 2, 3, 1)])
def test_ssd_checks_refuse_x_of_another_rank(x_shape: Tuple[int, ...]) -> None:
    """Mutant K07 (only rank < 3 refused): x must be 4-D, and the message says so."""
    from mmlinvit.ops.ssd import check_ssd_inputs
    _, dt, A, B, C, D = _ssd_args()
    with pytest.raises(ValueError, match=r'x must be \(batch, L, heads, headdim\)'):
        check_ssd_inputs(torch.zeros(x_shape), dt, A, B, C, D)


def test_ssd_kernel_reasons_for_empty_and_misshaped_inputs() -> None:
    """Mutants K02 (an empty sequence with a non-empty batch passed), K05 (the rank check
    dropped), K06 (the state size N unchecked): the reasons the dispatcher falls back for."""
    from mmlinvit.ops.ssd import kernel_unsupported_reason
    x, dt, A, B, C, D = _ssd_args()
    assert kernel_unsupported_reason(x, dt, A, B, C, D) is None
    assert kernel_unsupported_reason(x[:, :0], dt[:, :0], A, B[:, :0], C[:, :0],
                                     D) == 'empty batch or sequence'
    assert kernel_unsupported_reason(x[:0], dt[:0], A, B[:0], C[:0],
                                     D) == 'empty batch or sequence'
    assert kernel_unsupported_reason(x[0], dt, A, B, C, D) == 'x / B are not 4-D'
    assert kernel_unsupported_reason(x, dt, A, B[0], C[0], D) == 'x / B are not 4-D'
    wide = torch.zeros(1, 6, 1, 129)
    reason = kernel_unsupported_reason(x, dt, A, wide, wide, D)
    assert reason == "head dims / state size {'N': 129}, supported <= 128"


# ============================================================================ patch grid
@pytest.mark.parametrize('hw_shape,num_tokens', [((-2, -3), 7), ((-1, -5), 6), ((0, -4), 1)])
def test_patch_grid_refuses_negative_sides(hw_shape: Tuple[int, int], num_tokens: int) -> None:
    """FINDING (fails on the original ``patch_grid.py``): sides whose product happens to match
    the token count, e.g. (-2, -3) for 6 patches, passed ``check_patch_grid`` and failed later
    in ``heads_to_grid`` with torch's "invalid shape dimension -2"; the check must name the
    grid, as it does for a negative prefix count."""
    from mmlinvit.ops.patch_grid import check_patch_grid
    with pytest.raises(ValueError, match='attention operator got'):
        check_patch_grid('inline', num_tokens, hw_shape, 1)
    assert check_patch_grid('inline', 7, (2, 3), 1) == (2, 3)
    assert check_patch_grid('inline', 1, (0, 4), 1) == (0, 4)  # an empty grid is consistent
