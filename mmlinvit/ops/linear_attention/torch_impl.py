"""O(N) non-causal kernel linear attention in plain PyTorch (the CPU path).

Semantics are those of :func:`.naive.linear_attention_naive`.  Sums are accumulated in fp32
and scaled by 1/N whatever the input dtype, so fp16/bf16 inputs neither overflow nor lose
the normaliser.  A column of ones appended to V gives the numerator and the normaliser in
one pair of matrix products.
"""
import torch


def linear_attention_torch(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                           eps: float = 1e-6) -> torch.Tensor:
    """phi(Q) S / (phi(Q) z + eps) with S = phi(K)^T V / N and z = mean(phi(K)).

    Args:
        phi_q: Feature-mapped queries, (B, H, N, d).
        phi_k: Feature-mapped keys, (B, H, M, d).
        v: Values, (B, H, M, e).
        eps: Normaliser epsilon; keeps the division finite when phi(q).z == 0.

    Returns:
        (B, H, N, e) in the dtype of ``v``.
    """
    out_dtype = v.dtype
    q, k, v32 = phi_q.float(), phi_k.float(), v.float()
    m = k.shape[-2]
    ones = torch.ones(v32.shape[:-1] + (1, ), dtype=v32.dtype, device=v32.device)
    v_aug = torch.cat([v32, ones], dim=-1)  # (B, H, M, e + 1)
    kv = torch.matmul(k.transpose(-2, -1), v_aug).div_(m)  # (B, H, d, e + 1)
    out = torch.matmul(q, kv)  # (B, H, N, e + 1)
    num, den = out[..., :-1], out[..., -1:]
    return (num / (den + eps)).to(out_dtype)
