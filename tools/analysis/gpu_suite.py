"""One-GPU suite (~2-3 min on an H200 without the sweeps): kernel correctness, speed, backbones.

Sections (each prints a table; everything also goes to ``suite.json`` and ``suite.png`` in
``--out-dir``, by default ``$OUT`` when that variable is set, else ``work_dirs/gpu_suite``):

0. **Ceilings**: a 1 GiB device-to-device copy (bytes read + written) and an 8192^3 bf16
   matmul; section 2 also gives the kernel's bandwidth against the measured copy.
1. **Correctness** of the Triton kernels against the PyTorch paths, forward and backward
   (relative Frobenius error of the output and every input gradient), fp32 and bf16, ragged
   token counts (not multiples of any block), cross attention (N != M), ReLU at d = e = 128,
   a non-power-of-two head (48 -> 40), InLine; the SSD scan (Adventurer-B shapes, ragged L,
   groups, P / N not powers of two) against the chunked PyTorch scan.  The reference is run in
   fp32 on the same (rounded) inputs; bounds in :mod:`mmlinvit.analysis.kernel_checks`.  Exit
   code 1 if any check fails.
2. **Linear attention op** at 1k-64k tokens (B=1, H=16, d=64, ELU+1, bf16): the Triton kernel
   forward and forward + backward, the PyTorch path (``backend='torch'``, forward), and
   ``scaled_dot_product_attention`` under each fused backend forced with
   ``torch.nn.attention.sdpa_kernel``: ``SDPBackend.FLASH_ATTENTION`` ("flash") and
   ``SDPBackend.CUDNN_ATTENTION`` ("cudnn"), each forward and forward + backward, with the
   ratio to the Triton kernel; a backend this torch / device cannot run is recorded as
   skipped with torch's reason.  For every N the default dispatch's aten op and CUDA kernel are
   recorded too (profiled, not timed: on the H200 the default ran cuDNN, not FlashAttention).
   The Triton kernel's achieved bandwidth counts the minimal traffic (forward: read q, k, v,
   write out = 4 tensors; forward + backward: that plus read q, k, v, dout and write dq, dk,
   dv = 11 tensors) against the device's peak (``--peak-bw``, else the table
   :data:`mmlinvit.analysis.gpu_suite.metadata.PEAK_BW` by exact device name) and the
   measured copy.  Where the forward's working set fits in L2 (N < 16k here) the figure
   measures L2, not HBM (``in L2`` column); the target (>= 70 % of peak) is judged at
   N >= 16k only.
3. **SSD scan** (Adventurer-B: H=24, P=64, N=64, chunk 256, bf16 x / B / C): Triton vs the
   PyTorch scan, forward and forward + backward.  The PyTorch forward is timed in its
   vectorised chunk-256 form (``torch_impl.INFERENCE_FORM = False`` around the call: every
   chunk in one batched step, as autograd runs it), not the CPU-tuned inference form (chunks
   of 64, a Python loop over chunks: ~22k launches at 64k tokens, a host-overhead figure).
4. **Whole backbones** (random weights, bf16, batch 1, inference): ViT-L/14 softmax (SDPA,
   default dispatch; its aten op and kernel recorded) vs ELU + Triton at 518, 1024, 2048, plus
   the softmax model under ``SDPBackend.FLASH_ATTENTION`` (the target's "FlashAttention");
   Adventurer-B vs ViT-B/16 softmax at 512x1024 and 1024x2048; N = tokens into the blocks;
   time and peak activation memory (``max_memory_allocated`` during the call minus the
   allocation before it: weights excluded).  The linear models run with
   ``MMLINVIT_LINEAR_ATTN_BACKEND=triton`` and ``MMLINVIT_SSD_BACKEND=triton``: a call the
   kernels cannot take raises instead of falling back to PyTorch.  The models of one pair are
   timed interleaved (round-robin), so the per-round speed ratios give a spread.  Targets:
   ViT-L/14 at 1024 >= 1.7x the softmax model (speed) at <= 40 % of its memory (memory),
   judged separately, in CUDA graph replay and eagerly.
4b. **Profile**: device time per kernel (torch.profiler) of one forward of each ViT-L/14 at
   1024 and of Adventurer-B at the larger pair size.
5. **Launch sweeps**: tile sizes / warps / stages / programs of the linear attention and SSD
   kernels (``_LaunchConfig`` fields overridden one variant at a time), each timed by CUDA
   graph replay and checked against the default launch's outputs; ``--sweep-budget-s`` bounds
   it.  The data the defaults are chosen from.

Sections 2-4 time eagerly (CUDA events per call: host launch overhead included, as a user
sees it) and by CUDA graph replay (the device's own time; the kernel bandwidth figures use it,
and the ``BW from`` column says when a failed capture left only the eager time).  Every case
(one N, one L, one model) is guarded on its own: a failure (an out-of-memory error included)
is recorded in its row's ``error`` field and under ``errors`` and the next case runs.
``suite.json`` is rewritten atomically after every case and section (a killed run keeps what
it measured); stdout is line-buffered.  The JSON starts with the run's metadata (device, SM
count, MIG mode, TF32 settings, cuDNN, torch and triton versions, forced backends).

``--dry-run`` runs every section at tiny sizes on CPU with ``TRITON_INTERPRET=1`` (the Triton
interpreter; set before triton is imported), so CI proves the script works before a GPU is
there (tests/analysis/test_gpu_suite_dry_run.py).  Its timings and bandwidths are
meaningless; its correctness checks are real.  Without ``--dry-run`` ``TRITON_INTERPRET`` must
be unset.

The pieces live in :mod:`mmlinvit.analysis.gpu_suite` (run bookkeeping, timing, SDPA, run
metadata, the sections, verdicts, tables and figure); this script is the command line and
the order of the sections.

Examples::

    PYTHONPATH=. python tools/analysis/gpu_suite.py --sections ceilings check la ssd \\
        backbones profile                                        # on the GPU machine
    PYTHONPATH=. python tools/analysis/gpu_suite.py --dry-run --out-dir /tmp/suite
"""
import argparse
import os
import sys
import time
import traceback
from typing import Callable, List, Optional

if __name__ == '__main__' and '--dry-run' in sys.argv:
    os.environ['TRITON_INTERPRET'] = '1'  # before anything imports triton

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mmlinvit.analysis.gpu_suite.backbone_sections import (section_backbones,  # noqa: E402
                                                           section_profile)
from mmlinvit.analysis.gpu_suite.metadata import (DRY_RUN_PEAK_BW,  # noqa: E402
                                                  FORCED_BACKEND_ENV, peak_bandwidth,
                                                  run_metadata)
from mmlinvit.analysis.gpu_suite.op_sections import (SSD_TORCH_FORM,  # noqa: E402
                                                     section_ceilings, section_check,
                                                     section_linear_attention, section_ssd)
from mmlinvit.analysis.gpu_suite.report import plot, print_section  # noqa: E402
from mmlinvit.analysis.gpu_suite.run import SuiteRun  # noqa: E402
from mmlinvit.analysis.gpu_suite.sizes import dry_sizes, full_sizes  # noqa: E402
from mmlinvit.analysis.gpu_suite.sweeps import section_sweeps  # noqa: E402
from mmlinvit.analysis.gpu_suite.verdicts import verdicts  # noqa: E402

#: Sections in run order (``--sections`` picks a subset).
SECTIONS = ('ceilings', 'check', 'la', 'ssd', 'backbones', 'profile', 'sweeps')


def default_out_dir() -> str:
    """``$OUT`` when set (the device machine returns only files under it), else
    ``work_dirs/gpu_suite`` in the repository."""
    return os.environ.get('OUT') or os.path.join(ROOT, 'work_dirs', 'gpu_suite')


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The suite's command line.

    Args:
        argv: Arguments (None: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--dry-run', action='store_true',
                        help='tiny sizes on CPU with TRITON_INTERPRET=1 (CI)')
    parser.add_argument('--out-dir', default=default_out_dir(),
                        help='where suite.json / suite.png go (default: $OUT if set, else '
                        'work_dirs/gpu_suite)')
    parser.add_argument('--peak-bw', type=float, default=None,
                        help='peak HBM bandwidth in B/s (default: PEAK_BW by exact device name)')
    parser.add_argument('--sections', nargs='+', default=list(SECTIONS), choices=list(SECTIONS))
    parser.add_argument('--sweep-budget-s', type=float, default=120.0,
                        help='the sweeps stop starting variants after this many seconds '
                        '(default: 120; each eager timing is the median of 10 rounds, 1 with '
                        '--dry-run)')
    parser.add_argument('--sweep-kernels', nargs='+', default=['la', 'ssd'],
                        choices=['la', 'ssd'], help='kernels the sweeps cover')
    return parser.parse_args(argv)


#: Columns of the printed tables (the JSON has every field).
LA_COLS = ('N', 'triton ms', 'graph triton ms', 'triton f+b ms', 'graph triton f+b ms',
           'torch ms', 'torch/triton', 'fwd traffic MiB', 'in L2', 'BW from', 'HBM fwd', 'HBM f+b',
           'fwd vs copy', 'target >=0.7')
SDPA_COLS = ('N', 'sdpa', 'ms', 'sdpa/triton', 'graph ms', 'graph sdpa/triton', 'f+b ms',
             'f+b sdpa/triton', 'aten op', 'kernel')
BB_COLS = ('pair', 'model', 'size', 'N', 'ms', 'graph ms', 'act MiB', 'speed x',
           'graph speed x', 'speed x flash', 'graph speed x flash', 'mem frac', 'mem frac flash',
           'graph note')
BB_KERNEL_COLS = ('model', 'size', 'aten op', 'kernel', 'kernels')


def _interpreter_requested() -> bool:
    # as triton reads it: 'false' / 'off' / 'no' do not turn the interpreter on
    from mmlinvit.ops.triton_utils import triton_interpreter_enabled
    return triton_interpreter_enabled()


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the chosen sections; returns the exit code (1: a check, section or case failed).

    Args:
        argv: Command-line arguments (None: ``sys.argv[1:]``).
    """
    for stream in (sys.stdout, sys.stderr):  # a killed run keeps every printed line
        if hasattr(stream, 'reconfigure'):
            stream.reconfigure(line_buffering=True)
    args = parse_args(argv)
    dry = args.dry_run
    if dry:
        if os.environ.get('TRITON_INTERPRET') != '1':
            raise SystemExit('--dry-run needs TRITON_INTERPRET=1 set before triton is imported '
                             '(run the script directly, or export TRITON_INTERPRET=1)')
        device = torch.device('cpu')
        sizes = dry_sizes()
        torch.set_num_threads(min(2, torch.get_num_threads()))
    else:
        if _interpreter_requested():
            raise SystemExit(f"TRITON_INTERPRET={os.environ['TRITON_INTERPRET']} is set: the "
                             'Triton kernels would run in the CPU interpreter and every timing '
                             'would be meaningless; unset TRITON_INTERPRET for the GPU run (or '
                             'pass --dry-run for the CPU smoke run)')
        if not torch.cuda.is_available():
            raise SystemExit('no CUDA device; run with --dry-run for the CPU smoke run')
        device = torch.device('cuda')
        sizes = full_sizes()
    for var in FORCED_BACKEND_ENV:  # linear models must run the kernels, or fail loudly
        if os.environ.get(var, 'triton') != 'triton':
            print(f'note: {var}={os.environ[var]} overridden with triton')
        os.environ[var] = 'triton'
    from mmlinvit.ops.triton_utils import triton_available
    if not triton_available():
        raise SystemExit('the suite needs triton')
    name = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU (interpreter)'
    if args.peak_bw:
        peak_bw, peak_source = args.peak_bw, '--peak-bw'
    elif dry:
        peak_bw, peak_source = DRY_RUN_PEAK_BW, 'nominal (dry run)'
    else:
        peak_bw = peak_bandwidth(name)
        peak_source = 'PEAK_BW table (exact device name)' if peak_bw else \
            'unknown device: pass --peak-bw (fractions of peak left out)'
    os.makedirs(args.out_dir, exist_ok=True)
    run = SuiteRun(device, dry)
    result = run.result
    result.update(run_metadata(name, peak_bw, peak_source, device, dry))
    result['args'] = vars(args)
    run.path = json_path = os.path.join(args.out_dir, 'suite.json')
    print(f'device: {name}  torch {result["torch"]}  triton {result["triton"]}  '
          f'cuDNN {result["cudnn"]}  SMs {result["sm_count"]}  MIG {result["mig"]}  '
          f'matmul allow_tf32 {result["matmul allow_tf32"]}  peak BW '
          f'{"-" if peak_bw is None else f"{peak_bw / 1e12:.2f} TB/s"} ({peak_source})'
          f'{"  (DRY RUN: timings meaningless)" if dry else ""}')
    t_start = time.perf_counter()

    def run_section(name: str, fn: Callable[[], object]) -> object:
        """Runs one section; a failure is printed and recorded, and the next section runs."""
        if name not in args.sections:
            return None
        try:
            return fn()
        except Exception:  # one broken section must not cost the others' numbers
            trace = traceback.format_exc()
            print(f'section {name} FAILED:\n{trace}')
            result['errors'][name] = trace[-4000:]
            run.free_device_memory()
            return None
        finally:
            result['seconds'] = time.perf_counter() - t_start
            run.save()  # after every section: a killed run keeps its part

    def elapsed() -> str:
        return f'[{time.perf_counter() - t_start:.0f} s]'

    def ceilings() -> None:
        result['ceilings'] = section_ceilings(device)
        run.copy_bw = result['ceilings']['copy TB/s']
        print_section(f'0. measured ceilings {elapsed()}:', [result['ceilings']])

    def check() -> bool:
        la_rows = result['check_linear_attention'] = []
        ssd_rows = result['check_ssd'] = []
        try:
            section_check(run, sizes, la_rows, ssd_rows)
        finally:
            print_section('1. correctness, linear attention (rel. Frobenius error vs fp32 torch '
                          'path):', la_rows)
            print_section('   correctness, SSD scan (rel. error vs fp32 chunked torch scan):',
                          ssd_rows)
        passed = bool(la_rows) and all(r['ok'] == 'PASS' for r in la_rows + ssd_rows)
        print(f'   correctness {"PASSED" if passed else "FAILED"} {elapsed()}')
        return passed

    def la() -> None:
        rows = result['linear_attention'] = []
        sdpa_rows = result['linear_attention_sdpa'] = []
        try:
            section_linear_attention(run, sizes, peak_bw, rows, sdpa_rows)
        finally:
            print_section(
                f'2. linear attention op, B=1 H={sizes.la_heads} d={sizes.la_head_dim} ELU+1, '
                f'Triton kernel (median ms; graph = CUDA graph replay; HBM = fraction of '
                f'{"-" if peak_bw is None else f"{peak_bw / 1e12:.2f}"} TB/s from the graph '
                f'times, BW from says when eager times stood in; rows with in L2 = yes measure '
                f'L2, not HBM) {elapsed()}:', rows, LA_COLS)
            print_section('   vs scaled_dot_product_attention, each backend forced with '
                          'sdpa_kernel (default = torch\'s own choice, profiled not timed; '
                          'sdpa/triton > 1: Triton faster):', sdpa_rows, SDPA_COLS)

    def ssd() -> None:
        rows = result['ssd'] = []
        result['ssd_torch_form'] = SSD_TORCH_FORM
        try:
            section_ssd(run, sizes, rows)
        finally:
            print_section(f'3. SSD scan {sizes.ssd_shape} (median ms; torch = {SSD_TORCH_FORM}) '
                          f'{elapsed()}:', rows)

    def backbones() -> None:
        rows = result['backbones'] = []
        try:
            section_backbones(run, sizes, rows)
        finally:
            print_section('4. backbones, batch 1 inference (N = tokens into the blocks; act MiB = '
                          'peak above weights; speed x / mem frac vs the softmax model with the '
                          'default SDPA dispatch, "flash" vs it under FLASH_ATTENTION; models of '
                          f'a pair timed interleaved) {elapsed()}:', rows, BB_COLS)
            print_section('   attention kernels that ran (softmax: profiled SDPA op / kernel):',
                          rows, BB_KERNEL_COLS)

    def profile_models() -> None:
        result['profile'] = {}
        section_profile(run, sizes, result['profile'])
        for name, rows in result['profile'].items():
            print_section(f'4b. device time per kernel, one forward of {name} {elapsed()}:', rows)

    def sweeps() -> None:
        result['sweeps'] = section_sweeps(run, sizes, time.perf_counter() + args.sweep_budget_s,
                                          tuple(args.sweep_kernels))
        for name, rows in result['sweeps'].items():
            print_section(f'5. launch sweep, {name} (graph ms; error vs the default launch) '
                          f'{elapsed()}:', rows)

    run_section('ceilings', ceilings)
    ok = run_section('check', check) is True or 'check' not in args.sections
    run_section('la', la)
    run_section('ssd', ssd)
    run_section('backbones', backbones)
    run_section('profile', profile_models)
    run_section('sweeps', sweeps)
    lines = verdicts(result.get('linear_attention') or [], result.get('backbones') or [],
                     sizes.vit_l_target)
    result['verdicts'] = lines
    result['correctness_ok'] = ok
    result['seconds'] = time.perf_counter() - t_start
    for line in lines:
        print(line)
    run.save()
    try:
        plot(result, os.path.join(args.out_dir, 'suite.png'), dry)
    except Exception:  # the figure is a convenience: the JSON has every number
        result['errors']['plot'] = traceback.format_exc()[-4000:]
        print(f'plot FAILED:\n{result["errors"]["plot"]}')
        run.save()
    failed = sorted(result['errors'])
    print(f'total {result["seconds"]:.0f} s; correctness {"PASSED" if ok else "FAILED"}; '
          f'sections / cases failed: {failed or "none"}; wrote {json_path} and suite.png')
    return 0 if ok and not failed else 1


if __name__ == '__main__':
    sys.exit(main())
