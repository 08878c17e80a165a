"""Mutation round 15: distillation terms, CLIP input statistics, patch masking, teacher
forcing and the Impulse initialisation, on branches the rest of the suite let through.

Each test below failed on at least one single-line change of its module that every other test
passed.  Guarded here, each against an expectation written by hand in the test:

* :mod:`mmlinvit.models.distill.terms`: a term config without ``loss`` is the named config
  error (not a ``KeyError``); a patch-token loss that takes only ``student_token_layout`` is not
  asked for the ``teacher_token_layout`` it cannot take; :func:`describe_value` /
  :func:`describe_inputs` (the shapes in the dry-run message, ``'?'`` for a record whose
  resolution raises a ``RuntimeError`` / ``TypeError``);
* :mod:`mmlinvit.models.distill.clip_input_stats`: the CLIP-teacher warning names OpenAI CLIP's
  mean and std (openai/CLIP ``_transform``), not the std twice;
* :mod:`mmlinvit.distill.patch_masking`: a negative seed refused, seeds taken modulo 2**64, a
  ``forward_tokens`` without ``mask_token`` and a backbone without ``embed_dims`` refused, an
  empty grid;
* :mod:`mmlinvit.distill.teacher_forcing`: a student without ``num_prefix_tokens``, the patch
  size of a task-model teacher's backbone, what ``forward_attn`` receives by default (the
  corner-padded grid, the prefix tokens, ``with_layer_scale=False``);
* :mod:`mmlinvit.transfer.impulse`: the cache file name of a cross-entropy bank (no
  ``fit_loss`` entry in its key), Haar-distributed head rotations (sign-fixed QR), the reported
  worst peak fraction, the documented defaults, the fit's N(0, 1/C) starting weights, LN(P)
  with the blocks' ``norm1`` epsilon.
"""
import hashlib
import json
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn as nn

from mmlinvit.distill.patch_masking import PatchMasking, sample_patch_mask
from mmlinvit.distill.recorders import ModuleInputsRecorder
from mmlinvit.distill.teacher_forcing import TeacherForcing
from mmlinvit.models.distill import DistillationConfigError
from mmlinvit.models.distill import clip_input_stats as cis
from mmlinvit.models.distill.input_specs import InputSpec
from mmlinvit.models.distill.terms import (build_term, compute_terms, describe_inputs,
                                           describe_value)

#: OpenAI CLIP ``Normalize`` statistics (openai/CLIP ``clip/clip.py`` ``_transform``), 0-1 units.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _accept(term: str, spec: InputSpec) -> InputSpec:
    """A ``check_spec`` that accepts every spec."""
    return spec


# ------------------------------------------------------------------------------- terms


class _StudentLayoutOnlyLoss(nn.Module):
    """A patch-token loss that locates the student's patches only (the teacher has none)."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_tokens_only = True

    def forward(self, pred: torch.Tensor, target: torch.Tensor,
                student_token_layout: Tuple[int, int] = (0, 0)) -> torch.Tensor:
        return (pred - target).square().mean()


class _RaisingLoss(nn.Module):
    """A loss that refuses its inputs with the given exception type."""

    def __init__(self, error: type = ValueError) -> None:
        super().__init__()
        self.error = error

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise self.error('shapes do not fit')


def test_a_term_without_a_loss_is_a_named_config_error():
    """``dict(inputs=...)`` alone: the config error showing the expected form, not a KeyError."""
    with pytest.raises(DistillationConfigError, match=r'must be dict\(loss=<loss config>'):
        build_term('feat', dict(inputs=dict(pred='student.feat')), _accept)


def test_only_the_layouts_a_patch_token_loss_takes_are_required():
    """``patch_tokens_only=True`` with only ``student_token_layout`` in ``forward``: mapping it
    is enough; a missing ``teacher_token_layout`` the loss cannot take is not asked for."""
    loss, specs = build_term(
        'feat', dict(loss=dict(type=_StudentLayoutOnlyLoss),
                     inputs=dict(pred='student.feat', target='teacher.feat',
                                 student_token_layout='context.student_token_layout')), _accept)
    assert isinstance(loss, _StudentLayoutOnlyLoss)
    assert [s.arg for s in specs] == ['pred', 'target', 'student_token_layout']
    with pytest.raises(DistillationConfigError, match=r"\['student_token_layout'\] are not mapped"):
        build_term('feat', dict(loss=dict(type=_StudentLayoutOnlyLoss),
                                inputs=dict(pred='student.feat', target='teacher.feat')), _accept)


def test_describe_value_of_tensors_and_lists():
    """A tensor by its full shape; a list by its length and its one shape, or all its shapes."""
    assert describe_value(torch.zeros(2, 5, 8)) == '(2, 5, 8)'
    assert describe_value([torch.zeros(2, 3), torch.zeros(2, 3)]) == '2 x (2, 3)'
    assert describe_value([torch.zeros(2, 3), torch.zeros(1)]) == '2 x [(1,), (2, 3)]'
    assert describe_value((1, 0)) == '(1, 0)'


@pytest.mark.parametrize('error', [ValueError, RuntimeError, TypeError])
def test_describe_inputs_shows_a_question_mark_for_an_unreadable_record(error: type):
    """A record whose resolution raises (a module that did not run, a bad connector) is '?'."""
    specs = [InputSpec('pred', 'student', 'feat'), InputSpec('target', 'teacher', 'feat')]

    def resolve(spec: InputSpec) -> torch.Tensor:
        if spec.side == 'teacher':
            raise error('not recorded')
        return torch.zeros(2, 4)

    assert describe_inputs(specs, resolve) == ('pred <- student.feat: (2, 4); '
                                               'target <- teacher.feat: ?')


def test_a_value_error_of_a_loss_in_the_dry_run_names_the_shapes():
    """In the build-time dry run a loss's ValueError (e.g. a width check) becomes the config
    error naming the term, the input size and the shapes; in training it propagates as is."""
    specs = [InputSpec('pred', 'student', 'feat'), InputSpec('target', 'teacher', 'feat')]
    records = dict(student=torch.zeros(2, 3), teacher=torch.zeros(2, 5))
    with pytest.raises(DistillationConfigError) as info:
        compute_terms(dict(feat=_RaisingLoss(ValueError)), dict(feat=specs), dict(feat=1.0),
                      lambda s: records[s.side], dry_run_size=(16, 16))
    assert 'input size (16, 16)' in str(info.value)
    assert 'pred <- student.feat: (2, 3); target <- teacher.feat: (2, 5)' in str(info.value)
    with pytest.raises(ValueError) as info:
        compute_terms(dict(feat=_RaisingLoss(ValueError)), dict(feat=specs), dict(feat=1.0),
                      lambda s: records[s.side])
    assert type(info.value) is ValueError


# ----------------------------------------------------------------- teacher input statistics


def test_the_clip_teacher_warning_shows_the_statistics_seen_and_clips(warnings_logged):
    """The warning names the statistics the teacher would see (4 decimals) and CLIP's own."""
    teacher = SimpleNamespace(family='clip')
    assert cis.warn_clip_teacher_without_clip_stats(
        teacher, dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]), None)
    text = ' '.join(warnings_logged)
    assert 'mean [123.675, 116.28, 103.53], std [58.395, 57.12, 57.375]' in text
    assert (f'(mean {list(CLIP_MEAN)}, std {list(CLIP_STD)} for 0-1 pixels)') in text


# ------------------------------------------------------------------------------ patch masking


class _MaskableStudent(nn.Module):
    """A stand-in backbone with the masked forward the component needs."""

    patch_size = 4
    embed_dims = 8

    def __init__(self, mask_token: Optional[nn.Parameter] = None) -> None:
        super().__init__()
        self.mask_token = mask_token
        self.calls: List[Dict[str, Any]] = []

    def forward_tokens(self, x: torch.Tensor, patch_mask: Optional[torch.Tensor] = None,
                       mask_token: Optional[torch.Tensor] = None) -> None:
        self.calls.append(dict(patch_mask=patch_mask, mask_token=mask_token))


def test_a_negative_mask_seed_is_refused():
    with pytest.raises(DistillationConfigError, match='seed must be >= 0'):
        PatchMasking(seed=-1)


def test_the_student_must_take_the_mask_token_and_have_a_width():
    """A forward_tokens without ``mask_token``, or a backbone without ``embed_dims``."""

    class _NoToken(nn.Module):
        patch_size, embed_dims = 4, 8

        def forward_tokens(self, x: torch.Tensor, patch_mask: torch.Tensor) -> None:
            pass

    class _NoWidth(nn.Module):
        patch_size = 4

        def forward_tokens(self, x: torch.Tensor, patch_mask: torch.Tensor,
                           mask_token: torch.Tensor) -> None:
            pass

    with pytest.raises(DistillationConfigError, match='forward_tokens'):
        PatchMasking(seed=0).check(_NoToken())
    with pytest.raises(DistillationConfigError, match="attribute 'embed_dims'"):
        PatchMasking(seed=0).check(_NoWidth())


def test_an_empty_grid_draws_an_empty_mask():
    """No patch at all: nothing to mask and nothing refused (the check is for N > 0)."""
    assert sample_patch_mask(2, 0, 0.75, seed=0, step=0).shape == (2, 0)


# ---------------------------------------------------------------------------- teacher forcing


class _ForcedBlock(nn.Module):
    """A block whose attention branch records its arguments (or fails)."""

    def __init__(self, error: Optional[Exception] = None) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.error = error
        self.calls: List[Tuple[Tuple[int, int], int, bool]] = []

    def forward_attn(self, x: torch.Tensor, hw_shape: Tuple[int, int], num_prefix_tokens: int,
                     with_layer_scale: bool = False) -> torch.Tensor:
        if self.error is not None:
            raise self.error
        self.calls.append((tuple(hw_shape), num_prefix_tokens, with_layer_scale))
        return x


class _ForcedStudent(nn.Module):
    """A bare-backbone stand-in with ``blocks.{i}.forward_attn``."""

    patch_size = 4
    embed_dims = 2

    def __init__(self, depth: int = 2, num_prefix_tokens: int = 1,
                 error: Optional[Exception] = None, with_cp: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_ForcedBlock(error) for _ in range(depth))
        self.num_prefix_tokens = num_prefix_tokens
        self.with_cp = with_cp


def _block_input_recorder(depth: int = 2) -> SimpleNamespace:
    """What the teacher's ``ModuleInputs`` recorder on ``blocks.{i}`` holds after a forward."""
    inputs = [torch.zeros(1, 6, 2) for _ in range(depth)]
    return SimpleNamespace(indices=list(range(depth)), get=lambda where=None: inputs)


def _check_forcing(student: nn.Module, teacher: nn.Module) -> None:
    """``TeacherForcing.check`` with a ``ModuleInputs`` recorder on the teacher's blocks."""
    source = 'backbone.blocks.{i}' if hasattr(teacher, 'backbone') else 'blocks.{i}'
    recorder = ModuleInputsRecorder(source)
    recorder.attach(teacher)
    TeacherForcing('block_in').check(student, teacher, dict(block_in=recorder))


def test_a_student_without_num_prefix_tokens_is_refused():
    student = _ForcedStudent()
    del student.num_prefix_tokens
    with pytest.raises(DistillationConfigError, match="attribute 'num_prefix_tokens'"):
        _check_forcing(student, _ForcedStudent())


def test_forward_attn_gets_the_corner_padded_grid_and_the_prefix_tokens():
    """An 18 x 18 batch with 4-pixel patches: the corner-padded grid is ceil(18 / 4) = 5 per
    side; the prefix-token count is the student's; LayerScale off by default."""
    student = _ForcedStudent(num_prefix_tokens=1)
    TeacherForcing('block_in').forward_student(student, _block_input_recorder(),
                                               torch.zeros(1, 3, 18, 14))
    assert [b.calls for b in student.blocks] == [[((5, 4), 1, False)]] * 2


# --------------------------------------------------------------------------- Mimetic / Impulse


def _impulse_pair(embed_dims: int = 16, num_heads: int = 2,
                  num_layers: int = 2) -> Tuple[nn.Module, nn.Module]:
    """A student Impulse accepts (no prefix token, sin-cos positions, average pooling, 2 x 2
    grid) and a softmax teacher of the same shape."""
    from mmlinvit.backbones import VisionTransformer
    arch = dict(embed_dims=embed_dims, num_layers=num_layers, num_heads=num_heads,
                mlp_hidden_dims=2 * embed_dims)
    common = dict(img_size=8, patch_size=4)
    student = VisionTransformer(arch, attn_cfg='softmax', with_cls_token=False,
                                pos_embed_type='sincos', out_type='avg_featmap', **common)
    return student, VisionTransformer(arch, **common)


def test_impulse_cache_file_name_of_a_cross_entropy_bank(tmp_path):
    """The cache key: SHA-256 of the sorted-key JSON of the fit's shapes and options (no
    ``fit_loss`` entry for the default cross-entropy fit, so banks cached before that option
    keep their names; ``fit_loss='mse'`` adds it), then the fp32 bytes of LN(P)."""
    from mmlinvit.transfer.impulse import _FIT_VERSION, load_or_fit_impulse_bank
    tokens = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))

    def expected(**extra: Any) -> str:
        meta = dict(version=_FIT_VERSION, shape=[4, 8], grid=[2, 2], head_dims=4, window=3,
                    steps=2, lr=0.01, seed=5, **extra)
        digest = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
        digest.update(tokens.numpy().tobytes())
        return str(tmp_path / f'impulse_{digest.hexdigest()[:24]}.pt')

    bank = load_or_fit_impulse_bank(tokens, (2, 2), 4, 3, 2, 0.01, 5, str(tmp_path))
    assert bank['cache_file'] == expected()
    mse = load_or_fit_impulse_bank(tokens, (2, 2), 4, 3, 2, 0.01, 5, str(tmp_path), 'mse')
    assert mse['cache_file'] == expected(fit_loss='mse')


def test_a_cached_impulse_bank_is_read_back_as_a_hit(tmp_path):
    from mmlinvit.transfer.impulse import load_or_fit_impulse_bank
    tokens = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    first = load_or_fit_impulse_bank(tokens, (2, 2), 4, 3, 2, 0.01, 0, str(tmp_path))
    second = load_or_fit_impulse_bank(tokens, (2, 2), 4, 3, 2, 0.01, 0, str(tmp_path))
    assert (first['cache_hit'], second['cache_hit']) == (False, True)
    assert second['cache_file'] == first['cache_file']
    assert torch.equal(second['wq'], first['wq']) and torch.equal(second['wk'], first['wk'])


def test_impulse_head_rotations_are_haar_distributed():
    """A Haar-random orthogonal matrix has E[Q_00] = 0 (Q and -Q are equally likely; Mezzadri
    2007: QR of a Gaussian matrix needs R's diagonal made positive).  Without that sign fix,
    LAPACK's Householder QR gives Q_00 = -|a_00| / |a_0| < 0 every time."""
    from mmlinvit.transfer.impulse import _random_orthogonal
    gen = torch.Generator().manual_seed(0)
    draws = [_random_orthogonal(4, gen) for _ in range(400)]
    for q in draws[:3]:
        torch.testing.assert_close(q @ q.T, torch.eye(4, dtype=torch.float64))
    corner = torch.tensor([float(q[0, 0]) for q in draws])
    # the sample mean of 400 values of variance 1 / 4 has std 0.025
    assert abs(float(corner.mean())) < 0.1
    assert 0.3 < float((corner > 0).double().mean()) < 0.7


def test_impulse_reports_the_smallest_peak_fraction_of_its_bank(monkeypatch):
    """``fit_peak_fraction_min`` is the worst shift's peak fraction, not the best's."""
    import mmlinvit.transfer.impulse as impulse
    from mmlinvit.transfer import transfer_weights
    student, teacher = _impulse_pair()
    shifts = impulse.impulse_shifts(3)
    bank = dict(wq=torch.randn(9, 16, 8), wk=torch.randn(9, 16, 8), loss=0.5,
                peak=[1.0, 0.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5], shifts=shifts,
                cache_file=None, cache_hit=False)
    monkeypatch.setattr(impulse, 'load_or_fit_impulse_bank', lambda *args, **kwargs: bank)
    report = transfer_weights(student, teacher, 'impulse', seed=0, use_cache=False)
    assert report.details['fit_peak_fraction_min'] == 0.25


def test_impulse_defaults():
    """The documented defaults: a 3 x 3 window, 200 Adam steps at lr 1e-2 with the
    cross-entropy fit, one per-head draw shared by every layer (the public code's
    ``init_once=True``) and the cache under ``~/.cache/mmlinvit/impulse``; at least one step."""
    import os
    from mmlinvit.transfer.impulse import ImpulseInit
    init = ImpulseInit()
    assert (init.window, init.steps, init.lr, init.fit_loss, init.share_across_layers) == (
        3, 200, 1e-2, 'cross_entropy', True)
    assert init.cache_dir == os.path.join(os.path.expanduser('~'), '.cache', 'mmlinvit',
                                          'impulse')
    assert ImpulseInit(use_cache=False).cache_dir is None
    with pytest.raises(ValueError, match='steps must be positive'):
        ImpulseInit(steps=0)


def test_the_impulse_fit_starts_from_weights_of_std_one_over_sqrt_c():
    """Before any step the bank is N(0, 1 / C) (C = 64 here, head width 4): then ``t W`` has
    unit-variance entries for LN-normalised tokens (``|t|^2 = C``)."""
    from mmlinvit.transfer.impulse import fit_impulse_bank
    tokens = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    bank = fit_impulse_bank(tokens, (2, 2), 4, [(0, 0)] * 8, steps=0, lr=0.0, seed=0)
    for key in ('wq', 'wk'):
        assert float(bank[key].std()) == pytest.approx(1 / 8, rel=0.1), key


def test_impulse_position_tokens_use_the_blocks_norm_eps():
    """LN(P) is the blocks' ``norm1`` at initialisation: with ``norm_eps=1`` the tokens are
    ``(P - mean) / sqrt(var + 1)``, not the default-eps LayerNorm."""
    from mmlinvit.backbones import VisionTransformer
    from mmlinvit.transfer.impulse import ImpulseInit
    arch = dict(embed_dims=16, num_layers=1, num_heads=2, mlp_hidden_dims=32)
    student = VisionTransformer(arch, attn_cfg='softmax', with_cls_token=False,
                                pos_embed_type='sincos', out_type='avg_featmap', img_size=8,
                                patch_size=4, norm_eps=1.0)
    pos = student.patch_pos_embed(tuple(student.pos_grid), torch.device('cpu'),
                                  torch.float32)[0].double()
    mean = pos.mean(-1, keepdim=True)
    var = (pos - mean).square().mean(-1, keepdim=True)
    expected = (pos - mean) / torch.sqrt(var + 1.0)
    tokens = ImpulseInit(use_cache=False).position_tokens(student)
    torch.testing.assert_close(tokens.double(), expected, rtol=1e-5, atol=1e-6)


def test_count_blocks_refuses_a_path_without_a_placeholder():
    """``count_blocks(model, 'blocks.0')`` found the same module for every i and never
    returned (the teacher-forcing build then hung instead of naming the template)."""
    import torch.nn as nn
    from mmlinvit.distill.teacher_forcing import count_blocks
    model = nn.Module()
    model.blocks = nn.ModuleList([nn.Identity(), nn.Identity()])
    assert count_blocks(model, 'blocks.{i}') == 2
    with pytest.raises(ValueError, match=r"placeholder .*got 'blocks.0'"):
        count_blocks(model, 'blocks.0')
