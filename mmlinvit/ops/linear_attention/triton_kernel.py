"""Triton kernels for non-causal kernel linear attention (forward and backward).

Semantics (and arguments) are exactly those of :func:`.naive.linear_attention_naive` /
:func:`.torch_impl.linear_attention_torch` (feature map fused in-kernel) and of
:func:`.torch_impl.inline_attention_torch` (InLine mode)::

    kernel LA : out_i = phi(q_i) S / (phi(q_i) z + eps),  S = phi(K)^T V / M,  z = mean phi(k)
    InLine    : out_i = s q_i S + (1 - s q_i.kbar) vbar,   S = K^T V / M, kbar, vbar means
              = s q_i S_c + vbar,  S_c = S - kbar vbar^T   (the form the kernels compute)

Design (one program per (batch*head, token chunk); everything accumulated in fp32 registers):

* forward: ``_state_kernel`` reduces a chunk of keys into partial (d x e) states, already scaled
  by 1/M so that long sequences cannot overflow; the partials are summed in torch (tiny);
  ``_output_kernel`` applies the state to query tiles.
* backward: ``_bwd_q_kernel`` writes dq and per-chunk partial dS / dz / dvbar (summed in
  torch, so no atomics and no N x N buffer); ``_bwd_kv_kernel`` writes dk and dv.
* feature maps ``elu`` (ELU+1), ``relu`` and ``identity`` are applied after loading and the
  padded rows/columns are re-masked AFTER the map (elu(0) + 1 == 1).
* loads are up-cast to fp32 before every ``tl.dot`` (the interpreter's bf16 dot is wrong, and
  fp16 products of unscaled gradients could overflow); on GPU 16-bit inputs use TF32 tensor
  cores, fp32 inputs use IEEE fp32 unless ``torch.backends.cuda.matmul.allow_tf32`` is set.
* head dims d, e <= 128, any value (power-of-two padding with masks); fp32/fp16/bf16 inputs,
  arbitrary strides (no copies of permuted q/k/v views).  Sizes are not specialised on
  (``do_not_specialize``) so ragged token counts do not trigger recompilation; strides are.

This module imports triton at import time: import it only through
:mod:`.dispatch`, which checks that triton is installed first.  The kernels run in the Triton
CPU interpreter (CPU tensors) when ``TRITON_INTERPRET=1`` was set before triton was first
imported in the process and is still set at launch (triton decorates its own library at import
and this module's kernels at this module's import); otherwise they need CUDA tensors.
"""
import math
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ..triton_utils import (check_kernel_device, device_guard, dot_precision,
                            interpreter_active)
from .checks import (check_feature_map, check_linear_attention_inputs,
                     kernel_unsupported_reason)

#: True when the kernels below were decorated under TRITON_INTERPRET=1 (CPU tensors).
INTERPRETED: bool = interpreter_active()

#: Feature maps fused in the kernels, and their codes in the ``FEATURE`` constexpr.
FEATURE_CODES = {'identity': 0, 'elu': 1, 'relu': 2}


@triton.jit
def _feature(x, FEATURE: tl.constexpr):
    """phi(x) in fp32: 0 identity, 1 ELU+1, 2 ReLU."""
    if FEATURE == 1:
        y = tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
    elif FEATURE == 2:
        y = tl.maximum(x, 0.0)
    else:
        y = x
    return y


@triton.jit
def _feature_grad(x, FEATURE: tl.constexpr):
    """phi'(x) in fp32."""
    if FEATURE == 1:
        y = tl.where(x > 0, 1.0, tl.exp(tl.minimum(x, 0.0)))
    elif FEATURE == 2:
        y = tl.where(x > 0, 1.0, 0.0)
    else:
        y = tl.full(x.shape, 1.0, tl.float32)
    return y


@triton.jit
def _head_program(pid_bh, num_heads):
    """Batch b, head h and the flat bh (all int64) of program ``pid_bh = b * H + h``."""
    return ((pid_bh // num_heads).to(tl.int64), (pid_bh % num_heads).to(tl.int64),
            pid_bh.to(tl.int64))


@triton.jit
def _load_rows(base, offs_row, stride_row, offs_f, stride_f, mask):
    """fp32 (rows, features) tile ``base[row * stride_row + f * stride_f]``, 0 outside mask."""
    return tl.load(base + offs_row[:, None].to(tl.int64) * stride_row + offs_f[None, :] * stride_f,
                   mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _tile_mask(mask_rows, offs_f, F, EVEN_F: tl.constexpr, BLOCK_ROWS: tl.constexpr,
               BLOCK_F: tl.constexpr):
    """(rows, features) mask.  With ``EVEN_F`` (F == BLOCK_F, known when compiling) it is
    constant along the features, which lets the compiler vectorise the loads and stores
    (16-byte accesses instead of one element per instruction)."""
    if EVEN_F:
        mask = tl.broadcast_to(mask_rows[:, None], (BLOCK_ROWS, BLOCK_F))
    else:
        mask = mask_rows[:, None] & (offs_f < F)[None, :]
    return mask


@triton.jit
def _load_padded_matrix(PTR, bh, offs_d, offs_e, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """The (BLOCK_D, BLOCK_E) fp32 matrix of head ``bh`` in a padded per-head buffer."""
    return tl.load(PTR + bh * BLOCK_D * BLOCK_E + offs_d[:, None] * BLOCK_E + offs_e[None, :])


@triton.jit(do_not_specialize=['num_heads', 'M', 'D', 'E', 'tiles_per_chunk'])
def _state_kernel(K, V, SHIFT, S_PART, Z_PART, VBAR_PART,
                  stride_kb, stride_kh, stride_km, stride_kd,
                  stride_vb, stride_vh, stride_vm, stride_ve,
                  num_heads, M, D, E, inv_m, tiles_per_chunk,
                  FEATURE: tl.constexpr, WITH_VBAR: tl.constexpr, PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
                  EVEN_D: tl.constexpr, EVEN_E: tl.constexpr, DOT_16BIT: tl.constexpr = False):
    """Partial S = phi(K)^T V / M, z = sum phi(k) / M (and vbar) of one key chunk.

    ``DOT_16BIT`` (16-bit inputs): the dot takes phi(k) rounded to the input dtype and v as
    loaded (fp32 accumulation), instead of fp32 / TF32 operands: v then needs no register
    round trip and the operands half the shared memory.

    ``WITH_VBAR`` (InLine, identity features): the state is accumulated from the keys minus a
    per-head ``SHIFT`` (near their mean), so that its rounding is relative to the keys'
    spread, not to their mean (``_forward`` removes the shift exactly)."""
    pid_bh = tl.program_id(0)
    pid_chunk = tl.program_id(1)
    n_chunks = tl.num_programs(1)
    b, h, bh = _head_program(pid_bh, num_heads)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    acc_s = tl.zeros((BLOCK_D, BLOCK_E), dtype=tl.float32)
    acc_z = tl.zeros((BLOCK_D, ), dtype=tl.float32)
    acc_v = tl.zeros((BLOCK_E, ), dtype=tl.float32)
    if WITH_VBAR:
        shift = tl.load(SHIFT + bh * BLOCK_D + offs_d)
    start = pid_chunk * tiles_per_chunk * BLOCK_M
    for t in range(0, tiles_per_chunk):
        offs_m = start + t * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        mask_k = _tile_mask(mask_m, offs_d, D, EVEN_D, BLOCK_M, BLOCK_D)
        mask_v = _tile_mask(mask_m, offs_e, E, EVEN_E, BLOCK_M, BLOCK_E)
        k = _load_rows(k_base, offs_m, stride_km, offs_d, stride_kd, mask_k)
        phi_k = tl.where(mask_k, _feature(k, FEATURE), 0.0)
        acc_z += tl.sum(phi_k, axis=0)
        if WITH_VBAR:
            phi_k = tl.where(mask_k, phi_k - shift[None, :], 0.0)
        if DOT_16BIT:
            v_in = tl.load(v_base + offs_m[:, None].to(tl.int64) * stride_vm +
                           offs_e[None, :] * stride_ve, mask=mask_v, other=0.0)
            acc_s = tl.dot(tl.trans(phi_k.to(v_in.dtype)), v_in, acc_s)
            if WITH_VBAR:
                acc_v += tl.sum(v_in.to(tl.float32), axis=0)
        else:
            v = _load_rows(v_base, offs_m, stride_vm, offs_e, stride_ve, mask_v)
            acc_s = tl.dot(tl.trans(phi_k), v, acc_s, input_precision=PRECISION)
            if WITH_VBAR:
                acc_v += tl.sum(v, axis=0)

    part = bh * n_chunks + pid_chunk
    tl.store(S_PART + part * BLOCK_D * BLOCK_E + offs_d[:, None] * BLOCK_E + offs_e[None, :],
             acc_s * inv_m)
    tl.store(Z_PART + part * BLOCK_D + offs_d, acc_z * inv_m)
    if WITH_VBAR:
        tl.store(VBAR_PART + part * BLOCK_E + offs_e, acc_v * inv_m)


@triton.jit(do_not_specialize=['num_heads', 'N', 'D', 'E', 'tiles_per_program'])
def _output_kernel(Q, S, Z, VBAR, O,
                   stride_qb, stride_qh, stride_qn, stride_qd,
                   stride_ob, stride_oh, stride_on, stride_oe,
                   num_heads, N, D, E, eps, scale, tiles_per_program,
                   FEATURE: tl.constexpr, INLINE: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
                   EVEN_D: tl.constexpr, EVEN_E: tl.constexpr, DOT_16BIT: tl.constexpr = False):
    """out = phi(Q) S / (phi(Q) z + eps), or InLine s Q S + (1 - s Q kbar) vbar, for
    ``tiles_per_program`` consecutive query tiles (the head's state is loaded once).

    ``DOT_16BIT`` (16-bit inputs): phi(q) and the state enter the dot rounded to the input
    dtype (fp32 accumulation; the denominator stays fp32)."""
    b, h, bh = _head_program(tl.program_id(0), num_heads)
    pid_n = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    state = _load_padded_matrix(S, bh, offs_d, offs_e, BLOCK_D, BLOCK_E)
    if DOT_16BIT:
        state = state.to(Q.dtype.element_ty)
    z = tl.load(Z + bh * BLOCK_D + offs_d)
    if INLINE:
        vbar = tl.load(VBAR + bh * BLOCK_E + offs_e)
    q_base = Q + b * stride_qb + h * stride_qh
    o_base = O + b * stride_ob + h * stride_oh

    for t in range(0, tiles_per_program):
        offs_n = (pid_n * tiles_per_program + t) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        mask_q = _tile_mask(mask_n, offs_d, D, EVEN_D, BLOCK_N, BLOCK_D)
        mask_o = _tile_mask(mask_n, offs_e, E, EVEN_E, BLOCK_N, BLOCK_E)
        q = _load_rows(q_base, offs_n, stride_qn, offs_d, stride_qd, mask_q)
        phi_q = tl.where(mask_q, _feature(q, FEATURE), 0.0)
        if DOT_16BIT:
            num = tl.dot(phi_q.to(Q.dtype.element_ty), state)
        else:
            num = tl.dot(phi_q, state, input_precision=PRECISION)
        if INLINE:  # the state is centred: S_c = S - kbar vbar^T
            out = scale * num + vbar[None, :]
        else:
            out = num / (tl.sum(phi_q * z[None, :], axis=1) + eps)[:, None]
        tl.store(o_base + offs_n[:, None].to(tl.int64) * stride_on + offs_e[None, :] * stride_oe,
                 out.to(O.dtype.element_ty), mask=mask_o)


@triton.jit(do_not_specialize=['num_heads', 'N', 'D', 'E', 'tiles_per_chunk'])
def _bwd_q_kernel(Q, DO, S, Z, DQ, DS_PART, DZ_PART, DVBAR_PART,
                  stride_qb, stride_qh, stride_qn, stride_qd,
                  stride_gb, stride_gh, stride_gn, stride_ge,
                  stride_dqb, stride_dqh, stride_dqn, stride_dqd,
                  num_heads, N, D, E, eps, scale, tiles_per_chunk,
                  FEATURE: tl.constexpr, INLINE: tl.constexpr, PRECISION: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
                  EVEN_D: tl.constexpr, EVEN_E: tl.constexpr):
    """dq of a query chunk plus its partial dS (d x e), dz (d; kernel LA) and, for InLine,
    the sum of the output gradients (e); InLine's ``S`` is the centred state."""
    b, h, bh = _head_program(tl.program_id(0), num_heads)
    pid_chunk = tl.program_id(1)
    n_chunks = tl.num_programs(1)
    q_base = Q + b * stride_qb + h * stride_qh
    g_base = DO + b * stride_gb + h * stride_gh
    dq_base = DQ + b * stride_dqb + h * stride_dqh

    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    state = _load_padded_matrix(S, bh, offs_d, offs_e, BLOCK_D, BLOCK_E)
    state_t = tl.trans(state)
    z = tl.load(Z + bh * BLOCK_D + offs_d)
    acc_s = tl.zeros((BLOCK_D, BLOCK_E), dtype=tl.float32)
    acc_z = tl.zeros((BLOCK_D, ), dtype=tl.float32)
    acc_v = tl.zeros((BLOCK_E, ), dtype=tl.float32)
    start = pid_chunk * tiles_per_chunk * BLOCK_N
    for t in range(0, tiles_per_chunk):
        offs_n = start + t * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        mask_q = _tile_mask(mask_n, offs_d, D, EVEN_D, BLOCK_N, BLOCK_D)
        mask_g = _tile_mask(mask_n, offs_e, E, EVEN_E, BLOCK_N, BLOCK_E)
        rows = offs_n[:, None].to(tl.int64)
        q = _load_rows(q_base, offs_n, stride_qn, offs_d, stride_qd, mask_q)
        g = _load_rows(g_base, offs_n, stride_gn, offs_e, stride_ge, mask_g)
        phi_q = tl.where(mask_q, _feature(q, FEATURE), 0.0)
        if INLINE:
            # centred forms (no cancellation): d(out)/dq = s S_c with the centred state; the
            # k / v gradients are centred in _bwd_kv_kernel, which needs dS = s q^T g and
            # the plain sum of g (the vbar term of out = s q S_c + vbar)
            d_phi = scale * tl.dot(g, state_t, input_precision=PRECISION)
            acc_s = tl.dot(tl.trans(phi_q), g, acc_s, input_precision=PRECISION)
            acc_v += tl.sum(g, axis=0)
        else:
            inv_den = 1.0 / (tl.sum(phi_q * z[None, :], axis=1) + eps)  # (BLOCK_N, )
            num = tl.dot(phi_q, state, input_precision=PRECISION)
            d_num = g * inv_den[:, None]
            d_den = -tl.sum(d_num * num, axis=1) * inv_den
            d_phi = tl.dot(d_num, state_t, input_precision=PRECISION) + d_den[:, None] * z[None, :]
            acc_s = tl.dot(tl.trans(phi_q), d_num, acc_s, input_precision=PRECISION)
            acc_z += tl.sum(phi_q * d_den[:, None], axis=0)
        dq = d_phi * _feature_grad(q, FEATURE)
        tl.store(dq_base + rows * stride_dqn + offs_d[None, :] * stride_dqd,
                 dq.to(DQ.dtype.element_ty), mask=mask_q)

    part = bh * n_chunks + pid_chunk
    if INLINE:
        acc_s = acc_s * scale
        tl.store(DVBAR_PART + part * BLOCK_E + offs_e, acc_v)
    tl.store(DS_PART + part * BLOCK_D * BLOCK_E + offs_d[:, None] * BLOCK_E + offs_e[None, :],
             acc_s)
    tl.store(DZ_PART + part * BLOCK_D + offs_d, acc_z)


@triton.jit(do_not_specialize=['num_heads', 'M', 'D', 'E'])
def _bwd_kv_kernel(K, V, DS, DZ, DVBAR, Z, VBAR, DK, DV,
                   stride_kb, stride_kh, stride_km, stride_kd,
                   stride_vb, stride_vh, stride_vm, stride_ve,
                   stride_dkb, stride_dkh, stride_dkm, stride_dkd,
                   stride_dvb, stride_dvh, stride_dvm, stride_dve,
                   num_heads, M, D, E, inv_m,
                   FEATURE: tl.constexpr, WITH_VBAR: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
                   EVEN_D: tl.constexpr, EVEN_E: tl.constexpr):
    """dk = phi'(k) (v dS^T + dz) / M and dv = phi(k) dS / M of one key tile.

    InLine (``WITH_VBAR``), centred so that nothing cancels: dk = (v - vbar) dS^T / M and
    dv = ((k - kbar) dS + sum_i g_i) / M (``DVBAR`` holds sum_i g_i, ``Z`` kbar)."""
    b, h, bh = _head_program(tl.program_id(0), num_heads)
    pid_m = tl.program_id(1)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    mask_m = offs_m < M
    mask_k = _tile_mask(mask_m, offs_d, D, EVEN_D, BLOCK_M, BLOCK_D)
    mask_v = _tile_mask(mask_m, offs_e, E, EVEN_E, BLOCK_M, BLOCK_E)
    rows = offs_m[:, None].to(tl.int64)

    # Scale the (unbounded) state gradients by 1/M before they meet per-token tensors.
    d_state = _load_padded_matrix(DS, bh, offs_d, offs_e, BLOCK_D, BLOCK_E) * inv_m
    k = _load_rows(K + b * stride_kb + h * stride_kh, offs_m, stride_km, offs_d, stride_kd, mask_k)
    v = _load_rows(V + b * stride_vb + h * stride_vh, offs_m, stride_vm, offs_e, stride_ve, mask_v)
    if WITH_VBAR:  # InLine: identity features, centred operands
        kbar = tl.load(Z + bh * BLOCK_D + offs_d)
        vbar = tl.load(VBAR + bh * BLOCK_E + offs_e)
        dk = tl.dot(v - vbar[None, :], tl.trans(d_state), input_precision=PRECISION)
        dv = tl.dot(k - kbar[None, :], d_state, input_precision=PRECISION)
        g_sum = tl.load(DVBAR + bh * BLOCK_E + offs_e) * inv_m
        dv += g_sum[None, :]
    else:
        dz = tl.load(DZ + bh * BLOCK_D + offs_d) * inv_m
        phi_k = tl.where(mask_k, _feature(k, FEATURE), 0.0)
        d_phi = tl.dot(v, tl.trans(d_state), input_precision=PRECISION) + dz[None, :]
        dk = d_phi * _feature_grad(k, FEATURE)
        dv = tl.dot(phi_k, d_state, input_precision=PRECISION)
    dk_ptrs = (DK + b * stride_dkb + h * stride_dkh + rows * stride_dkm +
               offs_d[None, :] * stride_dkd)
    dv_ptrs = (DV + b * stride_dvb + h * stride_dvh + rows * stride_dvm +
               offs_e[None, :] * stride_dve)
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=mask_k)
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=mask_v)


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------


class _LaunchConfig:
    """Tile sizes and chunking of one call (heuristics, no autotuning).

    Token tiles per kernel were chosen so that ptxas (sm_90) reports no or negligible register
    spills with 8 warps: the (d x e) fp32 state and its gradient live in registers next to the
    token tiles, so larger heads and IEEE fp32 dots get smaller token tiles.  The interpreter
    uses the same tiles (same code paths as on GPU).

    Args:
        d: Feature dim of q/k.
        e: Feature dim of v.
        device: Device of the tensors.
        precision: ``tl.dot`` input precision (``'ieee'`` or ``'tf32'``).
    """

    def __init__(self, d: int, e: int, device: torch.device, precision: str) -> None:
        self.block_d = max(16, triton.next_power_of_2(d))
        self.block_e = max(16, triton.next_power_of_2(e))
        # Feature dims that fill their block need no feature mask: vectorised tile accesses.
        self.even_d, self.even_e = d == self.block_d, e == self.block_e
        self.precision = precision
        small = self.block_d * self.block_e <= 64 * 64
        ieee = precision == 'ieee'
        if small:
            self.block_state, self.block_out = 64, 64
            self.block_bwd_q, self.block_bwd_kv = 32, (32 if ieee else 64)
        else:
            self.block_state, self.block_out = 32, 32
            self.block_bwd_q, self.block_bwd_kv = 16, (16 if ieee else 32)
        self.num_warps = 8
        self.num_warps_bwd = 8
        if small and not ieee:
            # H200 sweep (tools/analysis/gpu_suite.py, d = e = 64, bf16, CUDA-graph times):
            # forward 0.114 vs 0.137 ms at N = 16k (0.389 vs 0.474 at 64k) with 4 warps;
            # forward + backward 0.341 vs 0.427 ms with 4 warps and 64-token backward tiles.
            self.num_warps = self.num_warps_bwd = 4
            self.block_bwd_q = self.block_bwd_kv = 64
        self.num_stages = 2
        if device.type == 'cuda':
            self.target_programs = 4 * torch.cuda.get_device_properties(
                device).multi_processor_count
        else:  # interpreter: several chunks per head to exercise the partial-sum path
            self.target_programs = 0
        #: Forward dots on 16-bit operands (phi rounded to the input dtype, fp32 accumulation)
        #: for 16-bit inputs of one dtype, instead of fp32 / TF32 operands.  Off until a GPU
        #: sweep (gpu_suite.py --sections sweeps) measures it: sm_90 SASS shows the fp32 path
        #: round-trips every tile through registers into fp32 shared-memory operands.  Not
        #: applied to bf16 in the interpreter, whose bf16 dots are wrong.
        self.dot_16bit = False
        #: Output-kernel programs to aim at (None: one query tile per program).  H200 sweep
        #: (gpu_suite.py, d = e = 64, bf16): 4 per multiprocessor, forward 0.095 vs 0.115 ms
        #: at N = 16k and 0.318 vs 0.397 ms at 64k, against one tile per program.
        self.target_programs_out: Optional[int] = self.target_programs or None

    def chunking(self, tokens: int, batch_heads: int, block: int) -> Tuple[int, int]:
        """(tiles per chunk, number of chunks) for a reduction over ``tokens`` tokens."""
        tiles = triton.cdiv(tokens, block)
        if self.target_programs > 0:
            chunks_per_head = max(1, triton.cdiv(self.target_programs, batch_heads))
            tiles_per_chunk = max(2, triton.cdiv(tiles, chunks_per_head))
        else:
            tiles_per_chunk = 4
        tiles_per_chunk = min(tiles_per_chunk, tiles)
        return tiles_per_chunk, triton.cdiv(tiles, tiles_per_chunk)

    def output_tiling(self, tokens: int, batch_heads: int) -> Tuple[int, int]:
        """(query tiles per program, programs per head) of the output kernel.

        ``target_programs_out`` bounds the programs (None: one tile per program); the
        interpreter takes 2 tiles per program, so the tests run the loop.
        """
        tiles = triton.cdiv(tokens, self.block_out)
        if self.target_programs_out is None:
            per_program = 1 if self.target_programs > 0 else 2
        else:
            per_head = max(1, triton.cdiv(self.target_programs_out, batch_heads))
            per_program = triton.cdiv(tiles, per_head)
        per_program = max(1, min(per_program, tiles))
        return per_program, triton.cdiv(tiles, per_program)

    def forward_dot_16bit(self, *tensors: torch.Tensor) -> bool:
        """Whether the forward kernels take 16-bit dot operands for these inputs.

        Args:
            *tensors: q, k, v.
        """
        dtypes = {t.dtype for t in tensors}
        if not self.dot_16bit or len(dtypes) != 1:
            return False
        dtype = dtypes.pop()
        if INTERPRETED:
            return dtype == torch.float16
        return dtype in (torch.float16, torch.bfloat16)

    def kernel_options(self, backward: bool = False) -> dict:
        """Launch keyword arguments shared by the forward (or the backward) kernels."""
        return dict(num_warps=self.num_warps_bwd if backward else self.num_warps,
                    num_stages=self.num_stages,
                    PRECISION=self.precision, BLOCK_D=self.block_d, BLOCK_E=self.block_e,
                    EVEN_D=self.even_d, EVEN_E=self.even_e)


def _strides(x: torch.Tensor) -> Tuple[int, int, int, int]:
    return tuple(x.stride())  # type: ignore[return-value]


def _validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raises a ValueError/RuntimeError naming the problem for inputs the kernels cannot take."""
    check_linear_attention_inputs(q, k, v)
    reason = kernel_unsupported_reason(q, k, v)
    if reason is not None:
        raise ValueError(f'the Triton linear attention cannot take these inputs: {reason}; '
                         'use backend="torch"')
    check_kernel_device(q.device, INTERPRETED, 'Triton')


def _sum_parts(parts: torch.Tensor) -> torch.Tensor:
    """(BH, chunks, ...) -> (BH, ...) fp32 contiguous."""
    if parts.shape[1] == 1:
        return parts[:, 0].contiguous()
    return parts.sum(dim=1)


def _key_shift(k: torch.Tensor, block_d: int) -> torch.Tensor:
    """(B * H, block_d) fp32 mean of each head's first (up to) 64 keys, zero-padded."""
    batch, heads, m, d = k.shape
    shift = k[:, :, :min(m, 64)].float().mean(dim=-2).reshape(batch * heads, d)
    return torch.nn.functional.pad(shift, (0, block_d - d)).contiguous()


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature: int, inline: bool,
             eps: float, scale: float, cfg: _LaunchConfig
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Runs both forward kernels; returns out and the fp32 states (S, z, vbar)."""
    batch, heads, n, d = q.shape
    m, e = v.shape[-2], v.shape[-1]
    bh = batch * heads
    dev = q.device
    opts = dict(cfg.kernel_options(), DOT_16BIT=cfg.forward_dot_16bit(q, k, v))
    tiles_per_chunk, n_chunks = cfg.chunking(m, bh, cfg.block_state)
    s_part = torch.empty(bh, n_chunks, cfg.block_d, cfg.block_e, dtype=torch.float32, device=dev)
    z_part = torch.empty(bh, n_chunks, cfg.block_d, dtype=torch.float32, device=dev)
    vbar_part = (torch.empty(bh, n_chunks, cfg.block_e, dtype=torch.float32, device=dev)
                 if inline else z_part)
    # InLine's s q S + (1 - s q.kbar) vbar cancels when q.kbar is large (trained ViTs): the
    # kernels use the centred state S_c = (K - kbar)^T V / M (out = s q S_c + vbar), built
    # from keys shifted by the mean of each head's first keys (near kbar), so that neither
    # the fp32 sums nor the TF32 / 16-bit dot operands round relative to the mean (emulated
    # TF32 at 16k tokens, q / k x10 with shared means: 1.2e-2 -> 1.8e-4 relative).
    shift = (_key_shift(k, cfg.block_d) if inline else z_part)
    _state_kernel[(bh, n_chunks)](
        k, v, shift, s_part, z_part, vbar_part, *_strides(k), *_strides(v), heads, m, d, e,
        1.0 / m, tiles_per_chunk, FEATURE=feature, WITH_VBAR=inline, BLOCK_M=cfg.block_state,
        **opts)
    state, z = _sum_parts(s_part), _sum_parts(z_part)
    vbar = _sum_parts(vbar_part) if inline else None
    if inline:  # sum (k - c)^T v / M - (kbar - c) vbar^T = (K - kbar)^T V / M
        state = state - (z - shift).unsqueeze(-1) * vbar.unsqueeze(-2)

    # Token-major storage (B, N, H, e), returned as the (B, H, N, e) view: the attention
    # layers' transpose(1, 2).reshape(B, N, H * e) is then a view, not a copy per layer.
    out = torch.empty(batch, n, heads, e, dtype=v.dtype, device=dev).transpose(1, 2)
    tiles_per_program, n_programs = cfg.output_tiling(n, bh)
    _output_kernel[(bh, n_programs)](
        q, state, z, vbar if inline else z, out, *_strides(q), *_strides(out), heads, n, d, e,
        float(eps), float(scale), tiles_per_program, FEATURE=feature, INLINE=inline,
        BLOCK_N=cfg.block_out, **opts)
    return out, state, z, vbar


def _backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              state: torch.Tensor, z: torch.Tensor, vbar: Optional[torch.Tensor], feature: int,
              inline: bool, eps: float, scale: float,
              cfg: _LaunchConfig) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Runs both backward kernels; returns dq, dk, dv in the dtypes of q, k, v."""
    batch, heads, n, d = q.shape
    m, e = v.shape[-2], v.shape[-1]
    bh = batch * heads
    dev = q.device
    opts = cfg.kernel_options(backward=True)
    dq = torch.empty(q.shape, dtype=q.dtype, device=dev)
    dk = torch.empty(k.shape, dtype=k.dtype, device=dev)
    dv = torch.empty(v.shape, dtype=v.dtype, device=dev)
    tiles_per_chunk, n_chunks = cfg.chunking(n, bh, cfg.block_bwd_q)
    ds_part = torch.empty(bh, n_chunks, cfg.block_d, cfg.block_e, dtype=torch.float32, device=dev)
    dz_part = torch.empty(bh, n_chunks, cfg.block_d, dtype=torch.float32, device=dev)
    dvbar_part = (torch.empty(bh, n_chunks, cfg.block_e, dtype=torch.float32, device=dev)
                  if inline else dz_part)
    _bwd_q_kernel[(bh, n_chunks)](
        q, grad_out, state, z, dq, ds_part, dz_part, dvbar_part,
        *_strides(q), *_strides(grad_out), *_strides(dq), heads, n, d, e, float(eps),
        float(scale), tiles_per_chunk, FEATURE=feature, INLINE=inline,
        BLOCK_N=cfg.block_bwd_q, **opts)
    d_state, dz = _sum_parts(ds_part), _sum_parts(dz_part)
    dvbar = _sum_parts(dvbar_part) if inline else dz
    _bwd_kv_kernel[(bh, triton.cdiv(m, cfg.block_bwd_kv))](
        k, v, d_state, dz, dvbar, z, vbar if inline else z, dk, dv, *_strides(k),
        *_strides(v), *_strides(dk),
        *_strides(dv), heads, m, d, e, 1.0 / m, FEATURE=feature, WITH_VBAR=inline,
        BLOCK_M=cfg.block_bwd_kv, **opts)
    return dq, dk, dv


class _FusedLinearAttention(torch.autograd.Function):
    """Autograd wrapper of the kernels; saves q, k, v and the tiny fp32 states only."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature: int,
                inline: bool, eps: float, scale: float) -> torch.Tensor:
        precision = dot_precision(INTERPRETED, q, k, v)
        cfg = _LaunchConfig(q.shape[-1], v.shape[-1], q.device, precision)
        with device_guard(q.device):
            out, state, z, vbar = _forward(q, k, v, feature, inline, eps, scale, cfg)
        if vbar is None:
            ctx.save_for_backward(q, k, v, state, z)
        else:
            ctx.save_for_backward(q, k, v, state, z, vbar)
        ctx.cfg = cfg
        ctx.feature, ctx.inline, ctx.eps, ctx.scale = feature, inline, eps, scale
        return out

    @staticmethod
    @once_differentiable  # double backward raises instead of returning constants
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, state, z, *rest = ctx.saved_tensors
        vbar = rest[0] if rest else None
        with device_guard(q.device):
            dq, dk, dv = _backward(grad_out, q, k, v, state, z, vbar, ctx.feature, ctx.inline,
                                   ctx.eps, ctx.scale, ctx.cfg)
        return dq, dk, dv, None, None, None, None


def linear_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            feature_map: str = 'elu', eps: float = 1e-6) -> torch.Tensor:
    """Triton kernel LA: phi(Q) S / (phi(Q) z + eps), S = phi(K)^T V / M, z = mean(phi(K)).

    Args:
        q, k, v, feature_map, eps: As :func:`.naive.linear_attention_naive` (the contract of
            every backend); (B, H, N, d) layout, any strides, fp32/fp16/bf16, d, e <= 128.

    Returns:
        (B, H, N, e) in the dtype of ``v``; differentiable w.r.t. q, k, v.
    """
    check_feature_map(feature_map, tuple(FEATURE_CODES), 'the Triton linear attention')
    _validate(q, k, v)
    return _FusedLinearAttention.apply(q, k, v, FEATURE_CODES[feature_map], False, float(eps),
                                       1.0)


def inline_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            scale: float) -> torch.Tensor:
    """Triton InLine attention: s Q (K^T V / M) + (1 - s Q.kbar) vbar.

    Args:
        q, k, v, scale: As :func:`.torch_impl.inline_attention_torch`; (B, H, N, d) layout,
            fp32/fp16/bf16, d, e <= 128.

    Returns:
        (B, H, N, e) in the dtype of ``v``; differentiable w.r.t. q, k, v.
    """
    _validate(q, k, v)
    if not math.isfinite(scale):
        raise ValueError(f'InLine scale must be finite; got {scale}')
    return _FusedLinearAttention.apply(q, k, v, FEATURE_CODES['identity'], True, 0.0,
                                       float(scale))

