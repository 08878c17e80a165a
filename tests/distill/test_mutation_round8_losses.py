"""Mutation round 8: distillation losses, their schedule and the block pairing, against
hand computations.

Each test here fails on a one-line change of the code under test that the rest of the suite
let through (the mutation audit of session 14):

* ``ActivationMatchingLoss`` (ViT-Linearizer L_act): the per-image average over the *visible*
  rows (not over all L rows, not pooled over the batch), visible = not masked, the token
  layouts of both sides, a fully masked image staying finite, no gradient to the teacher.
  The reference is the cosine-similarity map written out with explicit loops in float64.
* ``MaskedPredictionLoss`` (L_mask): Smooth L1 with the configured ``beta``, averaged over the
  channels of the masked patches, the layouts of both sides, no gradient to the teacher.
* ``patch_tokens`` layout checks, ``token_records_mse``'s default pair loss,
  ``patch_tokens_only=False`` keeping the special tokens, the KL attention-map rows
  renormalised after the special tokens are dropped.
* ``DistillLossScheduleHook``: every term and the logged scale follow the factor, the factor
  set in ``before_train`` comes from the runner's position in the hook's unit, and the
  "begin is not before the end of the run" warning uses the right unit and boundary.
* ``check_stage_depths``: every pair of blocks must sit at the same relative depth.
* ``MLPCopy.options()`` reports ``include_layer_scale`` as given.
"""
import logging
import math
from types import SimpleNamespace
from typing import Dict, List, Sequence, Tuple

import pytest
import torch
import torch.nn as nn

from mmlinvit.distill.losses import (ActivationMatchingLoss, AttentionMapLoss,
                                     AttentionOutputMSELoss, MaskedPredictionLoss,
                                     patch_tokens, token_records_mse)


# ---------------------------------------------------------------- float64 references
def cosine(u: Sequence[float], v: Sequence[float]) -> float:
    """cos(u, v) of two vectors, in Python floats."""
    dot = sum(a * b for a, b in zip(u, v))
    return dot / (math.sqrt(sum(a * a for a in u)) * math.sqrt(sum(b * b for b in v)))


def unit_row(values: List[float]) -> List[float]:
    norm = math.sqrt(sum(v * v for v in values))
    return [v / norm for v in values]


def activation_loss_reference(student: torch.Tensor, teacher: torch.Tensor,
                              visible: torch.Tensor) -> float:
    """L_act of one stage: for each image, 1 - <A_t(i, :), A_s(i, :)> averaged over its
    visible rows i, with A(i, j) = cos(f_i, f_j) over visible j and rows l2-normalised;
    then the mean over the images (an image without visible tokens adds 0).

    Args:
        student: (B, L, C_s) patch tokens.
        teacher: (B, L, C_t) patch tokens.
        visible: (B, L) bool.
    """
    s, t = student.double().tolist(), teacher.double().tolist()
    per_image = []
    for b in range(len(s)):
        keep = [j for j in range(len(s[b])) if bool(visible[b, j])]
        total = 0.0
        for i in keep:
            row_s = unit_row([cosine(s[b][i], s[b][j]) for j in keep])
            row_t = unit_row([cosine(t[b][i], t[b][j]) for j in keep])
            total += 1.0 - sum(x * y for x, y in zip(row_s, row_t))
        per_image.append(total / len(keep) if keep else 0.0)
    return sum(per_image) / len(per_image)


def smooth_l1_reference(student: torch.Tensor, teacher: torch.Tensor, masked: torch.Tensor,
                        beta: float) -> float:
    """Smooth L1 (0.5 d^2 / beta below beta, d - beta / 2 above) averaged over every channel
    of every masked patch of the batch."""
    values = []
    for b in range(student.shape[0]):
        for i in range(student.shape[1]):
            if not bool(masked[b, i]):
                continue
            for c in range(student.shape[2]):
                d = abs(float(student[b, i, c]) - float(teacher[b, i, c]))
                values.append(0.5 * d * d / beta if d < beta else d - 0.5 * beta)
    return sum(values) / len(values)


def tokens(*shape: int, seed: int) -> torch.Tensor:
    """Random tokens with per-token scales between 0.5 and 3 (the cosines must not depend on
    them)."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(*shape, generator=gen)
    return values * (0.5 + 2.5 * torch.rand(*shape[:-1], 1, generator=gen))


# ---------------------------------------------------------------- activation matching
# 2 images of 5 patches; image 0 keeps 3, image 1 keeps 4 (different counts on purpose).
MASK = torch.tensor([[True, False, False, True, False],
                     [False, False, True, False, False]])


def test_activation_matching_masked_batch_matches_the_loop_reference():
    """Rows and columns of masked tokens are left out and each image is averaged over its
    own visible rows: neither over all L rows nor pooled across the batch, and the mask is
    not read the wrong way round."""
    student, teacher = tokens(2, 5, 3, seed=0), tokens(2, 5, 4, seed=1)
    want = activation_loss_reference(student, teacher, ~MASK)
    got = ActivationMatchingLoss()(student, teacher, patch_mask=MASK)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(want, rel=1e-5)
    # the reference tells the mask's reading apart: inverted, or every token kept
    assert want != pytest.approx(activation_loss_reference(student, teacher, MASK), rel=1e-2)
    assert want != pytest.approx(
        activation_loss_reference(student, teacher, torch.ones_like(MASK)), rel=1e-2)


def test_activation_matching_divides_each_image_by_its_visible_count():
    """One image, its masked token far off: the sum over the 2 visible rows is divided by 2,
    not by the 3 patches (hand computation)."""
    teacher = torch.tensor([[[1., 0.], [1., 1.], [5., -3.]]])
    student = torch.tensor([[[1., 0.], [0., 1.], [0., 2.]]])
    mask = torch.tensor([[False, False, True]])
    # visible tokens 0, 1.  teacher cosines: [[1, 1/sqrt2], [1/sqrt2, 1]];
    # student cosines: [[1, 0], [0, 1]].  Normalised teacher rows: (sqrt2, 1) / sqrt3 and
    # (1, sqrt2) / sqrt3; student rows (1, 0) and (0, 1): both inner products sqrt(2/3).
    per_row = 1 - math.sqrt(2 / 3)
    loss = ActivationMatchingLoss()(student, teacher, patch_mask=mask)
    assert loss.item() == pytest.approx(2 * per_row / 2, rel=1e-5)
    assert activation_loss_reference(student, teacher, ~mask) == pytest.approx(per_row)


def test_activation_matching_token_layouts_of_both_sides_are_used():
    """Student (0, 1) (Adventurer: class token last) and teacher (1, 0) (CLIP: class token
    first): each side drops its own special tokens."""
    student, teacher = tokens(2, 5, 3, seed=2), tokens(2, 5, 4, seed=3)
    with_cls_s = torch.cat([student, tokens(2, 1, 3, seed=4)], dim=1)
    with_cls_t = torch.cat([tokens(2, 1, 4, seed=5), teacher], dim=1)
    loss = ActivationMatchingLoss()(with_cls_s, with_cls_t, patch_mask=MASK,
                                    student_token_layout=(0, 1), teacher_token_layout=(1, 0))
    want = activation_loss_reference(student, teacher, ~MASK)
    assert loss.item() == pytest.approx(want, rel=1e-5)


def test_activation_matching_fully_masked_image_stays_finite():
    """An image with every patch masked has no visible row: it adds 0 instead of 0 / 0."""
    student = tokens(2, 4, 3, seed=6).requires_grad_()
    teacher = tokens(2, 4, 3, seed=7)
    mask = torch.tensor([[True] * 4, [False, True, False, False]])
    loss = ActivationMatchingLoss()(student, teacher, patch_mask=mask)
    assert torch.isfinite(loss)
    assert loss.item() == pytest.approx(
        activation_loss_reference(student.detach(), teacher, ~mask), rel=1e-5)
    loss.backward()
    assert torch.isfinite(student.grad).all()


def test_activation_matching_gradient_reaches_the_student_only():
    student = tokens(1, 4, 3, seed=8).requires_grad_()
    teacher = tokens(1, 4, 3, seed=9).requires_grad_()
    ActivationMatchingLoss()(student, teacher).backward()
    assert student.grad is not None and student.grad.abs().sum() > 0
    assert teacher.grad is None


# ---------------------------------------------------------------- masked prediction
def test_masked_prediction_beta_and_channel_mean_match_the_loop_reference():
    """``beta`` (not 1) sets the Smooth L1 threshold and the value is the mean over every
    channel of the masked patches (3 channels: a sum over channels would be 3x)."""
    gen = torch.Generator().manual_seed(10)
    student = torch.randn(2, 4, 3, generator=gen)
    teacher = student + torch.tensor([0.1, 0.4, 1.5]) * torch.randn(2, 4, 3, generator=gen)
    mask = torch.tensor([[True, False, True, False], [False, False, False, True]])
    for beta in (0.25, 1.0, 2.0):
        want = smooth_l1_reference(student, teacher, mask, beta)
        got = MaskedPredictionLoss(loss_weight=1.5, beta=beta)(student, teacher, mask)
        assert got.item() == pytest.approx(1.5 * want, rel=1e-5), beta
    # the three betas give three different values (the differences straddle them)
    values = {round(smooth_l1_reference(student, teacher, mask, b), 6) for b in (.25, 1., 2.)}
    assert len(values) == 3


def test_masked_prediction_token_layouts_of_both_sides_are_used():
    """Adventurer student (0, 1) against a CLIP teacher (1, 0): patch i of the student is
    compared with patch i of the teacher, whatever the special tokens hold."""
    patches = torch.arange(12, dtype=torch.float32).reshape(1, 4, 3)
    student = torch.cat([patches + 0.5, torch.full((1, 1, 3), 100.)], dim=1)
    teacher = torch.cat([torch.full((1, 1, 3), -100.), patches], dim=1)
    mask = torch.tensor([[True, False, True, True]])
    loss = MaskedPredictionLoss()(student, teacher, mask, student_token_layout=(0, 1),
                                  teacher_token_layout=(1, 0))
    assert loss.item() == pytest.approx(0.5 * 0.5 ** 2)  # every masked difference is 0.5


def test_masked_prediction_gradient_reaches_the_student_only():
    student = torch.randn(1, 3, 2, requires_grad=True)
    teacher = torch.randn(1, 3, 2, requires_grad=True)
    MaskedPredictionLoss()(student, teacher, torch.tensor([[True, False, True]])).backward()
    assert student.grad is not None and teacher.grad is None
    assert torch.equal(student.grad[0, 1], torch.zeros(2))  # the visible patch gets nothing


# ---------------------------------------------------------------- token bookkeeping / MSE
def test_patch_tokens_refuses_layouts_leaving_no_patch_token():
    record = torch.zeros(1, 3, 2)
    assert patch_tokens(record, (1, 1), 'r').shape == (1, 1, 2)
    with pytest.raises(ValueError, match='3 tokens, not more than its 2 prefix \\+ 1 suffix'):
        patch_tokens(record, (2, 1), 'r')
    with pytest.raises(ValueError, match='non-negative'):
        patch_tokens(record, (-1, 0), 'r')
    with pytest.raises(ValueError, match='non-negative'):
        patch_tokens(record, (0, -1), 'r')


def test_token_records_mse_default_pair_loss_is_the_mean_squared_error():
    student = [torch.tensor([[[1., 3.]]]), torch.tensor([[[0., 0.], [2., 2.]]])]
    teacher = [torch.zeros(1, 1, 2), torch.zeros(1, 2, 2)]
    # record 0: (1 + 9) / 2 = 5; record 1: (4 + 4) / 4 = 2
    loss = token_records_mse(student, teacher, False, (0, 0), (0, 0), 'mean', 'test')
    assert loss.item() == pytest.approx(3.5)
    assert token_records_mse(student, teacher, False, (0, 0), (0, 0), 'sum',
                             'test').item() == pytest.approx(7.0)


def test_all_tokens_are_compared_unless_patch_tokens_only():
    """``patch_tokens_only=False`` compares the class token too, even when the layouts (which
    the distillation model always passes) name one."""
    student = torch.tensor([[[2., 0.], [1., 1.]]])
    teacher = torch.tensor([[[0., 0.], [1., 1.]]])
    loss = AttentionOutputMSELoss()(student, teacher, student_token_layout=(1, 0),
                                    teacher_token_layout=(1, 0))
    assert loss.item() == pytest.approx(4.0 / 4)
    only = AttentionOutputMSELoss(patch_tokens_only=True)(
        student, teacher, student_token_layout=(1, 0), teacher_token_layout=(1, 0))
    assert only.item() == 0.0


def test_attention_map_kl_renormalises_the_patch_rows():
    """KL(teacher row || student row) of the patch block, each row divided by its sum after
    the class row / column are dropped (hand computation)."""
    teacher = torch.tensor([[[[.2, .4, .4],
                              [.5, .25, .25],
                              [.2, .2, .6]]]])
    student = torch.tensor([[[[.5, .25, .25],
                              [.1, .6, .3],
                              [.3, .35, .35]]]])
    # patch block, rows renormalised: teacher (.5, .5), (.25, .75);
    # student (2/3, 1/3), (.5, .5)
    rows = [((.5, .5), (2 / 3, 1 / 3)), ((.25, .75), (.5, .5))]
    want = sum(sum(p * math.log(p / q) for p, q in zip(pt, ps)) for pt, ps in rows) / 2
    loss = AttentionMapLoss(mode='kl', patch_tokens_only=True)(
        student, teacher, student_token_layout=(1, 0), teacher_token_layout=(1, 0))
    assert loss.item() == pytest.approx(want, rel=1e-5)


# ---------------------------------------------------------------- schedule hook
class _ScaleModel:
    """Stands for a DistillationModel: records the scales set per term."""

    def __init__(self) -> None:
        self.scales: Dict[str, float] = {}

    def set_distill_scale(self, term: str, value: float) -> None:
        self.scales[term] = value


class _Hub:
    def __init__(self) -> None:
        self.scalars: Dict[str, float] = {}

    def update_scalar(self, key: str, value: float) -> None:
        self.scalars[key] = value


def _runner(epoch: int = 0, it: int = 0, max_epochs: int = 4, max_iters: int = 40):
    """A stand-in with what the hook reads from an EpochBasedTrainLoop runner."""
    return SimpleNamespace(model=_ScaleModel(), message_hub=_Hub(), train_loop=object(),
                           epoch=epoch, iter=it, max_epochs=max_epochs, max_iters=max_iters)


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: List[str] = []

    def emit(self, record) -> None:
        self.messages.append(record.getMessage())


def _before_train_warnings(hook, runner) -> List[str]:
    from mmengine.logging import MMLogger
    handler = _Warnings()
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        hook.before_train(runner)
    finally:
        logger.removeHandler(handler)
    return [m for m in handler.messages if 'DistillLossScheduleHook' in m]


def test_schedule_hook_scales_and_logs_every_term():
    from mmlinvit.engine.hooks import DistillLossScheduleHook
    hook = DistillLossScheduleHook(['act', 'mask'], begin=10, end=20, start_factor=0.0,
                                   end_factor=1.0)
    runner = _runner(it=15)
    hook.before_train_iter(runner, batch_idx=5)
    assert runner.model.scales == {'act': 0.5, 'mask': 0.5}
    assert runner.message_hub.scalars == {'train/distill.scale_act': 0.5,
                                          'train/distill.scale_mask': 0.5}


def test_schedule_hook_before_train_uses_the_position_in_its_unit():
    """Resuming at epoch 1, iteration 30: an epoch schedule starts from epoch 1, an iteration
    schedule from iteration 30."""
    from mmlinvit.engine.hooks import DistillLossScheduleHook
    by_epoch = DistillLossScheduleHook('act', begin=2, by_epoch=True)
    runner = _runner(epoch=1, it=30)
    by_epoch.before_train(runner)
    assert runner.model.scales == {'act': 1.0}  # epoch 1 < 2 (iteration 30 is not)
    by_iter = DistillLossScheduleHook('act', begin=2)
    runner = _runner(epoch=1, it=30)
    by_iter.before_train(runner)
    assert runner.model.scales == {'act': 0.0}  # iteration 30 >= 2 (epoch 1 is not)


def test_schedule_hook_warns_when_begin_is_not_before_the_end_of_the_run():
    """``begin`` equal to the run length never changes the factor (positions stop at
    length - 1): warned; the length is counted in the hook's unit."""
    from mmlinvit.engine.hooks import DistillLossScheduleHook
    assert _before_train_warnings(DistillLossScheduleHook('act', begin=40), _runner(
        max_epochs=4, max_iters=40))
    assert not _before_train_warnings(DistillLossScheduleHook('act', begin=39), _runner(
        max_epochs=4, max_iters=40))
    # epochs: 4 epochs of 10 iterations
    assert _before_train_warnings(DistillLossScheduleHook('act', begin=4, by_epoch=True),
                                  _runner(max_epochs=4, max_iters=40))
    assert not _before_train_warnings(DistillLossScheduleHook('act', begin=3, by_epoch=True),
                                      _runner(max_epochs=4, max_iters=2))


# ---------------------------------------------------------------- block pairing
class _Blocks(nn.Module):
    def __init__(self, name: str, depth: int) -> None:
        super().__init__()
        self.add_module(name, nn.ModuleList(nn.Identity() for _ in range(depth)))


def _check_depths(student: Tuple[List[int], int], teacher: Tuple[List[int], int]) -> None:
    """check_stage_depths for a 'layers.{i}' student and a 'blocks.{i}' teacher."""
    from mmlinvit.distill.recorders import ModuleOutputsRecorder
    from mmlinvit.models.distill.input_specs import InputSpec
    from mmlinvit.models.distill.stage_depths import check_stage_depths
    models = {'student': _Blocks('layers', student[1]), 'teacher': _Blocks('blocks', teacher[1])}
    recorders = {'student': {'stages': ModuleOutputsRecorder('layers.{i}', student[0])},
                 'teacher': {'stages': ModuleOutputsRecorder('blocks.{i}', teacher[0])}}
    for side in ('student', 'teacher'):
        recorders[side]['stages'].resolve(models[side], side)
    specs = {'act': [InputSpec('student_feats', 'student', 'stages'),
                     InputSpec('teacher_feats', 'teacher', 'stages')]}
    check_stage_depths(specs, recorders, models)


def test_stage_depths_every_pair_must_match():
    """One wrong index among four (23 of 24 mistyped 22) is refused, not only all four."""
    from mmlinvit.models.distill import DistillationConfigError
    _check_depths(([5, 11, 17, 23], 24), ([2, 5, 8, 11], 12))
    _check_depths(([1, 3], 4), ([5, 11], 12))
    with pytest.raises(DistillationConfigError, match=r'\[5, 11, 17, 22\].*23/24 vs 12/12'):
        _check_depths(([5, 11, 17, 22], 24), ([2, 5, 8, 11], 12))


# ---------------------------------------------------------------- copy strategies
def test_mlp_copy_reports_its_layer_scale_option():
    from mmlinvit.transfer.copy_strategies import MLPCopy
    assert MLPCopy().options() == {'include_layer_scale': True}
    assert MLPCopy(include_layer_scale=False).options() == {'include_layer_scale': False}
