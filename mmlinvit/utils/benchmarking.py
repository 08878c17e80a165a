"""Timing, size parsing and error helpers shared by the benchmark / analysis tools (torch only).

``tools/analysis/*`` and ``tools/deployment/*`` import these instead of each carrying a copy:

* :func:`parse_size` / :func:`size_label`: ``--sizes 512 512x1024`` arguments and their labels;
* :func:`timed_calls` / :func:`time_round_robin`: wall times in ms, measured with CUDA events
  on a GPU (after the call's kernels finish) and ``time.perf_counter`` on a CPU;
* :func:`rel_err`: relative Frobenius error of a result against a reference;
* :func:`proc_status_mib`: a memory line of ``/proc/self/status`` (CPU peak-memory probes);
* :func:`write_json`: the ``--json`` output of a tool's result rows.
"""
import argparse
import json
import math
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

#: Reductions of the per-call times that :func:`time_round_robin` accepts.
STATS = {'median': statistics.median, 'min': min}


def parse_size(text: str) -> Tuple[int, int]:
    """An ``argparse`` type: ``'512'`` -> (512, 512); ``'512x1024'`` -> (512, 1024) (H x W).

    Raises:
        argparse.ArgumentTypeError: naming the text and the accepted forms.
    """
    parts = text.lower().split('x')
    if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f'size {text!r} is not N or HxW (e.g. 512x1024)')
    return int(parts[0]), int(parts[-1])


def size_label(hw: Tuple[int, int]) -> str:
    """``(512, 512)`` -> ``'512'``; ``(512, 1024)`` -> ``'512x1024'`` (inverse of parse_size)."""
    return f'{hw[0]}' if hw[0] == hw[1] else f'{hw[0]}x{hw[1]}'


def synchronize(device: torch.device) -> None:
    """Waits for the device's queued kernels (a no-op on CPU)."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


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
    """
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
    """
    if stat not in STATS:
        raise ValueError(f'stat must be one of {sorted(STATS)}, got {stat!r}')
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


def write_json(rows: Any, path: Optional[str]) -> None:
    """Writes a tool's result rows to ``path`` as indented JSON (nothing when ``path`` is empty).
    """
    if path:
        with open(path, 'w') as f:
            json.dump(rows, f, indent=2)
