"""mmlinvit.utils.benchmarking: the one copy of the tools' size parsing, timing and error.

The tools (count_flops, benchmark_*, visualize_attention, gpu_suite, benchmark_onnx) each
carried their own ``parse_size`` / timing loop / ``rel_err`` before; these tests pin the shared
behaviour against values written out here.
"""
import argparse
import math
import time

import pytest
import torch

from mmlinvit.utils.benchmarking import (CpuPeakMemory, parse_size, print_table, rel_err,
                                         size_label, time_round_robin, timed_calls)

CPU = torch.device('cpu')


@pytest.mark.parametrize('text,hw', [('512', (512, 512)), ('512x1024', (512, 1024)),
                                     ('1024X2048', (1024, 2048))])
def test_parse_size_and_label_round_trip(text, hw):
    assert parse_size(text) == hw
    assert parse_size(size_label(hw)) == hw
    assert size_label(hw) == (str(hw[0]) if hw[0] == hw[1] else f'{hw[0]}x{hw[1]}')


@pytest.mark.parametrize('text', ['', 'x', '512x', '5a', '1x2x3', '-4'])
def test_parse_size_rejects_with_the_accepted_forms(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r'is not N or HxW \(e.g. 512x1024\)'):
        parse_size(text)


def test_rel_err_is_the_relative_frobenius_norm():
    want = torch.tensor([[3.0, 0.0], [0.0, 4.0]])  # norm 5
    got = want + torch.tensor([[0.0, 1.0], [0.0, 0.0]])  # error norm 1
    assert rel_err(got, want) == pytest.approx(0.2)
    assert rel_err(want.half(), want) == 0.0
    assert rel_err(torch.ones(2), torch.zeros(2)) == pytest.approx(math.sqrt(2) / 1e-30)


def test_round_robin_warms_up_interleaves_and_reduces():
    calls = []
    fns = {'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')}
    times = time_round_robin(fns, CPU, repeats=3, warmups=2)
    assert calls == ['a', 'a', 'b', 'b'] + ['a', 'b'] * 3
    assert set(times) == {'a', 'b'} and all(t >= 0 for t in times.values())
    with pytest.raises(ValueError, match="stat must be one of \\['median', 'min'\\]"):
        time_round_robin(fns, CPU, repeats=1, stat='mean')


class FakeClock:
    """A ``time.perf_counter`` stand-in: each call of ``step`` advances it by the next duration."""

    def __init__(self, durations_s):
        self.now = 0.0
        self.durations = list(durations_s)

    def perf_counter(self):
        return self.now

    def step(self):
        self.now += self.durations.pop(0)


def test_timing_measures_milliseconds_and_keeps_the_budget(monkeypatch):
    """Deterministic clock (no sleeps): a timed unit test would fail on a loaded CI machine."""
    clock = FakeClock([0.02] * 50)
    monkeypatch.setattr(time, 'perf_counter', clock.perf_counter)
    times = timed_calls(clock.step, CPU, repeats=50, max_seconds=0.05)
    assert times == pytest.approx([20.0, 20.0, 20.0])  # ms, stops once 60 ms > 50 ms budget
    clock = FakeClock([0.01, 0.03, 0.02] * 2)
    monkeypatch.setattr(time, 'perf_counter', clock.perf_counter)
    assert time_round_robin({'s': clock.step}, CPU, repeats=3, warmups=0)['s'] == \
        pytest.approx(20.0)
    assert time_round_robin({'s': clock.step}, CPU, repeats=3, warmups=0, stat='min')['s'] == \
        pytest.approx(10.0)


def test_cpu_peak_memory_sees_a_temporary_allocation():
    """A 64 MiB tensor allocated (and freed) inside the call counts; memory resident before the
    call does not (Linux /proc)."""
    import os
    if not os.path.exists('/proc/self/status'):
        pytest.skip('needs Linux /proc')
    resident = torch.ones(16 * 2**20)  # 64 MiB, allocated before the call
    probe = CpuPeakMemory(fresh_process=False)

    def call():
        return float(torch.ones(16 * 2**20).sum())  # 64 MiB temporary

    mib, out = probe.measure(call)
    assert out == 16 * 2**20
    assert mib >= 60  # the temporary
    if probe.can_reset:  # the peak mark was reset: the resident tensor is not counted
        assert mib < 64 + 40
    assert probe.method.startswith('all cases in one process')
    del resident


def test_print_table_right_aligns_columns(capsys):
    print_table(['name', 'ms'], [{'name': 'softmax', 'ms': '12.5'}, {'name': 'elu'}], indent='> ')
    assert capsys.readouterr().out.splitlines() == [
        '>    name    ms', '> -------  ----', '> softmax  12.5', '>     elu     -']
    print_table(['a'], [{'a': 'xyz'}], rule=False, missing='?')
    assert capsys.readouterr().out.splitlines() == ['  a', 'xyz']


def test_run_json_child_names_a_child_that_printed_nothing(tmp_path):
    """A case that exits 0 without its JSON line is named as such (was a bare IndexError); a
    failing case ends with its last stderr line; a good one returns its last line's JSON."""
    import sys

    from mmlinvit.utils.benchmarking import run_json_child
    root = str(tmp_path)
    silent = [sys.executable, '-c', 'import sys; sys.stderr.write("case skipped\\n")']
    with pytest.raises(RuntimeError, match=r'exit 0 without the JSON line.*case skipped'):
        run_json_child(silent, threads=1, root=root)
    failing = [sys.executable, '-c', 'raise SystemExit("bad size")']
    with pytest.raises(RuntimeError, match=r'exit 1: bad size'):
        run_json_child(failing, threads=1, root=root)
    good = [sys.executable, '-c', 'print("log"); print(\'{"ms": 2.5}\')']
    assert run_json_child(good, threads=1, root=root) == {'ms': 2.5}
