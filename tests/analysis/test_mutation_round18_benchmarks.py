"""Mutation round 18: the benchmark tools and :mod:`mmlinvit.utils.benchmarking` on branches,
defaults and error paths that rounds 11 and 13 (and the tools' own tests) left open.

A benchmark must never print a silently wrong number: each test below failed on at least one
single-line change of the code under test that the rest of the suite let pass.  Expectations
are worked out here by hand (fake clocks, fake allocations, fake profiler events), read from
the tools' own docstrings, or taken from the real model the tool measures:

* :mod:`mmlinvit.utils.benchmarking`: the documented 1 MiB mmap threshold, one warm-up by
  default (what ``benchmark_onnx`` documents), a child killed by a signal is a failure even
  after printing its JSON, the child timeout reaches ``subprocess.run`` (also through
  ``run_case_phases``), the repository first on the child's ``PYTHONPATH`` whatever the
  caller's is, ``CpuPeakMemory``'s default (fresh subprocess) and its formula (peak RSS after
  the call minus RSS before it) where the peak mark cannot be reset;
* ``tools/analysis/speed_ratios.py``: eval mode, the device, the smoke pair's mixer options
  kept under ``--adventurer-chunk``, ``--threads`` and ``--adventurer-chunk`` from ``main``,
  no autograd while measuring, non-square inputs, the ms and GFLOPs columns;
* ``tools/analysis/peak_memory_vit.py``: every parent option reaches the child command, the
  thread count, the error names the failing operator, the warm-up on a 2 x 2 patch grid before
  the measured forward (both under ``torch.inference_mode``), ``peak_rss_mb`` is VmHWM,
  ``output_finite`` is about every element, the printed columns;
* ``tools/analysis/benchmark_adventurer.py``: warm-up / repeat counts, ``inference_mode``,
  eval mode, threads, ``sec_per_img``, the peak as measured, the refusal without a resettable
  peak mark, the worker command (H x W order, chunk, threads) and the error naming the case;
* ``tools/analysis/benchmark_attention_op.py``: warm-ups per device, ``--stat`` and
  ``--max-seconds`` handed on, CUDA profiler events left out of the CPU peak, the default CPU
  dtype, the (B, H, N, d) shape, ``--feature-map``, ``--repeats``, ``--threads``, the graph
  path and its column, the CUDA memory probe;
* ``tools/analysis/benchmark_backbones.py``: the Adventurer op scope feeds its mixer the token
  count the model feeds it, non-square images, median timing (eager and compiled), the child
  spec and case timeout, the child's phase, a zero peak, ``--no-adventurer`` / ``--large``,
  the CUDA defaults (20 repeats, bfloat16, one process), the same-size baseline, the 10 %
  verdict, a compiled row without the backbone scope, no autograd while measuring.

Finding of this round (see the tests marked FINDING): ``parse_size`` took ``0`` (the tools then
failed deep inside the model), and ``--repeats 0`` / ``-1`` of ``benchmark_attention_op`` and
``benchmark_backbones`` were silently replaced by the default or ended in
``StatisticsError: no median for empty data``.
"""
import argparse
import contextlib
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch

from mmlinvit.utils import benchmarking
from mmlinvit.utils.benchmarking import (EXACT_RSS_ENV, CpuPeakMemory, parse_size,
                                         run_case_phases, run_json_child, time_round_robin,
                                         timed_calls)
from mmlinvit.utils.cli import load_script

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device('cpu')


def _tool(monkeypatch: pytest.MonkeyPatch, name: str) -> ModuleType:
    """``tools/analysis/<name>.py`` loaded as a module; ``sys.path`` (which some tools extend
    on import) is restored after the test."""
    monkeypatch.setattr(sys, 'path', list(sys.path))
    return load_script(str(ROOT / 'tools' / 'analysis' / f'{name}.py'), f'round18_{name}')


def _record_threads(monkeypatch: pytest.MonkeyPatch) -> List[int]:
    """Replaces ``torch.set_num_threads`` by a recorder (the process's threads stay as they
    are)."""
    seen: List[int] = []
    monkeypatch.setattr(torch, 'set_num_threads', seen.append)
    return seen


# ----------------------------------------------------------------------------- benchmarking
def test_exact_rss_threshold_is_the_documented_one_mib() -> None:
    """The docstring: 'glibc serves every allocation of 1 MiB or more with its own mapping'."""
    assert EXACT_RSS_ENV == {'MALLOC_MMAP_THRESHOLD_': str(1024 * 1024)}


def test_round_robin_makes_one_warm_up_call_by_default() -> None:
    """benchmark_onnx (which leaves ``warmups`` at its default) documents 'median over
    --repeats runs after one warm-up run'."""
    calls: List[str] = []
    time_round_robin({'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')}, CPU, 2)
    assert calls == ['a', 'b', 'a', 'b', 'a', 'b']


def test_round_robin_stops_only_once_the_budget_is_exceeded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Like ``timed_calls`` (round 11): rounds of exactly 0.25 s (binary fractions, exact sums)
    against a 0.5 s budget: 0.5 s is not past it, so a third round runs."""
    clock = {'now': 0.0}
    calls: List[int] = []

    def step() -> None:
        calls.append(1)
        clock['now'] += 0.25

    monkeypatch.setattr(time, 'perf_counter', lambda: clock['now'])
    times = time_round_robin({'f': step}, CPU, repeats=10, warmups=0, max_seconds=0.5)
    assert len(calls) == 3 and times == {'f': 250.0}


def test_a_child_killed_by_a_signal_is_a_failure(tmp_path: Path) -> None:
    """An OOM-killed case (negative return code) must not be read as a result, even when it
    printed its JSON line before it died."""
    code = ('import os, signal; print(\'{"ms": 1.0}\', flush=True); '
            'os.kill(os.getpid(), signal.SIGKILL)')
    with pytest.raises(RuntimeError, match=rf'^exit {-signal.SIGKILL}: '):
        run_json_child([sys.executable, '-c', code], 1, str(tmp_path))


def test_the_child_timeout_is_enforced_directly_and_per_phase(tmp_path: Path) -> None:
    sleeper = [sys.executable, '-c', 'import time; time.sleep(60)']
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_json_child(sleeper, 1, str(tmp_path), timeout=1.0)
    with pytest.raises(subprocess.TimeoutExpired):
        run_case_phases(lambda phase: sleeper, 1, str(tmp_path), timeout=1.0)
    assert time.monotonic() - start < 30


def test_the_repository_comes_first_on_the_childs_path(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    other = str(tmp_path / 'other')
    monkeypatch.setenv('PYTHONPATH', other)
    code = 'import json, os; print(json.dumps(os.environ["PYTHONPATH"].split(os.pathsep)))'
    assert run_json_child([sys.executable, '-c', code], 1, str(tmp_path)) == [
        str(tmp_path), other]


def test_cpu_peak_memory_defaults_to_a_fresh_process_per_case() -> None:
    """Documented: 'fresh_process: Whether every measured case runs in a fresh interpreter';
    the tools that build it without arguments (peak_memory_vit, benchmark_adventurer) run
    every case in its own subprocess."""
    assert CpuPeakMemory().method.startswith('fresh subprocess per case')


def test_cpu_peak_memory_without_a_resettable_mark_is_peak_after_minus_rss_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the peak mark cannot be reset the result is VmHWM after the call minus VmRSS
    before it (400 - 100 MiB), as ``method`` states, not VmHWM - VmHWM."""
    status = {'VmRSS': 100.0, 'VmHWM': 400.0}
    monkeypatch.setattr(benchmarking, 'proc_status_mib', lambda key: status[key])
    probe = CpuPeakMemory(fresh_process=False)
    probe.can_reset, probe._libc = False, None

    def call() -> str:
        status['VmRSS'] = 150.0  # the output stays resident
        return 'out'

    assert probe.measure(call) == (300.0, 'out')
    assert 'ru_maxrss after the call minus RSS before it' in probe.method


@pytest.mark.parametrize('text', ['0', '0x512', '512x0', '00'])
def test_parse_size_refuses_zero(text: str) -> None:
    """FINDING (fixed in this round): ``'0'`` parsed as (0, 0) and the tools failed inside
    the patch embedding ('Kernel size can't be greater than actual input size')."""
    with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
        parse_size(text)


@pytest.mark.parametrize('repeats', [0, -1])
def test_timing_refuses_no_repeats_by_name(repeats: int) -> None:
    """FINDING (fixed in this round): no timed call ended in ``StatisticsError: no median for
    empty data`` (``min() arg is an empty sequence`` with ``stat='min'``) or an empty list."""
    with pytest.raises(ValueError, match=f'repeats must be >= 1, got {repeats}'):
        time_round_robin({'a': lambda: None}, CPU, repeats)
    with pytest.raises(ValueError, match=f'repeats must be >= 1, got {repeats}'):
        timed_calls(lambda: None, CPU, repeats)


# ----------------------------------------------------------------------------- speed_ratios
class _Recorder(torch.nn.Module):
    """Records the input shape, grad / inference mode and training flag of every call."""

    def __init__(self, name: str, log: List[Dict[str, Any]]) -> None:
        super().__init__()
        self.name, self.log = name, log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append(dict(name=self.name, shape=tuple(x.shape), grad=torch.is_grad_enabled(),
                             inference=torch.is_inference_mode_enabled(),
                             training=self.training))
        return x


class _FakeCounter:
    """FlopCounter stand-in: 8 GFLOPs for softmax, 2 for elu."""

    FLOPS = {'softmax': 8e9, 'elu': 2e9}
    last: Dict[str, str] = {}

    def __enter__(self) -> '_FakeCounter':
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.total = self.FLOPS[self.last['name']]
        return False


def test_speed_ratios_builds_eval_models_on_the_device_with_the_pair_mixer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _tool(monkeypatch, 'speed_ratios')
    pair = tool.MODELS['tiny']
    models = tool.build_models(pair, ['elu'], True, torch.device('meta'), chunk=32)
    for model in models.values():
        assert not any(m.training for m in model.modules())
        assert {p.device.type for p in model.parameters()} == {'meta'}
    mixer = models['adventurer'].layers[0].mixer
    assert (mixer.d_state, mixer.headdim, mixer.chunk_size) == (
        pair.adventurer_mixer['d_state'], pair.adventurer_mixer['headdim'], 32)


def test_speed_ratios_rows_without_autograd_non_square_and_columns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _tool(monkeypatch, 'speed_ratios')
    log: List[Dict[str, Any]] = []

    class Counter(_FakeCounter):
        last = {}

    class Model(_Recorder):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            Counter.last['name'] = self.name
            return super().forward(x)

    monkeypatch.setattr(tool, 'FlopCounter', Counter)
    durations = {'softmax': 0.030, 'elu': 0.010}

    def timed(calls: Dict[str, Callable[[], object]], device: torch.device, rounds: int,
              warmups: int = 1) -> Dict[str, float]:
        for call in calls.values():  # the real calls, under the tool's grad mode
            call()
        return {name: durations[name] * 1e3 for name in calls}

    monkeypatch.setattr(tool, 'time_round_robin', timed)
    models = {name: Model(name, log) for name in ('softmax', 'elu')}
    rows = tool.measure_size(models, (8, 16), CPU, 1)
    assert {entry['shape'] for entry in log} == {(1, 3, 8, 16)}
    assert not any(entry['grad'] for entry in log)
    elu = next(r for r in rows if r['model'] == 'elu')
    assert (elu['ms'], elu['gflops'], elu['size']) == ('10.0', '2.0', '8x16')
    assert next(r for r in rows if r['model'] == 'softmax')['gflops'] == '8.0'


def test_speed_ratios_main_hands_on_threads_and_chunk(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    tool = _tool(monkeypatch, 'speed_ratios')
    threads = _record_threads(monkeypatch)
    built: List[Optional[int]] = []
    monkeypatch.setattr(tool, 'build_models',
                        lambda pair, ops, adventurer, device, chunk=None: built.append(chunk)
                        or {})
    monkeypatch.setattr(tool, 'measure_size', lambda models, hw, device, rounds: [])
    tool.main(['--model', 'tiny', '--threads', '3', '--adventurer-chunk', '32', '--sizes', '32'])
    assert threads == [3] and built == [32]
    assert 'Adventurer SSD chunk 32' in capsys.readouterr().out


# -------------------------------------------------------------------------- peak_memory_vit
def test_peak_memory_parent_hands_every_option_to_its_children(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    tool = _tool(monkeypatch, 'peak_memory_vit')
    seen: List[Tuple[List[str], List[str], int]] = []

    def fake_phases(command: Callable[[str], List[str]], threads: int, root: str) -> dict:
        seen.append((command('memory'), command('time'), threads))
        return dict(attn='elu', softmax_backend=None, num_tokens=26, params_mb=21.5,
                    peak_rss_mb=345.3, forward_mb=12.7, forward_s=0.5, memory_method='m')

    monkeypatch.setattr(tool, 'run_case_phases', fake_phases)
    parent = tool.parse_args(['--attn', 'elu', '--arch', 's', '--img-size', '72',
                              '--patch-size', '14', '--threads', '3'])
    tool.run_parent(parent)
    (memory, timing, threads), = seen
    assert threads == 3
    assert memory[:2] == [sys.executable, str(ROOT / 'tools' / 'analysis' /
                                              'peak_memory_vit.py')]
    for argv, phase in ((memory, 'memory'), (timing, 'time')):
        child = tool.parse_args(argv[2:])
        assert (child.child_attn, child.child_backend, child.child_phase) == (
            'elu', 'default', phase)
        assert (child.arch, child.img_size, child.patch_size, child.threads) == ('s', 72, 14, 3)
    line = next(line for line in capsys.readouterr().out.splitlines()
                if line.startswith('elu'))
    assert line.split() == ['elu', '26', '21.5', '345.3', '12.7', '0.50']


def test_peak_memory_parent_names_the_failing_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _tool(monkeypatch, 'peak_memory_vit')

    def failing(command: Callable[[str], List[str]], threads: int, root: str) -> dict:
        raise RuntimeError('time: exit 1: boom')

    monkeypatch.setattr(tool, 'run_case_phases', failing)
    with pytest.raises(RuntimeError, match=r'^softmax \(math\) failed: time: exit 1: boom$'):
        tool.run_parent(tool.parse_args(['--attn', 'softmax', '--softmax-backends', 'math']))


def _patch_vit(monkeypatch: pytest.MonkeyPatch, log: List[Dict[str, Any]],
               nan: bool = False) -> None:
    """``mmlinvit.backbones.VisionTransformer`` records every forward (and can put one NaN
    into the first output)."""
    import mmlinvit.backbones as backbones
    real = backbones.VisionTransformer

    class Recording(real):
        def forward(self, x: torch.Tensor) -> Any:
            log.append(dict(shape=tuple(x.shape), inference=torch.is_inference_mode_enabled(),
                            training=self.training))
            outs = super().forward(x)
            if nan:
                first = outs[0].clone()
                first.view(-1)[0] = float('nan')
                outs = (first, ) + tuple(outs[1:])
            return outs

    monkeypatch.setattr(backbones, 'VisionTransformer', Recording)


CHILD = ['--arch', 't', '--img-size', '48', '--patch-size', '16', '--threads', '1']


def test_peak_memory_child_warms_up_then_times_under_inference_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _tool(monkeypatch, 'peak_memory_vit')
    threads = _record_threads(monkeypatch)
    log: List[Dict[str, Any]] = []
    _patch_vit(monkeypatch, log)
    row = tool.run_child(tool.parse_args(['--child-attn', 'elu', '--child-phase', 'time'] +
                                         CHILD[:-1] + ['3']))
    assert threads == [3]
    assert [entry['shape'] for entry in log] == [(1, 3, 32, 32), (1, 3, 48, 48)]
    assert all(entry['inference'] for entry in log)
    assert row['output_finite'] and row['num_tokens'] == 3 * 3 + 1


def test_peak_memory_child_memory_row_and_a_nan_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """``peak_rss_mb`` is the peak (VmHWM, 345 MiB here), not the current RSS; one NaN makes
    the output not finite."""
    tool = _tool(monkeypatch, 'peak_memory_vit')
    log: List[Dict[str, Any]] = []
    _patch_vit(monkeypatch, log, nan=True)

    class Probe:
        method = 'probe'

        def measure(self, fn: Callable[[], object]) -> Tuple[float, object]:
            return 12.5, fn()

    monkeypatch.setattr(tool, 'CpuPeakMemory', Probe)
    monkeypatch.setattr(tool, 'proc_status_mib', {'VmHWM': 345.0, 'VmRSS': 200.0}.__getitem__)
    row = tool.run_child(tool.parse_args(['--child-attn', 'elu', '--child-phase', 'memory'] +
                                         CHILD))
    assert (row['forward_mb'], row['peak_rss_mb'], row['memory_method']) == (12.5, 345.0,
                                                                               'probe')
    assert row['output_finite'] is False
    assert [entry['shape'] for entry in log] == [(1, 3, 32, 32), (1, 3, 48, 48)]


# --------------------------------------------------------------------- benchmark_adventurer
class _Probe:
    """CpuPeakMemory stand-in with a resettable mark and a fixed 7 MiB peak."""

    method = 'probe'

    def __init__(self, can_reset: bool = True) -> None:
        self.can_reset = can_reset

    def measure(self, fn: Callable[[], object]) -> Tuple[float, object]:
        return 7.0, fn()


def test_adventurer_case_counts_modes_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    import mmlinvit.backbones as backbones
    tool = _tool(monkeypatch, 'benchmark_adventurer')
    threads = _record_threads(monkeypatch)
    log: List[Dict[str, Any]] = []
    monkeypatch.setattr(backbones, 'VisionTransformer', lambda *a, **k: _Recorder('vit', log))
    monkeypatch.setattr(tool, 'CpuPeakMemory', _Probe)
    real_clock, clock = time.perf_counter, iter([10.0, 11.0])
    monkeypatch.setattr(time, 'perf_counter', lambda: next(clock))
    assert tool.run_case('vit', (32, 48), 4, 2, 3, 256, 0, 'time') == dict(
        img_per_s=4.0, sec_per_img=0.25)  # 4 forwards in 1 s
    monkeypatch.setattr(time, 'perf_counter', real_clock)
    assert len(log) == 2 + 4 and threads == [3]
    assert all(e['inference'] and not e['training'] and e['shape'] == (1, 3, 32, 48)
               for e in log)
    log.clear()
    assert tool.run_case('vit', (32, 48), 4, 2, 1, 256, 0, 'memory') == dict(peak_mib=7.0)
    assert len(log) == 2 + 1 and all(e['inference'] for e in log)
    monkeypatch.setattr(tool, 'CpuPeakMemory', lambda: _Probe(can_reset=False))
    with pytest.raises(RuntimeError, match='cannot reset the peak-RSS counter'):
        tool.run_case('vit', (32, 48), 1, 0, 1, 256, 0, 'memory')


def test_adventurer_worker_command_and_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _tool(monkeypatch, 'benchmark_adventurer')
    seen: List[Tuple[List[str], int]] = []

    def fake_phases(command: Callable[[str], List[str]], threads: int, root: str) -> dict:
        seen.append((command('memory'), threads))
        return {}

    monkeypatch.setattr(tool, 'run_case_phases', fake_phases)
    args = argparse.Namespace(repeats=5, warmup=2, threads=3, chunk_size=128, chunks_per_step=4)
    tool.spawn_case('adventurer', (512, 1024), args)
    (argv, threads), = seen
    assert threads == 3

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert parse_size(value('--sizes')) == (512, 1024)  # H x W, as parse_size reads it back
    assert [value(f) for f in ('--worker', '--repeats', '--warmup', '--threads', '--chunk-size',
                               '--chunks-per-step', '--phase')] == [
        'adventurer', '5', '2', '3', '128', '4', 'memory']

    def failing(command: Callable[[str], List[str]], threads: int, root: str) -> dict:
        raise RuntimeError('memory: exit 1: boom')

    monkeypatch.setattr(tool, 'run_case_phases', failing)
    with pytest.raises(RuntimeError, match=r"^case vit \(224, 224\) failed: memory: exit 1"):
        tool.spawn_case('vit', (224, 224), args)


# ------------------------------------------------------------------- benchmark_attention_op
def test_attention_op_time_ms_hands_on_warmups_stat_and_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _tool(monkeypatch, 'benchmark_attention_op')
    seen: List[Tuple[str, int, int, float, str]] = []

    def fake(fns: dict, device: torch.device, repeats: int, warmups: int = 1,
             max_seconds: float = math.inf, stat: str = 'median') -> Dict[str, float]:
        seen.append((device.type, repeats, warmups, max_seconds, stat))
        return {}

    monkeypatch.setattr(tool, 'time_round_robin', fake)
    tool.time_ms({}, CPU, 7, 2.5, 'min')
    tool.time_ms({}, torch.device('cuda'), 9, 4.0, 'median')
    assert seen == [('cpu', 7, 1, 2.5, 'min'), ('cuda', 9, 3, 4.0, 'median')]


def test_attention_op_cpu_peak_leaves_cuda_events_out(monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _tool(monkeypatch, 'benchmark_attention_op')
    device_types = torch.autograd.DeviceType

    def event(start: int, nbytes: int, device: Any) -> SimpleNamespace:
        return SimpleNamespace(name=lambda: '[memory]', device_type=lambda: device,
                               start_ns=lambda: start, nbytes=lambda: nbytes)

    events = [event(0, 2**20, device_types.CPU), event(1, 512 * 2**20, device_types.CUDA),
              event(2, -2**20, device_types.CPU)]

    @contextlib.contextmanager
    def fake_profile(**kwargs: Any) -> Any:
        yield SimpleNamespace(profiler=SimpleNamespace(
            kineto_results=SimpleNamespace(events=lambda: events)))

    monkeypatch.setattr(tool, 'profile', fake_profile)
    assert tool.cpu_peak_bytes(lambda: None) == 2**20


def test_attention_op_peak_bytes_uses_the_cuda_probe_on_cuda(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _tool(monkeypatch, 'benchmark_attention_op')
    monkeypatch.setattr(tool, 'cuda_peak_bytes', lambda fn, device: ('cuda', device.type))
    monkeypatch.setattr(tool, 'cpu_peak_bytes', lambda fn: 'cpu')
    assert tool.peak_bytes(lambda: None, torch.device('cuda')) == ('cuda', 'cuda')
    assert tool.peak_bytes(lambda: None, CPU) == 'cpu'


def test_attention_op_main_inputs_operator_and_columns(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    """Default CPU dtype float32, q / k / v of shape (B, H, N, d), ``--feature-map`` reaches
    the torch path, the graph path is the whole-tensor form, ``--repeats`` and ``--threads``
    are used; the la-graph column is the graph time."""
    tool = _tool(monkeypatch, 'benchmark_attention_op')
    threads = _record_threads(monkeypatch)
    calls: List[Tuple[Any, ...]] = []

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        calls.append(('sdpa', tuple(q.shape), q.dtype))
        return q

    def linear(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fm: str,
               backend: str = 'auto') -> torch.Tensor:
        calls.append(('linear', fm, backend))
        return q

    def graph(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fm: str) -> torch.Tensor:
        calls.append(('graph', fm))
        return q

    repeats: List[int] = []

    def fake_time(fns: Dict[str, Callable[[], object]], device: torch.device, n: int,
                  max_seconds: float, stat: str) -> Dict[str, float]:
        repeats.append(n)
        for fn in fns.values():
            fn()
        return dict(sdpa=6.0, torch=2.0, graph=1.5)

    monkeypatch.setattr(tool, 'F', SimpleNamespace(scaled_dot_product_attention=sdpa))
    monkeypatch.setattr(tool, 'linear_attention', linear)
    monkeypatch.setattr(tool, 'linear_attention_graph', graph)
    monkeypatch.setattr(tool, 'time_ms', fake_time)
    monkeypatch.setattr(sys, 'argv', [
        'x', '--device', 'cpu', '--tokens', '7', '--batch', '2', '--heads', '3', '--head-dim',
        '5', '--feature-map', 'relu', '--repeats', '2', '--threads', '4', '--no-memory',
        '--graph-path'])
    tool.main()
    assert calls == [('sdpa', (2, 3, 7, 5), torch.float32), ('linear', 'relu', 'torch'),
                     ('graph', 'relu')]
    assert repeats == [2] and threads == [4]
    lines = capsys.readouterr().out.splitlines()
    assert 'dtype=torch.float32' in lines[0]
    assert [h.strip() for h in lines[-2].split('  ') if h.strip()] == [
        'N', 'sdpa ms', 'la-torch ms', 'la-graph ms', 'speed sdpa/la']
    assert lines[-1].split() == ['7', '6.000', '2.000', '1.500', '3.00x']


@pytest.mark.parametrize('repeats', ['0', '-1'])
def test_attention_op_refuses_repeats_below_one(monkeypatch: pytest.MonkeyPatch,
                                                repeats: str) -> None:
    """FINDING (fixed in this round): ``--repeats 0`` was silently the default (5) and
    ``--repeats -1`` ended in ``StatisticsError: no median for empty data``."""
    tool = _tool(monkeypatch, 'benchmark_attention_op')
    monkeypatch.setattr(tool, 'time_ms', lambda *a, **k: pytest.fail('measured'))
    monkeypatch.setattr(sys, 'argv', ['x', '--device', 'cpu', '--tokens', '7', '--repeats',
                                      repeats])
    with pytest.raises(SystemExit):
        tool.main()


# ---------------------------------------------------------------------- benchmark_backbones
def test_backbones_adventurer_op_scope_feeds_the_mixer_what_the_model_feeds_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Reference: the real model's first-mixer input, (1, patches + class + heading average,
    D), at a 2 x 3 patch grid."""
    tool = _tool(monkeypatch, 'benchmark_backbones')
    model = tool.build_backbone('tiny', 'adventurer', CPU, torch.float32)
    shapes: List[Tuple[int, ...]] = []
    handle = model.layers[0].mixer.register_forward_pre_hook(
        lambda module, args: shapes.append(tuple(args[0].shape)))
    try:
        with torch.inference_mode():
            model(torch.randn(1, 3, 32, 48))
            tool.op_callable(model, 'adventurer', (2, 3), CPU, torch.float32)()
    finally:
        handle.remove()
    assert len(shapes) == 2 and shapes[0] == shapes[1] == (1, 2 * 3 + 2, model.embed_dims)


def test_backbones_backbone_call_keeps_height_and_width(monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _tool(monkeypatch, 'benchmark_backbones')
    assert tool.backbone_callable(lambda x: tuple(x.shape), (16, 32), CPU, torch.float32)() == (
        1, 3, 16, 32)


def test_backbones_times_are_medians_without_autograd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Documented: 'median over --repeats calls'; [1, 2, 9] ms gives 2 (min 1, mean 4); the
    calls run without autograd."""
    tool = _tool(monkeypatch, 'benchmark_backbones')
    grad: List[bool] = []

    def fake_timed(fn: Callable[[], object], device: torch.device, repeats: int,
                   max_seconds: float = math.inf) -> List[float]:
        fn()
        grad.append(torch.is_grad_enabled())
        return [1.0, 9.0, 2.0]

    monkeypatch.setattr(tool, 'timed_calls', fake_timed)
    result = tool.measure_case('tiny', 'elu', (32, 32), ['op', 'backbone'], CPU, torch.float32,
                               repeats=3, max_seconds=1.0, phases=('time', ))
    assert result['op']['ms'] == result['backbone']['ms'] == 2.0
    assert result['backbone']['calls'] == 3 and grad == [False, False]
    monkeypatch.setattr(torch, 'compile', lambda model, **kwargs: model)
    compiled = tool.measure_compiled(torch.nn.Identity(), (16, 16), CPU, torch.float32, 3, 1.0)
    assert compiled['ms'] == 2.0 and compiled['calls'] == 3


def test_backbones_child_spec_timeout_and_phase(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    tool = _tool(monkeypatch, 'benchmark_backbones')
    seen: List[Tuple[Dict[str, Any], Dict[str, Any], int, Optional[float]]] = []

    def fake_phases(command: Callable[[str], List[str]], threads: int, root: str,
                    timeout: Optional[float] = None) -> dict:
        seen.append((json.loads(command('memory')[-1]), json.loads(command('time')[-1]),
                     threads, timeout))
        return {}

    monkeypatch.setattr(tool, 'run_case_phases', fake_phases)
    args = tool.parse_args(['--scopes', 'backbone', '--max-seconds', '7.5', '--threads', '3',
                            '--case-timeout', '42', '--compile'])
    args.dtype = 'float32'
    tool.run_case_subprocess(args, 'tiny', 'elu', (16, 32), 4)
    (memory, timing, threads, timeout), = seen
    assert threads == 3 and timeout == 42.0
    for spec, phase in ((memory, 'memory'), (timing, 'time')):
        assert spec == dict(model='tiny', operator='elu', size=[16, 32], scopes=['backbone'],
                            dtype='float32', repeats=4, max_seconds=7.5, threads=3, compile=True,
                            phase=phase)

    measured: List[Dict[str, Any]] = []
    threads_set = _record_threads(monkeypatch)
    monkeypatch.setattr(tool, 'measure_case',
                        lambda *a, **k: measured.append(dict(args=a, **k)) or dict(ok=1))
    tool.child_main(json.dumps(memory))
    assert measured[0]['phases'] == ('memory', ) and measured[0]['compile_model'] is True
    assert measured[0]['args'][5] == torch.float32 and threads_set == [3]
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == dict(ok=1)


def _row(size: str, operator: str, ms: float, mib: float = 10.0, gflops: float = 1.0,
         **extra: Any) -> Dict[str, Any]:
    return dict(model='ViT-B/16', size=size, tokens=1, operator=operator,
                backbone=dict(ms=ms, mib=mib, gflops=gflops), **extra)


def test_backbones_table_same_size_baseline_zero_peak_and_compiled_without_backbone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _tool(monkeypatch, 'benchmark_backbones')
    tables: List[List[Dict[str, str]]] = []
    monkeypatch.setattr(tool, 'print_table', lambda cols, table: tables.append(table))
    tool.print_rows([_row('224', 'softmax', 10.0), _row('1024', 'softmax', 30.0),
                     _row('1024', 'elu', 10.0, mib=0.0)], ['backbone'])
    elu = tables[0][2]
    assert elu['backbone x'] == '3.00x'  # 30 ms / 10 ms at 1024, not 10 / 10 at 224
    assert elu['backbone mem x'] == '-'  # no peak: no ratio (and no ZeroDivisionError)
    op_row = dict(model='ViT-B/16', size='32', tokens=1, operator='elu',
                  op=dict(ms=1.0, mib=1.0), compiled=dict(ms=0.5, compile_s=1.0))
    tool.print_rows([op_row], ['op'])  # --scopes op --compile: no backbone scope
    assert 'eager/compiled' not in tables[1][0]


def test_backbones_verdict_is_within_ten_percent(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    """Speed 7 / 8 = 0.875x over a FLOP ratio of 1: 12.5 % off, not within 10 %."""
    tool = _tool(monkeypatch, 'benchmark_backbones')
    monkeypatch.setattr(tool, 'analytic_ratio', lambda *a: 1.0)
    tool.print_flop_comparison([_row('1024', 'softmax', 7.0), _row('1024', 'elu', 8.0)],
                               {'ViT-B/16': 'vit-b16'})
    assert '= 0.88 (NOT within 10%' in capsys.readouterr().out


def test_backbones_case_lists_and_model_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _tool(monkeypatch, 'benchmark_backbones')
    assert tool.case_operators(tool.parse_args(['--operators', 'elu', '--no-adventurer'])) == [
        'softmax', 'elu']
    assert tool.case_operators(tool.parse_args(['--operators', 'relu'])) == [
        'softmax', 'relu', 'adventurer']
    assert tool.model_keys(tool.parse_args(['--large'])) == ['vit-b16', 'vit-l14']
    assert tool.model_keys(tool.parse_args([])) == ['vit-b16']
    assert tool.model_keys(tool.parse_args(['--tiny', '--large'])) == ['tiny']


def test_backbones_cuda_defaults_in_one_process(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    """Documented: 20 repeats and bfloat16 on CUDA, all cases in this process; --threads is
    applied."""
    tool = _tool(monkeypatch, 'benchmark_backbones')
    threads = _record_threads(monkeypatch)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'empty_cache', lambda: None)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: 'fake')
    monkeypatch.setattr(tool, 'plot', lambda rows, scopes, path: None)
    cases: List[Dict[str, Any]] = []

    def fake_case(model_key: str, op: str, hw: Tuple[int, int], scopes: List[str],
                  device: torch.device, dtype: torch.dtype, repeats: int, max_seconds: float,
                  fresh_process: bool = True, compile_model: bool = False) -> Dict[str, Any]:
        cases.append(dict(device=device.type, dtype=dtype, repeats=repeats,
                          fresh_process=fresh_process))
        return _row('32', op, 1.0)

    monkeypatch.setattr(tool, 'measure_case', fake_case)
    tool.main(['--device', 'cuda', '--tiny', '--sizes', '32', '--operators', 'elu',
               '--no-adventurer', '--scopes', 'backbone', '--threads', '3', '--out-dir',
               str(tmp_path)])
    assert cases == [dict(device='cuda', dtype=torch.bfloat16, repeats=20,
                          fresh_process=False)] * 2
    assert threads == [3]
    capsys.readouterr()


@pytest.mark.parametrize('repeats', ['0', '-1'])
def test_backbones_refuse_repeats_below_one(monkeypatch: pytest.MonkeyPatch,
                                            repeats: str) -> None:
    """FINDING (fixed in this round): ``--repeats 0`` was silently the default and ``-1`` gave
    every case the error row 'StatisticsError: no median for empty data'."""
    tool = _tool(monkeypatch, 'benchmark_backbones')
    with pytest.raises(SystemExit):
        tool.parse_args(['--repeats', repeats])
