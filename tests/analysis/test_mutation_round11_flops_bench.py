"""Mutation round 11: FLOP counting, the benchmark helpers and the checkpoint-coverage checks.

Oracles are independent of the code under test where they can be: torch's own
``FlopCounterMode`` with the math SDPA backend (which lowers attention to two ``bmm`` that
upstream counts; its CPU flash kernel counts 0 upstream), the plain torch linear-attention
paths, closed forms written out here, ``/proc/self/statm`` for RSS, and a fake clock / fake
CUDA events instead of real timing (no timing assertions).
"""
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import pytest
import torch
import torch.nn as nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from mmlinvit.analysis import (FlopCount, FlopCounter, analytic_vit_flops, attention_flops,
                               count_flops, sdpa_flops)
from mmlinvit.analysis.flops import linear_attention_function_flops
from mmlinvit.backbones import VisionTransformer
from mmlinvit.backbones.adventurer import Adventurer
from mmlinvit.ops.linear_attention import inline_attention_torch, linear_attention_torch
from mmlinvit.utils import benchmarking
from mmlinvit.utils.benchmarking import (EXACT_RSS_ENV, cuda_peak_memory, merge_results,
                                         proc_status_mib, run_case_phases, run_json_child,
                                         time_call_ms, time_round_robin, timed_calls,
                                         write_json)

TINY_ARCH = dict(embed_dims=32, num_layers=3, num_heads=4, mlp_hidden_dims=96)
PATCH = 8
#: Not a multiple of the patch: the grid is corner-padded to ceil(30 / 8) x ceil(50 / 8) = 4 x 7.
ODD_HW = (30, 50)
CPU = torch.device('cpu')
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _upstream_flops(model: nn.Module, images: torch.Tensor, grad: bool = False) -> int:
    """FLOPs of one forward by torch's FlopCounterMode alone, SDPA on its math backend.

    Args:
        model: The model.
        images: Its input.
        grad: Run with gradients enabled (the SSD scan then takes its chunked form).

    Returns:
        Upstream's total (2 x MACs of mm / bmm / conv).
    """
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as mode:
        with torch.set_grad_enabled(grad):
            model(images)
    return mode.get_total_flops()


def _tiny_vit(attn_cfg: Union[str, Sequence[str]], **kwargs: Any) -> VisionTransformer:
    return VisionTransformer(TINY_ARCH, attn_cfg=attn_cfg, img_size=32, patch_size=PATCH,
                             **kwargs).eval()


# ------------------------------------------------------------------------------ flops.py
@pytest.mark.parametrize('attn_cfg', ['softmax', 'elu', 'inline', ['softmax', 'relu', 'inline'],
                                      'hedgehog'])
@pytest.mark.parametrize('extra', [{}, dict(family='dinov2', num_reg_tokens=4)])
def test_vit_counts_equal_upstream_counter_and_closed_form_on_a_padded_grid(attn_cfg, extra):
    """A non-square input whose sides are not multiples of the patch (grid corner-padded to
    4 x 7): FlopCounter, torch's FlopCounterMode and the closed form agree exactly."""
    model = _tiny_vit(attn_cfg, **extra)
    images = torch.randn(1, 3, *ODD_HW)
    counted = count_flops(model, images).total
    assert counted == _upstream_flops(model, images)
    if attn_cfg != 'hedgehog':
        prefix = 1 + extra.get('num_reg_tokens', 0)
        closed = analytic_vit_flops(ODD_HW, PATCH, 32, 3, 4, 96, attn_cfg,
                                    num_prefix_tokens=prefix)
        assert closed.num_tokens == 4 * 7 + prefix
        assert closed.total == counted


def test_adventurer_counts_the_chunked_scan_like_upstream_with_gradients():
    """Without gradients the CPU scan runs its inference form (chunks of <= 64 tokens); the
    counter counts the configured chunk (128), which is what upstream counts of the autograd
    form.  The depthwise conv1d runs element-wise on CPU (0 in both)."""
    model = Adventurer(dict(embed_dims=64, num_layers=2), img_size=32, patch_size=PATCH,
                       mixer_cfg=dict(headdim=16, d_state=16, chunk_size=128)).eval()
    images = torch.randn(1, 3, 72, 120)  # 9 x 15 patches + class + heading = 137 tokens
    counted = count_flops(model, images).total
    assert counted == _upstream_flops(model, images, grad=True)
    assert counted > _upstream_flops(model, images, grad=False)  # the inference form differs


def test_analytic_hybrid_list_with_dict_configs_and_one_channel():
    """Per-layer operator lists (dict configs too) and ``in_channels`` reach the closed form."""
    attn = [dict(type='softmax'), 'elu', dict(type='inline')]
    model = _tiny_vit(['softmax', 'elu', 'inline'], in_channels=1)
    counted = count_flops(model, torch.randn(1, 1, 32, 48)).total
    closed = analytic_vit_flops((32, 48), PATCH, 32, 3, 4, 96, attn, in_channels=1)
    assert closed.total == counted
    n, d_model, head_dims = 4 * 6 + 1, 32, 8
    assert closed.attention == (4 * n * n * d_model + 4 * n * head_dims * d_model +
                                4 * n * head_dims * d_model)
    assert closed.extras == 2 * 24 * 1 * PATCH * PATCH * d_model + 2 * n * d_model
    with pytest.raises(ValueError, match='attention has 2 entries for 3 layers'):
        analytic_vit_flops(32, PATCH, 32, 3, 4, 96, ['softmax', 'elu'])


def test_attention_flops_of_one_layer_written_out():
    n, d_model, heads = 50, 64, 4
    head_dims = d_model // heads
    assert attention_flops('softmax', n, d_model, heads) == 4 * n * n * d_model
    assert attention_flops('elu', n, d_model, heads) == (4 * n * head_dims * d_model +
                                                         2 * n * d_model)
    assert attention_flops('relu', n, d_model, heads, exact=False) == 4 * n * head_dims * d_model
    assert attention_flops('inline', n, d_model, heads) == 4 * n * head_dims * d_model


def test_sdpa_flops_refuses_inputs_of_unequal_rank():
    with pytest.raises(ValueError, match='equal rank'):
        sdpa_flops((2, 3, 10, 8), (3, 12, 8), (2, 3, 12, 8))
    with pytest.raises(ValueError, match='equal rank'):
        sdpa_flops((2, 3, 10, 8), (2, 3, 12, 8), (3, 12, 8))
    with pytest.raises(ValueError, match='equal rank'):
        sdpa_flops((8, ), (8, ), (8, ))


def test_linear_attention_formula_equals_the_torch_paths_on_cross_shapes():
    """N != M and d != e: the Triton Function's formula is what upstream counts of the torch
    paths (kernel attention with its normaliser; InLine without)."""
    q, k, v = torch.randn(2, 3, 10, 8), torch.randn(2, 3, 12, 8), torch.randn(2, 3, 12, 5)
    for inline, run in ((False, lambda: linear_attention_torch(q, k, v, 'elu')),
                        (True, lambda: inline_attention_torch(q, k, v, 0.25))):
        with torch.no_grad(), FlopCounterMode(display=False) as mode:
            run()
        assert linear_attention_function_flops(q, k, v, 0, inline, 1e-6, 0.25) == \
            mode.get_total_flops(), inline


class _MatmulFunction(torch.autograd.Function):
    """``a @ b`` with a real backward (two matmuls)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        return grad @ b.t(), a.t() @ grad


def _matmul_formula(a: torch.Tensor, b: torch.Tensor) -> int:
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


def test_function_backward_counts_twice_its_forward_and_class_is_restored():
    original_apply = _MatmulFunction.__dict__.get('apply')
    original_backward = _MatmulFunction.__dict__['backward']
    a, b = torch.randn(4, 5, requires_grad=True), torch.randn(5, 6, requires_grad=True)
    forward = 2 * 4 * 5 * 6
    with FlopCounter(function_formulas={_MatmulFunction: _matmul_formula}) as counter:
        _MatmulFunction.apply(a, b).sum().backward()
    assert counter.by_op['_MatmulFunction'] == forward
    assert counter.by_op['_MatmulFunction.backward'] == 2 * forward
    assert counter.total == 3 * forward  # the backward's own mm are discarded
    assert _MatmulFunction.__dict__.get('apply') is original_apply
    assert _MatmulFunction.__dict__['backward'] is original_backward
    _MatmulFunction.apply(a, b).sum().backward()  # works outside a counter
    # a second use of a counter counts from zero
    with FlopCounter(function_formulas={_MatmulFunction: _matmul_formula}) as again:
        _MatmulFunction.apply(a, b)
    assert again.total == forward
    assert again.by_op == {'aten.mm': forward, 'discarded_inside_functions': -forward,
                           '_MatmulFunction': forward}


def test_counter_is_reused_from_zero_refuses_nesting_and_reports_inside():
    a, b = torch.randn(4, 5), torch.randn(5, 6)
    counter = FlopCounter(function_formulas={_MatmulFunction: lambda *args: 7})
    for _ in range(2):
        with counter:
            _MatmulFunction.apply(a, b)
            assert counter.total == 7  # the count so far, inside the context
            torch.mm(a, b)
        assert counter.total == 7 + 2 * 4 * 5 * 6
        assert 'discarded_inside_functions' in counter.by_op
    with counter:
        with pytest.raises(RuntimeError, match='not reentrant'):
            counter.__enter__()


def test_extra_op_formulas_override_the_registry():
    a, b = torch.randn(4, 5), torch.randn(5, 6)
    with FlopCounter(op_formulas={torch.ops.aten.mm: lambda *args, **kwargs: 11}) as counter:
        torch.mm(a, b)
    assert counter.total == 11


class _GradProbe(nn.Module):
    """Records whether gradients were enabled and the keyword argument it got."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: List[Tuple[bool, Optional[float]]] = []

    def forward(self, a: torch.Tensor, b: torch.Tensor, scale: Optional[float] = None):
        self.seen.append((torch.is_grad_enabled(), scale))
        return _MatmulFunction.apply(a, b)


def test_count_flops_runs_without_gradients_and_forwards_kwargs_and_formulas():
    probe = _GradProbe()
    result = count_flops(probe, torch.randn(4, 5), torch.randn(5, 6), scale=0.5,
                         function_formulas={_MatmulFunction: lambda *args: 13})
    assert probe.seen == [(False, 0.5)]
    assert result.total == 13 and result.by_op['_MatmulFunction'] == 13


def test_gflops_is_total_over_1e9():
    assert FlopCount(total=3_500_000_000).gflops == 3.5


def test_only_non_transposed_depthwise_conv1d_counts_zero():
    """A grouped transposed conv1d with (C, 1, k) weights keeps upstream's count."""
    conv = nn.ConvTranspose1d(8, 8, 4, groups=8)
    x = torch.randn(2, 8, 20)
    with FlopCounter() as counter:
        conv(x)
    with FlopCounterMode(display=False) as upstream:
        conv(x)
    assert counter.total == upstream.get_total_flops() > 0


def test_by_op_lists_no_zero_entries():
    """The zero-counted depthwise conv1d does not show up in the per-op breakdown."""
    from mmlinvit.layers.mamba2 import Mamba2Mixer
    with torch.device('meta'):
        mixer = Mamba2Mixer(32, d_state=16, headdim=16, chunk_size=16,
                            ssd_backend='torch').eval()
        result = count_flops(mixer, torch.empty(1, 40, 32))
    assert result.by_op and all(v != 0 for v in result.by_op.values()), result.by_op
    assert sum(result.by_op.values()) == result.total


# ------------------------------------------------------------------------- benchmarking
class _FakeClock:
    """``time.perf_counter`` stand-in: each ``step`` advances it by the next duration."""

    def __init__(self, durations_s: Sequence[float]) -> None:
        self.now = 0.0
        self.durations = list(durations_s)

    def perf_counter(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += self.durations.pop(0)


def test_round_robin_median_is_not_the_mean(monkeypatch):
    clock = _FakeClock([0.01, 0.02, 0.09])
    monkeypatch.setattr(time, 'perf_counter', clock.perf_counter)
    times = time_round_robin({'f': clock.step}, CPU, repeats=3, warmups=0)
    assert times['f'] == pytest.approx(20.0)  # mean 40, min 10


def test_round_robin_budget_starts_after_warmups_and_stops_rounds(monkeypatch):
    # warm-ups take 1 s each (outside the budget), then rounds of 2 x 0.02 s against 0.05 s
    clock = _FakeClock([1.0, 1.0] + [0.02] * 20)
    monkeypatch.setattr(time, 'perf_counter', clock.perf_counter)
    calls: Dict[str, int] = {'a': 0, 'b': 0}

    def make(name: str):
        def fn() -> None:
            calls[name] += 1
            clock.step()
        return fn

    times = time_round_robin({'a': make('a'), 'b': make('b')}, CPU, repeats=10, warmups=1,
                             max_seconds=0.05)
    assert calls == {'a': 3, 'b': 3}  # 1 warm-up + 2 rounds (0.04 s, then 0.08 s > 0.05 s)
    assert times == pytest.approx({'a': 20.0, 'b': 20.0})


def test_timed_calls_stop_only_once_the_budget_is_exceeded(monkeypatch):
    clock = _FakeClock([0.25] * 10)  # binary fractions: sums are exact
    monkeypatch.setattr(time, 'perf_counter', clock.perf_counter)
    assert timed_calls(clock.step, CPU, repeats=10, max_seconds=0.5) == [250.0] * 3
    clock = _FakeClock([0.25] * 10)
    monkeypatch.setattr(time, 'perf_counter', clock.perf_counter)
    assert timed_calls(clock.step, CPU, repeats=10, max_seconds=0.0) == [250.0]


class _FakeEvent:
    """``torch.cuda.Event`` stand-in reading a fake clock; elapsed_time needs a synchronized
    end event, as CUDA's does."""

    def __init__(self, clock: _FakeClock, log: List[str], enable_timing: bool = False) -> None:
        assert enable_timing
        self.clock, self.log, self.at, self.synced = clock, log, None, False

    def record(self) -> None:
        self.at = self.clock.now
        self.log.append('record')

    def synchronize(self) -> None:
        self.synced = True
        self.log.append('synchronize')

    def elapsed_time(self, end: '_FakeEvent') -> float:
        assert end.synced, 'elapsed_time before the end event completed'
        return (end.at - self.at) * 1e3


def test_cuda_timing_uses_events_start_to_end_and_syncs(monkeypatch):
    clock = _FakeClock([0.003, 0.1, 0.004, 0.005])  # one call, then warm-up + 2 rounds
    log: List[str] = []
    monkeypatch.setattr(torch.cuda, 'Event',
                        lambda enable_timing=False: _FakeEvent(clock, log, enable_timing))
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda device=None: log.append('device'))
    cuda = torch.device('cuda')
    assert time_call_ms(clock.step, cuda) == pytest.approx(3.0)
    assert log == ['record', 'record', 'synchronize']
    log.clear()
    times = time_round_robin({'f': clock.step}, cuda, repeats=2, warmups=1)
    assert log[0] == 'device'  # the warm-up's kernels finish before timing starts
    assert times['f'] == pytest.approx(4.5)  # median of 4 and 5 ms


def test_cuda_peak_memory_is_above_the_allocation_before(monkeypatch):
    state = {'reset': False}
    mib = 2**20
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda device=None: None)
    monkeypatch.setattr(torch.cuda, 'memory_allocated', lambda device=None: 10 * mib)
    monkeypatch.setattr(torch.cuda, 'reset_peak_memory_stats',
                        lambda device=None: state.update(reset=True))
    monkeypatch.setattr(torch.cuda, 'max_memory_allocated',
                        lambda device=None: (74 if state['reset'] else 500) * mib)
    peak, out = cuda_peak_memory(lambda: 'result', torch.device('cuda'))
    assert (peak, out) == (64.0, 'result')


def test_proc_status_mib_reads_kib_lines_as_mib():
    if not os.path.exists('/proc/self/statm'):
        pytest.skip('needs Linux /proc')
    keep = torch.ones(8 * 2**20)  # 32 MiB resident, so the RSS is well above rounding
    with open('/proc/self/statm') as f:
        rss_pages = int(f.read().split()[1])
    statm_mib = rss_pages * os.sysconf('SC_PAGE_SIZE') / 2**20
    assert proc_status_mib('VmRSS') == pytest.approx(statm_mib, abs=2.0)
    with pytest.raises(RuntimeError, match='NoSuchKey not found'):
        proc_status_mib('NoSuchKey')
    with pytest.raises(RuntimeError, match='RSS not found'):  # a whole key, not a part
        proc_status_mib('RSS')
    del keep


_CHILD = ('import json, os, sys; '
          'print("noise"); '
          'print(json.dumps(dict(threads=os.environ["OMP_NUM_THREADS"], '
          'path=os.environ["PYTHONPATH"].split(os.pathsep)[0], '
          'mmap=os.environ.get("MALLOC_MMAP_THRESHOLD_"), phase=sys.argv[1], '
          'nested={sys.argv[1]: 1})))')


def test_run_json_child_environment_and_last_line(tmp_path):
    out = run_json_child([sys.executable, '-c', _CHILD, 'x'], threads=3, root=str(tmp_path))
    assert out == dict(threads='3', path=str(tmp_path), mmap=None, phase='x', nested={'x': 1})
    out = run_json_child([sys.executable, '-c', _CHILD, 'x'], 1, str(tmp_path),
                         exact_memory=True)
    assert out['mmap'] == EXACT_RSS_ENV['MALLOC_MMAP_THRESHOLD_']
    failing = 'import sys; sys.stderr.write("first\\nlast line\\n"); sys.exit(3)'
    with pytest.raises(RuntimeError, match=r'^exit 3: last line$'):
        run_json_child([sys.executable, '-c', failing], 1, str(tmp_path))


def test_case_phases_memory_exact_then_time_merged(tmp_path):
    merged = run_case_phases(lambda phase: [sys.executable, '-c', _CHILD, phase], 1,
                             str(tmp_path))
    assert merged['phase'] == 'time' and merged['mmap'] is None
    assert merged['nested'] == {'memory': 1, 'time': 1}
    seen = {}

    def command(phase: str) -> List[str]:
        seen[phase] = True
        code = _CHILD if phase == 'memory' else 'import sys; sys.stderr.write("boom"); exit(2)'
        return [sys.executable, '-c', code, phase]

    with pytest.raises(RuntimeError, match=r'^time: exit 2: boom$'):
        run_case_phases(command, 1, str(tmp_path))
    assert list(seen) == ['memory', 'time']


def test_merge_results_merges_nested_dicts_key_by_key():
    parts = [dict(a=1, mem=dict(x=1, y=2)), dict(b=2, mem=dict(y=3, z=4), a=5)]
    assert merge_results(parts) == dict(a=5, b=2, mem=dict(x=1, y=3, z=4))
    assert merge_results([dict(a=dict(x=1)), dict(a=2)]) == dict(a=2)


def test_write_json_writes_only_with_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_json([dict(a=1)], None)
    write_json([dict(a=1)], '')
    assert os.listdir(tmp_path) == []
    path = tmp_path / 'rows.json'
    write_json([dict(a=1, b='x')], str(path))
    assert json.loads(path.read_text()) == [dict(a=1, b='x')]


def test_exact_rss_reads_the_environment(monkeypatch):
    for key in EXACT_RSS_ENV:
        monkeypatch.delenv(key, raising=False)
    assert not benchmarking.exact_rss()
    for key, value in EXACT_RSS_ENV.items():
        monkeypatch.setenv(key, value)
    assert benchmarking.exact_rss()
    monkeypatch.setenv(next(iter(EXACT_RSS_ENV)), '12345')
    assert not benchmarking.exact_rss()


# -------------------------------------------------------------------- checkpoint coverage
def _tiny_backbone(attn_cfg: Union[str, Sequence[str]] = 'softmax', img_size: int = 32
                   ) -> VisionTransformer:
    return VisionTransformer(dict(embed_dims=16, num_layers=2, num_heads=2,
                                  mlp_hidden_dims=32), attn_cfg=attn_cfg, img_size=img_size,
                             patch_size=PATCH)


def _model(attn_cfg: Union[str, Sequence[str]] = 'softmax', img_size: int = 32) -> nn.Module:
    """backbone + head + a module named ``submodule`` (its keys contain ``module.``)."""
    return nn.ModuleDict(dict(backbone=_tiny_backbone(attn_cfg, img_size),
                              head=nn.Linear(16, 3), submodule=nn.Linear(2, 2)))


def _without_records(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A checkpoint from before the training records (official / older files)."""
    optional = set(VisionTransformer.OPTIONAL_CHECKPOINT_KEYS)
    return {k: v for k, v in state.items() if k.split('.')[-1] not in optional}


def test_optional_keys_prefix_and_position_grid_are_covered():
    from mmlinvit.engine.checkpoint_coverage import (check_checkpoint_covers,
                                                     mismatched_shapes, uncovered_keys)
    model = _model()
    state = _without_records(model.state_dict())
    assert len(state) < len(model.state_dict())
    assert uncovered_keys(model, state) == []
    assert uncovered_keys(model, {f'module.{k}': v for k, v in state.items()}) == []
    # a position grid of another size is resampled on load, other shapes are skipped
    other_grid = dict(state, **{'backbone.pos_embed': _model(img_size=48).state_dict()[
        'backbone.pos_embed']})
    assert mismatched_shapes(model, other_grid) == []
    check_checkpoint_covers(model, {'state_dict': other_grid}, 'grid.pth')
    wide = dict(state, **{'head.weight': torch.zeros(5, 16)})
    assert mismatched_shapes(model, wide) == ['head.weight: checkpoint (5, 16) vs model (3, 16)']


def test_missing_weights_are_reported_before_shapes_with_per_module_counts():
    from mmlinvit.engine.checkpoint_coverage import (CheckpointCoverageError,
                                                     check_checkpoint_covers)
    model = _model()
    state = model.state_dict()
    total = len(state)
    partial = {k: v for k, v in state.items() if not k.startswith('head.')}
    partial['submodule.weight'] = torch.zeros(3, 3)  # also another shape
    with pytest.raises(CheckpointCoverageError,
                       match=rf'^x\.pth does not hold 2 of the {total} weights .*missing per '
                             r'module: head 2/2 \(head\.bias, head\.weight\)'):
        check_checkpoint_covers(model, {'state_dict': partial}, 'x.pth')
    half = {k: v for k, v in state.items() if not k.startswith('backbone.blocks.1')}
    with pytest.raises(CheckpointCoverageError, match=r'backbone \d+/\d+\b'):
        check_checkpoint_covers(model, half, 'y.pth')


def test_a_bare_backbone_softmax_checkpoint_is_refused_for_a_linear_model():
    """Without a prefix (the bare backbone is the model) the operator record is found too."""
    from mmlinvit.engine.checkpoint_coverage import (CheckpointCoverageError,
                                                     check_checkpoint_covers)
    softmax = _tiny_backbone('softmax').state_dict()
    with pytest.raises(CheckpointCoverageError,
                       match=r"the model to evaluate \(the model\) runs \['elu'\] in blocks "
                             r"\[0, 1\].*--cfg-options \"model\.attn_cfg='softmax'\""):
        check_checkpoint_covers(_tiny_backbone('elu'), softmax, 'softmax.pth')


def test_hybrid_checkpoint_names_its_softmax_blocks_and_list_fix():
    from mmlinvit.engine.checkpoint_coverage import (CheckpointCoverageError,
                                                     check_evaluated_operators)
    state = _model(['softmax', 'elu']).state_dict()
    with pytest.raises(CheckpointCoverageError,
                       match=r"in blocks \[0\].*model\.backbone\.attn_cfg=\['softmax', 'elu'\]"):
        check_evaluated_operators(_model(['elu', 'elu']), state, 'hybrid.pth')
    check_evaluated_operators(_model(['softmax', 'relu']), state, 'hybrid.pth')


def test_linear_weights_for_another_linear_operator_are_left_to_the_load():
    """Only softmax-trained weights are refused here; an ELU checkpoint given to a ReLU model
    is refused by the load itself (the block_operators record)."""
    from mmlinvit.engine.checkpoint_coverage import check_checkpoint_covers
    elu = _model('elu').state_dict()
    relu_model = _model('relu')
    check_checkpoint_covers(relu_model, elu, 'elu.pth')
    with pytest.raises(Exception, match='elu'):
        relu_model.load_state_dict(elu)


def test_training_load_from_thresholds_frozen_pretrained_and_grid():
    from mmlinvit.engine.checkpoint_coverage import (CheckpointCoverageError,
                                                     check_training_load_from)
    model = _model()
    state = _without_records(model.state_dict())
    keys = [k for k in state if k.startswith('backbone.')]
    required = [k for k in model.state_dict() if k.startswith('backbone.')
                and k.split('.', 1)[1] not in VisionTransformer.OPTIONAL_CHECKPOINT_KEYS]
    assert sorted(keys) == sorted(required) and len(keys) % 2 == 0
    half = {k: state[k] for k in keys[:len(keys) // 2]}
    check_training_load_from(model, half, 'half.pth')  # half is enough
    less = {k: state[k] for k in keys[:len(keys) // 2 - 1]}
    with pytest.raises(CheckpointCoverageError,
                       match=rf"holds {len(keys) // 2 - 1} of the {len(keys)} weights of the "
                             r"trainable backbone 'backbone'"):
        check_training_load_from(model, less, 'less.pth')
    model.backbone.pretrained = 'backbone.pth'  # its weights come from pretrained=
    check_training_load_from(model, less, 'less.pth')
    model.backbone.pretrained = None
    model.backbone.requires_grad_(False)  # a frozen teacher
    check_training_load_from(model, {}, 'empty.pth')
    model.backbone.blocks[0].attn.requires_grad_(True)  # Stage 1: only attention trains
    with pytest.raises(CheckpointCoverageError, match='trainable backbone'):
        check_training_load_from(model, {}, 'empty.pth')
    model.backbone.requires_grad_(True)
    grid = dict(state, **{'backbone.pos_embed': _model(img_size=48).state_dict()[
        'backbone.pos_embed']})
    check_training_load_from(model, grid, 'grid.pth')


def test_operator_record_of_another_depth_is_reported_as_a_shape():
    """A softmax checkpoint of a deeper model: its block_operators record does not line up
    with the model's blocks, so the shape check names it (no per-block operator comparison
    on a truncated record)."""
    from mmlinvit.engine.checkpoint_coverage import (CheckpointCoverageError,
                                                     check_checkpoint_covers)
    deeper = VisionTransformer(dict(embed_dims=16, num_layers=3, num_heads=2,
                                    mlp_hidden_dims=32), attn_cfg='softmax', img_size=32,
                               patch_size=PATCH).state_dict()
    with pytest.raises(CheckpointCoverageError,
                       match=r'another shape.*block_operators: checkpoint \(3, '):
        check_checkpoint_covers(_tiny_backbone('elu'), deeper, 'deeper.pth')


def test_analytic_flops_read_scoped_operator_names_as_the_backbone_does() -> None:
    """``dict(type='mmlinvit.elu')`` (the scoped spelling a config may use) counts as ``'elu'``."""
    from mmlinvit.analysis.flops import analytic_vit_flops
    kwargs = dict(img_size=64, patch_size=16, embed_dims=64, num_layers=2, num_heads=2,
                  mlp_hidden_dims=128)
    bare = analytic_vit_flops(attention='elu', **kwargs)
    assert analytic_vit_flops(attention=dict(type='mmlinvit.elu'), **kwargs) == bare
    assert analytic_vit_flops(attention=['mmlinvit.elu', dict(type='elu')], **kwargs) == bare
