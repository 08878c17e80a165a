"""Chunked Mamba-2 SSD scan in plain PyTorch (the reference O(N) path).

The sequence is cut into chunks of ``Q`` tokens (the last one zero-padded: a padded token
has ``dt = 0``, so it neither decays nor feeds the state, and any length works).  With the
per-token log decay ``a_t = A_h dt_t`` and ``seg(i, j) = a_{j+1} + ... + a_i``:

* within a chunk, the quadratic (attention-like) form
  ``y_i = sum_{j <= i} exp(seg(i, j)) (C_i . B_j) dt_j x_j``;
* each chunk summarises its own inputs in the state at its end,
  ``S_c = sum_j exp(seg(Q - 1, j)) dt_j x_j B_j^T``;
* states are passed between chunks by the recurrence
  ``H_{c+1} = exp(a_0 + ... + a_{Q-1}) H_c + S_c`` (a loop over chunks),
  and every token adds ``exp(a_0 + ... + a_i) C_i H_c`` from the state entering its chunk.

``seg`` is a difference of fp64 cumulative sums (split hi + lo), so it stays accurate when
the decays, and so the cumulative sums, are large.  Everything runs in fp32
(fp64 when the inputs are fp64, which lets tests check the algebra to ~1e-12).
The largest temporaries are (batch, chunks, H, Q, Q): O(L * H * Q) memory, linear in the
sequence length for a fixed chunk size; ``chunks_per_step`` bounds them further.

Two forms share these formulas.  With autograd, :func:`_scan_chunk_block` runs all chunks
as one vectorised step (the differentiable form).  Without autograd, :func:`_scan_inference`
runs chunks of at most :data:`INFERENCE_CHUNK` tokens a few at a time into one output, each
chunk's outputs from one product per head (same values up to fp32 rounding); while a graph
is captured (ONNX / export / compile) :func:`_scan_inference_graph` does the same with
out-of-place whole-tensor ops.
"""
import math
from typing import Optional, Tuple

import torch

from ..graph_capture import capturing_graph
from .checks import check_chunk_size, check_ssd_inputs


#: Floor of the log decay before ``exp``: exp(-80) ~ 1.8e-35 stands in for weights that
#: would underflow (CPUs evaluate exp an order of magnitude slower when the result is
#: denormal or zero).  Entries above the diagonal are zeroed in the log domain first, so
#: nothing overflows, and are masked out of the result.
LOG_DECAY_FLOOR = -80.0

#: Without gradients, the chunks of one step are chosen so that the (batch, step, H, Q, Q + N)
#: fp32 operand of :func:`_scan_inference` stays within this many bytes (the within-chunk
#: buffers are the largest temporaries: at Q = 64, N = 64 and 24 heads one chunk is 0.75 MiB).
#: Adventurer-B's scan on 2 CPU threads is as fast with 4 MiB as with 8 (16.3 / 15.9 ms at
#: 2050 tokens, 32.5 / 38 ms at 4098) and slower from 16 MiB (34 ms at 2050 tokens).
INFERENCE_STEP_BYTES = 4 << 20


CumsumSplit = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _split_cumsum(log_decay: torch.Tensor) -> CumsumSplit:
    """(cum, hi, lo): cum = cumsum(log_decay) over the last dim in fp64, and hi + lo = cum
    with hi = cum rounded to the dtype of ``log_decay`` and lo the remainder (same dtype)."""
    cum = log_decay.to(torch.float64).cumsum(dim=-1)
    hi = cum.to(log_decay.dtype)
    return cum, hi, (cum - hi.to(torch.float64)).to(log_decay.dtype)


def _cumsum_differences(log_decay: torch.Tensor, inplace: bool,
                        out: Optional[torch.Tensor] = None,
                        split: Optional[CumsumSplit] = None) -> torch.Tensor:
    """d[..., i, j] = cum_i - cum_j for all i, j, cum = cumsum(log_decay), fp32-accurate.

    The cumulative sums are taken in fp64 and split into ``hi + lo`` (both in the input
    dtype); ``(hi_i - hi_j) + lo_i - lo_j`` then carries only the rounding of the result,
    whereas a plain fp32 difference of cumulative sums would lose ~eps * |cum|.  With
    ``inplace``, ``out`` (the (..., Q, Q) shape) is the buffer written.  ``split``: the
    caller's :func:`_split_cumsum` of ``log_decay``, if it has it.
    """
    _, hi, lo = _split_cumsum(log_decay) if split is None else split
    # both forms round ((hi_i - hi_j) + lo_i) - lo_j in this order: the same bits
    if inplace:
        diff = torch.sub(hi.unsqueeze(-1), hi.unsqueeze(-2), out=out)
        return diff.add_(lo.unsqueeze(-1)).sub_(lo.unsqueeze(-2))
    return hi.unsqueeze(-1) - hi.unsqueeze(-2) + lo.unsqueeze(-1) - lo.unsqueeze(-2)


def segment_sums(log_decay: torch.Tensor) -> torch.Tensor:
    """seg[..., i, j] = sum_{k=j+1}^{i} log_decay[..., k] for i >= j, -inf above the diagonal.

    Args:
        log_decay: (..., Q), fp32 or fp64.

    Returns:
        (..., Q, Q) in the dtype of ``log_decay``, as accurate as a direct sum.
    """
    q = log_decay.shape[-1]
    upper = torch.ones(q, q, dtype=torch.bool, device=log_decay.device).triu(1)
    return _cumsum_differences(log_decay, inplace=False).masked_fill(upper, float('-inf'))


def _unmasked_decay(log_decay: torch.Tensor, inplace: bool, nonpositive: bool = False,
                    out: Optional[torch.Tensor] = None,
                    split: Optional[CumsumSplit] = None) -> torch.Tensor:
    """exp(seg) below the diagonal and 1 above it (seg zeroed there), floored, (..., Q, Q).

    ``nonpositive``: every log decay is <= 0 (A <= 0, dt >= 0: the Mamba-2 contract), so seg
    is >= 0 exactly above the diagonal and <= 0 on and below it (up to rounding), and one
    ``clamp(FLOOR, 0)`` replaces the causal multiply and the floor (one pass fewer over the
    (Q, Q) buffer).  ``out`` and ``split``: see :func:`_cumsum_differences`.
    """
    seg = _cumsum_differences(log_decay, inplace, out, split)
    if nonpositive:
        return seg.clamp_(LOG_DECAY_FLOOR, 0.0).exp_() if inplace else \
            seg.clamp(LOG_DECAY_FLOOR, 0.0).exp()
    q = log_decay.shape[-1]
    causal = torch.ones(q, q, dtype=log_decay.dtype, device=log_decay.device).tril()
    if inplace:
        return seg.mul_(causal).clamp_(min=LOG_DECAY_FLOOR).exp_()
    return (seg * causal).clamp(min=LOG_DECAY_FLOOR).exp()


def decay_matrix(log_decay: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """exp(segment_sums(log_decay)): lower-triangular chunk decay, exactly 0 above.

    Args:
        log_decay: (..., Q), fp32 or fp64.
        inplace: Build it in one buffer with in-place ops (no autograd).

    Returns:
        (..., Q, Q) in the dtype of ``log_decay``; log values are floored at
        :data:`LOG_DECAY_FLOOR` before the exp.
    """
    q = log_decay.shape[-1]
    causal = torch.ones(q, q, dtype=log_decay.dtype, device=log_decay.device).tril()
    decay = _unmasked_decay(log_decay, inplace)
    return decay.mul_(causal) if inplace else decay * causal


def _scan_chunk_block(
        xdt: torch.Tensor, log_decay: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
        state: torch.Tensor, inplace: bool, nonpositive: bool = False,
        workspace: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Scans consecutive chunks given the state entering the first one.

    Args:
        xdt: dt * x, (batch, k, Q, G, R, P).
        log_decay: A * dt, (batch, k, G, R, Q).
        b: (batch, k, Q, G, N).
        c: (batch, k, Q, G, N).
        state: (batch, G, R, P, N), the state before the first chunk.
        inplace: Reuse the (Q, Q) buffers in place (only when no gradient is needed).
        nonpositive: Every log decay is <= 0 (see :func:`_unmasked_decay`).
        workspace: With ``inplace``, a (batch, k, G, R, Q, Q) buffer for the decay matrix,
            reused by every step of a scan: a fresh buffer of that size per step costs more
            in page faults than the passes over it (2.8 vs 0.4 ms at 24 heads, Q = 256).

    Returns:
        y (batch, k, Q, G, R, P) and the state after the last chunk.
    """
    q = log_decay.shape[-1]
    # The causal mask is folded into the (smaller) scores below; the last row (decay to the
    # chunk end) has nothing above the diagonal.
    # (batch, k, G, R, Q, Q)
    split = _split_cumsum(log_decay)  # its fp64 cumsum also gives the state passing below
    decay = _unmasked_decay(log_decay, inplace, nonpositive, workspace, split)

    # Each chunk's own contribution to the state at its end (uses decay[..., Q - 1, j]).
    to_end = decay[..., -1, :].permute(0, 1, 4, 2, 3).unsqueeze(-1)  # (batch, k, Q, G, R, 1)
    own = torch.einsum('bkjgrp,bkjgn->bkgrpn', xdt * to_end, b)  # (batch, k, G, R, P, N)

    # Within-chunk quadratic form with causal (lower-triangular) scores.
    causal = torch.ones(q, q, dtype=decay.dtype, device=decay.device).tril()
    scores = (torch.einsum('bkign,bkjgn->bkgij', c, b) * causal).unsqueeze(3)
    weights = decay.mul_(scores) if inplace else decay * scores
    y = torch.einsum('bkgrij,bkjgrp->bkigrp', weights, xdt)
    del decay, weights

    # State passing between chunks, then each token reads the state entering its chunk.
    cum = split[0]  # fp64 cumsum of log_decay, (batch, k, G, R, Q)
    chunk_decay = cum[..., -1].exp().to(state.dtype)[..., None, None]  # (batch, k, G, R, 1, 1)
    entering = []
    for i in range(xdt.shape[1]):
        entering.append(state)
        state = chunk_decay[:, i] * state + own[:, i]
    prev = torch.stack(entering, dim=1)  # (batch, k, G, R, P, N)
    from_prev = torch.einsum('bkign,bkgrpn->bkigrp', c, prev)
    y = y + from_prev * cum.exp().to(y.dtype).permute(0, 1, 4, 2, 3).unsqueeze(-1)
    return y, state


#: Whether scans without autograd take the inference forms (:func:`_scan_inference`, and
#: :func:`_scan_inference_graph` while a graph is captured).  ``False`` runs the chunked
#: (differentiable) form in place instead, whose values are the autograd path's to the bit
#: (for checks; slower).
INFERENCE_FORM = True

#: Without autograd the scan works in chunks of at most this many
#: tokens, whatever ``chunk_size`` asks for: the outputs do not depend on the chunk length
#: (only rounding does), and on CPU the within-chunk work (``H x Q x Q`` decays, ``Q x Q``
#: products per head) costs more than the extra state passing from Q = 64 up (Adventurer-B
#: at 2050 tokens, 2 threads: 11 ms per scan at Q = 64, 42 ms for the chunk-256 form).
INFERENCE_CHUNK = 64


def _chunked_inputs(x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                    t0: int, t1: int, chunks: int, chunk_size: int, acc: torch.dtype
                    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens t0:t1 of the scan inputs, zero-padded to ``chunks * chunk_size`` tokens, in the
    layouts of the inference forms: x (batch, k, Q, H, P) and dt (batch, k, Q, H) in ``acc``,
    B^T (batch, k, G, N, Q) contiguous, C (batch, k, G, Q, N)."""
    batch, heads, headdim = x.shape[0], x.shape[2], x.shape[3]
    groups, d_state = B.shape[2], B.shape[3]
    pad = chunks * chunk_size - (t1 - t0)
    shape = (batch, chunks, chunk_size)
    x_c = _pad_tokens(x[:, t0:t1].to(acc), pad).view(*shape, heads, headdim)
    dt_c = _pad_tokens(dt[:, t0:t1].to(acc), pad).view(*shape, heads)
    b_t = _pad_tokens(B[:, t0:t1].to(acc), pad).view(*shape, groups, d_state).permute(
        0, 1, 3, 4, 2).contiguous()
    c_g = _pad_tokens(C[:, t0:t1].to(acc), pad).view(*shape, groups, d_state).permute(
        0, 1, 3, 2, 4)
    return x_c, dt_c, b_t, c_g


def _scan_inference(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                    C: torch.Tensor, D: Optional[torch.Tensor], chunk_size: int,
                    chunks_per_step: Optional[int], nonpositive: bool) -> torch.Tensor:
    """The scan without autograd: per head, one product per chunk gives every output.

    Per chunk and head, with ``cum_i`` the log decay summed from the chunk start to token i,
    ``y = [W | E] @ [X ; S]`` where ``W_ij = exp(cum_i - cum_j) (C_i . B_j)`` (causal),
    ``X_j = dt_j x_j``, ``E_i = exp(cum_i) C_i`` and ``S`` the (N, P) state entering the
    chunk; the chunk's own state ``sum_j exp(cum_end - cum_j) B_j X_j^T`` is one product too.
    The two halves of each operand are written into buffers kept for the whole scan (fresh
    buffers per step cost more in page faults than the passes over them), the products are
    batched over (batch, chunks, heads), and the state recurrence is a loop over chunks.

    Args:
        x, dt, A, B, C, D: As :func:`ssd_scan_torch`.
        chunk_size: Tokens per chunk Q.
        chunks_per_step: Chunks per step (``None``: as many as keep the (Q, Q + N) operand
            of a step within :data:`INFERENCE_STEP_BYTES`).
        nonpositive: Every log decay is <= 0 (see :func:`_unmasked_decay`).

    Returns:
        y (batch, L, H, P) in the dtype of ``x``.
    """
    batch, length, heads, headdim = x.shape
    groups, d_state = B.shape[2], B.shape[3]
    per_group = heads // groups
    q = chunk_size
    num_chunks = math.ceil(length / q)
    acc = torch.promote_types(x.dtype, torch.float32)
    step = min(chunks_per_step or _inference_chunks_per_step(batch, heads, q, d_state,
                                                             num_chunks), num_chunks)
    a32 = A.to(acc)
    d32 = None if D is None else D.to(acc)[:, None]
    upper = torch.ones(q, q, dtype=torch.bool, device=x.device).triu(1)

    # lhs = [W | E] (batch, step, H, Q, Q + N); rhs = [X ; S] (batch, step, H, Q + N, P).
    lhs = x.new_empty((batch, step, heads, q, q + d_state), dtype=acc)
    rhs = x.new_empty((batch, step, heads, q + d_state, headdim), dtype=acc)
    state = x.new_zeros((batch, heads, d_state, headdim), dtype=acc)  # (N, P) per head
    out = x.new_empty(x.shape)
    for first in range(0, num_chunks, step):
        k = min(step, num_chunks - first)
        t0, t1 = first * q, min((first + k) * q, length)
        lhs_k, rhs_k = lhs[:, :k], rhs[:, :k]
        x_c, dt_c, b_t, c_g = _chunked_inputs(x, dt, B, C, t0, t1, k, q, acc)

        # X = dt x, head-major, into the top of rhs.
        xdt = rhs_k[..., :q, :]
        torch.mul(x_c.permute(0, 1, 3, 2, 4), dt_c.permute(0, 1, 3, 2).unsqueeze(-1), out=xdt)

        # Log decays from the chunk start and exp(cum_i - cum_j) in the left block of lhs.
        log_decay = (dt_c * a32).permute(0, 1, 3, 2)  # (batch, k, H, Q)
        split = _split_cumsum(log_decay)
        cum, hi = split[0], split[1]
        decay = _unmasked_decay(log_decay, True, nonpositive, lhs_k[..., :q], split)

        # The chunk's own state: (B * exp(cum_end - cum_j))^T-products with X, (b, k, H, N, P).
        to_end = decay[..., -1, :].unsqueeze(-2)  # (batch, k, H, 1, Q): no entry above diagonal
        b_end = b_t.unsqueeze(3) * to_end.view(batch, k, groups, per_group, 1, q)
        own = torch.matmul(b_end.view(batch, k, heads, d_state, q), xdt)
        del b_end

        # W = decay * causal scores (shared by the heads of a group); E = exp(cum) C.
        scores = torch.matmul(c_g, b_t).masked_fill_(upper, 0.0)  # (batch, k, G, Q, Q)
        decay.view(batch, k, groups, per_group, q, q).mul_(scores.unsqueeze(3))
        torch.mul(c_g.unsqueeze(3), hi.exp().view(batch, k, groups, per_group, q, 1),
                  out=lhs_k[..., q:].view(batch, k, groups, per_group, q, d_state))

        # States entering each chunk, into the bottom of rhs.
        chunk_decay = cum[..., -1].exp().to(acc)[..., None, None]  # (batch, k, H, 1, 1)
        for i in range(k):
            rhs_k[:, i, :, q:] = state
            state = torch.addcmul(own[:, i], chunk_decay[:, i], state)
        del own

        y = torch.matmul(lhs_k, rhs_k).permute(0, 1, 3, 2, 4)  # (batch, k, Q, H, P) view
        # Token-major output written straight from the head-major products (plus D x):
        # whole chunks as (batch, chunks, Q, H, P) views, then the tail of a partial chunk.
        full = (t1 - t0) // q
        for first_chunk, chunks, tokens in ((0, full, q), (full, 1, t1 - t0 - full * q)):
            if chunks == 0 or tokens == 0:
                continue
            start = t0 + first_chunk * q
            stop = start + chunks * tokens
            dst = out[:, start:stop].view(batch, chunks, tokens, heads, headdim)
            src = y[:, first_chunk:first_chunk + chunks, :tokens]
            if d32 is None:
                dst.copy_(src)
            elif dst.dtype == acc:
                torch.addcmul(src, x[:, start:stop].view(dst.shape), d32, out=dst)
            else:
                dst.copy_(torch.addcmul(src, x[:, start:stop].view(dst.shape).to(acc), d32))
    return out


def _scan_inference_graph(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                          B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor],
                          chunk_size: int) -> torch.Tensor:
    """:func:`_scan_inference` for a captured graph (ONNX / export / compile, no autograd).

    The same per-chunk products, written with out-of-place whole-tensor ops on all chunks
    at once (no kept buffers, no ``out=``, no slice updates); only the state recurrence is a
    loop over chunks, unrolled in the graph.  Decays are not known to be <= 0 while tracing,
    so the decay takes its general (masked) form.

    Args:
        x, dt, A, B, C, D: As :func:`ssd_scan_torch`.
        chunk_size: Tokens per chunk Q.

    Returns:
        y (batch, L, H, P) in the dtype of ``x``.
    """
    batch, length, heads, headdim = x.shape
    groups, d_state = B.shape[2], B.shape[3]
    per_group = heads // groups
    q = chunk_size
    k = math.ceil(length / q)
    acc = torch.promote_types(x.dtype, torch.float32)
    upper = torch.ones(q, q, dtype=torch.bool, device=x.device).triu(1)
    x_c, dt_c, b_t, c_g = _chunked_inputs(x, dt, B, C, 0, length, k, q, acc)

    xdt = (x_c * dt_c.unsqueeze(-1)).permute(0, 1, 3, 2, 4)  # (batch, k, H, Q, P)
    log_decay = (dt_c * A.to(acc)).permute(0, 1, 3, 2)  # (batch, k, H, Q)
    split = _split_cumsum(log_decay)
    cum, hi = split[0], split[1]
    decay = _unmasked_decay(log_decay, False, split=split)  # (batch, k, H, Q, Q)

    to_end = decay[..., -1, :].reshape(batch, k, groups, per_group, 1, q)
    own = torch.matmul((b_t.unsqueeze(3) * to_end).reshape(batch, k, heads, d_state, q), xdt)
    scores = torch.matmul(c_g, b_t).masked_fill(upper, 0.0)  # (batch, k, G, Q, Q)
    weights = (decay.view(batch, k, groups, per_group, q, q) * scores.unsqueeze(3)).reshape(
        batch, k, heads, q, q)
    from_state = (c_g.unsqueeze(3) * hi.exp().view(batch, k, groups, per_group, q, 1)).reshape(
        batch, k, heads, q, d_state)

    chunk_decay = cum[..., -1].exp().to(acc)[..., None, None]  # (batch, k, H, 1, 1)
    state = x.new_zeros((batch, heads, d_state, headdim), dtype=acc)
    entering = []
    for i in range(k):
        entering.append(state)
        state = chunk_decay[:, i] * state + own[:, i]
    states = torch.stack(entering, dim=1)  # (batch, k, H, N, P)

    y = torch.matmul(torch.cat([weights, from_state], dim=-1), torch.cat([xdt, states], dim=-2))
    y = y.permute(0, 1, 3, 2, 4).reshape(batch, k * q, heads, headdim)[:, :length]
    if D is not None:
        y = y + D.to(acc)[:, None] * x.to(acc)
    return y.to(x.dtype)


def _inference_chunks_per_step(batch: int, heads: int, chunk_size: int, d_state: int,
                               num_chunks: int) -> int:
    """Chunks per step of :func:`_scan_inference`: as many as keep its (batch, step, H, Q,
    Q + N) fp32 operand within :data:`INFERENCE_STEP_BYTES` (at least one)."""
    per_chunk = batch * heads * chunk_size * (chunk_size + d_state) * 4
    return max(1, min(num_chunks, INFERENCE_STEP_BYTES // max(per_chunk, 1)))


def _decays_known_nonpositive(A: torch.Tensor, dt: torch.Tensor) -> bool:
    """Whether A <= 0 and dt >= 0 everywhere (all log decays <= 0), checked on the values;
    False where values cannot be read cheaply (meta tensors, graph capture)."""
    if A.device.type == 'meta' or capturing_graph():
        return False
    return bool((A <= 0).all()) and bool((dt >= 0).all())


def _pad_tokens(t: torch.Tensor, pad: int) -> torch.Tensor:
    """Zero-pads dim 1 (tokens) of ``t`` at the end by ``pad``."""
    if pad == 0:
        return t
    return torch.cat([t, t.new_zeros((t.shape[0], pad) + tuple(t.shape[2:]))], dim=1)


def ssd_scan_torch(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: Optional[torch.Tensor] = None, chunk_size: int = 256,
                   chunks_per_step: Optional[int] = None) -> torch.Tensor:
    """Mamba-2 scan by chunks (see the module docstring), accumulated in fp32 (fp64 for fp64).

    The inputs are read one step of chunks at a time (converted and padded per step), so
    besides the output only one step's buffers exist at once.  Without autograd (and outside
    graph capture) the scan takes the inference form (:func:`_scan_inference`) with chunks of
    ``min(chunk_size, INFERENCE_CHUNK)`` tokens.

    Args:
        x, dt, A, B, C, D: As :func:`.naive.ssd_scan_naive` (the contract of every backend).
        chunk_size: Tokens per chunk Q (any L works; the last chunk is padded).  The outputs
            do not depend on it (up to rounding), only memory and speed do.
        chunks_per_step: Chunks processed together; ``None`` = all of them when gradients
            are needed or a graph is captured, else as many as fit
            :data:`INFERENCE_STEP_BYTES` (the outputs do not depend on it).

    Returns:
        y (batch, L, H, P) in the dtype of ``x``.
    """
    check_ssd_inputs(x, dt, A, B, C, D)
    check_chunk_size(chunk_size)
    if chunks_per_step is not None and (isinstance(chunks_per_step, bool)
                                        or not isinstance(chunks_per_step, int)
                                        or chunks_per_step < 1):
        raise ValueError(f'chunks_per_step must be None or a positive int, got '
                         f'{chunks_per_step!r}')
    batch, length, heads, headdim = x.shape
    groups, d_state = B.shape[2], B.shape[3]
    if length == 0:
        return x.new_zeros(x.shape)
    per_group = heads // groups
    num_chunks = math.ceil(length / chunk_size)
    acc = torch.promote_types(x.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
    a32 = A.to(acc).reshape(groups, per_group)
    d32 = None if D is None else D.to(acc)[None, None, :, None]
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, dt, A, B, C, D))
    nonpositive = _decays_known_nonpositive(A, dt)
    if not needs_grad and INFERENCE_FORM:
        chunk = min(chunk_size, INFERENCE_CHUNK)
        if capturing_graph():
            return _scan_inference_graph(x, dt, A, B, C, D, chunk)
        return _scan_inference(x, dt, A, B, C, D, chunk, chunks_per_step, nonpositive)
    # Autograd keeps every step's buffers anyway, and a captured graph would unroll the
    # steps: one vectorised step unless the caller asks otherwise.
    step = chunks_per_step or num_chunks

    state = x.new_zeros(batch, groups, per_group, headdim, d_state, dtype=acc)
    out = None if needs_grad else x.new_empty(x.shape)
    workspace = None if needs_grad else x.new_empty(
        (batch, min(step, num_chunks), groups, per_group, chunk_size, chunk_size), dtype=acc)
    outs = []
    for first in range(0, num_chunks, step):
        k = min(step, num_chunks - first)
        t0, t1 = first * chunk_size, min((first + k) * chunk_size, length)
        pad = (first + k) * chunk_size - t1
        shape = (batch, k, chunk_size, groups)
        x_blk = x[:, t0:t1].to(acc)
        dt_blk = _pad_tokens(dt[:, t0:t1].to(acc), pad).reshape(*shape, per_group)
        xdt = _pad_tokens(x_blk, pad).reshape(*shape, per_group, headdim) * dt_blk.unsqueeze(-1)
        log_decay = (dt_blk * a32).permute(0, 1, 3, 4, 2)  # (batch, k, G, R, Q)
        b_blk = _pad_tokens(B[:, t0:t1].to(acc), pad).reshape(*shape, d_state)
        c_blk = _pad_tokens(C[:, t0:t1].to(acc), pad).reshape(*shape, d_state)
        y_blk, state = _scan_chunk_block(xdt, log_decay, b_blk, c_blk, state, not needs_grad,
                                         nonpositive,
                                         None if workspace is None else workspace[:, :k])
        y_blk = y_blk.reshape(batch, k * chunk_size, heads, headdim)[:, :t1 - t0]
        if d32 is not None:
            y_blk = y_blk + d32 * x_blk
        if out is None:
            outs.append(y_blk)
        else:
            out[:, t0:t1] = y_blk
    return out if out is not None else torch.cat(outs, dim=1).to(x.dtype)
