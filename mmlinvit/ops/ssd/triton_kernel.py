"""Triton kernels of the Mamba-2 SSD chunk scan (forward and backward).

Semantics are exactly those of :func:`.torch_impl.ssd_scan_torch` (and of the oracle
:func:`.naive.ssd_scan_naive`): per head ``h`` reading B/C group ``g = h // (H // G)``::

    h_t = exp(A_h dt_t) h_{t-1} + dt_t x_t B_t^T        (state (P, N), h_0 = 0)
    y_t = h_t C_t + D_h x_t

The sequence is cut into chunks of ``Q = chunk_size`` tokens.  With the within-chunk inclusive
cumulative log decay ``cs_i = A (dt_0 + ... + dt_i)``:

Forward (four kernels, fp32 accumulation):

1. ``_chunk_cumsum_kernel``: ``cs`` and a zero-padded fp32 copy of ``dt`` per (batch*head,
   chunk) (padded tokens have ``dt = 0``: they neither decay nor feed the state, so any L
   works).
2. ``_chunk_state_kernel``: each chunk's own state ``S_c = sum_j exp(cs_end - cs_j) dt_j x_j
   B_j^T``, parallel over (batch, head, chunk, P tile).
3. ``_state_passing_kernel``: ``h_{c+1} = exp(cs_end_c) h_c + S_c``, sequential over chunks and
   parallel over (batch, head, state tile); overwrites ``S_c`` with the state ``h_c`` entering
   chunk ``c`` (kept for the backward).
4. ``_chunk_scan_fwd_kernel``: ``y_i = sum_{j<=i} (C_i . B_j) exp(cs_i - cs_j) dt_j x_j +
   exp(cs_i) C_i h_c + D x_i`` per (chunk, row tile, P tile), the causal sum tiled over
   source tokens (no token beyond the row tile is visited).

Backward (four kernels plus O(L H) torch glue):

1. ``_chunk_state_kernel`` (``LOCAL``): ``sum_i exp(cs_i) dy_i C_i^T`` per chunk, the gradient
   that chunk's outputs send into the state entering it.
2. ``_state_passing_bwd_kernel``: the reverse recurrence ``dh_c = local_c + exp(cs_end_c)
   dh_{c+1}``; stores ``dS_c = dh_{c+1}`` and the partial sums of ``<dS_c, h_{c+1}>`` (the
   gradient of ``cs_end_c`` through the state; summed in torch, no atomics).
3. ``_chunk_scan_bwd_dx_kernel`` per source tile: ``dx``, ``dB`` (per head), the direct part
   of ``d dt`` and partial ``dD``.
4. ``_chunk_scan_bwd_dc_kernel`` per output tile: ``dC`` (per head) and the row part of the
   gradient of ``cs``.

The gradient of ``cs`` is assembled in torch (``d cs_j`` loses ``dt_j * ddt_direct_j`` as a
source, gains the row sums as a target, the last slot gains ``<dS_c, h_{c+1}>``), turned into
the gradient of ``a = A dt`` by a reverse cumulative sum within chunks, then into ``d dt``
and ``dA``; per-head ``dB`` / ``dC`` are summed over the heads of each group.  These are
O(L * H * N) element-wise ops, small next to the kernels' O(L * H * P * N) work.

Numerics: loads are up-cast to fp32 before every ``tl.dot`` (the interpreter's bf16 dot is
wrong); on GPU, 16-bit inputs use TF32 tensor cores and fp32 inputs IEEE fp32 unless
``torch.backends.cuda.matmul.allow_tf32`` is set.  ``cs`` differences are taken in fp32 (an
absolute error of ~eps * |cs| in the log weights, i.e. ~1e-5 relative for |cs| ~ 100), whereas
the torch path forms them from fp64 sums; the chunk size bounds |cs|.  Heads P and states N
up to 128, any value (power-of-two padding with masks); any chunk size >= 1 (non-powers of
two are masked); fp32/fp16/bf16 inputs with arbitrary strides (no copies; the (H,) A and D are made
contiguous, as the kernels index them by head).

This module imports triton at import time: import it only through :mod:`.dispatch`, which
checks that triton is installed first.  The kernels run in the Triton CPU interpreter (CPU
tensors) when ``TRITON_INTERPRET=1`` was set before triton was first imported in the process
and is still set at launch; otherwise they need CUDA tensors.
"""
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ..triton_utils import check_kernel_device, device_guard, dot_precision, interpreter_active
from .checks import check_chunk_size, check_ssd_inputs, kernel_unsupported_reason

#: True when the kernels below were decorated under TRITON_INTERPRET=1 (CPU tensors).
INTERPRETED: bool = interpreter_active()

# ---------------------------------------------------------------------------------------------
# Tile helpers (inlined into the kernels)
# ---------------------------------------------------------------------------------------------


@triton.jit
def _chunk_program(pid, num_heads, heads_per_group, Q, n_chunks):
    """Chunk c, batch b, head h, B/C group g and row0 of program ``pid``.

    ``pid = (batch * head) * n_chunks + c``; ``row0`` is the chunk's first index in the
    (BH, chunks * Q) cs / dt buffers.
    """
    bh = pid // n_chunks
    c = pid % n_chunks
    h = bh % num_heads
    row0 = bh.to(tl.int64) * n_chunks * Q + c * Q
    return c, (bh // num_heads).to(tl.int64), h, h // heads_per_group, row0


@triton.jit
def _chunk_tokens(start, c, Q, L, BLOCK: tl.constexpr):
    """A tile of a chunk's tokens: offsets in the chunk, in-chunk mask, int64 token index
    and the mask of real tokens (the last chunk is padded past L)."""
    offs = start + tl.arange(0, BLOCK)
    in_chunk = offs < Q
    t = (c * Q + offs).to(tl.int64)
    return offs, in_chunk, t, in_chunk & (t < L)


@triton.jit
def _load_tokens(base, t, stride_t, offs_f, stride_f, mask_t, mask_f):
    """fp32 (tokens, features) tile ``base[t * stride_t + f * stride_f]``, 0 outside masks."""
    return tl.load(base + t[:, None] * stride_t + offs_f[None, :] * stride_f,
                   mask=mask_t[:, None] & mask_f[None, :], other=0.0).to(tl.float32)


@triton.jit
def _dot_grad(a, b, acc, EXACT_A: tl.constexpr, SPLIT: tl.constexpr,
              PRECISION: tl.constexpr):
    """acc + a @ b for the products the gradients of dt and A come from.

    Those gradients are small sums of large terms (dA sums them over every token), so
    rounding the computed operand to TF32 (2^-11) left 2-5 % error in dA at L = 1k-4k on an
    H200 (bf16 inputs).  With ``SPLIT`` (the exact operand holds 16-bit values, which TF32
    represents exactly), the computed operand is split into hi (its bf16 rounding) + lo and
    multiplied twice: both TF32 products are then exact but for lo's rounding (~2^-20 of the
    operand).  ``EXACT_A`` says which operand is the exact one.
    """
    if SPLIT:
        if EXACT_A:
            hi = b.to(tl.bfloat16).to(tl.float32)
            acc = tl.dot(a, hi, acc, input_precision=PRECISION)
            acc = tl.dot(a, b - hi, acc, input_precision=PRECISION)
        else:
            hi = a.to(tl.bfloat16).to(tl.float32)
            acc = tl.dot(hi, b, acc, input_precision=PRECISION)
            acc = tl.dot(a - hi, b, acc, input_precision=PRECISION)
    else:
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _causal_decay(cs_i, cs_j, causal):
    """exp(cs_i - cs_j) where ``causal``, else 0 (the -inf is masked before the exp)."""
    return tl.exp(tl.where(causal, cs_i - cs_j, float('-inf')))


# ---------------------------------------------------------------------------------------------
# Forward kernels
# ---------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=['num_heads', 'L', 'Q', 'n_chunks'])
def _chunk_cumsum_kernel(DT, A, CS, DT_OUT,
                         stride_db, stride_dl, stride_dh,
                         num_heads, L, Q, n_chunks,
                         BLOCK_Q: tl.constexpr):
    """cs = within-chunk inclusive cumsum of A*dt and a zero-padded fp32 dt, (BH, chunks*Q)."""
    pid_bh = tl.program_id(0)
    c = tl.program_id(1)
    b = (pid_bh // num_heads).to(tl.int64)
    h = pid_bh % num_heads
    offs = tl.arange(0, BLOCK_Q)
    in_chunk = offs < Q
    t = (c * Q + offs).to(tl.int64)
    valid = in_chunk & (t < L)
    dt = tl.load(DT + b * stride_db + t * stride_dl + h * stride_dh, mask=valid,
                 other=0.0).to(tl.float32)
    a = tl.load(A + h).to(tl.float32)
    cs = tl.cumsum(dt * a, axis=0)
    row = pid_bh.to(tl.int64) * n_chunks * Q + c * Q
    tl.store(CS + row + offs, cs, mask=in_chunk)
    tl.store(DT_OUT + row + offs, dt, mask=in_chunk)


@triton.jit(do_not_specialize=['num_heads', 'heads_per_group', 'L', 'Q', 'n_chunks'])
def _chunk_state_kernel(X, BM, CS, DT, OUT,
                        stride_xb, stride_xl, stride_xh, stride_xp,
                        stride_bb, stride_bl, stride_bg, stride_bn,
                        num_heads, heads_per_group, L, Q, n_chunks, P, N,
                        LOCAL: tl.constexpr, PRECISION: tl.constexpr, BLOCK_K: tl.constexpr,
                        BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """OUT[chunk] = sum_j w_j X_j^T BM_j (P x N) over the tokens of one chunk.

    Forward: X = x, BM = B, w_j = exp(cs_end - cs_j) dt_j (the chunk's own state).
    ``LOCAL`` (backward): X = dy, BM = C, w_j = exp(cs_j) (gradient into the entering state).
    """
    pid = tl.program_id(0)  # (batch * head) * n_chunks + chunk
    pid_p = tl.program_id(1)
    c, b, h, g, row0 = _chunk_program(pid, num_heads, heads_per_group, Q, n_chunks)

    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p = offs_p < P
    mask_n = offs_n < N
    x_base = X + b * stride_xb + h * stride_xh
    b_base = BM + b * stride_bb + g * stride_bg
    cs_end = tl.load(CS + row0 + Q - 1)
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, Q, BLOCK_K):
        offs_k, in_chunk, t, valid = _chunk_tokens(k0, c, Q, L, BLOCK_K)
        x_t = tl.load(x_base + t[None, :] * stride_xl + offs_p[:, None] * stride_xp,
                      mask=mask_p[:, None] & valid[None, :], other=0.0).to(tl.float32)
        bm = _load_tokens(b_base, t, stride_bl, offs_n, stride_bn, valid, mask_n)
        cs_k = tl.load(CS + row0 + offs_k, mask=in_chunk, other=0.0)
        if LOCAL:
            w = tl.exp(cs_k)
        else:
            dt_k = tl.load(DT + row0 + offs_k, mask=in_chunk, other=0.0)
            w = tl.exp(cs_end - cs_k) * dt_k
        w = tl.where(valid, w, 0.0)
        acc = tl.dot(x_t * w[None, :], bm, acc, input_precision=PRECISION)
    out = OUT + pid.to(tl.int64) * P * N
    tl.store(out + offs_p[:, None] * N + offs_n[None, :], acc,
             mask=mask_p[:, None] & mask_n[None, :])


@triton.jit(do_not_specialize=['Q', 'n_chunks', 'PN'])
def _state_passing_kernel(ST, CS, Q, n_chunks, PN, BLOCK_S: tl.constexpr):
    """In place: ST[c] = S_c (own state) -> h_c (state entering chunk c); sequential over c."""
    bh = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    mask = offs < PN
    base = ST + bh * n_chunks * PN + offs
    cs_last = CS + bh * n_chunks * Q + Q - 1
    running = tl.zeros((BLOCK_S, ), dtype=tl.float32)
    for c in range(0, n_chunks):
        own = tl.load(base + c * PN, mask=mask, other=0.0)
        tl.store(base + c * PN, running, mask=mask)
        decay = tl.exp(tl.load(cs_last + c * Q))
        running = running * decay + own


@triton.jit(do_not_specialize=['num_heads', 'heads_per_group', 'L', 'Q', 'n_chunks'])
def _chunk_scan_fwd_kernel(X, BM, CM, CS, DT, ST, DSKIP, Y,
                           stride_xb, stride_xl, stride_xh, stride_xp,
                           stride_bb, stride_bl, stride_bg, stride_bn,
                           stride_cb, stride_cl, stride_cg, stride_cn,
                           stride_yb, stride_yl, stride_yh, stride_yp,
                           num_heads, heads_per_group, L, Q, n_chunks, P, N,
                           HAS_D: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """y of one (chunk, row tile, P tile): intra-chunk causal sum + entering state + D x."""
    pid = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_p = tl.program_id(2)
    c, b, h, g, row0 = _chunk_program(pid, num_heads, heads_per_group, Q, n_chunks)
    x_base = X + b * stride_xb + h * stride_xh
    b_base = BM + b * stride_bb + g * stride_bg
    c_base = CM + b * stride_cb + g * stride_cg

    offs_m, in_m, t_m, valid_m = _chunk_tokens(pid_m * BLOCK_M, c, Q, L, BLOCK_M)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p = offs_p < P
    mask_n = offs_n < N

    cs_m = tl.load(CS + row0 + offs_m, mask=in_m, other=0.0)
    cm = _load_tokens(c_base, t_m, stride_cl, offs_n, stride_cn, valid_m, mask_n)
    state_t = tl.load(ST + pid.to(tl.int64) * P * N + offs_p[None, :] * N + offs_n[:, None],
                      mask=mask_n[:, None] & mask_p[None, :], other=0.0)  # (N, P)
    acc = tl.dot(cm, state_t, input_precision=PRECISION) * tl.exp(cs_m)[:, None]

    hi = tl.minimum((pid_m + 1) * BLOCK_M, Q)
    for k0 in range(0, hi, BLOCK_K):
        offs_k, in_k, t_k, valid_k = _chunk_tokens(k0, c, Q, L, BLOCK_K)
        cs_k = tl.load(CS + row0 + offs_k, mask=in_k, other=0.0)
        dt_k = tl.load(DT + row0 + offs_k, mask=in_k, other=0.0)
        bm_t = tl.load(b_base + t_k[None, :] * stride_bl + offs_n[:, None] * stride_bn,
                       mask=mask_n[:, None] & valid_k[None, :], other=0.0).to(tl.float32)
        scores = tl.dot(cm, bm_t, input_precision=PRECISION)  # (M, K)
        causal = ((offs_k[None, :] <= offs_m[:, None]) & valid_k[None, :] &
                  valid_m[:, None])
        weights = scores * _causal_decay(cs_m[:, None], cs_k[None, :], causal) * dt_k[None, :]
        xk = _load_tokens(x_base, t_k, stride_xl, offs_p, stride_xp, valid_k, mask_p)
        acc = tl.dot(weights, xk, acc, input_precision=PRECISION)

    mask_y = valid_m[:, None] & mask_p[None, :]
    if HAS_D:
        xm = _load_tokens(x_base, t_m, stride_xl, offs_p, stride_xp, valid_m, mask_p)
        acc += tl.load(DSKIP + h).to(tl.float32) * xm
    tl.store(Y + b * stride_yb + h * stride_yh + t_m[:, None] * stride_yl +
             offs_p[None, :] * stride_yp, acc.to(Y.dtype.element_ty), mask=mask_y)


# ---------------------------------------------------------------------------------------------
# Backward kernels
# ---------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=['Q', 'n_chunks', 'PN'])
def _state_passing_bwd_kernel(DST, ST, CS, DEND_PART, Q, n_chunks, PN,
                              BLOCK_S: tl.constexpr):
    """In place: DST[c] = local_c -> dS_c = dh_{c+1}; partial <dS_c, h_{c+1}> per tile.

    ``dh_c = local_c + exp(cs_end_c) dh_{c+1}`` runs backwards over chunks; ``h_{c+1}`` is
    ``ST[c + 1]`` (the state entering the next chunk; dS of the last chunk is 0).
    """
    bh = tl.program_id(0).to(tl.int64)
    pid_s = tl.program_id(1)
    n_tiles = tl.num_programs(1)
    offs = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    mask = offs < PN
    d_base = DST + bh * n_chunks * PN + offs
    s_base = ST + bh * n_chunks * PN + offs
    cs_last = CS + bh * n_chunks * Q + Q - 1
    dend = DEND_PART + (bh * n_tiles + pid_s) * n_chunks
    running = tl.zeros((BLOCK_S, ), dtype=tl.float32)
    for i in range(0, n_chunks):
        c = n_chunks - 1 - i
        local = tl.load(d_base + c * PN, mask=mask, other=0.0)
        tl.store(d_base + c * PN, running, mask=mask)
        h_next = tl.load(s_base + (c + 1) * PN, mask=mask & (c + 1 < n_chunks), other=0.0)
        tl.store(dend + c, tl.sum(running * h_next, axis=0))
        decay = tl.exp(tl.load(cs_last + c * Q))
        running = local + decay * running


@triton.jit(do_not_specialize=['num_heads', 'heads_per_group', 'L', 'Q', 'n_chunks'])
def _chunk_scan_bwd_dx_kernel(X, BM, CM, DY, CS, DT, DST, DSKIP, DX, DBH, DDT, DD_PART,
                              stride_xb, stride_xl, stride_xh, stride_xp,
                              stride_bb, stride_bl, stride_bg, stride_bn,
                              stride_cb, stride_cl, stride_cg, stride_cn,
                              stride_gb, stride_gl, stride_gh, stride_gp,
                              stride_dxb, stride_dxl, stride_dxh, stride_dxp,
                              stride_dbb, stride_dbl, stride_dbh, stride_dbn,
                              num_heads, heads_per_group, L, Q, n_chunks, P, N,
                              HAS_D: tl.constexpr, PRECISION: tl.constexpr,
                              SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                              BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """Per source tile j: g_j = sum_{i>=j} (B_j.C_i) exp(cs_i-cs_j) dy_i + exp(cs_end-cs_j) dS B_j.

    Writes dx_j = dt_j g_j + D dy_j, ddt_direct_j = <g_j, x_j>, the per-head
    dB_j = dt_j (sum_{i>=j} exp(cs_i-cs_j) <x_j, dy_i> C_i + exp(cs_end-cs_j) dS^T x_j) and a
    partial sum of <dy, x> (dD).
    """
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    c, b, h, g, row0 = _chunk_program(pid, num_heads, heads_per_group, Q, n_chunks)
    x_base = X + b * stride_xb + h * stride_xh
    dy_base = DY + b * stride_gb + h * stride_gh
    b_base = BM + b * stride_bb + g * stride_bg
    c_base = CM + b * stride_cb + g * stride_cg

    offs_k, in_k, t_k, valid_k = _chunk_tokens(pid_k * BLOCK_K, c, Q, L, BLOCK_K)
    offs_p = tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p = offs_p < P
    mask_n = offs_n < N
    mask_kp = valid_k[:, None] & mask_p[None, :]
    mask_kn = valid_k[:, None] & mask_n[None, :]

    cs_k = tl.load(CS + row0 + offs_k, mask=in_k, other=0.0)
    dt_k = tl.load(DT + row0 + offs_k, mask=in_k, other=0.0)
    cs_end = tl.load(CS + row0 + Q - 1)
    bm = _load_tokens(b_base, t_k, stride_bl, offs_n, stride_bn, valid_k, mask_n)
    xk = _load_tokens(x_base, t_k, stride_xl, offs_p, stride_xp, valid_k, mask_p)
    d_state = tl.load(DST + pid.to(tl.int64) * P * N + offs_p[:, None] * N + offs_n[None, :],
                      mask=mask_p[:, None] & mask_n[None, :], other=0.0)  # (P, N)
    to_end = tl.where(valid_k, tl.exp(cs_end - cs_k), 0.0)
    grad = _dot_grad(bm, tl.trans(d_state), tl.zeros((BLOCK_K, BLOCK_P), dtype=tl.float32),
                     True, SPLIT, PRECISION) * to_end[:, None]
    d_b = tl.dot(xk, d_state, input_precision=PRECISION) * to_end[:, None]

    m_start = (pid_k * BLOCK_K // BLOCK_M) * BLOCK_M
    for m0 in range(m_start, Q, BLOCK_M):
        offs_m, in_m, t_m, valid_m = _chunk_tokens(m0, c, Q, L, BLOCK_M)
        cs_m = tl.load(CS + row0 + offs_m, mask=in_m, other=0.0)
        cm = _load_tokens(c_base, t_m, stride_cl, offs_n, stride_cn, valid_m, mask_n)
        dym = _load_tokens(dy_base, t_m, stride_gl, offs_p, stride_gp, valid_m, mask_p)
        causal = (offs_m[None, :] >= offs_k[:, None]) & valid_m[None, :]
        decay_t = _causal_decay(cs_m[None, :], cs_k[:, None], causal)  # (K, M)
        scores_t = tl.dot(bm, tl.trans(cm), input_precision=PRECISION)  # (K, M)
        grad = _dot_grad(scores_t * decay_t, dym, grad, False, SPLIT, PRECISION)
        x_dy = tl.dot(xk, tl.trans(dym), input_precision=PRECISION)  # (K, M)
        d_b = tl.dot(x_dy * decay_t, cm, d_b, input_precision=PRECISION)

    ddt = tl.sum(grad * xk, axis=1)
    dx = grad * dt_k[:, None]
    if HAS_D:
        dyk = _load_tokens(dy_base, t_k, stride_gl, offs_p, stride_gp, valid_k, mask_p)
        dx += tl.load(DSKIP + h).to(tl.float32) * dyk
        n_k_tiles = tl.num_programs(1)
        tl.store(DD_PART + pid.to(tl.int64) * n_k_tiles + pid_k, tl.sum(tl.sum(dyk * xk, axis=1),
                                                                          axis=0))
    d_b = d_b * dt_k[:, None]
    tl.store(DX + b * stride_dxb + h * stride_dxh + t_k[:, None] * stride_dxl +
             offs_p[None, :] * stride_dxp, dx.to(DX.dtype.element_ty), mask=mask_kp)
    tl.store(DBH + b * stride_dbb + h * stride_dbh + t_k[:, None] * stride_dbl +
             offs_n[None, :] * stride_dbn, d_b, mask=mask_kn)
    tl.store(DDT + row0 + offs_k, ddt, mask=in_k)


@triton.jit(do_not_specialize=['num_heads', 'heads_per_group', 'L', 'Q', 'n_chunks'])
def _chunk_scan_bwd_dc_kernel(X, BM, CM, DY, CS, DT, ST, DCH, DCS,
                              stride_xb, stride_xl, stride_xh, stride_xp,
                              stride_bb, stride_bl, stride_bg, stride_bn,
                              stride_cb, stride_cl, stride_cg, stride_cn,
                              stride_gb, stride_gl, stride_gh, stride_gp,
                              stride_dcb, stride_dcl, stride_dch, stride_dcn,
                              num_heads, heads_per_group, L, Q, n_chunks, P, N,
                              PRECISION: tl.constexpr, SPLIT: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                              BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """Per output tile i: per-head dC_i and the target part of d cs_i.

    dC_i = exp(cs_i) h_c^T dy_i + sum_{j<=i} exp(cs_i-cs_j) dt_j <dy_i, x_j> B_j and
    dcs_i = <dC_i, C_i> (the gradient of every weight that has cs_i as its upper end).
    """
    pid = tl.program_id(0)
    pid_m = tl.program_id(1)
    c, b, h, g, row0 = _chunk_program(pid, num_heads, heads_per_group, Q, n_chunks)
    x_base = X + b * stride_xb + h * stride_xh
    dy_base = DY + b * stride_gb + h * stride_gh
    b_base = BM + b * stride_bb + g * stride_bg
    c_base = CM + b * stride_cb + g * stride_cg

    offs_m, in_m, t_m, valid_m = _chunk_tokens(pid_m * BLOCK_M, c, Q, L, BLOCK_M)
    offs_p = tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p = offs_p < P
    mask_n = offs_n < N
    mask_mn = valid_m[:, None] & mask_n[None, :]

    cs_m = tl.load(CS + row0 + offs_m, mask=in_m, other=0.0)
    cm = _load_tokens(c_base, t_m, stride_cl, offs_n, stride_cn, valid_m, mask_n)
    dym = _load_tokens(dy_base, t_m, stride_gl, offs_p, stride_gp, valid_m, mask_p)
    state = tl.load(ST + pid.to(tl.int64) * P * N + offs_p[:, None] * N + offs_n[None, :],
                    mask=mask_p[:, None] & mask_n[None, :], other=0.0)  # (P, N)
    from_state = tl.where(valid_m, tl.exp(cs_m), 0.0)
    d_c = _dot_grad(dym, state, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), True, SPLIT,
                    PRECISION) * from_state[:, None]

    hi = tl.minimum((pid_m + 1) * BLOCK_M, Q)
    for k0 in range(0, hi, BLOCK_K):
        offs_k, in_k, t_k, valid_k = _chunk_tokens(k0, c, Q, L, BLOCK_K)
        cs_k = tl.load(CS + row0 + offs_k, mask=in_k, other=0.0)
        dt_k = tl.load(DT + row0 + offs_k, mask=in_k, other=0.0)
        bm = _load_tokens(b_base, t_k, stride_bl, offs_n, stride_bn, valid_k, mask_n)
        xk = _load_tokens(x_base, t_k, stride_xl, offs_p, stride_xp, valid_k, mask_p)
        causal = ((offs_k[None, :] <= offs_m[:, None]) & valid_k[None, :] &
                  valid_m[:, None])
        decay = _causal_decay(cs_m[:, None], cs_k[None, :], causal)
        dy_x = tl.dot(dym, tl.trans(xk), input_precision=PRECISION)  # (M, K)
        d_c = _dot_grad(dy_x * decay * dt_k[None, :], bm, d_c, False, SPLIT, PRECISION)

    dcs = tl.sum(d_c * cm, axis=1)
    tl.store(DCH + b * stride_dcb + h * stride_dch + t_m[:, None] * stride_dcl +
             offs_n[None, :] * stride_dcn, d_c, mask=mask_mn)
    tl.store(DCS + row0 + offs_m, dcs, mask=in_m)


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------


class _LaunchConfig:
    """Tile sizes of one call (heuristics, no autotuning; the interpreter uses the same tiles).

    Args:
        chunk_size: Tokens per chunk Q.
        headdim: P.
        d_state: N.
        precision: ``tl.dot`` input precision (``'ieee'`` or ``'tf32'``).
    """

    def __init__(self, chunk_size: int, headdim: int, d_state: int, precision: str) -> None:
        self.block_q = max(16, triton.next_power_of_2(chunk_size))
        self.block_n = max(16, triton.next_power_of_2(d_state))
        self.block_p_full = max(16, triton.next_power_of_2(headdim))
        # The backward keeps (tokens x P) and (tokens x N) fp32 accumulators next to the (P x N)
        # state gradient: smaller token tiles for large heads.
        large = self.block_p_full * self.block_n > 64 * 64
        self.block_t = min(self.block_q, 32 if large else 64)
        self.block_p = min(self.block_p_full, 64)
        self.block_s = min(256, triton.next_power_of_2(headdim * d_state))
        self.precision = precision
        # Not tuned on a GPU yet: 8 warps where a program holds several (64 x 64) fp32 tiles
        # (the backward keeps ~8 of them live), to keep registers per thread below the limit.
        self.num_warps = 4
        many_tiles = self.block_t * max(self.block_p_full, self.block_n) >= 64 * 64
        self.num_warps_bwd = 8 if many_tiles else 4
        if precision != 'ieee':
            # H200 sweep (gpu_suite.py, Adventurer-B heads, bf16, L = 16k): forward + backward
            # 1.92 vs 2.86 ms with 4 warps in the backward (TF32 dots keep the spills small).
            self.num_warps_bwd = 4
        self.num_stages = 2
        #: Split the computed operand of the dt / A gradient products into hi + lo
        #: (:func:`_dot_grad`); None = where the dots are TF32 and the exact operands 16-bit.
        self.split_grad_dots: Optional[bool] = None

    def options(self, backward: bool = False) -> dict:
        """Launch keyword arguments shared by the matmul kernels."""
        return dict(num_warps=self.num_warps_bwd if backward else self.num_warps,
                    num_stages=self.num_stages, PRECISION=self.precision, BLOCK_N=self.block_n)


def _validate(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
              C: torch.Tensor, D: Optional[torch.Tensor], chunk_size: int) -> None:
    """Raises a ValueError/RuntimeError naming the problem for inputs the kernels cannot take."""
    check_ssd_inputs(x, dt, A, B, C, D)
    check_chunk_size(chunk_size)
    if x.shape[0] == 0 or x.shape[1] == 0:
        return  # empty batch or sequence: ssd_scan_triton returns zeros without launching
    reason = kernel_unsupported_reason(x, dt, A, B, C, D)
    if reason is not None:
        raise ValueError(f'the Triton SSD scan cannot take these inputs: {reason}; '
                         'use backend="torch"')
    check_kernel_device(x.device, INTERPRETED, 'Triton SSD')


def _forward(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, D: Optional[torch.Tensor], chunk_size: int, cfg: _LaunchConfig
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Runs the forward kernels; returns y, cs, padded fp32 dt (both (BH, Lp)) and h_in."""
    batch, length, heads, headdim = x.shape
    groups, d_state = B.shape[2], B.shape[3]
    per_group = heads // groups
    n_chunks = triton.cdiv(length, chunk_size)
    bh = batch * heads
    dev = x.device
    cs = torch.empty(bh, n_chunks * chunk_size, dtype=torch.float32, device=dev)
    dt32 = torch.empty_like(cs)
    _chunk_cumsum_kernel[(bh, n_chunks)](dt, A, cs, dt32, *dt.stride(), heads, length,
                                         chunk_size, n_chunks, BLOCK_Q=cfg.block_q)

    states = torch.empty(bh, n_chunks, headdim, d_state, dtype=torch.float32, device=dev)
    dims = (heads, per_group, length, chunk_size, n_chunks, headdim, d_state)
    _chunk_state_kernel[(bh * n_chunks, triton.cdiv(headdim, cfg.block_p))](
        x, B, cs, dt32, states, *x.stride(), *B.stride(), *dims, LOCAL=False,
        BLOCK_K=cfg.block_t, BLOCK_P=cfg.block_p, **cfg.options())
    pn = headdim * d_state
    _state_passing_kernel[(bh, triton.cdiv(pn, cfg.block_s))](
        states, cs, chunk_size, n_chunks, pn, BLOCK_S=cfg.block_s)

    y = torch.empty(x.shape, dtype=x.dtype, device=dev)
    grid = (bh * n_chunks, triton.cdiv(chunk_size, cfg.block_t), triton.cdiv(headdim, cfg.block_p))
    _chunk_scan_fwd_kernel[grid](
        x, B, C, cs, dt32, states, D if D is not None else A, y, *x.stride(), *B.stride(),
        *C.stride(), *y.stride(), *dims, HAS_D=D is not None, BLOCK_M=cfg.block_t,
        BLOCK_K=cfg.block_t, BLOCK_P=cfg.block_p, **cfg.options())
    return y, cs, dt32, states


def _backward(dy: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
              B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor], cs: torch.Tensor,
              dt32: torch.Tensor, states: torch.Tensor, chunk_size: int, cfg: _LaunchConfig
              ) -> Tuple[torch.Tensor, ...]:
    """Runs the backward kernels; returns dx, ddt, dA, dB, dC, dD (dD None without D)."""
    batch, length, heads, headdim = x.shape
    groups, d_state = B.shape[2], B.shape[3]
    per_group = heads // groups
    n_chunks = triton.cdiv(length, chunk_size)
    bh = batch * heads
    dev = x.device
    dims = (heads, per_group, length, chunk_size, n_chunks, headdim, d_state)
    opts = cfg.options(backward=True)
    split = cfg.split_grad_dots
    if split is None:  # TF32 dots, and 16-bit values (exact in TF32) in B, C, x and dy
        split = cfg.precision == 'tf32' and all(t.dtype in (torch.bfloat16, torch.float16)
                                                for t in (x, B, C, dy))
    matmul_opts = dict(opts, SPLIT=bool(split))

    d_states = torch.empty_like(states)
    _chunk_state_kernel[(bh * n_chunks, triton.cdiv(headdim, cfg.block_p))](
        dy, C, cs, dt32, d_states, *dy.stride(), *C.stride(), *dims, LOCAL=True,
        BLOCK_K=cfg.block_t, BLOCK_P=cfg.block_p, **opts)
    pn = headdim * d_state
    n_state_tiles = triton.cdiv(pn, cfg.block_s)
    d_end_part = torch.empty(bh, n_state_tiles, n_chunks, dtype=torch.float32, device=dev)
    _state_passing_bwd_kernel[(bh, n_state_tiles)](
        d_states, states, cs, d_end_part, chunk_size, n_chunks, pn, BLOCK_S=cfg.block_s)

    n_tiles = triton.cdiv(chunk_size, cfg.block_t)
    dx = torch.empty(x.shape, dtype=x.dtype, device=dev)
    db_head = torch.empty(batch, length, heads, d_state, dtype=torch.float32, device=dev)
    ddt_direct = torch.empty_like(cs)
    dd_part = torch.empty(bh * n_chunks, n_tiles, dtype=torch.float32, device=dev)
    _chunk_scan_bwd_dx_kernel[(bh * n_chunks, n_tiles)](
        x, B, C, dy, cs, dt32, d_states, D if D is not None else A, dx, db_head, ddt_direct,
        dd_part, *x.stride(), *B.stride(), *C.stride(), *dy.stride(), *dx.stride(),
        *db_head.stride(), *dims, HAS_D=D is not None, BLOCK_M=cfg.block_t,
        BLOCK_K=cfg.block_t, BLOCK_P=cfg.block_p_full, **matmul_opts)
    dc_head = torch.empty_like(db_head)
    dcs = torch.empty_like(cs)
    _chunk_scan_bwd_dc_kernel[(bh * n_chunks, n_tiles)](
        x, B, C, dy, cs, dt32, states, dc_head, dcs, *x.stride(), *B.stride(), *C.stride(),
        *dy.stride(), *dc_head.stride(), *dims, BLOCK_M=cfg.block_t, BLOCK_K=cfg.block_t,
        BLOCK_P=cfg.block_p_full, **matmul_opts)

    # d cs -> d a (a = A dt) by a reverse cumsum within chunks -> d dt, dA.
    chunked = (bh, n_chunks, chunk_size)
    dt_c = dt32.view(chunked)
    ddt_c = ddt_direct.view(chunked)
    dcs = dcs.view(chunked) - dt_c * ddt_c
    dcs[:, :, -1] += d_end_part.sum(dim=1)
    d_log_decay = dcs.flip(-1).cumsum(-1).flip(-1)
    a_per_row = A.to(torch.float32).repeat(batch)[:, None, None]  # row b * H + h -> A[h]
    ddt = (ddt_c + a_per_row * d_log_decay).view(batch, heads, -1)[:, :, :length]
    ddt = ddt.transpose(1, 2).to(dt.dtype)
    dA = (dt_c * d_log_decay).sum(dim=(1, 2)).view(batch, heads).sum(dim=0).to(A.dtype)
    dB = db_head.view(batch, length, groups, per_group, d_state).sum(dim=3).to(B.dtype)
    dC = dc_head.view(batch, length, groups, per_group, d_state).sum(dim=3).to(C.dtype)
    dD = None
    if D is not None:
        dD = dd_part.view(batch, heads, -1).sum(dim=(0, 2)).to(D.dtype)
    return dx, ddt, dA, dB, dC, dD


class _SSDScanTriton(torch.autograd.Function):
    """Autograd wrapper; saves the inputs, cs, padded dt and the fp32 entering states."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, D: Optional[torch.Tensor], chunk_size: int) -> torch.Tensor:
        precision = dot_precision(INTERPRETED, x, B, C)
        cfg = _LaunchConfig(chunk_size, x.shape[-1], B.shape[-1], precision)
        with device_guard(x.device):
            y, cs, dt32, states = _forward(x, dt, A, B, C, D, chunk_size, cfg)
        ctx.save_for_backward(x, dt, A, B, C, D, cs, dt32, states)
        ctx.cfg = cfg
        ctx.chunk_size = chunk_size
        return y

    @staticmethod
    @once_differentiable  # double backward raises instead of returning constants
    def backward(ctx, dy: torch.Tensor):
        x, dt, A, B, C, D, cs, dt32, states = ctx.saved_tensors
        with device_guard(x.device):
            grads = _backward(dy, x, dt, A, B, C, D, cs, dt32, states, ctx.chunk_size, ctx.cfg)
        grads = [g if needed else None for g, needed in zip(grads, ctx.needs_input_grad)]
        return (*grads, None)


def ssd_scan_triton(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                    C: torch.Tensor, D: Optional[torch.Tensor] = None,
                    chunk_size: int = 256) -> torch.Tensor:
    """Mamba-2 SSD scan with the Triton kernels (forward and backward in Triton).

    Args:
        x, dt, A, B, C, D: As :func:`.naive.ssd_scan_naive` (the contract of every backend);
            P, N <= 128, any strides, fp32/fp16/bf16.
        chunk_size: Tokens per chunk Q (any L works; the last chunk is masked).

    Returns:
        y (batch, L, H, P) in the dtype of ``x``; differentiable w.r.t. x, dt, A, B, C, D
        (gradients in the dtypes of the inputs).
    """
    _validate(x, dt, A, B, C, D, chunk_size)
    if x.shape[0] == 0 or x.shape[1] == 0:
        return x.new_zeros(x.shape)
    # The kernels read A[h] and D[h] without a stride: copy (H,) views (cheap, differentiable).
    A = A.contiguous()
    D = None if D is None else D.contiguous()
    return _SSDScanTriton.apply(x, dt, A, B, C, D, chunk_size)

