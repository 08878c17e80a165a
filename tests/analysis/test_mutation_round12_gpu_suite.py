"""Mutation round 12: the GPU suite's numbers and verdicts, checked on CPU by hand.

The suite runs once on a rented GPU; a wrong fraction of peak bandwidth, a ratio in the wrong
direction, a target judged at the wrong threshold or a tolerance that passes a wrong kernel
would waste that run.  These tests pin the pure functions (ratios, spreads, verdicts, replay
counts, the bytes-moved formulas of section 2, the check tolerances) to values computed by
hand, with the timers replaced by fixed numbers.
"""
from types import SimpleNamespace
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
import torch

from mmlinvit.analysis import kernel_checks
from mmlinvit.analysis.gpu_suite import op_sections, report, sweeps, timing
from mmlinvit.analysis.gpu_suite.backbone_sections import backbone_pairs, block_tokens
from mmlinvit.analysis.gpu_suite.metadata import (L2_RULE_TOKENS, PEAK_BW, l2_bytes,
                                                  peak_bandwidth)
from mmlinvit.analysis.gpu_suite.run import SuiteRun
from mmlinvit.analysis.gpu_suite.sizes import Sizes, dry_sizes, full_sizes
from mmlinvit.analysis.gpu_suite.verdicts import backbone_ratios, ratio, spread, verdicts
from mmlinvit.analysis.kernel_checks import check_linear_attention, check_ssd

CPU = torch.device('cpu')


# ----------------------------------------------------------------------------- ratios


def test_ratio_is_num_over_den_and_none_when_missing():
    assert ratio(6.0, 3.0) == 2.0
    assert ratio(3.0, 6.0) == 0.5
    assert ratio(None, 3.0) is None and ratio(3.0, None) is None
    assert ratio(0.0, 3.0) is None and ratio(3.0, 0.0) is None


def test_spread_is_min_median_max():
    assert spread([3.0, 1.0, 2.0]) == [1.0, 2.0, 3.0]
    assert spread([1.0, 2.0, 3.0, 10.0]) == [1.0, 2.5, 10.0]  # median of an even count
    assert spread([]) is None


def _bb_row(model: str, role: str, ms: Optional[float], mem: Optional[float],
            pair: str = 'ViT-L/14', size: str = '1024x1024', **extra: object
            ) -> Dict[str, object]:
    return dict(pair=pair, model=model, role=role, size=size, ms=ms, **{'act MiB': mem},
                **extra)


def test_backbone_ratios_direction_baseline_and_memory_against_the_default_softmax():
    """speed x = baseline ms / model ms (> 1: the model is faster); memory only against the
    default-dispatch softmax model; another pair's softmax of the same size is no baseline."""
    rows = [
        _bb_row('ViT-B/16 softmax', 'softmax', 1.0, 1.0, pair='B-pair'),  # decoy
        _bb_row('ViT-L/14 softmax', 'softmax', 12.0, 200.0, **{
            'graph ms': 9.0, 'graph rounds ms': [8.0, 9.0, 12.0]}),
        _bb_row('ViT-L/14 softmax [flash]', 'softmax-flash', 8.0, 100.0, **{
            'graph ms': 6.0, 'graph rounds ms': [6.0, 6.0, 6.0]}),
        _bb_row('ViT-L/14 elu', 'linear', 4.0, 50.0, **{
            'graph ms': 3.0, 'graph rounds ms': [2.0, 3.0, 4.0],
            'eager rounds ms': [4.0, 4.0]}),
    ]
    rows[1]['eager rounds ms'] = [12.0, 12.0, 12.0]  # 3 != 2 rounds: no eager spread
    backbone_ratios(rows)
    elu = rows[3]
    assert elu['speed x'] == pytest.approx(3.0)
    assert elu['graph speed x'] == pytest.approx(3.0)
    assert elu['speed x flash'] == pytest.approx(2.0)
    assert elu['graph speed x flash'] == pytest.approx(2.0)
    assert elu['graph speed x spread'] == pytest.approx([3.0, 3.0, 4.0])  # 8/2, 9/3, 12/4
    assert elu['graph speed x flash spread'] == pytest.approx([1.5, 2.0, 3.0])
    assert 'eager speed x spread' not in elu
    assert elu['mem frac'] == pytest.approx(0.25)  # 50 / 200, not 50 / 100 (flash)
    flash = rows[2]
    assert flash['speed x'] == pytest.approx(1.5) and flash['mem frac'] == pytest.approx(0.5)
    assert 'speed x flash' not in flash  # only linear rows are set against flash
    for base in rows[:2]:
        assert 'speed x' not in base and 'mem frac' not in base


def test_backbone_ratios_failed_baseline_gives_none():
    rows = [_bb_row('ViT-L/14 softmax', 'softmax', None, None),
            _bb_row('ViT-L/14 elu', 'linear', 4.0, 50.0)]
    backbone_ratios(rows)
    assert rows[1]['speed x'] is None and rows[1]['mem frac'] is None


# ----------------------------------------------------------------------------- verdicts


def _la(n: int, in_l2: str, hbm: Optional[float], source: str = 'graph/graph'
        ) -> Dict[str, object]:
    return {'N': n, 'in L2': in_l2, 'HBM fwd': hbm, 'BW from': source}


def _elu_rows(speed: Optional[float], graph_speed: Optional[float], mem: Optional[float],
              size: str = '1024x1024') -> List[Dict[str, object]]:
    base = dict(pair='ViT-L/14', size=size, ms=10.0)
    return [dict(base, model='ViT-L/14 softmax', role='softmax', kernel='cudnn_sdpa'),
            dict(base, model='ViT-L/14 softmax [flash]', role='softmax-flash',
                 kernel='flash_fwd'),
            dict(base, model='ViT-L/14 elu', role='linear', **{
                'speed x': speed, 'graph speed x': graph_speed, 'speed x flash': speed,
                'graph speed x flash': graph_speed, 'mem frac': mem, 'act MiB': 40.0})]


def test_bandwidth_verdict_takes_the_worst_hbm_row_at_70_percent():
    """Only rows with N >= 16k and a working set beyond L2 count; 70 % exactly is met."""
    rows = [_la(4096, 'no', 0.1), _la(16384, 'yes', 0.2), _la(16384, 'no', 0.7),
            _la(65536, 'no', 0.8)]
    line = verdicts(rows, [])[0]
    assert 'min 70% of peak at N=16384' in line and line.endswith(': met')
    assert 'CUDA graph replay' in line
    rows = [_la(16384, 'no', 0.75), _la(65536, 'no', 0.69, 'eager/graph')]
    line = verdicts(rows, [])[0]
    assert 'min 69% of peak at N=65536' in line and line.endswith('NOT met')
    assert 'EAGER' in line
    assert verdicts([_la(16384, 'no', None)], [])[0].endswith('not measured (see the errors / '
                                                              '--peak-bw)')
    assert verdicts([_la(4096, 'no', 0.1)], []) == []


@pytest.mark.parametrize('value, judged', [(1.7, 'met'), (1.69, 'NOT met'), (2.5, 'met')])
def test_speed_verdict_threshold_is_1_7x(value: float, judged: str):
    lines = verdicts([], _elu_rows(value, value, 0.3))
    flash, default, memory = lines
    for line in (flash, default):
        assert f'CUDA graph replay: {value:.2f}x -> {judged};' in line
        assert line.endswith(f'eager: {value:.2f}x -> {judged}')
    assert 'FlashAttention' in flash and '[flash_fwd]' in flash
    assert 'default SDPA' in default and '[cudnn_sdpa]' in default


@pytest.mark.parametrize('mem, judged', [(0.4, 'met'), (0.41, 'NOT met'), (0.1, 'met')])
def test_memory_verdict_threshold_is_40_percent(mem: float, judged: str):
    memory = verdicts([], _elu_rows(2.0, 2.0, mem))[-1]
    assert f'= {mem:.0%} of the softmax' in memory and memory.endswith(f': {judged}')
    assert 'activations 40 MiB' in memory


def test_verdicts_at_the_target_size_only_and_missing_baselines():
    rows = _elu_rows(2.0, 2.0, 0.3, size='518x518')
    assert verdicts([], rows) == []  # no ViT-L/14 elu at 1024x1024
    assert len(verdicts([], rows, target_size=(518, 518))) == 3
    rows = _elu_rows(2.0, 2.0, None)
    del rows[1]  # flash baseline not run
    rows[0]['ms'] = None
    rows[0]['error'] = 'OutOfMemoryError'
    lines = verdicts([], rows)
    assert lines[0].endswith('FlashAttention (SDPBackend.FLASH_ATTENTION): not measured '
                             '(not run)')
    assert lines[1].endswith('default SDPA dispatch: not measured (OutOfMemoryError)')
    assert 'MEMORY' in lines[2] and 'not measured' in lines[2]
    rows = _elu_rows(2.0, 2.0, 0.3)
    rows[2]['error'] = 'boom'
    assert verdicts([], rows) == ['ViT-L/14 at 1024x1024: not measured (boom)']


# ----------------------------------------------------------------------------- timing


@pytest.mark.parametrize('eager_ms, replays', [
    (None, 20), (0.0, 20), (1.0, 20), (10.0, 20), (15.0, 13), (50.0, 4), (66.7, 3),
    (100.0, 3), (1000.0, 3)])
def test_replays_for_aims_at_200_ms_per_round(eager_ms: Optional[float], replays: int):
    assert timing.replays_for(eager_ms) == replays


def test_eager_rounds_round_robin_after_one_cpu_warmup():
    calls: List[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ('a', 'b')}
    times = timing.eager_rounds(fns, CPU, 3)
    assert calls == ['a', 'b'] + ['a', 'b'] * 3
    assert set(times) == {'a', 'b'} and all(len(t) == 3 and min(t) >= 0 for t in times.values())


def test_cpu_timing_helpers():
    calls: List[int] = []
    assert timing.graph_ms(lambda: None, CPU) is None
    assert timing.try_graph_ms(lambda: None, CPU) == (None, 'no CUDA graphs on CPU')
    assert timing.peak_mib(lambda: calls.append(1), CPU) is None and calls == [1]
    assert timing.bench_ms(lambda: calls.append(2), CPU, 2) >= 0
    assert calls == [1, 2, 2, 2]  # one warm-up on CPU, then two timed calls
    with torch.enable_grad():
        x = torch.ones(1, requires_grad=True)
        assert timing.no_grad(lambda: x * 2)().requires_grad is False


# ----------------------------------------------------------------------------- sizes


@pytest.mark.parametrize('make', [full_sizes, dry_sizes])
def test_sizes_hold_the_target_size(make):
    sizes: Sizes = make()
    assert tuple(sizes.vit_l_target) in [tuple(s) for s in sizes.vit_l_sizes]
    assert sizes.repeats >= 1


def test_full_sizes_measure_hbm_beyond_l2_at_the_verdict_tokens():
    """The bandwidth verdict needs timed N >= 16k whose working set (q, k, v, out in bf16)
    exceeds the H200's 50 MiB L2; the ViT-L/14 targets are judged at 1024x1024."""
    sizes = full_sizes()
    assert sizes.vit_l_target == (1024, 1024)
    big = [n for n in sizes.la_bench_tokens if n >= L2_RULE_TOKENS]
    assert big and all(4 * n * sizes.la_heads * sizes.la_head_dim * 2 > 50 * 2**20
                       for n in big)
    assert (sizes.la_heads, sizes.la_head_dim) == (16, 64)  # ViT-L/14: 1024 = 16 x 64
    assert sizes.repeats >= 5
    assert L2_RULE_TOKENS == 16384


# ----------------------------------------------------------------------------- metadata


def test_peak_bandwidth_table_matches_the_data_sheets():
    """Vendor data sheets (TB/s): H200 4.8, H100 SXM 3.35, H100 PCIe 2.0, A100 SXM4 80 GB
    2.039 / 40 GB 1.555, A100 PCIe 80 GB 1.935 / 40 GB 1.555, L40S 0.864."""
    sheets = {'NVIDIA H200': 4.8, 'NVIDIA H100 80GB HBM3': 3.35, 'NVIDIA H100 PCIe': 2.0,
              'NVIDIA A100-SXM4-80GB': 2.039, 'NVIDIA A100-SXM4-40GB': 1.555,
              'NVIDIA A100 80GB PCIe': 1.935, 'NVIDIA A100-PCIE-40GB': 1.555,
              'NVIDIA L40S': 0.864}
    assert {k: v / 1e12 for k, v in PEAK_BW.items()} == pytest.approx(sheets)
    assert peak_bandwidth(' NVIDIA H200\n') == 4.8e12
    assert peak_bandwidth('NVIDIA H20') is None
    assert l2_bytes(CPU) is None


# ----------------------------------------------------------------------------- section 2


def _fake_run(copy_bw: Optional[float]) -> SuiteRun:
    run = SuiteRun(CPU, dry=True)
    run.result = {'errors': {}}
    run.copy_bw = copy_bw
    return run


def _la_section(monkeypatch, l2: Optional[int], graph: List[Tuple[Optional[float],
                                                                  Optional[str]]],
                peak_bw: Optional[float], copy_bw: Optional[float],
                rule_tokens: int = 16) -> Tuple[Dict[str, object], Dict[str, object]]:
    """Section 2 at N = 32 (H = 2, d = 16, fp32: 4096 bytes per tensor) with fixed times.

    Eager ms, in call order: triton 2, triton f+b 5, torch 8, sdpa-flash 3, sdpa-flash f+b 9.
    """
    from mmlinvit.ops.linear_attention import linear_attention_torch
    fake = SimpleNamespace(linear_attention_triton=linear_attention_torch)
    eager: Iterator[float] = iter([2.0, 5.0, 8.0, 3.0, 9.0])
    graphs = iter(graph)
    monkeypatch.setattr(op_sections, 'triton_kernels', lambda device: (fake, fake))
    monkeypatch.setattr(op_sections, 'bench_ms', lambda fn, device, repeats: next(eager))
    monkeypatch.setattr(op_sections, 'try_graph_ms',
                        lambda fn, device, eager_ms=None: next(graphs))
    monkeypatch.setattr(op_sections, 'l2_bytes', lambda device: l2)
    monkeypatch.setattr(op_sections, 'L2_RULE_TOKENS', rule_tokens)
    sizes = dry_sizes()
    sizes.la_bench_tokens = [32]
    run = _fake_run(copy_bw)
    rows: List[Dict[str, object]] = []
    sdpa_rows: List[Dict[str, object]] = []
    op_sections.section_linear_attention(run, sizes, peak_bw, rows, sdpa_rows)
    assert run.result['errors'] == {}, run.result['errors']
    (row, ) = rows
    flash = next(r for r in sdpa_rows if r['sdpa'] == 'flash')
    return row, flash


def test_section_2_bandwidth_from_graph_times(monkeypatch):
    """fwd bytes = 4 tensors x 4096 B = 16384 B in 1 ms (graph): 1.6384e7 B/s; f+b bytes =
    11 x 4096 B in 4 ms: 1.1264e7 B/s."""
    row, flash = _la_section(monkeypatch, l2=None, graph=[(1.0, None), (4.0, None),
                                                          (1.5, None)],
                             peak_bw=2.048e7, copy_bw=3.2768e-5)
    assert row['triton ms'] == 2.0 and row['triton f+b ms'] == 5.0 and row['torch ms'] == 8.0
    assert row['torch/triton'] == pytest.approx(4.0)
    assert row['BW from'] == 'graph/graph'
    assert row['fwd traffic MiB'] == pytest.approx(16384 / 2**20)
    assert row['HBM fwd'] == pytest.approx(0.8)
    assert row['HBM f+b'] == pytest.approx(0.55)
    assert row['fwd vs copy'] == pytest.approx(0.5)
    assert row['in L2'] == 'no'  # no L2 size: N = 32 >= the (patched) rule's 16 tokens
    assert row['target >=0.7'] == 'met'
    assert flash['ms'] == 3.0 and flash['sdpa/triton'] == pytest.approx(1.5)
    assert flash['graph sdpa/triton'] == pytest.approx(1.5)
    assert flash['f+b sdpa/triton'] == pytest.approx(1.8)


def test_section_2_bandwidth_from_eager_times_when_capture_fails(monkeypatch):
    """Eager 2 ms fwd, 5 ms f+b: 8.192e6 and 9.0112e6 B/s of a 1.6384e7 B/s peak."""
    row, _ = _la_section(monkeypatch, l2=None, graph=[(None, 'capture failed: x'),
                                                      (None, 'capture failed: y'),
                                                      (None, 'z')],
                         peak_bw=1.6384e7, copy_bw=None)
    assert row['BW from'] == 'eager/eager'
    assert row['HBM fwd'] == pytest.approx(0.5)
    assert row['HBM f+b'] == pytest.approx(0.55)
    assert row['fwd vs copy'] is None
    assert row['target >=0.7'] == 'NOT met'


@pytest.mark.parametrize('l2, in_l2', [(16384, 'yes'), (16383, 'no')])
def test_section_2_working_set_in_l2(monkeypatch, l2: int, in_l2: str):
    """The 16384-byte forward working set fits a 16384-byte L2 (no HBM verdict there)."""
    row, _ = _la_section(monkeypatch, l2=l2, graph=[(1.0, None), (4.0, None), (1.5, None)],
                         peak_bw=2.048e7, copy_bw=None)
    assert row['in L2'] == in_l2
    assert row['target >=0.7'] == ('-' if in_l2 == 'yes' else 'met')


def test_section_2_no_verdict_below_the_rule_tokens_or_without_peak(monkeypatch):
    row, _ = _la_section(monkeypatch, l2=None, graph=[(1.0, None), (4.0, None), (1.5, None)],
                         peak_bw=2.048e7, copy_bw=None, rule_tokens=64)
    assert row['in L2'] == 'yes' and row['target >=0.7'] == '-'
    row, _ = _la_section(monkeypatch, l2=1, graph=[(1.0, None), (4.0, None), (1.5, None)],
                         peak_bw=2.048e7, copy_bw=None, rule_tokens=64)
    assert row['in L2'] == 'no' and row['HBM fwd'] == pytest.approx(0.8)
    assert row['target >=0.7'] == '-'  # beyond a tiny L2, but N < the 16k rule
    row, _ = _la_section(monkeypatch, l2=1, graph=[(1.0, None), (4.0, None), (1.5, None)],
                         peak_bw=None, copy_bw=None)
    assert row['HBM fwd'] is None and row['HBM f+b'] is None and row['target >=0.7'] == '-'


# ----------------------------------------------------------------------------- checks


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient scaled by ``scale`` (a kernel with one wrong gradient)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


def _ssd_with_wrong_grad(index: int, scale: float) -> SimpleNamespace:
    from mmlinvit.ops.ssd import ssd_scan_torch

    def scan(*leaves: torch.Tensor, chunk_size: int) -> torch.Tensor:
        leaves = list(leaves)
        leaves[index] = _ScaleGrad.apply(leaves[index], scale)
        return ssd_scan_torch(*leaves, chunk_size=chunk_size)
    return SimpleNamespace(ssd_scan_triton=scan)


@pytest.mark.parametrize('index, name, scale, ok', [
    (2, 'dA', 1.003, 'PASS'),  # dA: 3e-3 <= its fp32 bound 5e-3
    (2, 'dA', 1.007, 'FAIL'),
    (5, 'dD', 1.003, 'FAIL'),  # any other gradient: 3e-3 > 1e-4
    (1, 'ddt', 1.0005, 'FAIL')])
def test_ssd_check_bounds_each_gradient(index: int, name: str, scale: float, ok: str):
    row = check_ssd(_ssd_with_wrong_grad(index, scale), 'x', 1, 20, 2, 4, 1, 8, 8,
                    torch.float32, CPU)
    assert row[name] == pytest.approx(scale - 1.0, rel=1e-2)
    assert row['ok'] == ok, row
    assert row['tol'] == 1e-4


def test_ssd_check_fails_a_non_finite_gradient():
    row = check_ssd(_ssd_with_wrong_grad(0, float('inf')), 'x', 1, 20, 2, 4, 1, 8, 8,
                    torch.float32, CPU)
    assert row['ok'] == 'FAIL'


def _la_with_wrong_grad(index: int, scale: float) -> SimpleNamespace:
    from mmlinvit.ops.linear_attention import linear_attention_torch

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str) -> torch.Tensor:
        qkv = [q, k, v]
        qkv[index] = _ScaleGrad.apply(qkv[index], scale)
        return linear_attention_torch(*qkv, mode)
    return SimpleNamespace(linear_attention_triton=kernel)


@pytest.mark.parametrize('index, name', [(0, 'dq'), (1, 'dk'), (2, 'dv')])
def test_linear_attention_check_fails_each_wrong_gradient(index: int, name: str):
    row = check_linear_attention(_la_with_wrong_grad(index, 1.0003), 'x', 17, 23, 2, 8, 6,
                                 torch.float32, 'elu', CPU)
    assert row[name] == pytest.approx(3e-4, rel=1e-2) and row['out'] < 1e-6
    assert row['ok'] == 'FAIL' and row['tol'] == 1e-4


def test_linear_attention_check_fails_a_nan_gradient_with_an_exact_output():
    """max() over [0.0, nan, ...] is 0.0: only the finiteness test fails such a kernel."""
    row = check_linear_attention(_la_with_wrong_grad(0, float('nan')), 'x', 17, 23, 2, 8, 6,
                                 torch.float32, 'elu', CPU)
    assert row['out'] < 1e-6 and row['ok'] == 'FAIL'


def test_linear_attention_check_fp16_bound():
    """fp16 bound 4e-3: an output 0.6 % too large fails (bf16's 6e-3 would pass it)."""
    from mmlinvit.ops.linear_attention import linear_attention_torch
    exact = SimpleNamespace(linear_attention_triton=linear_attention_torch)
    row = check_linear_attention(exact, 'x', 64, 64, 2, 16, 16, torch.float16, 'elu', CPU)
    assert row['ok'] == 'PASS' and row['tol'] == 4e-3
    scaled = SimpleNamespace(linear_attention_triton=lambda q, k, v, mode: (
        1.0055 * linear_attention_torch(q, k, v, mode).float()).to(q.dtype))
    row = check_linear_attention(scaled, 'x', 64, 64, 2, 16, 16, torch.float16, 'elu', CPU)
    assert 4e-3 < row['out'] < 6e-3 and row['ok'] == 'FAIL', row


def test_check_tolerances():
    assert kernel_checks.TOL_LA == {torch.float32: 1e-4, torch.float16: 4e-3,
                                    torch.bfloat16: 6e-3}
    assert kernel_checks.TOL_SSD == {torch.float32: 1e-4, torch.float16: 5e-3,
                                     torch.bfloat16: 6e-3}
    assert kernel_checks.TOL_SSD_DA == {torch.float32: 5e-3, torch.float16: 2e-2,
                                        torch.bfloat16: 1e-2}


# ----------------------------------------------------------------------------- sweeps


def _sweep_module() -> SimpleNamespace:
    class LaunchConfig:
        def __init__(self) -> None:
            self.scale = 1.0
    return SimpleNamespace(_LaunchConfig=LaunchConfig, __name__='fake_kernel')


def test_sweep_errors_against_the_default_and_fp32(monkeypatch):
    module = _sweep_module()
    x = torch.ones(4, 4)

    def call() -> Tuple[torch.Tensor, torch.Tensor]:
        scale = module._LaunchConfig().scale
        return x * scale, x * (2.0 - scale)

    exact = {'c': [x * 1.5, x * 2.0]}
    cases = [('c', call, list)]
    rows = sweeps.sweep(module, [dict(scale=1.01), dict(scale=0.98), dict(nope=1)], cases,
                        deadline=float('inf'), device=CPU, exact=exact,
                        exact_names={'c': ('a', 'b')})
    assert rows[0]['variant'] == 'scale=1.01'
    assert rows[0]['max rel err vs default'] == pytest.approx(0.01)
    assert rows[1]['max rel err vs default'] == pytest.approx(0.02)
    assert rows[0]['a err'] == pytest.approx(abs(1.01 - 1.5) / 1.5)
    assert rows[0]['b err'] == pytest.approx(abs(0.99 - 2.0) / 2.0)
    assert rows[0]['c ms'] >= 0
    assert 'AttributeError' in rows[2]['error'] and "'nope'" in rows[2]['error']
    assert module._LaunchConfig().scale == 1.0  # restored after every variant
    rows = sweeps.sweep(module, [dict(scale=1.01)], cases, deadline=float('inf'),
                        device=CPU, exact=exact)
    assert rows[0]['c err vs fp32'] == pytest.approx(abs(0.99 - 2.0) / 2.0)  # the largest
    rows = sweeps.sweep(module, [dict(scale=1.01)], cases, deadline=-float('inf'), device=CPU)
    assert rows == [{'variant': 'deadline reached: rest skipped'}]


# ----------------------------------------------------------------------------- backbones


def test_backbone_pairs_name_the_rows_the_verdicts_read():
    """verdicts() looks up 'ViT-L/14 elu' and the 'ViT-L/14' softmax roles: the pairs must
    give those labels, with the softmax baseline first and flash reusing the softmax model."""
    pairs = backbone_pairs(dry_sizes())
    vit = [p for p in pairs if p[0] == 'ViT-L/14']
    assert [p[1] for p in vit] == dry_sizes().vit_l_sizes
    members = vit[0][2]
    assert [(m[0], m[1], m[3]) for m in members] == [
        ('ViT-L/14 softmax', 'softmax', 'default'),
        ('ViT-L/14 softmax [flash]', 'softmax-flash', 'flash'),
        ('ViT-L/14 elu', 'linear', None)]
    assert members[1][2] == 'ViT-L/14 softmax'
    b_pairs = [p for p in pairs if p[0] == 'B-pair']
    assert [p[1] for p in b_pairs] == dry_sizes().pair_sizes
    assert [m[1] for m in b_pairs[0][2]] == ['softmax', 'linear']


def test_block_tokens_counts_the_tokens_into_the_first_block():
    model = torch.nn.Module()
    model.block_list = torch.nn.ModuleList([torch.nn.Identity(), torch.nn.Identity()])
    x = torch.zeros(1, 7, 3)
    assert block_tokens(model, lambda: model.block_list[0](x[:, :5])) == 5


# ----------------------------------------------------------------------------- report


def test_print_section_formats_floats_and_drops_lists(capsys):
    rows = [{'N': 16384, 'ms': 0.123456, 'big': 123456.7, 'rounds': [1.0], 'x': None},
            {'N': 2, 'error': 'boom'}]
    report.print_section('T', rows)
    out = capsys.readouterr().out
    assert out.splitlines()[0] == 'T'
    assert '0.123' in out and '123457' in out and 'rounds' not in out and 'boom' in out
    report.print_section('U', rows, cols=['N', 'ms', 'absent'])
    out = capsys.readouterr().out
    assert 'absent' not in out and 'error' in out and 'big' not in out


# ----------------------------------------------------------------------------- round 12b


def test_speed_verdicts_read_their_own_baselines_ratios():
    """The flash line reads the ' flash' ratios, the default line the plain ones; a baseline
    of another size is not this size's baseline."""
    rows = _elu_rows(1.2, 1.9, 0.3)
    rows[2].update({'speed x flash': 1.8, 'graph speed x flash': 1.1})
    stale = dict(rows[1], size='518x518', ms=None, skipped='other size')
    lines = verdicts([], rows + [stale])
    assert verdicts([], [stale] + rows) == lines
    assert 'CUDA graph replay: 1.10x -> NOT met; eager: 1.80x -> met' in lines[0]
    assert 'CUDA graph replay: 1.90x -> met; eager: 1.20x -> NOT met' in lines[1]


def test_section_2_rule_tokens_without_l2_size(monkeypatch):
    """Without the L2 size, N >= L2_RULE_TOKENS counts as beyond L2 (N = 32, rule 32)."""
    row, _ = _la_section(monkeypatch, l2=None, graph=[(1.0, None), (4.0, None), (1.5, None)],
                         peak_bw=2.048e7, copy_bw=None, rule_tokens=32)
    assert row['in L2'] == 'no' and row['target >=0.7'] == 'met'


class _FakeEvent:
    """A CUDA event whose elapsed time is 10 ms."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: '_FakeEvent') -> float:
        return 10.0


def test_graph_rounds_divide_by_the_replays(monkeypatch):
    """10 ms for a round of 4 replays: 2.5 ms per replay; a failed capture has no times."""
    replayed: List[str] = []

    def capture(fn, device):
        if fn is None:
            raise RuntimeError('not capturable')
        return SimpleNamespace(replay=lambda: replayed.append(fn()))

    monkeypatch.setattr(timing, 'capture_graph', capture)
    monkeypatch.setattr(torch.cuda, 'Event', _FakeEvent)
    monkeypatch.setattr(torch.cuda, 'empty_cache', lambda: None)
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda device=None: None)
    times, failed = timing.graph_rounds({'a': lambda: 'a', 'b': None}, CPU, {'a': 4, 'b': 3},
                                        rounds=2)
    assert times == {'a': [2.5, 2.5]}
    assert failed == {'b': 'RuntimeError: not capturable'}
    assert replayed == ['a'] * 8


def test_ceilings_count_copy_read_and_write(monkeypatch):
    """1 GiB copied (read + written: 2 GiB) in 1 ms = 2.147 TB/s; 2 x 8192^3 flop in 2 ms."""
    fake_torch = SimpleNamespace(randn=lambda *a, **k: torch.zeros(1), empty_like=torch.empty_like,
                                 bfloat16=torch.bfloat16,
                                 cuda=SimpleNamespace(empty_cache=lambda: None))
    times = iter([1.0, 2.0])
    monkeypatch.setattr(op_sections, 'torch', fake_torch)
    monkeypatch.setattr(op_sections, 'bench_ms', lambda fn, device, repeats: next(times))
    got = op_sections.section_ceilings(SimpleNamespace(type='cuda'))
    assert got['copy TB/s'] == pytest.approx(2 * 2**30 / 1e-3 / 1e12)
    assert got['bf16 matmul TFLOP/s'] == pytest.approx(2 * 8192**3 / 2e-3 / 1e12)
    assert op_sections.section_ceilings(CPU) == {'copy TB/s': None, 'bf16 matmul TFLOP/s': None}


def test_sweep_error_is_the_largest_over_all_cases():
    """Case 'big' is 5 % off under the variant, case 'small' (run after it) 1 %: 0.05."""
    module = _sweep_module()
    x = torch.ones(3)

    def big() -> torch.Tensor:
        return x * (1.0 + 5.0 * (module._LaunchConfig().scale - 1.0))

    def small() -> torch.Tensor:
        return x * module._LaunchConfig().scale

    rows = sweeps.sweep(module, [dict(scale=1.01)], [('big', big, lambda o: [o]),
                                                     ('small', small, lambda o: [o])],
                        deadline=float('inf'), device=CPU)
    assert rows[0]['max rel err vs default'] == pytest.approx(0.05)


def test_section_backbones_median_times_and_ratios(monkeypatch):
    """Per-round eager ms [1, 2, 9] (softmax) and [1, 1, 3] (linear): medians 2 and 1,
    speed 2.0x, per-round ratios [1, 2, 3]."""
    from mmlinvit.analysis.gpu_suite import backbone_sections

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block_list = torch.nn.ModuleList([torch.nn.Identity()])

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return self.block_list[0](images.flatten(2).transpose(1, 2))

    members = [('soft', 'softmax', Tiny, 'default'), ('lin', 'linear', Tiny, None)]
    monkeypatch.setattr(backbone_sections, 'backbone_pairs',
                        lambda sizes: [('P', (2, 3), members)])
    monkeypatch.setattr(backbone_sections, 'attention_kernels',
                        lambda fn, device: {'aten op': None, 'kernel': None})
    monkeypatch.setattr(backbone_sections, 'eager_rounds', lambda fns, device, repeats: {
        'soft': [1.0, 2.0, 9.0], 'lin': [1.0, 1.0, 3.0]})
    rows: List[Dict[str, object]] = []
    run = _fake_run(None)
    backbone_sections.section_backbones(run, dry_sizes(), rows)
    assert run.result['errors'] == {}
    soft, lin = rows
    assert soft['N'] == 6 and soft['size'] == '2x3' and soft['act MiB'] is None
    assert soft['ms'] == 2.0 and lin['ms'] == 1.0
    assert lin['speed x'] == pytest.approx(2.0)
    assert lin['eager speed x spread'] == pytest.approx([1.0, 2.0, 3.0])
