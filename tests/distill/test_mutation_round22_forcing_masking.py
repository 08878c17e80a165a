"""Teacher forcing, patch masking, recorders and the teacher input normalisation on branches
that the rest of the suite let pass (mutation round 22): each test below failed on at least
one single-line change of its module that no other test caught.

Guarded here, each against an independent reference (the signature of the student backbone,
numpy's ``SeedSequence`` written out in the test, mmpretrain's ``ResNet`` layout and
``ClsDataPreprocessor``, values by hand):

* :mod:`mmlinvit.distill.teacher_forcing`: a student without a ``with_cp`` attribute is not
  checkpointed (``with_cp`` is opt-in); the fixes the refusals give are real: the
  ``--cfg-options`` keys of the prefix-token refusal are arguments of
  ``mmlinvit.VisionTransformer`` with the teacher's-token values, the single-module refusal
  names the ``'<blocks>.{i}'`` template and ``indices``;
* :mod:`mmlinvit.distill.patch_masking`: ``mask_stream_seed`` without ``rank`` is rank 0's
  stream;
* :mod:`mmlinvit.distill.recorders`: a template over stages numbered from 1 (ResNet's
  ``layer1`` .. ``layer4``) is refused naming ``layer0``, with or without ``indices``; a
  detached recorder cannot be entered (it would record nothing); an ``arg_index`` recorder
  that is off ignores the arguments; attention maps can be read twice;
* :mod:`mmlinvit.models.distill.teacher_input_norm`: a mean of exactly 1 is in 0-1 units.
"""
import numpy as np
import pytest
import torch
import torch.nn as nn

import mmlinvit.distill.teacher_forcing as tf_module
from mmlinvit.distill import (AttentionMapsRecorder, DistillationConfigError,
                              ModuleInputsRecorder, ModuleOutputsRecorder, TeacherForcing)
from mmlinvit.distill.patch_masking import MASK_STREAM_TAG, mask_stream_seed

from call_spy import CallSpy
from teacher_forcing_toys import ToyBackbone

pytestmark = pytest.mark.usefixtures('one_thread')


# ------------------------------------------------------------------------- teacher forcing
def test_a_student_without_a_with_cp_switch_is_not_checkpointed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``with_cp`` is opt-in (mmpretrain's and timm's backbones default to ``False``): a
    student backbone that has no ``with_cp`` attribute runs its forced attention plainly, once
    per block."""
    spy = CallSpy(tf_module.checkpoint)
    monkeypatch.setattr(tf_module, 'checkpoint', spy)
    student, teacher = ToyBackbone(2), ToyBackbone(2)
    del student.with_cp
    forcing = TeacherForcing('block_in')
    with ModuleInputsRecorder('blocks.{i}').attach(teacher) as block_in:
        forcing.check(student, teacher, dict(block_in=block_in))
        with torch.no_grad():
            teacher(torch.randn(2, 5, 4))
        student.train()
        forcing.forward_student(student, block_in, torch.zeros(2, 3, 32, 32))
    assert spy.calls == []
    assert [len(blk.calls) for blk in student.blocks] == [1, 1]


def test_the_prefix_token_refusal_suggests_real_student_options() -> None:
    """The fix the message gives is a ``--cfg-options`` line: every key it sets must be an
    argument of the student backbone (``mmlinvit.VisionTransformer``, read from its
    signature), with the values that give the teacher's tokens."""
    import inspect
    import re

    from mmlinvit.backbones import VisionTransformer
    student, teacher = ToyBackbone(2, num_prefix_tokens=0), ToyBackbone(2, num_prefix_tokens=5)
    with ModuleInputsRecorder('blocks.{i}').attach(teacher) as block_in:
        with pytest.raises(DistillationConfigError) as err:
            TeacherForcing('block_in').check(student, teacher, dict(block_in=block_in))
    options = dict(re.findall(r'model\.student\.(\w+)=(\S+)', str(err.value)))
    assert options == {'with_cls_token': 'True', 'num_reg_tokens': "<teacher's>",
                       'pos_embed_type': 'learned', 'check_operator_setting': 'False'}
    assert set(options) <= set(inspect.signature(VisionTransformer.__init__).parameters)


def test_the_single_module_refusal_gives_the_template_to_use() -> None:
    """The message of a plain ``'blocks.1'`` input recorder names the template form (with the
    block container placeholder) and the ``indices`` option, which the check accepts."""
    student, teacher = ToyBackbone(2), ToyBackbone(2)
    with ModuleInputsRecorder('blocks.1').attach(teacher) as block_in:
        with pytest.raises(DistillationConfigError) as err:
            TeacherForcing('block_in').check(student, teacher, dict(block_in=block_in))
    assert "Use source='<blocks>.{i}' (add indices=[...] to force only some blocks)" in str(
        err.value)
    with ModuleInputsRecorder('blocks.{i}', indices=[1]).attach(teacher) as block_in:
        TeacherForcing('block_in').check(student, teacher, dict(block_in=block_in))


# ------------------------------------------------------------------------- patch masking
def _seed_sequence_word(seed: int, step: int, rank: int) -> int:
    """The documented stream seed, written out with numpy: the first 64-bit word of
    ``SeedSequence(seed, spawn_key=('mask' tag, step, rank))``."""
    sequence = np.random.SeedSequence(seed, spawn_key=(0x6D61736B, step, rank))
    return int(sequence.generate_state(1, np.uint64)[0])


def test_mask_stream_seed_defaults_to_rank_0() -> None:
    """A single-process caller leaves ``rank`` out: it gets rank 0's stream."""
    assert MASK_STREAM_TAG == 0x6D61736B
    for seed, step in ((0, 0), (7, 3)):
        assert mask_stream_seed(seed, step) == _seed_sequence_word(seed, step, 0)
        assert mask_stream_seed(seed, step) != _seed_sequence_word(seed, step, 1)



# ------------------------------------------------------------------------- recorders
def test_a_stage_list_numbered_from_1_is_refused_naming_its_missing_stage_0() -> None:
    """Template records pair with blocks by position from block 0.  mmpretrain's ResNet
    numbers its stages ``layer1`` .. ``layer4``: a ``'layer{i}'`` template finds no
    ``layer0`` and is refused naming it, also with ``indices=[1]`` (not silently shifted by
    one); a plain path records a stage."""
    from mmpretrain.models import ResNet
    model = ResNet(depth=18, stem_channels=8, base_channels=8)
    assert [name for name, _ in model.named_children() if name.startswith('layer')] == [
        'layer1', 'layer2', 'layer3', 'layer4']
    for indices in (None, [1]):
        with pytest.raises(DistillationConfigError,
                           match=r"no module matches 'layer\{i\}' in ResNet \(first missing: "
                                 r"'layer0'\)"):
            ModuleOutputsRecorder('layer{i}', indices=indices).attach(model)
    assert ModuleOutputsRecorder('layer1').attach(model).paths == ['layer1']


def test_a_detached_recorder_cannot_be_entered_again() -> None:
    """``detach`` removes the hooks: entering the recorder afterwards would record nothing, so
    it is refused with the fix, as for a recorder never attached; attached again, it records."""
    model = ToyBackbone(2)
    rec = ModuleOutputsRecorder('blocks.{i}').attach(model)
    rec.detach()
    with pytest.raises(RuntimeError, match=r"recorder 'blocks.\{i\}' is not attached to a "
                                           r'model'):
        with rec:
            pass
    x = torch.zeros(1, 3, 4)
    with rec.attach(model):
        model(x)
        torch.testing.assert_close(rec.get(), [2 * x + 1, 2 * (2 * x + 1) + 1])


class _AddsTwo(nn.Module):
    """``x + y``: a module called with two positional arguments."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class _CallsWithOne(nn.Module):
    """Calls its child with one positional argument and one keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.add = _AddsTwo()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add(x, y=2 * x)


def test_an_arg_index_recorder_that_is_off_ignores_the_arguments() -> None:
    """Attached but not recording (outside its ``with``), an ``arg_index`` recorder past the
    positional arguments lets plain inference run; recording, it names the mismatch."""
    model = _CallsWithOne()
    rec = ModuleInputsRecorder('add', arg_index=1).attach(model)
    try:
        torch.testing.assert_close(model(torch.ones(2)), torch.full((2, ), 3.0))
        with rec:
            with pytest.raises(RuntimeError, match='called with 1 positional arguments, '
                                                   'arg_index is 1'):
                model(torch.ones(2))
    finally:
        rec.detach()


class _OuterProductMap(nn.Module):
    """An operator whose explicit map is the outer product of its input with itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def attention_map(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, None, :, None] * x[:, None, None, :]  # (B, 1, N, N)


def test_attention_maps_can_be_read_twice() -> None:
    """Two loss terms (or a term and a logger) reading one attention-map recorder: the second
    read gives the same maps (by hand: the outer product of the input), not an error."""
    model = nn.Sequential()
    model.add_module('op', _OuterProductMap())
    x = torch.randn(2, 3)
    expected = x[:, None, :, None] * x[:, None, None, :]
    with AttentionMapsRecorder('op').attach(model) as maps:
        model(x)
        torch.testing.assert_close(maps.get(), expected, rtol=0, atol=0)
        torch.testing.assert_close(maps.get(), expected, rtol=0, atol=0)


# ------------------------------------------------------------------------- teacher input norm
def test_a_mean_of_exactly_1_is_in_0_1_units() -> None:
    """``_pixel_units``' documented bound: a 0-1 pixel mean is at most 1 (a white image), so
    mean 1 with a std below 1 is a 0-1 set, which mmpretrain's ``ClsDataPreprocessor`` with
    ImageNet's 0-1 statistics accepts and with the 0-255 ones refuses."""
    from mmpretrain.models import ClsDataPreprocessor

    from mmlinvit.models.distill.teacher_input_norm import TeacherInputNorm, _pixel_units
    assert _pixel_units(torch.ones(3), torch.full((3, ), 0.5)) == '0-1'
    assert _pixel_units(torch.full((3, ), 1.5), torch.full((3, ), 0.5)) == '0-255'
    imagenet_0_1 = ClsDataPreprocessor(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    TeacherInputNorm([1.0] * 3, [0.5] * 3, imagenet_0_1)
    imagenet_0_255 = ClsDataPreprocessor(mean=[123.675, 116.28, 103.53],
                                         std=[58.395, 57.12, 57.375])
    with pytest.raises(DistillationConfigError, match='different units'):
        TeacherInputNorm([1.0] * 3, [0.5] * 3, imagenet_0_255)
