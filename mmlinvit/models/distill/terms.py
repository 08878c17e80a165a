"""Distillation terms: a loss and, for each of its arguments, where the value comes from.

A term is configured as ``dict(loss=<loss config>, inputs={arg: spec})`` (see
:mod:`.input_specs` for the specs).  At build time :func:`build_term` builds the loss and
checks the mapping against the signature of its ``forward`` and, through :func:`check_spec`,
against the model's recorders, connectors and context.  :func:`compute_terms` evaluates the
terms on the records of a step (in the build-time dry run naming the shapes of a term that
does not fit them).
"""
import inspect
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from mmlinvit.registry import MODELS
from .errors import DistillationConfigError
from .input_specs import CONTEXT_KEYS, InputSpec, parse_input_spec
from .recorders import ModuleRecorder

#: Checks one parsed spec of a term (``check(term, spec)``) and returns it.
SpecCheck = Callable[[str, InputSpec], InputSpec]


def check_term_name(term: str) -> None:
    """Term names are logged as ``distill.loss_<term>`` and ``distill.gap_<term>``.

    Raises:
        DistillationConfigError: for a name that is no identifier or holds ``'loss'``.
    """
    if not isinstance(term, str) or not term.isidentifier() or 'loss' in term:
        raise DistillationConfigError(
            f"distill term name {term!r} must be an identifier without 'loss' (it is "
            f"logged as distill.loss_<term> and distill.gap_<term>)")


def build_term(term: str, cfg: dict, check_spec: SpecCheck) -> Tuple[nn.Module, List[InputSpec]]:
    """Builds a term's loss and its checked input specs.

    Args:
        term: Term name.
        cfg: ``dict(loss=<loss config>, inputs={arg: spec})``.
        check_spec: Checks each parsed spec against the model (recorders, connectors,
            context entries).

    Returns:
        The loss module and one :class:`InputSpec` per mapped argument.

    Raises:
        DistillationConfigError: for a bad name or config, an argument the loss does not
            take, or a required loss argument left unmapped.
    """
    check_term_name(term)
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
        specs.append(check_spec(term, parse_input_spec(term, arg, spec)))
    unmapped = [p for p in required if p not in {s.arg for s in specs}]
    if unmapped:
        raise DistillationConfigError(
            f'distill term {term!r}: required argument(s) {unmapped} of '
            f'{type(loss).__name__}.forward are not mapped in inputs')
    check_patch_token_layouts(term, loss, params, specs)
    return loss, specs


#: Loss arguments that say where the special tokens of a record are.
TOKEN_LAYOUT_ARGS = ('student_token_layout', 'teacher_token_layout')


def check_patch_token_layouts(term: str, loss: nn.Module, params: Mapping[str, Any],
                              specs: List[InputSpec]) -> None:
    """Refuses a patch-token loss without the token layouts that locate the patches.

    A loss that takes ``student_token_layout`` / ``teacher_token_layout`` defaults them to
    ``(0, 0)`` (no special tokens): with ``patch_tokens_only=True``, or without that switch
    (``ActivationMatchingLoss`` / ``MaskedPredictionLoss`` always compare patch tokens), and the
    layouts unmapped, class and register tokens would silently count as patches.

    Args:
        term: Term name.
        loss: The built loss.
        params: Parameters of ``loss.forward``.
        specs: The term's mapped inputs.

    Raises:
        DistillationConfigError: naming the unmapped layout arguments and the mapping to add.
    """
    switch = getattr(loss, 'patch_tokens_only', None)
    # a loss that takes the layouts without a patch_tokens_only switch always compares patch
    # tokens (ActivationMatchingLoss, MaskedPredictionLoss)
    patch_only = switch if switch is not None else any(a in params for a in TOKEN_LAYOUT_ARGS)
    if not patch_only:
        return
    mapped = {s.arg for s in specs}
    missing = [a for a in TOKEN_LAYOUT_ARGS if a in params and a not in mapped]
    if missing:
        hint = ', '.join(f"{a}='context.{a}'" for a in missing)
        what = ('(patch_tokens_only=True)' if switch is not None else
                ' (it compares patch tokens only)')
        raise DistillationConfigError(
            f'distill term {term!r}: {type(loss).__name__}{what} needs the '
            f'token layouts to find the patch tokens, but {missing} are not mapped (they '
            f'default to no special tokens, so class / register tokens would count as '
            f'patches); add to its inputs: {hint}')


def describe_value(value: Any) -> str:
    """A short description of a record: its shape, or ``'<n> x <shape>'`` for a list."""
    if isinstance(value, torch.Tensor):
        return str(tuple(value.shape))
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, torch.Tensor) for v in value):
        shapes = sorted({tuple(v.shape) for v in value})
        return f'{len(value)} x {shapes[0] if len(shapes) == 1 else shapes}'
    return repr(value)


def describe_inputs(specs: Sequence[InputSpec], resolve: Callable[[InputSpec], Any]) -> str:
    """``'<arg> <- <spec>: <shape>'`` for each argument of a term, ``'; '``-joined.

    Args:
        specs: The term's input specs.
        resolve: Returns the value of a spec (``'?'`` is shown where it raises).
    """
    described = []
    for s in specs:
        try:
            shape = describe_value(resolve(s))
        except (ValueError, RuntimeError, TypeError):
            shape = '?'
        described.append(f'{s.arg} <- {s!r}: {shape}')
    return '; '.join(described)


def check_spec(term: str, spec: InputSpec, recorders: Mapping[str, Mapping[str, ModuleRecorder]],
               connectors: Collection[str], missing_context: Mapping[str, str]) -> InputSpec:
    """Checks that a spec names an existing recorder, connector or available context entry.

    Args:
        term: Term name (for messages).
        spec: The parsed spec.
        recorders: ``{'student': {name: recorder}, 'teacher': {name: recorder}}``.
        connectors: Connector names.
        missing_context: ``{context key: why it is unavailable}`` for the context entries
            this model cannot provide (e.g. ``patch_mask`` without patch masking).

    Returns:
        ``spec`` itself.

    Raises:
        DistillationConfigError: naming the missing entry and the existing ones.
    """
    where = f'distill term {term!r}, argument {spec.arg!r}'
    if spec.side == 'context':
        if spec.name not in CONTEXT_KEYS:
            raise DistillationConfigError(f'{where}: unknown context entry {spec.name!r}; '
                                          f'available: {CONTEXT_KEYS}')
        if spec.name in missing_context:
            raise DistillationConfigError(f'{where}: {missing_context[spec.name]}')
        return spec
    side_recorders = recorders[spec.side]
    if spec.name not in side_recorders:
        raise DistillationConfigError(f'{where}: {spec.side} recorder {spec.name!r} does '
                                      f'not exist; {spec.side} recorders: '
                                      f'{sorted(side_recorders)}')
    if spec.connector is not None and spec.connector not in connectors:
        raise DistillationConfigError(f'{where}: connector {spec.connector!r} does not '
                                      f'exist; connectors: {sorted(connectors)}')
    return spec


def check_connectors_used(connectors: Collection[str],
                          term_inputs: Mapping[str, Sequence[InputSpec]]) -> None:
    """Every connector must feed some term, or it would never train.

    Raises:
        DistillationConfigError: naming the unused connectors.
    """
    used = {s.connector for specs in term_inputs.values() for s in specs}
    unused = sorted(set(connectors) - used)
    if unused:
        raise DistillationConfigError(f'connector(s) {unused} are used by no distill term '
                                      f'(they would never train)')


def compute_terms(losses: Mapping[str, nn.Module], term_inputs: Mapping[str, Sequence[InputSpec]],
                  scales: Mapping[str, float], resolve: Callable[[InputSpec], Any],
                  dry_run_size: Optional[Tuple[int, int]] = None) -> Dict[str, torch.Tensor]:
    """Evaluates every term on the current records.

    Args:
        losses: ``{term: loss module}``.
        term_inputs: ``{term: input specs}``.
        scales: ``{term: schedule factor}``.
        resolve: Returns the value of a spec (a record, a connector output or a context
            entry).
        dry_run_size: Input size of the build-time dry run; there, a term that does not fit
            its records raises a :class:`DistillationConfigError` naming the shapes.  ``None``
            (training): errors propagate unchanged.

    Returns:
        ``distill.loss_<term>`` (``scale * loss``) and ``distill.gap_<term>`` (the detached
        loss without ``loss_weight`` or scale) for each term.
    """
    out = {}
    for term, loss in losses.items():
        specs = term_inputs[term]
        try:
            raw = loss(**{s.arg: resolve(s) for s in specs})
        except (ValueError, RuntimeError, TypeError) as err:
            if dry_run_size is None:
                raise
            raise DistillationConfigError(
                f'distill term {term!r} ({type(loss).__name__}) does not fit the records of '
                f'a dry run at input size {dry_run_size}: {describe_inputs(specs, resolve)}. '
                f'{err}') from err
        weight = getattr(loss, 'loss_weight', 1.0)
        gap = raw.detach() / weight if weight else raw.detach()
        out[f'distill.loss_{term}'] = raw * scales[term]
        out[f'distill.gap_{term}'] = gap
    return out


def check_finite_losses(losses: Mapping[str, Any]) -> None:
    """Raises if any ``*loss*`` entry (a tensor or a list of tensors) is NaN or inf.

    Raises:
        FloatingPointError: naming the first non-finite entry.
    """
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
