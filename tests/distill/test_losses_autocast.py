"""Distillation losses under ``torch.autocast`` (``--amp``) give their float32 values.

mmengine's ``AmpOptimWrapper`` runs the losses inside ``torch.autocast``; autocast lowers
matmuls to fp16 / bf16 even on ``.float()`` inputs.  ActivationMatchingLoss (a small difference
of near-one inner products of token cosine-similarity maps) computed that way is off by 1.5x
(fp16) to 16x (bf16) on the inputs below; it must equal its float32 value.  The other losses
are element-wise / autocast-float32-list math and must stay exact too (regression guard).
"""
from typing import Callable, Dict, Tuple

import pytest
import torch

from mmlinvit.distill.losses import (ActivationMatchingLoss, AttentionMapLoss,
                                     AttentionOutputMSELoss, FeatureMSELoss,
                                     MaskedPredictionLoss, NormalizedAttentionOutputMSELoss,
                                     cosine_similarity_map)

AMP_DTYPES = [torch.bfloat16, torch.float16]
#: Relative tolerance of "equals the float32 value" under autocast.
RTOL = 1e-6


def _tokens(noise: float = 0.3, seed: int = 0, batch: int = 2, patches: int = 16,
            width: int = 64) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, 1 + L, C) teacher / student records with a class token, and a (B, L) patch mask.

    A shared per-image component makes the token cosines ~0.9 and the student is the teacher
    plus a little noise, so the loss (~4e-5) is a small difference of near-one numbers.
    """
    g = torch.Generator().manual_seed(seed)
    teacher = 2.0 * torch.randn(batch, 1, width, generator=g) + 0.5 * torch.randn(
        batch, patches + 1, width, generator=g)
    student = teacher + noise * torch.randn(batch, patches + 1, width, generator=g)
    mask = torch.zeros(batch, patches, dtype=torch.bool)
    mask[0, ::2] = True
    mask[1, 1::3] = True
    return student, teacher, mask


def _activation_formula(student: torch.Tensor, teacher: torch.Tensor,
                        mask: torch.Tensor) -> torch.Tensor:
    """ViT-Linearizer L_act written out image by image on the visible patch tokens.

    A(i, j) = cos(f_i, f_j) over the visible tokens, rows l2-normalised; the loss is the mean
    over the batch of the mean over visible rows of 1 - <A_s(i, :), A_t(i, :)>.  The class
    token (index 0) is dropped.  Runs in the dtype of the inputs (float64 for the reference).
    """
    per_image = []
    for b in range(student.shape[0]):
        keep = ~mask[b]
        rows = []
        for feats in (student[b, 1:][keep], teacher[b, 1:][keep]):
            unit = feats / feats.norm(dim=-1, keepdim=True)
            sim = unit @ unit.T
            rows.append(sim / sim.norm(dim=-1, keepdim=True))
        per_image.append((1.0 - (rows[0] * rows[1]).sum(-1)).mean())
    return torch.stack(per_image).mean()


def _rel(value: torch.Tensor, reference: torch.Tensor) -> float:
    return (abs(value.double() - reference.double()) / abs(reference.double())).item()


def _grad_rel(grad: torch.Tensor, reference: torch.Tensor) -> float:
    """Max abs difference over the max abs entry of the reference gradient."""
    return ((grad.double() - reference.double()).abs().max() /
            reference.double().abs().max()).item()


def _activation_loss(student: torch.Tensor, teacher: torch.Tensor,
                     mask: torch.Tensor) -> torch.Tensor:
    return ActivationMatchingLoss()(student, teacher, patch_mask=mask,
                                    student_token_layout=(1, 0),
                                    teacher_token_layout=(1, 0))


@pytest.mark.parametrize('dtype', AMP_DTYPES, ids=str)
def test_activation_matching_under_autocast_equals_float32(dtype):
    student, teacher, mask = _tokens()
    reference = _activation_formula(student.double(), teacher.double(), mask)
    # the inputs discriminate: the same formula with autocast's 16-bit math is far off
    with torch.autocast('cpu', dtype=dtype):
        naive = _activation_formula(student, teacher, mask)
    assert _rel(naive, reference) > 0.5, (dtype, naive.item(), reference.item())

    leaf32 = student.clone().requires_grad_()
    fp32 = _activation_loss(leaf32, teacher, mask)
    assert fp32.dtype == torch.float32
    assert _rel(fp32, reference) < 2e-3  # the float32 loss is the formula

    leaf_amp = student.clone().requires_grad_()
    with torch.autocast('cpu', dtype=dtype):
        amp = _activation_loss(leaf_amp, teacher, mask)
    assert amp.dtype == torch.float32
    assert _rel(amp, fp32) <= RTOL, (dtype, amp.item(), fp32.item())

    # gradients: backward works under autocast and matches float32 (and the float64 formula)
    with torch.autocast('cpu', dtype=dtype):
        amp = _activation_loss(leaf_amp, teacher, mask)
    amp.backward()
    fp32.backward()
    leaf64 = student.double().requires_grad_()
    _activation_formula(leaf64, teacher.double(), mask).backward()
    assert leaf_amp.grad.dtype == torch.float32
    assert _grad_rel(leaf_amp.grad, leaf32.grad) <= RTOL
    assert _grad_rel(leaf32.grad, leaf64.grad) < 1e-2


@pytest.mark.parametrize('dtype', AMP_DTYPES, ids=str)
def test_activation_matching_of_16bit_records_under_autocast(dtype):
    """Records produced in 16 bits under AMP: the loss is the float32 loss of their values."""
    student, teacher, mask = _tokens()
    student, teacher = student.to(dtype), teacher.to(dtype)
    reference = _activation_formula(student.double(), teacher.double(), mask)

    leaf_out = student.clone().requires_grad_()
    outside = _activation_loss(leaf_out, teacher, mask)
    leaf_amp = student.clone().requires_grad_()
    with torch.autocast('cpu', dtype=dtype):
        amp = _activation_loss(leaf_amp, teacher, mask)
    assert amp.dtype == torch.float32
    assert _rel(outside, reference) < 2e-3
    assert _rel(amp, outside) <= RTOL, (dtype, amp.item(), outside.item())

    outside.backward()
    amp.backward()
    assert leaf_amp.grad.dtype == dtype  # the gradient reaches the 16-bit record
    assert _grad_rel(leaf_amp.grad, leaf_out.grad) <= RTOL


@pytest.mark.parametrize('dtype', AMP_DTYPES, ids=str)
def test_cosine_similarity_map_under_autocast_is_float32(dtype):
    student, _, mask = _tokens()
    feats = student[:, 1:]
    keep = ~mask
    outside = cosine_similarity_map(feats, keep)
    with torch.autocast('cpu', dtype=dtype):
        amp = cosine_similarity_map(feats, keep)
    assert amp.dtype == torch.float32
    assert (amp - outside).abs().max().item() <= RTOL
    # independent check of one image's map: cosines of kept columns, rows normalised
    unit = feats[0].double() / feats[0].double().norm(dim=-1, keepdim=True)
    sim = (unit @ unit.T) * keep[0].double()
    expected = sim / sim.norm(dim=-1, keepdim=True)
    assert torch.allclose(amp[0].double(), expected, atol=1e-6)


# ---------------------------------------------------------------- the other losses stay exact
def _near_tokens() -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Student = teacher + 1e-4 noise: 16-bit rounding of the records would swamp the MSE."""
    g = torch.Generator().manual_seed(1)
    teacher = 1.0 + torch.randn(2, 9, 16, generator=g)
    student = teacher + 1e-4 * torch.randn(2, 9, 16, generator=g)
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[:, ::3] = True
    return student, teacher, mask


def _near_maps() -> Tuple[torch.Tensor, torch.Tensor]:
    """Softmax maps whose student logits differ from the teacher's by 3e-4 (B, H, N, N)."""
    g = torch.Generator().manual_seed(2)
    logits = 3.0 * torch.randn(2, 2, 9, 9, generator=g)
    teacher = logits.softmax(-1)
    student = (logits + 3e-4 * torch.randn(2, 2, 9, 9, generator=g)).softmax(-1)
    return student, teacher


def _other_losses() -> Dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                                          torch.Tensor]]:
    return {
        'attention_output_mse': lambda s, t, m: AttentionOutputMSELoss(
            patch_tokens_only=True)(s, t, (1, 0), (1, 0)),
        'normalized_attention_output_mse': lambda s, t, m: NormalizedAttentionOutputMSELoss()(
            [s, 2 * s], [t, 2 * t]),
        'feature_mse': lambda s, t, m: FeatureMSELoss()(s, t),
        'masked_prediction_smooth_l1': lambda s, t, m: MaskedPredictionLoss()(
            s, t, m, (1, 0), (1, 0)),
        'attention_map_mse': lambda s, t, m: AttentionMapLoss()(s, t),
        'attention_map_kl': lambda s, t, m: AttentionMapLoss(
            mode='kl', patch_tokens_only=True)(s, t, (1, 0), (1, 0)),
    }


@pytest.mark.parametrize('name', sorted(_other_losses()))
@pytest.mark.parametrize('dtype', AMP_DTYPES, ids=str)
def test_other_losses_under_autocast_equal_float32(name, dtype):
    loss_fn = _other_losses()[name]
    if name.startswith('attention_map'):
        student, teacher = _near_maps()
        mask = None
    else:
        student, teacher, mask = _near_tokens()
    # the inputs discriminate: the loss of 16-bit-rounded records is far off
    fp32 = loss_fn(student, teacher, mask)
    rounded = loss_fn(student.to(dtype), teacher.to(dtype), mask)
    assert _rel(rounded, fp32) > 0.1, (name, dtype, rounded.item(), fp32.item())

    leaf32 = student.clone().requires_grad_()
    fp32 = loss_fn(leaf32, teacher, mask)
    leaf_amp = student.clone().requires_grad_()
    with torch.autocast('cpu', dtype=dtype):
        amp = loss_fn(leaf_amp, teacher, mask)
    assert amp.dtype == torch.float32
    assert _rel(amp, fp32) <= RTOL, (name, dtype, amp.item(), fp32.item())
    fp32.backward()
    amp.backward()
    assert _grad_rel(leaf_amp.grad, leaf32.grad) <= RTOL
