"""Adventurer-Base vs softmax ViT-B/16: forward throughput and peak memory on CPU.

Every (model, resolution) case runs in a fresh Python subprocess, so caches, allocator state
and earlier peaks never leak between cases.  Inside a case:

* throughput: batch 1, ``torch.inference_mode()``, ``--warmup`` untimed forwards, then
  ``--repeats`` timed forwards; img/s = repeats / elapsed.
* peak memory: the model and input are built, the kernel's peak-RSS counter is reset
  (``echo 5 > /proc/self/clear_refs``, which sets VmHWM to the current VmRSS), the forwards
  run, and the reported number is ``VmHWM - VmRSS_before``: the largest extra resident
  memory any forward needed (activations, temporaries, allocator overhead), weights and
  input excluded.  Memory is measured in its own subprocess (a memory phase before the
  timing one), on one forward after the warm-up forwards, with glibc's mmap threshold fixed
  at 1 MiB (``CpuPeakMemory``: every allocation of 1 MiB or more mapped on its own and
  unmapped when freed), so the resident peak is that of the live tensors, not of the
  allocator's history.  Linux only; the script stops with an error where
  the counter cannot be reset.

Usage::

    python tools/analysis/benchmark_adventurer.py --sizes 224 512 512x1024 1024x1024 \\
        --repeats 1
"""
import argparse
import json
import os
import sys
import time
from typing import Dict, List, Tuple

from mmlinvit.layers.patch_embed import patch_grid
from mmlinvit.utils.benchmarking import CpuPeakMemory, parse_size, run_case_phases

MODELS = ('adventurer', 'vit')
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LABELS = {'adventurer': 'Adventurer-B/16', 'vit': 'ViT-B/16 (softmax, DeiT)'}
#: Patch side of both models (Adventurer-B/16 and ViT-B/16).
PATCH_SIZE = 16


def run_case(model_name: str, size: Tuple[int, int], repeats: int, warmup: int, threads: int,
             chunk_size: int, chunks_per_step: int, phase: str) -> Dict[str, float]:
    """Builds one model, measures its memory or its time (runs inside the subprocess)."""
    import torch

    torch.set_num_threads(threads)
    if model_name == 'adventurer':
        from mmlinvit.backbones.adventurer import Adventurer
        mixer_cfg = dict(chunk_size=chunk_size)
        if chunks_per_step > 0:
            mixer_cfg['chunks_per_step'] = chunks_per_step
        model = Adventurer('b', mixer_cfg=mixer_cfg)
    else:
        from mmlinvit.backbones import VisionTransformer
        model = VisionTransformer('b', family='deit')
    model.eval()
    x = torch.randn(1, 3, *size)
    memory = CpuPeakMemory()
    if not memory.can_reset:
        raise RuntimeError('cannot reset the peak-RSS counter (/proc/self/clear_refs); this '
                           'benchmark needs Linux with a writable /proc')
    with torch.inference_mode():
        for _ in range(warmup):
            model(x)
        if phase == 'memory':
            return dict(peak_mib=memory.measure(lambda: model(x))[0])
        start = time.perf_counter()
        for _ in range(repeats):
            model(x)
        elapsed = time.perf_counter() - start
    return dict(img_per_s=repeats / elapsed, sec_per_img=elapsed / repeats)


def token_count(size: Tuple[int, int]) -> int:
    """Tokens of both models at ``size``: the corner-padded 16-pixel patch grid + the class
    token."""
    grid = patch_grid(size, PATCH_SIZE)
    return grid[0] * grid[1] + 1


def spawn_case(model_name: str, size: Tuple[int, int], args: argparse.Namespace) -> Dict:
    """Runs :func:`run_case` in fresh interpreters: memory (``EXACT_RSS_ENV``), then time."""
    def command(phase: str) -> List[str]:
        return [sys.executable, os.path.abspath(__file__), '--worker', model_name, '--sizes',
                f'{size[0]}x{size[1]}', '--repeats', str(args.repeats), '--warmup',
                str(args.warmup), '--threads', str(args.threads), '--chunk-size',
                str(args.chunk_size), '--chunks-per-step', str(args.chunks_per_step),
                '--phase', phase]

    try:
        return run_case_phases(command, args.threads, REPO)
    except RuntimeError as err:
        raise RuntimeError(f'case {model_name} {size} failed: {err}') from err


def format_table(rows: List[Dict]) -> str:
    head = ('| size (HxW) | tokens | Adventurer-B img/s | ViT-B img/s | speed ratio (Adv/ViT) '
            '| Adventurer-B peak MiB | ViT-B peak MiB | memory ratio (Adv/ViT) |')
    lines = [head, '|' + '---|' * 8]
    for r in rows:
        adv, vit = r['adventurer'], r['vit']
        lines.append(f"| {r['size']} | {r['tokens']} | {adv['img_per_s']:.3f} | "
                     f"{vit['img_per_s']:.3f} | {adv['img_per_s'] / vit['img_per_s']:.2f}x | "
                     f"{adv['peak_mib']:.0f} | {vit['peak_mib']:.0f} | "
                     f"{adv['peak_mib'] / max(vit['peak_mib'], 1e-9):.2f}x |")
    return '\n'.join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--sizes', nargs='+', type=parse_size,
                        default=[(224, 224), (512, 512), (512, 1024), (1024, 1024)],
                        help='resolutions, e.g. 224 512 512x1024 1024x1024 (H x W)')
    parser.add_argument('--repeats', type=int, default=3, help='timed forwards per case')
    parser.add_argument('--warmup', type=int, default=1, help='untimed forwards per case')
    parser.add_argument('--threads', type=int, default=1,
                        help='torch CPU threads (1 is the stable choice on a shared machine)')
    parser.add_argument('--chunk-size', type=int, default=256,
                        help='Adventurer SSD chunk size (256 = the model default; the '
                        'no-autograd torch scan uses chunks of at most 64 tokens whatever '
                        'this says: INFERENCE_CHUNK)')
    parser.add_argument('--chunks-per-step', type=int, default=0,
                        help='Adventurer scan: chunks vectorised together (0 = the scan default: '
                        'all with autograd, INFERENCE_STEP_BYTES-bounded steps of chunks of '
                        'INFERENCE_CHUNK tokens without)')
    parser.add_argument('--worker', choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument('--phase', choices=('memory', 'time'), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats < 1 or args.warmup < 0:
        parser.error('--repeats must be >= 1 and --warmup >= 0')

    if args.worker:
        print(json.dumps(run_case(args.worker, args.sizes[0], args.repeats, args.warmup,
                                  args.threads, args.chunk_size, args.chunks_per_step,
                                  args.phase)))
        return

    print(f'Adventurer-B/16 (Mamba-2, chunked PyTorch SSD scan, chunk {args.chunk_size}) vs '
          f'ViT-B/16 (softmax via torch SDPA), CPU, batch 1, fp32, torch.inference_mode')
    print(f'threads={args.threads} warmup={args.warmup} repeats={args.repeats} '
          f'chunks_per_step={args.chunks_per_step or "default"}')
    print('memory: peak extra resident memory of one forward after the warm-up (VmHWM after '
          'reset via /proc/self/clear_refs, minus VmRSS before; weights excluded), in a fresh '
          'subprocess per case with EXACT_RSS_ENV; time in another with the default allocator')
    print('load average at start (1/5/15 min): %.2f %.2f %.2f' % os.getloadavg())
    rows = []
    for size in args.sizes:
        row = dict(size=f'{size[0]}x{size[1]}', tokens=token_count(size))
        for model_name in MODELS:
            row[model_name] = spawn_case(model_name, size, args)
            print(f"  {LABELS[model_name]:<26} {row['size']:>10}: "
                  f"{row[model_name]['img_per_s']:.3f} img/s, "
                  f"{row[model_name]['peak_mib']:.0f} MiB", flush=True)
        rows.append(row)
    print('load average at end (1/5/15 min): %.2f %.2f %.2f' % os.getloadavg())
    print()
    print(format_table(rows))


if __name__ == '__main__':
    main()
