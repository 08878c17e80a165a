"""Mutation round 15: distillation losses, small token-mixing ops and four engine pieces, on
branches, defaults and error paths that the rest of the suite let through.

Each test here fails on a one-line change of the code under test that the earlier tests
passed (the mutation audit of round 15), against an independent reference:

* the record losses (``AttentionOutputMSELoss``, ``FeatureMSELoss``,
  ``NormalizedAttentionOutputMSELoss``): their defaults (mean over records, every token
  compared, ``eps = 1e-8``), ``loss_weight``, the ``'sum'`` reduction, the teacher kept out of
  the graph, and the hints of the shape errors; references are means of squares written out
  with Python loops;
* ``ActivationMatchingLoss`` (ViT-Linearizer L_act): the default ``stage_reduction='mean'``
  and ``visible_only=True``, and the refused mask shape; the reference is the
  cosine-similarity map written with explicit loops in float64;
* ``MaskedPredictionLoss`` (ViT-Linearizer L_mask): the default Smooth L1 ``beta = 1``, the
  missing / misshapen mask, a mask with no masked patch (0, finite, differentiable);
* ``token_utils``: the layout, rank, record-type and batch checks;
* ``hedgehog_feature`` in float32 for 16-bit inputs, the causal convolution's captured-graph
  form with a bias against ``torch.nn.functional.conv1d`` with left padding;
* ``ExportStudentHook`` (a backbone that is the whole model, copies not views, the
  ``TypeError`` for a model without a student), ``SyncNormStatsHook`` (its buffer list is
  rebuilt per run, it runs before mmengine's ``CheckpointHook`` in a real ``Runner``),
  ``FrozenAwareOptimWrapperConstructor`` (a wholly frozen model, against mmengine's
  ``DefaultOptimWrapperConstructor``).
"""
import contextlib
import logging
import math
import types
from typing import Iterator, List

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmlinvit.distill.losses import (ActivationMatchingLoss, AttentionOutputMSELoss,
                                     FeatureMSELoss, MaskedPredictionLoss,
                                     NormalizedAttentionOutputMSELoss, patch_tokens,
                                     token_records_mse)
from mmlinvit.distill.losses.token_utils import (check_layout, check_same_shape,
                                                 record_pairs, reduce_over_records)


class _Capture(logging.Handler):

    def __init__(self, level: int) -> None:
        super().__init__(level=level)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def captured_log(level: int = logging.NOTSET) -> Iterator[List[str]]:
    """The messages the current MMLogger emits at ``level`` or above inside the block."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    handler = _Capture(level)
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)


# ------------------------------------------------------------------ float64 references
def mean_square(a: torch.Tensor, b: torch.Tensor) -> float:
    """mean((a - b)^2) over every element, with Python floats."""
    x, y = a.double().flatten().tolist(), b.double().flatten().tolist()
    return sum((u - v) ** 2 for u, v in zip(x, y)) / len(x)


def smooth_l1(d: float, beta: float) -> float:
    """Smooth L1 of one difference (Huber / beta), as in Fast R-CNN."""
    return 0.5 * d * d / beta if abs(d) < beta else abs(d) - 0.5 * beta


def activation_stage_reference(student: torch.Tensor, teacher: torch.Tensor,
                               visible: torch.Tensor) -> float:
    """ViT-Linearizer L_act of one stage: per image, 1 - <A_t(i, :), A_s(i, :)> averaged over
    the visible rows, A(i, j) = cos(f_i, f_j) over visible j with rows l2-normalised; then the
    mean over the images."""
    def cos(u: List[float], v: List[float]) -> float:
        dot = sum(a * b for a, b in zip(u, v))
        return dot / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))

    def unit(row: List[float]) -> List[float]:
        norm = math.sqrt(sum(v * v for v in row))
        return [v / norm for v in row]

    per_image = []
    for s, t, vis in zip(student.double().tolist(), teacher.double().tolist(),
                         visible.tolist()):
        idx = [i for i, v in enumerate(vis) if v]
        rows = []
        for i in idx:
            a_s = unit([cos(s[i], s[j]) for j in idx])
            a_t = unit([cos(t[i], t[j]) for j in idx])
            rows.append(1.0 - sum(p * q for p, q in zip(a_s, a_t)))
        per_image.append(sum(rows) / len(rows))
    return sum(per_image) / len(per_image)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ MSE record losses
def test_record_losses_default_to_the_mean_over_records_of_every_token():
    """Defaults: ``block_reduction`` / ``reduction`` 'mean' and ``patch_tokens_only=False``
    (the class token, given in the layouts, is still compared)."""
    s = [_randn(2, 4, 3, seed=1), _randn(2, 4, 3, seed=2)]
    t = [_randn(2, 4, 3, seed=3), _randn(2, 4, 3, seed=4)]
    want = (mean_square(s[0], t[0]) + mean_square(s[1], t[1])) / 2
    for loss in (AttentionOutputMSELoss(), FeatureMSELoss()):
        got = loss(s, t, student_token_layout=(1, 0), teacher_token_layout=(1, 0))
        assert got.item() == pytest.approx(want, rel=1e-5), type(loss).__name__


@pytest.mark.parametrize('cls', [AttentionOutputMSELoss, FeatureMSELoss])
def test_patch_tokens_only_uses_each_sides_own_layout(cls):
    """Student (1 prefix, 0 suffix), teacher (0 prefix, 2 suffix): the layouts are not swapped."""
    s, t = _randn(1, 4, 2, seed=5), _randn(1, 5, 2, seed=6)
    loss = cls(patch_tokens_only=True)(s, t, student_token_layout=(1, 0),
                                       teacher_token_layout=(0, 2))
    assert loss.item() == pytest.approx(mean_square(s[:, 1:], t[:, :3]), rel=1e-5)


def test_feature_mse_weight_and_sum_reduction():
    s = [_randn(2, 3, seed=7), _randn(2, 3, seed=8)]
    t = [_randn(2, 3, seed=9), _randn(2, 3, seed=10)]
    want = 0.5 * (mean_square(s[0], t[0]) + mean_square(s[1], t[1]))
    assert FeatureMSELoss(loss_weight=0.5, reduction='sum')(s, t).item() == pytest.approx(
        want, rel=1e-5)


def test_feature_mse_names_its_reduction_argument():
    with pytest.raises(ValueError, match="^reduction must be 'mean' or 'sum'"):
        FeatureMSELoss(reduction='max')


@pytest.mark.parametrize('cls', [AttentionOutputMSELoss, FeatureMSELoss,
                                 NormalizedAttentionOutputMSELoss])
def test_no_gradient_reaches_the_teacher(cls):
    s = _randn(1, 3, 2, seed=11).requires_grad_()
    t = _randn(1, 3, 2, seed=12).requires_grad_()
    loss = cls()(s, t)
    assert loss.requires_grad
    loss.backward()
    assert t.grad is None
    assert s.grad is not None and s.grad.abs().sum() > 0


def test_default_pair_loss_of_token_records_mse_keeps_the_teacher_out_of_the_graph():
    s = _randn(1, 3, 2, seed=13).requires_grad_()
    t = _randn(1, 3, 2, seed=14).requires_grad_()
    token_records_mse(s, t, False, (0, 0), (0, 0), 'mean', 'x').backward()
    assert t.grad is None


def test_normalized_mse_default_eps_is_negligible_for_a_small_teacher():
    """``eps = 1e-8`` by default: with a teacher mean square of 1e-4 the value is the relative
    squared error to 1e-4 (``eps = 1e-3`` would make it 11x smaller)."""
    t = torch.full((1, 2, 2), 0.01)
    s = torch.zeros(1, 2, 2)
    got = NormalizedAttentionOutputMSELoss()(s, t).item()
    assert got == pytest.approx(1e-4 / (1e-4 + 1e-8), rel=1e-5)


def test_shape_error_hints():
    """Equal widths but other token counts hint at ``patch_tokens_only`` (unless it is already
    set); other widths hint at a connector."""
    with pytest.raises(ValueError, match=r'\(1, 3, 2\).*\(1, 4, 2\); the token counts '
                                         r'differ: set patch_tokens_only=True'):
        FeatureMSELoss()(torch.zeros(1, 3, 2), torch.zeros(1, 4, 2))
    with pytest.raises(ValueError) as info:
        FeatureMSELoss(patch_tokens_only=True)(torch.zeros(1, 3, 2), torch.zeros(1, 4, 2))
    assert 'patch_tokens_only' not in str(info.value) and 'connector' not in str(info.value)
    with pytest.raises(ValueError, match=r'\(1, 3, 2\).*\(1, 3, 4\); the widths differ: add '
                                         r'a connector'):
        AttentionOutputMSELoss()(torch.zeros(1, 3, 2), torch.zeros(1, 3, 4))


# ------------------------------------------------------------------ activation matching
def test_activation_matching_defaults_mean_over_stages_and_visible_tokens():
    """Default ``stage_reduction='mean'`` and ``visible_only=True`` (the mask is honoured)."""
    s = [_randn(2, 4, 3, seed=20), _randn(2, 4, 3, seed=21)]
    t = [_randn(2, 4, 5, seed=22), _randn(2, 4, 5, seed=23)]
    mask = torch.tensor([[False, True, False, False], [True, False, False, True]])
    visible = ~mask
    want = (activation_stage_reference(s[0], t[0], visible)
            + activation_stage_reference(s[1], t[1], visible)) / 2
    got = ActivationMatchingLoss()(s, t, patch_mask=mask)
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_activation_matching_without_visible_only_uses_every_token():
    s, t = _randn(2, 4, 3, seed=24), _randn(2, 4, 3, seed=25)
    mask = torch.tensor([[False, True, False, False], [True, False, False, True]])
    want = activation_stage_reference(s, t, torch.ones(2, 4, dtype=torch.bool))
    got = ActivationMatchingLoss(visible_only=False)(s, t, patch_mask=mask)
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_activation_matching_refuses_a_mask_of_another_shape():
    with pytest.raises(ValueError, match=r'patch_mask has shape \(2, 3\) but the records '
                                         r'have \(2, 4\)'):
        ActivationMatchingLoss()(torch.randn(2, 4, 3), torch.randn(2, 4, 3),
                                 patch_mask=torch.zeros(2, 3, dtype=torch.bool))


# ------------------------------------------------------------------ masked prediction
def test_masked_prediction_default_beta_is_one():
    """Differences 0.5 and 1.5 (on either side of beta = 1) and 3.0 (beyond beta = 2)."""
    s = torch.tensor([[[0.5, 1.5], [3.0, 0.0]]])
    t = torch.zeros(1, 2, 2)
    mask = torch.tensor([[True, True]])
    want = sum(smooth_l1(d, 1.0) for d in (0.5, 1.5, 3.0, 0.0)) / 4
    assert MaskedPredictionLoss()(s, t, mask).item() == pytest.approx(want, rel=1e-6)


def test_masked_prediction_needs_a_mask_of_the_patch_shape():
    s, t = torch.zeros(2, 3, 2), torch.zeros(2, 3, 2)
    with pytest.raises(ValueError, match='needs a patch_mask'):
        MaskedPredictionLoss()(s, t, None)
    with pytest.raises(ValueError, match=r'patch_mask has shape \(2, 2\) but the features '
                                         r'have \(2, 3\)'):
        MaskedPredictionLoss()(s, t, torch.ones(2, 2, dtype=torch.bool))


def test_masked_prediction_token_count_mismatch_does_not_suggest_a_connector():
    with pytest.raises(ValueError) as info:
        MaskedPredictionLoss()(torch.zeros(1, 2, 3), torch.zeros(1, 3, 3),
                               torch.tensor([[True, False]]))
    assert 'connector' not in str(info.value)


def test_masked_prediction_without_masked_patches_is_a_differentiable_zero():
    """A batch with no masked patch costs 0 (not NaN, the mean of nothing) and still backs
    up (zero gradients) like any other step."""
    s = _randn(2, 3, 2, seed=30).requires_grad_()
    loss = MaskedPredictionLoss(loss_weight=3.0)(s, torch.zeros(2, 3, 2),
                                                 torch.zeros(2, 3, dtype=torch.bool))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(s.grad, torch.zeros(2, 3, 2))


# ------------------------------------------------------------------ token utils
def test_token_layouts_must_be_pairs_of_non_negative_counts():
    assert check_layout((0, 0), 'x') == (0, 0)
    for bad in ((1, 0, 0), (1, ), (-1, 0)):
        with pytest.raises(ValueError, match='num_prefix_tokens, num_suffix_tokens'):
            check_layout(bad, 'x')


def test_patch_tokens_refuses_records_that_are_not_tokens():
    with pytest.raises(ValueError, match=r'must be \(B, N, C\) tokens, got shape \(4, 3\)'):
        patch_tokens(torch.zeros(4, 3), (1, 0), 'rec')
    # one patch token left is enough
    assert patch_tokens(torch.zeros(1, 3, 2), (1, 1), 'rec').shape == (1, 1, 2)


def test_records_must_be_tensors():
    with pytest.raises(TypeError, match='non-empty sequence of tensors, got list'):
        record_pairs([torch.zeros(1), 1.0], [torch.zeros(1), torch.zeros(1)], 'x')
    with pytest.raises(TypeError, match='non-empty sequence of tensors'):
        record_pairs([], [], 'x')


def test_batch_size_mismatch_is_named():
    with pytest.raises(ValueError, match=r'student shape \(2, 3\) does not match teacher '
                                         r'shape \(1, 3\)'):
        check_same_shape(torch.zeros(2, 3), torch.zeros(1, 3), 'x')


def test_sum_over_records():
    values = [torch.tensor(1.5), torch.tensor(2.0), torch.tensor(4.0)]
    assert reduce_over_records(values, 'sum').item() == 7.5
    assert reduce_over_records(values, 'mean').item() == pytest.approx(2.5)


def test_activation_matching_applies_its_loss_weight():
    """``loss_weight`` multiplies L_act (``DistillLossBase.weighted``), also summed over stages."""
    s, t = _randn(1, 4, 3, seed=26), _randn(1, 4, 3, seed=27)
    one = activation_stage_reference(s, t, torch.ones(1, 4, dtype=torch.bool))
    assert ActivationMatchingLoss(loss_weight=3.0)(s, t).item() == pytest.approx(
        3.0 * one, rel=1e-5)
    assert ActivationMatchingLoss(loss_weight=0.5, stage_reduction='sum')(
        [s, s], [t, t]).item() == pytest.approx(0.5 * 2 * one, rel=1e-5)


# ------------------------------------------------------------------ ops
def test_hedgehog_feature_of_half_inputs_is_float32():
    """phi(x) = [softmax(x W), softmax(-x W)] is computed in float32 from 16-bit inputs."""
    from mmlinvit.ops.feature_maps import hedgehog_feature
    x = _randn(1, 2, 3, 4, seed=40).half()
    w = _randn(2, 4, 5, seed=41).half()
    logits = torch.einsum('bhnd,hdf->bhnf', x.double(), w.double())
    want = torch.cat([logits.softmax(-1), (-logits).softmax(-1)], dim=-1)
    got = hedgehog_feature(x, w)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_unknown_feature_map_lists_the_registered_names():
    from mmlinvit.ops.feature_maps import get_feature_map
    with pytest.raises(ValueError, match=r"Unknown feature map 'gelu'; available: "
                                         r"\['elu', 'identity', 'relu'\]"):
        get_feature_map('gelu')
    assert get_feature_map('relu')(torch.tensor([-2.0, 3.0])).tolist() == [0.0, 3.0]


@pytest.mark.parametrize('channels_last', [False, True])
def test_causal_conv_captured_form_with_bias_equals_left_padded_conv1d(monkeypatch,
                                                                      channels_last):
    """The captured-graph form (ONNX / export) against ``F.conv1d`` on x padded by K - 1 on the
    left, with a bias, in both layouts."""
    from mmlinvit.ops import causal_conv
    monkeypatch.setattr(causal_conv, 'capturing_graph', lambda: True)
    x = _randn(2, 3, 7, seed=42)  # (batch, C, L)
    weight, bias = _randn(3, 1, 4, seed=43), _randn(3, seed=44)
    want = F.conv1d(F.pad(x, (3, 0)), weight, bias, groups=3)
    inp = x.transpose(1, 2).contiguous() if channels_last else x
    got = causal_conv.causal_depthwise_conv1d(inp, weight, bias, channels_last=channels_last)
    torch.testing.assert_close(got.transpose(1, 2) if channels_last else got, want)


# ------------------------------------------------------------------ ExportStudentHook
class _Backbone(nn.Module):
    """A model that is its own student backbone (``named_modules`` names it '')."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def student_backbone(self) -> nn.Module:
        return self


class _Distill(nn.Module):

    def __init__(self) -> None:
        super().__init__()
        self.student = nn.Linear(2, 3)
        self.teacher = nn.Linear(2, 3)

    def student_backbone(self) -> nn.Module:
        return self.student


def test_export_of_a_model_that_is_its_own_backbone(tmp_path):
    from mmlinvit.engine.hooks.export_student_hook import ExportStudentHook
    model = _Backbone()
    runner = types.SimpleNamespace(model=model, work_dir=str(tmp_path))
    ExportStudentHook().before_save_checkpoint(
        runner, dict(meta=dict(epoch=1, iter=4), state_dict=model.state_dict()))
    exported = torch.load(tmp_path / 'student_backbone.pth', weights_only=True)
    assert sorted(exported) == ['fc.bias', 'fc.weight']


def test_exported_state_holds_copies_of_the_checkpoint_tensors():
    """"CPU copies": editing the export does not edit the checkpoint being saved."""
    from mmlinvit.engine.hooks.export_student_hook import student_backbone_state
    model = _Distill()
    state_dict = model.state_dict()
    before = state_dict['student.weight'].clone()
    state = student_backbone_state(model, state_dict)
    state['weight'].add_(1.0)
    assert torch.equal(state_dict['student.weight'], before)


def test_export_refuses_a_model_without_a_student(tmp_path):
    from mmlinvit.engine.hooks.export_student_hook import ExportStudentHook
    runner = types.SimpleNamespace(model=nn.Linear(2, 2), work_dir=str(tmp_path))
    with pytest.raises(TypeError, match='needs a mmlinvit.DistillationModel, the runner '
                                        'trains a Linear'):
        ExportStudentHook().before_save_checkpoint(
            runner, dict(meta=dict(epoch=1, iter=1), state_dict={}))


def _ordered(*hooks) -> List[str]:
    """The hook order mmengine's ``Runner.register_hook`` gives (registration order within a
    priority)."""
    from mmengine.runner import Runner
    holder = types.SimpleNamespace(_hooks=[])
    for hook in hooks:
        Runner.register_hook(holder, hook)
    return [type(h).__name__ for h in holder._hooks]


def test_export_runs_after_ema_and_sync_before_checkpoint_in_a_runner():
    """Custom hooks are registered after the default ``CheckpointHook``: the statistics must
    be averaged before it writes; the export must follow ``EMAHook``'s swap even when listed
    first."""
    from mmengine.hooks import CheckpointHook, EMAHook
    from mmlinvit.engine.hooks.export_student_hook import ExportStudentHook
    from mmlinvit.engine.hooks.sync_norm_stats_hook import SyncNormStatsHook
    order = _ordered(CheckpointHook(), ExportStudentHook(), EMAHook(), SyncNormStatsHook())
    assert order.index('SyncNormStatsHook') < order.index('CheckpointHook')
    assert order.index('EMAHook') < order.index('ExportStudentHook')


# ------------------------------------------------------------------ SyncNormStatsHook
def test_sync_lists_each_buffer_once_per_run(monkeypatch):
    """A second ``before_train`` (a second ``runner.train()``) rebuilds the list: every
    floating BN buffer is reduced once."""
    from mmlinvit.engine.hooks import sync_norm_stats_hook
    calls: List[List[torch.Tensor]] = []
    monkeypatch.setattr(sync_norm_stats_hook, 'is_distributed', lambda: True)
    monkeypatch.setattr(sync_norm_stats_hook, 'all_reduce_params',
                        lambda params, op='sum': calls.append(list(params)))
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    runner = types.SimpleNamespace(model=model, hooks=[])
    hook = sync_norm_stats_hook.SyncNormStatsHook()
    hook.before_train(runner)
    hook.before_train(runner)
    hook.before_val_epoch(runner)
    assert [sorted(map(id, c)) for c in calls] == [
        sorted(map(id, [model[1].running_mean, model[1].running_var]))]


# ------------------------------------------------------------------ FrozenAware constructor
def test_frozen_summary_is_sorted_by_name_and_matches_mmengines_groups():
    """Against mmengine's ``DefaultOptimWrapperConstructor``: the same parameter groups (no
    frozen parameter in the optimizer); the summary lists the parts in name order whatever
    the module order."""
    from mmengine.optim import DefaultOptimWrapperConstructor
    from mmlinvit.engine.optimizers import FrozenAwareOptimWrapperConstructor
    model = nn.Module()
    model.zeta = nn.Linear(2, 2)
    model.alpha = nn.Linear(2, 2)
    model.mid = nn.Linear(2, 2)
    model.zeta.requires_grad_(False)
    model.alpha.requires_grad_(False)
    cfg = dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1, weight_decay=0.01))
    paramwise = dict(bias_decay_mult=0.0)
    theirs = DefaultOptimWrapperConstructor(dict(cfg), dict(paramwise))(model)
    with captured_log(logging.INFO) as messages:
        ours = FrozenAwareOptimWrapperConstructor(dict(cfg), dict(paramwise))(model)

    def ids(wrapper) -> List[List[int]]:
        return [[id(p) for p in g['params']] for g in wrapper.optimizer.param_groups]

    assert ids(ours) == ids(theirs) == [[id(model.mid.weight)], [id(model.mid.bias)]]
    assert [m for m in messages if m.startswith('Not optimised')] == [
        'Not optimised (requires_grad=False): 4 parameter tensors of alpha (2), zeta (2)']


# ------------------------------------------------------------------ findings of round 15
def test_finding_batch_size_mismatch_gets_no_token_count_hint():
    """FINDING (fails on the code before the round-15 fix): records of the same token count
    and width but another batch size were told "the token counts differ: set
    patch_tokens_only=True", which sends the user the wrong way."""
    with pytest.raises(ValueError) as info:
        FeatureMSELoss()(torch.zeros(2, 3, 4), torch.zeros(1, 3, 4))
    message = str(info.value)
    assert 'student shape (2, 3, 4) does not match teacher shape (1, 3, 4)' in message
    assert 'token counts differ' not in message and 'patch_tokens_only' not in message


def test_finding_test_time_interval_below_one_is_refused_when_built():
    """FINDING (fails on the code before the round-15 fix): ``tools/test.py --show-dir D
    --interval 0`` built the hook and then stopped the test run at its first batch with
    ``ZeroDivisionError: integer modulo by zero`` (``--interval -2`` drew every sample).
    mmengine's ``every_n_inner_iters`` never fires for n <= 0; the hook now refuses such an
    interval when it is built, naming it."""
    from mmengine.visualization import Visualizer
    from mmlinvit.engine.hooks.seg_visualization_hook import SegVisualizationHook
    Visualizer.get_instance('round15_seg_visualization')
    for bad in (0, -2):
        with pytest.raises(ValueError,
                           match=f'interval must be a positive integer.*--interval N.*got {bad}'):
            SegVisualizationHook(draw=True, interval=bad)
    assert SegVisualizationHook(draw=True, interval=2).interval == 2
