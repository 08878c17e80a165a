"""Build-time check that matched student / teacher blocks sit at the same relative depth.

A term that compares a student template recorder (``'layers.{i}'``) with a teacher one
(``'blocks.{i}'``) pairs their k-th records.  The recipes pair blocks at equal depth fractions
``(i + 1) / depth``: ViT-Linearizer's K = 4 stage ends (blocks 2, 5, 8, 11 of 12 against 2, 5,
8, 11 of 12, or 5, 11, 17, 23 of an Adventurer-L's 24), and block i with block i for equal
depths (AdaLA, Copy-MLP).  When a user changes one model's depth (``--cfg-options
model.student.arch=l``) and keeps the recorder indices, the term would silently compare block
11 of 24 with the teacher's last block; :func:`check_stage_depths` refuses that, naming the
indices that match.
"""
from fractions import Fraction
from typing import List, Mapping, Optional, Sequence

import torch.nn as nn

from mmlinvit.backbones.adventurer import stage_block_indices
from mmlinvit.distill.recorders import ModuleRecorder
from mmlinvit.distill.teacher_forcing import count_blocks
from .errors import DistillationConfigError
from .input_specs import InputSpec


def matching_indices(indices: Sequence[int], depth: int, other_depth: int) -> Optional[List[int]]:
    """The blocks of a model with ``other_depth`` blocks at the depth fractions of ``indices``.

    Args:
        indices: Block indices of the model with ``depth`` blocks.
        depth: That model's depth.
        other_depth: The other model's depth.

    Returns:
        ``[(i + 1) * other_depth / depth - 1 for i in indices]``, or ``None`` when some
        fraction falls between two blocks.
    """
    matched = [Fraction((i + 1) * other_depth, depth) - 1 for i in indices]
    if any(m.denominator != 1 for m in matched):
        return None
    return [int(m) for m in matched]


def _paired_specs(specs: Sequence[InputSpec]) -> List[tuple]:
    """(student spec, teacher spec) pairs of one term, by argument name (``student_feats`` with
    ``teacher_feats``, ``student_outputs`` with ``teacher_outputs``, ...)."""
    by_arg = {s.arg: s for s in specs}
    pairs = []
    for spec in specs:
        if spec.side != 'student' or 'student' not in spec.arg:
            continue
        other = by_arg.get(spec.arg.replace('student', 'teacher'))
        if other is not None and other.side == 'teacher':
            pairs.append((spec, other))
    return pairs


def check_stage_depths(term_inputs: Mapping[str, Sequence[InputSpec]],
                       recorders: Mapping[str, Mapping[str, ModuleRecorder]],
                       models: Mapping[str, Optional[nn.Module]]) -> None:
    """Refuses a term that pairs student and teacher blocks at different relative depths.

    For every term argument pair ``student_<x>`` / ``teacher_<x>`` fed by template recorders
    (one record per block index), the k-th student block ``i_s`` of ``D_s`` and the k-th
    teacher block ``i_t`` of ``D_t`` must satisfy ``(i_s + 1) / D_s == (i_t + 1) / D_t``.
    Equal depths with equal indices (block i against block i) always pass.

    Args:
        term_inputs: ``{term: input specs}``.
        recorders: ``{'student': {name: recorder}, 'teacher': {name: recorder}}``, attached.
        models: ``{'student': model, 'teacher': model}`` the recorders are attached to.

    Raises:
        DistillationConfigError: naming the term, both index lists and depths, and the
            student indices at the teacher's depth fractions (when there are such blocks).
    """
    for term, specs in term_inputs.items():
        for student_spec, teacher_spec in _paired_specs(specs):
            student_rec = recorders['student'][student_spec.name]
            teacher_rec = recorders['teacher'][teacher_spec.name]
            if not (student_rec.is_template and teacher_rec.is_template):
                continue
            s_idx, t_idx = list(student_rec.indices), list(teacher_rec.indices)
            if len(s_idx) != len(t_idx):
                continue  # the term's own shape check names that
            s_depth = count_blocks(models['student'], student_rec.source)
            t_depth = count_blocks(models['teacher'], teacher_rec.source)
            if all(Fraction(s + 1, s_depth) == Fraction(t + 1, t_depth)
                   for s, t in zip(s_idx, t_idx)):
                continue
            _raise_mismatch(term, student_spec, teacher_spec, (s_idx, s_depth),
                            (t_idx, t_depth), student_rec.source, teacher_rec.source)


def _raise_mismatch(term: str, student_spec: InputSpec, teacher_spec: InputSpec,
                    student: tuple, teacher: tuple, student_source: str,
                    teacher_source: str) -> None:
    (s_idx, s_depth), (t_idx, t_depth) = student, teacher
    fractions = ', '.join(f'{s + 1}/{s_depth} vs {t + 1}/{t_depth}' for s, t in zip(s_idx, t_idx))
    lines = [
        f'distill term {term!r} pairs student {student_source!r} blocks {s_idx} of a '
        f'{s_depth}-block student with teacher {teacher_source!r} blocks {t_idx} of a '
        f'{t_depth}-block teacher at different relative depths (i + 1) / depth ({fractions}); '
        f'it would compare features of different depths without a word (e.g. a student depth '
        f'changed with --cfg-options and the recorder indices kept).'
    ]
    fix = matching_indices(t_idx, t_depth, s_depth)
    where = f'model.student_recorders.{student_spec.name}.indices'
    if fix is not None:
        stages = ''
        if len(fix) <= s_depth and fix == stage_block_indices(s_depth, len(fix)):
            stages = (f', the last blocks of {len(fix)} equal stages: '
                      f'mmlinvit.backbones.adventurer.stage_block_indices({s_depth}, {len(fix)})')
        lines.append(f'fix: set {where}={fix} (the student blocks at the teacher\'s depth '
                     f'fractions{stages}).')
    else:
        lines.append(f'no student block sits at the teacher\'s depth fractions: set {where} '
                     f'and model.teacher_recorders.{teacher_spec.name}.indices to blocks with '
                     f'equal (i + 1) / depth (e.g. the last blocks of K equal stages, '
                     f'mmlinvit.backbones.adventurer.stage_block_indices(depth, K), where K '
                     f'divides both depths).')
    lines.append('(model.check_block_depths=False pairs them as given, on purpose.)')
    raise DistillationConfigError(' '.join(lines))
