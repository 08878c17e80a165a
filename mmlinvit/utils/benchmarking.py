"""Timing, size parsing and error helpers shared by the benchmark / analysis tools (torch only).

``tools/analysis/*`` and ``tools/deployment/*`` import these instead of each carrying a copy:

* :func:`parse_size` / :func:`size_label`: ``--sizes 512 512x1024`` arguments and their labels;
* :func:`timed_calls` / :func:`time_round_robin`: wall times in ms, measured with CUDA events
  on a GPU (after the call's kernels finish) and ``time.perf_counter`` on a CPU;
* :func:`rel_err`: relative Frobenius error of a result against a reference;
* :func:`proc_status_mib`: a memory line of ``/proc/self/status`` (CPU peak-memory probes);
* :class:`CpuPeakMemory` / :func:`cuda_peak_memory`: peak memory of one call above the memory
  before it (CPU: peak RSS, Linux; CUDA: ``max_memory_allocated``);
* :func:`print_table`: result rows as right-aligned text columns;
* :func:`write_json`: the ``--json`` output of a tool's result rows.
"""
import argparse
import ctypes
import ctypes.util
import json
import math
import os
import statistics
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

#: Reductions of the per-call times that :func:`time_round_robin` accepts.
STATS = {'median': statistics.median, 'min': min}


def parse_size(text: str) -> Tuple[int, int]:
    """An ``argparse`` type: ``'512'`` -> (512, 512); ``'512x1024'`` -> (512, 1024) (H x W).

    Raises:
        argparse.ArgumentTypeError: naming the text and the accepted forms.
    """
    parts = text.lower().split('x')
    if len(parts) not in (1, 2) or not all(p.isdecimal() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f'size {text!r} is not N or HxW (e.g. 512x1024) of positive integers')
    return int(parts[0]), int(parts[-1])


def size_label(hw: Tuple[int, int]) -> str:
    """``(512, 512)`` -> ``'512'``; ``(512, 1024)`` -> ``'512x1024'`` (inverse of parse_size)."""
    return f'{hw[0]}' if hw[0] == hw[1] else f'{hw[0]}x{hw[1]}'


def synchronize(device: torch.device) -> None:
    """Waits for the device's queued kernels (a no-op on CPU)."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def _check_repeats(repeats: int) -> None:
    """Refuses a call count that would leave no time to reduce (``repeats < 1``)."""
    if repeats < 1:
        raise ValueError(f'repeats must be >= 1, got {repeats}')


def time_call_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Wall time of one call of ``fn`` in ms (CUDA events on a GPU, perf_counter on a CPU)."""
    if device.type == 'cuda':
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def timed_calls(fn: Callable[[], object], device: torch.device, repeats: int,
                max_seconds: float = math.inf) -> List[float]:
    """Times in ms of up to ``repeats`` calls (no warm-up), stopping once ``max_seconds`` pass.

    Args:
        fn: The call to time.
        device: Where ``fn`` runs (selects CUDA events or perf_counter).
        repeats: Most calls.
        max_seconds: Time budget; at least one call is made.

    Raises:
        ValueError: ``repeats < 1``.
    """
    _check_repeats(repeats)
    times: List[float] = []
    budget_start = time.perf_counter()
    for _ in range(repeats):
        times.append(time_call_ms(fn, device))
        if time.perf_counter() - budget_start > max_seconds:
            break
    return times


def time_round_robin(fns: Dict[str, Callable[[], object]], device: torch.device, repeats: int,
                     warmups: int = 1, max_seconds: float = math.inf,
                     stat: str = 'median') -> Dict[str, float]:
    """Median (or min) time in ms of each function, calls interleaved round-robin.

    Interleaving exposes all candidates to the same background load (shared CPU boxes).

    Args:
        fns: Name -> call.
        device: Where the calls run (selects CUDA events or perf_counter).
        repeats: Most rounds (one call of every function each).
        warmups: Untimed calls of each function first.
        max_seconds: Time budget of the timed rounds; at least one round is made.
        stat: ``'median'`` or ``'min'`` of each function's times.

    Raises:
        ValueError: An unknown ``stat``, or ``repeats < 1``.
    """
    if stat not in STATS:
        raise ValueError(f'stat must be one of {sorted(STATS)}, got {stat!r}')
    _check_repeats(repeats)
    for fn in fns.values():
        for _ in range(warmups):
            fn()
    synchronize(device)
    times: Dict[str, List[float]] = {name: [] for name in fns}
    budget_start = time.perf_counter()
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(time_call_ms(fn, device))
        if time.perf_counter() - budget_start > max_seconds:
            break
    return {name: STATS[stat](values) for name, values in times.items()}


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """``||got - want|| / ||want||`` (Frobenius norms, in fp32)."""
    got, want = got.detach().float(), want.detach().float()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def proc_status_mib(key: str) -> float:
    """A memory line of ``/proc/self/status`` (``'VmRSS'``, ``'VmHWM'``...) in MiB.

    Raises:
        RuntimeError: The line is missing (not Linux).
    """
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f'{key} not found in /proc/self/status (this needs Linux)')


#: Environment of a CPU subprocess that measures memory (and nothing else): glibc serves every
#: allocation of 1 MiB or more with its own mapping and unmaps it when freed.  By default the
#: threshold moves up to 32 MiB after the first large frees, and freed tensors then stay
#: resident in the heap, so peak RSS measured the allocator's history (one model read 238-286
#: MiB in repeated runs) rather than the memory the call needs; with the fixed threshold it
#: tracks live tensors (repeated runs within ~2 MiB).  Fresh mappings cost page faults on
#: every large allocation, so time in another process with the default allocator.
EXACT_RSS_ENV = {'MALLOC_MMAP_THRESHOLD_': str(1 << 20)}


def exact_rss() -> bool:
    """Whether this process runs with :data:`EXACT_RSS_ENV`."""
    return all(os.environ.get(k) == v for k, v in EXACT_RSS_ENV.items())


def run_json_child(cmd: List[str], threads: int, root: str, exact_memory: bool = False,
                   timeout: Optional[float] = None) -> Dict[str, Any]:
    """Runs a benchmark case in a fresh interpreter and parses the JSON of its last stdout line.

    Args:
        cmd: The command (``sys.executable``, the tool and its case arguments).
        threads: ``OMP_NUM_THREADS`` of the child.
        root: Put first on the child's ``PYTHONPATH`` (the repository).
        exact_memory: Start the child with :data:`EXACT_RSS_ENV` (memory-only children).
        timeout: Seconds before the child is killed (``subprocess.TimeoutExpired``).

    Raises:
        RuntimeError: The child failed, or printed nothing; the message ends with its last
            stderr line.
    """
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **(EXACT_RSS_ENV if exact_memory else {}))
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [root, env.get('PYTHONPATH')]))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ['(no stderr)']
        raise RuntimeError(f'exit {proc.returncode}: {tail[0]}')
    lines = proc.stdout.strip().splitlines()
    if not lines:
        tail = proc.stderr.strip().splitlines()[-1:] or ['(no stderr)']
        raise RuntimeError(f'exit 0 without the JSON line a benchmark case prints last (stdout '
                           f'empty): {tail[0]}')
    return json.loads(lines[-1])


def merge_results(parts: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """One result from the results of a case's phases (nested dicts merged key by key)."""
    merged: Dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    return merged


def run_case_phases(command: Callable[[str], List[str]], threads: int, root: str,
                    timeout: Optional[float] = None) -> Dict[str, Any]:
    """One CPU benchmark case in two fresh interpreters: ``'memory'`` (started with
    :data:`EXACT_RSS_ENV`), then ``'time'`` (default allocator); their results merged.

    Args:
        command: Phase name -> the child's command.
        threads, root, timeout: As :func:`run_json_child`.

    Raises:
        RuntimeError: A phase failed (the message starts with the phase's name).
        subprocess.TimeoutExpired: A phase ran past ``timeout``.
    """
    parts = []
    for phase in ('memory', 'time'):
        try:
            parts.append(run_json_child(command(phase), threads, root, phase == 'memory',
                                        timeout))
        except RuntimeError as err:
            raise RuntimeError(f'{phase}: {err}') from err
    return merge_results(parts)


class CpuPeakMemory:
    """Peak RSS of one call above the RSS just before it (Linux).

    Before the call freed heap memory is handed back (``malloc_trim``) and the kernel's
    peak-RSS mark is reset (``/proc/self/clear_refs`` = 5); the result is the peak RSS
    (``VmHWM``) after the call minus the RSS (``VmRSS``) before it: memory already resident
    (weights, inputs) is excluded, the call's output included.  Where ``clear_refs`` is not
    writable the peak mark cannot be reset, and :attr:`method` says so.

    Run it in a process started with :data:`EXACT_RSS_ENV` for the peak of the live
    allocations (:attr:`method` says whether it was).

    Args:
        fresh_process: Whether every measured case runs in a fresh interpreter (only named in
            :attr:`method`).
    """

    def __init__(self, fresh_process: bool = True) -> None:
        self.fresh_process = fresh_process
        libc_name = ctypes.util.find_library('c')
        self._libc = ctypes.CDLL(libc_name) if libc_name else None
        self.can_reset = os.access('/proc/self/clear_refs', os.W_OK)

    @property
    def method(self) -> str:
        """How the memory was measured, for the tools' reports."""
        where = 'fresh subprocess per case' if self.fresh_process else \
            'all cases in one process (--cpu-memory inprocess)'
        if exact_rss():
            where += ', allocations >= 1 MiB mapped and unmapped on their own (EXACT_RSS_ENV)'
        if self.can_reset:
            return (f'{where}; peak RSS (VmHWM, reset via /proc/self/clear_refs) '
                    'during the call minus RSS before it, after malloc_trim')
        return (f'{where}; ru_maxrss after the call minus RSS before it '
                '(/proc/self/clear_refs not writable: the op scope is exact, the backbone scope '
                'a lower bound if the op peak was higher)')

    def measure(self, fn: Callable[[], object]) -> Tuple[float, object]:
        """(peak MiB above the pre-call RSS, the call's result) of one call of ``fn``."""
        if self._libc is not None:
            self._libc.malloc_trim(0)
        if self.can_reset:
            with open('/proc/self/clear_refs', 'w') as f:
                f.write('5')
        before = proc_status_mib('VmRSS')
        out = fn()
        peak = proc_status_mib('VmHWM')
        return max(peak - before, 0.0), out


def cuda_peak_memory(fn: Callable[[], object], device: torch.device) -> Tuple[float, object]:
    """(``max_memory_allocated`` during one call of ``fn`` minus the allocation before it, in
    MiB; the call's result) on a CUDA ``device``."""
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20, out


def print_table(columns: Sequence[str], rows: Sequence[Dict[str, str]], indent: str = '',
                rule: bool = True, missing: str = '-') -> None:
    """Prints ``rows`` (column -> text) under ``columns``, each column right-aligned.

    Args:
        columns: Column names, in order (the header line).
        rows: One dict of cell texts per row; absent cells print as ``missing``.
        indent: Text before every line.
        rule: Whether a dashed line separates the header from the rows.
        missing: The text of absent cells.
    """
    widths = {c: max([len(c)] + [len(r.get(c, missing)) for r in rows]) for c in columns}
    print(indent + '  '.join(c.rjust(widths[c]) for c in columns))
    if rule:
        print(indent + '  '.join('-' * widths[c] for c in columns))
    for r in rows:
        print(indent + '  '.join(r.get(c, missing).rjust(widths[c]) for c in columns))


def write_json(rows: Any, path: Optional[str]) -> None:
    """Writes a tool's result rows to ``path`` as indented JSON (nothing when ``path`` is empty).
    """
    if path:
        with open(path, 'w') as f:
            json.dump(rows, f, indent=2)
