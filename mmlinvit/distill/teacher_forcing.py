"""Teacher forcing (ViT-AdaLA Stage 1): each student block runs on the teacher's block input.

Torch only.  A :class:`~mmlinvit.distill.recorders.ModuleInputsRecorder` on the teacher
records the input of every teacher block i; :class:`TeacherForcing` then runs the attention
branch of student block i (``forward_attn(x, hw_shape, num_prefix_tokens)``) on that input,
instead of the student's own forward, so the student's attention outputs can be matched to
the teacher's block by block without errors accumulating through the depth.

The mmengine integration, :class:`~mmlinvit.models.distill.DistillationModel`, builds it
from ``teacher_forcing=dict(input_recorder='block_in', blocks='blocks')``.
"""
from typing import Mapping

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from mmlinvit.layers.checkpointing import checkpoint_active
from mmlinvit.layers.patch_embed import patch_grid
from .errors import DistillationConfigError
from .recorders import ModuleInputsRecorder, ModuleRecorder, module_exists

#: Keys of the ``teacher_forcing`` config.
TEACHER_FORCING_KEYS = ('input_recorder', 'blocks', 'with_layer_scale')


def count_blocks(model: nn.Module, template: str) -> int:
    """How many modules ``template.format(i=0)``, ``template.format(i=1)``, ... exist.

    Args:
        model: The model searched.
        template: Module path with an ``{i}`` placeholder, e.g. ``'blocks.{i}'``.
    """
    if '{i}' not in template:  # one path for every i: the loop would never end
        raise ValueError(f'count_blocks needs a module path with an {{i}} placeholder (e.g. '
                         f"'blocks.{{i}}'), got {template!r}")
    count = 0
    while module_exists(model, template.format(i=count)):
        count += 1
    return count


class TeacherForcing:
    """Feeds each student block the teacher's input of the same block, checked at build time.

    Args:
        input_recorder: Name of the teacher recorder (type ``'ModuleInputs'``) holding the
            teacher block inputs.
        blocks: Path of the student's block container (``'<blocks>.<i>'`` is block i).
        with_layer_scale: Each student block also applies its LayerScale ``ls1`` to the
            attention output, so that recorders on ``blocks.{i}.ls1`` (student and teacher)
            match the branch the residual adds; ``False`` stops at the attention module
            (``blocks.{i}.attn`` recorders).
    """

    def __init__(self, input_recorder: str, blocks: str = 'blocks',
                 with_layer_scale: bool = False) -> None:
        self.input_recorder = input_recorder
        self.blocks = blocks
        self.with_layer_scale = with_layer_scale

    @classmethod
    def from_config(cls, cfg: dict) -> 'TeacherForcing':
        """Builds the component from ``dict(input_recorder=..., blocks='blocks')``.

        Raises:
            DistillationConfigError: naming unknown or missing keys.
        """
        cfg = dict(cfg)
        unknown = sorted(set(cfg) - set(TEACHER_FORCING_KEYS))
        if unknown or 'input_recorder' not in cfg:
            raise DistillationConfigError(
                f"teacher_forcing takes 'input_recorder' (required), 'blocks' and "
                f"'with_layer_scale', got keys "
                f"{sorted(cfg)}")
        return cls(**cfg)

    def recorder(self, teacher_recorders: Mapping[str, ModuleRecorder]) -> ModuleInputsRecorder:
        """The teacher recorder of the block inputs.

        Raises:
            DistillationConfigError: when it is missing or not a ``'ModuleInputs'`` recorder.
        """
        recorder = teacher_recorders.get(self.input_recorder)
        if not isinstance(recorder, ModuleInputsRecorder):
            raise DistillationConfigError(
                f"teacher_forcing.input_recorder {self.input_recorder!r} must name a teacher "
                f"recorder of type 'ModuleInputs' (block inputs); teacher recorders: "
                f"{sorted(teacher_recorders)}")
        return recorder

    def check(self, student: nn.Module, teacher: nn.Module,
              teacher_recorders: Mapping[str, ModuleRecorder],
              bare_backbone: bool = True) -> None:
        """Checks the student against the teacher and the teacher's input recorder.

        Args:
            student: The student model.
            teacher: The teacher model the recorders are attached to.
            teacher_recorders: The attached teacher recorders by name.
            bare_backbone: Whether ``student`` is a bare backbone (not a task model).

        Raises:
            DistillationConfigError: for a task-model student, a missing or wrong input
                recorder (not block inputs, or not a ``{i}`` template), a different number of blocks in student and teacher (naming both),
                a student block without ``forward_attn``, a student backbone without
                ``patch_size`` / ``num_prefix_tokens``, another patch size or other prefix
                tokens (class / registers) than the teacher's.
        """
        if not bare_backbone:
            raise DistillationConfigError('teacher_forcing needs a bare backbone student '
                                          f'(got {type(student).__name__})')
        recorder = self.recorder(teacher_recorders)
        if not recorder.is_template:
            # a plain path records one input, which would reach student block 0 whatever
            # teacher block it came from
            raise DistillationConfigError(
                f'teacher_forcing.input_recorder {self.input_recorder!r} records '
                f'{recorder.source!r}, a single module: student block i runs on the input of '
                f'teacher block i, so the recorder needs a {{i}} template. Use source='
                f'\'<blocks>.{{i}}\' (add indices=[...] to force only some blocks)')
        # Block i of the student takes block i's input: a deeper student would have blocks
        # that never run (and never train), a shallower one no block to run.
        num_student = count_blocks(student, self.blocks + '.{i}')
        num_teacher = count_blocks(teacher, recorder.source)
        if num_student != num_teacher:
            raise DistillationConfigError(
                f'teacher_forcing: the student has {num_student} blocks '
                f'({self.blocks!r}) and the teacher {num_teacher} '
                f'({recorder.source!r}); student block i runs on the input of teacher '
                f'block i, so both need the same number of blocks')
        for idx, teacher_path in zip(recorder.indices, recorder.paths):
            path = f'{self.blocks}.{idx}'
            try:
                block = student.get_submodule(path)
            except AttributeError as err:
                raise DistillationConfigError(
                    f'teacher_forcing: the student has no block {path!r} for the teacher input '
                    f'recorded at {teacher_path!r}') from err
            if not callable(getattr(block, 'forward_attn', None)):
                raise DistillationConfigError(
                    f'teacher_forcing: student module {path!r} ({type(block).__name__}) has no '
                    f'forward_attn(x, hw_shape, num_prefix_tokens, with_layer_scale)')
        for attr in ('patch_size', 'num_prefix_tokens'):
            if not hasattr(student, attr):
                raise DistillationConfigError(
                    f'teacher_forcing needs the student backbone attribute {attr!r} '
                    f'({type(student).__name__} has none)')
        # a task-model teacher (ImageClassifier, segmentor): its backbone's tokens
        backbone = teacher.backbone if isinstance(getattr(teacher, 'backbone', None),
                                                   nn.Module) else teacher
        patch = getattr(backbone, 'patch_size', None)
        if patch is not None and patch != student.patch_size:
            raise DistillationConfigError(
                f'teacher_forcing: the teacher\'s patch size is {patch} and the student\'s '
                f'{student.patch_size}; each student block runs on the teacher\'s tokens (its '
                f'{patch} x {patch} patch grid), so the student would learn on another grid than '
                f'its own patch embedding makes. Build the student with patch_size={patch} '
                f'(--cfg-options model.student.patch_size={patch})')
        theirs = getattr(backbone, 'num_prefix_tokens', None)
        if theirs is not None and theirs != student.num_prefix_tokens:
            raise DistillationConfigError(
                f'teacher_forcing: the teacher\'s block inputs carry {theirs} class / register '
                f'token(s) before the patches and the student expects '
                f'{student.num_prefix_tokens}; each student block runs on the teacher\'s tokens, '
                f'so both need the same prefix tokens. MHLA / TTT students take their papers\' '
                f'setting (no class token) unless told otherwise: build the student with the '
                f'teacher\'s tokens, e.g. --cfg-options model.student.with_cls_token=True '
                f'model.student.num_reg_tokens=<teacher\'s> model.student.pos_embed_type=learned '
                f'model.student.check_operator_setting=False (a documented deviation)')

    def forward_student(self, student: nn.Module, recorder: ModuleInputsRecorder,
                        inputs: torch.Tensor, dry_run: bool = False) -> None:
        """Runs each student block's attention on the recorded teacher block input.

        Call it after the teacher's forward (which filled ``recorder``); the student's own
        recorders capture the attention outputs.

        Args:
            student: The checked student backbone.
            recorder: The teacher's block-input recorder, holding this batch's records.
            inputs: The (B, C, H, W) batch (its size gives the patch grid).
            dry_run: Turn shape errors into a :class:`DistillationConfigError` naming the
                block, the teacher input shape and the student's width and grid.
        """
        block_inputs = recorder.get('teacher forcing input')
        if not isinstance(block_inputs, list):
            block_inputs = [block_inputs]
        hw_shape = patch_grid(inputs.shape[-2:], student.patch_size)
        for idx, x in zip(recorder.indices, block_inputs):
            block = student.get_submodule(f'{self.blocks}.{idx}')
            try:
                if checkpoint_active(block, x, getattr(student, 'with_cp', False)):
                    # with_cp: the block's attention activations are recomputed in backward
                    checkpoint(block.forward_attn, x, hw_shape, student.num_prefix_tokens,
                               with_layer_scale=self.with_layer_scale, use_reentrant=False)
                else:
                    block.forward_attn(x, hw_shape, student.num_prefix_tokens,
                                       with_layer_scale=self.with_layer_scale)
            except RuntimeError as err:
                if not dry_run:
                    raise
                raise DistillationConfigError(
                    f'teacher forcing: student block {self.blocks}.{idx} cannot take the '
                    f'teacher block input of shape {tuple(x.shape)} (student embed_dims='
                    f'{getattr(student, "embed_dims", "?")}, grid {hw_shape}, '
                    f'{student.num_prefix_tokens} prefix tokens): {err}') from err

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(input_recorder={self.input_recorder!r}, '
                f'blocks={self.blocks!r}, with_layer_scale={self.with_layer_scale})')
