"""FLOPs and parameters of any mmlinvit config, or counted vs analytic GFLOPs of ViTs.

With a CONFIG (classification, segmentation or distillation), builds the model that is
deployed (a ``DistillationModel``'s student, or the config's model) without reading any
checkpoint and counts one batch-1 inference at the config's training crop (``crop_size``,
else the train pipeline's crop, else ``--shape``): ``ImageClassifier`` logits,
``EncoderDecoder.inference`` in ``'whole'`` mode (backbone, neck and decode head, Mask2Former
included; auxiliary heads are training-only and not run), or the bare backbone's forward.
Parameters are all of that model's parameters (auxiliary heads included).  The distillation
teacher is described, not counted.  ``tools/analysis/model_index.py`` writes these numbers
into ``model-index.yml`` / ``configs/**/metafile.yml``::

    python tools/analysis/count_flops.py configs/adala_dinov2_ade20k.py
    python tools/analysis/count_flops.py CONFIG --shape 1024 1024 --device cpu

Without a CONFIG: counted vs analytic GFLOPs of softmax and linear ViTs (and Adventurer) per
resolution.

Counts one batch-1 forward with :class:`mmlinvit.analysis.FlopCounter` (torch's
FlopCounterMode plus handlers for CPU SDPA and the Triton linear-attention and SSD-scan
Functions; the SSD scan at its configured ``chunk_size``) on
``torch.device('meta')`` tensors, so nothing is computed and ViT-L/14 at 2048^2 takes seconds.
Next to each count it prints the issue's analytic convention, per layer

    GEMMs 24 N D^2  +  softmax attention 4 N^2 D   or   linear attention 4 N d D

(times depth), the exact closed form of everything counted (adds the patch embedding and the
2 N D normaliser mat-vec of linear attention) and the ratios.  Convention: FLOPs = 2 x MACs.

Example::

    PYTHONPATH=. python tools/analysis/count_flops.py --models vit-b16 vit-l14
    PYTHONPATH=. python tools/analysis/count_flops.py --models vit-b16 \\
        --operators softmax elu inline
"""
import argparse
import os
import sys
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

import torch
from mmengine.config import DictAction

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mmlinvit.analysis import (ANALYTIC_OPERATORS, FLOP_CONVENTION, analytic_vit_flops,  # noqa
                               count_flops)
from mmlinvit.backbones import VIT_SIZES, VisionTransformer  # noqa: E402
from mmlinvit.engine.launch import replace_sync_bn  # noqa: E402
from mmlinvit.engine.preflight import clear_checkpoints  # noqa: E402
from mmlinvit.layers.patch_embed import patch_grid  # noqa: E402
from mmlinvit.utils.benchmarking import parse_size, size_label, write_json  # noqa: E402

#: name -> (label, arch, family); patch size and prefix tokens come from the family.
VIT_MODELS = {
    'vit-b16': ('ViT-B/16', 'b', 'deit'),
    'vit-l14': ('ViT-L/14', 'l', 'dinov2'),
}
T = TypeVar('T')
DEFAULT_SIZES = ['224', '512', '512x1024', '1024x1024', '2048x2048']
ADVENTURER_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'mmlinvit', 'backbones', 'adventurer.py')


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config', nargs='?', default=None,
                        help='an mmlinvit config: count its deployed model at its crop')
    parser.add_argument('--shape', nargs='+', type=int, default=None,
                        help='CONFIG mode: input H [W] instead of the config crop')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default=None,
                        help='CONFIG mode: override config keys')
    parser.add_argument('--models', nargs='+', default=list(VIT_MODELS), choices=list(VIT_MODELS))
    parser.add_argument('--operators', nargs='+', default=['softmax', 'elu'],
                        help='attention operators; the first is the baseline of the ratios')
    parser.add_argument('--sizes', nargs='+', type=parse_size,
                        default=[parse_size(s) for s in DEFAULT_SIZES],
                        help='input sizes, N or HxW')
    parser.add_argument('--device', default='meta', choices=['meta', 'cpu'],
                        help="'meta' counts shapes only (fast); 'cpu' runs the forward for real "
                        '(needed for operators with data-dependent shapes, e.g. mhla)')
    parser.add_argument('--no-adventurer', action='store_true',
                        help='skip Adventurer (counted at the ViT-B/16 sizes when present)')
    parser.add_argument('--json-out', default=None, help='also write the rows as JSON')
    args = parser.parse_args(argv)
    if args.shape is not None and (args.config is None or len(args.shape) not in (1, 2)):
        parser.error('--shape H [W] needs a CONFIG')
    return args


# ------------------------------------------------------------------------------ config mode
#: ``model.type`` of mmlinvit's distillation wrapper.
DISTILLATION_TYPES = ('mmlinvit.DistillationModel', 'DistillationModel')


def _pipeline_crop(pipeline: object) -> Optional[Tuple[int, int]]:
    """(H, W) of the first cropping transform of a pipeline, or None."""
    for step in pipeline or []:
        if not isinstance(step, dict):
            continue
        kind = str(step.get('type', '')).split('.')[-1]
        size = None
        if kind == 'RandomResizedCrop':  # mmpretrain: ``scale`` is the output size
            size = step.get('scale', step.get('size'))
        elif kind == 'RandomResizedCropAndInterpolationWithTwoPic':
            size = step.get('size')  # its ``scale`` is the area range, e.g. (0.08, 1.0)
        elif kind in ('RandomCrop', 'CenterCrop'):
            size = step.get('crop_size', step.get('size'))
        if size is not None:
            if isinstance(size, int):
                return (size, size)
            if isinstance(size, (list, tuple)) and len(size) == 2:
                # mmpretrain crop sizes are (w, h) tuples, mmseg RandomCrop sizes (h, w);
                # every square crop reads the same either way, other ones are ambiguous
                if size[0] != size[1] and kind != 'RandomCrop':
                    raise ValueError(f'{kind} size {size} is not square: pass --shape H W')
                return (int(size[0]), int(size[1]))
    return None


def _loader_pipeline(cfg: object, loader: str) -> Optional[list]:
    node = cfg.get(loader, None)
    dataset = node.get('dataset', None) if node else None
    while isinstance(dataset, dict) and 'pipeline' not in dataset and 'dataset' in dataset:
        dataset = dataset['dataset']
    return dataset.get('pipeline', None) if isinstance(dataset, dict) else None


def config_input_size(cfg: object) -> Tuple[int, int]:
    """The (H, W) a config trains at: ``crop_size``, else the train / test pipeline's crop.

    Args:
        cfg: A loaded mmengine ``Config``.

    Returns:
        (height, width).

    Raises:
        ValueError: The config names no crop (pass ``--shape``).
    """
    crop = cfg.get('crop_size', None)
    if crop is not None:
        crop = (crop, crop) if isinstance(crop, int) else tuple(crop)
        return (int(crop[0]), int(crop[1]))
    for loader in ('train_dataloader', 'test_dataloader', 'val_dataloader'):
        size = _pipeline_crop(_loader_pipeline(cfg, loader))
        if size is not None:
            return size
    raise ValueError('the config has no crop_size and no cropping transform in its pipelines: '
                     'pass --shape H W')


def deployed_model_config(cfg: object) -> Tuple[dict, str]:
    """The model config that is deployed and its name: the config's model or its student.

    Args:
        cfg: A loaded mmengine ``Config``.

    Returns:
        (a copy of the model config, ``'model'`` or ``'student'``).
    """
    import copy
    model = copy.deepcopy(cfg.model)
    if model.get('type') in DISTILLATION_TYPES:
        return copy.deepcopy(model['student']), 'student'
    return model, 'model'


def on_meta_or_cpu(count: Callable[[str], T], device: str, label: str) -> Tuple[T, str]:
    """``count(device)``; on ``'meta'``, ``count('cpu')`` when shapes depend on values.

    Models whose shapes depend on tensor values (``torch.nonzero``, ``.item()``,
    ``.numpy()``; MHLA's block bookkeeping did before its indices came from the grid sizes)
    cannot run on meta tensors; they are counted with a real forward on random weights
    instead (the same count, slower), with a note on stderr.

    Returns:
        (the count, the device used).
    """
    if device != 'meta':
        return count(device), device
    try:
        return count('meta'), 'meta'
    except (RuntimeError, NotImplementedError, TypeError) as err:
        if 'meta' not in str(err).lower():
            raise
        print(f'{label}: shapes depend on tensor values here ({str(err).splitlines()[0]}); '
              f'counting with a real forward on CPU instead (random weights, same count)',
              file=sys.stderr, flush=True)
        return count('cpu'), 'cpu'


def count_config(cfg: object, shape: Optional[Tuple[int, int]] = None,
                 device: str = 'meta') -> Dict[str, object]:
    """Counts the deployed model of a loaded config (see the module docstring).

    Args:
        cfg: A loaded mmengine ``Config`` (its scopes registered).
        shape: (H, W) input; default :func:`config_input_size`.
        device: ``'meta'`` (shapes only) or ``'cpu'`` (a real forward with random weights,
            for operators with data-dependent shapes).

    Returns:
        dict(part, model_type, input=(H, W), params, flops, what) - ``what`` names the
        forward that was counted.
    """
    from mmengine.registry import MODELS, init_default_scope

    from mmlinvit.analysis import FlopCounter
    scope = cfg.get('default_scope', None)
    if scope is None:
        raise ValueError('the config sets no default_scope (mmseg or mmpretrain)')
    init_default_scope(scope)
    hw = tuple(shape) if shape is not None else config_input_size(cfg)
    model_cfg, part = deployed_model_config(cfg)
    clear_checkpoints(model_cfg)  # no weights are read
    replace_sync_bn(model_cfg)  # SyncBN needs a process group; BN counts the same
    is_segmentor = 'decode_head' in model_cfg
    if is_segmentor:
        test_cfg = dict(model_cfg.get('test_cfg', None) or {})
        test_cfg['mode'] = 'whole'
        model_cfg['test_cfg'] = test_cfg
    with torch.device(device):
        model = MODELS.build(model_cfg).eval()
        images = torch.zeros(1, 3, hw[0], hw[1])
    params = sum(p.numel() for p in model.parameters())
    with torch.no_grad(), FlopCounter() as counter:
        if is_segmentor:
            meta = dict(img_shape=hw, ori_shape=hw, pad_shape=hw, padding_size=[0, 0, 0, 0])
            model.inference(images, [meta])
            what = 'whole-image inference (backbone, neck, decode head)'
        elif 'backbone' in model_cfg:
            model(images, mode='tensor')
            what = 'forward to logits / features (mode=tensor)'
        else:
            model(images)
            what = 'backbone forward'
    return dict(part=part, model_type=str(model_cfg.get('type')), input=hw, params=params,
                flops=counter.result().total, what=what, device=device)


def main_config(args: argparse.Namespace) -> Dict[str, object]:
    """CONFIG mode of :func:`main`."""
    from mmengine.config import Config

    from mmlinvit.config_scopes import register_config_scopes
    register_config_scopes()
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    shape = None
    if args.shape is not None:
        shape = (args.shape[0], args.shape[-1])
    row, _ = on_meta_or_cpu(lambda device: count_config(cfg, shape=shape, device=device),
                            args.device, args.config)
    row['config'] = args.config
    print(f'Convention: {FLOP_CONVENTION}.')
    print(f'config   {args.config}')
    print(f'counted  the {row["part"]} ({row["model_type"]}): {row["what"]}, batch 1, '
          f'input {row["input"][0]}x{row["input"][1]}, device {row["device"]}')
    print(f'params   {row["params"] / 1e6:.2f} M ({row["params"]})')
    print(f'FLOPs    {row["flops"] / 1e9:.2f} G ({row["flops"]})')
    write_json(row, args.json_out)
    return row


def count_vit(arch: str, family: str, operator: str, hw: Tuple[int, int],
              device: str) -> Tuple[int, Optional[object]]:
    """Counted FLOPs and the analytic breakdown (None without a closed form)."""
    with torch.device(device):
        model = VisionTransformer(arch, family=family, attn_cfg=operator).eval()
        images = torch.zeros(1, 3, hw[0], hw[1])
    counted = count_flops(model, images).total
    analytic = None
    if operator in ANALYTIC_OPERATORS:
        dims = VIT_SIZES[arch]
        analytic = analytic_vit_flops(hw, model.patch_size, dims['embed_dims'],
                                      dims['num_layers'], dims['num_heads'],
                                      dims['mlp_hidden_dims'], operator,
                                      num_prefix_tokens=model.num_prefix_tokens)
    return counted, analytic


def count_adventurer(hw: Tuple[int, int], device: str) -> Tuple[int, int]:
    """Counted FLOPs and token count (corner-padded patch grid + class token) of
    Adventurer-B/16."""
    from mmlinvit.backbones.adventurer import Adventurer
    with torch.device(device):
        model = Adventurer('b', patch_size=16).eval()
        images = torch.zeros(1, 3, hw[0], hw[1])
    grid = patch_grid(hw, model.patch_size)
    return count_flops(model, images).total, grid[0] * grid[1] + 1


def main(argv: Optional[List[str]] = None) -> object:
    """CONFIG mode: the config's row (dict); otherwise the table rows (list of dicts)."""
    args = parse_args(argv)
    if args.config is not None:
        return main_config(args)
    print(f'Convention: {FLOP_CONVENTION}.')
    print('analytic = issue convention per layer: GEMMs 24 N D^2 + attention (softmax 4 N^2 D, '
          'linear 4 N d D); exact = analytic + patch embedding + linear-attention normaliser '
          '(2 N D); counted = FlopCounter on one batch-1 forward '
          f'(device {args.device}).')
    rows: List[Dict[str, object]] = []
    baseline_op = args.operators[0]
    header = (f'{"model":<10}{"size":>10}{"tokens":>8}{"operator":>10}{"counted GF":>13}'
              f'{"analytic GF":>13}{"exact GF":>12}{"cnt/exact":>10}{"cnt/anl":>9}'
              f'{baseline_op + "/op (cnt)":>20}{"(anl)":>8}')
    print(header)
    print('-' * len(header))
    for name in args.models:
        label, arch, family = VIT_MODELS[name]
        for hw in args.sizes:
            base: Dict[str, float] = {}
            for op in args.operators:
                (counted, analytic), _ = on_meta_or_cpu(
                    lambda device: count_vit(arch, family, op, hw, device), args.device,
                    f'{label} {size_label(hw)} {op}')
                row = dict(model=label, size=size_label(hw), operator=op, counted=counted,
                           tokens=None, analytic=None, exact=None)
                if analytic is not None:
                    row.update(tokens=analytic.num_tokens, analytic=analytic.reference_total,
                               exact=analytic.total)
                if op == baseline_op:
                    base = dict(counted=counted, analytic=row['analytic'])
                ratio_cnt = base['counted'] / counted if base else float('nan')
                ratio_anl = (base['analytic'] / row['analytic']
                             if base.get('analytic') and row['analytic'] else float('nan'))
                row.update(ratio_counted=ratio_cnt, ratio_analytic=ratio_anl)
                rows.append(row)

                def gf(v):
                    return f'{v / 1e9:.1f}' if v else '-'

                def rel(a, b):
                    return f'{a / b:.4f}' if b else '-'

                print(f'{label:<10}{size_label(hw):>10}{str(row["tokens"] or "-"):>8}{op:>10}'
                      f'{gf(counted):>13}{gf(row["analytic"]):>13}{gf(row["exact"]):>12}'
                      f'{rel(counted, row["exact"]):>10}{rel(counted, row["analytic"]):>9}'
                      f'{ratio_cnt:>20.2f}{ratio_anl:>8.2f}')
    if not args.no_adventurer and os.path.exists(ADVENTURER_FILE):
        print('\nAdventurer-B/16 (Mamba-2 mixer, SwiGLU 2.5 D; counted only, no closed form):')
        for hw in args.sizes:
            counted, tokens = count_adventurer(hw, args.device)
            rows.append(dict(model='Adventurer-B/16', size=size_label(hw), operator='mamba2',
                             counted=counted, tokens=tokens))
            print(f'{"Adv-B/16":<10}{size_label(hw):>10}{tokens:>8}{"mamba2":>10}'
                  f'{counted / 1e9:>13.1f}')
    write_json(rows, args.json_out)
    return rows


if __name__ == '__main__':
    main()
