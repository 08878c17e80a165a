"""Distillation losses on hand-computed examples."""
import math

import pytest
import torch

from mmlinvit.distill.losses import (ActivationMatchingLoss, AttentionMapLoss,
                                     AttentionOutputMSELoss, FeatureMSELoss,
                                     MaskedPredictionLoss)


def t(values):
    return torch.tensor(values, dtype=torch.float32)


# ---------------------------------------------------------------- attention-output MSE
def test_attention_output_mse_mean_over_blocks_and_weight():
    student = [t([[[1., 2.], [3., 4.]]]), t([[[1., 1.], [1., 1.]]])]
    teacher = [torch.zeros(1, 2, 2), torch.zeros(1, 2, 2)]
    # block 0: (1 + 4 + 9 + 16) / 4 = 7.5; block 1: 1; mean 4.25; x 2
    loss = AttentionOutputMSELoss(loss_weight=2.0)(student, teacher)
    assert loss.item() == pytest.approx(8.5)
    loss_sum = AttentionOutputMSELoss(loss_weight=2.0, block_reduction='sum')(student, teacher)
    assert loss_sum.item() == pytest.approx(17.0)


def test_attention_output_mse_patch_tokens_only_drops_the_teacher_class_token():
    student = t([[[1., 2.], [3., 5.]]])                  # no class token
    teacher = t([[[100., 100.], [1., 2.], [3., 4.]]])    # class token first
    loss = AttentionOutputMSELoss(patch_tokens_only=True)(
        student, teacher, student_token_layout=(0, 0), teacher_token_layout=(1, 0))
    assert loss.item() == pytest.approx(0.25)  # one entry differs by 1, over 4 entries
    # a suffix class token (Adventurer layout) is dropped the same way
    teacher_suffix = t([[[1., 2.], [3., 4.], [100., 100.]]])
    loss = AttentionOutputMSELoss(patch_tokens_only=True)(
        student, teacher_suffix, teacher_token_layout=(0, 1))
    assert loss.item() == pytest.approx(0.25)


def test_attention_output_mse_names_both_shapes_on_mismatch():
    with pytest.raises(ValueError, match=r'\(1, 2, 2\).*\(1, 3, 2\).*patch_tokens_only'):
        AttentionOutputMSELoss()(torch.zeros(1, 2, 2), torch.zeros(1, 3, 2))
    with pytest.raises(ValueError, match='2 records but the teacher 1'):
        AttentionOutputMSELoss()([torch.zeros(1, 2, 2)] * 2, [torch.zeros(1, 2, 2)])


def test_attention_output_mse_gradient_reaches_student_only():
    student = t([[[1., 2.]]]).requires_grad_()
    teacher = t([[[0., 0.]]]).requires_grad_()
    AttentionOutputMSELoss()(student, teacher).backward()
    # d/ds mean((s - t)^2) = 2 (s - t) / n
    assert torch.allclose(student.grad, t([[[1., 2.]]]))
    assert teacher.grad is None


# ---------------------------------------------------------------- final-feature MSE
def test_feature_mse():
    loss = FeatureMSELoss(loss_weight=3.0)(t([[[2., 0.]]]), t([[[0., 0.]]]))
    assert loss.item() == pytest.approx(3.0 * 4.0 / 2.0)


# ---------------------------------------------------------------- attention maps
def test_attention_map_mse_accepts_signed_maps():
    teacher = torch.full((1, 1, 2, 2), 0.5)
    student = t([[[[1., 0.], [0., 1.]]]])
    assert AttentionMapLoss()(student, teacher).item() == pytest.approx(0.25)
    signed = t([[[[1.5, -0.5], [0., 1.]]]])  # rows sum to one, negative entry (InLine-like)
    # squared differences 1, 1, 0.25, 0.25 -> mean 0.625
    assert AttentionMapLoss()(signed, teacher).item() == pytest.approx(0.625)


def test_attention_map_kl_hand_computed_and_rejects_signed_maps():
    teacher = torch.full((1, 1, 2, 2), 0.5)
    student = t([[[[0.75, 0.25], [0.25, 0.75]]]])
    expected = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)  # = 0.5 ln(4/3)
    loss = AttentionMapLoss(mode='kl')(student, teacher)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="signed map.*mode='mse'"):
        AttentionMapLoss(mode='kl')(t([[[[1.5, -0.5], [0., 1.]]]]), teacher)


def test_attention_map_patch_tokens_only():
    teacher = torch.zeros(1, 1, 3, 3)
    teacher[..., 0, :] = 9.0  # class row / column, dropped
    teacher[..., :, 0] = 9.0
    student = torch.ones(1, 1, 2, 2)
    loss = AttentionMapLoss(patch_tokens_only=True)(student, teacher,
                                                     teacher_token_layout=(1, 0))
    assert loss.item() == pytest.approx(1.0)


# ---------------------------------------------------------------- activation matching
def _activation_example():
    # teacher tokens: (1,0), (0,1), (1,0) -> cos map [[1,0,1],[0,1,0],[1,0,1]]
    teacher = t([[[1., 0.], [0., 1.], [1., 0.]]])
    # student tokens all (1,0) -> cos map all ones
    student = t([[[1., 0.], [1., 0.], [1., 0.]]])
    return student, teacher


def test_activation_matching_all_tokens_hand_computed():
    student, teacher = _activation_example()
    # normalised rows: teacher [1,0,1]/sqrt2, [0,1,0], [1,0,1]/sqrt2; student [1,1,1]/sqrt3
    # 1 - <.,.> = 1 - 2/sqrt6, 1 - 1/sqrt3, 1 - 2/sqrt6
    expected = ((1 - 2 / math.sqrt(6)) * 2 + (1 - 1 / math.sqrt(3))) / 3
    loss = ActivationMatchingLoss()(student, teacher)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    # two identical stages: the mean over stages is unchanged, the sum doubles
    assert ActivationMatchingLoss()([student] * 2, [teacher] * 2).item() == pytest.approx(
        expected, rel=1e-5)
    assert ActivationMatchingLoss(stage_reduction='sum')(
        [student] * 2, [teacher] * 2).item() == pytest.approx(2 * expected, rel=1e-5)


def test_activation_matching_visible_tokens_only():
    student, teacher = _activation_example()
    mask = torch.tensor([[False, True, False]])  # token 1 masked
    # over visible tokens {0, 2}: both maps are all ones -> identical rows -> zero loss
    loss = ActivationMatchingLoss()(student, teacher, patch_mask=mask)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    # visible_only=False ignores the mask
    loss_all = ActivationMatchingLoss(visible_only=False)(student, teacher, patch_mask=mask)
    assert loss_all.item() > 0.2


def test_activation_matching_ignores_special_tokens_and_width():
    student, teacher = _activation_example()
    wide_teacher = torch.cat([teacher, torch.zeros(1, 3, 3)], dim=-1)  # width 5, same cosines
    with_cls = torch.cat([torch.randn(1, 1, 5), wide_teacher], dim=1)
    plain = ActivationMatchingLoss()(student, teacher)
    mixed = ActivationMatchingLoss()(student, with_cls, teacher_token_layout=(1, 0))
    assert mixed.item() == pytest.approx(plain.item(), rel=1e-5)


def test_activation_matching_token_count_mismatch_names_shapes():
    with pytest.raises(ValueError, match=r'\(1, 3, 2\).*\(1, 4, 2\)'):
        ActivationMatchingLoss()(torch.randn(1, 3, 2), torch.randn(1, 4, 2))


# ---------------------------------------------------------------- masked prediction
def test_masked_prediction_smooth_l1_on_masked_patches():
    student = t([[[0.5], [3.0]]])
    teacher = torch.zeros(1, 2, 1)
    # smooth L1 (beta 1): |0.5| -> 0.5 * 0.25 = 0.125, |3| -> 3 - 0.5 = 2.5
    everything = MaskedPredictionLoss()(student, teacher, torch.tensor([[True, True]]))
    assert everything.item() == pytest.approx((0.125 + 2.5) / 2)
    first = MaskedPredictionLoss(loss_weight=2.0)(student, teacher, torch.tensor([[True, False]]))
    assert first.item() == pytest.approx(0.25)
    nothing = MaskedPredictionLoss()(student, teacher, torch.tensor([[False, False]]))
    assert nothing.item() == 0.0


def test_masked_prediction_width_mismatch_suggests_a_connector():
    with pytest.raises(ValueError, match=r'\(1, 2, 3\).*\(1, 2, 4\).*connector'):
        MaskedPredictionLoss()(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4),
                               torch.tensor([[True, False]]))


# ---------------------------------------------------------------- shared constructor checks
@pytest.mark.parametrize('cls,arg', [(AttentionOutputMSELoss, 'block_reduction'),
                                     (FeatureMSELoss, 'reduction'),
                                     (AttentionMapLoss, 'block_reduction'),
                                     (ActivationMatchingLoss, 'stage_reduction')])
def test_unknown_record_reduction_fails_at_build_time_naming_the_argument(cls, arg):
    with pytest.raises(ValueError, match=f"{arg} must be 'mean' or 'sum', got 'max'"):
        cls(**{arg: 'max'})


def test_activation_matching_small_values_are_exact():
    """Late in training the maps nearly agree: 1 - <a_s, a_t> cancelled in fp32 and the logged
    value was 30 % to 9x off an fp64 computation below ~1e-7 (the gradients were fine)."""
    gen = torch.Generator().manual_seed(0)
    shared = torch.randn(1, 1, 32, generator=gen)
    teacher = shared + 0.3 * torch.randn(2, 40, 32, generator=gen)  # cos ~ 0.9, as real tokens
    for noise in (1e-2, 1e-3):
        student = teacher + noise * torch.randn(2, 40, 32, generator=gen)
        got = ActivationMatchingLoss()(student, teacher).item()

        def unit_map(x):
            u = torch.nn.functional.normalize(x.double(), dim=-1)
            return torch.nn.functional.normalize(u @ u.transpose(1, 2), dim=-1)

        want = (1 - (unit_map(student) * unit_map(teacher)).sum(-1)).mean().item()
        assert got == pytest.approx(want, rel=2e-2), (noise, got, want)
