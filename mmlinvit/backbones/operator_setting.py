"""Backbone settings an attention operator's paper runs it in (torch only).

Operators declare ``paper_backbone_setting`` (e.g. MHLA and TTT in seed 000: no class token,
sin-cos position embeddings, average pooling).  :func:`resolve_operator_setting` applies it
to the :class:`~.vit.VisionTransformer` arguments the caller left unset, and refuses given
values the setting does not accept, naming the fix, unless the check is switched off.
"""
import warnings
from typing import Any, Dict, List, Sequence, Tuple, Union

from mmlinvit.layers.attention import ATTENTION_OPERATORS

#: Values of the setting arguments when neither the caller nor an operator fixes them.
#: ``out_type`` follows the class token: ``'cls_token'`` with one, ``'avg_featmap'`` without.
UNSET_DEFAULTS = dict(with_cls_token=True, pos_embed_type='learned')


def _operator_name(cfg: Union[str, dict]) -> str:
    name = cfg if isinstance(cfg, str) else cfg['type']
    return name[len('mmlinvit.'):] if name.startswith('mmlinvit.') else name


def declared_setting(attn_cfgs: Sequence[Union[str, dict]]) -> Dict[str, Tuple[Tuple[Any, ...],
                                                                              List[str]]]:
    """Merges the operators' ``paper_backbone_setting`` over the layers.

    Args:
        attn_cfgs: One operator name / config per layer.

    Returns:
        ``{argument: (accepted values, operator names declaring it)}``.

    Raises:
        ValueError: when two operators of the stack accept no common value.
    """
    merged: Dict[str, Tuple[Tuple[Any, ...], List[str]]] = {}
    for cfg in attn_cfgs:
        name = _operator_name(cfg)
        setting = getattr(ATTENTION_OPERATORS.get(name), 'paper_backbone_setting', {})
        for arg, accepted in setting.items():
            if arg not in merged:
                merged[arg] = (tuple(accepted), [name])
                continue
            previous, names = merged[arg]
            if name in names:
                continue
            common = tuple(v for v in previous if v in accepted)
            if not common:
                raise ValueError(f'Operators {names} and {name!r} need incompatible {arg} '
                                 f'values ({previous} vs {tuple(accepted)}); they cannot share '
                                 f'one backbone')
            merged[arg] = (common, names + [name])
    return merged


def resolve_operator_setting(attn_cfgs: Sequence[Union[str, dict]], given: Dict[str, Any],
                             check: bool = True) -> Dict[str, Any]:
    """The backbone's ``with_cls_token``, ``pos_embed_type`` and ``out_type``.

    Arguments the caller left ``None`` take the operators' paper setting (with a warning that
    names it), else :data:`UNSET_DEFAULTS`.  Given values outside the setting raise, naming
    the values and the ``--cfg-options`` that fix them.

    Args:
        attn_cfgs: One operator name / config per layer.
        given: ``dict(with_cls_token=..., pos_embed_type=..., out_type=...)`` as passed to the
            backbone (``None``: not given).
        check: ``False`` builds a setting the operators' papers do not use (warning instead
            of error): a deliberate deviation.

    Returns:
        The resolved values of the three arguments.

    Raises:
        ValueError: naming the operators, the refused values and the fix.
    """
    declared = declared_setting(attn_cfgs)
    resolved: Dict[str, Any] = {}
    applied: List[str] = []
    refused: List[str] = []
    for arg in ('with_cls_token', 'pos_embed_type', 'out_type'):
        value = given.get(arg)
        accepted = declared.get(arg, (None, None))[0]
        if value is None:
            if accepted is not None:
                value = accepted[0]
                applied.append(f'{arg}={value!r}')
            elif arg == 'out_type':
                value = 'cls_token' if resolved['with_cls_token'] else 'avg_featmap'
            else:
                value = UNSET_DEFAULTS[arg]
        elif accepted is not None and value not in accepted:
            refused.append(arg)
        resolved[arg] = value
    if not declared:
        return resolved
    operators = sorted({name for _, names in declared.values() for name in names})
    what = (f"attention operator(s) {operators} (seed 000 and their papers run them without a "
            f"class token, with sin-cos position embeddings and average pooling; "
            f"paper_backbone_setting of the operator class)")
    if refused:
        got = ', '.join(f'{arg}={resolved[arg]!r}' for arg in refused)
        fix = {arg: declared[arg][0][0] for arg in refused}
        if 'with_cls_token' in refused and resolved['out_type'] == 'cls_token':
            fix['out_type'] = declared.get('out_type', (('avg_featmap', ), None))[0][0]
        kwargs = ', '.join(f'{arg}={value!r}' for arg, value in fix.items())
        options = ' '.join(f'<backbone>.{arg}={value}' for arg, value in fix.items())
        example = ' '.join(f'model.student.backbone.{arg}={value}' for arg, value in fix.items())
        message = (
            f'{what}: the backbone was built with {got}. Build it with {kwargs}, i.e. '
            f'--cfg-options {options} (<backbone> is the backbone path of the config, e.g. '
            f'--cfg-options {example} for configs/copy_mlp_distill_attn/; a softmax teacher '
            f'with a class token then needs patch_tokens_only=True in the attention-output '
            f'distillation loss), or leave these arguments unset to get the paper setting; '
            f'check_operator_setting=False keeps {got} as a deliberate deviation.')
        if check:
            raise ValueError(message)
        warnings.warn(f'check_operator_setting=False: {message}', stacklevel=3)
    if applied:
        warnings.warn(f'{what}: unset backbone arguments take that setting: '
                      f'{", ".join(applied)}. Pass them explicitly to silence this warning.',
                      stacklevel=3)
    return resolved
