"""Sections 4 and 4b of the GPU suite: whole backbones and their per-kernel profiles.

:func:`section_backbones` times each pair of models (a softmax baseline and a linear model,
random weights, batch 1, inference) interleaved, eagerly and by CUDA-graph replay, with the
tokens into the blocks, the peak activation memory and the attention kernel that ran;
:func:`section_profile` gives the device time per kernel of one forward.
"""
import os
import statistics
import warnings
from typing import Callable, Dict, List, Tuple

import torch

from mmlinvit.utils.benchmarking import synchronize

from .metadata import FORCED_BACKEND_ENV
from .run import SuiteRun
from .sdpa import attention_kernels, sdpa_context
from .sizes import Sizes
from .timing import eager_rounds, graph_rounds, no_grad, peak_mib, replays_for
from .verdicts import backbone_ratios


def block_tokens(model: torch.nn.Module, fn: Callable[[], object]) -> int:
    """Tokens entering the first block during one call of ``fn``.

    Args:
        model: A backbone with ``block_list``.
        fn: A call of ``model``.
    """
    seen: List[int] = []
    handle = model.block_list[0].register_forward_pre_hook(
        lambda module, args: seen.append(int(args[0].shape[1])))
    try:
        fn()
    finally:
        handle.remove()
    return seen[0]


def backbone_pairs(sizes: Sizes) -> List[Tuple[str, Tuple[int, int], List[tuple]]]:
    """(pair, size, members): each member (label, role, build or the label of the model it
    reuses, SDPA backend); the first member is the pair's softmax baseline.

    Args:
        sizes: The run's sizes.
    """
    from mmlinvit.backbones import Adventurer, VisionTransformer

    def vit_l(op: str) -> Callable[[], torch.nn.Module]:
        return lambda: VisionTransformer(sizes.vit_l, family='dinov2', patch_size=14,
                                         img_size=518, attn_cfg=op, out_type='featmap')

    vit_b = lambda: VisionTransformer(sizes.vit_b, family='deit',  # noqa: E731
                                      attn_cfg='softmax', out_type='featmap')
    adventurer = lambda: Adventurer(sizes.adventurer_b,  # noqa: E731
                                    mixer_cfg=sizes.adventurer_mixer, with_mask_token=False,
                                    out_type='featmap')
    pairs = []
    for hw in sizes.vit_l_sizes:
        pairs.append(('ViT-L/14', hw, [
            ('ViT-L/14 softmax', 'softmax', vit_l('softmax'), 'default'),
            ('ViT-L/14 softmax [flash]', 'softmax-flash', 'ViT-L/14 softmax', 'flash'),
            ('ViT-L/14 elu', 'linear', vit_l('elu'), None)]))
    for hw in sizes.pair_sizes:
        pairs.append(('B-pair', hw, [
            ('ViT-B/16 softmax', 'softmax', vit_b, 'default'),
            ('Adventurer-B', 'linear', adventurer, None)]))
    return pairs


def section_backbones(run: SuiteRun, sizes: Sizes, rows: List[Dict[str, object]]) -> None:
    """Fills ``rows``: per pair and size, each model's tokens, activation memory, attention
    kernel (softmax models) and time (the pair's models interleaved), then the ratios.

    Args:
        run: The suite run.
        sizes: The run's sizes.
        rows: The backbone rows (filled).
    """
    device = run.device
    dtype = torch.bfloat16 if not run.dry else torch.float32
    for pair, hw, members in backbone_pairs(sizes):
        size = f'{hw[0]}x{hw[1]}'
        models: Dict[str, torch.nn.Module] = {}
        fns: Dict[str, Callable[[], object]] = {}
        pair_rows: Dict[str, Dict[str, object]] = {}
        images = None
        for label, role, build, backend in members:
            row: Dict[str, object] = {'pair': pair, 'model': label, 'role': role, 'size': size}
            rows.append(row)
            pair_rows[label] = row

            def prepare(label=label, build=build, backend=backend, row=row) -> None:
                nonlocal images
                if isinstance(build, str):
                    model = models[build]  # the same model under another SDPA backend
                else:
                    torch.manual_seed(0)
                    model = build().to(device=device, dtype=dtype).eval()
                    models[label] = model
                if images is None:
                    images = torch.randn(1, 3, hw[0], hw[1], device=device, dtype=dtype)

                def fn(model=model, backend=backend) -> object:
                    with sdpa_context(backend or 'default'):
                        return model(images)

                with torch.no_grad():
                    row['N'] = block_tokens(model, fn)
                    row['act MiB'] = peak_mib(fn, device)
                    if backend is not None:
                        row.update(attention_kernels(fn, device))
                    else:
                        row['kernels'] = 'triton (forced: ' + ', '.join(
                            f'{k}={os.environ.get(k)}' for k in FORCED_BACKEND_ENV) + ')'
                fns[label] = no_grad(fn)

            run.run_case(f'backbone {label} {size} (build)', [row], prepare)

        def timing() -> None:
            eager = eager_rounds(fns, device, sizes.repeats)
            for label, times in eager.items():
                pair_rows[label]['ms'] = statistics.median(times)
                pair_rows[label]['eager rounds ms'] = times
            if device.type != 'cuda':
                return
            replays = {label: replays_for(pair_rows[label]['ms']) for label in fns}
            graph, failed = graph_rounds(fns, device, replays)
            for label in fns:
                row = pair_rows[label]
                row['graph ms'] = statistics.median(graph[label]) if label in graph else None
                row['graph rounds ms'] = graph.get(label)
                if label in failed:
                    row['graph note'] = f'capture failed: {failed[label]}'

        if fns:
            run.run_case(f'backbone {pair} {size} (timing)', [pair_rows[k] for k in fns], timing)
        models.clear()
        fns.clear()
        images = None
        run.free_device_memory()
    backbone_ratios(rows)


def section_profile(run: SuiteRun, sizes: Sizes, out: Dict[str, List[Dict[str, object]]],
                    top: int = 12) -> None:
    """Fills ``out`` (model -> rows): device time per kernel (torch.profiler) of one forward of
    the ViT-L/14 pair at the target size and of Adventurer-B at the larger pair size.

    Args:
        run: The suite run.
        sizes: The run's sizes.
        out: Model label -> its rows (filled; a failed profile leaves one error row).
        top: Kernels listed per model (then a ``TOTAL`` row).
    """
    from torch.profiler import ProfilerActivity, profile

    from mmlinvit.backbones import Adventurer, VisionTransformer
    device = run.device
    dtype = torch.bfloat16 if not run.dry else torch.float32
    hw_l = sizes.vit_l_target
    models = {f'ViT-L/14 {op} {hw_l[0]}': (lambda op=op: VisionTransformer(
        sizes.vit_l, family='dinov2', patch_size=14, img_size=518, attn_cfg=op,
        out_type='featmap'), hw_l) for op in ('softmax', 'elu')}
    hw_a = sizes.pair_sizes[-1]
    models[f'Adventurer-B {hw_a[0]}x{hw_a[1]}'] = (lambda: Adventurer(
        sizes.adventurer_b, mixer_cfg=sizes.adventurer_mixer, with_mask_token=False,
        out_type='featmap'), hw_a)
    activities = [ProfilerActivity.CUDA] if device.type == 'cuda' else [ProfilerActivity.CPU]
    key = 'device_time_total' if device.type == 'cuda' else 'cpu_time_total'

    def case(label: str, build: Callable[[], torch.nn.Module], hw: Tuple[int, int]) -> None:
        torch.manual_seed(0)
        model = build().to(device=device, dtype=dtype).eval()
        images = torch.randn(1, 3, hw[0], hw[1], device=device, dtype=dtype)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter('ignore')
            model(images)
            synchronize(device)
            with profile(activities=activities) as prof:
                model(images)
                synchronize(device)
        events = [e for e in prof.key_averages() if getattr(e, key, 0) > 0]
        if device.type == 'cuda':
            events = [e for e in events if e.device_type.name == 'CUDA'] or events
        total = sum(getattr(e, key) for e in events) or 1.0
        events.sort(key=lambda e: getattr(e, key), reverse=True)
        rows = out[label]
        rows.extend({'kernel': e.key[:60], 'calls': e.count, 'ms': getattr(e, key) / 1e3,
                     'share': getattr(e, key) / total} for e in events[:top])
        rows.append({'kernel': 'TOTAL (all kernels)', 'calls': sum(e.count for e in events),
                     'ms': total / 1e3, 'share': 1.0})

    for label, (build, hw) in models.items():
        out[label] = []
        error_row: Dict[str, object] = {'kernel': '(profile)'}
        if not run.run_case(f'profile {label}', [error_row],
                            lambda label=label, build=build, hw=hw: case(label, build, hw)):
            out[label].append(error_row)
