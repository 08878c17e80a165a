"""Mutation round 17: the distillation losses and ``LinearConnector``, second pass.

Each test here fails on a one-line change of the code under test that rounds 8, 11 and 15
let through.  References are independent of the code under test: formulas written out in
float64 Python, hand-computed values, or the real mmpretrain / torch behaviour run here.

Guarded:

* ``ActivationMatchingLoss`` / ``MaskedPredictionLoss`` read a 0/1 *integer* patch mask (what
  mmpretrain's ``SimMIMMaskGenerator`` emits) as a boolean mask, not as indices or bit
  patterns.
* ``AttentionMapLoss``: the (B, heads, N, N) shape checks of ``patch_tokens_only``, a layout
  that leaves no patch token, the KL form on maps with exact zeros (ReLU linear attention),
  signed *teacher* maps refused, rows renormalised only after special tokens are dropped,
  the default ``eps``, unknown modes, the teacher kept out of the graph.
* ``token_records_mse`` / ``reduce_over_records`` / ``record_pairs`` / ``check_layout``:
  error paths (unknown reduction, more teacher than student records, layouts that are not
  pairs, tuples of records), hint selection, the loss name in messages.
* ``NormalizedAttentionOutputMSELoss``: ``eps = 0`` refused, defaults.
* ``LinearConnector``: argument checks and the width check of each record.
"""
import math
from typing import List, Sequence

import numpy as np
import pytest
import torch

from mmlinvit.distill.losses import (ActivationMatchingLoss, AttentionMapLoss,
                                     AttentionOutputMSELoss, FeatureMSELoss,
                                     MaskedPredictionLoss, NormalizedAttentionOutputMSELoss,
                                     token_records_mse)
from mmlinvit.distill.losses.token_utils import (check_layout, check_same_shape,
                                                 record_pairs, reduce_over_records)


# ---------------------------------------------------------------- float64 references
def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _cos(u: Sequence[float], v: Sequence[float]) -> float:
    dot = sum(a * b for a, b in zip(u, v))
    return dot / (math.sqrt(sum(a * a for a in u)) * math.sqrt(sum(b * b for b in v)))


def _unit(values: List[float]) -> List[float]:
    norm = math.sqrt(sum(v * v for v in values))
    return [v / norm for v in values]


def activation_reference(student: torch.Tensor, teacher: torch.Tensor,
                         visible: Sequence[Sequence[bool]]) -> float:
    """ViT-Linearizer L_act of one stage: per image, 1 - <A_t(i, :), A_s(i, :)> averaged over
    its visible rows i, A(i, j) = cos(f_i, f_j) over visible j, rows l2-normalised; then the
    mean over the images."""
    s, t = student.double().tolist(), teacher.double().tolist()
    per_image = []
    for b in range(len(s)):
        keep = [j for j in range(len(s[b])) if visible[b][j]]
        rows = []
        for i in keep:
            a_s = _unit([_cos(s[b][i], s[b][j]) for j in keep])
            a_t = _unit([_cos(t[b][i], t[b][j]) for j in keep])
            rows.append(1.0 - sum(p * q for p, q in zip(a_s, a_t)))
        per_image.append(sum(rows) / len(rows))
    return sum(per_image) / len(per_image)


def smooth_l1(d: float, beta: float) -> float:
    """Smooth L1 of one difference (Fast R-CNN / ``torch.nn.SmoothL1Loss``)."""
    d = abs(d)
    return 0.5 * d * d / beta if d < beta else d - 0.5 * beta


@pytest.fixture
def simmim_mask() -> torch.Tensor:
    """Two flattened (16,) 0/1 int masks from mmpretrain's ``SimMIMMaskGenerator`` (it draws
    from numpy's global generator; its state is restored afterwards)."""
    from mmpretrain.datasets.transforms.processing import SimMIMMaskGenerator
    state = np.random.get_state()
    try:
        np.random.seed(3)
        gen = SimMIMMaskGenerator(input_size=32, mask_patch_size=8, model_patch_size=8,
                                  mask_ratio=0.5)
        masks = [gen.transform({})['mask'].reshape(-1) for _ in range(2)]
    finally:
        np.random.set_state(state)
    mask = torch.from_numpy(np.stack(masks))
    assert mask.dtype != torch.bool and set(mask.unique().tolist()) == {0, 1}
    return mask


# ---------------------------------------------------------------- integer masks
def test_activation_matching_reads_an_integer_mask_as_booleans(simmim_mask: torch.Tensor):
    """A 0/1 int mask (1 = masked) selects the same visible tokens as the bool mask: ``~`` of
    an int tensor is a bitwise not (-1 / -2), which must not weight the maps."""
    student, teacher = _randn(2, 16, 3, seed=1), _randn(2, 16, 5, seed=2)
    visible = (simmim_mask == 0).tolist()
    want = activation_reference(student, teacher, visible)
    got = ActivationMatchingLoss()(student, teacher, patch_mask=simmim_mask)
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_masked_prediction_reads_an_integer_mask_as_booleans(simmim_mask: torch.Tensor):
    """With an int mask, ``s[mask]`` would gather tokens 0 and 1 by index instead of selecting
    the masked patches."""
    student, teacher = _randn(2, 16, 3, seed=3), _randn(2, 16, 3, seed=4)
    diffs = [float(student[b, i, c] - teacher[b, i, c])
             for b in range(2) for i in range(16) if simmim_mask[b, i] == 1 for c in range(3)]
    want = sum(smooth_l1(d, 1.0) for d in diffs) / len(diffs)
    got = MaskedPredictionLoss()(student, teacher, simmim_mask)
    assert got.item() == pytest.approx(want, rel=1e-5)


# ---------------------------------------------------------------- attention maps
def _softmax_maps(*shape: int, seed: int) -> torch.Tensor:
    return _randn(*shape, seed=seed).softmax(-1)


def test_attention_map_patch_block_needs_a_patch_token():
    """Layout (1, 1) on 2 tokens leaves an empty block (the MSE of nothing is NaN): refused."""
    maps = _softmax_maps(1, 1, 2, 2, seed=5)
    loss = AttentionMapLoss(patch_tokens_only=True)
    with pytest.raises(ValueError, match='2 tokens, not more than its 1 prefix \\+ 1 suffix'):
        loss(maps, maps, student_token_layout=(1, 1), teacher_token_layout=(0, 0))
    # one patch token left is enough: the 1 x 1 blocks are compared
    maps3 = _softmax_maps(1, 1, 3, 3, seed=6)
    other = _softmax_maps(1, 1, 3, 3, seed=7)
    got = loss(maps3, other, student_token_layout=(1, 1), teacher_token_layout=(1, 1))
    assert got.item() == pytest.approx((float(maps3[0, 0, 1, 1]) - float(other[0, 0, 1, 1])) ** 2,
                                       rel=1e-5)


@pytest.mark.parametrize('shape', [(1, 4, 4), (1, 1, 3, 4), (1, 1, 1, 4, 4)])
def test_attention_map_patch_block_needs_square_4d_maps(shape: Sequence[int]):
    """(B, N, N) without heads, non-square and 5-D maps are named, not silently sliced."""
    maps = torch.full(shape, 0.25)
    with pytest.raises(ValueError, match=r'must be \(B, heads, N, N\) attention maps, got shape '
                                         + re_shape(shape)):
        AttentionMapLoss(patch_tokens_only=True)(maps, maps, student_token_layout=(1, 0),
                                                 teacher_token_layout=(1, 0))


def re_shape(shape: Sequence[int]) -> str:
    """The regex of ``tuple(shape)`` as printed."""
    return '\\(' + ', '.join(str(n) for n in shape) + '\\)'


def test_attention_map_kl_of_maps_with_exact_zeros():
    """ReLU linear attention has exact zeros: they are valid (not "signed"), a zero teacher
    entry adds 0 (0 log 0 = 0) and a zero student entry costs t log(t / eps)."""
    teacher = torch.tensor([[[[0.5, 0.5, 0.0], [0.0, 0.25, 0.75]]]])
    student = torch.tensor([[[[0.25, 0.25, 0.5], [0.5, 0.5, 0.0]]]])
    eps = 1e-8
    row0 = 0.5 * math.log(0.5 / 0.25) * 2
    row1 = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / eps)
    got = AttentionMapLoss(mode='kl')(student, teacher)
    assert math.isfinite(got.item())
    assert got.item() == pytest.approx((row0 + row1) / 2, rel=1e-5)


def test_attention_map_kl_default_eps_is_1e_8():
    """The clamp of a zero student entry is 1e-8 by default (hand computation), and ``eps``
    is the argument's value when given."""
    teacher = torch.tensor([[[[1.0, 0.0]]]])
    student = torch.tensor([[[[0.0, 1.0]]]])
    assert AttentionMapLoss(mode='kl')(student, teacher).item() == pytest.approx(
        math.log(1 / 1e-8), rel=1e-5)
    assert AttentionMapLoss(mode='kl', eps=1e-3)(student, teacher).item() == pytest.approx(
        math.log(1 / 1e-3), rel=1e-5)


def test_attention_map_kl_refuses_a_signed_teacher_map():
    student = torch.full((1, 1, 2, 2), 0.5)
    signed = torch.tensor([[[[1.5, -0.5], [0.5, 0.5]]]])
    with pytest.raises(ValueError, match="block 0: the teacher map has negative entries"):
        AttentionMapLoss(mode='kl')(student, signed)
    with pytest.raises(ValueError, match="block 1: the student map has negative entries"):
        AttentionMapLoss(mode='kl')([student, signed], [student, student])


def test_attention_map_kl_keeps_full_rows_as_given():
    """Without ``patch_tokens_only`` the rows are used as recorded (no renormalisation): rows
    summing to 0.8 give sum_j t_j log(t_j / s_j) of the given entries."""
    teacher = torch.tensor([[[[0.4, 0.4], [0.2, 0.6]]]])
    student = torch.tensor([[[[0.6, 0.2], [0.4, 0.4]]]])
    want = (0.4 * math.log(0.4 / 0.6) + 0.4 * math.log(0.4 / 0.2)
            + 0.2 * math.log(0.2 / 0.4) + 0.6 * math.log(0.6 / 0.4)) / 2
    got = AttentionMapLoss(mode='kl')(student, teacher)
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_attention_map_unknown_mode_is_refused():
    with pytest.raises(ValueError, match=r"Unknown mode 'ce'; available: \('mse', 'kl'\)"):
        AttentionMapLoss(mode='ce')


def test_attention_map_kl_patch_row_without_patch_mass():
    """A student row whose whole mass sits on the class token has an all-zero patch row: its
    sum is clamped to eps (0 / 0 would be NaN), so it stays zero and costs
    sum_j t_j log(t_j / eps) against the renormalised teacher row (0.5, 0.5)."""
    teacher = torch.tensor([[[[0.2, 0.4, 0.4], [0.5, 0.25, 0.25], [0.2, 0.2, 0.6]]]])
    student = torch.tensor([[[[0.5, 0.25, 0.25], [1.0, 0.0, 0.0], [0.2, 0.4, 0.4]]]])
    eps = 1e-8
    # patch rows: teacher (.5, .5), (.25, .75); student (0, 0) -> clamped, (.5, .5)
    row0 = 2 * 0.5 * math.log(0.5 / eps)
    row1 = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    got = AttentionMapLoss(mode='kl', patch_tokens_only=True)(
        student, teacher, student_token_layout=(1, 0), teacher_token_layout=(1, 0))
    assert got.item() == pytest.approx((row0 + row1) / 2, rel=1e-5)



def test_attention_map_kl_teacher_patch_row_without_patch_mass_costs_nothing():
    """A teacher row attending only to its class token has an all-zero patch row: clamped
    (not 0 / 0), it stays zero and adds 0 log 0 = 0 whatever the student row is."""
    teacher = torch.tensor([[[[0.2, 0.4, 0.4], [1.0, 0.0, 0.0], [0.2, 0.2, 0.6]]]])
    student = torch.tensor([[[[0.5, 0.25, 0.25], [0.2, 0.6, 0.2], [0.2, 0.4, 0.4]]]])
    # patch rows: teacher (0, 0), (.25, .75); student (.75, .25), (.5, .5)
    row1 = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    got = AttentionMapLoss(mode='kl', patch_tokens_only=True)(
        student, teacher, student_token_layout=(1, 0), teacher_token_layout=(1, 0))
    assert got.item() == pytest.approx((0.0 + row1) / 2, rel=1e-5)

def test_attention_map_defaults_compare_every_entry_averaged_over_blocks():
    """Defaults: ``mode='mse'``, ``patch_tokens_only=False`` (the class row / column given
    in the layouts still count) and the mean over blocks."""
    s = [_softmax_maps(2, 2, 3, 3, seed=8), _softmax_maps(2, 2, 3, 3, seed=9)]
    t = [_softmax_maps(2, 2, 3, 3, seed=10), _softmax_maps(2, 2, 3, 3, seed=11)]
    per_block = [sum((a - b) ** 2 for a, b in zip(si.flatten().tolist(), ti.flatten().tolist()))
                 / si.numel() for si, ti in zip(s, t)]
    got = AttentionMapLoss()(s, t, student_token_layout=(1, 0), teacher_token_layout=(1, 0))
    assert got.item() == pytest.approx(sum(per_block) / 2, rel=1e-5)


def test_attention_map_patch_blocks_use_each_sides_layout():
    """Student without special tokens, teacher with a class token first (MHLA vs DeiT)."""
    student = _softmax_maps(1, 2, 2, 2, seed=12)
    teacher = _softmax_maps(1, 2, 3, 3, seed=13)
    want = sum((a - b) ** 2 for a, b in zip(student.flatten().tolist(),
                                             teacher[..., 1:, 1:].flatten().tolist())) / 8
    got = AttentionMapLoss(patch_tokens_only=True)(student, teacher, student_token_layout=(0, 0),
                                                   teacher_token_layout=(1, 0))
    assert got.item() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize('mode', ['mse', 'kl'])
def test_attention_map_gradient_reaches_the_student_only(mode: str):
    student = _softmax_maps(1, 1, 3, 3, seed=14).requires_grad_()
    teacher = _softmax_maps(1, 1, 3, 3, seed=15).requires_grad_()
    AttentionMapLoss(mode=mode)(student, teacher).backward()
    assert teacher.grad is None
    assert student.grad is not None and student.grad.abs().sum() > 0


# ---------------------------------------------------------------- token bookkeeping
def test_more_teacher_records_than_student_records_are_refused():
    """``zip`` would silently drop the extra teacher block: the counts must be equal both
    ways."""
    a, b = torch.zeros(1, 2, 2), torch.ones(1, 2, 2)
    with pytest.raises(ValueError, match='the student provides 1 records but the teacher 2'):
        record_pairs([a], [a, b], 'x')
    with pytest.raises(ValueError, match='the student provides 1 records but the teacher 2'):
        AttentionOutputMSELoss()(a, [a, b])


def test_tuples_of_records_are_paired_in_order():
    """A tuple of per-block records is as good as a list (student i with teacher i)."""
    s = (torch.zeros(1, 1, 2), torch.ones(1, 1, 2))
    t = (torch.zeros(1, 1, 2), torch.full((1, 1, 2), 3.0))
    # block 0: 0; block 1: (3 - 1)^2 = 4; sum 4
    assert FeatureMSELoss(reduction='sum')(s, t).item() == pytest.approx(4.0)
    pairs = record_pairs(s, t, 'x')
    assert all(ps is s[i] and pt is t[i] for i, (ps, pt) in enumerate(pairs))


def test_token_records_mse_refuses_an_unknown_reduction():
    """The function (used without a loss module) checks its reduction itself."""
    s = torch.zeros(1, 2, 2)
    with pytest.raises(ValueError, match=r"Unknown reduction 'max'; use 'mean' or 'sum'"):
        token_records_mse(s, s, False, (0, 0), (0, 0), 'max', 'x')
    with pytest.raises(ValueError, match='Unknown reduction'):
        reduce_over_records([torch.tensor(1.0)], 'none')


def test_layouts_are_read_prefix_first():
    assert check_layout((2, 1), 'x') == (2, 1)
    assert check_layout([0, 3], 'x') == (0, 3)


def test_shape_errors_name_the_loss_and_the_record():
    with pytest.raises(ValueError, match=r'^FeatureMSELoss record 1: student shape'):
        FeatureMSELoss()([torch.zeros(1, 2), torch.zeros(1, 2)],
                         [torch.zeros(1, 2), torch.zeros(1, 3, 2)])
    with pytest.raises(ValueError, match=r'^NormalizedAttentionOutputMSELoss record 0'):
        NormalizedAttentionOutputMSELoss()(torch.zeros(1, 2, 2), torch.zeros(1, 2, 3))


def test_type_errors_name_the_forward_argument():
    """The message names the argument of the loss's ``forward`` that got a non-tensor."""
    with pytest.raises(TypeError, match='^teacher_maps must be a tensor'):
        AttentionMapLoss()(torch.zeros(1, 1, 2, 2), 'maps')
    with pytest.raises(TypeError, match='^student_feats must be a tensor'):
        ActivationMatchingLoss()([], torch.zeros(1, 2, 2))


def test_width_hint_only_for_records_of_the_same_rank():
    """A connector cannot fix records of another rank: no width hint there."""
    with pytest.raises(ValueError) as info:
        FeatureMSELoss()(torch.zeros(2, 3, 4), torch.zeros(2, 5))
    assert 'connector' not in str(info.value)
    assert str(info.value).endswith('does not match teacher shape (2, 5)')


def test_token_count_hint_only_when_the_widths_agree():
    """Other widths *and* other token counts: the first thing to fix is the width
    (patch_tokens_only alone cannot make the shapes match)."""
    with pytest.raises(ValueError, match='the widths differ: add a connector') as info:
        FeatureMSELoss()(torch.zeros(1, 3, 2), torch.zeros(1, 4, 5))
    assert 'patch_tokens_only' not in str(info.value)


def test_check_same_shape_without_hint_adds_nothing():
    with pytest.raises(ValueError) as info:
        check_same_shape(torch.zeros(1, 2), torch.zeros(1, 3), 'x')
    assert str(info.value) == 'x: student shape (1, 2) does not match teacher shape (1, 3)'


# ---------------------------------------------------------------- normalised MSE defaults
def test_normalized_loss_defaults_every_token_and_mean_over_blocks():
    """Defaults: ``patch_tokens_only=False`` (the class token, named in the layouts, counts)
    and the mean over blocks of mean((s - t)^2) / (mean(t^2) + 1e-8)."""
    s = [_randn(1, 3, 2, seed=20), _randn(1, 3, 2, seed=21)]
    t = [_randn(1, 3, 2, seed=22), _randn(1, 3, 2, seed=23)]

    def block(si: torch.Tensor, ti: torch.Tensor) -> float:
        a, b = si.double().flatten().tolist(), ti.double().flatten().tolist()
        num = sum((x - y) ** 2 for x, y in zip(a, b)) / len(a)
        return num / (sum(y * y for y in b) / len(b) + 1e-8)

    want = (block(s[0], t[0]) + block(s[1], t[1])) / 2
    got = NormalizedAttentionOutputMSELoss()(s, t, student_token_layout=(1, 0),
                                              teacher_token_layout=(1, 0))
    assert got.item() == pytest.approx(want, rel=1e-5)


# ---------------------------------------------------------------- connector
def test_linear_connector_names_a_non_integer_student_width():
    from mmlinvit.models.distill import LinearConnector
    with pytest.raises(TypeError, match=r'integer in_channels \(student width\).*16\.0'):
        LinearConnector(16.0, 24)
    connector = LinearConnector(16, 24)
    assert (connector.in_channels, connector.out_channels) == (16, 24)
    assert connector(torch.zeros(2, 3, 16)).shape == (2, 3, 24)


# ---------------------------------------------------------------- findings
def test_finding_masked_prediction_names_a_list_of_records():
    """FINDING (fails on the code before the round-17 fix in ``token_utils.patch_tokens``):
    ``MaskedPredictionLoss`` compares one record; a per-stage list (a multi-block recorder
    mapped by mistake) raised ``AttributeError: 'list' object has no attribute 'ndim'``,
    which the DistillationModel's build-time dry run does not turn into a
    ``DistillationConfigError`` naming the record shapes."""
    mask = torch.tensor([[True, False]])
    with pytest.raises(TypeError, match='^student_feats must be one \\(B, N, C\\) token '
                                        'tensor, got list'):
        MaskedPredictionLoss()([torch.zeros(1, 2, 3)] * 2, torch.zeros(1, 2, 3), mask)
    with pytest.raises(TypeError, match='^teacher_feats must be one'):
        MaskedPredictionLoss()(torch.zeros(1, 2, 3), (torch.zeros(1, 2, 3), ), mask)


def test_finding_list_record_for_masked_prediction_is_a_config_error_at_build():
    """FINDING (same fix): the dry run of ``DistillationModel`` names the term and the shapes
    (``2 x (1, 17, 24)``) instead of failing with an AttributeError."""
    from mmlinvit.models.distill import DistillationConfigError
    from mmlinvit.registry import MODELS
    from distill_testing import IMG_SIZE, PATCH, tiny_arch

    def vit(attn: str, width: int) -> dict:
        return dict(type='mmlinvit.VisionTransformer', arch=tiny_arch(embed_dims=width),
                    patch_size=PATCH, img_size=IMG_SIZE, attn_cfg=attn, out_type='raw')

    layouts = dict(student_token_layout='context.student_token_layout',
                   teacher_token_layout='context.teacher_token_layout')
    cfg = dict(
        type='mmlinvit.DistillationModel', student=vit('elu', 16), teacher=vit('softmax', 24),
        student_recorders=dict(stages=dict(type='ModuleOutputs', source='blocks.{i}')),
        teacher_recorders=dict(stages=dict(type='ModuleOutputs', source='blocks.{i}')),
        patch_masking=dict(ratio=0.5, seed=1),
        connectors=dict(proj=dict(type='mmlinvit.LinearConnector', in_channels=16,
                                  out_channels=24)),
        distill_losses=dict(mask=dict(
            loss=dict(type='mmlinvit.MaskedPredictionLoss'),
            inputs=dict(student_feats=dict(source='student.stages', connector='proj'),
                        teacher_feats='teacher.stages', patch_mask='context.patch_mask',
                        **layouts))))
    with pytest.raises(DistillationConfigError,
                       match=r"distill term 'mask' \(MaskedPredictionLoss\) does not fit.*"
                             r"student_feats <- student.stages via connector 'proj': 2 x"):
        MODELS.build(cfg)
