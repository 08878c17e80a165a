"""Turn a softmax ViT checkpoint into an initialised linearized student checkpoint.

Loads the teacher checkpoint in any layout :mod:`mmlinvit.converters` reads, builds the teacher
and the student (same arch, another attention operator per layer), transfers weights with a
registered strategy and writes the student plus a JSON report of what was copied.

Examples::

    python tools/linearize.py deit_base.pth work_dirs/deit_b_elu.pth --arch b --family deit \
        --operator elu --strategy mlp_copy
    python tools/linearize.py dinov2_vitb14.pth out.pth --arch b --family dinov2 \
        --operator-per-layer softmax,elu,elu,elu,elu,elu,elu,elu,elu,elu,elu,softmax \
        --strategy full_copy   # mlp_copy would leave the softmax layers' attention random
    python tools/linearize.py deit_base.pth out.pth --operator elu --strategy impulse \
        --student-no-cls --student-pos-embed sincos --strategy-arg window=5

The student takes the teacher's structure (tokens, position embedding, patch, LayerScale,
``pre_norm``, final norm: a file without ``norm.*``, e.g. an MAE fine-tuned release, gives
``final_norm=False``); MHLA / TTT students take their papers' setting instead (no class
token, no register tokens, sin-cos positions, average pooling; ``--student-no-cls``,
``--student-pos-embed`` and ``--student-reg-tokens`` set these explicitly).  The teacher must
hold softmax-attention weights: a linearized student's file is refused.

The output checkpoint is ``dict(state_dict=..., meta=dict(operators, strategy, report,
student_cfg, teacher))``; rebuild the student with
``VisionTransformer(**meta['student_cfg']).load_state_dict(ckpt['state_dict'], strict=True)``.
It holds only tensors and plain data, so ``torch.load(weights_only=True)`` reads it.
"""
import argparse
import inspect
import json
import os
import sys
from typing import Any, Dict, List, NoReturn, Optional, Union

import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.backbones.arch_zoo import VIT_FAMILIES, VIT_SIZES
from mmlinvit.backbones.operator_setting import declared_setting
from mmlinvit.layers.attention import ATTENTION_OPERATORS
from mmlinvit.layers.pos_embed import checkpoint_pos_grid, recorded_pos_grid
from mmlinvit.backbones.training_record import (MLP_ACT_RECORD, TrainingRecordMismatchError,
                                                decode_names)
from mmlinvit.converters import (CheckpointMismatchError, check_state_dict_fits, layout_names,
                                 read_checkpoint)
from mmlinvit.transfer import TRANSFER_STRATEGIES, transfer_weights
from mmlinvit.utils.cli import add_trust_checkpoint_argument, checkpoint_io_parser


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = checkpoint_io_parser(
        'Initialise a linearized student ViT from a softmax teacher checkpoint.',
        ('teacher_ckpt', 'softmax teacher checkpoint (any supported layout)'),
        ('out_ckpt', 'output student checkpoint path'))
    parser.add_argument('--arch', default='b',
                        help='size name (t/s/b/l/h/g) or a JSON dict with embed_dims, '
                             'num_layers, num_heads, mlp_hidden_dims')
    parser.add_argument('--family', default='deit', help='ViT family (deit, deit3, mae, '
                        'dinov2, clip)')
    parser.add_argument('--act', default=None, choices=('gelu', 'quick_gelu'),
                        help="MLP activation of teacher and student (default: the checkpoint's "
                             "record, else the family's). CLIP weights need it unless they are "
                             "OpenAI's release: open_clip LAION-2B / DataComp and timm "
                             "*_clip_224.laion2b* weights use gelu, OpenAI's quick_gelu")
    parser.add_argument('--norm-eps', type=float, default=None,
                        help="LayerNorm epsilon of teacher and student (default: the family's; "
                             "mmpretrain's converted CLIP classifiers use 1e-6)")
    parser.add_argument('--operator', default=None,
                        help='student attention operator for every layer: a name (elu, relu, '
                             'hedgehog, inline, mhla, ttt, ...) or a JSON config dict')
    parser.add_argument('--operator-per-layer', default=None,
                        help='comma-separated operator names, one per layer (hybrid stacks), '
                             'or a JSON list of names / config dicts')
    parser.add_argument('--strategy', default='mlp_copy',
                        help=f'transfer strategy: {", ".join(TRANSFER_STRATEGIES.names)}')
    parser.add_argument('--strategy-arg', action='append', default=[], metavar='KEY=VALUE',
                        help='strategy option (VALUE parsed as JSON when possible), e.g. '
                             'base=mlp_copy, alpha=0.7, steps=300; repeatable')
    parser.add_argument('--layout', default='auto', choices=layout_names(),
                        help='teacher checkpoint layout (default: detect it)')
    parser.add_argument('--img-size', type=int, default=None,
                        help="student training resolution (default: the resolution of the "
                             "teacher's learned position grid, else the family default); a "
                             "learned teacher grid is resampled to it")
    parser.add_argument('--student-no-cls', action='store_true',
                        help="student without class token (global average pooling), as MHLA, "
                             "TTT and the impulse init need")
    parser.add_argument('--student-pos-embed', default=None, choices=('learned', 'sincos', 'none'),
                        help="student position embedding (default: the teacher's)")
    parser.add_argument('--student-reg-tokens', type=int, default=None, metavar='N',
                        help="student register tokens (default: the teacher's, but 0 for "
                             "MHLA / TTT, whose paper setting has no prefix tokens)")
    parser.add_argument('--seed', type=int, default=0, help='seed of the student initialisation')
    parser.add_argument('--report', default=None,
                        help='JSON report path (default: OUT_CKPT with a .json extension)')
    add_trust_checkpoint_argument(parser, 'a teacher file that holds Python objects')
    return parser.parse_args(argv)


def usage_error(message: str) -> NoReturn:
    """Prints ``error: MESSAGE`` to stderr and exits with status 2 (a command-line mistake)."""
    print(f'error: {message}', file=sys.stderr)
    raise SystemExit(2)


def check_names(attn_cfg: Union[str, dict, list], strategy: str, arch: Any, family: str) -> None:
    """Exits with an ``error:`` line when an operator, strategy, arch or family is unknown.

    Runs before the teacher checkpoint is read, so a typo costs nothing; the message lists
    the registered names.

    Args:
        attn_cfg: The student's operator(s) (name, config dict, or one per layer).
        strategy: ``--strategy``.
        arch: ``--arch`` (a size name or a dict).
        family: ``--family``.
    """
    for i, cfg in enumerate(attn_cfg if isinstance(attn_cfg, list) else [attn_cfg]):
        where = f' (layer {i} of --operator-per-layer)' if isinstance(attn_cfg, list) else ''
        name = cfg.get('type') if isinstance(cfg, dict) else cfg
        if not isinstance(name, str):
            usage_error(f'operator{where} must be a name or a JSON dict with a "type" key, got '
                        f'{cfg!r}; registered attention operators: '
                        f'{", ".join(ATTENTION_OPERATORS.names)}')
        if name.removeprefix('mmlinvit.') not in ATTENTION_OPERATORS:
            usage_error(f'unknown operator {name!r}{where}; registered attention operators: '
                        f'{", ".join(ATTENTION_OPERATORS.names)}')
    if strategy.removeprefix('mmlinvit.') not in TRANSFER_STRATEGIES:
        usage_error(f'unknown strategy {strategy!r}; registered weight-transfer strategies: '
                    f'{", ".join(TRANSFER_STRATEGIES.names)}')
    if isinstance(arch, str) and arch not in VIT_SIZES:
        usage_error(f'unknown arch {arch!r}; available sizes: {", ".join(VIT_SIZES)}, or a JSON '
                    'dict with embed_dims, num_layers, num_heads, mlp_hidden_dims')
    if isinstance(arch, dict):
        missing = sorted({'embed_dims', 'num_layers', 'num_heads', 'mlp_hidden_dims'} - set(arch))
        if missing:
            usage_error(f'--arch dict is missing {missing}')
    elif not isinstance(arch, str):
        usage_error(f'--arch must be a size name or a JSON dict, got {arch!r}')
    if family not in VIT_FAMILIES:
        usage_error(f'unknown family {family!r}; available families: '
                    f'{", ".join(VIT_FAMILIES)}')


def _parse_json_or_name(text: str) -> Any:
    """JSON value if ``text`` is JSON, else the text itself (names like ``elu``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_operators(operator: Optional[str], per_layer: Optional[str]) -> Union[str, dict, list]:
    """The student's ``attn_cfg`` from ``--operator`` / ``--operator-per-layer``."""
    if (operator is None) == (per_layer is None):
        usage_error('give exactly one of --operator and --operator-per-layer')
    if operator is not None:
        return _parse_json_or_name(operator)
    value = _parse_json_or_name(per_layer)
    if isinstance(value, list):
        return value
    return [name.strip() for name in per_layer.split(',') if name.strip()]


def parse_strategy_args(items: List[str]) -> Dict[str, Any]:
    """``['alpha=0.5', 'base=mlp_copy']`` -> ``{'alpha': 0.5, 'base': 'mlp_copy'}``."""
    options = {}
    for item in items:
        key, sep, value = item.partition('=')
        if not sep or not key:
            usage_error(f'--strategy-arg expects KEY=VALUE, got {item!r}')
        options[key.strip()] = _parse_json_or_name(value)
    return options


def teacher_structure(state_dict: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    """Constructor options the checkpoint itself fixes (tokens, position embedding, patch,
    and ``final_norm=False`` for a file without a final norm, e.g. an MAE fine-tuned
    release, whose global-pool ``fc_norm`` belongs to the classifier)."""
    structure = dict(
        with_cls_token='cls_token' in state_dict,
        num_reg_tokens=int(state_dict['reg_token'].shape[1]) if 'reg_token' in state_dict else 0,
        with_mask_token='mask_token' in state_dict,
        pos_embed_type='learned' if 'pos_embed' in state_dict else 'sincos')
    if 'norm.weight' not in state_dict and 'blocks.0.norm1.weight' in state_dict:
        structure['final_norm'] = False
    patch = state_dict.get('patch_embed.proj.weight')
    if patch is not None and patch.ndim == 4:
        structure['patch_size'] = int(patch.shape[-1])
        if 'pos_embed' in state_dict:  # the resolution the checkpoint's grid was learned at
            n_patches = state_dict['pos_embed'].shape[1] - int(structure['with_cls_token'])
            rows, cols = checkpoint_pos_grid(n_patches, recorded_pos_grid(state_dict))
            size = (rows * structure['patch_size'], cols * structure['patch_size'])
            structure['img_size'] = size[0] if rows == cols else size
    return structure


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the linearization; returns the process exit code."""
    args = parse_args(argv)
    attn_cfg = parse_operators(args.operator, args.operator_per_layer)
    strategy_options = parse_strategy_args(args.strategy_arg)
    arch = _parse_json_or_name(args.arch)
    check_names(attn_cfg, args.strategy, arch, args.family)
    if args.student_reg_tokens is not None and args.student_reg_tokens < 0:
        usage_error(f'--student-reg-tokens must be 0 or more, got {args.student_reg_tokens}')
    # the class's signature: an option-free strategy (object.__init__) takes no options
    parameters = inspect.signature(TRANSFER_STRATEGIES.get(
        args.strategy.removeprefix('mmlinvit.'))).parameters.values()
    accepted = [p.name for p in parameters if p.name != 'self' and p.kind != p.VAR_KEYWORD]
    unknown = sorted(set(strategy_options) - set(accepted))
    if unknown and not any(p.kind == p.VAR_KEYWORD for p in parameters):
        usage_error(f'--strategy-arg {", ".join(unknown)}: not an option of strategy '
                    f'{args.strategy!r}; its options: {", ".join(accepted) or "none"}')

    try:
        state_dict, conversion, _ = read_checkpoint(args.teacher_ckpt, layout=args.layout,
                                                    trust_checkpoint=args.trust_checkpoint)
        structure = teacher_structure(state_dict)
    except (OSError, ValueError, TypeError, RuntimeError) as err:
        print(f'error: {args.teacher_ckpt}: {err}', file=sys.stderr)
        return 1

    teacher_cfg = dict(arch=arch, family=args.family, attn_cfg='softmax', **structure)
    if args.act is not None:
        teacher_cfg['act'] = args.act
    elif MLP_ACT_RECORD in state_dict:  # the student's MLP is the teacher's
        teacher_cfg['act'] = decode_names(state_dict[MLP_ACT_RECORD])[0]
    if args.norm_eps is not None:
        teacher_cfg['norm_eps'] = args.norm_eps
    if structure['with_cls_token']:
        teacher_cfg['out_type'] = 'cls_token'
    else:
        teacher_cfg['out_type'] = 'avg_featmap'
    teacher = VisionTransformer(**teacher_cfg)
    source = f'{args.teacher_ckpt!r} (read as layout {conversion.source_layout!r})'
    try:
        teacher.check_checkpoint_act(state_dict, source)
        check_state_dict_fits(teacher, state_dict, strict=True, source=source)
    except CheckpointMismatchError as err:  # e.g. --arch / --family of another model
        print(f'error: {err}\n(tools/linearize.py builds the teacher from --arch {arch!r} and '
              f'--family {args.family!r}: give the ones of the checkpoint.)', file=sys.stderr)
        return 1
    except TrainingRecordMismatchError as err:
        print(f'error: {err}', file=sys.stderr)
        return 1
    non_softmax = (set(decode_names(state_dict['block_operators'])) - {'softmax'}
                   if isinstance(state_dict.get('block_operators'), torch.Tensor) else set())
    if non_softmax:  # a linearized student given as the teacher
        print(f'error: {args.teacher_ckpt}: the teacher must hold softmax-attention weights, but '
              f'the checkpoint records attention operators {sorted(non_softmax)} (a linearized '
              f'student, e.g. a tools/linearize.py output or a trained student?): give the '
              f'softmax model it was linearized from.', file=sys.stderr)
        return 1
    try:
        teacher.load_state_dict(state_dict, strict=True)
    except (TrainingRecordMismatchError, RuntimeError) as err:
        print(f'error: {args.teacher_ckpt}: {err}', file=sys.stderr)
        return 1
    if structure.get('final_norm') is False:
        print(f'note: {args.teacher_ckpt} has no final norm (norm.weight / norm.bias; e.g. an '
              f'MAE fine-tuned release, whose fc_norm belongs to the classifier): teacher and '
              f'student are built with final_norm=False (recorded in the student_cfg).',
              file=sys.stderr)

    student_cfg = dict(teacher_cfg, attn_cfg=attn_cfg)
    if args.img_size is not None:
        student_cfg['img_size'] = args.img_size
    elif teacher.pos_embed is not None:  # the resolution the teacher's grid was learned at
        grid = [side * teacher.patch_size for side in teacher.pos_grid]
        student_cfg['img_size'] = grid[0] if grid[0] == grid[1] else grid
    layer_operators = attn_cfg if isinstance(attn_cfg, (list, tuple)) else [attn_cfg]
    declared = declared_setting(layer_operators)
    if declared:
        # MHLA / TTT: the teacher's class token / learned positions are not given to the
        # student, whose backbone then takes the operators' paper setting (and warns so)
        # unless the flags below set them.
        for key in ('with_cls_token', 'pos_embed_type', 'out_type'):
            student_cfg[key] = None
        if student_cfg['num_reg_tokens'] and args.student_reg_tokens is None:
            # the paper setting has no prefix tokens: the teacher's registers are dropped too
            operators = sorted({name for _, names in declared.values() for name in names})
            print(f'warning: the teacher has {student_cfg["num_reg_tokens"]} register tokens; '
                  f'the {operators} student takes the operators\' paper setting, which has no '
                  f'prefix tokens, so it is built with num_reg_tokens=0 (--student-reg-tokens '
                  f'{student_cfg["num_reg_tokens"]} keeps them).', file=sys.stderr)
            student_cfg['num_reg_tokens'] = 0
    if args.student_reg_tokens is not None:
        student_cfg['num_reg_tokens'] = args.student_reg_tokens
    if student_cfg['num_reg_tokens'] != teacher_cfg['num_reg_tokens']:
        # a family's default position interpolation follows the register count (DINOv2):
        # the student keeps the teacher's
        student_cfg['pos_interp'] = teacher.pos_interp
    if args.student_no_cls:
        student_cfg.update(with_cls_token=False, out_type='avg_featmap')
    if args.student_pos_embed is not None:
        student_cfg['pos_embed_type'] = args.student_pos_embed
    torch.manual_seed(args.seed)
    student = VisionTransformer(**student_cfg)

    try:
        report = transfer_weights(student, teacher, args.strategy, **strategy_options)
    except ValueError as err:  # a strategy that cannot be applied to this student
        print(f'error: {err}', file=sys.stderr)
        return 1
    operators = student.attn_cfgs
    teacher_meta = dict(checkpoint=os.path.abspath(args.teacher_ckpt),
                        layout=conversion.source_layout,
                        dropped_by_conversion=sorted(conversion.dropped))
    meta = dict(operators=operators, strategy=report.strategy, strategy_options=report.options,
                seed=args.seed, report=report.to_dict(), student_cfg=student_cfg,
                teacher=teacher_meta)
    out_dir = os.path.dirname(os.path.abspath(args.out_ckpt))
    os.makedirs(out_dir, exist_ok=True)
    torch.save(dict(state_dict=student.state_dict(), meta=meta), args.out_ckpt)

    report_path = args.report or os.path.splitext(args.out_ckpt)[0] + '.json'
    report_dir = os.path.dirname(os.path.abspath(report_path))
    os.makedirs(report_dir, exist_ok=True)
    with open(report_path, 'w') as f:
        json.dump(dict(teacher=teacher_meta, student_cfg=student_cfg, operators=operators,
                       transfer=report.to_dict()), f, indent=1)
    print(report.summary())
    print(f'wrote the student to {args.out_ckpt} and the report to {report_path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
