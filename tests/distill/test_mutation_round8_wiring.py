"""Distillation wiring (mutation round 8): which recorded features reach which loss argument.

Guarded here, each against values taken by hooks of the test's own (not the recorders) or by
hand:

* every argument of every term receives the right tensor: the student's / teacher's block
  outputs in block order, the student's final norm output passed through the connector
  (``x W^T + b`` by hand), the patch mask the student was masked with this step, and the token
  layouts of each side (the teacher has register tokens, so the two differ);
* the patch-mask step counter advances once per training step and never in eval mode, and the
  student's masks are those of ``(seed, step)``;
* the build-time dry run exercises the masked student forward, not the plain one;
* the teacher is in eval mode from the build on and runs without autograd (no graph is kept
  for it), the student with it;
* a teacher-forcing model without distillation terms still runs the teacher that feeds it;
* records are forgotten and recording stops after each step (a later forward through the
  same modules records nothing);
* a configured ``context.<key>`` with a connector is refused; a backbone's
  ``num_suffix_tokens`` is read into its token layout;
* recorders leave no hook behind when attaching fails half-way, and re-attaching to another
  model removes the hooks on the first one.
"""
from types import SimpleNamespace
from typing import Any, Dict, List

import pytest
import torch
import torch.nn as nn
from mmengine.registry import DefaultScope

from mmlinvit.distill import ModuleOutputsRecorder
from mmlinvit.distill.patch_masking import PatchMasking, sample_patch_mask
from mmlinvit.distill.recorders import AttentionMapsRecorder
from mmlinvit.models.distill import DistillationConfigError
from mmlinvit.models.distill.input_specs import token_layout
from mmlinvit.registry import MODELS

from distill_testing import IMG_SIZE, PATCH
from test_distillation_model import linearizer_model, vit

GRID = IMG_SIZE // PATCH
RATIO = 0.75
SEED = 7
#: The teacher's register tokens make its layout differ from the student's (1, 0).
TEACHER_REGS = 2


@pytest.fixture(autouse=True)
def _mmpretrain_scope():
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


def _masked_cfg(**overrides: Any) -> dict:
    """A Linearizer-like model (:func:`test_distillation_model.linearizer_model`: masked
    student, wider teacher, a connector) whose teacher has register tokens."""
    cfg = linearizer_model(teacher=vit('softmax', width=24, num_reg_tokens=TEACHER_REGS),
                           patch_masking=dict(ratio=RATIO, seed=SEED))
    cfg.update(overrides)
    return cfg


def _images(seed: int, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, IMG_SIZE, IMG_SIZE, generator=torch.Generator().manual_seed(seed))


def _expected_mask(batch: int, step: int) -> torch.Tensor:
    return sample_patch_mask(batch, GRID * GRID, RATIO, SEED, step, 0)


class _Spy:
    """Own hooks on the student / teacher modules, the loss inputs and the masked forward."""

    def __init__(self, model: nn.Module) -> None:
        self.outputs: Dict[str, List[torch.Tensor]] = {}
        self.loss_kwargs: Dict[str, dict] = {}
        self.student_masks: List[torch.Tensor] = []
        for side in ('student', 'teacher'):
            backbone = getattr(model, side)
            for i, block in enumerate(backbone.blocks):
                block.register_forward_hook(self._keep(f'{side}.blocks.{i}'))
            backbone.norm.register_forward_hook(self._keep(f'{side}.norm'))
        for term, loss in model.distill_losses.items():
            loss.register_forward_pre_hook(self._keep_kwargs(term), with_kwargs=True)
        masking = model.patch_masking
        original = masking.forward_student

        def forward_student(student, inputs, patch_mask, mask_token):
            self.student_masks.append(patch_mask)
            return original(student, inputs, patch_mask, mask_token)

        masking.forward_student = forward_student

    def _keep(self, name: str):

        def hook(module, args, output):
            self.outputs.setdefault(name, []).append(output)

        return hook

    def _keep_kwargs(self, term: str):

        def hook(module, args, kwargs):
            self.loss_kwargs[term] = dict(kwargs)

        return hook

    def last(self, name: str) -> torch.Tensor:
        return self.outputs[name][-1]


# ---------------------------------------------------------------- what each argument receives
def test_every_loss_argument_receives_its_own_record():
    """Block outputs in block order, side by side; the connector on the student's final
    features only; this step's mask; each side's token layout."""
    model = MODELS.build(_masked_cfg())
    model.train()
    spy = _Spy(model)
    x = _images(0)
    model.loss(x)
    act, mask = spy.loss_kwargs['act'], spy.loss_kwargs['mask']
    depth = len(model.student.blocks)
    assert depth == 2 and len(act['student_feats']) == depth
    assert len(act['teacher_feats']) == depth
    for i in range(depth):
        assert torch.equal(act['student_feats'][i], spy.last(f'student.blocks.{i}'))
        assert torch.equal(act['teacher_feats'][i], spy.last(f'teacher.blocks.{i}'))
    assert act['student_feats'][0].shape[1] == 1 + GRID * GRID
    assert act['teacher_feats'][0].shape[1] == 1 + TEACHER_REGS + GRID * GRID
    # the connector maps the student's final features to the teacher's width: x W^T + b
    linear = model.connectors.proj.linear
    final = spy.last('student.norm')
    torch.testing.assert_close(mask['student_feats'], final @ linear.weight.T + linear.bias)
    assert torch.equal(mask['teacher_feats'], spy.last('teacher.norm'))
    # the mask the student was masked with, the one of (seed, step 0)
    assert len(spy.student_masks) == 1
    for kwargs in (act, mask):
        assert torch.equal(kwargs['patch_mask'], spy.student_masks[0])
        assert torch.equal(kwargs['patch_mask'], _expected_mask(2, 0))
        assert tuple(kwargs['student_token_layout']) == (1, 0)
        assert tuple(kwargs['teacher_token_layout']) == (1 + TEACHER_REGS, 0)


def test_records_come_from_this_steps_forward():
    """The second step's loss reads the second batch's records, not the first one's."""
    model = MODELS.build(_masked_cfg())
    model.train()
    spy = _Spy(model)
    model.loss(_images(0))
    model.loss(_images(1))
    act = spy.loss_kwargs['act']
    assert torch.equal(act['student_feats'][1], spy.outputs['student.blocks.1'][1])
    assert torch.equal(act['teacher_feats'][0], spy.outputs['teacher.blocks.0'][1])
    assert not torch.equal(spy.outputs['teacher.blocks.0'][0], spy.outputs['teacher.blocks.0'][1])


# ---------------------------------------------------------------- patch-mask steps
def test_mask_step_advances_in_training_only():
    """Train steps draw the masks of steps 0, 1 and move the counter; eval steps draw the
    current step's masks and leave it."""
    model = MODELS.build(_masked_cfg())
    spy = _Spy(model)
    x = _images(0)
    model.train()
    for step in (0, 1):
        model.loss(x)
        assert torch.equal(spy.student_masks[-1], _expected_mask(2, step))
        assert int(model.mask_step) == step + 1
    model.eval()
    for _ in range(2):
        model.loss(x)
        assert torch.equal(spy.student_masks[-1], _expected_mask(2, 2))
        assert int(model.mask_step) == 2
    assert not torch.equal(_expected_mask(2, 1), _expected_mask(2, 2))  # control


def test_dry_run_runs_the_masked_student(monkeypatch):
    """The build-time check runs the student as training will: through the masked forward,
    with one image's mask of step 0, leaving the counter at 0."""
    calls = []
    original = PatchMasking.forward_student

    def spy(self, student, inputs, patch_mask, mask_token):
        calls.append(patch_mask)
        return original(self, student, inputs, patch_mask, mask_token)

    monkeypatch.setattr(PatchMasking, 'forward_student', spy)
    model = MODELS.build(_masked_cfg())
    assert len(calls) == 1
    assert torch.equal(calls[0], _expected_mask(1, 0))
    assert int(model.mask_step) == 0


# ---------------------------------------------------------------- teacher
def test_teacher_runs_without_autograd_and_the_student_with_it():
    """No graph is built for the frozen teacher (memory); the student's forward keeps one."""
    model = MODELS.build(_masked_cfg())
    model.train()
    grad_enabled = {}

    def note(side: str):

        def hook(module, args, output) -> None:
            grad_enabled[side] = torch.is_grad_enabled()

        return hook

    for side in ('student', 'teacher'):
        getattr(model, side).blocks[0].register_forward_hook(note(side))
    model.loss(_images(0))
    assert grad_enabled == dict(student=True, teacher=False)


def test_teacher_is_frozen_in_eval_mode_from_the_build_on():
    """Without terms there is no build-time dry run (whose end sets the modes): the teacher,
    here only the source of the weight transfer, is still built in eval mode."""
    cfg = dict(type='mmlinvit.DistillationModel', student=vit('elu'), teacher=vit('softmax'),
               weight_transfer=dict(type='mlp_copy'))
    model = MODELS.build(cfg)
    assert model.student.training and not model.teacher.training
    assert not any(p.requires_grad for p in model.teacher.parameters())


def test_teacher_forcing_without_terms_still_runs_the_teacher():
    """Teacher forcing alone (no distillation term) feeds each student attention the
    teacher's block input, so the teacher must run in every step."""
    cfg = dict(type='mmlinvit.DistillationModel', student=vit('elu'), teacher=vit('softmax'),
               teacher_recorders=dict(block_in=dict(type='ModuleInputs', source='blocks.{i}')),
               teacher_forcing=dict(input_recorder='block_in', blocks='blocks'),
               trainable_params=['blocks.*.attn.*'])
    model = MODELS.build(cfg)
    model.train()
    seen = {}

    def note(name: str):

        def hook(module, args) -> None:
            seen[name] = args[0]

        return hook

    model.teacher.blocks[1].register_forward_pre_hook(note('teacher'))
    model.student.blocks[1].attn.register_forward_pre_hook(note('student'))
    assert model.loss(_images(0)) == {}
    torch.testing.assert_close(seen['student'], model.student.blocks[1].norm1(seen['teacher']))


# ---------------------------------------------------------------- recording window
def test_records_are_forgotten_after_the_step():
    """Nothing recorded in a step (tensors holding the step's graph) outlives it."""
    model = MODELS.build(_masked_cfg())
    model.train()
    model.loss(_images(0))
    for rec in [*model.student_recorders.values(), *model.teacher_recorders.values()]:
        with pytest.raises(RuntimeError, match='did not run'):
            rec.get()


def test_plain_forwards_after_a_step_record_nothing():
    """Inference through the same modules after a training step stores no record."""
    model = MODELS.build(_masked_cfg())
    model.train()
    model.loss(_images(0))
    model.eval()
    with torch.no_grad():
        model(_images(1), mode='tensor')
        model.teacher(_images(1))
    for rec in [*model.student_recorders.values(), *model.teacher_recorders.values()]:
        with pytest.raises(RuntimeError, match='did not run'):
            rec.get()


# ---------------------------------------------------------------- specs and layouts
def test_a_context_entry_with_a_connector_is_refused():
    cfg = _masked_cfg()
    cfg['distill_losses']['act']['inputs']['patch_mask'] = dict(source='context.patch_mask',
                                                                connector='proj')
    with pytest.raises(DistillationConfigError, match='context entries take no connector'):
        MODELS.build(cfg)


def test_token_layout_reads_prefix_and_suffix_counts():
    assert token_layout(None, SimpleNamespace(num_prefix_tokens=1, num_suffix_tokens=2)) == (1, 2)
    assert token_layout(None, SimpleNamespace(num_prefix_tokens=3)) == (3, 0)
    assert token_layout(None, SimpleNamespace()) is None
    assert token_layout((0, 1), SimpleNamespace(num_prefix_tokens=1)) == (0, 1)


# ---------------------------------------------------------------- recorder hooks
class _Attn(nn.Module):
    """An attention stand-in; only some have an explicit map."""

    def __init__(self, has_map: bool) -> None:
        super().__init__()
        if has_map:
            self.attention_map = lambda x: x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class _Blocks(nn.Module):

    def __init__(self, has_maps: List[bool]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Attn(m) for m in has_maps])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_failed_attach_leaves_no_hook():
    """Block 0 has a map, block 1 none: the refused recorder removes block 0's hook too."""
    model = _Blocks([True, False])
    with pytest.raises(DistillationConfigError, match='no explicit attention map'):
        AttentionMapsRecorder('blocks.{i}').attach(model)
    assert _hooks(model) == 0


def test_reattaching_moves_the_hooks_to_the_new_model():
    first, second = _Blocks([True, True]), _Blocks([True, True])
    rec = ModuleOutputsRecorder('blocks.{i}').attach(first)
    assert _hooks(first) == 2
    with rec.attach(second):
        assert _hooks(first) == 0
        x = torch.ones(1, 2)
        second(x)
        first(x * 5)  # the old model's modules record nothing any more
        torch.testing.assert_close(rec.get(), [x * 2, x * 4])
    assert _hooks(second) == 0
