"""One teacher-student mechanism for every distillation recipe, inside mmengine runners.

The pattern follows mmrazor's ``SingleTeacherDistill`` + ``ConfigurableDistiller`` (recorders
declared by module path, a mapping of records onto loss arguments checked at build time,
connectors), without depending on mmrazor.

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

A teacher trained with other input statistics than the data preprocessor's gets them with
``teacher_input_norm=dict(mean=..., std=...)`` (e.g. OpenAI CLIP's, in 0-255 units): its
batch is converted from the student's normalisation on the fly.

Input specs name a record as ``'student.<recorder>'``, ``'teacher.<recorder>'`` or a context
entry ``'context.<key>'`` (``patch_mask``, ``student_token_layout``, ``teacher_token_layout``);
the dict form ``dict(source='student.feat', connector='proj')`` passes a student/teacher record
through a connector first.

Logged values: ``student.<task loss>`` (task-model students), ``distill.loss_<term>`` (scaled
and weighted term, summed into the total) and ``distill.gap_<term>`` (the term without
``loss_weight`` or schedule scale: the teacher-student gap, e.g. the plain MSE; not summed).
"""
import fnmatch
import inspect
import logging
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.dist import get_rank
from mmengine.logging import print_log
from mmengine.model import BaseModel, BaseModule
from mmengine.runner.checkpoint import load_checkpoint

from mmlinvit.layers.patch_embed import patch_grid
from mmlinvit.registry import MODELS
from .errors import DistillationConfigError
from .input_specs import CONTEXT_KEYS, InputSpec, parse_input_spec
from .recorders import ModuleInputsRecorder, ModuleRecorder, build_recorder

TokenLayout = Tuple[int, int]


def _shape_of(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return str(tuple(value.shape))
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, torch.Tensor) for v in value):
        shapes = sorted({tuple(v.shape) for v in value})
        return f'{len(value)} x {shapes[0] if len(shapes) == 1 else shapes}'
    return repr(value)


def _drop_teacher_state(module: nn.Module, state_dict: Dict[str, Any], prefix: str,
                        local_metadata: Dict[str, Any]) -> None:
    """State-dict post-hook: the frozen teacher is rebuilt from its config, never saved."""
    teacher_prefix = prefix + 'teacher.'
    for key in [k for k in state_dict if k.startswith(teacher_prefix)]:
        del state_dict[key]


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
            teacher's input of block i instead of the student's own forward (AdaLA Stage 1).
        patch_masking: ``dict(ratio=0.75, seed=0)``: a learnable mask token replaces that
            ratio of the student's patch tokens, sampled per image (ViT-Linearizer).  Needs a
            bare backbone student with ``forward_tokens(x, patch_mask, mask_token)``.  The
            token is this model's ``mask_token``; with ``use_student_mask_token=True`` it is
            the student backbone's own ``mask_token`` parameter instead (e.g. Adventurer),
            which then trains and is exported with the student.
        trainable_params: fnmatch patterns of student parameter names that train (e.g.
            ``['blocks.*.attn.*']``); every other student parameter is frozen.  ``None``
            trains all.
        weight_transfer: ``dict(strategy='mlp_copy', **options)``: initialise the student
            backbone from the teacher backbone in :meth:`init_weights`
            (:func:`mmlinvit.transfer.transfer_weights`).
        student_token_layout: ``(prefix, suffix)`` special-token counts of the student's
            records; ``None`` reads ``num_prefix_tokens`` / ``num_suffix_tokens`` of its
            backbone.
        teacher_token_layout: Same for the teacher.
        check_input_size: (H, W) of the build-time dry run that checks every term on real
            records; ``None`` uses the student backbone's ``img_size``.
        check_finite: Stop with an error naming the term when a loss is NaN or inf.
        teacher_input_norm: ``dict(mean=[...], std=[...])``: the per-channel statistics the
            teacher was trained with, in the units of the data preprocessor (0-255 for the
            mmpretrain / mmseg preprocessors), when they differ from the student's (e.g. an
            OpenAI CLIP teacher under ImageNet statistics).  The batch, normalised by the
            data preprocessor with the student's ``mean_s`` / ``std_s``, is converted on the
            fly for the teacher: ``x_t = (x_s * std_s + mean_s - mean_t) / std_t``.  The
            student statistics are read from the data preprocessor (its ``mean`` / ``std``
            buffers), so a preprocessor that does not normalise is refused at build time.
            ``None``: the teacher sees the student's batch.
        data_preprocessor: Data preprocessor config; ``None`` reuses the student's when it
            is a task model.
        init_cfg: mmengine init config.
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
                 teacher_input_norm: Optional[dict] = None,
                 data_preprocessor: Optional[Union[dict, nn.Module]] = None,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        self.student = MODELS.build(student)
        self.student_is_task_model = isinstance(self.student, BaseModel)
        if data_preprocessor is None and self.student_is_task_model:
            self.data_preprocessor = self.student.data_preprocessor
        distill_losses = dict(distill_losses or {})
        self.check_finite = check_finite
        self.weight_transfer = None if weight_transfer is None else dict(weight_transfer)
        self.transfer_report = None

        needs_teacher = bool(distill_losses) or teacher_forcing is not None or weight_transfer
        if teacher is None:
            if needs_teacher:
                raise DistillationConfigError(
                    'distill_losses, teacher_forcing and weight_transfer need a teacher; set '
                    'teacher=dict(type=..., ...)')
            self.teacher = None
        else:
            self.teacher = self._build_teacher(teacher, teacher_ckpt, teacher_ckpt_layout)
        self._setup_teacher_input_norm(teacher_input_norm)

        self.student_recorders = self._attach_recorders(student_recorders, self.student,
                                                        'student')
        self.teacher_recorders = self._attach_recorders(teacher_recorders, self.teacher,
                                                        'teacher')
        self.connectors = nn.ModuleDict(
            {name: MODELS.build(cfg) for name, cfg in (connectors or {}).items()})

        self.teacher_forcing = self._check_teacher_forcing(teacher_forcing)
        self._setup_patch_masking(patch_masking)
        self.trainable_params = None if trainable_params is None else list(trainable_params)
        self._freeze_student(self.trainable_params)
        self.token_layouts = {
            'student': self._token_layout(student_token_layout, self.student_backbone()),
            'teacher': (self._token_layout(teacher_token_layout, self.teacher_backbone())
                        if self.teacher is not None else None),
        }

        self.distill_losses = nn.ModuleDict()
        self.term_inputs: Dict[str, List[InputSpec]] = {}
        for term, term_cfg in distill_losses.items():
            self._add_term(term, term_cfg)
        self._check_connectors_used()
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
    def student_backbone(self) -> nn.Module:
        """The student's backbone (the student itself when it is a bare backbone)."""
        return self.student.backbone if self.student_is_task_model else self.student

    def teacher_backbone(self) -> Optional[nn.Module]:
        """The teacher's backbone (the teacher itself when it is a bare backbone)."""
        if self.teacher is None:
            return None
        return self.teacher.backbone if isinstance(self.teacher, BaseModel) else self.teacher

    def _build_teacher(self, cfg: dict, ckpt: Optional[str], layout: str) -> nn.Module:
        teacher = MODELS.build(cfg)
        if callable(getattr(teacher, 'init_weights', None)):
            teacher.init_weights()  # loads the teacher config's own `pretrained=`
        if ckpt is not None:
            try:
                if isinstance(teacher, BaseModel):
                    load_checkpoint(teacher, ckpt, map_location='cpu', strict=True,
                                    revise_keys=[(r'^module\.', '')])
                else:
                    from mmlinvit.converters import load_pretrained
                    load_pretrained(teacher, ckpt, layout=layout)
            except (RuntimeError, ValueError, KeyError, FileNotFoundError) as err:
                raise DistillationConfigError(
                    f'teacher_ckpt {ckpt!r} does not fit the teacher '
                    f'{type(teacher).__name__}: {err}') from err
            print_log(f'Loaded the teacher weights from {ckpt}', logger='current')
        elif not getattr(teacher, 'pretrained', None) and not getattr(teacher, 'init_cfg', None):
            print_log('The teacher has no checkpoint (no teacher_ckpt, no pretrained=): it '
                      'keeps its random initialisation', logger='current',
                      level=logging.WARNING)
        # Never (re-)initialised by the runner, never trained.
        if isinstance(teacher, BaseModule):
            teacher._is_init = True
        else:
            teacher.is_init = True
        teacher.eval()
        for param in teacher.parameters():
            param.requires_grad_(False)
        return teacher

    def _student_input_stats(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The (C,) mean and std the data preprocessor normalises the batch with.

        Raises:
            DistillationConfigError: when the data preprocessor does not normalise.
        """
        pre = self.data_preprocessor
        mean, std = getattr(pre, 'mean', None), getattr(pre, 'std', None)
        enabled = getattr(pre, '_enable_normalize', mean is not None)
        if not (enabled and isinstance(mean, torch.Tensor) and isinstance(std, torch.Tensor)):
            raise DistillationConfigError(
                f'teacher_input_norm converts the batch normalised with the student statistics '
                f'into the teacher statistics, but the data preprocessor '
                f'({type(pre).__name__}) does not normalise, so the student statistics are '
                f'unknown. Give the model a normalising data preprocessor, e.g. '
                f"data_preprocessor=dict(type='ClsDataPreprocessor', mean=[123.675, 116.28, "
                f'103.53], std=[58.395, 57.12, 57.375], to_rgb=True) (top level of an '
                f'mmpretrain config, or inside the student task model), or drop '
                f'teacher_input_norm')
        return mean.detach().flatten().float(), std.detach().flatten().float()

    def _setup_teacher_input_norm(self, cfg: Optional[dict]) -> None:
        self.teacher_input_norm = None
        if cfg is None:
            return
        if self.teacher is None:
            raise DistillationConfigError('teacher_input_norm is set but there is no teacher')
        cfg = dict(cfg)
        if set(cfg) != {'mean', 'std'}:
            raise DistillationConfigError(f"teacher_input_norm takes 'mean' and 'std' (both "
                                          f'required), got keys {sorted(cfg)}')
        mean_t = torch.as_tensor(cfg['mean'], dtype=torch.float32).flatten()
        std_t = torch.as_tensor(cfg['std'], dtype=torch.float32).flatten()
        mean_s, std_s = self._student_input_stats()
        if not mean_t.numel() == std_t.numel() == mean_s.numel():
            raise DistillationConfigError(
                f'teacher_input_norm has {mean_t.numel()} mean and {std_t.numel()} std values, '
                f'the data preprocessor normalises {mean_s.numel()} channels')
        if not bool((std_t > 0).all()):
            raise DistillationConfigError(f'teacher_input_norm.std must be positive, got '
                                          f'{std_t.tolist()}')
        # Both sets must be in the same units: a 0-1 set next to a 0-255 one is a typo that
        # would silently feed the teacher images scaled by 255.  A pixel std is at most 0.5
        # in 0-1 units and far above 1 in 0-255 units.
        if (float(std_t.max()) <= 1.0) != (float(std_s.max()) <= 1.0):
            raise DistillationConfigError(
                f'teacher_input_norm std {std_t.tolist()} and the data preprocessor std '
                f'{std_s.tolist()} are in different units (0-1 vs 0-255): give the teacher '
                f'statistics in the data preprocessor units (e.g. multiply 0-1 statistics by '
                f'255 for mmpretrain / mmseg preprocessors)')
        self.teacher_input_norm = dict(mean=mean_t.tolist(), std=std_t.tolist())
        # Not in checkpoints: rebuilt from the config, like the teacher.
        self.register_buffer('teacher_mean', mean_t.view(1, -1, 1, 1), persistent=False)
        self.register_buffer('teacher_std', std_t.view(1, -1, 1, 1), persistent=False)

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
        mean_s, std_s = self._student_input_stats()
        mean_s = mean_s.to(inputs.device).view(1, -1, 1, 1)
        std_s = std_s.to(inputs.device).view(1, -1, 1, 1)
        pixels = inputs.float() * std_s + mean_s
        return ((pixels - self.teacher_mean) / self.teacher_std).to(inputs.dtype)

    @staticmethod
    def _attach_recorders(cfgs: Optional[Dict[str, Union[str, dict]]],
                          model: Optional[nn.Module], side: str) -> Dict[str, ModuleRecorder]:
        recorders = {}
        if cfgs and model is None:
            raise DistillationConfigError(f'{side}_recorders are set but there is no {side}')
        for name, cfg in (cfgs or {}).items():
            where = f'{side} recorder {name!r}'
            try:
                recorder = build_recorder(cfg)
            except (KeyError, TypeError) as err:
                raise DistillationConfigError(f'{where}: cannot build {cfg!r}: {err}') from err
            recorder.attach(model, where)
            recorders[name] = recorder
        return recorders

    def _check_teacher_forcing(self, cfg: Optional[dict]) -> Optional[dict]:
        if cfg is None:
            return None
        cfg = dict(cfg)
        unknown = sorted(set(cfg) - {'input_recorder', 'blocks'})
        if unknown or 'input_recorder' not in cfg:
            raise DistillationConfigError(
                f"teacher_forcing takes 'input_recorder' (required) and 'blocks', got keys "
                f"{sorted(cfg)}")
        cfg.setdefault('blocks', 'blocks')
        if self.student_is_task_model:
            raise DistillationConfigError('teacher_forcing needs a bare backbone student '
                                          f'(got {type(self.student).__name__})')
        recorder = self.teacher_recorders.get(cfg['input_recorder'])
        if not isinstance(recorder, ModuleInputsRecorder):
            raise DistillationConfigError(
                f"teacher_forcing.input_recorder {cfg['input_recorder']!r} must name a teacher "
                f"recorder of type 'ModuleInputs' (block inputs); teacher recorders: "
                f"{sorted(self.teacher_recorders)}")
        for idx in recorder.indices:
            path = f"{cfg['blocks']}.{idx}"
            try:
                block = self.student.get_submodule(path)
            except AttributeError as err:
                raise DistillationConfigError(
                    f'teacher_forcing: the student has no block {path!r} for the teacher input '
                    f'recorded at {recorder.paths[recorder.indices.index(idx)]!r}') from err
            if not callable(getattr(block, 'forward_attn', None)):
                raise DistillationConfigError(
                    f'teacher_forcing: student module {path!r} ({type(block).__name__}) has no '
                    f'forward_attn(x, hw_shape, num_prefix_tokens)')
        for attr in ('patch_size', 'num_prefix_tokens'):
            if not hasattr(self.student, attr):
                raise DistillationConfigError(
                    f'teacher_forcing needs the student backbone attribute {attr!r} '
                    f'({type(self.student).__name__} has none)')
        return cfg

    def _setup_patch_masking(self, cfg: Optional[dict]) -> None:
        self.mask_ratio = None
        self.mask_token = None
        if cfg is None:
            return
        cfg = dict(cfg)
        unknown = sorted(set(cfg) - {'ratio', 'seed', 'use_student_mask_token'})
        if unknown:
            raise DistillationConfigError(f"patch_masking takes 'ratio', 'seed' and "
                                          f"'use_student_mask_token', got unknown keys {unknown}")
        ratio = float(cfg.get('ratio', 0.75))
        if not 0.0 <= ratio < 1.0:
            raise DistillationConfigError(f'patch_masking.ratio must be in [0, 1), got {ratio}')
        if self.student_is_task_model or self.teacher_forcing is not None:
            raise DistillationConfigError('patch_masking needs a bare backbone student and no '
                                          'teacher forcing')
        backbone = self.student
        params = inspect.signature(backbone.forward_tokens).parameters if callable(
            getattr(backbone, 'forward_tokens', None)) else {}
        if not {'patch_mask', 'mask_token'} <= set(params):
            raise DistillationConfigError(
                f'patch_masking needs the student backbone to provide forward_tokens(x, '
                f'patch_mask, mask_token); {type(backbone).__name__} does not')
        for attr in ('patch_size', 'embed_dims'):
            if not hasattr(backbone, attr):
                raise DistillationConfigError(f'patch_masking needs the student backbone '
                                              f'attribute {attr!r}')
        self.mask_ratio = ratio
        self.mask_seed = int(cfg.get('seed', 0))
        if cfg.get('use_student_mask_token', False):
            # forward_tokens(mask_token=None) falls back to the backbone's own token
            if not isinstance(getattr(backbone, 'mask_token', None), nn.Parameter):
                raise DistillationConfigError(
                    f'patch_masking.use_student_mask_token needs a mask_token parameter in the '
                    f'student backbone; build {type(backbone).__name__} with '
                    f'with_mask_token=True or drop use_student_mask_token')
        else:
            self.mask_token = nn.Parameter(torch.zeros(1, backbone.embed_dims))
            nn.init.trunc_normal_(self.mask_token, std=0.02)
        # Masks are drawn from (seed, step, rank): resuming reproduces them exactly.
        self.register_buffer('mask_step', torch.zeros((), dtype=torch.long))

    def _freeze_student(self, patterns: Optional[List[str]]) -> None:
        if patterns is None:
            if self.teacher_forcing is not None:
                raise DistillationConfigError(
                    'teacher_forcing runs only the student attention modules: set '
                    "trainable_params (e.g. ['blocks.*.attn.*']) so nothing unused trains")
            return
        names = [name for name, _ in self.student.named_parameters()]
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
                raise DistillationConfigError(
                    f'trainable_params pattern {pattern!r} matches no student parameter; '
                    f'first names: {names[:8]}')
        for name, param in self.student.named_parameters():
            if not any(fnmatch.fnmatchcase(name, p) for p in patterns):
                param.requires_grad_(False)

    @staticmethod
    def _token_layout(layout: Optional[Sequence[int]],
                      backbone: nn.Module) -> Optional[TokenLayout]:
        if layout is not None:
            if len(layout) != 2:
                raise DistillationConfigError(f'a token layout is (prefix, suffix), got '
                                              f'{tuple(layout)}')
            return int(layout[0]), int(layout[1])
        if not hasattr(backbone, 'num_prefix_tokens'):
            return None  # an error is raised if a term maps it
        return int(backbone.num_prefix_tokens), int(getattr(backbone, 'num_suffix_tokens', 0))

    def _add_term(self, term: str, cfg: dict) -> None:
        if not isinstance(term, str) or not term.isidentifier() or 'loss' in term:
            raise DistillationConfigError(
                f"distill term name {term!r} must be an identifier without 'loss' (it is "
                f"logged as distill.loss_<term> and distill.gap_<term>)")
        if not isinstance(cfg, dict) or set(cfg) - {'loss', 'inputs'} or 'loss' not in cfg:
            raise DistillationConfigError(
                f"distill term {term!r} must be dict(loss=<loss config>, inputs={{arg: spec}}), "
                f"got {cfg!r}")
        loss = MODELS.build(cfg['loss'])
        params = inspect.signature(loss.forward).parameters
        accepted = [p for p in params if p != 'self']
        required = [p for p, v in params.items() if v.default is inspect.Parameter.empty
                    and v.kind in (v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY)]
        specs = []
        takes_any = any(v.kind == v.VAR_KEYWORD for v in params.values())
        for arg, spec in dict(cfg.get('inputs') or {}).items():
            if arg not in params and not takes_any:
                raise DistillationConfigError(
                    f'distill term {term!r}: {type(loss).__name__}.forward has no argument '
                    f'{arg!r}; it accepts {accepted}')
            specs.append(self._check_spec(term, parse_input_spec(term, arg, spec)))
        unmapped = [p for p in required if p not in {s.arg for s in specs}]
        if unmapped:
            raise DistillationConfigError(
                f'distill term {term!r}: required argument(s) {unmapped} of '
                f'{type(loss).__name__}.forward are not mapped in inputs')
        self.distill_losses[term] = loss
        self.term_inputs[term] = specs

    def _check_spec(self, term: str, spec: InputSpec) -> InputSpec:
        where = f'distill term {term!r}, argument {spec.arg!r}'
        if spec.side == 'context':
            if spec.name not in CONTEXT_KEYS:
                raise DistillationConfigError(f'{where}: unknown context entry {spec.name!r}; '
                                              f'available: {CONTEXT_KEYS}')
            if spec.name == 'patch_mask' and self.mask_ratio is None:
                raise DistillationConfigError(f'{where}: context.patch_mask needs '
                                              f'patch_masking=dict(ratio=...)')
            if spec.name.endswith('token_layout'):
                side = spec.name.split('_')[0]
                if self.token_layouts[side] is None:
                    raise DistillationConfigError(
                        f'{where}: the {side} backbone has no num_prefix_tokens attribute; set '
                        f'{side}_token_layout=(prefix, suffix) in the model config')
            return spec
        recorders = self.student_recorders if spec.side == 'student' else self.teacher_recorders
        if spec.name not in recorders:
            raise DistillationConfigError(f'{where}: {spec.side} recorder {spec.name!r} does '
                                          f'not exist; {spec.side} recorders: '
                                          f'{sorted(recorders)}')
        if spec.connector is not None and spec.connector not in self.connectors:
            raise DistillationConfigError(f'{where}: connector {spec.connector!r} does not '
                                          f'exist; connectors: {sorted(self.connectors)}')
        return spec

    def _check_connectors_used(self) -> None:
        used = {s.connector for specs in self.term_inputs.values() for s in specs}
        unused = sorted(set(self.connectors) - used)
        if unused:
            raise DistillationConfigError(f'connector(s) {unused} are used by no distill term '
                                          f'(they would never train)')

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
            from mmlinvit.transfer import transfer_weights
            options = dict(self.weight_transfer)
            strategy = options.pop('strategy', None)
            if strategy is None:
                raise DistillationConfigError("weight_transfer needs a 'strategy' key")
            self.transfer_report = transfer_weights(self.student_backbone(),
                                                    self.teacher_backbone(), strategy=strategy,
                                                    **options)
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
    @contextmanager
    def _recording(self) -> Iterator[None]:
        recorders = list(self.student_recorders.values()) + list(self.teacher_recorders.values())
        for rec in recorders:
            rec.reset()
            rec.enabled = True
        try:
            yield
        finally:
            for rec in recorders:
                rec.enabled = False
                rec.reset()

    def _sample_patch_mask(self, inputs: torch.Tensor, advance: bool) -> torch.Tensor:
        backbone = self.student
        grid = patch_grid(inputs.shape[-2:], backbone.patch_size)  # corner-padded grid
        num_patches = grid[0] * grid[1]
        num_masked = int(round(self.mask_ratio * num_patches))
        step = int(self.mask_step)
        generator = torch.Generator().manual_seed(
            (self.mask_seed * 1_000_003 + step * 1_009 + get_rank()) % (2**63 - 1))
        noise = torch.rand(inputs.shape[0], num_patches, generator=generator)
        masked_idx = noise.argsort(dim=1)[:, :num_masked]
        mask = torch.zeros(inputs.shape[0], num_patches, dtype=torch.bool)
        mask.scatter_(1, masked_idx, True)
        if advance:
            self.mask_step += 1
        return mask.to(inputs.device)

    def _run_teacher(self, inputs: torch.Tensor) -> None:
        inputs = self.teacher_inputs(inputs)
        with torch.no_grad():
            if isinstance(self.teacher, BaseModel):
                self.teacher(inputs, mode='tensor')
            else:
                self.teacher(inputs)

    def _run_teacher_forced_student(self, inputs: torch.Tensor, dry_run: bool = False) -> None:
        recorder = self.teacher_recorders[self.teacher_forcing['input_recorder']]
        block_inputs = recorder.get('teacher forcing input')
        if not isinstance(block_inputs, list):
            block_inputs = [block_inputs]
        backbone = self.student
        hw_shape = patch_grid(inputs.shape[-2:], backbone.patch_size)
        blocks = self.teacher_forcing['blocks']
        for idx, x in zip(recorder.indices, block_inputs):
            block = self.student.get_submodule(f'{blocks}.{idx}')
            try:
                block.forward_attn(x, hw_shape, backbone.num_prefix_tokens)
            except RuntimeError as err:
                if not dry_run:
                    raise
                raise DistillationConfigError(
                    f'teacher forcing: student block {blocks}.{idx} cannot take the teacher '
                    f'block input of shape {tuple(x.shape)} (student embed_dims='
                    f'{getattr(backbone, "embed_dims", "?")}, grid {hw_shape}, '
                    f'{backbone.num_prefix_tokens} prefix tokens): {err}') from err

    def _run_student(self, inputs: torch.Tensor, data_samples: Optional[list],
                     patch_mask: Optional[torch.Tensor], task_loss: bool,
                     dry_run: bool = False) -> Dict[str, Any]:
        if self.teacher_forcing is not None:
            self._run_teacher_forced_student(inputs, dry_run)
            return {}
        if self.student_is_task_model:
            if task_loss:
                return self.student.loss(inputs, data_samples)
            self.student(inputs, mode='tensor')
            return {}
        if patch_mask is not None:
            self.student.forward_tokens(inputs, patch_mask=patch_mask, mask_token=self.mask_token)
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
        out = {}
        for term, loss in self.distill_losses.items():
            specs = self.term_inputs[term]
            try:
                kwargs = {s.arg: self._resolve(s, context) for s in specs}
                raw = loss(**kwargs)
            except (ValueError, RuntimeError, TypeError) as err:
                if not dry_run:
                    raise
                described = []
                for s in specs:
                    try:
                        shape = _shape_of(self._resolve(s, context))
                    except (ValueError, RuntimeError, TypeError):
                        shape = '?'
                    described.append(f'{s.arg} <- {s!r}: {shape}')
                raise DistillationConfigError(
                    f'distill term {term!r} ({type(loss).__name__}) does not fit the records of '
                    f'a dry run at input size {self._dry_run_size()}: '
                    f'{"; ".join(described)}. {err}') from err
            weight = getattr(loss, 'loss_weight', 1.0)
            gap = raw.detach() / weight if weight else raw.detach()
            out[f'distill.loss_{term}'] = raw * self.distill_scales[term]
            out[f'distill.gap_{term}'] = gap
        return out

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
        try:
            with torch.no_grad(), self._recording():
                mask = (self._sample_patch_mask(inputs, advance=False)
                        if self.mask_ratio is not None else None)
                self._run_teacher(inputs)
                self._run_student(inputs, None, mask, task_loss=False, dry_run=True)
                self._distill_terms(self._context(mask), dry_run=True)
        finally:
            self.train(was_training)

    # ------------------------------------------------------------------ mmengine API
    def loss(self, inputs: torch.Tensor, data_samples: Optional[list] = None) -> Dict[str, Any]:
        """Task losses of the student (``student.*``) plus every distillation term.

        Raises:
            FloatingPointError: naming the term whose value is NaN or inf.
        """
        losses: Dict[str, Any] = {}
        with self._recording():
            mask = (self._sample_patch_mask(inputs, advance=self.training)
                    if self.mask_ratio is not None else None)
            if self.distill_losses or self.teacher_forcing is not None:
                self._run_teacher(inputs)
            student_losses = self._run_student(inputs, data_samples, mask, task_loss=True)
            losses.update({f'student.{k}': v for k, v in student_losses.items()})
            losses.update(self._distill_terms(self._context(mask)))
        if self.check_finite:
            self._check_finite(losses)
        return losses

    @staticmethod
    def _check_finite(losses: Dict[str, Any]) -> None:
        for key, value in losses.items():
            if 'loss' not in key:
                continue
            values = value if isinstance(value, (list, tuple)) else [value]
            for v in values:
                if isinstance(v, torch.Tensor) and not bool(torch.isfinite(v).all()):
                    raise FloatingPointError(
                        f'Loss term {key!r} is not finite ({v.detach().float().mean().item()}); '
                        f'training stopped. Lower the learning rate or this term\'s weight, or '
                        f'check the inputs of the term.')

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
