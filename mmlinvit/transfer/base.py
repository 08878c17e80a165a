"""Weight transfer from a softmax teacher ViT into a linearized student ViT (torch only).

A *strategy* decides which teacher tensors are copied into the student and may write
structured initialisations of its own (Mimetic, Impulse).  :func:`transfer_weights` pairs the
two state dicts, checks that the architectures agree, copies what the strategy selects and
returns a :class:`TransferReport` that says exactly where every tensor came from.

Pairing rule: a teacher state-dict key has a *counterpart* when the student has the same key
with the same shape.  The one exception is ``pos_embed``: a learned teacher grid is paired
with a learned student grid of another size (resampled with the student's ``pos_interp``),
and its class position is dropped when the student has no class token; such copies are listed
in :attr:`TransferReport.adapted`.  Any other key present on both sides with different shapes
is an architecture mismatch and raises.

Tokens and a learned position grid the student is built without (``cls_token``,
``reg_token``, ``mask_token``, ``pos_embed``) are listed in
:attr:`TransferReport.no_counterpart`.  Any other teacher tensor the strategy would copy
but the student has no place for (LayerScale ``ls1`` / ``ls2.gamma``, CLIP's ``pre_norm``,
the final ``norm``, a bias), and any student LayerScale / ``pre_norm`` / final ``norm`` the
strategy would copy but the teacher lacks, is refused (:func:`check_transfer_structure`):
the copied weights would compute another function than the teacher's.
"""
import dataclasses
import re
from typing import Any, Dict, Mapping, Optional, Set, Tuple, Union

import torch
import torch.nn as nn

from mmlinvit.backbones import VisionTransformer
from mmlinvit.backbones.vit import operator_name as block_operator_name
from mmlinvit.backbones.training_record import MLP_ACT_RECORD, decode_names
from mmlinvit.layers.pos_embed import checkpoint_pos_grid, recorded_pos_grid, resample_pos_grid
from mmlinvit.utils import NameRegistry

#: Registered weight-transfer strategies (snake_case names and the papers' CamelCase aliases).
TRANSFER_STRATEGIES = NameRegistry('weight-transfer strategy')

TeacherLike = Union[nn.Module, Mapping[str, torch.Tensor]]


@dataclasses.dataclass
class TransferReport:
    """Where every student tensor came from, and what of the teacher was used.

    Names are state-dict keys in the canonical layout (``blocks.3.attn.qkv.weight``); a copied
    key has the same name on both sides.  Invariants (checked by :meth:`validate`)::

        student keys = copied | initialized                 (disjoint)
        teacher keys = copied | skipped | no_counterpart    (disjoint)
        student_only, strategy_initialized  are subsets of  initialized

    Args:
        strategy: Canonical name of the strategy that produced the report.
        copied: Student keys whose tensor was copied from the teacher key of the same name
            (bitwise, unless the key is in ``adapted``).
        initialized: Student keys whose tensor does not come from the teacher: they keep the
            student's own initialisation (timm-style init of ``VisionTransformer`` and each
            operator's ``init_extra_parameters()``) or were written by the strategy.
        student_only: Student keys without a teacher counterpart (e.g. Hedgehog / MHLA / TTT
            operator parameters, a class token the teacher lacks).
        strategy_initialized: Student keys the strategy itself wrote (Mimetic, Impulse).
        no_counterpart: Teacher keys without a student counterpart (e.g. ``mask_token`` or
            ``cls_token`` when the student has none); no strategy can copy them.
        skipped: Teacher keys that have a student counterpart but that the strategy chose not
            to copy (e.g. ``attn.qkv.*`` under ``mlp_copy``).
        adapted: Copied keys whose tensor was transformed on the way, with a description
            (``pos_embed`` resampled to the student grid / class position dropped).
        options: The strategy's options (seeds, alpha / beta, base strategy...).
        details: Strategy-specific results (e.g. the impulse shifts chosen per layer).
    """

    strategy: str
    copied: Set[str] = dataclasses.field(default_factory=set)
    initialized: Set[str] = dataclasses.field(default_factory=set)
    student_only: Set[str] = dataclasses.field(default_factory=set)
    strategy_initialized: Set[str] = dataclasses.field(default_factory=set)
    no_counterpart: Set[str] = dataclasses.field(default_factory=set)
    skipped: Set[str] = dataclasses.field(default_factory=set)
    adapted: Dict[str, str] = dataclasses.field(default_factory=dict)
    options: Dict[str, Any] = dataclasses.field(default_factory=dict)
    details: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def validate(self, student_keys: Set[str], teacher_keys: Set[str]) -> None:
        """Raises ``AssertionError`` naming the first documented invariant that does not hold.

        Args:
            student_keys: All state-dict keys of the student.
            teacher_keys: All state-dict keys of the teacher.
        """
        teacher_parts = (self.copied, self.skipped, self.no_counterpart)
        checks = (
            (not self.copied & self.initialized, 'copied and initialized overlap'),
            (self.copied | self.initialized == student_keys,
             'copied | initialized is not the set of student keys'),
            (sum(len(p) for p in teacher_parts) == len(set().union(*teacher_parts)),
             'copied, skipped and no_counterpart overlap'),
            (set().union(*teacher_parts) == teacher_keys,
             'copied | skipped | no_counterpart is not the set of teacher keys'),
            (self.student_only <= self.initialized, 'student_only is not within initialized'),
            (self.strategy_initialized <= self.initialized,
             'strategy_initialized is not within initialized'),
            (set(self.adapted) <= self.copied, 'adapted is not within copied'),
        )
        for holds, problem in checks:
            if not holds:
                raise AssertionError(f'Inconsistent transfer report ({self.strategy}): {problem}')

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready dict: sorted name lists plus their counts."""
        out: Dict[str, Any] = dict(strategy=self.strategy)
        counts = {}
        for field in ('copied', 'initialized', 'student_only', 'strategy_initialized',
                      'no_counterpart', 'skipped'):
            names = sorted(getattr(self, field))
            out[field] = names
            counts[field] = len(names)
        out['counts'] = counts
        out['adapted'] = dict(sorted(self.adapted.items()))
        out['options'] = dict(self.options)
        out['details'] = dict(self.details)
        return out

    def summary(self) -> str:
        """One line: strategy and the size of each set."""
        return (f'{self.strategy}: copied {len(self.copied)}, initialized '
                f'{len(self.initialized)} (strategy-set {len(self.strategy_initialized)}, '
                f'student-only {len(self.student_only)}), teacher skipped {len(self.skipped)}, '
                f'teacher without counterpart {len(self.no_counterpart)}')


class TransferStrategy:
    """Base class: which paired teacher tensors to copy, and what to write afterwards.

    Subclasses override :meth:`selects` (a pure function of the key) and, for structured
    initialisations, :meth:`check` (validate the student before anything is written) and
    :meth:`initialize` (write tensors; return the keys written).
    """

    #: Canonical registered name, used in reports.
    name: str = ''

    def selects(self, key: str) -> bool:
        """Whether the paired teacher tensor ``key`` is copied into the student."""
        return False

    def check(self, student: VisionTransformer) -> None:
        """Raises a clear error if the strategy cannot be applied to ``student``."""

    def initialize(self, student: VisionTransformer, report: TransferReport) -> Set[str]:
        """Writes the strategy's own tensors after copying; returns the student keys written.

        Args:
            student: The student, already holding the copied tensors.
            report: The report being built; strategies may add ``details``.
        """
        return set()

    def options(self) -> Dict[str, Any]:
        """JSON-ready options, recorded in the report."""
        return {}


def build_transfer_strategy(strategy: Union[str, dict, TransferStrategy],
                            **kwargs: Any) -> TransferStrategy:
    """Builds a strategy from a name, a ``dict(type=...)`` config or returns an instance.

    Configs name the strategy with ``type`` like every other part
    (``weight_transfer=dict(type='mlp_copy')``); the former key ``strategy`` is refused with
    the fix.

    Args:
        strategy: Registered name (``'mlp_copy'``, ``'MLPCopy'``...), config dict with a
            ``type`` key and the strategy's options, or an instance.
        **kwargs: Strategy options (ignored for instances; pass them to the constructor).

    Raises:
        ValueError: A config dict that names the strategy with ``strategy=`` instead of
            ``type=``.
        KeyError: Unknown strategy (the message lists the registered ones).
    """
    if isinstance(strategy, TransferStrategy):
        if kwargs:
            raise TypeError(f'Options {sorted(kwargs)} given together with an already built '
                            f'strategy {strategy.name!r}; pass them to its constructor instead')
        return strategy
    if isinstance(strategy, Mapping) and 'strategy' in strategy:
        options = {k: v for k, v in strategy.items() if k not in ('strategy', 'type')}
        fixed = ', '.join([f'type={strategy["strategy"]!r}'] +
                          [f'{k}={v!r}' for k, v in options.items()])
        raise ValueError(f'A weight-transfer config names its strategy with "type", like every '
                         f'other part of a config; the key "strategy" is not read. Write '
                         f'dict({fixed}) (e.g. weight_transfer=dict(type=\'mlp_copy\')), got '
                         f'{dict(strategy)!r}')
    return TRANSFER_STRATEGIES.build(strategy, **kwargs)


# ---------------------------------------------------------------------- pairing
def _teacher_state(teacher: TeacherLike) -> Tuple[Dict[str, torch.Tensor], bool]:
    """Teacher state dict (detached) and whether its ``pos_embed`` starts with a class position."""
    if isinstance(teacher, nn.Module):
        if not isinstance(teacher, VisionTransformer):
            raise TypeError('The teacher must be a mmlinvit VisionTransformer or a canonical '
                            f'state dict, got a {type(teacher).__name__} module')
        state = {k: v.detach() for k, v in teacher.state_dict().items()
                 if k not in VisionTransformer.TRAINING_RECORDS}
        return state, teacher.with_cls_token
    if not isinstance(teacher, Mapping):
        raise TypeError('The teacher must be a VisionTransformer or a state dict (mapping of '
                        f'names to tensors), got {type(teacher).__name__}')
    state = {}
    for key, value in teacher.items():
        if key in VisionTransformer.TRAINING_RECORDS:  # describes weights, is none
            continue
        if not isinstance(value, torch.Tensor):
            raise TypeError(f'Teacher state dict entry {key!r} is a {type(value).__name__}, not '
                            'a tensor; pass the state dict itself, not a checkpoint wrapper')
        state[key] = value.detach()
    return state, 'cls_token' in state


def _teacher_shape(state: Mapping[str, torch.Tensor]) -> Tuple[int, int]:
    """(embed_dims, num_layers) of a canonical teacher state dict."""
    depth = {int(k.split('.')[1]) for k in state if k.startswith('blocks.') and
             k.split('.')[1].isdigit()}
    width_key = next((k for k in ('patch_embed.proj.weight', 'blocks.0.norm1.weight')
                      if k in state), None)
    if not depth or width_key is None:
        raise ValueError('The teacher state dict is not in the canonical layout (no '
                         "'blocks.<i>.' / 'patch_embed.proj.weight' keys; first keys: "
                         f'{list(state)[:5]}). Convert it first with '
                         'mmlinvit.converters.convert_state_dict(state_dict, layout="auto").')
    missing = sorted(set(range(max(depth) + 1)) - depth)
    if missing:
        raise ValueError(f'The teacher state dict has no tensors of blocks {missing} (it has '
                         f'blocks.0 .. blocks.{max(depth)}): a truncated or filtered file; '
                         f'their student blocks would silently keep their initialisation')
    return state[width_key].shape[0], max(depth) + 1


def check_compatible(student: VisionTransformer, teacher: TeacherLike) -> None:
    """Raises ``ValueError`` naming both shapes if width, depth or heads differ.

    Args:
        student: The student backbone.
        teacher: Teacher backbone or canonical state dict.
    """
    state, _ = _teacher_state(teacher)
    t_width, t_depth = _teacher_shape(state)
    t_heads = teacher.num_heads if isinstance(teacher, VisionTransformer) else None
    mismatch = (t_width != student.embed_dims or t_depth != student.num_layers or
                (t_heads is not None and t_heads != student.num_heads))
    if mismatch:
        heads = f', num_heads={t_heads}' if t_heads is not None else ''
        raise ValueError(
            f'Teacher and student architectures differ: teacher embed_dims={t_width}, '
            f'num_layers={t_depth}{heads} vs student embed_dims={student.embed_dims}, '
            f'num_layers={student.num_layers}, num_heads={student.num_heads}. Weight transfer '
            'needs the same width, depth and heads; build the student with the teacher arch.')


def _check_same_act(student: VisionTransformer, teacher: TeacherLike) -> None:
    """Refuses a teacher whose MLP activation is known and is not the student's: its MLP
    weights would be copied into a student that computes another function with them."""
    if isinstance(teacher, VisionTransformer):
        theirs, where = teacher.act, f'the teacher backbone ({teacher.act_source})'
    elif isinstance(teacher, Mapping) and isinstance(teacher.get(MLP_ACT_RECORD), torch.Tensor):
        theirs, where = decode_names(teacher[MLP_ACT_RECORD])[0], 'the teacher state dict record'
    else:
        return
    if theirs != student.act:
        raise ValueError(f'The teacher\'s MLP uses act={theirs!r} ({where}), the student '
                         f'act={student.act!r} ({student.act_source}): copied MLP weights '
                         f'would compute another function. Build the student with '
                         f'act={theirs!r}.')


def _teacher_grid(teacher: TeacherLike) -> Optional[Tuple[int, int]]:
    """The (rows, cols) of the teacher's position grid when it is known: a backbone's own
    grid, a state dict's ``pos_embed_grid`` record (mmlinvit files); ``None`` otherwise."""
    if isinstance(teacher, VisionTransformer):
        return tuple(teacher.pos_grid)
    return recorded_pos_grid(teacher) if isinstance(teacher, Mapping) else None


def _adapt_pos_embed(teacher_pos: torch.Tensor, teacher_has_cls: bool,
                     student: VisionTransformer,
                     teacher_grid: Optional[Tuple[int, int]] = None
                     ) -> Tuple[Optional[torch.Tensor], str]:
    """Teacher ``pos_embed`` reshaped for the student (or ``None``), and what was done;
    ``teacher_grid`` is the teacher grid's (rows, cols) when known (else it must be square)."""
    if student.pos_embed is None or teacher_pos.ndim != 3:
        return None, ''
    if teacher_pos.shape[-1] != student.embed_dims:
        return None, ''
    if student.with_cls_token and not teacher_has_cls:
        return None, ''  # the student's class position has no teacher value
    start = int(teacher_has_cls)
    patch = teacher_pos[:, start:]
    notes = []
    if teacher_has_cls and not student.with_cls_token:
        notes.append('class position dropped')
    src = checkpoint_pos_grid(patch.shape[1], teacher_grid)
    dst = tuple(student.pos_grid)
    if src != dst:
        patch = resample_pos_grid(patch, src, dst, student.pos_interp)
        notes.append(f'grid {src[0]}x{src[1]} resampled to {dst[0]}x{dst[1]} '
                     f'({student.pos_interp})')
    parts = [teacher_pos[:, :1], patch] if student.with_cls_token else [patch]
    return torch.cat(parts, dim=1), '; '.join(notes)


def pair_state_dicts(student: VisionTransformer, teacher: TeacherLike
                     ) -> Tuple[Dict[str, torch.Tensor], Dict[str, str], Set[str]]:
    """Pairs teacher tensors with student keys (see the module docstring for the rule).

    Args:
        student: The student backbone.
        teacher: Teacher backbone or canonical state dict.

    Returns:
        ``(counterparts, adapted, no_counterpart)``: teacher tensors ready to copy keyed by the
        shared name, descriptions of adapted tensors, and teacher keys without counterpart.

    Raises:
        ValueError: If width / depth differ, or a shared key has incompatible shapes.
    """
    check_compatible(student, teacher)
    _check_same_act(student, teacher)
    state, teacher_has_cls = _teacher_state(teacher)
    student_state = student_weights(student)
    counterparts: Dict[str, torch.Tensor] = {}
    adapted: Dict[str, str] = {}
    no_counterpart: Set[str] = set()
    mismatched = []
    for key, value in state.items():
        if key not in student_state:
            no_counterpart.add(key)
            continue
        target_shape = student_state[key].shape
        teacher_grid = _teacher_grid(teacher) if key == 'pos_embed' else None
        if value.shape == target_shape and (key != 'pos_embed'
                                            or student.on_model_grid(value, teacher_grid)):
            counterparts[key] = value
            continue
        if key == 'pos_embed':
            pos, note = _adapt_pos_embed(value, teacher_has_cls, student, teacher_grid)
            if pos is not None and pos.shape == target_shape:
                counterparts[key] = pos
                adapted[key] = note
            else:
                no_counterpart.add(key)
            continue
        mismatched.append(f'{key}: teacher {tuple(value.shape)} vs student '
                          f'{tuple(target_shape)}')
    if mismatched:
        shown = '; '.join(mismatched[:8]) + ('; ...' if len(mismatched) > 8 else '')
        raise ValueError(f'{len(mismatched)} teacher tensors do not fit the student ({shown}). '
                         'Teacher and student must share the architecture (arch, MLP type, '
                         'biases, register tokens).')
    return counterparts, adapted, no_counterpart


#: Teacher keys a student may lack on purpose (it is built without that token or without a
#: learned position grid); every other teacher tensor takes part in the computation of the
#: tensors around it.
_TOKEN_KEYS = frozenset({'cls_token', 'reg_token', 'mask_token', 'pos_embed'})
#: Student tensors that change the function of the tensors copied around them when the
#: teacher lacks them (LayerScale, CLIP's ``pre_norm``, the final norm).
_STRUCTURAL_STUDENT_KEY = re.compile(
    r'^(blocks\.\d+\.ls[12]\.gamma|(pre_norm|norm)\.(weight|bias))$')
_LAYER_SCALE_KEY = re.compile(r'^blocks\.\d+\.ls[12]\.gamma$')


class TransferStructureError(ValueError):
    """The strategy would copy tensors whose neighbours the teacher and student do not share:
    the copied weights would compute another function than the teacher's."""


def _structure_hint(key: str, teacher_side: bool) -> str:
    """The student option that gives ``key`` a place (``teacher_side``) or removes it."""
    if _LAYER_SCALE_KEY.match(key):
        return ('LayerScale: build the student with the teacher\'s family (deit3 / dinov2 have '
                'LayerScale) or layer_scale_init=<float>' if teacher_side else
                'LayerScale: the teacher has none; build the student with '
                'layer_scale_init=None (or the teacher\'s family, e.g. deit)')
    if key.startswith('pre_norm.'):
        return ('pre_norm: build the student with pre_norm=True (CLIP\'s ln_pre; family '
                '\'clip\')' if teacher_side else
                'pre_norm: the teacher has none; build the student with pre_norm=False')
    if key.startswith('norm.'):
        return ('final norm: build the student with final_norm=True' if teacher_side else
                'final norm: the teacher has none (e.g. an MAE fine-tuned release); build the '
                'student with final_norm=False')
    if key.endswith('.bias'):
        return (f'{key}: build the student with that bias (qkv_bias / patch_bias / the '
                f'teacher\'s family)')
    return (f'{key}: build the student with the teacher\'s arch / family / mlp_type, or give a '
            f'canonical state dict (mmlinvit.converters.convert_state_dict(state_dict, '
            f'layout="auto"))')


def unplaced_tensors(student: VisionTransformer, teacher: TeacherLike,
                     strategy: Union[str, dict, 'TransferStrategy']) -> Tuple[Set[str], Set[str]]:
    """Tensors that make the strategy's copy compute another function than the teacher's.

    ``(teacher_keys, student_keys)``: teacher tensors the strategy would copy but the student
    has no place for (other than the tokens and position grid a student may lack on purpose:
    ``cls_token``, ``reg_token``, ``mask_token``, ``pos_embed``), e.g. the teacher's
    LayerScale ``blocks.i.ls2.gamma`` under MLPCopy for a student without LayerScale (its
    copied MLP branch would run at 1/gamma of the teacher's), CLIP's ``pre_norm`` under
    FullCopy; and student LayerScale / ``pre_norm`` / final ``norm`` tensors the strategy would
    copy but the teacher lacks (they would keep their initialisation, e.g. gamma = 1e-6).

    Args:
        student: The student backbone.
        teacher: Teacher backbone or canonical state dict.
        strategy: The strategy (name, config dict or instance).
    """
    strat = build_transfer_strategy(strategy)
    teacher_keys = set(_teacher_state(teacher)[0])
    student_keys = set(student_weights(student))
    teacher_only = {k for k in teacher_keys - student_keys
                    if k not in _TOKEN_KEYS and strat.selects(k)}
    student_only = {k for k in student_keys - teacher_keys
                    if _STRUCTURAL_STUDENT_KEY.match(k) and strat.selects(k)}
    return teacher_only, student_only


def _numbered(keys: Set[str]) -> str:
    shown = sorted(keys)
    return ', '.join(shown[:8]) + (f', ... ({len(shown)} in all)' if len(shown) > 8 else '')


def check_transfer_structure(student: VisionTransformer, teacher: TeacherLike,
                             strategy: Union[str, dict, 'TransferStrategy']) -> None:
    """Refuses a transfer whose copied tensors would compute another function than the
    teacher's because a tensor around them exists on one side only (see
    :func:`unplaced_tensors`); the message names the tensors and the student option that
    makes the two structures agree.  Nothing is written.

    Raises:
        TransferStructureError: naming the tensors and the fix.
    """
    strat = build_transfer_strategy(strategy)
    teacher_only, student_only = unplaced_tensors(student, teacher, strat)
    if not teacher_only and not student_only:
        return
    parts = []
    if teacher_only:
        parts.append(f'teacher tensors with no place in the student: {_numbered(teacher_only)}')
    if student_only:
        parts.append(f'student tensors the teacher does not have (they would keep their '
                     f'initialisation): {_numbered(student_only)}')
    hints = sorted({_structure_hint(k, True) for k in teacher_only} |
                   {_structure_hint(k, False) for k in student_only})
    layer_scale = any(_LAYER_SCALE_KEY.match(k) for k in teacher_only | student_only)
    opt_out = ''
    if layer_scale and strat.name != 'full_copy':
        opt_out = (" To leave the LayerScale out of the transfer on purpose (the copied MLP "
                   "branch then runs at the student's own scale), pass include_layer_scale="
                   "False to mlp_copy: weight_transfer=dict(type='mlp_copy', "
                   "include_layer_scale=False), base=dict(type='mlp_copy', "
                   "include_layer_scale=False) for mimetic / impulse, or --strategy-arg "
                   "include_layer_scale=false (mlp_copy) in tools/linearize.py.")
    example = (' (a copied MLP branch without the teacher\'s LayerScale gamma runs at 1/gamma '
               'of the teacher\'s; under a student gamma the teacher lacks, at gamma times it)'
               if layer_scale else '')
    raise TransferStructureError(
        f'Strategy {strat.name!r} would copy weights whose surrounding structure teacher and '
        f'student do not share, so they would compute another function than the '
        f'teacher\'s{example}: {"; ".join(parts)}. Fix: {"; ".join(hints)}.{opt_out}')


def student_weights(student: VisionTransformer, keep_vars: bool = False
                    ) -> Dict[str, torch.Tensor]:
    """The student's state dict without its training records (``block_operators`` says
    what the student is; it is never copied from the teacher nor reported)."""
    return {k: v for k, v in student.state_dict(keep_vars=keep_vars).items()
            if k not in student.TRAINING_RECORDS}


# ---------------------------------------------------------------------- entry point
def transfer_weights(student: VisionTransformer,
                     teacher_or_state_dict: TeacherLike,
                     strategy: Union[str, dict, TransferStrategy] = 'mlp_copy',
                     **kwargs: Any) -> TransferReport:
    """Initialises ``student`` from a softmax teacher with a registered strategy (in place).

    Args:
        student: The linearized student (``VisionTransformer`` built with ``attn_cfg``).
        teacher_or_state_dict: The softmax teacher backbone, or its state dict in the canonical
            layout (convert official checkpoints with :mod:`mmlinvit.converters` first).
        strategy: Registered name (see ``TRANSFER_STRATEGIES.names``), a config dict with a
            ``type`` key, or a built :class:`TransferStrategy`.
        **kwargs: Options of the strategy (e.g. ``alpha``, ``seed``, ``base`` for Mimetic).

    Returns:
        A :class:`TransferReport`.

    Raises:
        KeyError: Unknown strategy (the message lists the registered ones).
        ValueError: Incompatible teacher / student, a strategy that cannot be applied to
            an operator of the student, or a teacher module built with ``pretrained=`` whose
            weights were never loaded (raised before anything is written).
        TransferStructureError: (a ``ValueError``) the strategy would copy tensors whose
            LayerScale / ``pre_norm`` / final norm / bias exists on one side only, so the copy
            would compute another function than the teacher's (:func:`unplaced_tensors`;
            raised before anything is written, naming the student option that fixes it).
    """
    if not isinstance(student, VisionTransformer):
        raise TypeError('The student must be a mmlinvit VisionTransformer, got '
                        f'{type(student).__name__}')
    if (isinstance(teacher_or_state_dict, nn.Module)
            and getattr(teacher_or_state_dict, 'pretrained', None)
            and not getattr(teacher_or_state_dict, 'weights_loaded', True)):
        raise ValueError(
            f'the teacher was built with pretrained={teacher_or_state_dict.pretrained!r} but its '
            f'weights were never loaded (pretrained= is read by init_weights()): call '
            f'teacher.init_weights() before transfer_weights, or the student would copy a '
            f'random teacher')
    strat = build_transfer_strategy(strategy, **kwargs)
    counterparts, adapted, no_counterpart = pair_state_dicts(student, teacher_or_state_dict)
    strat.check(student)
    check_transfer_structure(student, teacher_or_state_dict, strat)

    report = TransferReport(strategy=strat.name, options=strat.options())
    report.no_counterpart = no_counterpart
    student_tensors = student_weights(student, keep_vars=True)
    with torch.no_grad():
        for key, value in counterparts.items():
            if strat.selects(key):
                student_tensors[key].copy_(value)
                report.copied.add(key)
                if key in adapted:
                    report.adapted[key] = adapted[key]
            else:
                report.skipped.add(key)
        written = strat.initialize(student, report)
    overwritten = written & report.copied
    if overwritten:
        raise RuntimeError(f'Strategy {strat.name!r} overwrote copied tensors '
                           f'{sorted(overwritten)}; its base strategy must not copy them')
    student_keys = set(student_tensors)
    report.initialized = student_keys - report.copied
    report.student_only = student_keys - set(counterparts)
    report.strategy_initialized = set(written)
    report.validate(student_keys, set(counterparts) | no_counterpart)
    return report


# ---------------------------------------------------------------------- structured inits
def operator_name(student: VisionTransformer, index: int) -> str:
    """The operator name layer ``index`` of ``student`` was built with."""
    return block_operator_name(student.attn_cfgs[index])


class AttentionInitStrategy(TransferStrategy):
    """Base of structured attention initialisations (Mimetic, Impulse) composed with a copy base.

    The copy part is delegated to ``base``, which must leave ``attn.qkv`` and ``attn.proj``
    alone (``'random'`` or ``'mlp_copy'``); the structured part then writes the attention
    projections of every block.

    Args:
        base: Copy strategy run first: ``'random'`` (copy nothing) or ``'mlp_copy'``, as a
            name or config dict (``dict(type='mlp_copy', include_layer_scale=True)``).
    """

    #: Canonical names of the copy strategies a structured init can be combined with.
    ALLOWED_BASES = ('random', 'mlp_copy')

    def __init__(self, base: Union[str, dict] = 'random') -> None:
        self.base = build_transfer_strategy(base)
        if self.base.name not in self.ALLOWED_BASES:
            raise ValueError(f'{self.name!r} writes the attention projections itself, so it can '
                             f'only be combined with a base strategy that does not copy them: '
                             f'{self.ALLOWED_BASES}; got base={self.base.name!r}')

    def selects(self, key: str) -> bool:
        return self.base.selects(key)

    def check(self, student: VisionTransformer) -> None:
        """Every layer must mix tokens through q.k^T (``has_qk_form``)."""
        for i, block in enumerate(student.blocks):
            if not block.attn.has_qk_form:
                raise ValueError(
                    f'Strategy {self.name!r} initialises per-head q.k^T products, but layer {i} '
                    f'of the student uses operator {operator_name(student, i)!r}, which has no '
                    f'q.k^T form (has_qk_form=False). Use a copy strategy (random / copy / '
                    f'mlp_copy / full_copy) for this student, or a per-layer attn_cfg whose '
                    f'operators all have a q.k^T form.')
        self.base.check(student)

    def options(self) -> Dict[str, Any]:
        return dict(base=self.base.name, base_options=self.base.options())

    @staticmethod
    def run_seed(seed: Optional[int]) -> int:
        """``seed``, or for ``None`` the seed of torch's default generator: the run's
        ``randomness.seed`` under mmengine (set before weights are initialised), ``--seed`` of
        ``tools/linearize.py``; so runs with other seeds draw other structured inits, as the
        official code (which draws from torch's global generator) does.

        Args:
            seed: The strategy's ``seed`` option.
        """
        return torch.initial_seed() if seed is None else int(seed)
