"""Two ``--cfg-options`` a ViT-Linearizer user is invited to make (the config's comments) are
checked at build time instead of training silently on a wrong setting.

* ``model.student.arch=l`` (Adventurer-L, 24 blocks) with the recorder indices left at the
  config's ``[2, 5, 8, 11]`` would match student block 11 of 24 with the teacher's last
  block: refused, naming the indices at the teacher's depth fractions.
* ``model.teacher.family=deit3`` with the config's CLIP ``teacher_input_norm`` kept would feed
  a DeiT-III teacher CLIP-normalised images: warned, naming ``model.teacher_input_norm=None``.

The models are the real configs built as the Runner builds them, every width divided by 8
(``tests/configs/config_testing.py``), depths, recorders and losses unchanged.
"""
import os.path as osp
import sys
from typing import Callable, List

import pytest
from mmengine.registry import MODELS, init_default_scope

from mmlinvit.models.distill import DistillationConfigError

sys.path.insert(0, osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'configs'))
from config_testing import model_config, shrink_width  # noqa: E402

ADVENTURER = 'linearizer/vit-linearizer_clip-b16_adventurer-b_16xb64-300e_in1k-224x224.py'
VIT_ELU = 'linearizer/vit-linearizer_clip-b16_vit-b-elu_16xb64-300e_in1k-224x224.py'
TEACHER_DEPTH = 12  # CLIP ViT-B/16
LARGE_DEPTH = 24    # Adventurer-L, ViT-L


def build(rel: str, edit: Callable[[dict], None] = lambda m: None):
    """The config's model with ``edit`` applied (as --cfg-options would), widths shrunk."""
    cfg, model = model_config(rel)
    init_default_scope(cfg.default_scope)
    edit(model)
    shrink_width(model)
    model['check_input_size'] = None
    return MODELS.build(model)


def large_student(model: dict) -> None:
    """--cfg-options model.student.arch=l model.connectors.proj.in_channels=1024"""
    model['student']['arch'] = 'l'
    model['connectors']['proj']['in_channels'] = 1024


def same_fractions(indices: List[int], depth: int, other_depth: int) -> List[int]:
    """Blocks of a model of ``other_depth`` at the fractions (i + 1) / depth (written here)."""
    out = []
    for i in indices:
        assert ((i + 1) * other_depth) % depth == 0
        out.append((i + 1) * other_depth // depth - 1)
    return out



@pytest.mark.parametrize('rel', [ADVENTURER, VIT_ELU])
def test_large_student_with_base_stage_indices_is_refused(rel):
    cfg, _ = model_config(rel)
    indices = list(cfg.model.student_recorders.stages.indices)
    assert indices == list(cfg.model.teacher_recorders.stages.indices) == [2, 5, 8, 11]
    with pytest.raises(DistillationConfigError) as info:
        build(rel, large_student)
    message = str(info.value)
    right = same_fractions(indices, TEACHER_DEPTH, LARGE_DEPTH)
    assert right == [5, 11, 17, 23]
    assert f'model.student_recorders.stages.indices={right}' in message
    assert str(indices) in message and f'{LARGE_DEPTH}-block student' in message
    assert f'{TEACHER_DEPTH}-block teacher' in message
    assert 'model.check_block_depths=False' in message

    def on_purpose(model: dict) -> None:
        large_student(model)
        model['check_block_depths'] = False

    assert build(rel, on_purpose).student_recorders['stages'].indices == indices


def test_large_student_with_the_indices_at_the_teacher_fractions_builds():
    def edit(model: dict) -> None:
        large_student(model)
        model['student_recorders']['stages']['indices'] = same_fractions(
            [2, 5, 8, 11], TEACHER_DEPTH, LARGE_DEPTH)

    model = build(ADVENTURER, edit)
    assert model.student.num_layers == LARGE_DEPTH
    assert model.student_recorders['stages'].indices == [5, 11, 17, 23]


def test_default_configs_build_without_warnings(warnings_logged):
    for rel in (ADVENTURER, VIT_ELU):
        model = build(rel)
        assert model.teacher.family == 'clip' and model.teacher_input_norm is not None
    assert not [m for m in warnings_logged if 'teacher_input_norm' in m], warnings_logged


def test_non_clip_teacher_with_clip_statistics_warns(warnings_logged):
    def deit3_teacher(model: dict) -> None:
        model['teacher']['family'] = 'deit3'

    model = build(ADVENTURER, deit3_teacher)
    assert model.teacher.family == 'deit3'
    found = [m for m in warnings_logged if 'teacher_input_norm' in m]
    assert len(found) == 1, warnings_logged
    assert 'model.teacher_input_norm=None' in found[0] and "'deit3'" in found[0]

    # The fix the warning names: no warning, the teacher sees the student's batch.
    def fixed(model: dict) -> None:
        deit3_teacher(model)
        model['teacher_input_norm'] = None

    warnings_logged.clear()
    model = build(ADVENTURER, fixed)
    assert model.teacher_input_norm is None
    assert not [m for m in warnings_logged if 'teacher_input_norm' in m], warnings_logged


def test_other_statistics_for_a_non_clip_teacher_do_not_warn(warnings_logged):
    """Only CLIP's own statistics are suspicious: a teacher given its own ones is fine."""
    def own_stats(model: dict) -> None:
        model['teacher']['family'] = 'deit3'
        model['teacher_input_norm'] = dict(mean=[127.5, 127.5, 127.5],
                                           std=[127.5, 127.5, 127.5])

    build(ADVENTURER, own_stats)
    assert not [m for m in warnings_logged if 'teacher_input_norm' in m], warnings_logged
