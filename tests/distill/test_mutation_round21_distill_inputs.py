"""Mutation round 21: the distillation model's input plumbing, on branches the suite let pass.

Each test below failed on a single-line change of its module that every other test of the
module passed.  Guarded here, each against a reference written or run in the test (a value or
rule worked out by hand, mmengine's ``BaseModule.init_weights`` and ``BaseModel.parse_losses``
run in the test):

* :mod:`~mmlinvit.models.distill.input_specs`: a dict spec without ``source`` and a spec that
  is no string are config errors (not a ``KeyError`` / ``TypeError``); a side other than
  ``student`` / ``teacher`` / ``context`` is refused;
* :mod:`~mmlinvit.models.distill.teacher_input_norm`: a preprocessor with ``mean`` / ``std``
  buffers and no ``_enable_normalize`` flag normalises;
* :mod:`~mmlinvit.models.distill.teacher`: the frozen teacher is in eval mode from the start;
  an mmengine parent's ``init_weights`` never re-initialises it (``BaseModule`` or plain
  ``nn.Module``); a teacher that loads its own ``pretrained=`` file is not warned as random; a
  ``Pretrained`` entry of a list ``init_cfg`` counts as loaded; a truncated task-model
  checkpoint is named as truncated;
* :mod:`~mmlinvit.models.distill.trainable_params` (FINDING, fixed): a single string is named,
  not split into one-character patterns;
* :mod:`~mmlinvit.models.distill.stage_depths`: a student argument without its teacher
  counterpart is not paired;
* :mod:`~mmlinvit.models.distill.terms`: a term without ``inputs`` names its unmapped
  arguments; a term name that is no string, or holds ``'loss'`` (mmengine would sum its gap
  into the loss), is refused; an empty record list is described by its ``repr``; a context
  entry the model cannot provide is named; a non-finite loss after entries without ``'loss'``
  in their key is still found.
"""
import math
from typing import Optional, Tuple

import pytest
import torch
import torch.nn as nn

from mmlinvit.models.distill import DistillationConfigError, InputSpec, parse_input_spec
from mmlinvit.models.distill.terms import (build_term, check_finite_losses, check_spec,
                                           check_term_name, describe_value)

#: torchvision's ImageNet ``Normalize`` statistics times 255 (mmpretrain / mmseg configs).
IMAGENET_MEAN_255 = (123.675, 116.28, 103.53)
IMAGENET_STD_255 = (58.395, 57.12, 57.375)


# ------------------------------------------------------------------------- input_specs


def test_a_dict_spec_without_source_is_a_config_error():
    """``dict(connector=...)`` alone: the config error naming 'source', not a ``KeyError``."""
    with pytest.raises(DistillationConfigError, match=r"'source' \(required\)"):
        parse_input_spec('feat', 'pred', dict(connector='proj'))


@pytest.mark.parametrize('spec', [5, None, ['student.feat']])
def test_a_spec_that_is_no_string_is_a_config_error(spec: object):
    """A number, ``None`` or a list: the config error naming the expected form."""
    with pytest.raises(DistillationConfigError, match=r"must look like 'student.<recorder>'"):
        parse_input_spec('feat', 'pred', spec)


@pytest.mark.parametrize('side', ['model', 'Student', 'teachers'])
def test_unknown_sides_are_refused(side: str):
    """Only ``student`` / ``teacher`` / ``context``, spelled exactly."""
    with pytest.raises(DistillationConfigError, match=f'unknown side {side!r}'):
        parse_input_spec('feat', 'pred', f'{side}.feat')


# ---------------------------------------------------------------------- teacher_input_norm


class _Stats(nn.Module):
    """A data preprocessor stand-in with ``mean`` / ``std`` buffers and, optionally,
    mmengine's ``_enable_normalize`` flag.

    Args:
        mean: Per-channel mean.
        std: Per-channel std.
        enabled: ``_enable_normalize`` (``None``: the attribute is absent).
    """

    def __init__(self, mean: Tuple[float, ...], std: Tuple[float, ...],
                 enabled: Optional[bool] = None) -> None:
        super().__init__()
        if enabled is not None:
            self._enable_normalize = enabled
        self.register_buffer('mean', torch.tensor(mean).view(-1, 1, 1))
        self.register_buffer('std', torch.tensor(std).view(-1, 1, 1))


def test_statistics_are_read_without_an_enable_flag():
    """A preprocessor with ``mean`` / ``std`` buffers and no ``_enable_normalize`` normalises
    (the flag is mmengine's; a plain module with the buffers is taken at its word)."""
    from mmlinvit.models.distill.teacher_input_norm import student_input_stats
    mean, std = student_input_stats(_Stats(IMAGENET_MEAN_255, IMAGENET_STD_255))
    assert mean.tolist() == pytest.approx(IMAGENET_MEAN_255)
    assert std.tolist() == pytest.approx(IMAGENET_STD_255)


# ------------------------------------------------------------------------------- teacher


def _tiny_vit(**kwargs) -> dict:
    """A tiny ``mmlinvit.VisionTransformer`` config (CPU-sized)."""
    cfg = dict(type='mmlinvit.VisionTransformer',
               arch=dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32),
               patch_size=4, img_size=16, out_type='raw')
    cfg.update(kwargs)
    return cfg


def _counted_init_teacher_type(base: type) -> type:
    """A teacher on ``base`` with its own ``init_weights`` (counted) that does not call
    mmengine's (so a ``BaseModule`` one never sets ``_is_init`` itself)."""

    class CountedInitTeacher(base):

        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.init_calls = 0

        def init_weights(self) -> None:
            self.init_calls += 1
            nn.init.normal_(self.fc.weight)

    return CountedInitTeacher


#: A plain ``nn.Module`` teacher with its own ``init_weights`` (counted).
_PlainTeacher = _counted_init_teacher_type(nn.Module)


def _custom_init_teacher_type() -> type:
    """An mmengine ``BaseModule`` teacher whose ``init_weights`` does not call mmengine's."""
    from mmengine.model import BaseModule
    return _counted_init_teacher_type(BaseModule)


def _task_teacher_type() -> type:
    """A tiny mmengine ``BaseModel`` teacher (a task model: strict mmengine loading)."""
    from mmengine.model import BaseModel

    class TaskTeacher(BaseModel):

        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, inputs, data_samples=None, mode='tensor'):
            return self.fc(inputs)

    return TaskTeacher


def test_the_frozen_teacher_is_in_eval_mode_without_gradients():
    """Dropout off from the start (no ``train()`` call needed) and no trainable parameter."""
    from mmlinvit.models.distill.teacher import build_frozen_teacher
    teacher = build_frozen_teacher(_tiny_vit(drop_rate=0.5))
    assert not any(m.training for m in teacher.modules())
    assert not any(p.requires_grad for p in teacher.parameters())


def test_a_parents_init_weights_never_reinitialises_the_teacher():
    """mmengine's ``BaseModule.init_weights`` of a parent calls the ``init_weights`` of each
    child not marked initialised: the teacher (an mmengine ``BaseModule``, also one whose own
    ``init_weights`` bypasses mmengine's, or a plain ``nn.Module``) keeps the weights it was
    built and loaded with."""
    from mmengine.model import BaseModule

    from mmlinvit.models.distill.teacher import build_frozen_teacher
    torch.manual_seed(0)
    parent = BaseModule()
    parent.vit = build_frozen_teacher(_tiny_vit())
    parent.plain = build_frozen_teacher(dict(type=_PlainTeacher))
    parent.custom = build_frozen_teacher(dict(type=_custom_init_teacher_type()))
    # its own initialisation, once, at build time
    assert parent.plain.init_calls == parent.custom.init_calls == 1
    before = {k: v.clone() for k, v in parent.state_dict().items()}
    parent.init_weights()
    assert parent.plain.init_calls == parent.custom.init_calls == 1
    after = parent.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


class _PretrainedTeacher(nn.Module):
    """A teacher whose ``init_weights`` loads its ``pretrained=`` file (no init_cfg, no flag).

    Args:
        pretrained: A ``torch.save``'d state dict.
    """

    def __init__(self, pretrained: str) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.pretrained = pretrained

    def init_weights(self) -> None:
        self.fc.load_state_dict(torch.load(self.pretrained, map_location='cpu'))


def test_a_teacher_loading_its_pretrained_file_is_not_warned_as_random(tmp_path,
                                                                       warnings_logged):
    """``pretrained=<file>`` read by the teacher's own ``init_weights``: the teacher has
    weights, so no "random initialisation" warning; without ``pretrained`` there is one."""
    from mmlinvit.models.distill.teacher import build_frozen_teacher
    path = str(tmp_path / 'fc.pth')
    torch.save(nn.Linear(4, 4).state_dict(), path)
    teacher = build_frozen_teacher(dict(type=_PretrainedTeacher, pretrained=path))
    assert torch.equal(teacher.fc.weight, torch.load(path)['weight'])
    assert not [m for m in warnings_logged if 'random initialisation' in m]
    build_frozen_teacher(dict(type=_PlainTeacher))
    assert [m for m in warnings_logged if 'random initialisation' in m]


def test_a_pretrained_entry_in_a_list_init_cfg_counts_as_loaded(tmp_path, warnings_logged):
    """mmengine's ``BaseModule`` takes a list ``init_cfg`` and applies each entry in order: a
    ``Pretrained`` entry after a ``Constant`` one loads the file, so the teacher is not warned
    as keeping its random initialisation."""
    from mmengine.model import BaseModule

    from mmlinvit.models.distill.teacher import build_frozen_teacher

    class ListInitTeacher(BaseModule):

        def __init__(self, init_cfg: list) -> None:
            super().__init__(init_cfg=init_cfg)
            self.fc = nn.Linear(4, 4)

    source = nn.Linear(4, 4)
    path = str(tmp_path / 'fc.pth')
    torch.save({f'fc.{k}': v for k, v in source.state_dict().items()}, path)
    teacher = build_frozen_teacher(dict(
        type=ListInitTeacher, init_cfg=[dict(type='Constant', layer='Linear', val=0.0),
                                        dict(type='Pretrained', checkpoint=path)]))
    assert torch.equal(teacher.fc.weight, source.weight)  # mmengine loaded the file
    assert not [m for m in warnings_logged if 'random initialisation' in m]


def test_a_truncated_task_model_teacher_checkpoint_is_named_as_truncated(tmp_path):
    """A ``torch.save`` archive cut in half (an interrupted copy): the config error says the
    file is truncated, not only torch's bare zip-reader message."""
    from mmlinvit.models.distill.teacher import build_frozen_teacher
    kind = _task_teacher_type()
    path = tmp_path / 'cut.pth'
    torch.save(dict(state_dict=kind().state_dict()), str(path))
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(DistillationConfigError, match=r'(?s)does not fit the teacher.*truncated'):
        build_frozen_teacher(dict(type=kind), str(path))


# --------------------------------------------------------------------------------- terms


class _PairLoss(nn.Module):
    """A loss of two required inputs."""

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (pred - target).square().mean()


def test_a_term_without_inputs_names_the_unmapped_arguments():
    """``dict(loss=...)`` without ``inputs``: the config error naming the loss arguments left
    unmapped, not a bare ``KeyError: 'inputs'``."""
    with pytest.raises(DistillationConfigError,
                       match=r"required argument\(s\) \['pred', 'target'\] of _PairLoss"):
        build_term('feat', dict(loss=dict(type=_PairLoss)), lambda term, spec: spec)


@pytest.mark.parametrize('name', [5, None, ('feat', )])
def test_a_term_name_that_is_no_string_is_a_config_error(name: object):
    """A number, ``None`` or a tuple as a term name: the config error, not an
    ``AttributeError`` about ``isidentifier``."""
    with pytest.raises(DistillationConfigError, match='must be an identifier'):
        check_term_name(name)


def test_an_empty_record_list_is_described_as_itself():
    """``[]`` (no block recorded): its ``repr``, not an ``IndexError`` in the dry-run message."""
    assert describe_value([]) == repr([]) and describe_value(()) == repr(())


def test_a_student_argument_without_a_teacher_counterpart_is_not_paired():
    """``student_feats`` mapped without ``teacher_feats`` (the target comes from an argument of
    another name): the depth check has nothing to pair and passes."""
    from mmlinvit.models.distill.stage_depths import check_stage_depths
    specs = [InputSpec('student_feats', 'student', 'feat'), InputSpec('target', 'teacher', 'feat')]
    check_stage_depths(dict(feat=specs), dict(student={}, teacher={}), dict(student=None,
                                                                           teacher=None))


@pytest.mark.parametrize('name', ['my_loss', 'lossy', 'featloss'])
def test_term_names_must_not_hold_loss(name: str):
    """The gap is logged as ``distill.gap_<term>``, and mmengine's ``parse_losses`` sums every
    entry whose key holds ``'loss'``: a term name holding it would add its gap to the loss."""
    from mmengine.model import BaseModel

    class Model(BaseModel):

        def forward(self, *args, **kwargs):
            return None

    total, _ = Model().parse_losses({'distill.loss_a': torch.tensor(1.0),
                                     f'distill.gap_{name}': torch.tensor(2.0)})
    assert float(total) == 3.0  # why such a name cannot be allowed
    with pytest.raises(DistillationConfigError, match="must be an identifier without 'loss'"):
        check_term_name(name)


def test_a_context_entry_the_model_cannot_provide_is_named():
    """``patch_mask`` without patch masking: the model's reason, at build time; an entry it
    provides passes."""
    recorders = dict(student={}, teacher={})
    with pytest.raises(DistillationConfigError, match='no patch masking here'):
        check_spec('t', InputSpec('m', 'context', 'patch_mask'), recorders, (),
                   dict(patch_mask='no patch masking here'))
    spec = InputSpec('m', 'context', 'teacher_token_layout')
    assert check_spec('t', spec, recorders, (), dict(patch_mask='no patch masking here')) is spec


@pytest.mark.parametrize('bad', [math.inf, math.nan])
def test_a_non_finite_loss_after_other_entries_is_found(bad: float):
    """Entries without ``'loss'`` in their key (accuracy, gaps) are skipped, not the end of
    the check: a non-finite loss after them still stops training."""
    ok = torch.tensor(1.0)
    with pytest.raises(FloatingPointError, match="'loss_cls'"):
        check_finite_losses({'acc': ok, 'distill.gap_a': ok, 'loss_cls': torch.tensor(bad)})
    check_finite_losses({'distill.gap_a': torch.tensor(bad), 'loss_cls': ok})


# ---------------------------------------------------------------------- trainable_params


def test_trainable_params_given_as_one_string_are_named():
    """FINDING (fails on the code before the fix): ``trainable_params='blocks.*'`` was split
    into its characters (``list('blocks.*')``) and refused as "pattern 'b' matches no student
    parameter", which names no real mistake; the string is now named with the list to write,
    by ``freeze_all_but`` and by the ``DistillationModel`` (parameters left untouched)."""
    from mmlinvit.models.distill import DistillationModel
    from mmlinvit.models.distill.trainable_params import freeze_all_but
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(DistillationConfigError, match=r"got the string '0\.\*'.*\['0\.\*'\]"):
        freeze_all_but(model, '0.*')
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(DistillationConfigError, match=r"got the string 'blocks\.\*'"):
        DistillationModel(student=_tiny_vit(), trainable_params='blocks.*')
