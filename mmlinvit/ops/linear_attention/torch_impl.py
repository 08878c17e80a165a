"""O(N) non-causal kernel linear attention in plain PyTorch (the CPU path).

Semantics are those of :func:`.naive.linear_attention_naive`::

    out_i = phi(q_i) S / (phi(q_i) z + eps),  S = phi(K)^T V / M,  z = mean_j phi(k_j)

Sums are accumulated in fp32 and scaled by 1/M whatever the input dtype, so fp16/bf16 inputs
neither overflow nor lose the normaliser; autocast (AMP) is switched off inside, so the math
stays fp32 under ``torch.autocast`` too (the output has the dtype of ``v``).

Memory (the reason for the chunked form).  Applying the feature map to whole (B, H, N, d)
tensors and then multiplying materialises phi(Q), phi(K) and the (B, H, N, e) numerator
next to the output, three times the output's size, whereas CPU SDPA streams its blocks and
allocates little more than its output.  :func:`linear_attention_torch` therefore

* streams the keys in token chunks: a chunk of K (any strides / dtype) is gathered into one
  small reused fp32 buffer, the feature map is applied in place on it (fused with the copy
  where possible) and ``S += phi(K_c)^T V_c / M``, ``z += sum phi(K_c) / M`` are accumulated;
* streams the queries the same way: ``num = phi(Q_c) S`` and ``den = phi(Q_c) z + eps`` per
  chunk, their quotient written straight into the output;
* is an autograd Function that saves only q, k, v (references, no copies) and the tiny
  (d, e + 1) state, and recomputes phi chunk by chunk in backward:
  ``G = [g / den, -(g . num) / den^2]``, ``dphi(Q_c) = G [S | z]^T``, ``d[S | z] += phi(Q_c)^T G``,
  then ``dphi(K_c) = [V_c | 1] d[S | z]^T / M``, ``dV_c = phi(K_c) dS / M``, and
  ``dx = dphi(x) * phi'(x)`` with phi' read off phi (ELU+1: ``min(phi, 1)``; ReLU: ``phi > 0``).

So the peak is the output (and, in backward, the gradients) plus a few chunk-sized buffers;
chunks are sized by bytes (:data:`DEFAULT_CHUNK_BYTES` per (tokens x features) buffer), which
also keeps each chunk in cache between the feature map and its product.

Self-attention with an fp32 output on CPU (N = M, d = e: every ViT block) takes a variant
with far fewer ops (:func:`_forward_in_output`): the output tensor itself is the scratch for
phi(K) and then phi(Q), so the feature maps and reductions are whole-tensor ops and only the
``phi(Q_c) S / den_c`` write-back is chunked (two ops per chunk).  Many small multi-threaded
ops are slow on a CPU shared with other work (each one synchronises the thread pool), so the
op count matters there as much as the bytes.

Graph capture (``torch.compile``, ``torch.export`` / ONNX export, ``torch.jit.trace``) uses
:func:`linear_attention_graph` instead: the same formula as a handful of whole-tensor ops that
the compiler fuses and plans memory for (an unrolled chunk loop would only bloat the graph).
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ..precision import autocast_disabled
from .checks import check_feature_map, check_linear_attention_inputs

#: Feature maps the torch path fuses (``identity``: inputs are already feature-mapped).
TORCH_FEATURE_MAPS = ('elu', 'relu', 'identity')
#: Target bytes of one fp32 (lead x tokens x features) chunk buffer on CPU (cache-sized).
DEFAULT_CHUNK_BYTES = 1 << 18
#: The same on accelerators, where every chunk costs kernel launches rather than cache misses.
ACCELERATOR_CHUNK_BYTES = 1 << 26
#: Chunk budget of the backward pass (CPU), whose peak is dominated by the three gradients.
BACKWARD_CHUNK_BYTES = 1 << 20
#: Budget of the (lead x tokens x e) product chunk of the in-output forward (see
#: :func:`_forward_in_output`).
IN_OUTPUT_CHUNK_BYTES = 1 << 18
#: Smallest chunk (tokens) picked automatically; fewer tokens cost more in per-op overhead.
MIN_CHUNK_TOKENS = 32
#: A sequence whose whole buffer is at most this many chunk buffers runs as one chunk (short
#: sequences: per-op overhead dominates and the memory is small anyway).
SINGLE_CHUNK_FACTOR = 4



def chunk_tokens(rows: int, width: int, tokens: int,
                 chunk_bytes: Optional[int] = None) -> int:
    """Tokens per chunk so that one fp32 (rows, chunk, width) buffer is ~``chunk_bytes``.

    Args:
        rows: Product of the leading (batch, head) dims.
        width: Widest per-token feature count of the buffers (d or e + 1).
        tokens: Length of the sequence being chunked.
        chunk_bytes: Target buffer size.

    Returns:
        A chunk length in [1, tokens] (at least :data:`MIN_CHUNK_TOKENS` when that fits; all
        ``tokens`` when the whole buffer is at most :data:`SINGLE_CHUNK_FACTOR` chunks).
    """
    chunk_bytes = DEFAULT_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    per_token = max(rows * width * 4, 1)
    if per_token * tokens <= SINGLE_CHUNK_FACTOR * chunk_bytes:
        return max(tokens, 1)
    return max(1, min(tokens, max(MIN_CHUNK_TOKENS, chunk_bytes // per_token)))


def _load_features(x: torch.Tensor, start: int, stop: int, buf: torch.Tensor,
                   feature_map: str) -> torch.Tensor:
    """phi(x[..., start:stop, :]) in fp32, written into ``buf``; returned as (L, c, d).

    Args:
        x: (..., T, d) tensor, any strides and float dtype.
        start: First token.
        stop: One past the last token.
        buf: Contiguous fp32 (..., C, d) scratch buffer, C >= stop - start.
        feature_map: ``'elu'`` (ELU + 1), ``'relu'`` or ``'identity'``.
    """
    count = stop - start
    dst = buf[..., :count, :]
    src = x[..., start:stop, :]
    if feature_map == 'elu' and src.dtype == torch.float32:
        torch._C._nn.elu(src, 1.0, 1.0, 1.0, out=dst)  # gather + map in one pass
        dst.add_(1.0)
    else:
        dst.copy_(src)
        if feature_map == 'elu':
            F.elu_(dst).add_(1.0)
        elif feature_map == 'relu':
            dst.relu_()
    return dst.reshape(math.prod(dst.shape[:-2]), count, dst.shape[-1])  # a view


def _feature_derivative_(phi: torch.Tensor, feature_map: str) -> torch.Tensor:
    """phi'(x) computed in place from phi(x) (ELU+1: min(phi, 1); ReLU: 1[phi > 0])."""
    if feature_map == 'elu':
        return phi.clamp_(max=1.0)
    if feature_map == 'relu':
        return phi.gt_(0.0)  # 1.0 / 0.0 in fp32, relu'(0) = 0 as in autograd
    return phi.fill_(1.0)


def _normaliser_bias(e: int, eps: float, device: torch.device) -> torch.Tensor:
    """(1, 1, e + 1) row [0, ..., 0, eps] added to [num | den]."""
    bias = torch.zeros(1, 1, e + 1, dtype=torch.float32, device=device)
    bias[..., e] = eps
    return bias


def _key_states(k: torch.Tensor, v: torch.Tensor, feature_map: str, chunk: int) -> torch.Tensor:
    """[S | z] = phi(K)^T [V | 1] / M as an fp32 (L, d, e + 1) tensor, streamed over keys."""
    lead, m, d, e = k.shape[:-2], k.shape[-2], k.shape[-1], v.shape[-1]
    rows = math.prod(lead)
    state = torch.zeros(rows, d, e, dtype=torch.float32, device=k.device)
    z = torch.zeros(rows, d, dtype=torch.float32, device=k.device)
    buf = torch.empty(lead + (min(chunk, m), d), dtype=torch.float32, device=k.device)
    for start in range(0, m, chunk):
        stop = min(start + chunk, m)
        phi_k = _load_features(k, start, stop, buf, feature_map)
        v_c = v[..., start:stop, :].float().reshape(rows, stop - start, e)
        # out of place: (L, d, e) is tiny, and FLOP counters see aten.baddbmm, not baddbmm_
        state = torch.baddbmm(state, phi_k.transpose(1, 2), v_c)
        z.add_(phi_k.sum(dim=1))
    return torch.cat([state, z.unsqueeze(-1)], dim=-1).mul_(1.0 / m)


def _queries_forward(q: torch.Tensor, state: torch.Tensor, feature_map: str, eps: float,
                     chunk: int, out_dtype: torch.dtype) -> torch.Tensor:
    """out = phi(Q) S / (phi(Q) z + eps) from ``state`` = [S | z], streamed over queries."""
    lead, n, d = q.shape[:-2], q.shape[-2], q.shape[-1]
    e = state.shape[-1] - 1
    out = torch.empty(lead + (n, e), dtype=out_dtype, device=q.device)
    out3 = out.view(math.prod(lead), n, e)
    s, z = state[..., :e], state[..., e:]
    eps_t = torch.full((1, 1, 1), eps, dtype=torch.float32, device=q.device)
    buf = torch.empty(lead + (max(min(chunk, n), 1), d), dtype=torch.float32, device=q.device)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        phi_q = _load_features(q, start, stop, buf, feature_map)
        # Separate contiguous num / den products: a quotient of strided slices of one
        # [num | den] product does not vectorise and costs more than the extra mat-vec.
        torch.div(torch.bmm(phi_q, s), torch.baddbmm(eps_t, phi_q, z), out=out3[:, start:stop])
    return out


def _queries_backward(grad_out: torch.Tensor, q: torch.Tensor, state: torch.Tensor,
                      feature_map: str, eps: float, chunk: int,
                      need_dq: bool) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
    """dq (or None) and d[S | z], streamed over queries."""
    lead, n, d = q.shape[:-2], q.shape[-2], q.shape[-1]
    rows, e = math.prod(lead), state.shape[-1] - 1
    bias = _normaliser_bias(e, eps, q.device)
    d_state = torch.zeros_like(state)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device) if need_dq else None
    buf = torch.empty(lead + (min(chunk, n), d), dtype=torch.float32, device=q.device)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        phi_q = _load_features(q, start, stop, buf, feature_map)
        num_den = torch.baddbmm(bias, phi_q, state)
        num, den = num_den[..., :e], num_den[..., e:]
        g = grad_out[..., start:stop, :].float().reshape(rows, stop - start, e)
        g_aug = torch.empty_like(num_den)  # [g / den, -(g . num) / den^2]
        torch.div(g, den, out=g_aug[..., :e])
        torch.sum(g_aug[..., :e] * num, dim=-1, keepdim=True, out=g_aug[..., e:])
        g_aug[..., e:].div_(den).neg_()
        d_state.baddbmm_(phi_q.transpose(1, 2), g_aug)
        if dq is not None:
            d_phi = torch.bmm(g_aug, state.transpose(1, 2))
            torch.mul(d_phi, _feature_derivative_(phi_q, feature_map),
                      out=dq.view(rows, n, d)[:, start:stop])
    return dq, d_state


def _keys_backward(k: torch.Tensor, v: torch.Tensor, d_state: torch.Tensor, feature_map: str,
                   chunk: int, need_dk: bool,
                   need_dv: bool) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """dk and dv (or None) from d[S | z], streamed over keys."""
    lead, m, d, e = k.shape[:-2], k.shape[-2], k.shape[-1], v.shape[-1]
    rows = math.prod(lead)
    inv_m = 1.0 / m
    d_s = d_state[..., :e]  # (L, d, e)
    d_z = d_state[..., e].unsqueeze(1).mul(inv_m)  # (L, 1, d)
    d_s_t = d_s.transpose(1, 2)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device) if need_dk else None
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device) if need_dv else None
    buf = torch.empty(lead + (min(chunk, m), d), dtype=torch.float32, device=k.device)
    for start in range(0, m, chunk):
        stop = min(start + chunk, m)
        phi_k = _load_features(k, start, stop, buf, feature_map)
        if dv is not None:
            torch.mul(torch.bmm(phi_k, d_s), inv_m, out=dv.view(rows, m, e)[:, start:stop])
        if dk is not None:
            v_c = v[..., start:stop, :].float().reshape(rows, stop - start, e)
            d_phi = torch.baddbmm(d_z, v_c, d_s_t, alpha=inv_m)
            torch.mul(d_phi, _feature_derivative_(phi_k, feature_map),
                      out=dk.view(rows, m, d)[:, start:stop])
    return dk, dv


def _can_run_in_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Self-attention shapes with an fp32 output: the output can hold phi(K), then phi(Q)."""
    return (v.dtype == torch.float32 and q.shape == k.shape == v.shape
            and q.device.type == 'cpu')


def _forward_in_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature_map: str,
                       eps: float, chunk: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The forward with the output tensor as the feature-map scratch (few, large ops).

    phi(K) is written into the output buffer and reduced to [S | z] with whole-tensor ops
    (V streamed in chunks only when it cannot be viewed as (L, M, e)); then phi(Q) overwrites
    it, ``den = phi(Q) z + eps`` is one mat-vec, and ``phi(Q_c) S / den_c`` is written back
    over phi(Q_c) chunk by chunk: two ops per chunk and one (lead x chunk x e) temporary.  On
    a CPU shared with other work every multi-threaded op pays a thread synchronisation, so
    the op count matters as much as the bytes moved.

    Returns:
        The output and [S | z] (for the backward).
    """
    lead, n, d = q.shape[:-2], q.shape[-2], q.shape[-1]
    rows, e = math.prod(lead), v.shape[-1]
    out = torch.empty(lead + (n, e), dtype=torch.float32, device=q.device)
    out3 = out.view(rows, n, e)
    inv_n = 1.0 / n
    phi_k = _load_features(k, 0, n, out, feature_map)  # (L, N, d) view of the output
    z = phi_k.sum(dim=1)
    v3 = v.view(rows, n, e) if v.is_contiguous() else None
    if v3 is not None:
        state = torch.bmm(phi_k.transpose(1, 2), v3)
    else:  # a strided view (e.g. of a fused qkv projection): stream V
        state = torch.zeros(rows, d, e, dtype=torch.float32, device=q.device)
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            v_c = v[..., start:stop, :].reshape(rows, stop - start, e)
            state = torch.baddbmm(state, phi_k[:, start:stop].transpose(1, 2), v_c)
    state_aug = torch.cat([state, z.unsqueeze(-1)], dim=-1).mul_(inv_n)  # [S | z]
    phi_q = _load_features(q, 0, n, out, feature_map)
    eps_t = torch.full((1, 1, 1), eps, dtype=torch.float32, device=q.device)
    den = torch.baddbmm(eps_t, phi_q, state_aug[..., e:])  # (L, N, 1)
    s_view = state_aug[..., :e]
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        num = torch.bmm(phi_q[:, start:stop], s_view)
        torch.div(num, den[:, start:stop], out=out3[:, start:stop])
    return out, state_aug


class _ChunkedLinearAttention(torch.autograd.Function):
    """Chunked forward / backward (see the module docstring); saves q, k, v and [S | z]."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature_map: str,
                eps: float, chunk_q: int, chunk_k: int, auto_chunks: bool) -> torch.Tensor:
        with autocast_disabled(q.device):  # fp32 math under AMP too
            if _can_run_in_output(q, k, v):
                chunk = chunk_q
                if auto_chunks:
                    rows, e = math.prod(q.shape[:-2]), v.shape[-1]
                    chunk = chunk_tokens(rows, e, q.shape[-2], IN_OUTPUT_CHUNK_BYTES)
                out, state = _forward_in_output(q, k, v, feature_map, eps, chunk)
            else:
                state = _key_states(k, v, feature_map, chunk_k)
                out = _queries_forward(q, state, feature_map, eps, chunk_q, v.dtype)
        ctx.save_for_backward(q, k, v, state)
        ctx.feature_map, ctx.eps, ctx.chunk_q, ctx.chunk_k = feature_map, eps, chunk_q, chunk_k
        ctx.auto_chunks = auto_chunks
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, state = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        chunk_q, chunk_k = ctx.chunk_q, ctx.chunk_k
        if ctx.auto_chunks and q.device.type == 'cpu':
            rows, e = math.prod(q.shape[:-2]), v.shape[-1]
            width = max(q.shape[-1], e + 1)
            chunk_q = chunk_tokens(rows, width, q.shape[-2], BACKWARD_CHUNK_BYTES)
            chunk_k = chunk_tokens(rows, width, k.shape[-2], BACKWARD_CHUNK_BYTES)
        with autocast_disabled(q.device):
            dq, d_state = _queries_backward(grad_out, q, state, ctx.feature_map, ctx.eps,
                                            chunk_q, need_q)
            dk = dv = None
            if need_k or need_v:
                dk, dv = _keys_backward(k, v, d_state, ctx.feature_map, chunk_k, need_k,
                                        need_v)
        return dq, dk, dv, None, None, None, None, None


def linear_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           feature_map: str = 'elu', eps: float = 1e-6,
                           chunk_size: Optional[int] = None) -> torch.Tensor:
    """phi(Q) S / (phi(Q) z + eps), S = phi(K)^T V / M, z = mean phi(K); feature map fused.

    Args:
        q, k, v, feature_map, eps: As :func:`.naive.linear_attention_naive` (the contract of
            every backend); any equal leading dims, any strides, fp32/fp16/bf16.
        chunk_size: Tokens per chunk; ``None`` sizes chunks by :data:`DEFAULT_CHUNK_BYTES`
            (CPU) or :data:`ACCELERATOR_CHUNK_BYTES` (other devices).

    Returns:
        (..., N, e) in the dtype of ``v``; differentiable w.r.t. q, k and v (the backward
        recomputes the feature maps chunk by chunk).
    """
    check_feature_map(feature_map, TORCH_FEATURE_MAPS, 'the torch linear attention')
    lead = check_linear_attention_inputs(q, k, v)
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f'chunk_size must be >= 1 or None, got {chunk_size}')
    rows = math.prod(lead)
    d, e = q.shape[-1], v.shape[-1]
    n, m = q.shape[-2], k.shape[-2]
    budget = DEFAULT_CHUNK_BYTES if q.device.type == 'cpu' else ACCELERATOR_CHUNK_BYTES
    chunk_q = max(1, min(chunk_size or chunk_tokens(rows, max(d, e + 1), n, budget), n))
    chunk_k = min(chunk_size or chunk_tokens(rows, max(d, e), m, budget), m)
    return _ChunkedLinearAttention.apply(q, k, v, feature_map, float(eps), chunk_q, chunk_k,
                                         chunk_size is None)


def linear_attention_graph(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           feature_map: str = 'elu', eps: float = 1e-6) -> torch.Tensor:
    """The same result as :func:`linear_attention_torch` from whole-tensor ops.

    For graph capture (``torch.compile``, export): a few matmuls and element-wise ops that a
    compiler fuses and plans memory for, plain autograd.

    Args:
        q: Raw queries (..., N, d).
        k: Raw keys (..., M, d).
        v: Values (..., M, e).
        feature_map: ``'elu'``, ``'relu'`` or ``'identity'``.
        eps: Normaliser epsilon.

    Returns:
        (..., N, e) in the dtype of ``v``.
    """
    check_feature_map(feature_map, TORCH_FEATURE_MAPS, 'the torch linear attention')
    check_linear_attention_inputs(q, k, v)
    with autocast_disabled(q.device):  # fp32 math under AMP too
        q32, k32 = q.float(), k.float()
        if feature_map == 'elu':
            q32, k32 = F.elu(q32) + 1.0, F.elu(k32) + 1.0
        elif feature_map == 'relu':
            q32, k32 = F.relu(q32), F.relu(k32)
        inv_m = 1.0 / k.shape[-2]
        state = torch.matmul(k32.transpose(-2, -1), v.float()) * inv_m  # (..., d, e)
        z = k32.mean(dim=-2).unsqueeze(-1)  # (..., d, 1)
        den = torch.matmul(q32, z) + eps
        return (torch.matmul(q32, state) / den).to(v.dtype)


def _as_fp32_batch(x: torch.Tensor) -> torch.Tensor:
    """(..., T, c) -> fp32 (batch, T, c); no copy when already so."""
    return x.float().reshape(-1, x.shape[-2], x.shape[-1])


def inline_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """InLine attention out_i = s q_i (K^T V / M) + (1 - s q_i.kbar) vbar, fp32 accumulation
    (computed as s q_i (K - kbar)^T V / M + vbar).

    Args:
        q: Queries (B, H, N, d) (identity feature map).
        k: Keys (B, H, M, d).
        v: Values (B, H, M, e).
        scale: s, usually d ** -0.5.

    Returns:
        (B, H, N, e) in the dtype of ``v``.
    """
    lead = check_linear_attention_inputs(q, k, v)
    out_dtype = v.dtype
    n, e = q.shape[-2], v.shape[-1]
    with autocast_disabled(q.device):  # fp32 math under AMP too (1 - s q.kbar cancels)
        q32, k32, v32 = _as_fp32_batch(q), _as_fp32_batch(k), _as_fp32_batch(v)
        m = k32.shape[-2]
        # s q S + (1 - s q.kbar) vbar = s q S_c + vbar with the centred state
        # S_c = (K - kbar)^T V / M: no cancellation when q.kbar is large (fp32 at 16k tokens,
        # q / k x10 with shared means: 5e-5 -> 4e-6 relative).
        k_centred = k32 - k32.mean(dim=1, keepdim=True)
        v_mean = v32.mean(dim=1, keepdim=True)  # (BH, 1, e)
        state = torch.empty(k32.shape[0], k32.shape[-1], v32.shape[-1], dtype=torch.float32,
                            device=k32.device)
        state = torch.baddbmm(state, k_centred.transpose(1, 2), v32, beta=0.0,
                              alpha=1.0 / m)  # (BH, d, e)
        out = torch.baddbmm(v_mean.expand(-1, n, -1), q32, state, alpha=scale)
    return out.reshape(lead + (n, e)).to(out_dtype)
