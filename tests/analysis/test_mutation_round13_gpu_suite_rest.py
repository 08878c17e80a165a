"""Mutation round 13: the rest of the GPU suite, checked on CPU with stand-ins for CUDA.

The suite runs once on a rented GPU: a wrong backend label, a section silently skipped or run
when not asked for, a printed table that drops a column, a timing helper that warms up, syncs,
divides or reduces the wrong way would waste that run.  Round 12
(``test_mutation_round12_gpu_suite.py``) pinned the verdicts, ratios, bytes-moved formulas and
check tolerances; the tests below guard what it left open, each against torch's own API or a
value worked out by hand:

* :mod:`~mmlinvit.analysis.gpu_suite.sdpa`: the backend forced by ``sdpa_context`` is the one
  ``torch.nn.attention.sdpa_kernel`` enables for that ``SDPBackend`` member; a refusal is
  reported with torch's own warnings, a real error is raised; the aten op / CUDA kernels read
  from a profile (the top-level op left out, heaviest kernel first, mixed-case kernel names);
* :mod:`~mmlinvit.analysis.gpu_suite.metadata`: MIG mode from ``nvidia-smi``, the CUDA fields
  of ``run_metadata`` (SM count, capability, GiB, L2 MiB) from fixed device properties, the
  TF32 flags and the environment it records;
* :mod:`~mmlinvit.analysis.gpu_suite.report`: the exact printed table, and what ``plot`` draws
  (the SDPA backends without the default row, failed points left out, targets);
* :mod:`~mmlinvit.analysis.gpu_suite.sizes`: the GPU sizes against the tool's docstring and the
  Adventurer-B mixer, and the names of the extra checks against their parameters;
* :mod:`~mmlinvit.analysis.gpu_suite.timing`: warm-ups, syncs and round-robin order on CUDA,
  per-replay division, median reduction, replays per round, graph capture order, peak MiB;
* :mod:`~mmlinvit.analysis.gpu_suite.run`: every row of a failed case marked, the first line
  of the message, the traceback's tail, the CUDA cache emptied, what JSON cannot hold;
* ``tools/analysis/gpu_suite.py``: ``main`` in-process with the sections replaced by
  stand-ins: section selection, exit code, correctness with missing / failing rows, failures
  recorded, the copy bandwidth and ``--peak-bw`` handed on, the forced backends, the sweep
  budget, the verdicts at the run's target size, printed columns that exist in the rows;
* :mod:`mmlinvit.utils.benchmarking`: what round 11 and ``test_benchmarking`` left open.
"""
import gc
import json
import os
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from mmlinvit.analysis.gpu_suite import metadata, report, sdpa, timing
from mmlinvit.analysis.gpu_suite.metadata import L2_RULE_TOKENS, run_metadata
from mmlinvit.analysis.gpu_suite.run import SuiteRun, write_json_atomic
from mmlinvit.analysis.gpu_suite.sizes import Sizes, dry_sizes, full_sizes
from mmlinvit.utils.cli import load_script

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / 'tools' / 'analysis' / 'gpu_suite.py'
CPU = torch.device('cpu')
CUDA = torch.device('cuda')

_SDP_FLAGS = ('flash', 'mem_efficient', 'cudnn', 'math')


def _sdp_enabled() -> Dict[str, bool]:
    return {b: getattr(torch.backends.cuda, f'{b}_sdp_enabled')() for b in _SDP_FLAGS}


# ----------------------------------------------------------------------------- sdpa


@pytest.mark.parametrize('name, member', [('flash', SDPBackend.FLASH_ATTENTION),
                                          ('cudnn', SDPBackend.CUDNN_ATTENTION)])
def test_sdpa_context_enables_what_torchs_sdpa_kernel_enables(name: str, member: SDPBackend):
    """The table name maps to the same backend flags as torch's own ``sdpa_kernel(member)``;
    ``'default'`` leaves torch's dispatch as it is."""
    before = _sdp_enabled()
    with sdpa_kernel(member):
        want = _sdp_enabled()
    with sdpa.sdpa_context(name):
        got = _sdp_enabled()
    assert got == want
    assert sum(got.values()) == 1  # one fused backend, no fallback
    with sdpa.sdpa_context('default'):
        assert _sdp_enabled() == before
    assert _sdp_enabled() == before


def test_sdpa_unavailable_reports_torchs_reasons_and_raises_real_errors():
    """Flash with unequal head dims is refused on CPU with two UserWarnings and 'No available
    kernel': the reason is torch's warnings (first line each, 160 chars, '; '); cuDNN on CPU
    warns nothing: the exception's first line; a shape error of another op is raised."""
    q = torch.randn(1, 2, 8, 4)
    ragged = lambda: F.scaled_dot_product_attention(q, q[..., :3], q)  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        with pytest.raises(RuntimeError) as err, sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ragged()
    assert 'backend' not in str(err.value) and 'kernel' in str(err.value)
    reasons = [str(w.message).strip().splitlines()[0][:160] for w in caught
               if issubclass(w.category, UserWarning)]
    assert len(set(reasons)) >= 2
    want = ('unavailable: ' + '; '.join(dict.fromkeys(reasons)))[:400]
    assert sdpa.sdpa_unavailable(ragged, 'flash') == want
    assert 'same last dimension' in want

    ok = lambda: F.scaled_dot_product_attention(q, q, q)  # noqa: E731
    assert sdpa.sdpa_unavailable(ok, 'flash') is None
    with pytest.raises(RuntimeError) as err, sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ok()
    assert sdpa.sdpa_unavailable(ok, 'cudnn') == \
        f'unavailable: {str(err.value).splitlines()[0]}'[:400]

    def other_error() -> None:
        torch.bmm(torch.ones(2, 3, 4), torch.ones(2, 5, 6))

    with pytest.raises(RuntimeError, match='batch2'):
        sdpa.sdpa_unavailable(other_error, 'flash')


def test_attention_kernels_names_the_cpu_op_below_sdpa():
    """Profiled on CPU: the op torch ran below ``aten::scaled_dot_product_attention`` (not the
    top-level op itself), and no device kernels."""
    q = torch.randn(1, 2, 8, 4)
    fn = lambda: F.scaled_dot_product_attention(q, q, q)  # noqa: E731
    with sdpa.sdpa_context('flash'):
        got = sdpa.attention_kernels(fn, CPU)
    assert got == {'aten op': 'aten::_scaled_dot_product_flash_attention_for_cpu',
                   'kernel': None}
    with sdpa_kernel(SDPBackend.MATH):
        got = sdpa.attention_kernels(fn, CPU)
    assert got == {'aten op': 'aten::_scaled_dot_product_attention_math', 'kernel': None}


class _FakeProfile:
    """``torch.profiler.profile`` stand-in whose averages are fixed events."""

    events: List[SimpleNamespace] = []
    activities: List[object] = []

    def __init__(self, activities: List[object]) -> None:
        type(self).activities = list(activities)

    def __enter__(self) -> '_FakeProfile':
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def key_averages(self) -> List[SimpleNamespace]:
        return list(self.events)


def _event(key: str, device: str = 'CPU', time_us: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(key=key, device_type=SimpleNamespace(name=device),
                           device_time_total=time_us)


def test_attention_kernels_on_cuda_heaviest_kernel_first(monkeypatch):
    """A memory-efficient dispatch as torch profiles it on CUDA: two aten ops below SDPA (one
    without 'scaled_dot_product' in its name), the softmax kernel (mixed case
    ``cunn_SoftMaxForward``, 80 us) before the fmha kernel (50 us); other kernels left out."""
    softmax = ('void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, '
               'float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>'
               '(float*, float const*, int)')
    fmha = ('fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel'
            '<float, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)')
    _FakeProfile.events = [
        _event('aten::scaled_dot_product_attention'),
        _event('aten::_scaled_dot_product_efficient_attention'),
        _event('aten::_efficient_attention_forward'),
        _event('aten::matmul'),
        _event('cudaLaunchKernel'),
        _event(fmha, 'CUDA', 50.0),
        _event('void at::native::vectorized_elementwise_kernel<4>', 'CUDA', 500.0),
        _event(softmax, 'CUDA', 80.0),
    ]
    import torch.profiler
    monkeypatch.setattr(torch.profiler, 'profile', _FakeProfile)
    monkeypatch.setattr(sdpa, 'synchronize', lambda device: None)
    calls: List[int] = []
    got = sdpa.attention_kernels(lambda: calls.append(1), CUDA)
    assert calls == [1, 1]  # one untimed call, one profiled
    assert torch.profiler.ProfilerActivity.CUDA in _FakeProfile.activities
    assert got['aten op'] == ('aten::_efficient_attention_forward, '
                              'aten::_scaled_dot_product_efficient_attention')
    assert got['kernel'] == f'{softmax[:90]}, {fmha[:90]}'
    sdpa.attention_kernels(lambda: None, CPU)
    assert torch.profiler.ProfilerActivity.CUDA not in _FakeProfile.activities


# ----------------------------------------------------------------------------- metadata


def _smi(monkeypatch, returncode: int, stdout: str, stderr: str) -> List[List[str]]:
    seen: List[List[str]] = []

    def fake_run(cmd: List[str], **kwargs: object) -> SimpleNamespace:
        seen.append(cmd)
        return SimpleNamespace(returncode=returncode, stdout=stdout, stderr=stderr)

    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    monkeypatch.setattr(metadata.shutil, 'which', lambda name: '/usr/bin/' + name)
    monkeypatch.setattr(metadata.subprocess, 'run', fake_run)
    return seen


def test_mig_mode_reads_nvidia_smi(monkeypatch):
    seen = _smi(monkeypatch, 0, 'NVIDIA H200, Disabled\nNVIDIA H200, Enabled\n',
                'a warning on stderr')
    assert metadata.mig_mode() == 'NVIDIA H200, Disabled; NVIDIA H200, Enabled'
    assert 'mig.mode.current' in ' '.join(seen[0])
    _smi(monkeypatch, 9, '', 'NVIDIA-SMI has failed')
    assert metadata.mig_mode() == 'unknown (nvidia-smi: NVIDIA-SMI has failed)'
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', 'MIG-1b2c3d')
    assert metadata.mig_mode().startswith('enabled')
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', 'GPU-1b2c3d')
    assert metadata.mig_mode() == 'unknown (nvidia-smi: NVIDIA-SMI has failed)'
    monkeypatch.setattr(metadata.shutil, 'which', lambda name: None)
    assert metadata.mig_mode() == 'unknown (no nvidia-smi)'


def test_run_metadata_cuda_fields_and_environment(monkeypatch):
    """An H200-like device: 132 SMs, capability 9.0, 140.5 GiB, 60 MiB L2."""
    props = SimpleNamespace(multi_processor_count=132, major=9, minor=0,
                            total_memory=140 * 2**30 + 2**29, L2_cache_size=60 * 2**20)
    monkeypatch.setattr(torch.cuda, 'get_device_properties', lambda device=None: props)
    monkeypatch.setattr(metadata, 'mig_mode', lambda: 'NVIDIA H200, Disabled')
    monkeypatch.setenv('MMLINVIT_LINEAR_ATTN_BACKEND', 'triton')
    monkeypatch.setenv('MMLINVIT_SSD_BACKEND', 'torch')
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    meta = run_metadata('NVIDIA H200', 4.8e12, 'table', CUDA, dry=False)
    assert (meta['sm_count'], meta['capability'], meta['memory_GiB'], meta['l2_MiB'],
            meta['mig']) == (132, '9.0', 140.5, 60.0, 'NVIDIA H200, Disabled')
    assert meta['dry_run'] is False and meta['peak_bw'] == 4.8e12
    assert meta['env'] == {'MMLINVIT_LINEAR_ATTN_BACKEND': 'triton',
                           'MMLINVIT_SSD_BACKEND': 'torch', 'TRITON_INTERPRET': '0'}
    props.L2_cache_size = 0  # torch does not say
    assert run_metadata('x', None, 'y', CUDA, dry=True)['l2_MiB'] is None
    meta = run_metadata('CPU (interpreter)', None, 'y', CPU, dry=True)
    assert meta['dry_run'] is True and meta['mig'] == 'n/a (CPU)'
    assert meta['sm_count'] is None and meta['l2_MiB'] is None


def test_run_metadata_records_each_tf32_flag_of_its_own(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        try:
            torch.backends.cuda.matmul.allow_tf32 = not cudnn
            want_matmul = torch.backends.cuda.matmul.allow_tf32
            meta = run_metadata('x', None, 'y', CPU, dry=True)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = matmul
    assert want_matmul != cudnn
    assert meta['matmul allow_tf32'] == want_matmul and meta['cudnn allow_tf32'] == cudnn
    assert meta['float32_matmul_precision'] == torch.get_float32_matmul_precision()
    assert meta['sdp enabled'] == _sdp_enabled()


def test_l2_bytes_only_asks_cuda_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'get_device_properties',
                        lambda device=None: SimpleNamespace(L2_cache_size=50 * 2**20))
    assert metadata.l2_bytes(CUDA) == 50 * 2**20
    assert metadata.l2_bytes(torch.device('meta')) is None


# ----------------------------------------------------------------------------- report


def test_print_section_prints_the_exact_table(capsys):
    """Columns right-aligned, two spaces apart, no rule; floats with 3 significant digits
    (1234.5 -> 1.23e+03, from 1e4 on whole numbers), None as '-', list and dict columns left
    out; given columns: one present in some rows only is kept, 'skipped' added."""
    rows = [{'N': 64, 'ms': 0.123456, 'rounds': [1.0], 'cfg': {'a': 1}, 'big': 1234.5,
             'x': None},
            {'N': 130, 'ms': 12345.6, 'graph ms': 2.5, 'skipped': 'unavailable: x'}]
    report.print_section('T', rows)
    assert capsys.readouterr().out.splitlines() == [
        'T',
        '    N     ms       big  x  graph ms         skipped',
        '   64  0.123  1.23e+03  -         -               -',
        '  130  12346         -  -       2.5  unavailable: x']
    report.print_section('U', rows, cols=['N', 'graph ms', 'absent'])
    assert capsys.readouterr().out.splitlines() == [
        'U',
        '    N  graph ms         skipped',
        '   64         -               -',
        '  130       2.5  unavailable: x']
    report.print_section('E', [])
    assert capsys.readouterr().out == 'E\n'


class _Recorder:
    """Records every method call made on it (a matplotlib figure / axes stand-in)."""

    def __init__(self) -> None:
        self.calls: List[Tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith('__'):
            raise AttributeError(name)
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))

    def named(self, name: str) -> List[Tuple[tuple, dict]]:
        return [(a, k) for n, a, k in self.calls if n == name]


def _plot(monkeypatch, result: Dict[str, object], dry: bool) -> Tuple[_Recorder, List[_Recorder]]:
    import matplotlib.pyplot as plt
    fig, axes = _Recorder(), [_Recorder() for _ in range(3)]
    monkeypatch.setattr(plt, 'subplots', lambda *a, **k: (fig, axes))
    monkeypatch.setattr(plt, 'close', lambda f: None)
    report.plot(result, 'suite.png', dry)
    return fig, axes


def test_plot_draws_the_sdpa_backends_and_leaves_failed_points_out(monkeypatch):
    la = [{'N': 1024, 'triton ms': 1.0, 'torch ms': 4.0, 'triton f+b ms': 3.0,
           'HBM fwd': 0.5, 'HBM f+b': 0.6},
          {'N': 4096, 'triton ms': 2.0, 'torch ms': None, 'triton f+b ms': 6.0,
           'HBM fwd': 0.7, 'HBM f+b': None, 'error': 'OutOfMemoryError: x'}]
    sdpa_rows = [{'N': 1024, 'sdpa': 'default', 'aten op': 'a', 'ms': 99.0},
                 {'N': 1024, 'sdpa': 'flash', 'ms': 1.5, 'f+b ms': 4.5},
                 {'N': 1024, 'sdpa': 'cudnn', 'skipped': 'unavailable'},
                 {'N': 4096, 'sdpa': 'default', 'aten op': 'a', 'ms': 99.0},
                 {'N': 4096, 'sdpa': 'flash', 'ms': 3.0, 'f+b ms': 9.0}]
    bb = [{'model': 'ViT-L/14 softmax', 'size': '1024x1024', 'ms': 10.0},
          {'model': 'ViT-L/14 elu', 'size': '1024x1024', 'ms': 5.0},
          {'model': 'ViT-L/14 elu', 'size': '2048x2048', 'ms': None, 'error': 'OOM'}]
    result = {'device': 'NVIDIA H200', 'linear_attention': la,
              'linear_attention_sdpa': sdpa_rows, 'backbones': bb}
    fig, (ax0, ax1, ax2) = _plot(monkeypatch, result, dry=False)
    lines = [(list(a[0]), list(a[1]), a[2], k['label']) for a, k in ax0.named('plot')]
    assert lines == [([1024, 4096], [1.0, 2.0], 'o-', 'triton ms'),
                     ([1024], [4.0], 's-', 'torch ms'),
                     ([1024, 4096], [3.0, 6.0], 'o:', 'triton f+b ms'),
                     ([1024, 4096], [1.5, 3.0], 'x--', 'sdpa-flash ms'),
                     ([1024, 4096], [4.5, 9.0], 'x:', 'sdpa-flash f+b ms'),
                     ([], [], 'x--', 'sdpa-cudnn ms'),
                     ([], [], 'x:', 'sdpa-cudnn f+b ms')]
    lines = [(list(a[0]), list(a[1]), k['label']) for a, k in ax1.named('plot')]
    assert lines == [([1024, 4096], [0.5, 0.7], 'fwd'), ([1024], [0.6], 'fwd+bwd')]
    assert [a for a, _ in ax1.named('axhline')] == [(0.7, )]  # the 70 % target
    assert [a for a, _ in ax1.named('axvline')] == [(L2_RULE_TOKENS, )]
    ((args, kwargs), ) = ax2.named('bar')
    assert list(args[0]) == [0, 1] and list(args[1]) == [10.0, 5.0]
    assert kwargs['color'] == ['C0', 'C1']  # softmax, linear
    ((args, _), ) = ax2.named('set_xticks')
    assert list(args[1]) == ['ViT-L/14 softmax\n1024x1024', 'ViT-L/14 elu\n1024x1024']
    assert fig.named('suptitle') == [(('NVIDIA H200 (bf16)', ), {})]
    assert fig.named('savefig') == [(('suite.png', ), {'dpi': 100})]
    fig, _ = _plot(monkeypatch, {'device': 'CPU (interpreter)'}, dry=True)
    assert fig.named('suptitle') == [(('CPU (interpreter) (dry run: timings meaningless)', ),
                                      {})]


# ----------------------------------------------------------------------------- sizes


def _doc_section(number: str) -> str:
    doc = SUITE.read_text().split('"""')[1]
    return ' '.join(doc.split(f'\n{number}. ', 1)[1].split('\n\n')[0].split('\n')[:12])


def test_full_sizes_are_the_ones_the_tool_documents():
    """Section 2: 1k-64k tokens; section 3: Adventurer-B's SSD shape (the Mamba-2 mixer of
    its 768-dim blocks) up to 64k tokens; section 4: ViT-L/14 at 518, 1024, 2048 and the pairs
    at 512x1024 and 1024x2048."""
    from mmlinvit.backbones.adventurer import ADVENTURER_SIZES
    from mmlinvit.layers.mamba2 import Mamba2Mixer
    sizes = full_sizes()
    assert '1k-64k tokens' in _doc_section('2')
    assert (min(sizes.la_bench_tokens), max(sizes.la_bench_tokens)) == (1024, 65536)
    assert sizes.la_bench_tokens == [1024, 4096, 16384, 65536]
    mixer = Mamba2Mixer(ADVENTURER_SIZES['b']['embed_dims'])
    assert sizes.ssd_shape == dict(heads=mixer.nheads, headdim=mixer.headdim,
                                   d_state=mixer.d_state, groups=mixer.ngroups,
                                   chunk=mixer.chunk_size)
    assert 'H=24, P=64, N=64, chunk 256' in _doc_section('3')
    assert '64k tokens' in _doc_section('3') and max(sizes.ssd_bench_lengths) == 65536
    assert '518, 1024, 2048' in _doc_section('4')
    assert sizes.vit_l_sizes == [(518, 518), (1024, 1024), (2048, 2048)]
    assert '512x1024 and 1024x2048' in _doc_section('4')
    assert sizes.pair_sizes == [(512, 1024), (1024, 2048)]


@pytest.mark.parametrize('make', [full_sizes, dry_sizes])
def test_checks_are_what_their_names_say(make: Callable[[], Sizes]):
    """Ragged token counts / lengths (not multiples of a 16 block or of the SSD chunk), cross
    attention with N != M, the head sizes, fp32 and the trained InLine mode as named."""
    import re
    sizes = make()
    assert all(n % 16 for n in sizes.la_check_tokens)
    assert any(length % sizes.ssd_shape['chunk'] for length in sizes.ssd_check_lengths)
    for name, n, m, h, d, e, dtype, mode in sizes.extra_la_cases:
        assert ('cross' in name) == (n != m), name
        assert ('fp32' in name) == (dtype == torch.float32), name
        assert ('trained' in name) == (mode == 'inline trained'), name
        assert name.split()[0] == mode.split()[0], name
        if 'ragged' in name:
            assert n % 16 and m % 16, name
        got = re.search(r'd=(?:e=)?(\d+)(?: e=(\d+))?', name)
        if got:
            assert (d, e) == (int(got.group(1)), int(got.group(2) or got.group(1))), name


# ----------------------------------------------------------------------------- timing


class _Clock:
    """A device clock in ms and CUDA events that read it."""

    def __init__(self) -> None:
        self.now = 0.0

    def event(self, enable_timing: bool = False) -> SimpleNamespace:
        assert enable_timing
        ev = SimpleNamespace(at=None)
        ev.record = lambda: setattr(ev, 'at', self.now)
        ev.synchronize = lambda: None
        ev.elapsed_time = lambda end: end.at - ev.at
        return ev


def _fake_graphs(monkeypatch, clock: _Clock, log: List[str],
                 duration: Callable[[str, int], float]) -> None:
    """capture_graph returns graphs whose replay logs the name and advances the clock by
    ``duration(name, replays of that name so far)``."""
    def capture(fn: Callable[[], object], device: torch.device) -> SimpleNamespace:
        name = fn()

        def replay() -> None:
            clock.now += duration(name, log.count(name))
            log.append(name)
        return SimpleNamespace(replay=replay)

    monkeypatch.setattr(timing, 'capture_graph', capture)
    monkeypatch.setattr(torch.cuda, 'Event', clock.event)
    monkeypatch.setattr(torch.cuda, 'empty_cache', lambda: None)


def test_graph_rounds_replay_round_robin_and_time_per_replay(monkeypatch):
    clock, log = _Clock(), []
    _fake_graphs(monkeypatch, clock, log, lambda name, i: {'a': 1.5, 'b': 4.0}[name])
    times, failed = timing.graph_rounds({'a': lambda: 'a', 'b': lambda: 'b'}, CUDA,
                                        {'a': 2, 'b': 3}, rounds=2)
    assert log == ['a', 'a', 'b', 'b', 'b'] * 2
    assert times == {'a': [1.5, 1.5], 'b': [4.0, 4.0]} and failed == {}


def test_graph_ms_and_try_graph_ms_take_the_median_round(monkeypatch):
    """Replays of round r take ms[r]: graph_ms (2 replays x 3 rounds) -> median 2 of
    [1, 9, 2]; try_graph_ms after a 50 ms eager call: 200 // 50 = 4 replays x 5 rounds ->
    median 3 of [1, 9, 2, 8, 3]."""
    clock, log = _Clock(), []
    per_round = [1.0, 9.0, 2.0]
    _fake_graphs(monkeypatch, clock, log, lambda name, i: per_round[i // 2])
    assert timing.graph_ms(lambda: 'f', CUDA, replays=2, rounds=3) == 2.0
    assert len(log) == 6
    clock, log = _Clock(), []
    per_round = [1.0, 9.0, 2.0, 8.0, 3.0]
    _fake_graphs(monkeypatch, clock, log, lambda name, i: per_round[i // 4])
    assert timing.try_graph_ms(lambda: 'f', CUDA, eager_ms=50.0) == (3.0, None)
    assert len(log) == 20
    clock, log = _Clock(), []
    _fake_graphs(monkeypatch, clock, log, lambda name, i: 1.0)
    assert timing.graph_ms(lambda: 'f', CUDA) == 1.0
    assert len(log) == 20 * 5  # defaults: 20 replays (replays_for(None)) x 5 rounds
    assert timing.replays_for(None) == 20


def test_graph_ms_raises_and_try_graph_ms_reports_a_failed_capture(monkeypatch, capsys):
    def capture(fn: Callable[[], object], device: torch.device) -> None:
        raise RuntimeError('operation not permitted when stream is capturing')

    monkeypatch.setattr(timing, 'capture_graph', capture)
    monkeypatch.setattr(torch.cuda, 'empty_cache', lambda: None)
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda device=None: None)
    with pytest.raises(RuntimeError, match='CUDA graph capture failed: RuntimeError: '
                                           'operation not permitted'):
        timing.graph_ms(lambda: None, CUDA)
    assert timing.try_graph_ms(lambda: None, CUDA, 5.0) == (
        None, 'capture failed: RuntimeError: operation not permitted when stream is capturing')
    assert 'CUDA graph capture failed' in capsys.readouterr().out


def test_capture_graph_warms_up_twice_on_a_side_stream_then_captures_and_replays(monkeypatch):
    log: List[str] = []
    state = {'stream': 'main', 'capturing': False}

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait_stream(self, other: 'Stream') -> None:
            log.append(f'{self.name} waits {other.name}')

    main, side = Stream('main'), Stream('side')

    class StreamContext:
        def __init__(self, stream: Stream) -> None:
            self.stream = stream

        def __enter__(self) -> None:
            state['stream'] = self.stream.name

        def __exit__(self, *exc: object) -> None:
            state['stream'] = 'main'

    class Graph:
        def replay(self) -> None:
            log.append('replay')

    class GraphContext:
        def __init__(self, graph: Graph) -> None:
            pass

        def __enter__(self) -> None:
            state['capturing'] = True

        def __exit__(self, *exc: object) -> None:
            state['capturing'] = False

    monkeypatch.setattr(torch.cuda, 'Stream', lambda device=None: side)
    monkeypatch.setattr(torch.cuda, 'current_stream', lambda device=None: main)
    monkeypatch.setattr(torch.cuda, 'stream', StreamContext)
    monkeypatch.setattr(torch.cuda, 'CUDAGraph', Graph)
    monkeypatch.setattr(torch.cuda, 'graph', GraphContext)
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda device=None: log.append('sync'))

    def fn() -> None:
        log.append('capture' if state['capturing'] else f'call on {state["stream"]}')

    graph = timing.capture_graph(fn, CUDA)
    assert isinstance(graph, Graph)
    assert log == ['side waits main', 'call on side', 'call on side', 'main waits side',
                   'capture', 'replay', 'sync']


def test_cuda_warmups_sync_and_round_robin(monkeypatch):
    """CUDA: two warm-ups of each function, the device synchronized, then rounds of one call
    of each; the per-round times go to the function that was timed."""
    log: List[str] = []
    ms: Iterator[float] = iter([1.0, 2.0, 3.0, 4.0])

    def time_call(fn: Callable[[], object], device: torch.device) -> float:
        fn()
        return next(ms)

    monkeypatch.setattr(timing, 'time_call_ms', time_call)
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda device=None: log.append('sync'))
    fns = {name: (lambda name=name: log.append(name)) for name in ('a', 'b')}
    times = timing.eager_rounds(fns, CUDA, 2)
    assert log == ['a', 'a', 'b', 'b', 'sync', 'a', 'b', 'a', 'b']
    assert times == {'a': [1.0, 3.0], 'b': [2.0, 4.0]}

    seen: Dict[str, object] = {}

    def round_robin(fns: Dict[str, Callable[[], object]], device: torch.device, repeats: int,
                    warmups: int = 1) -> Dict[str, float]:
        seen.update(repeats=repeats, warmups=warmups)
        return {'fn': 7.0}

    monkeypatch.setattr(timing, 'time_round_robin', round_robin)
    assert timing.bench_ms(lambda: None, CUDA, 9) == 7.0
    assert seen == {'repeats': 9, 'warmups': 2}
    assert timing.bench_ms(lambda: None, CPU, 9) == 7.0 and seen['warmups'] == 1


def test_peak_mib_on_cuda_is_the_peak_of_cuda_peak_memory(monkeypatch):
    monkeypatch.setattr(timing, 'cuda_peak_memory', lambda fn, device: (64.0, fn()))
    assert timing.peak_mib(lambda: 'out', CUDA) == 64.0


# ----------------------------------------------------------------------------- run


def test_failed_case_marks_every_row_with_the_first_line_and_keeps_the_tail(tmp_path):
    run = SuiteRun(CPU)
    assert run.dry is False
    run.path = str(tmp_path / 'suite.json')
    rows = [{'N': 1, 'sdpa': 'default'}, {'N': 1, 'sdpa': 'flash'}]

    def body() -> None:
        raise ValueError('first line\n' + 'y' * 4000 + '\nLAST')

    assert run.run_case('la sdpa N=1', rows, body) is False
    assert [r['error'] for r in rows] == ['ValueError: first line'] * 2
    trace = run.result['errors']['la sdpa N=1']
    assert len(trace) == 3000 and trace.rstrip().endswith('LAST')
    saved = json.loads((tmp_path / 'suite.json').read_text())
    assert saved['errors'] == run.result['errors']


def test_failed_case_on_cuda_empties_the_cache_a_good_one_does_not(monkeypatch):
    log: List[str] = []
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda device=None: log.append('sync'))
    monkeypatch.setattr(torch.cuda, 'empty_cache', lambda: log.append('empty_cache'))
    run = SuiteRun(CUDA)
    assert run.run_case('good', [{}], lambda: None) and log == []

    def oom() -> None:
        raise torch.cuda.OutOfMemoryError('CUDA out of memory')

    assert not run.run_case('bad', [{}], oom)
    assert log == ['sync', 'empty_cache']


def test_json_writes_what_json_cannot_hold_as_str(tmp_path):
    path = tmp_path / 'suite.json'
    write_json_atomic(str(path), {'device': torch.device('cuda', 1), 'out': Path('/x/y'),
                                  'dtype': torch.bfloat16, 'sizes': (1, 2)})
    assert json.loads(path.read_text()) == {'device': 'cuda:1', 'out': '/x/y',
                                            'dtype': 'torch.bfloat16', 'sizes': [1, 2]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ['suite.json']


# ----------------------------------------------------------------------------- the tool


class _Sections:
    """Stand-ins for the tool's sections: each records its call and fills fixed rows.

    Args:
        la_ok / ssd_ok: The ``ok`` of the check rows (None: no row).
        fail: The name of a section that raises.
        json_path: ``suite.json``, read at the start of each section (what was saved before).
    """

    def __init__(self, json_path: Path, la_ok: Optional[str] = 'PASS',
                 ssd_ok: Optional[str] = 'PASS', fail: Optional[str] = None) -> None:
        self.json_path, self.la_ok, self.ssd_ok, self.fail = json_path, la_ok, ssd_ok, fail
        self.calls: List[str] = []
        self.seen: Dict[str, object] = {}
        self.saved_before: Dict[str, List[str]] = {}

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        saved = json.loads(self.json_path.read_text()) if self.json_path.exists() else {}
        self.saved_before[name] = sorted(saved)
        if name == self.fail:
            raise RuntimeError(f'{name} broke')

    def ceilings(self, device: torch.device) -> Dict[str, float]:
        self._enter('ceilings')
        return {'copy TB/s': 3.5, 'bf16 matmul TFLOP/s': 700.0}

    def check(self, run: SuiteRun, sizes: Sizes, la_rows: list, ssd_rows: list) -> None:
        self._enter('check')
        if self.la_ok:
            la_rows.append({'kernel': 'linear-attn', 'case': 'elu', 'ok': self.la_ok})
        if self.ssd_ok:
            ssd_rows.append({'kernel': 'ssd', 'case': 'adventurer', 'ok': self.ssd_ok})

    def la(self, run: SuiteRun, sizes: Sizes, peak_bw: Optional[float], rows: list,
           sdpa_rows: list) -> None:
        self._enter('la')
        self.seen.update(copy_bw=run.copy_bw, peak_bw=peak_bw)
        rows.append({'N': 64, 'triton ms': 1.0})

    def ssd(self, run: SuiteRun, sizes: Sizes, rows: list) -> None:
        self._enter('ssd')
        rows.append({'L': 48, 'triton ms': 1.0})

    def backbones(self, run: SuiteRun, sizes: Sizes, rows: list) -> None:
        """A ViT-L/14 pair at the run's target size: 2x faster, 30 % of the memory."""
        self._enter('backbones')
        size = f'{sizes.vit_l_target[0]}x{sizes.vit_l_target[1]}'
        base = dict(pair='ViT-L/14', size=size, ms=2.0, **{'act MiB': 10.0})
        rows += [dict(base, model='ViT-L/14 softmax', role='softmax'),
                 dict(base, model='ViT-L/14 softmax [flash]', role='softmax-flash'),
                 dict(base, model='ViT-L/14 elu', role='linear', ms=1.0, **{
                     'act MiB': 3.0, 'speed x': 2.0, 'speed x flash': 2.0,
                     'mem frac': 0.3})]

    def profile(self, run: SuiteRun, sizes: Sizes, out: dict) -> None:
        self._enter('profile')

    def sweeps(self, run: SuiteRun, sizes: Sizes, deadline: float,
               kernels: Tuple[str, ...]) -> Dict[str, list]:
        self._enter('sweeps')
        self.seen.update(budget_left=deadline - time.perf_counter(), kernels=kernels)
        return {}


def _main(monkeypatch, tmp_path: Path, argv: List[str], plot_error: bool = False,
          **behaviour: object) -> Tuple[int, Dict[str, object], _Sections]:
    """The tool's ``main(['--dry-run', '--out-dir', tmp_path] + argv)`` with stand-in sections."""
    monkeypatch.setattr(sys, 'path', list(sys.path))  # the script inserts the repository
    suite = load_script(str(SUITE), 'gpu_suite_round13')
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    for var in ('MMLINVIT_LINEAR_ATTN_BACKEND', 'MMLINVIT_SSD_BACKEND'):
        # main() forces the kernels (os.environ[var] = 'triton'): registered with monkeypatch
        # (setenv records the value to restore) so that later tests keep their backends
        monkeypatch.setenv(var, os.environ.get(var, ''))
        if var not in behaviour.get('keep_env', ()):
            monkeypatch.delenv(var)
    monkeypatch.setattr(torch, 'set_num_threads', lambda n: None)
    sections = _Sections(tmp_path / 'suite.json',
                         **{k: v for k, v in behaviour.items() if k != 'keep_env'})
    for attr, name in (('section_ceilings', 'ceilings'), ('section_check', 'check'),
                       ('section_linear_attention', 'la'), ('section_ssd', 'ssd'),
                       ('section_backbones', 'backbones'), ('section_profile', 'profile'),
                       ('section_sweeps', 'sweeps')):
        monkeypatch.setattr(suite, attr, getattr(sections, name))

    def plot(result: Dict[str, object], path: str, dry: bool) -> None:
        if plot_error:
            raise ValueError('no display')
        Path(path).write_bytes(b'png')

    monkeypatch.setattr(suite, 'plot', plot)
    code = suite.main(['--dry-run', '--out-dir', str(tmp_path)] + argv)
    return code, json.loads((tmp_path / 'suite.json').read_text()), sections


def test_main_runs_every_section_in_order_and_saves_after_each(monkeypatch, tmp_path):
    """The ceilings' copy bandwidth and the dry run's nominal peak reach section 2; the JSON
    on disk holds each section's result before the next one starts."""
    from mmlinvit.analysis.gpu_suite.metadata import DRY_RUN_PEAK_BW
    code, result, sections = _main(monkeypatch, tmp_path, [])
    assert code == 0 and result['errors'] == {} and result['correctness_ok'] is True
    assert sections.calls == ['ceilings', 'check', 'la', 'ssd', 'backbones', 'profile',
                              'sweeps']
    assert sections.seen['copy_bw'] == 3.5 and sections.seen['peak_bw'] == DRY_RUN_PEAK_BW
    assert 'ceilings' in sections.saved_before['check']
    assert 'linear_attention' in sections.saved_before['ssd']
    assert 'backbones' in sections.saved_before['profile']
    assert sections.seen['kernels'] == ('la', 'ssd')


def test_main_runs_only_the_chosen_sections(monkeypatch, tmp_path):
    """Without the check section the run is not failed for it (exit 0)."""
    code, result, sections = _main(monkeypatch, tmp_path, ['--sections', 'la', 'ssd'])
    assert sections.calls == ['la', 'ssd']
    assert code == 0 and result['correctness_ok'] is True
    assert result['args']['sections'] == ['la', 'ssd'] and result['args']['dry_run'] is True
    for key in ('ceilings', 'check_linear_attention', 'backbones', 'profile', 'sweeps'):
        assert key not in result
    assert sections.seen['copy_bw'] is None  # no ceilings measured


@pytest.mark.parametrize('la_ok, ssd_ok', [(None, None), ('PASS', 'FAIL'), ('FAIL', 'PASS')])
def test_main_fails_correctness_without_rows_or_with_a_failed_check(
        monkeypatch, tmp_path, capsys, la_ok: Optional[str], ssd_ok: Optional[str]):
    code, result, _ = _main(monkeypatch, tmp_path, [], la_ok=la_ok, ssd_ok=ssd_ok)
    assert code == 1 and result['correctness_ok'] is False
    assert 'correctness FAILED' in capsys.readouterr().out


def test_main_records_a_failed_section_and_runs_the_next(monkeypatch, tmp_path):
    code, result, sections = _main(monkeypatch, tmp_path, [], fail='la')
    assert code == 1 and result['correctness_ok'] is True
    assert list(result['errors']) == ['la'] and 'RuntimeError: la broke' in result['errors']['la']
    assert sections.calls[-4:] == ['ssd', 'backbones', 'profile', 'sweeps']


def test_main_records_a_failed_plot(monkeypatch, tmp_path):
    code, result, _ = _main(monkeypatch, tmp_path, [], plot_error=True)
    assert code == 1 and 'ValueError: no display' in result['errors']['plot']


def test_main_hands_on_peak_bw_and_the_sweep_options(monkeypatch, tmp_path):
    code, result, sections = _main(monkeypatch, tmp_path, [
        '--peak-bw', '2e12', '--sweep-budget-s', '7', '--sweep-kernels', 'ssd'])
    assert code == 0
    assert sections.seen['peak_bw'] == 2e12
    assert (result['peak_bw'], result['peak_bw_source']) == (2e12, '--peak-bw')
    assert 0 < sections.seen['budget_left'] <= 7 and sections.seen['kernels'] == ('ssd', )


def test_main_forces_the_triton_backends(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv('MMLINVIT_LINEAR_ATTN_BACKEND', 'torch')
    code, result, _ = _main(monkeypatch, tmp_path, ['--sections', 'la'],
                            keep_env=('MMLINVIT_LINEAR_ATTN_BACKEND', ))
    assert code == 0
    assert result['env']['MMLINVIT_LINEAR_ATTN_BACKEND'] == 'triton'
    assert result['env']['MMLINVIT_SSD_BACKEND'] == 'triton'
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith('note:')]
    assert notes == ['note: MMLINVIT_LINEAR_ATTN_BACKEND=torch overridden with triton']


def test_main_judges_the_targets_at_the_runs_target_size(monkeypatch, tmp_path):
    """The dry run's ViT-L/14 target is 42x42: its speed and memory lines are there."""
    code, result, _ = _main(monkeypatch, tmp_path, ['--sections', 'backbones'])
    assert dry_sizes().vit_l_target == (42, 42)
    lines = result['verdicts']
    assert len(lines) == 3 and all('42x42' in line for line in lines)
    assert 'SPEED' in lines[0] and 'MEMORY' in lines[-1]


def test_triton_interpret_zero_is_not_the_interpreter(monkeypatch):
    """Triton reads TRITON_INTERPRET=0 as off: the GPU run then stops for want of CUDA, not
    for the interpreter; =1 is refused; --dry-run needs =1."""
    monkeypatch.setattr(sys, 'path', list(sys.path))
    suite = load_script(str(SUITE), 'gpu_suite_round13')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    with pytest.raises(SystemExit, match='no CUDA device'):
        suite.main([])
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    with pytest.raises(SystemExit, match='TRITON_INTERPRET=1 is set'):
        suite.main([])
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    with pytest.raises(SystemExit, match='--dry-run needs TRITON_INTERPRET=1'):
        suite.main(['--dry-run'])


def test_printed_columns_are_keys_the_sections_write(monkeypatch):
    """Every column of the section 2 tables names a key of section 2's rows (CPU, timers
    fixed); every non-graph column of the backbone tables a key of section 4's rows (graph
    columns need CUDA)."""
    from mmlinvit.analysis.gpu_suite import backbone_sections, op_sections
    from mmlinvit.ops.linear_attention import linear_attention_torch
    monkeypatch.setattr(sys, 'path', list(sys.path))
    suite = load_script(str(SUITE), 'gpu_suite_round13')
    fake = SimpleNamespace(linear_attention_triton=linear_attention_torch)
    monkeypatch.setattr(op_sections, 'triton_kernels', lambda device: (fake, fake))
    monkeypatch.setattr(op_sections, 'bench_ms', lambda fn, device, repeats: 2.0)
    monkeypatch.setattr(op_sections, 'try_graph_ms', lambda fn, device, eager_ms=None: (1.0, None))
    sizes = dry_sizes()
    sizes.la_bench_tokens = [32]
    run = SuiteRun(CPU, dry=True)
    run.copy_bw = 1e-5
    rows: List[Dict[str, object]] = []
    sdpa_rows: List[Dict[str, object]] = []
    op_sections.section_linear_attention(run, sizes, 2e7, rows, sdpa_rows)
    assert run.result['errors'] == {}
    assert set(suite.LA_COLS) <= set(rows[0])
    assert set(suite.SDPA_COLS) <= {k for r in sdpa_rows for k in r}

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block_list = torch.nn.ModuleList([torch.nn.Identity()])

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return self.block_list[0](images.flatten(2).transpose(1, 2))

    members = [('ViT-L/14 softmax', 'softmax', Tiny, 'default'),
               ('ViT-L/14 softmax [flash]', 'softmax-flash', 'ViT-L/14 softmax', 'flash'),
               ('ViT-L/14 elu', 'linear', Tiny, None)]
    monkeypatch.setattr(backbone_sections, 'backbone_pairs',
                        lambda sizes: [('ViT-L/14', (2, 3), members)])
    monkeypatch.setattr(backbone_sections, 'attention_kernels',
                        lambda fn, device: {'aten op': 'a', 'kernel': None})
    monkeypatch.setattr(backbone_sections, 'eager_rounds', lambda fns, device, repeats: {
        name: [1.0] for name in fns})
    bb_rows: List[Dict[str, object]] = []
    backbone_sections.section_backbones(SuiteRun(CPU, dry=True), sizes, bb_rows)
    keys = {k for r in bb_rows for k in r}
    assert {c for c in suite.BB_COLS if not c.startswith('graph')} <= keys
    assert set(suite.BB_KERNEL_COLS) <= keys


# ----------------------------------------------------------------------------- benchmarking


def test_proc_status_mib_wants_the_whole_key():
    """'VmRS' is a prefix of 'VmRSS', 'Rss' of 'RssAnon': neither is a key of its own."""
    from mmlinvit.utils.benchmarking import proc_status_mib
    if not os.path.exists('/proc/self/status'):
        pytest.skip('needs Linux /proc')
    assert proc_status_mib('VmRSS') > 0
    for part in ('VmRS', 'Rss', 'Vm'):
        with pytest.raises(RuntimeError, match=f'{part} not found'):
            proc_status_mib(part)


def test_print_table_widens_a_column_for_a_long_missing_text(capsys):
    from mmlinvit.utils.benchmarking import print_table
    print_table(['a', 'b'], [{'b': 'x'}], missing='n/a')
    assert capsys.readouterr().out.splitlines() == ['  a  b', '---  -', 'n/a  x']


def test_cpu_peak_memory_resets_the_peak_mark_before_the_call():
    """A 256 MiB tensor freed before the call raised VmHWM; with the mark reset
    (/proc/self/clear_refs = 5) an empty call measures ~0 MiB, not the old peak."""
    from mmlinvit.utils.benchmarking import CpuPeakMemory, proc_status_mib
    probe = CpuPeakMemory(fresh_process=False)
    if not probe.can_reset:
        pytest.skip('/proc/self/clear_refs not writable')
    big = torch.ones(64 * 2**20)  # 256 MiB, its own mapping (above any mmap threshold)
    del big
    gc.collect()
    assert proc_status_mib('VmHWM') - proc_status_mib('VmRSS') > 200  # the old peak
    mib, out = probe.measure(lambda: 'done')
    assert out == 'done' and mib < 32


def test_cpu_peak_memory_trims_freed_heap_memory_before_the_call():
    """128 MiB of 32 KiB tensors (heap, not mapped on their own) freed below a live one stay
    resident unless handed back (malloc_trim); a call allocating them again then needs new
    pages: ~128 MiB, not ~0."""
    from mmlinvit.utils.benchmarking import CpuPeakMemory
    if not os.path.exists('/proc/self/status'):
        pytest.skip('needs Linux /proc')
    probe = CpuPeakMemory(fresh_process=False)
    if probe._libc is None:
        pytest.skip('no libc')
    pieces = [torch.ones(8192) for _ in range(4096)]
    pin = torch.ones(8192)  # above the freed pieces: the heap cannot shrink on its own
    del pieces
    gc.collect()
    mib, out = probe.measure(lambda: [torch.ones(8192) for _ in range(4096)])
    assert len(out) == 4096 and mib > 96
    del out, pin


# ----------------------------------------------------------------------------- finding (fixed)


@pytest.mark.parametrize('value', ['', '0', '1', 'true', 'TRUE', 'on', 'yes', 'false', 'off',
                                   'no'])
def test_interpreter_requested_reads_the_variable_as_triton_does(monkeypatch, value: str):
    """Reference: ``triton.knobs.runtime.interpret``, what triton itself does with the value.

    Failed before round 13 for 'false', 'off' and 'no' (``strip() not in ('', '0')``): the
    GPU run stopped with 'TRITON_INTERPRET=false is set: the Triton kernels would run in the
    CPU interpreter', which they would not.
    """
    knobs = pytest.importorskip('triton.knobs')
    monkeypatch.setattr(sys, 'path', list(sys.path))
    suite = load_script(str(SUITE), 'gpu_suite_round13')
    monkeypatch.setenv('TRITON_INTERPRET', value)
    assert suite._interpreter_requested() is bool(knobs.runtime.interpret)
