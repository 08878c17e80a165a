"""One teacher-student mechanism for every distillation recipe, inside mmengine runners.

As in mmrazor (algorithm, distiller, recorders, connectors), without depending on it: this
model builds the student and the frozen teacher (:mod:`.teacher`), attaches the recorders
(:mod:`.recorders`), builds the connectors and the distillation terms (:mod:`.terms`), and
runs the optional components, each checked against student and teacher at build time:
``teacher_forcing`` (:mod:`mmlinvit.distill.teacher_forcing`, ViT-AdaLA Stage 1),
``patch_masking`` (:mod:`mmlinvit.distill.patch_masking`, ViT-Linearizer) and
``teacher_input_norm`` (:mod:`.teacher_input_norm`, e.g. an OpenAI CLIP teacher).

Config sketch::

    model = dict(
        type='mmlinvit.DistillationModel',
        student=dict(type='mmlinvit.LinearVisionTransformer', ...),   # or an ImageClassifier
        teacher=dict(type='mmlinvit.VisionTransformer', ..., pretrained='teacher.pth'),
        student_recorders=dict(attn_out=dict(type='ModuleOutputs', source='blocks.{i}.attn')),
        teacher_recorders=dict(attn_out=dict(type='ModuleOutputs', source='blocks.{i}.attn')),
        distill_losses=dict(
            attn_out=dict(
                loss=dict(type='mmlinvit.AttentionOutputMSELoss', loss_weight=50.0),
                inputs=dict(student_outputs='student.attn_out',
                            teacher_outputs='teacher.attn_out'))))

Input specs name a record as ``'student.<recorder>'``, ``'teacher.<recorder>'`` or a context
entry ``'context.<key>'`` (``patch_mask``, ``student_token_layout``, ``teacher_token_layout``);
the dict form ``dict(source='student.feat', connector='proj')`` passes a student/teacher record
through a connector first.

Logged values: ``student.<task loss>`` (task-model students), ``distill.loss_<term>`` (scaled
and weighted term, summed into the total) and ``distill.gap_<term>`` (the term without
``loss_weight`` or schedule scale: the teacher-student gap, e.g. the plain MSE; not summed).
"""
import functools
from typing import Any, ContextManager, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.dist import get_rank
from mmengine.logging import print_log
from mmengine.model import BaseModel

from mmlinvit.backbones import VisionTransformer
from mmlinvit.backbones.base import TokenBackbone
from mmlinvit.distill.patch_masking import PatchMasking
from mmlinvit.distill.teacher_forcing import TeacherForcing
from mmlinvit.registry import MODELS
from mmlinvit.models.segmentors import EncoderDecoder as PatchPaddingSegmentor
from mmlinvit.transfer import (TransferStructureError, build_transfer_strategy,
                               check_transfer_structure, transfer_weights)
from mmlinvit.utils.config_types import is_pretrained_init
from .clip_input_stats import (warn_clip_stats_for_other_teacher,
                               warn_clip_teacher_without_clip_stats)
from .errors import DistillationConfigError
from .input_specs import InputSpec, token_layout
from .recorders import attach_recorders, recording
from .stage_depths import check_stage_depths
from .student_preprocessing import (build_untyped_preprocessor, check_student_preprocessing,
                                    refuse_student_settings)
from .teacher import build_frozen_teacher
from .teacher_input_norm import (TeacherInputNorm, fold_into_patch_embedding,
                                 student_input_stats)
from .terms import (build_term, check_connectors_used, check_finite_losses, check_spec,
                    compute_terms)
from .trainable_params import check_patterns, freeze_all_but


def _drop_teacher_state(module: nn.Module, state_dict: Dict[str, Any], prefix: str,
                        local_metadata: Dict[str, Any]) -> None:
    """State-dict post-hook: the frozen teacher is rebuilt from its config, never saved."""
    teacher_prefix = prefix + 'teacher.'
    for key in [k for k in state_dict if k.startswith(teacher_prefix)]:
        del state_dict[key]


_STUDENT_SEGMENTOR_ATTRIBUTES = ('out_channels', 'decode_head')


@MODELS.register_module()
class DistillationModel(BaseModel):
    """A trainable student and a frozen teacher with configurable distillation terms.

    Args:
        student: Config of the student: a bare backbone (AdaLA Stages 1-2, Linearizer
            pre-distillation) or a task model (mmpretrain ``ImageClassifier``, mmseg
            ``EncoderDecoder``) whose task losses are added.
        teacher: Config of the frozen teacher (a backbone or a task model); it may carry its
            own ``pretrained=``.  Required when there are distillation terms, teacher
            forcing or a weight transfer.
        teacher_ckpt: Checkpoint loaded into the teacher at build time (for a backbone: any
            layout :func:`mmlinvit.converters.load_pretrained` handles).
        teacher_ckpt_layout: Layout of ``teacher_ckpt`` (``'auto'`` detects it).
        student_recorders: ``{name: recorder config}`` with paths relative to the student.
        teacher_recorders: ``{name: recorder config}`` with paths relative to the teacher.
        connectors: ``{name: module config}`` of trainable maps (e.g. ``LinearConnector``).
        distill_losses: ``{term: dict(loss=<loss config>, inputs={arg: spec})}``.  ``None``
            or ``{}`` trains the student alone (the teacher is then only used for
            ``weight_transfer``).
        teacher_forcing: ``dict(input_recorder=<teacher ModuleInputs recorder>,
            blocks='blocks')``: each student block ``blocks[i]`` runs ``forward_attn`` on the
            teacher's input of block i instead of the student's own forward (AdaLA Stage 1;
            :class:`~mmlinvit.distill.teacher_forcing.TeacherForcing`).  Student and teacher
            need the same number of blocks.
        patch_masking: ``dict(ratio=0.75)``: a learnable mask token replaces that ratio of
            the student's patch tokens, sampled per image from the run seed (``seed=`` fixes
            them; ViT-Linearizer;
            :class:`~mmlinvit.distill.patch_masking.PatchMasking`).  Needs a bare backbone
            student with ``forward_tokens(x, patch_mask, mask_token)``.  The token is this
            model's ``mask_token``; with ``use_student_mask_token=True`` it is the student
            backbone's own ``mask_token`` parameter instead (e.g. Adventurer), which then
            trains and is exported with the student.
        trainable_params: fnmatch patterns of student parameter names that train (e.g.
            ``['blocks.*.attn.*']``); every other student parameter is frozen.  ``None``
            trains all.
        weight_transfer: ``dict(type='mlp_copy', **options)``: initialise the student
            backbone from the teacher backbone in :meth:`init_weights`
            (:func:`mmlinvit.transfer.transfer_weights`); the strategy is built (name and
            options checked) here.  The former ``strategy=`` key is refused with the fix.
            Refused at build time: a student backbone with ``pretrained=`` (the transfer
            would overwrite the file's weights; ``'random'``, which writes nothing, is
            allowed), and a LayerScale / ``pre_norm`` / final norm on one side only that
            the strategy would copy around
            (:func:`mmlinvit.transfer.check_transfer_structure`).
        student_token_layout: ``(prefix, suffix)`` special-token counts of the student's
            records; ``None`` reads ``num_prefix_tokens`` / ``num_suffix_tokens`` of its
            backbone.
        teacher_token_layout: Same for the teacher.
        check_input_size: (H, W) of the build-time dry run that checks every term on real
            records; ``None`` uses the student backbone's ``img_size``.
        check_finite: Stop with an error naming the term when a loss is NaN or inf.
        check_block_depths: Refuse a term whose student and teacher block records sit at
            different relative depths (:func:`.stage_depths.check_stage_depths`); ``False``
            allows such a pairing on purpose.
        teacher_input_norm: ``dict(mean=[...], std=[...])``: the per-channel statistics the
            teacher was trained with, in the units of the data preprocessor (0-255 for the
            mmpretrain / mmseg preprocessors), when they differ from the student's (e.g. an
            OpenAI CLIP teacher under ImageNet statistics).  The batch, normalised by the
            data preprocessor with the student's ``mean_s`` / ``std_s``, is converted on the
            fly for the teacher: ``x_t = (x_s * std_s + mean_s - mean_t) / std_t``
            (:class:`.teacher_input_norm.TeacherInputNorm`).  The student statistics are
            read from the data preprocessor (its ``mean`` / ``std`` buffers), so a
            preprocessor that does not normalise is refused at build time.  ``None``: the
            teacher sees the student's batch.  A teacher backbone of family ``'clip'`` whose
            input statistics (these, or the data preprocessor's) are not OpenAI CLIP's is
            warned at build time, naming the fix.
        data_preprocessor: Data preprocessor config (one without ``type``, as mmpretrain's data
            set bases give it, takes the student's preprocessor type); ``None`` reuses the
            student's when it is a task model.  It preprocesses every batch, for teacher and
            student: a student ``data_preprocessor`` or ``train_cfg`` batch augments that
            differ from it are refused at build time
            (:func:`.student_preprocessing.check_student_preprocessing`), since they would
            never run.
        init_cfg: mmengine init config.
        **student_settings: Refused with the fix: keys of the student model given at the
            top level (``test_cfg``, ``decode_head``, ...; e.g. ``--cfg-options
            model.test_cfg.mode=slide``), which belong under ``model.student``.
    """

    def __init__(self,
                 student: dict,
                 teacher: Optional[dict] = None,
                 teacher_ckpt: Optional[str] = None,
                 teacher_ckpt_layout: str = 'auto',
                 student_recorders: Optional[Dict[str, Union[str, dict]]] = None,
                 teacher_recorders: Optional[Dict[str, Union[str, dict]]] = None,
                 connectors: Optional[Dict[str, dict]] = None,
                 distill_losses: Optional[Dict[str, dict]] = None,
                 teacher_forcing: Optional[dict] = None,
                 patch_masking: Optional[dict] = None,
                 trainable_params: Optional[Sequence[str]] = None,
                 weight_transfer: Optional[dict] = None,
                 student_token_layout: Optional[Sequence[int]] = None,
                 teacher_token_layout: Optional[Sequence[int]] = None,
                 check_input_size: Optional[Union[int, Sequence[int]]] = None,
                 check_finite: bool = True,
                 check_block_depths: bool = True,
                 teacher_input_norm: Optional[dict] = None,
                 data_preprocessor: Optional[Union[dict, nn.Module]] = None,
                 init_cfg: Optional[dict] = None,
                 **student_settings: object) -> None:
        refuse_student_settings(student_settings)
        check_student_preprocessing(student, data_preprocessor)
        # mmpretrain's data set bases give data_preprocessor without a type (its
        # ImageClassifier fills in its own): the student's preprocessor type is taken below
        untyped = isinstance(data_preprocessor, dict) and 'type' not in data_preprocessor
        super().__init__(data_preprocessor=None if untyped else data_preprocessor,
                         init_cfg=init_cfg)
        self.student = MODELS.build(student)
        self.student_is_task_model = isinstance(self.student, BaseModel)
        if untyped:
            self.data_preprocessor = build_untyped_preprocessor(
                data_preprocessor, self.student if self.student_is_task_model else None)
        elif data_preprocessor is None and self.student_is_task_model:
            self.data_preprocessor = self.student.data_preprocessor
        distill_losses = dict(distill_losses or {})
        self.check_finite = check_finite
        self.weight_transfer = (None if weight_transfer is None else
                                build_transfer_strategy(weight_transfer))
        self.transfer_report = None

        needs_teacher = bool(distill_losses) or teacher_forcing is not None or weight_transfer
        if teacher is None:
            if needs_teacher:
                raise DistillationConfigError(
                    'distill_losses, teacher_forcing and weight_transfer need a teacher; set '
                    'teacher=dict(type=..., ...)')
            self.teacher = None
        else:
            self.teacher = build_frozen_teacher(teacher, teacher_ckpt, teacher_ckpt_layout)
        #: Converts the batch into the teacher's input statistics (None: no conversion).
        self.teacher_input_norm: Optional[TeacherInputNorm] = None
        if teacher_input_norm is not None:
            if self.teacher is None:
                raise DistillationConfigError('teacher_input_norm is set but there is no teacher')
            self.teacher_input_norm = TeacherInputNorm.from_config(teacher_input_norm,
                                                                   self.data_preprocessor)
            warn_clip_stats_for_other_teacher(teacher_backbone=self.teacher_backbone(),
                                              **self.teacher_input_norm.stats)
        warn_clip_teacher_without_clip_stats(
            self.teacher_backbone(),
            None if self.teacher_input_norm is None else self.teacher_input_norm.stats,
            self.data_preprocessor)
        self._check_weight_transfer()

        self.student_recorders = attach_recorders(student_recorders, self.student, 'student')
        self.teacher_recorders = attach_recorders(teacher_recorders, self.teacher, 'teacher')
        self.connectors = nn.ModuleDict(
            {name: MODELS.build(cfg) for name, cfg in (connectors or {}).items()})

        self.teacher_forcing: Optional[TeacherForcing] = None
        if teacher_forcing is not None:
            self.teacher_forcing = TeacherForcing.from_config(teacher_forcing)
            self.teacher_forcing.check(self.student, self.teacher, self.teacher_recorders,
                                       bare_backbone=not self.student_is_task_model)
        self._setup_patch_masking(patch_masking)
        check_patterns(trainable_params)
        self.trainable_params = None if trainable_params is None else list(trainable_params)
        if self.trainable_params is None and self.teacher_forcing is not None:
            raise DistillationConfigError(
                'teacher_forcing runs only the student attention modules: set '
                "trainable_params (e.g. ['blocks.*.attn.*']) so nothing unused trains")
        if self.trainable_params is not None:
            freeze_all_but(self.student, self.trainable_params)
        self.token_layouts = {
            'student': token_layout(student_token_layout, self.student_backbone()),
            'teacher': (token_layout(teacher_token_layout, self.teacher_backbone())
                        if self.teacher is not None else None),
        }

        self.distill_losses = nn.ModuleDict()
        self.term_inputs: Dict[str, List[InputSpec]] = {}
        recorders = dict(student=self.student_recorders, teacher=self.teacher_recorders)
        spec_check = functools.partial(check_spec, recorders=recorders,
                                       connectors=self.connectors,
                                       missing_context=self._missing_context())
        for term, term_cfg in distill_losses.items():
            self.distill_losses[term], self.term_inputs[term] = build_term(
                term, term_cfg, spec_check)
        check_connectors_used(self.connectors, self.term_inputs)
        if check_block_depths:
            check_stage_depths(self.term_inputs, recorders,
                               dict(student=self.student, teacher=self.teacher))
        #: Schedule factors of each term (set by DistillLossScheduleHook), 1.0 by default.
        self.distill_scales: Dict[str, float] = {term: 1.0 for term in self.distill_losses}

        self.register_state_dict_post_hook(_drop_teacher_state)
        self._register_load_state_dict_pre_hook(self._remember_load_prefix)
        self.register_load_state_dict_post_hook(self._tolerate_missing_teacher)
        self._load_prefix = ''

        if check_input_size is not None and isinstance(check_input_size, int):
            check_input_size = (check_input_size, check_input_size)
        self.check_input_size = None if check_input_size is None else tuple(check_input_size)
        self._check_with_dry_run()

    # ------------------------------------------------------------------ building
    @property
    def out_channels(self) -> int:
        """The segmentation student's ``out_channels`` (what mmseg's ``SegTTAModel`` reads
        of the model it wraps: predictions are the student's)."""
        return self.student.out_channels

    @property
    def decode_head(self) -> nn.Module:
        """The segmentation student's decode head (mmseg's ``SegTTAModel`` reads its
        ``threshold`` when the student predicts one channel, a binary task)."""
        return self.student.decode_head

    def __getattr__(self, name: str) -> Any:
        """Name the student when one of its segmentor attributes is missing.

        A property that raises ``AttributeError`` falls through to ``nn.Module.__getattr__``,
        whose generic message would replace the property's own; this says what is missing.
        """
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name not in _STUDENT_SEGMENTOR_ATTRIBUTES or 'student' not in self._modules:
                raise
            raise AttributeError(
                f'DistillationModel.{name} is the student\'s, and the student '
                f'({type(self._modules["student"]).__name__}) has no {name}: it is read by '
                f'segmentation tools (mmseg SegTTAModel, test-time augmentation), which need '
                f'an mmseg segmentor student') from None

    def student_backbone(self) -> nn.Module:
        """The student's backbone (the student itself when it is a bare backbone)."""
        return self.student.backbone if self.student_is_task_model else self.student

    def teacher_backbone(self) -> Optional[nn.Module]:
        """The teacher's backbone (the teacher itself when it is a bare backbone)."""
        if self.teacher is None:
            return None
        return self.teacher.backbone if isinstance(self.teacher, BaseModel) else self.teacher

    def teacher_inputs(self, inputs: torch.Tensor) -> torch.Tensor:
        """The teacher's view of a preprocessed batch (see ``teacher_input_norm``).

        Args:
            inputs: (B, C, H, W) batch normalised by the data preprocessor.

        Returns:
            ``inputs`` itself without ``teacher_input_norm``, else
            ``(inputs * std_s + mean_s - mean_t) / std_t`` (computed in fp32, returned in the
            dtype of ``inputs``).
        """
        if self.teacher_input_norm is None:
            return inputs
        return self.teacher_input_norm(inputs, self.data_preprocessor)

    def _check_weight_transfer(self) -> None:
        """Refuses a ``weight_transfer`` that would overwrite the student's ``pretrained=``
        weights, or whose copied weights would compute another function than the teacher's
        (a LayerScale / ``pre_norm`` / final norm on one side only)."""
        if self.weight_transfer is None:
            return
        student = self.student_backbone()
        where = 'model.student.backbone' if self.student_is_task_model else 'model.student'
        pretrained = getattr(student, 'pretrained', None)
        source = f'{where}.pretrained'
        # a Pretrained init_cfg of the student or of a module holding its backbone
        # (mmpretrain's ImageClassifier(pretrained=...) is one) loads the backbone in
        # init_weights() too, before the transfer; a head's does not touch it
        holders = {name: module for name, module in self.student.named_modules()
                   if module is student or any(m is student for m in module.modules())
                   or any(m is module for m in student.modules())}
        for name, module in holders.items():
            init_cfgs = getattr(module, 'init_cfg', None) or []
            for init_cfg in (init_cfgs if isinstance(init_cfgs, (list, tuple)) else [init_cfgs]):
                if not pretrained and is_pretrained_init(init_cfg):
                    pretrained = init_cfg.get('checkpoint')
                    source = f'model.student{"." + name if name else ""}.init_cfg (Pretrained)'
        if pretrained and self.weight_transfer.name != 'random':
            raise DistillationConfigError(
                f'{source}={pretrained!r} loads the student\'s weights, and weight_transfer '
                f'(strategy {self.weight_transfer.name!r}) would then overwrite part of them '
                f'with the teacher\'s in init_weights(). Keep the file\'s weights (e.g. a '
                f'tools/linearize.py output, which already holds its transfer, or a trained '
                f'student) with --cfg-options model.weight_transfer=None, or drop {source} to '
                f'initialise the student from the teacher by the transfer.')
        teacher = self.teacher_backbone()
        if isinstance(student, VisionTransformer) and isinstance(teacher, VisionTransformer):
            try:
                check_transfer_structure(student, teacher, self.weight_transfer)
            except TransferStructureError as err:
                teacher_where = ('model.teacher' if teacher is self.teacher else
                                 'model.teacher.backbone')
                raise DistillationConfigError(
                    f'weight_transfer: {err} (config: the student backbone is {where}, the '
                    f'teacher backbone {teacher_where}; strategy options go in '
                    f'model.weight_transfer)') from err

    def _setup_patch_masking(self, cfg: Optional[dict]) -> None:
        """Builds and checks the patch masking; owns its mask token and step counter."""
        self.patch_masking: Optional[PatchMasking] = None
        self.mask_token = None
        if cfg is None:
            return
        self.patch_masking = PatchMasking.from_config(cfg)
        self.patch_masking.check(self.student, bare_backbone=not self.student_is_task_model,
                                 teacher_forcing=self.teacher_forcing is not None)
        # None: forward_tokens(mask_token=None) uses the student backbone's own token.
        self.mask_token = self.patch_masking.make_mask_token(self.student)
        # Masks are drawn from (seed, step, rank): resuming reproduces them exactly.
        self.register_buffer('mask_step', torch.zeros((), dtype=torch.long))

    def _missing_context(self) -> Dict[str, str]:
        """``{context key: why this model cannot provide it}``."""
        missing = {}
        if self.patch_masking is None:
            missing['patch_mask'] = 'context.patch_mask needs patch_masking=dict(ratio=...)'
        for side, layout in self.token_layouts.items():
            if layout is None:
                missing[f'{side}_token_layout'] = (
                    f'the {side} backbone has no num_prefix_tokens attribute; set '
                    f'{side}_token_layout=(prefix, suffix) in the model config')
        return missing

    # ------------------------------------------------------------------ checkpoints
    def _remember_load_prefix(self, state_dict: Dict[str, Any], prefix: str, *args: Any) -> None:
        self._load_prefix = prefix

    def _tolerate_missing_teacher(self, module: nn.Module, incompatible_keys: Any) -> None:
        """Load post-hook: checkpoints hold no teacher weights, so none are 'missing'."""
        teacher_prefix = self._load_prefix + 'teacher.'
        missing = incompatible_keys.missing_keys
        missing[:] = [k for k in missing if not k.startswith(teacher_prefix)]

    def init_weights(self) -> None:
        """Initialises the student (its ``pretrained=`` / init_cfg), then the weight transfer.

        The teacher was loaded at build time and is skipped.
        """
        super().init_weights()
        if self.weight_transfer is not None:
            student = self.student_backbone()
            self.transfer_report = transfer_weights(student, self.teacher_backbone(),
                                                    strategy=self.weight_transfer)
            if (self.teacher_input_norm is not None
                    and 'patch_embed.proj.weight' in self.transfer_report.copied):
                # the copied projection expects the teacher's statistics, the student's batch
                # has the data preprocessor's (FullCopy's student would not start as the teacher)
                mean_s, std_s = student_input_stats(self.data_preprocessor)
                stats = self.teacher_input_norm.stats
                fold_into_patch_embedding(student.patch_embed.proj, mean_s, std_s,
                                          torch.tensor(stats['mean']), torch.tensor(stats['std']))
                self.transfer_report.details['patch_embed_input_norm_folded'] = True
            print_log(f'Weight transfer teacher -> student: {self.transfer_report.summary()}',
                      logger='current')

    def train(self, mode: bool = True) -> 'DistillationModel':
        """Sets the mode of everything but the teacher, which always stays in eval mode."""
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()
        return self

    def set_distill_scale(self, term: str, factor: float) -> None:
        """Sets the schedule factor of a term (its loss is ``factor * loss(...)``).

        Raises:
            KeyError: naming the unknown term and the existing ones.
        """
        if term not in self.distill_scales:
            raise KeyError(f'Unknown distill term {term!r}; terms: {sorted(self.distill_scales)}')
        self.distill_scales[term] = float(factor)

    # ------------------------------------------------------------------ forward pieces
    def _recording(self) -> ContextManager[None]:
        return recording(list(self.student_recorders.values()) +
                         list(self.teacher_recorders.values()))

    def _sample_patch_mask(self, inputs: torch.Tensor, advance: bool) -> torch.Tensor:
        """This step's (B, h * w) patch masks; ``advance`` moves on to the next step."""
        mask = self.patch_masking.sample(inputs, self.student.patch_size, int(self.mask_step),
                                         get_rank())
        if advance:
            self.mask_step += 1
        return mask

    def _run_teacher(self, inputs: torch.Tensor) -> None:
        if isinstance(self.student, PatchPaddingSegmentor):
            # the student segmentor pads its batch to the patch grid before its backbone
            # (DINOv2's centred padding puts the image elsewhere on the grid than a teacher's
            # own bottom / right padding): the teacher sees the same pixels
            pads = self.student.patch_pads(tuple(inputs.shape[-2:]))
            if any(pads):
                inputs = F.pad(inputs, pads)
        inputs = self.teacher_inputs(inputs)
        with torch.no_grad():
            if isinstance(self.teacher, BaseModel):
                self.teacher(inputs, mode='tensor')
            else:
                self.teacher(inputs)

    def _run_student(self, inputs: torch.Tensor, data_samples: Optional[list],
                     patch_mask: Optional[torch.Tensor], task_loss: bool,
                     dry_run: bool = False) -> Dict[str, Any]:
        if self.teacher_forcing is not None:
            recorder = self.teacher_recorders[self.teacher_forcing.input_recorder]
            self.teacher_forcing.forward_student(self.student, recorder, inputs, dry_run)
            return {}
        if self.student_is_task_model:
            if task_loss:
                if data_samples is None:
                    raise ValueError(
                        f'the task-model student ({type(self.student).__name__}) computes its '
                        f'task loss from data_samples (the labels), got data_samples=None: pass '
                        f'the batch through the data preprocessor (model.train_step / '
                        f'model(inputs, data_samples, mode=\'loss\'))')
                return self.student.loss(inputs, data_samples)
            self.student(inputs, mode='tensor')
            return {}
        if patch_mask is not None:
            self.patch_masking.forward_student(self.student, inputs, patch_mask, self.mask_token)
        else:
            self.student(inputs)
        return {}

    def _resolve(self, spec: InputSpec, context: Dict[str, Any]) -> Any:
        if spec.side == 'context':
            return context[spec.name]
        recorders = self.student_recorders if spec.side == 'student' else self.teacher_recorders
        value = recorders[spec.name].get(f'{spec.side} recorder {spec.name!r}')
        if spec.connector is not None:
            value = self.connectors[spec.connector](value)
        return value

    def _distill_terms(self, context: Dict[str, Any],
                       dry_run: bool = False) -> Dict[str, torch.Tensor]:
        return compute_terms(self.distill_losses, self.term_inputs, self.distill_scales,
                             lambda spec: self._resolve(spec, context),
                             self._dry_run_size() if dry_run else None)

    def _context(self, patch_mask: Optional[torch.Tensor]) -> Dict[str, Any]:
        return dict(patch_mask=patch_mask,
                    student_token_layout=self.token_layouts['student'],
                    teacher_token_layout=self.token_layouts['teacher'])

    def _dry_run_size(self) -> Tuple[int, int]:
        if self.check_input_size is not None:
            return self.check_input_size
        img_size = getattr(self.student_backbone(), 'img_size', None)
        if img_size is None:
            raise DistillationConfigError(
                f'the build-time check needs an input size: set check_input_size=(H, W) '
                f'({type(self.student_backbone()).__name__} has no img_size)')
        return (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)

    def _check_with_dry_run(self) -> None:
        """Runs one tiny batch through teacher, student and every term (no gradients)."""
        if not self.distill_losses and self.teacher_forcing is None:
            return
        height, width = self._dry_run_size()
        generator = torch.Generator().manual_seed(0)
        inputs = torch.randn(1, 3, height, width, generator=generator)
        was_training = self.training
        self.eval()
        # runs before the runner's init_weights(): a backbone's pretrained= is not loaded yet,
        # which is not worth the "never loaded" warning (and would use up its one warning)
        quiet = [m for m in self.modules()
                 if isinstance(m, TokenBackbone) and not m._warned_not_loaded]
        for module in quiet:
            module._warned_not_loaded = True
        try:
            with torch.no_grad(), self._recording():
                mask = (self._sample_patch_mask(inputs, advance=False)
                        if self.patch_masking is not None else None)
                self._run_teacher(inputs)
                self._run_student(inputs, None, mask, task_loss=False, dry_run=True)
                self._distill_terms(self._context(mask), dry_run=True)
        finally:
            self.train(was_training)
            for module in quiet:
                module._warned_not_loaded = False

    # ------------------------------------------------------------------ mmengine API
    def loss(self, inputs: torch.Tensor, data_samples: Optional[list] = None) -> Dict[str, Any]:
        """Task losses of the student (``student.*``) plus every distillation term.

        Raises:
            FloatingPointError: naming the term whose value is NaN or inf.
        """
        losses: Dict[str, Any] = {}
        with self._recording():
            mask = (self._sample_patch_mask(inputs, advance=self.training)
                    if self.patch_masking is not None else None)
            if self.distill_losses or self.teacher_forcing is not None:
                self._run_teacher(inputs)
            student_losses = self._run_student(inputs, data_samples, mask, task_loss=True)
            losses.update({f'student.{k}': v for k, v in student_losses.items()})
            losses.update(self._distill_terms(self._context(mask)))
        if self.check_finite:
            check_finite_losses(losses)
        return losses

    def forward(self,
                inputs: torch.Tensor,
                data_samples: Optional[list] = None,
                mode: str = 'tensor') -> Any:
        """``'loss'``: distillation + task losses; ``'predict'`` / ``'tensor'``: the student.

        Args:
            inputs: Preprocessed images (B, C, H, W).
            data_samples: Task data samples.
            mode: ``'loss'``, ``'predict'`` or ``'tensor'``.
        """
        if mode == 'loss':
            return self.loss(inputs, data_samples)
        if mode not in ('predict', 'tensor'):
            raise RuntimeError(f"Invalid mode {mode!r}; use 'loss', 'predict' or 'tensor'")
        if self.student_is_task_model:
            return self.student(inputs, data_samples, mode=mode)
        if mode == 'predict':
            raise RuntimeError(f'predict needs a task-model student; the student is a bare '
                               f'{type(self.student).__name__} backbone (validate the exported '
                               f'backbone inside a task model instead)')
        return self.student(inputs)
