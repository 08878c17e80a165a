"""Timing of the GPU suite: eagerly (CUDA events per call) and by CUDA-graph replay.

Eager times include the host's launch overhead, as a user sees it; graph replays leave it
out (the time the device needs, the number to set against the bytes moved).  Functions
timed against each other run round-robin, so the ratios of one round share the device's
state.  Built on :mod:`mmlinvit.utils.benchmarking`.
"""
import contextlib
import statistics
from typing import Callable, Dict, List, Optional, Tuple

import torch

from mmlinvit.utils.benchmarking import cuda_peak_memory, time_call_ms, time_round_robin

#: CUDA-graph replays per round are chosen so one round of one function takes about this long.
GRAPH_ROUND_MS = 200.0


def no_grad(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` called under ``torch.no_grad()``.

    Args:
        fn: The call to wrap.
    """
    def run():
        with torch.no_grad():
            return fn()
    return run


def bench_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median ms of ``fn`` (CUDA events after 2 warm-ups; CPU: perf_counter after 1).

    Args:
        fn: The call to time.
        device: Where it runs.
        repeats: Timed calls.
    """
    warmups = 2 if device.type == 'cuda' else 1
    return time_round_robin({'fn': fn}, device, repeats, warmups=warmups)['fn']


def eager_rounds(fns: Dict[str, Callable[[], object]], device: torch.device,
                 repeats: int) -> Dict[str, List[float]]:
    """Per-round ms of each function, called round-robin (``repeats`` rounds after warm-ups:
    2 on CUDA, 1 on CPU), so the ratios of one round share the device's state.

    Args:
        fns: Name -> call.
        device: Where the calls run.
        repeats: Rounds (one call of every function each).
    """
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
    """CUDA-graph replays per timing round: ~:data:`GRAPH_ROUND_MS` per round, 3 to 20.

    Args:
        eager_ms: The call's eager time (None or 0: 20 replays).
    """
    if not eager_ms:
        return 20
    return int(max(3, min(20, GRAPH_ROUND_MS // eager_ms)))


def capture_graph(fn: Callable[[], object], device: torch.device) -> 'torch.cuda.CUDAGraph':
    """``fn`` captured in a CUDA graph (after two warm-up calls on a side stream), replayed once.

    Args:
        fn: The call to capture.
        device: The CUDA device.
    """
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

    Args:
        fns: Name -> call.
        device: The CUDA device.
        replays: Name -> replays per round (:func:`replays_for`).
        rounds: Timing rounds.
    """
    graphs, failed = {}, {}
    for name, fn in fns.items():
        try:
            graphs[name] = capture_graph(fn, device)
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
    capture fails.

    Args:
        fn: The call to time.
        device: Where it runs.
        replays: Replays per round.
        rounds: Timing rounds.
    """
    if device.type != 'cuda':
        return None
    times, failed = graph_rounds({'fn': fn}, device, {'fn': replays}, rounds)
    if failed:
        raise RuntimeError(f'CUDA graph capture failed: {failed["fn"]}')
    return statistics.median(times['fn'])


def try_graph_ms(fn: Callable[[], object], device: torch.device,
                 eager_ms: Optional[float] = None) -> Tuple[Optional[float], Optional[str]]:
    """(median ms per replay, None), or (None, why) where there is no graph time: on CPU, or
    where capture failed (the reason printed).

    Args:
        fn: The call to time.
        device: Where it runs.
        eager_ms: Its eager time (sets the replays per round, :func:`replays_for`).
    """
    if device.type != 'cuda':
        return None, 'no CUDA graphs on CPU'
    times, failed = graph_rounds({'fn': fn}, device, {'fn': replays_for(eager_ms)})
    if failed:
        return None, f'capture failed: {failed["fn"]}'
    return statistics.median(times['fn']), None


def peak_mib(fn: Callable[[], object], device: torch.device) -> Optional[float]:
    """Peak allocation above the pre-call allocation (CUDA), None on CPU (``fn`` still runs).

    Args:
        fn: The call to measure.
        device: Where it runs.
    """
    if device.type != 'cuda':
        fn()
        return None
    return cuda_peak_memory(fn, device)[0]
