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
   :data:`PEAK_BW` by exact device name) and the measured copy.  Where the forward's working
   set fits in L2 (N < 16k here) the figure measures L2, not HBM (``in L2`` column); the
   target (>= 70 % of peak) is judged at N >= 16k only.
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

Examples::

    PYTHONPATH=. python tools/analysis/gpu_suite.py --sections ceilings check la ssd \\
        backbones profile                                        # on the GPU machine
    PYTHONPATH=. python tools/analysis/gpu_suite.py --dry-run --out-dir /tmp/suite
"""
import argparse
import contextlib
import gc
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

if __name__ == '__main__' and '--dry-run' in sys.argv:
    os.environ['TRITON_INTERPRET'] = '1'  # before anything imports triton

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mmlinvit.analysis.kernel_checks import (check_linear_attention,  # noqa: E402
                                             check_ssd, make_qkv, make_ssd_inputs)
from mmlinvit.utils.benchmarking import (cuda_peak_memory, print_table,  # noqa: E402
                                         rel_err, time_call_ms, time_round_robin)

#: Sections in run order (``--sections`` picks a subset).
SECTIONS = ('ceilings', 'check', 'la', 'ssd', 'backbones', 'profile', 'sweeps')
#: Peak HBM bandwidth (B/s) by exact ``torch.cuda.get_device_name()`` (vendor data sheets);
#: another device needs ``--peak-bw`` (without it only the measured copy is the reference).
PEAK_BW = {
    'NVIDIA H200': 4.8e12,
    'NVIDIA H100 80GB HBM3': 3.35e12,
    'NVIDIA H100 PCIe': 2.0e12,
    'NVIDIA A100-SXM4-80GB': 2.039e12,
    'NVIDIA A100-SXM4-40GB': 1.555e12,
    'NVIDIA A100 80GB PCIe': 1.935e12,
    'NVIDIA A100-PCIE-40GB': 1.555e12,
    'NVIDIA L40S': 0.864e12,
}
#: Nominal peak of the dry run (its bandwidth figures are meaningless anyway).
DRY_RUN_PEAK_BW = 4.8e12
DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16}
#: Fused SDPA backends timed in section 2 (name in the tables -> ``SDPBackend`` member).
SDPA_BACKENDS = {'flash': 'FLASH_ATTENTION', 'cudnn': 'CUDNN_ATTENTION'}
#: The kernel-backend environment variables (``mmlinvit.ops.*.dispatch``) the suite forces to
#: ``triton``: a linear model that cannot take the kernel raises instead of silently timing
#: the PyTorch path.
FORCED_BACKEND_ENV = ('MMLINVIT_LINEAR_ATTN_BACKEND', 'MMLINVIT_SSD_BACKEND')
#: Forward working sets at or below the device's L2 measure L2 bandwidth; where the L2 size
#: is unknown (CPU) the rule of thumb for the H200 (50 MiB L2, 32 MiB per tensor at 16k).
L2_RULE_TOKENS = 16384
#: CUDA-graph replays per round are chosen so one round of one function takes about this long.
GRAPH_ROUND_MS = 200.0


@dataclass
class Sizes:
    """Problem sizes of one suite run (full GPU run or ``--dry-run``)."""
    la_check_tokens: List[int]
    la_heads: int
    la_head_dim: int
    la_bench_tokens: List[int]
    ssd_check_lengths: List[int]
    ssd_shape: Dict[str, int]
    ssd_bench_lengths: List[int]
    vit_l: object
    vit_l_sizes: List[Tuple[int, int]]
    vit_b: object
    adventurer_b: object
    adventurer_mixer: Optional[dict]
    pair_sizes: List[Tuple[int, int]]
    repeats: int
    extra_la_cases: List[tuple] = field(default_factory=list)
    sweep_tokens: Tuple[int, int] = (16384, 65536)
    sweep_ssd_length: int = 16384
    sweep_programs: Tuple[int, ...] = (132, 264, 1056)
    sweep_programs_out: Tuple[int, ...] = (264, 528, 1056, 2112)
    sweep_limit: Optional[int] = None  # most variants per list (dry run: a few)
    vit_l_target: Tuple[int, int] = (1024, 1024)  # the size of the speed / memory targets


def full_sizes() -> Sizes:
    return Sizes(
        la_check_tokens=[1000, 4097, 16411], la_heads=16, la_head_dim=64,
        la_bench_tokens=[1024, 4096, 16384, 65536],
        ssd_check_lengths=[1024, 4133], ssd_shape=dict(heads=24, headdim=64, d_state=64,
                                                       groups=1, chunk=256),
        ssd_bench_lengths=[1024, 4096, 16384, 65536],
        vit_l='l', vit_l_sizes=[(518, 518), (1024, 1024), (2048, 2048)],
        vit_b='b', adventurer_b='b', adventurer_mixer=None,
        pair_sizes=[(512, 1024), (1024, 2048)], repeats=10,
        extra_la_cases=[  # (name, N, M, H, d, e, dtype, mode)
            ('relu d=e=128', 4097, 4097, 4, 128, 128, torch.bfloat16, 'relu'),
            ('relu d=e=128 fp32', 1000, 1000, 4, 128, 128, torch.float32, 'relu'),
            ('elu d=48 e=40 ragged', 4101, 4101, 4, 48, 40, torch.float16, 'elu'),
            ('inline', 4097, 4097, 16, 64, 64, torch.bfloat16, 'inline'),
            ('inline fp32 ragged', 1001, 1001, 16, 64, 64, torch.float32, 'inline'),
            ('elu cross N!=M', 977, 3079, 16, 64, 64, torch.bfloat16, 'elu'),
        ])


def dry_sizes() -> Sizes:
    tiny_vit = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
    return Sizes(
        la_check_tokens=[37, 70], la_heads=2, la_head_dim=16, la_bench_tokens=[64, 130],
        ssd_check_lengths=[40], ssd_shape=dict(heads=2, headdim=16, d_state=16, groups=1,
                                               chunk=16),
        ssd_bench_lengths=[48],
        vit_l=tiny_vit, vit_l_sizes=[(28, 28), (42, 42)],
        vit_b=tiny_vit, adventurer_b=dict(embed_dims=32, num_layers=2),
        adventurer_mixer=dict(d_state=16, headdim=16, chunk_size=16),
        pair_sizes=[(32, 48)], repeats=1,
        extra_la_cases=[('elu d=12 e=10 ragged', 29, 29, 2, 12, 10, torch.float16, 'elu'),
                        ('inline', 33, 33, 2, 16, 16, torch.bfloat16, 'inline'),
                        ('elu cross N!=M', 17, 41, 2, 16, 16, torch.bfloat16, 'elu')],
        sweep_tokens=(40, 70), sweep_ssd_length=40, sweep_programs=(4, ),
        sweep_programs_out=(2, ), sweep_limit=2, vit_l_target=(42, 42))


def default_out_dir() -> str:
    """``$OUT`` when set (the device machine returns only files under it), else
    ``work_dirs/gpu_suite`` in the repository."""
    return os.environ.get('OUT') or os.path.join(ROOT, 'work_dirs', 'gpu_suite')


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
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
                        help='the sweeps stop starting variants after this many seconds')
    parser.add_argument('--sweep-kernels', nargs='+', default=['la', 'ssd'],
                        choices=['la', 'ssd'], help='kernels the sweeps cover')
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------- output
def _json_default(obj: object) -> object:
    return str(obj)


def write_json_atomic(path: str, obj: object) -> None:
    """Writes ``obj`` to ``path`` through a temporary file and ``os.replace``: a reader (or a
    run killed mid-write) sees the previous complete file or the new one, never half of it."""
    tmp = f'{path}.tmp'
    with open(tmp, 'w') as f:
        json.dump(obj, f, indent=2, default=_json_default)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Output:
    """The run's result dict and where it is saved (``path`` None: not saved)."""

    def __init__(self) -> None:
        self.result: Dict[str, object] = {'errors': {}}
        self.path: Optional[str] = None

    def save(self) -> None:
        if self.path is not None:
            write_json_atomic(self.path, self.result)


OUTPUT = Output()


def free_device_memory() -> None:
    """Collects garbage and returns cached CUDA blocks (after a failed case)."""
    gc.collect()
    if DEVICE.type == 'cuda':
        with contextlib.suppress(Exception):  # a sticky CUDA error must not end the run here
            torch.cuda.synchronize(DEVICE)
        torch.cuda.empty_cache()


def run_case(label: str, rows: Sequence[Dict[str, object]], body: Callable[[], None]) -> bool:
    """Runs one measurement case; returns whether it succeeded.

    The rows are already in the result (``body`` fills them in place), so what the case
    measured before failing stays; an exception (``torch.cuda.OutOfMemoryError`` included) is
    written as ``'Type: message'`` into every row's ``error`` and its traceback under
    ``errors[label]``, the CUDA cache is emptied, and the JSON is saved either way.
    """
    failed = False
    try:
        body()
    except Exception as exc:  # one failing case must not cost the other cases' numbers
        message = f'{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ""}'
        for row in rows:
            row['error'] = message
        OUTPUT.result['errors'][label] = traceback.format_exc()[-3000:]
        print(f'   {label} FAILED: {message}')
        failed = True
    if failed:  # outside the except block: the traceback (and the case's tensors) are gone
        free_device_memory()
    OUTPUT.save()
    return not failed


# ---------------------------------------------------------------------------------- timing
def bench_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median ms of ``fn`` (CUDA events after 2 warm-ups; CPU: perf_counter after 1)."""
    warmups = 2 if device.type == 'cuda' else 1
    return time_round_robin({'fn': fn}, device, repeats, warmups=warmups)['fn']


def eager_rounds(fns: Dict[str, Callable[[], object]], device: torch.device,
                 repeats: int) -> Dict[str, List[float]]:
    """Per-round ms of each function, called round-robin (``repeats`` rounds after warm-ups:
    2 on CUDA, 1 on CPU), so the ratios of one round share the device's state."""
    warmups = 2 if device.type == 'cuda' else 1
    for fn in fns.values():
        for _ in range(warmups):
            fn()
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    times: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(time_call_ms(fn, device))
    return times


def replays_for(eager_ms: Optional[float]) -> int:
    """CUDA-graph replays per timing round: ~:data:`GRAPH_ROUND_MS` per round, 3 to 20."""
    if not eager_ms:
        return 20
    return int(max(3, min(20, GRAPH_ROUND_MS // eager_ms)))


def _capture(fn: Callable[[], object], device: torch.device) -> 'torch.cuda.CUDAGraph':
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize(device)
    return graph


def graph_rounds(fns: Dict[str, Callable[[], object]], device: torch.device,
                 replays: Dict[str, int], rounds: int = 5
                 ) -> Tuple[Dict[str, List[float]], Dict[str, str]]:
    """ms per replay of each function captured in a CUDA graph, per round, the graphs replayed
    round-robin; and the reason of each capture that failed (that function has no times).

    Replays leave out the host's launch overhead (Python dispatch of every kernel): this is
    the time the device needs, the number to set against the bytes moved.
    """
    graphs, failed = {}, {}
    for name, fn in fns.items():
        try:
            graphs[name] = _capture(fn, device)
        except Exception as exc:  # capture is a measurement aid: report and go on
            failed[name] = f'{type(exc).__name__}: {str(exc)[:160]}'
            print(f'   ({name}: CUDA graph capture failed: {failed[name]})')
            with contextlib.suppress(Exception):
                torch.cuda.synchronize(device)
    times: Dict[str, List[float]] = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, graph in graphs.items():
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays[name]):
                graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / replays[name])
    del graphs
    torch.cuda.empty_cache()
    return times, failed


def graph_ms(fn: Callable[[], object], device: torch.device, replays: int = 20,
             rounds: int = 5) -> Optional[float]:
    """Median ms per replay of ``fn`` captured in a CUDA graph (None on CPU); raises where
    capture fails."""
    if device.type != 'cuda':
        return None
    times, failed = graph_rounds({'fn': fn}, device, {'fn': replays}, rounds)
    if failed:
        raise RuntimeError(f'CUDA graph capture failed: {failed["fn"]}')
    return statistics.median(times['fn'])


def try_graph_ms(fn: Callable[[], object], device: torch.device,
                 eager_ms: Optional[float] = None) -> Tuple[Optional[float], Optional[str]]:
    """(median ms per replay, None), or (None, why) where there is no graph time: on CPU, or
    where capture failed (the reason printed)."""
    if device.type != 'cuda':
        return None, 'no CUDA graphs on CPU'
    times, failed = graph_rounds({'fn': fn}, device, {'fn': replays_for(eager_ms)})
    if failed:
        return None, f'capture failed: {failed["fn"]}'
    return statistics.median(times['fn']), None


def section_ceilings() -> Dict[str, Optional[float]]:
    """Measured ceilings: device-to-device copy (bytes read + written) and a bf16 matmul."""
    if DEVICE.type != 'cuda':
        return {'copy TB/s': None, 'bf16 matmul TFLOP/s': None}
    src = torch.randn(2**29, device=DEVICE, dtype=torch.bfloat16)  # 1 GiB
    dst = torch.empty_like(src)
    t_copy = bench_ms(lambda: dst.copy_(src), DEVICE, 10)
    src = dst = None  # free before the matmul operands
    a = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    t_mm = bench_ms(lambda: a @ b, DEVICE, 10)
    a = b = None
    torch.cuda.empty_cache()
    return {'copy TB/s': 2 * 2**30 / (t_copy * 1e-3) / 1e12,
            'bf16 matmul TFLOP/s': 2 * 8192**3 / (t_mm * 1e-3) / 1e12}


def peak_mib(fn: Callable[[], object], device: torch.device) -> Optional[float]:
    """Peak allocation above the pre-call allocation (CUDA), None on CPU."""
    if device.type != 'cuda':
        fn()
        return None
    return cuda_peak_memory(fn, device)[0]


def print_section(title: str, rows: Sequence[Dict[str, object]],
                  cols: Optional[Sequence[str]] = None) -> None:
    """``title``, then ``rows`` as a table (floats with 3 significant digits).

    Args:
        title: The line above the table.
        rows: Result rows; list values (per-round times) are left out of the table.
        cols: Columns to print (an ``error`` / ``skipped`` column is added when a row has
            one); ``None``: every scalar column.
    """
    print(title)
    if not rows:
        return
    if cols is None:
        cols = [c for c in dict.fromkeys(k for r in rows for k in r)
                if not any(isinstance(r.get(c), (list, dict)) for r in rows)]
    else:
        cols = [c for c in cols if any(c in r for r in rows)]
        cols += [c for c in ('skipped', 'error') if c not in cols and any(c in r for r in rows)]

    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f'{v:.3g}' if abs(v) < 1e4 else f'{v:.0f}'
        return '-' if v is None else str(v)

    print_table(cols, [{c: fmt(r.get(c)) for c in cols} for r in rows], indent='  ',
                rule=False)


def _ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    return num / den if num and den else None


def _spread(values: Sequence[float]) -> Optional[List[float]]:
    """[min, median, max] of ``values`` (None when empty)."""
    return [min(values), statistics.median(values), max(values)] if values else None


# ---------------------------------------------------------------------------------- metadata
def peak_bandwidth(name: str) -> Optional[float]:
    """Peak HBM bandwidth (B/s) of the device called exactly ``name``, None if not in
    :data:`PEAK_BW` (a substring match would give an H100 PCIe the SXM part's 3.35 TB/s)."""
    return PEAK_BW.get(name.strip())


def l2_bytes() -> Optional[int]:
    """The device's L2 cache size in bytes (None on CPU or where torch does not say)."""
    if DEVICE.type != 'cuda':
        return None
    return getattr(torch.cuda.get_device_properties(DEVICE), 'L2_cache_size', None) or None


def mig_mode() -> str:
    """The MIG mode as ``nvidia-smi`` reports it (or why it could not be queried)."""
    if os.environ.get('CUDA_VISIBLE_DEVICES', '').startswith('MIG-'):
        return 'enabled (CUDA_VISIBLE_DEVICES names a MIG instance)'
    if shutil.which('nvidia-smi') is None:
        return 'unknown (no nvidia-smi)'
    try:
        proc = subprocess.run(['nvidia-smi', '--query-gpu=name,mig.mode.current',
                               '--format=csv,noheader'], capture_output=True, text=True,
                              timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f'unknown ({type(exc).__name__})'
    out = (proc.stdout or proc.stderr).strip().replace('\n', '; ')
    return out[:200] if proc.returncode == 0 else f'unknown (nvidia-smi: {out[:120]})'


def run_metadata(name: str, peak_bw: Optional[float], peak_source: str) -> Dict[str, object]:
    """What the numbers depend on besides the code: device, versions, precision settings."""
    import triton
    meta: Dict[str, object] = dict(
        device=name, torch=torch.__version__, triton=triton.__version__,
        cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(), dry_run=DRY,
        peak_bw=peak_bw, peak_bw_source=peak_source, python=sys.version.split()[0])
    with warnings.catch_warnings():  # the TF32 flags are deprecated in newer torch
        warnings.simplefilter('ignore')
        meta['matmul allow_tf32'] = torch.backends.cuda.matmul.allow_tf32
        meta['cudnn allow_tf32'] = torch.backends.cudnn.allow_tf32
        meta['float32_matmul_precision'] = torch.get_float32_matmul_precision()
        meta['sdp enabled'] = {b: getattr(torch.backends.cuda, f'{b}_sdp_enabled')()
                               for b in ('flash', 'mem_efficient', 'cudnn', 'math')
                               if hasattr(torch.backends.cuda, f'{b}_sdp_enabled')}
    if DEVICE.type == 'cuda':
        props = torch.cuda.get_device_properties(DEVICE)
        meta.update(sm_count=props.multi_processor_count,
                    capability=f'{props.major}.{props.minor}',
                    memory_GiB=round(props.total_memory / 2**30, 1),
                    l2_MiB=(l2_bytes() or 0) / 2**20 or None, mig=mig_mode())
    else:
        meta.update(sm_count=None, capability=None, memory_GiB=None, l2_MiB=None,
                    mig='n/a (CPU)')
    meta['env'] = {k: os.environ.get(k) for k in FORCED_BACKEND_ENV + ('TRITON_INTERPRET', )}
    return meta


# ---------------------------------------------------------------------------------- SDPA
def sdpa_context(backend: str) -> contextlib.AbstractContextManager:
    """``sdpa_kernel`` restricted to one fused backend (:data:`SDPA_BACKENDS`), or a no-op
    for ``'default'`` (torch's own dispatch)."""
    if backend == 'default':
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[backend]))


def sdpa_unavailable(fn: Callable[[], object], backend: str) -> Optional[str]:
    """None if one call of ``fn`` under ``backend`` runs, else torch's reason it cannot."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        try:
            with torch.no_grad(), sdpa_context(backend):
                fn()
        except RuntimeError as exc:
            if 'backend' not in str(exc) and 'kernel' not in str(exc):
                raise  # not a dispatch refusal: a real error
            # torch warns why each backend refused; the exception only says none was left
            why = '; '.join(dict.fromkeys(str(w.message).strip().splitlines()[0][:160]
                                          for w in caught if issubclass(w.category, UserWarning)))
            return f'unavailable: {why or str(exc).splitlines()[0]}'[:400]
    return None


#: Substrings that mark an attention kernel among the device kernels of a profile.
ATTENTION_KERNEL_MARKS = ('sdpa', 'flash', 'fmha', 'attention', 'attn', 'softmax')


def attention_kernels(fn: Callable[[], object]) -> Dict[str, Optional[str]]:
    """The SDPA aten op(s) and CUDA kernel(s) one call of ``fn`` runs (torch.profiler).

    Returns:
        ``{'aten op': ..., 'kernel': ...}``: the ``aten::_scaled_dot_product_*`` /
        ``aten::_*attention*`` ops below ``scaled_dot_product_attention`` (they name the
        backend: flash, cudnn, efficient, math, ..._for_cpu) and the device kernels whose names
        mark attention (:data:`ATTENTION_KERNEL_MARKS`), heaviest first; None where there is
        none (no device kernels on CPU).
    """
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU]
    if DEVICE.type == 'cuda':
        activities.append(ProfilerActivity.CUDA)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter('ignore')
        fn()
        synchronize_device()
        with profile(activities=activities) as prof:
            fn()
            synchronize_device()
    ops, kernels = [], []
    for e in prof.key_averages():
        key = e.key
        on_device = getattr(getattr(e, 'device_type', None), 'name', 'CPU') == 'CUDA'
        if on_device:
            if any(m in key.lower() for m in ATTENTION_KERNEL_MARKS):
                kernels.append((getattr(e, 'device_time_total', 0.0), key))
        elif key.startswith('aten::') and key != 'aten::scaled_dot_product_attention' and (
                'scaled_dot_product' in key or 'attention' in key):
            ops.append(key)
    kernels.sort(reverse=True)
    return {'aten op': ', '.join(sorted(set(ops))) or None,
            'kernel': ', '.join(dict.fromkeys(k[:90] for _, k in kernels)) or None}


# ---------------------------------------------------------------------------------- kernels
def _kernels():
    """The Triton modules, imported through the dispatchers' rules."""
    from mmlinvit.ops.linear_attention import select_backend
    from mmlinvit.ops.ssd import select_ssd_backend
    probe = torch.zeros(1, 1, 1, 16, device=DEVICE)
    if select_backend(probe, probe, probe, backend='triton') != 'triton':
        raise RuntimeError('the linear attention dispatcher did not choose the Triton kernel')
    leaves = make_ssd_inputs(1, 4, 2, 16, 1, 16, torch.float32, DEVICE)
    if select_ssd_backend(*leaves, backend='triton') != 'triton':
        raise RuntimeError('the SSD dispatcher did not choose the Triton kernel')
    from mmlinvit.ops.linear_attention import triton_kernel as la_kernel
    from mmlinvit.ops.ssd import triton_kernel as ssd_kernel
    return la_kernel, ssd_kernel


def section_check(sizes: Sizes, la_rows: List[Dict[str, object]],
                  ssd_rows: List[Dict[str, object]]) -> None:
    """Fills ``la_rows`` / ``ssd_rows`` with the check rows (a case that raises: ``ok`` =
    ``'ERROR'`` and its ``error``)."""
    la_kernel, kernel = _kernels()
    h, d = sizes.la_heads, sizes.la_head_dim

    def case(rows: List[Dict[str, object]], row: Dict[str, object],
             check: Callable[[], Dict[str, object]]) -> None:
        rows.append(row)

        def body() -> None:
            done = check()
            row.clear()
            row.update(done)

        if not run_case(f'check {row["kernel"]} {row["case"]} {row["dtype"]}', [row], body):
            row['ok'] = 'ERROR'

    la_cases = [('elu', n, n, h, d, d, dtype, 'elu') for dtype in DTYPES.values()
                for n in sizes.la_check_tokens] + list(sizes.extra_la_cases)
    for c in la_cases:
        case(la_rows, dict(kernel='linear-attn', case=c[0], dtype=str(c[6]).split('.')[-1]),
             lambda c=c: check_linear_attention(la_kernel, *c, DEVICE))
    s = sizes.ssd_shape
    ssd_cases = [('adventurer', 1, length, s['heads'], s['headdim'], s['groups'], s['d_state'],
                  s['chunk'], dtype) for dtype in DTYPES.values()
                 for length in sizes.ssd_check_lengths]
    small = min(sizes.ssd_check_lengths)
    ssd_cases.append(('ragged groups P48 N40' if not DRY else 'ragged groups', 2, small + 37, 4,
                      48 if not DRY else 12, 2, 40 if not DRY else 10, s['chunk'],
                      torch.bfloat16))
    for c in ssd_cases:
        case(ssd_rows, dict(kernel='ssd', case=c[0], dtype=str(c[-1]).split('.')[-1]),
             lambda c=c: check_ssd(kernel, *c, DEVICE))


# ---------------------------------------------------------------------------------- op timing
def section_linear_attention(sizes: Sizes, peak_bw: Optional[float],
                             rows: List[Dict[str, object]],
                             sdpa_rows: List[Dict[str, object]]) -> None:
    """Fills ``rows`` (one per N: the Triton kernel, the torch path, bandwidth) and
    ``sdpa_rows`` (per N: the default dispatch's kernel, then each of :data:`SDPA_BACKENDS`
    timed, or skipped with the reason)."""
    la_kernel, _ = _kernels()
    from mmlinvit.ops.linear_attention import linear_attention
    dtype = torch.bfloat16 if not DRY else torch.float32
    h, d = sizes.la_heads, sizes.la_head_dim
    l2 = l2_bytes()

    def inputs(n: int) -> Tuple[torch.Tensor, ...]:
        q, k, v = make_qkv(n, n, h, d, d, dtype, DEVICE)
        return q, k, v, torch.randn_like(q)

    def fwd_bwd(fn: Callable[..., torch.Tensor], q, k, v, grad) -> Callable[[], None]:
        def run():
            torch.autograd.grad(fn(q, k, v), (q, k, v), grad)
        return run

    def triton_case(row: Dict[str, object]) -> None:
        n = row['N']
        q, k, v, grad = inputs(n)
        nbytes = q.numel() * q.element_size()
        tri = lambda: la_kernel.linear_attention_triton(q, k, v, 'elu')  # noqa: E731
        tri_fb = fwd_bwd(lambda a, b, c: la_kernel.linear_attention_triton(a, b, c, 'elu'),
                         q, k, v, grad)
        with torch.no_grad():
            row['triton ms'] = bench_ms(tri, DEVICE, sizes.repeats)
            row['graph triton ms'], why = try_graph_ms(tri, DEVICE, row['triton ms'])
        row['triton f+b ms'] = bench_ms(tri_fb, DEVICE, sizes.repeats)
        row['graph triton f+b ms'], why_fb = try_graph_ms(tri_fb, DEVICE, row['triton f+b ms'])
        with torch.no_grad():
            row['torch ms'] = bench_ms(lambda: linear_attention(q, k, v, 'elu', backend='torch'),
                                       DEVICE, sizes.repeats)
        row['torch/triton'] = _ratio(row['torch ms'], row['triton ms'])
        # bandwidth of the kernels themselves: graph replays where capture worked
        t_bw = row['graph triton ms'] or row['triton ms']
        t_bw_fb = row['graph triton f+b ms'] or row['triton f+b ms']
        row['BW from'] = '/'.join('graph' if w is None else 'eager'
                                  for w in (why, why_fb))  # fwd/f+b
        if DEVICE.type == 'cuda' and (why or why_fb):
            row['BW note'] = f'eager times used: {why or why_fb}'
        row['fwd MiB'] = 4 * nbytes / 2**20
        row['in L2'] = 'yes' if (4 * nbytes <= l2 if l2 else n < L2_RULE_TOKENS) else 'no'
        bytes_per_s = 4 * nbytes / (t_bw * 1e-3)
        row['HBM fwd'] = bytes_per_s / peak_bw if peak_bw else None
        row['HBM f+b'] = 11 * nbytes / (t_bw_fb * 1e-3) / peak_bw if peak_bw else None
        row['fwd vs copy'] = bytes_per_s / (COPY_BW[0] * 1e12) if COPY_BW[0] else None
        row['target >=0.7'] = ('-' if row['in L2'] == 'yes' or n < L2_RULE_TOKENS
                               or row['HBM fwd'] is None
                               else 'met' if row['HBM fwd'] >= 0.7 else 'NOT met')

    def sdpa_case(row: Dict[str, object]) -> None:
        n, backend = row['N'], row['sdpa']
        q, k, v, grad = inputs(n)
        fwd = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
        if backend != 'default':
            reason = sdpa_unavailable(fwd, backend)
            if reason:
                row['skipped'] = reason
                return
        with sdpa_context(backend):
            row.update(attention_kernels(fwd))
        if backend == 'default':  # recorded, not timed: it is one of the forced backends
            return
        tri = next((r for r in rows if r['N'] == n), None) or {}
        with sdpa_context(backend):
            with torch.no_grad():
                row['ms'] = bench_ms(fwd, DEVICE, sizes.repeats)
                row['sdpa/triton'] = _ratio(row['ms'], tri.get('triton ms'))
                row['graph ms'], _ = try_graph_ms(fwd, DEVICE, row['ms'])
                row['graph sdpa/triton'] = _ratio(row['graph ms'], tri.get('graph triton ms'))
            fb = fwd_bwd(F.scaled_dot_product_attention, q, k, v, grad)
            row['f+b ms'] = bench_ms(fb, DEVICE, sizes.repeats)
            row['f+b sdpa/triton'] = _ratio(row['f+b ms'], tri.get('triton f+b ms'))

    for n in sizes.la_bench_tokens:
        row: Dict[str, object] = {'N': n}
        rows.append(row)
        run_case(f'la triton N={n}', [row], lambda row=row: triton_case(row))
        for backend in ('default', ) + tuple(SDPA_BACKENDS):
            srow: Dict[str, object] = {'N': n, 'sdpa': backend}
            sdpa_rows.append(srow)
            run_case(f'la sdpa-{backend} N={n}', [srow], lambda srow=srow: sdpa_case(srow))


@contextlib.contextmanager
def ssd_torch_vectorised() -> Iterator[None]:
    """Within the block the PyTorch SSD scan runs its vectorised chunked form without
    autograd too (``torch_impl.INFERENCE_FORM = False``, read at call time; restored after):
    all chunks of ``chunk_size`` tokens in one batched step, the form a GPU should be compared
    with (the inference form loops over chunks of 64 in Python, tuned for CPU caches)."""
    torch_impl = importlib.import_module('mmlinvit.ops.ssd.torch_impl')
    before = torch_impl.INFERENCE_FORM
    torch_impl.INFERENCE_FORM = False
    try:
        yield
    finally:
        torch_impl.INFERENCE_FORM = before


#: What section 3 times as the PyTorch scan (also in the JSON).
SSD_TORCH_FORM = ('ssd_scan_torch, vectorised chunked form (INFERENCE_FORM=False: all chunks '
                  'of chunk_size tokens in one step; autograd form for f+b)')


def section_ssd(sizes: Sizes, rows: List[Dict[str, object]]) -> None:
    """Fills ``rows``: per L, the Triton scan vs the vectorised PyTorch scan."""
    _, kernel = _kernels()
    from mmlinvit.ops.ssd import ssd_scan_torch
    s = sizes.ssd_shape
    dtype = torch.bfloat16 if not DRY else torch.float32

    def case(row: Dict[str, object]) -> None:
        length = row['L']
        leaves = make_ssd_inputs(1, length, s['heads'], s['headdim'], s['groups'], s['d_state'],
                                 dtype, DEVICE)
        grad = torch.randn(1, length, s['heads'], s['headdim'], device=DEVICE).to(dtype)

        def fb(fn):
            def run():
                torch.autograd.grad(fn(*leaves, chunk_size=s['chunk']), leaves, grad)
            return run

        tri = lambda: kernel.ssd_scan_triton(*leaves, chunk_size=s['chunk'])  # noqa: E731
        ref = lambda: ssd_scan_torch(*leaves, chunk_size=s['chunk'])  # noqa: E731
        with torch.no_grad():
            row['triton ms'] = bench_ms(tri, DEVICE, sizes.repeats)
            row['graph triton ms'], _ = try_graph_ms(tri, DEVICE, row['triton ms'])
            with ssd_torch_vectorised():  # eager only: it reads A / dt on the host
                row['torch ms'] = bench_ms(ref, DEVICE, sizes.repeats)
        row['torch/triton'] = _ratio(row['torch ms'], row['triton ms'])
        row['triton f+b ms'] = bench_ms(fb(kernel.ssd_scan_triton), DEVICE, sizes.repeats)
        row['torch f+b ms'] = bench_ms(fb(ssd_scan_torch), DEVICE, sizes.repeats)
        row['f+b torch/triton'] = _ratio(row['torch f+b ms'], row['triton f+b ms'])

    for length in sizes.ssd_bench_lengths:
        row: Dict[str, object] = {'L': length}
        rows.append(row)
        run_case(f'ssd L={length}', [row], lambda row=row: case(row))


# ---------------------------------------------------------------------------------- backbones
def block_tokens(model: torch.nn.Module, fn: Callable[[], object]) -> int:
    """Tokens entering the first block during one call of ``fn``."""
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
    reuses, SDPA backend); the first member is the pair's softmax baseline."""
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


def backbone_ratios(rows: List[Dict[str, object]]) -> None:
    """Adds to every non-baseline row its ratios against the softmax model of its pair and
    size (default SDPA dispatch, ``role`` = ``'softmax'``) and, for linear rows where one was
    timed, against the softmax model under FlashAttention (``' flash'`` columns): speed
    (median eager and CUDA-graph times) with its spread over the interleaved rounds
    ([min, median, max] of the per-round ratios), and activation memory.  A missing or failed
    baseline leaves the ratios None."""
    for r in rows:
        if r.get('role') == 'softmax':
            continue
        for role, suffix in (('softmax', ''), ('softmax-flash', ' flash')):
            if suffix and r.get('role') != 'linear':
                continue
            base = next((b for b in rows if b.get('pair') == r.get('pair')
                         and b.get('size') == r.get('size') and b.get('role') == role), None)
            if base is None:
                continue
            r['speed x' + suffix] = _ratio(base.get('ms'), r.get('ms'))
            r['graph speed x' + suffix] = _ratio(base.get('graph ms'), r.get('graph ms'))
            for key in ('eager', 'graph'):
                mine, theirs = r.get(f'{key} rounds ms'), base.get(f'{key} rounds ms')
                if mine and theirs and len(mine) == len(theirs):
                    r[f'{key} speed x{suffix} spread'] = _spread(
                        [b / m for b, m in zip(theirs, mine)])
            if not suffix:
                r['mem frac'] = _ratio(r.get('act MiB'), base.get('act MiB'))


def section_backbones(sizes: Sizes, rows: List[Dict[str, object]]) -> None:
    """Fills ``rows``: per pair and size, each model's tokens, activation memory, attention
    kernel (softmax models) and time (the pair's models interleaved), then the ratios."""
    dtype = torch.bfloat16 if not DRY else torch.float32
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
                    model = build().to(device=DEVICE, dtype=dtype).eval()
                    models[label] = model
                if images is None:
                    images = torch.randn(1, 3, hw[0], hw[1], device=DEVICE, dtype=dtype)

                def fn(model=model, backend=backend) -> object:
                    with sdpa_context(backend or 'default'):
                        return model(images)

                with torch.no_grad():
                    row['N'] = block_tokens(model, fn)
                    row['act MiB'] = peak_mib(fn, DEVICE)
                    if backend is not None:
                        row.update(attention_kernels(fn))
                    else:
                        row['kernels'] = 'triton (forced: ' + ', '.join(
                            f'{k}={os.environ.get(k)}' for k in FORCED_BACKEND_ENV) + ')'
                fns[label] = _no_grad(fn)

            run_case(f'backbone {label} {size} (build)', [row], prepare)

        def timing() -> None:
            eager = eager_rounds(fns, DEVICE, sizes.repeats)
            for label, times in eager.items():
                pair_rows[label]['ms'] = statistics.median(times)
                pair_rows[label]['eager rounds ms'] = times
            if DEVICE.type != 'cuda':
                return
            replays = {label: replays_for(pair_rows[label]['ms']) for label in fns}
            graph, failed = graph_rounds(fns, DEVICE, replays)
            for label in fns:
                row = pair_rows[label]
                row['graph ms'] = statistics.median(graph[label]) if label in graph else None
                row['graph rounds ms'] = graph.get(label)
                if label in failed:
                    row['graph note'] = f'capture failed: {failed[label]}'

        if fns:
            run_case(f'backbone {pair} {size} (timing)', [pair_rows[k] for k in fns], timing)
        models.clear()
        fns.clear()
        images = None
        free_device_memory()
    backbone_ratios(rows)


# ---------------------------------------------------------------------------------- sweeps
@contextlib.contextmanager
def launch_config(module: ModuleType, **overrides: object) -> Iterator[None]:
    """Within the block, ``module``'s kernels launch with ``overrides`` set on the default
    ``_LaunchConfig`` (tile sizes, warps, stages): one variant of a launch-parameter sweep."""
    base = module._LaunchConfig

    class Variant(base):  # type: ignore[misc, valid-type]

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            for key, value in overrides.items():
                if not hasattr(self, key):
                    raise AttributeError(f'{module.__name__}._LaunchConfig has no {key!r}')
                setattr(self, key, value)

    module._LaunchConfig = Variant
    try:
        yield
    finally:
        module._LaunchConfig = base


def _sweep(module: ModuleType, variants: List[Dict[str, object]],
           cases: List[Tuple[str, Callable[[], object], Callable[[object], List[torch.Tensor]]]],
           deadline: float, exact: Optional[Dict[str, List[torch.Tensor]]] = None,
           exact_names: Optional[Dict[str, Tuple[str, ...]]] = None) -> List[Dict[str, object]]:
    """Times each launch variant on each case (graph replays on CUDA) and checks its outputs
    against the default configuration's (relative error; a variant that errs is reported).

    ``exact`` (case -> fp32 reference outputs) adds each variant's error against it, one column
    per output named in ``exact_names`` (else the largest)."""
    reference = {name: [t.float() for t in outputs(run())] for name, run, outputs in cases}
    rows = []
    for overrides in variants:
        if time.perf_counter() > deadline:
            rows.append({'variant': 'deadline reached: rest skipped'})
            break
        row: Dict[str, object] = {'variant': ' '.join(f'{k}={v}' for k, v in overrides.items())}
        try:
            with launch_config(module, **overrides):
                err = 0.0
                for name, run, outputs in cases:
                    got = outputs(run())
                    err = max([err] + [rel_err(g, w) for g, w in zip(got, reference[name])])
                    if exact and name in exact:
                        errs = [rel_err(g, w) for g, w in zip(got, exact[name])]
                        names = (exact_names or {}).get(name)
                        if names:
                            row.update({f'{n} err': e for n, e in zip(names, errs)})
                        else:
                            row[name + ' err vs fp32'] = max(errs)
                    row[name + ' ms'] = (graph_ms(run, DEVICE) if DEVICE.type == 'cuda'
                                         else bench_ms(run, DEVICE, 1))
                row['max rel err vs default'] = err
        except Exception as exc:  # a variant the compiler or the device refuses
            row['error'] = f'{type(exc).__name__}: {str(exc)[:120]}'
        rows.append(row)
    return rows


def section_sweeps(sizes: Sizes, deadline: float,
                   kernels: Tuple[str, ...] = ('la', 'ssd')) -> Dict[str, List[Dict[str, object]]]:
    """Launch-parameter sweeps of the linear attention and (``'ssd'`` in ``kernels``) the SSD
    kernels, forward and f+b."""
    la_kernel, ssd_kernel = _kernels()
    dtype = torch.bfloat16 if not DRY else torch.float32
    out: Dict[str, List[Dict[str, object]]] = {}
    n_small, n_big = sizes.sweep_tokens
    cases = []
    for n in (n_small, n_big):
        q, k, v = make_qkv(n, n, sizes.la_heads, sizes.la_head_dim, sizes.la_head_dim, dtype,
                           DEVICE)
        cases.append((f'fwd N={n}', _no_grad(
            lambda q=q, k=k, v=v: la_kernel.linear_attention_triton(q, k, v, 'elu')),
            lambda o: [o]))
    q, k, v = make_qkv(n_small, n_small, sizes.la_heads, sizes.la_head_dim, sizes.la_head_dim,
                       dtype, DEVICE)
    grad = torch.randn_like(q)
    cases.append((f'f+b N={n_small}', lambda: torch.autograd.grad(
        la_kernel.linear_attention_triton(q, k, v, 'elu'), (q, k, v), grad), list))
    lim = sizes.sweep_limit
    variants = [dict(block_state=bs, block_out=bo, num_warps=w, num_stages=st)
                for bs in (64, 128) for bo in (64, 128) for w in (4, 8) for st in (2, 3)][:lim]
    variants += [dict(block_bwd_q=bq, block_bwd_kv=bkv, num_warps_bwd=w)
                 for bq in (32, 64) for bkv in (32, 64, 128) for w in (4, 8)][:lim]
    variants += [dict(target_programs=tp) for tp in sizes.sweep_programs]
    variants += [dict(target_programs_out=tp, num_stages=st)
                 for tp in sizes.sweep_programs_out for st in (2, 3)][:lim]
    out['linear_attention'] = _sweep(la_kernel, variants, cases, deadline)
    if 'ssd' not in kernels:
        return out

    s = sizes.ssd_shape
    length = sizes.sweep_ssd_length
    leaves = make_ssd_inputs(1, length, s['heads'], s['headdim'], s['groups'], s['d_state'],
                             dtype, DEVICE)
    grad_y = torch.randn(1, length, s['heads'], s['headdim'], device=DEVICE).to(dtype)
    ssd_cases = [
        (f'fwd L={length}', _no_grad(
            lambda: ssd_kernel.ssd_scan_triton(*leaves, chunk_size=s['chunk'])), lambda o: [o]),
        (f'f+b L={length}', lambda: torch.autograd.grad(
            ssd_kernel.ssd_scan_triton(*leaves, chunk_size=s['chunk']), leaves, grad_y), list)]
    from mmlinvit.ops.ssd import ssd_scan_torch
    ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
    ref_out = ssd_scan_torch(*ref_leaves, chunk_size=s['chunk'])
    exact = {f'fwd L={length}': [ref_out.detach()],
             f'f+b L={length}': list(torch.autograd.grad(ref_out, ref_leaves, grad_y.float()))}
    variants = [dict(num_warps=w, num_stages=st, block_t=bt, block_p=bp)
                for w in (4, 8) for st in (2, 3) for bt in (32, 64) for bp in (32, 64)][:lim]
    variants += [dict(num_warps_bwd=w, block_t=bt, split_grad_dots=sp)
                 for sp in (True, False) for w in (4, 8) for bt in (32, 64)][:lim]
    out['ssd'] = _sweep(ssd_kernel, variants, ssd_cases, deadline, exact=exact,
                        exact_names={f'f+b L={length}': ('dx', 'ddt', 'dA', 'dB', 'dC', 'dD')})
    return out


def _no_grad(fn: Callable[[], object]) -> Callable[[], object]:
    def run():
        with torch.no_grad():
            return fn()
    return run


def section_profile(sizes: Sizes, out: Dict[str, List[Dict[str, object]]],
                    top: int = 12) -> None:
    """Fills ``out`` (model -> rows): device time per kernel (torch.profiler) of one forward of
    the ViT-L/14 pair at the target size and of Adventurer-B at the larger pair size."""
    from torch.profiler import ProfilerActivity, profile

    from mmlinvit.backbones import Adventurer, VisionTransformer
    dtype = torch.bfloat16 if not DRY else torch.float32
    hw_l = sizes.vit_l_target
    models = {f'ViT-L/14 {op} {hw_l[0]}': (lambda op=op: VisionTransformer(
        sizes.vit_l, family='dinov2', patch_size=14, img_size=518, attn_cfg=op,
        out_type='featmap'), hw_l) for op in ('softmax', 'elu')}
    hw_a = sizes.pair_sizes[-1]
    models[f'Adventurer-B {hw_a[0]}x{hw_a[1]}'] = (lambda: Adventurer(
        sizes.adventurer_b, mixer_cfg=sizes.adventurer_mixer, with_mask_token=False,
        out_type='featmap'), hw_a)
    activities = [ProfilerActivity.CUDA] if DEVICE.type == 'cuda' else [ProfilerActivity.CPU]
    key = 'device_time_total' if DEVICE.type == 'cuda' else 'cpu_time_total'

    def case(label: str, build: Callable[[], torch.nn.Module], hw: Tuple[int, int]) -> None:
        torch.manual_seed(0)
        model = build().to(device=DEVICE, dtype=dtype).eval()
        images = torch.randn(1, 3, hw[0], hw[1], device=DEVICE, dtype=dtype)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter('ignore')
            model(images)
            synchronize_device()
            with profile(activities=activities) as prof:
                model(images)
                synchronize_device()
        events = [e for e in prof.key_averages() if getattr(e, key, 0) > 0]
        if DEVICE.type == 'cuda':
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
        if not run_case(f'profile {label}', [error_row],
                        lambda label=label, build=build, hw=hw: case(label, build, hw)):
            out[label].append(error_row)


def synchronize_device() -> None:
    if DEVICE.type == 'cuda':
        torch.cuda.synchronize(DEVICE)


def _fmt_spread(spread: Optional[List[float]], rounds: Optional[list]) -> str:
    if not spread:
        return ''
    return (f' (min {spread[0]:.2f} / median {spread[1]:.2f} / max {spread[2]:.2f} over '
            f'{len(rounds or [])} interleaved rounds)')


def verdicts(la_rows: List[Dict[str, object]], bb_rows: List[Dict[str, object]],
             target_size: Tuple[int, int] = (1024, 1024)) -> List[str]:
    """The target lines: kernel bandwidth; ViT-L/14 speed (against the default SDPA dispatch
    and FlashAttention, CUDA graph replay and eager, with the spread over rounds) and memory,
    each judged on its own."""
    lines = []
    big = [r for r in la_rows if r.get('N', 0) >= L2_RULE_TOKENS and r.get('in L2') == 'no'
           and r.get('HBM fwd') is not None]
    if big:
        worst = min(big, key=lambda r: r['HBM fwd'])
        source = 'CUDA graph replay' if worst['BW from'].startswith('graph') else \
            'EAGER times (graph capture failed)'
        lines.append(f"kernel HBM bandwidth (forward, N >= 16k, working set > L2; {source}): "
                     f"min {worst['HBM fwd']:.0%} of peak at N={worst['N']} (target 70%): "
                     f"{'met' if worst['HBM fwd'] >= 0.7 else 'NOT met'}")
    elif any(r.get('N', 0) >= L2_RULE_TOKENS for r in la_rows):
        lines.append('kernel HBM bandwidth at N >= 16k: not measured (see the errors / '
                     '--peak-bw)')
    size = f'{target_size[0]}x{target_size[1]}'
    elu = next((r for r in bb_rows if r.get('model') == 'ViT-L/14 elu'
                and r.get('size') == size), None)
    if elu is None:
        return lines
    if 'error' in elu or elu.get('ms') is None:
        lines.append(f"ViT-L/14 at {size}: not measured ({elu.get('error', 'no time')})")
        return lines
    bases = {b['role']: b for b in bb_rows if b.get('pair') == 'ViT-L/14'
             and b.get('size') == size and b.get('role', '').startswith('softmax')}
    for role, suffix, name in (('softmax-flash', ' flash', 'FlashAttention '
                                '(SDPBackend.FLASH_ATTENTION)'),
                               ('softmax', '', 'the default SDPA dispatch')):
        base = bases.get(role)
        if base is None or base.get('ms') is None:
            why = 'not run' if base is None else base.get('skipped') or base.get('error')
            lines.append(f'ViT-L/14 at {size}, speed vs the softmax model with {name}: not '
                         f'measured ({why})')
            continue
        kernel = base.get('kernel') or base.get('aten op') or '?'
        parts = []
        for key, mode in (('graph', 'CUDA graph replay'), ('eager', 'eager')):
            ratio = elu.get(('graph speed x' if key == 'graph' else 'speed x') + suffix)
            if ratio is None:
                parts.append(f'{mode}: -')
                continue
            spread = _fmt_spread(elu.get(f'{key} speed x{suffix} spread'),
                                 elu.get(f'{key} rounds ms'))
            parts.append(f"{mode}: {ratio:.2f}x{spread} -> {'met' if ratio >= 1.7 else 'NOT met'}")
        lines.append(f'ViT-L/14 at {size}, SPEED vs the softmax model with {name} '
                     f'[{kernel[:70]}] (target >= 1.7x): ' + '; '.join(parts))
    mem, mib = elu.get('mem frac'), elu.get('act MiB')
    if mem is None:
        lines.append(f'ViT-L/14 at {size}, MEMORY (target <= 40% of the softmax model): not '
                     'measured (peak memory is measured on CUDA only)')
    else:
        lines.append(f"ViT-L/14 at {size}, MEMORY: activations {mib:.0f} MiB = {mem:.0%} of the "
                     f"softmax model's (default SDPA) (target <= 40%): "
                     f"{'met' if mem <= 0.4 else 'NOT met'}")
    return lines


def _numbers(rows: List[Dict[str, object]], x: str, y: str) -> Tuple[list, list]:
    pts = [(r[x], r[y]) for r in rows if isinstance(r.get(y), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot(result: Dict[str, object], path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    la = result.get('linear_attention') or []
    sdpa = [r for r in result.get('linear_attention_sdpa') or [] if r.get('sdpa') != 'default']
    if la:
        for key, style in (('triton ms', 'o-'), ('torch ms', 's-'), ('triton f+b ms', 'o:')):
            axes[0].plot(*_numbers(la, 'N', key), style, label=key)
        for backend in SDPA_BACKENDS:
            mine = [r for r in sdpa if r['sdpa'] == backend]
            axes[0].plot(*_numbers(mine, 'N', 'ms'), 'x--', label=f'sdpa-{backend} ms')
            axes[0].plot(*_numbers(mine, 'N', 'f+b ms'), 'x:', label=f'sdpa-{backend} f+b ms')
        axes[0].set(xscale='log', yscale='log', xlabel='tokens N', ylabel='ms',
                    title='linear attention op (B=1)')
        axes[0].legend(fontsize=7)
        axes[1].plot(*_numbers(la, 'N', 'HBM fwd'), 'o-', label='fwd')
        axes[1].plot(*_numbers(la, 'N', 'HBM f+b'), 's-', label='fwd+bwd')
        axes[1].axhline(0.7, color='gray', linestyle='--', label='target 70%')
        axes[1].axvline(L2_RULE_TOKENS, color='gray', linestyle=':', label='left: in L2')
        axes[1].set(xscale='log', xlabel='tokens N', ylabel='fraction of peak HBM BW',
                    title='Triton kernel bandwidth')
        axes[1].legend(fontsize=7)
    bb = [r for r in result.get('backbones') or [] if isinstance(r.get('ms'), (int, float))]
    if bb:
        labels = [f"{r['model']}\n{r['size']}" for r in bb]
        axes[2].bar(range(len(bb)), [r['ms'] for r in bb],
                    color=['C0' if 'softmax' in r['model'] else 'C1' for r in bb])
        axes[2].set_xticks(range(len(bb)), labels, fontsize=6, rotation=60)
        axes[2].set(ylabel='ms (batch 1, eager)', yscale='log', title='backbones')
    fig.suptitle(f"{result['device']} ({'dry run: timings meaningless' if DRY else 'bf16'})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


DEVICE = torch.device('cpu')
DRY = False
#: Measured copy bandwidth in TB/s (set by the ceilings section; None before / on CPU).
COPY_BW: List[Optional[float]] = [None]

#: Columns of the printed tables (the JSON has every field).
LA_COLS = ('N', 'triton ms', 'graph triton ms', 'triton f+b ms', 'graph triton f+b ms',
           'torch ms', 'torch/triton', 'fwd MiB', 'in L2', 'BW from', 'HBM fwd', 'HBM f+b',
           'fwd vs copy', 'target >=0.7')
SDPA_COLS = ('N', 'sdpa', 'ms', 'sdpa/triton', 'graph ms', 'graph sdpa/triton', 'f+b ms',
             'f+b sdpa/triton', 'aten op', 'kernel')
BB_COLS = ('pair', 'model', 'size', 'N', 'ms', 'graph ms', 'act MiB', 'speed x',
           'graph speed x', 'speed x flash', 'graph speed x flash', 'mem frac', 'graph note')
BB_KERNEL_COLS = ('model', 'size', 'aten op', 'kernel', 'kernels')


def _interpreter_requested() -> bool:
    return os.environ.get('TRITON_INTERPRET', '').strip() not in ('', '0')


def main(argv: Optional[List[str]] = None) -> int:
    global DEVICE, DRY
    for stream in (sys.stdout, sys.stderr):  # a killed run keeps every printed line
        if hasattr(stream, 'reconfigure'):
            stream.reconfigure(line_buffering=True)
    args = parse_args(argv)
    DRY = args.dry_run
    if DRY:
        if os.environ.get('TRITON_INTERPRET') != '1':
            raise SystemExit('--dry-run needs TRITON_INTERPRET=1 set before triton is imported '
                             '(run the script directly, or export TRITON_INTERPRET=1)')
        DEVICE = torch.device('cpu')
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
        DEVICE = torch.device('cuda')
        sizes = full_sizes()
    for var in FORCED_BACKEND_ENV:  # linear models must run the kernels, or fail loudly
        if os.environ.get(var, 'triton') != 'triton':
            print(f'note: {var}={os.environ[var]} overridden with triton')
        os.environ[var] = 'triton'
    from mmlinvit.ops.triton_utils import triton_available
    if not triton_available():
        raise SystemExit('the suite needs triton')
    name = torch.cuda.get_device_name(DEVICE) if DEVICE.type == 'cuda' else 'CPU (interpreter)'
    if args.peak_bw:
        peak_bw, peak_source = args.peak_bw, '--peak-bw'
    elif DRY:
        peak_bw, peak_source = DRY_RUN_PEAK_BW, 'nominal (dry run)'
    else:
        peak_bw = peak_bandwidth(name)
        peak_source = 'PEAK_BW table (exact device name)' if peak_bw else \
            'unknown device: pass --peak-bw (fractions of peak left out)'
    os.makedirs(args.out_dir, exist_ok=True)
    result = OUTPUT.result = {'errors': {}}
    result.update(run_metadata(name, peak_bw, peak_source))
    result['args'] = vars(args)
    OUTPUT.path = json_path = os.path.join(args.out_dir, 'suite.json')
    print(f'device: {name}  torch {result["torch"]}  triton {result["triton"]}  '
          f'cuDNN {result["cudnn"]}  SMs {result["sm_count"]}  MIG {result["mig"]}  '
          f'matmul allow_tf32 {result["matmul allow_tf32"]}  peak BW '
          f'{"-" if peak_bw is None else f"{peak_bw / 1e12:.2f} TB/s"} ({peak_source})'
          f'{"  (DRY RUN: timings meaningless)" if DRY else ""}')
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
            free_device_memory()
            return None
        finally:
            result['seconds'] = time.perf_counter() - t_start
            OUTPUT.save()  # after every section: a killed run keeps its part

    def elapsed() -> str:
        return f'[{time.perf_counter() - t_start:.0f} s]'

    def ceilings() -> None:
        result['ceilings'] = section_ceilings()
        COPY_BW[0] = result['ceilings']['copy TB/s']
        print_section(f'0. measured ceilings {elapsed()}:', [result['ceilings']])

    def check() -> bool:
        la_rows = result['check_linear_attention'] = []
        ssd_rows = result['check_ssd'] = []
        try:
            section_check(sizes, la_rows, ssd_rows)
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
            section_linear_attention(sizes, peak_bw, rows, sdpa_rows)
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
            section_ssd(sizes, rows)
        finally:
            print_section(f'3. SSD scan {sizes.ssd_shape} (median ms; torch = {SSD_TORCH_FORM}) '
                          f'{elapsed()}:', rows)

    def backbones() -> None:
        rows = result['backbones'] = []
        try:
            section_backbones(sizes, rows)
        finally:
            print_section('4. backbones, batch 1 inference (N = tokens into the blocks; act MiB = '
                          'peak above weights; speed x / mem frac vs the softmax model with the '
                          'default SDPA dispatch, "flash" vs it under FLASH_ATTENTION; models of '
                          f'a pair timed interleaved) {elapsed()}:', rows, BB_COLS)
            print_section('   attention kernels that ran (softmax: profiled SDPA op / kernel):',
                          rows, BB_KERNEL_COLS)

    def profile_models() -> None:
        result['profile'] = {}
        section_profile(sizes, result['profile'])
        for name, rows in result['profile'].items():
            print_section(f'4b. device time per kernel, one forward of {name} {elapsed()}:', rows)

    def sweeps() -> None:
        result['sweeps'] = section_sweeps(sizes, time.perf_counter() + args.sweep_budget_s,
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
    OUTPUT.save()
    try:
        plot(result, os.path.join(args.out_dir, 'suite.png'))
    except Exception:  # the figure is a convenience: the JSON has every number
        result['errors']['plot'] = traceback.format_exc()[-4000:]
        print(f'plot FAILED:\n{result["errors"]["plot"]}')
        OUTPUT.save()
    failed = sorted(result['errors'])
    print(f'total {result["seconds"]:.0f} s; correctness {"PASSED" if ok else "FAILED"}; '
          f'sections / cases failed: {failed or "none"}; wrote {json_path} and suite.png')
    return 0 if ok and not failed else 1


if __name__ == '__main__':
    sys.exit(main())
