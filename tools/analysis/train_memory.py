"""Peak training-step memory per image of recipe configs, with and without ``with_cp``.

For every config, crop, precision (``fp32``; ``bf16`` = bf16 autocast, fp32 master weights as
mmengine's AMP) and ``with_cp`` setting, ONE real training step of the config's model is run:
the model is built from the config through the OpenMMLab registries (every ``pretrained`` /
``Pretrained`` ``init_cfg`` is dropped: random weights, same memory), its optimizer wrapper
from ``optim_wrapper`` (plain ``OptimWrapper``), and ``model.train_step`` gets a batch of
``--batch`` generated images at the crop size (uint8 images with random label maps or class
labels, packed like the data loader packs them), so the data preprocessor, the losses, the
backward pass and the optimizer update are the real ones.

``with_cp`` is set on every mmlinvit ViT / Adventurer backbone config of the model (the
student of a distillation model).

Memory:

* CPU: every case runs in a fresh subprocess started with
  :data:`mmlinvit.utils.benchmarking.EXACT_RSS_ENV` (glibc serves large blocks by mmap, so
  RSS tracks live tensors; ``step s`` is therefore a little pessimistic).  A warm-up step on
  a 2 x 2 patch-grid crop
  allocates the optimizer state and makes kernels / thread pools resident; then freed heap
  is returned (``malloc_trim``), the peak-RSS mark reset (``/proc/self/clear_refs`` = 5), and
  the step's memory is the peak RSS during the measured step minus the RSS before it
  (weights, optimizer state and the previous step's state excluded; activations, gradients
  and temporaries included).
* CUDA: ``torch.cuda.max_memory_allocated`` during the step minus the allocation before it.

Resident sizes (weights, optimizer state) are printed separately.  "Per image" divides the
step peak by ``--batch`` (default 2, the recipes' per-GPU batch; batch 1 cannot train
UPerNet, whose 1 x 1 pyramid-pooling BatchNorm needs more than one value per channel).

Example::

    PYTHONPATH=. python tools/analysis/train_memory.py \\
        configs/segmentation/upernet_deit-b-relu-fullcopy_8xb2-160k_ade20k-512x512.py \\
        --crop 512 1024 --precision fp32 bf16
"""
import argparse
import contextlib
import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mmlinvit.utils.benchmarking import (exact_rss, proc_status_mib, run_json_child,  # noqa: E402
                                         write_json)
from mmlinvit.utils.config_types import config_type_name, is_pretrained_init  # noqa: E402

#: Backbone types that take ``with_cp`` (scope prefix stripped).
CP_BACKBONES = ('VisionTransformer', 'LinearVisionTransformer', 'Adventurer')
PRECISIONS = {'fp32': None, 'bf16': torch.bfloat16}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('configs', nargs='+', help='config files')
    parser.add_argument('--crop', nargs='+', type=int, default=None,
                        help="square crop sides (default: each config's training crop, "
                             "non-square ones such as Cityscapes' 512 x 1024 as they are)")
    parser.add_argument('--precision', nargs='+', default=['fp32', 'bf16'],
                        choices=sorted(PRECISIONS))
    parser.add_argument('--with-cp', nargs='+', default=['off', 'on'], choices=['off', 'on'])
    parser.add_argument('--batch', type=int, default=2,
                        help='images per step (2: the recipes\' per-GPU batch; UPerNet\'s pooled '
                        'BatchNorm cannot train on 1)')
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--case-timeout', type=float, default=1800.0)
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        help='key=value overrides (python literals), e.g. '
                        'model.backbone.arch=t')
    parser.add_argument('--json', default=None, help='also write the rows to this JSON file')
    parser.add_argument('--child', default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _literal(text: str) -> Any:
    import ast
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_cfg_options(items: List[str]) -> Dict[str, Any]:
    """``['a.b=1', 'c=x']`` -> ``{'a.b': 1, 'c': 'x'}``."""
    options = {}
    for item in items:
        if '=' not in item:
            raise SystemExit(f'--cfg-options entry {item!r} is not key=value')
        key, value = item.split('=', 1)
        options[key] = _literal(value)
    return options


# ---------------------------------------------------------------------------------- config
def _iter_dicts(node: Any) -> Iterator[dict]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _iter_dicts(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _iter_dicts(value)


def drop_pretrained(model_cfg: Any) -> int:
    """Removes checkpoint loading from a model config (random weights); returns the count."""
    count = 0
    for node in _iter_dicts(model_cfg):
        if node.get('pretrained'):
            node['pretrained'] = None
            count += 1
        init_cfg = node.get('init_cfg')
        if is_pretrained_init(init_cfg):
            node['init_cfg'] = None
            count += 1
        for key in [k for k in node if (k.endswith('checkpoint') or k.endswith('_ckpt'))
                    and isinstance(node[k], str)]:
            node[key] = None
            count += 1
    return count


def set_with_cp(model_cfg: Any, with_cp: bool) -> int:
    """Sets ``with_cp`` on every mmlinvit ViT / Adventurer config; returns how many."""
    count = 0
    for node in _iter_dicts(model_cfg):
        if config_type_name(node.get('type')) in CP_BACKBONES:
            node['with_cp'] = with_cp
            count += 1
    return count


def config_crop(cfg: Any) -> Union[int, Tuple[int, int]]:
    """The config's training crop (``crop_size``, preprocessor size or ``img_size``): its side
    when square, else ``(h, w)`` (a 512 x 1024 Cityscapes crop is measured as such)."""
    crop = cfg.get('crop_size', None)
    if crop is None:
        crop = (cfg.model.get('data_preprocessor') or {}).get('size', None)
    if crop is None:
        for node in _iter_dicts(cfg.model):
            if config_type_name(node.get('type')) in CP_BACKBONES and node.get('img_size'):
                crop = node['img_size']
                break
    if crop is None:
        raise SystemExit('cannot tell the crop size of the config; pass --crop')
    h, w = _crop_hw(crop)
    return h if h == w else (h, w)


def _crop_hw(crop: Union[int, Sequence[int]]) -> Tuple[int, int]:
    """``(h, w)`` of a crop side or pair."""
    if isinstance(crop, int):
        return crop, crop
    return int(crop[0]), int(crop[1])


# ---------------------------------------------------------------------------------- batches
def make_batch(model: Optional[torch.nn.Module], world: str, crop: Union[int, Sequence[int]],
               batch: int, num_classes: int) -> Dict[str, list]:
    """A data-loader style batch: uint8 images + label maps (seg) or class labels (cls) of
    ``crop`` (a side or ``(h, w)``)."""
    h, w = _crop_hw(crop)
    gen = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for _ in range(batch):
        img = torch.randint(0, 256, (3, h, w), generator=gen, dtype=torch.uint8)
        inputs.append(img)
        if world == 'mmseg':
            from mmengine.structures import PixelData
            from mmseg.structures import SegDataSample
            sample = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w),
                                                 pad_shape=(h, w)))
            label = torch.randint(0, num_classes, (1, h, w), generator=gen)
            sample.gt_sem_seg = PixelData(data=label)
        else:
            from mmpretrain.structures import DataSample
            sample = DataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w)))
            sample.set_gt_label(int(torch.randint(0, num_classes, (1, ), generator=gen)))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _num_classes(cfg: Any) -> int:
    for node in _iter_dicts(cfg.model):
        if isinstance(node.get('num_classes'), int):
            return node['num_classes']
    return 10


def _patch_size(model: torch.nn.Module) -> int:
    for module in model.modules():
        if type(module).__name__ in CP_BACKBONES:
            return int(module.patch_size)
    return 16


# ---------------------------------------------------------------------------------- measuring
def _tensor_mib(tensors: Iterator[torch.Tensor]) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def measure_case(config: str, crop: Optional[int], precision: str, with_cp: bool, batch: int,
                 device: torch.device, cfg_options: Dict[str, Any]) -> Dict[str, Any]:
    """Builds the model and optimizer of ``config`` and measures one training step."""
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import MODELS, init_default_scope

    from mmlinvit.engine.launch import adapt_to_device, load_config
    cfg = load_config(config, cfg_options or None)
    world = cfg.get('default_scope', 'mmseg')
    init_default_scope(world)
    drop_pretrained(cfg.model)
    if cfg.get('data_preprocessor') is not None:  # as mmengine's Runner merges it
        cfg.model.setdefault('data_preprocessor', cfg.data_preprocessor)
    n_cp = set_with_cp(cfg.model, with_cp)
    if n_cp == 0 and with_cp:
        raise SystemExit(f'{config}: no mmlinvit ViT / Adventurer backbone to set with_cp on')
    adapt_to_device(cfg)
    crop = crop or config_crop(cfg)
    if world == 'mmseg' and cfg.model.get('data_preprocessor'):  # mmseg pads to ``size``
        cfg.model.data_preprocessor['size'] = _crop_hw(crop)
    model = MODELS.build(cfg.model).to(device)
    model.init_weights()
    model.train()
    optim_cfg = dict(cfg.optim_wrapper)
    optim_cfg['type'] = 'OptimWrapper'
    optim_cfg.pop('loss_scale', None)
    optim_cfg.pop('dtype', None)
    optim_wrapper = build_optim_wrapper(model, optim_cfg)
    autocast = (torch.autocast(device.type, dtype=PRECISIONS[precision])
                if PRECISIONS[precision] is not None else contextlib.nullcontext())
    num_classes = _num_classes(cfg)

    def step(size: Union[int, Tuple[int, int]]) -> Dict[str, torch.Tensor]:
        data = make_batch(model, world, size, batch, num_classes)
        with autocast:
            return model.train_step(data, optim_wrapper)

    # Warm-up on a tiny crop: optimizer state, kernels, thread pools.
    step(2 * _patch_size(model))
    params = _tensor_mib(p for p in model.parameters())
    optim_state = _tensor_mib(t for state in optim_wrapper.optimizer.state.values()
                              for t in state.values() if torch.is_tensor(t))
    t0 = time.perf_counter()
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        losses = step(crop)
        torch.cuda.synchronize(device)
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        method = 'cuda max_memory_allocated during the step minus the allocation before it'
    else:
        libc_name = ctypes.util.find_library('c')
        if libc_name:
            ctypes.CDLL(libc_name).malloc_trim(0)
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        before = proc_status_mib('VmRSS')
        losses = step(crop)
        peak = proc_status_mib('VmHWM') - before
        method = ('fresh subprocess per case; peak RSS (VmHWM reset via /proc/self/clear_refs) '
                  'during the step minus RSS before it, after a warm-up step and malloc_trim'
                  + ('; glibc mmap threshold fixed at 1 MiB (EXACT_RSS_ENV)' if exact_rss()
                     else ''))
    seconds = time.perf_counter() - t0
    loss = float(losses['loss'].detach())  # mmengine's parse_losses: the sum of the terms
    return dict(config=os.path.relpath(config, ROOT) if os.path.isabs(config) else config,
                crop=crop, precision=precision, with_cp=with_cp, batch=batch,
                step_mib=peak, per_image_mib=peak / batch, params_mib=params,
                optimizer_mib=optim_state, step_s=seconds, loss=loss, cp_backbones=n_cp,
                memory_method=method)


def run_case_subprocess(args: argparse.Namespace, spec: Dict[str, Any]) -> Dict[str, Any]:
    """One case in a fresh interpreter started with :data:`EXACT_RSS_ENV` (peak RSS then tracks
    live tensors, not the allocator's history); errors come back as the row's ``error``."""
    cmd = [sys.executable, os.path.abspath(__file__), spec['config'], '--child', json.dumps(spec)]
    base = dict(config=spec['config'], crop=spec['crop'], precision=spec['precision'],
                with_cp=spec['with_cp'])
    try:
        return run_json_child(cmd, args.threads, ROOT, exact_memory=True,
                              timeout=args.case_timeout)
    except subprocess.TimeoutExpired:
        return dict(base, error=f'timeout after {args.case_timeout:.0f} s')
    except RuntimeError as exc:
        return dict(base, error=str(exc)[:200])


def _crop_label(crop: Any) -> str:
    """``'512'`` for a square crop, ``'512x1024'`` for (h, w)."""
    if isinstance(crop, (list, tuple)):
        return 'x'.join(str(int(side)) for side in crop)
    return str(crop)


def print_table(rows: List[Dict[str, Any]]) -> None:
    cols = ['config', 'crop', 'precision', 'with_cp', 'step MiB/img', 'vs no-cp', 'weights MiB',
            'optim MiB', 'step s']
    table = []
    for r in rows:
        line = {'config': os.path.basename(str(r['config'])).replace('.py', ''),
                'crop': _crop_label(r.get('crop')), 'precision': r['precision'],
                'with_cp': 'on' if r['with_cp'] else 'off'}
        if 'error' in r:
            line['step MiB/img'] = r['error']
            table.append(line)
            continue
        ref = next((b for b in rows if b['config'] == r['config'] and b.get('crop') == r['crop']
                    and b['precision'] == r['precision'] and not b['with_cp']
                    and 'error' not in b), None)
        line['step MiB/img'] = f'{r["per_image_mib"]:.0f}'
        line['vs no-cp'] = f'{r["per_image_mib"] / ref["per_image_mib"]:.2f}x' if ref else '-'
        line['weights MiB'] = f'{r["params_mib"]:.0f}'
        line['optim MiB'] = f'{r["optimizer_mib"]:.0f}'
        line['step s'] = f'{r["step_s"]:.1f}'
        table.append(line)
    widths = {c: max(len(c), *(len(t.get(c, '-')) for t in table)) for c in cols}
    print('  '.join(c.rjust(widths[c]) for c in cols))
    for t in table:
        print('  '.join(t.get(c, '-').rjust(widths[c]) for c in cols))


def main(argv: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    args = parse_args(argv)
    cfg_options = parse_cfg_options(args.cfg_options)
    if args.child is not None:
        spec = json.loads(args.child)
        torch.set_num_threads(spec['threads'])
        row = measure_case(spec['config'], spec['crop'], spec['precision'], spec['with_cp'],
                           spec['batch'], torch.device('cpu'), spec['cfg_options'])
        print(json.dumps(row))
        return [row]
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda requested but torch.cuda.is_available() is False')
    torch.set_num_threads(args.threads)
    rows = []
    for config in args.configs:
        for crop in (args.crop or [None]):
            for precision in args.precision:
                for cp in args.with_cp:
                    spec = dict(config=config, crop=crop, precision=precision,
                                with_cp=cp == 'on', batch=args.batch, threads=args.threads,
                                cfg_options=cfg_options)
                    t0 = time.perf_counter()
                    if device.type == 'cpu':
                        row = run_case_subprocess(args, spec)
                    else:
                        row = measure_case(config, crop, precision, cp == 'on', args.batch,
                                           device, cfg_options)
                        torch.cuda.empty_cache()
                    rows.append(row)
                    status = row.get('error') or (
                        f'{row["per_image_mib"]:.0f} MiB/image (step {row["step_mib"]:.0f} MiB, '
                        f'{row["step_s"]:.0f} s)')
                    print(f'[{time.perf_counter() - t0:6.1f} s] {config} crop={row.get("crop")} '
                          f'{precision} with_cp={cp}: {status}', flush=True)
    print()
    method = next((r['memory_method'] for r in rows if 'memory_method' in r), '-')
    print(f'device={device} threads={args.threads} batch={args.batch} torch={torch.__version__}')
    print(f'memory: {method}; bf16 = torch.autocast(bfloat16) around train_step, fp32 weights')
    print_table(rows)
    write_json(rows, args.json)
    return rows


if __name__ == '__main__':
    main()
