"""Mutation round 18: the GPU suite's paths that only a CUDA run takes, checked on CPU.

The suite runs once on a rented GPU with a few minutes of budget, and its ``--dry-run`` on
CPU never enters the ``device.type == 'cuda'`` branches.  Rounds 12, 13 and 17
(``test_mutation_round12_gpu_suite.py``, ``test_mutation_round13_gpu_suite_rest.py``,
``tests/ops/test_mutation_round17_ops_checks.py``) pinned the formulas and the verdict
thresholds; the tests below guard what their mutants left open, each against a value worked
out by hand, torch's own API or the documented contract, with CUDA replaced by stand-ins
(a fake device whose ``type`` is ``'cuda'``, fixed timers, recording profilers):

* :mod:`~mmlinvit.analysis.gpu_suite.metadata`: ``nvidia-smi`` is called with a timeout and a
  hung one is reported, not raised;
* :mod:`~mmlinvit.analysis.gpu_suite.verdicts`: a baseline is one of the row's own pair and
  size, the target size is (H, W) as the sections write it, the B-pair softmax model is no
  ViT-L/14 baseline, a skipped FlashAttention baseline gives torch's reason, the CPU aten op
  names the kernel where no device kernel was profiled, the spread reads min / median / max;
* :mod:`~mmlinvit.analysis.gpu_suite.timing`: a failed capture whose synchronize raises (a
  sticky CUDA error) still falls back, and an event's time is read after it completed;
* :mod:`~mmlinvit.analysis.gpu_suite.backbone_sections`: on CUDA the models run in bf16, the
  FlashAttention member under ``SDPBackend.FLASH_ATTENTION`` only, replays per round from the
  eager median, graph medians and capture notes, a model timed alone when its partner failed;
  the hook of :func:`block_tokens` removed; the ViT-L/14 pair is DINOv2's patch 14 and the
  linear member really is ELU + 1 attention; the per-kernel profile (sort, units, shares,
  device kernels only on CUDA, the larger pair size);
* :mod:`~mmlinvit.analysis.gpu_suite.sweeps`: CUDA-graph times on CUDA, bf16 inputs on the GPU
  run, every launch variant of the full sweep names a real ``_LaunchConfig`` field (the dry
  run tries only the first two of each list), the SSD gradient columns in leaf order, the
  small / large token counts, the per-list limit, the SSD sweep only where asked;
* :mod:`~mmlinvit.analysis.gpu_suite.op_sections`: the ceilings' 1 GiB copy and 8192^3
  matmul, the ``BW from`` order (forward first, the one the verdict reads) and the CUDA note,
  the replays of each graph timing sized by its own eager time, the PyTorch path timed in the
  same ELU + 1 mode as the kernel.
"""
import inspect
import subprocess
import sys
from types import SimpleNamespace
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import torch

from mmlinvit.analysis.gpu_suite import (backbone_sections, metadata, op_sections, sweeps,
                                         timing)
from mmlinvit.analysis.gpu_suite.run import SuiteRun
from mmlinvit.analysis.gpu_suite.sizes import Sizes, dry_sizes
from mmlinvit.analysis.gpu_suite.verdicts import backbone_ratios, verdicts

from test_mutation_round13_gpu_suite_rest import _FakeProfile

verdicts_module = sys.modules['mmlinvit.analysis.gpu_suite.verdicts']

CPU = torch.device('cpu')
#: A device the sections take for CUDA: only ``.type`` is read by the code under test.
FAKE_CUDA = SimpleNamespace(type='cuda')
_SDP_FLAGS = ('flash', 'mem_efficient', 'cudnn', 'math')


def _sdp_enabled() -> Dict[str, bool]:
    return {b: getattr(torch.backends.cuda, f'{b}_sdp_enabled')() for b in _SDP_FLAGS}


class _TorchOnCpu:
    """``torch`` as a section module sees it, with ``device=`` dropped from ``randn`` (the
    fake CUDA device is not a torch device); everything else is torch itself."""

    def __init__(self, log: Optional[List[tuple]] = None) -> None:
        self.log = log if log is not None else []

    def __getattr__(self, name: str) -> object:
        return getattr(torch, name)

    def randn(self, *shape: int, device: object = None, dtype: torch.dtype = torch.float32
              ) -> torch.Tensor:
        self.log.append((shape, dtype))
        return torch.randn(*shape, dtype=dtype)


# ----------------------------------------------------------------------------- metadata


def test_mig_mode_reports_a_hung_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants meta01 (only OSError caught) and meta07 (no timeout): ``nvidia-smi`` is asked
    with a finite timeout, and its ``TimeoutExpired`` (a ``SubprocessError``) is reported as
    the mode's reason instead of ending the run before the first measurement."""
    seen: List[dict] = []

    def hung(cmd: List[str], **kwargs: object) -> None:
        seen.append(kwargs)
        raise subprocess.TimeoutExpired(cmd, kwargs.get('timeout'))

    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')
    monkeypatch.setattr(metadata.shutil, 'which', lambda name: '/usr/bin/' + name)
    monkeypatch.setattr(metadata.subprocess, 'run', hung)
    assert metadata.mig_mode() == 'unknown (TimeoutExpired)'
    timeout = seen[0].get('timeout')
    assert timeout is not None and 0 < timeout <= 60


# ----------------------------------------------------------------------------- verdicts


def _row(model: str, role: str, ms: Optional[float], size: str, pair: str = 'ViT-L/14',
         **extra: object) -> Dict[str, object]:
    return dict(pair=pair, model=model, role=role, size=size, ms=ms, **extra)


def test_backbone_ratios_take_the_baseline_of_the_rows_own_size() -> None:
    """Mutant verd01 (size ignored): at 518 the softmax model takes 4 ms, at 1024 16 ms; the
    ELU model's 2 and 4 ms give 2x and 4x, each against its own size (listed first, the
    other size's baseline would be found first)."""
    rows = [_row('ViT-L/14 softmax', 'softmax', 4.0, '518x518', **{'act MiB': 100.0}),
            _row('ViT-L/14 softmax', 'softmax', 16.0, '1024x1024', **{'act MiB': 400.0}),
            _row('ViT-L/14 elu', 'linear', 4.0, '1024x1024', **{'act MiB': 100.0}),
            _row('ViT-L/14 elu', 'linear', 2.0, '518x518', **{'act MiB': 50.0})]
    backbone_ratios(rows)
    assert rows[2]['speed x'] == pytest.approx(16.0 / 4.0)
    assert rows[2]['mem frac'] == pytest.approx(100.0 / 400.0)
    assert rows[3]['speed x'] == pytest.approx(4.0 / 2.0)
    assert rows[3]['mem frac'] == pytest.approx(50.0 / 100.0)


def test_memory_target_is_judged_against_the_flash_attention_model() -> None:
    """Finding (round 18): the issue's memory target is "1.7x the softmax model with
    FlashAttention, at no more than 40% of its memory"; only the default-dispatch model was
    compared.  Here the default (cuDNN) softmax model holds 200 MiB, the FlashAttention one
    100 MiB, the ELU model 60 MiB: 30% of the first but 60% of the second, so NOT met."""
    size = '1024x1024'
    rows = [_row('ViT-L/14 softmax', 'softmax', 10.0, size, kernel='cudnn', **{'act MiB': 200.0}),
            _row('ViT-L/14 softmax [flash]', 'softmax-flash', 10.0, size, kernel='flash_fwd',
                 **{'act MiB': 100.0}),
            _row('ViT-L/14 elu', 'linear', 5.0, size, **{'act MiB': 60.0})]
    backbone_ratios(rows)
    assert rows[2]['mem frac'] == pytest.approx(60.0 / 200.0)
    assert rows[2]['mem frac flash'] == pytest.approx(60.0 / 100.0)
    memory = verdicts([], rows)[-1]
    assert 'MEMORY' in memory and '60% of the softmax model\'s with FlashAttention' in memory
    assert '30%' in memory and memory.endswith('NOT met')
    rows[1]['act MiB'] = 200.0  # FlashAttention model as large: 30% of both -> met
    backbone_ratios(rows)
    assert verdicts([], rows)[-1].endswith(': met')


def _target_rows(size: str, flash: Optional[Dict[str, object]] = None
                 ) -> List[Dict[str, object]]:
    """A ViT-L/14 pair at ``size``: ELU 2x faster than both baselines, 30 % of the memory."""
    rows = [_row('ViT-L/14 softmax', 'softmax', 10.0, size, kernel='cudnn_sdpa'),
            flash if flash is not None else
            _row('ViT-L/14 softmax [flash]', 'softmax-flash', 10.0, size, kernel='flash_fwd'),
            _row('ViT-L/14 elu', 'linear', 5.0, size, **{
                'speed x': 2.0, 'graph speed x': 2.0, 'speed x flash': 2.0,
                'graph speed x flash': 2.0, 'mem frac': 0.3, 'act MiB': 30.0})]
    return rows


def test_verdicts_read_a_non_square_target_as_height_x_width() -> None:
    """Mutant verd02 (W x H): section 4 writes a size as f'{H}x{W}' (``backbone_sections``),
    so the target (512, 1024) is the row '512x1024', not '1024x512'."""
    lines = verdicts([], _target_rows('512x1024'), target_size=(512, 1024))
    assert len(lines) == 3 and all('512x1024' in line for line in lines)
    assert verdicts([], _target_rows('1024x512'), target_size=(512, 1024)) == []


def test_verdicts_baselines_are_the_vit_l_pairs_own() -> None:
    """Mutant verd03 (pair ignored): the B-pair's ViT-B/16 softmax model at the same size is
    no baseline of the ViT-L/14 targets, whichever comes last."""
    rows = _target_rows('1024x1024')
    decoy = _row('ViT-B/16 softmax', 'softmax', 1.0, '1024x1024', pair='B-pair',
                 kernel='DECOY_KERNEL')
    for bb_rows in (rows + [decoy], [decoy] + rows):
        default = verdicts([], bb_rows)[1]
        assert '[cudnn_sdpa]' in default and 'DECOY' not in default


def test_verdicts_skipped_flash_baseline_gives_torchs_reason() -> None:
    """Mutant verd04 (only ``error`` read): a FlashAttention baseline that torch refused has
    ``skipped`` (``sdpa_unavailable``'s reason), no ``ms``: the line says why."""
    flash = _row('ViT-L/14 softmax [flash]', 'softmax-flash', None, '1024x1024',
                 skipped='unavailable: Flash attention requires head dim <= 256')
    line = verdicts([], _target_rows('1024x1024', flash))[0]
    assert line.endswith('FlashAttention (SDPBackend.FLASH_ATTENTION): not measured '
                         '(unavailable: Flash attention requires head dim <= 256)')


def test_verdicts_name_the_aten_op_without_device_kernels_and_cut_long_names() -> None:
    """Mutants verd05 (no aten-op fallback) and verd06 (name not cut): on CPU no device
    kernel is profiled, the line names the aten op; a kernel name is cut at 70 characters."""
    long_kernel = 'k' * 100
    flash = _row('ViT-L/14 softmax [flash]', 'softmax-flash', 10.0, '1024x1024', kernel=None,
                 **{'aten op': 'aten::_scaled_dot_product_flash_attention_for_cpu'})
    rows = _target_rows('1024x1024', flash)
    rows[0]['kernel'] = long_kernel
    flash_line, default_line, _ = verdicts([], rows)
    assert '[aten::_scaled_dot_product_flash_attention_for_cpu]' in flash_line
    assert f'[{"k" * 70}]' in default_line and 'k' * 71 not in default_line


def test_verdicts_print_the_spread_as_min_median_max() -> None:
    """Mutant verd07 (median and max swapped): per-round ratios [1.5, 2.0, 3.0] over the 3
    graph rounds of the ELU model."""
    rows = _target_rows('1024x1024')
    rows[2].update({'graph speed x flash spread': [1.5, 2.0, 3.0],
                    'graph rounds ms': [1.0, 1.0, 1.0]})
    line = verdicts([], rows)[0]
    assert ('CUDA graph replay: 2.00x (min 1.50 / median 2.00 / max 3.00 over 3 interleaved '
            'rounds) -> met') in line


# ----------------------------------------------------------------------------- timing


class _StickyError(RuntimeError):
    pass


def test_graph_rounds_survive_a_sticky_error_after_a_failed_capture(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Mutant time03 (synchronize not guarded): a capture that fails can leave a CUDA error
    that the next synchronize raises; the capture is still reported as failed, the other
    function still timed (``graph_rounds``: 'capture is a measurement aid')."""
    def capture(fn: Callable[[], object], device: object) -> SimpleNamespace:
        if fn() == 'bad':
            raise RuntimeError('operation not permitted when stream is capturing')
        return SimpleNamespace(replay=lambda: None)

    def sync(device: object = None) -> None:
        raise _StickyError('CUDA error: operation failed due to a previous error')

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self) -> None:
            pass

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, end: 'Event') -> float:
            return 6.0

    monkeypatch.setattr(timing, 'capture_graph', capture)
    monkeypatch.setattr(torch.cuda, 'synchronize', sync)
    monkeypatch.setattr(torch.cuda, 'Event', Event)
    monkeypatch.setattr(torch.cuda, 'empty_cache', lambda: None)
    times, failed = timing.graph_rounds({'bad': lambda: 'bad', 'ok': lambda: 'ok'}, FAKE_CUDA,
                                        {'bad': 2, 'ok': 3}, rounds=2)
    assert times == {'ok': [2.0, 2.0]}
    assert failed == {'bad': 'RuntimeError: operation not permitted when stream is capturing'}
    assert 'bad: CUDA graph capture failed' in capsys.readouterr().out


def test_graph_rounds_read_the_time_after_the_end_event_completed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant time05 (no ``end.synchronize()``): ``Event.elapsed_time`` needs both events
    completed (CUDA raises 'device not ready' before); the stand-in raises likewise."""
    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.done = False

        def record(self) -> None:
            self.done = False

        def synchronize(self) -> None:
            self.done = True

        def elapsed_time(self, end: 'Event') -> float:
            if not end.done:
                raise RuntimeError('CUDA error: device not ready')
            return 8.0

    monkeypatch.setattr(timing, 'capture_graph',
                        lambda fn, device: SimpleNamespace(replay=lambda: None))
    monkeypatch.setattr(torch.cuda, 'Event', Event)
    monkeypatch.setattr(torch.cuda, 'empty_cache', lambda: None)
    times, failed = timing.graph_rounds({'f': lambda: None}, FAKE_CUDA, {'f': 4}, rounds=1)
    assert times == {'f': [2.0]} and failed == {}


# ----------------------------------------------------------------------------- backbones


class _Tiny(torch.nn.Module):
    """A backbone stand-in: tokens = pixels; records its dtype and the SDPA backends enabled
    during its last forward."""

    last_flags: Dict[str, bool] = {}

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        if fail:
            raise RuntimeError('CUDA out of memory')
        self.block_list = torch.nn.ModuleList([torch.nn.Identity()])
        self.scale = torch.nn.Parameter(torch.ones(1))
        self.moved_to: List[object] = []

    def to(self, device: object = None, dtype: Optional[torch.dtype] = None) -> '_Tiny':
        self.moved_to.append((device, dtype))
        return super().to(dtype=dtype)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        type(self).last_flags = _sdp_enabled()
        assert images.dtype == self.scale.dtype
        return self.block_list[0](images.flatten(2).transpose(1, 2)) * self.scale


def _cuda_backbones(monkeypatch: pytest.MonkeyPatch, eager: Dict[str, List[float]],
                    graph: Dict[str, List[float]], failed: Dict[str, str],
                    members: List[tuple]) -> Tuple[List[Dict[str, object]], Dict[str, object]]:
    """Section 4 on the fake CUDA device with fixed eager and graph times."""
    seen: Dict[str, object] = {'flags': {}, 'images': []}

    def eager_rounds(fns: Dict[str, Callable[[], object]], device: object,
                     repeats: int) -> Dict[str, List[float]]:
        for name, fn in fns.items():
            fn()
            seen['flags'][name] = dict(_Tiny.last_flags)
        return {name: eager[name] for name in fns}

    def graph_rounds(fns: Dict[str, Callable[[], object]], device: object,
                     replays: Dict[str, int], rounds: int = 5
                     ) -> Tuple[Dict[str, List[float]], Dict[str, str]]:
        seen['replays'] = dict(replays)
        return {k: v for k, v in graph.items() if k in fns}, dict(failed)

    monkeypatch.setattr(backbone_sections, 'torch', _TorchOnCpu(seen['images']))
    monkeypatch.setattr(backbone_sections, 'backbone_pairs',
                        lambda sizes: [('ViT-L/14', (2, 3), members)])
    monkeypatch.setattr(backbone_sections, 'attention_kernels',
                        lambda fn, device: {'aten op': 'a', 'kernel': 'k'})
    monkeypatch.setattr(backbone_sections, 'peak_mib', lambda fn, device: (fn(), 64.0)[1])
    monkeypatch.setattr(backbone_sections, 'eager_rounds', eager_rounds)
    monkeypatch.setattr(backbone_sections, 'graph_rounds', graph_rounds)
    monkeypatch.setattr(torch.cuda, 'empty_cache', lambda: None)
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda device=None: None)
    run = SuiteRun(FAKE_CUDA, dry=False)
    rows: List[Dict[str, object]] = []
    backbone_sections.section_backbones(run, dry_sizes(), rows)
    seen['errors'] = run.result['errors']
    return rows, seen


_MEMBERS = [('ViT-L/14 softmax', 'softmax', _Tiny, 'default'),
            ('ViT-L/14 softmax [flash]', 'softmax-flash', 'ViT-L/14 softmax', 'flash'),
            ('ViT-L/14 elu', 'linear', _Tiny, None)]


def test_section_backbones_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants bb04 (fp32 on the GPU run), bb05 (flash member under the default dispatch),
    bb06 (20 replays whatever the eager time), bb07 (graph min instead of median), bb08
    (capture note on the wrong rows).

    Eager medians 50, 100, 10 ms give ``replays_for`` 200 // 50 = 4, max(3, 2) = 3 and
    min(20, 20) = 20 replays; graph rounds [8, 9, 30] and [4, 4.5, 5] ms give medians 9 and
    4.5: graph speed 2.0x, per-round [2, 2, 6]; the flash member's capture failed."""
    eager = {'ViT-L/14 softmax': [40.0, 50.0, 60.0], 'ViT-L/14 softmax [flash]': [100.0] * 3,
             'ViT-L/14 elu': [9.0, 10.0, 11.0]}
    graph = {'ViT-L/14 softmax': [8.0, 9.0, 30.0], 'ViT-L/14 elu': [4.0, 4.5, 5.0]}
    failed = {'ViT-L/14 softmax [flash]': 'RuntimeError: capture'}
    before = _sdp_enabled()
    rows, seen = _cuda_backbones(monkeypatch, eager, graph, failed, _MEMBERS)
    assert seen['errors'] == {}, seen['errors']
    soft, flash, elu = rows
    assert seen['replays'] == {'ViT-L/14 softmax': 4, 'ViT-L/14 softmax [flash]': 3,
                               'ViT-L/14 elu': 20}
    assert soft['graph ms'] == 9.0 and elu['graph ms'] == 4.5 and flash['graph ms'] is None
    assert soft['graph rounds ms'] == [8.0, 9.0, 30.0] and flash['graph rounds ms'] is None
    assert flash['graph note'] == 'capture failed: RuntimeError: capture'
    assert 'graph note' not in soft and 'graph note' not in elu
    assert elu['graph speed x'] == pytest.approx(2.0)
    assert elu['graph speed x spread'] == pytest.approx([2.0, 2.0, 6.0])
    assert elu['graph speed x flash'] is None
    # the GPU run times bf16 models on bf16 images (fp32 only in the dry run)
    assert {dtype for _, dtype in seen['images']} == {torch.bfloat16}
    assert all(r['act MiB'] == 64.0 for r in rows)
    # the flash member runs under SDPBackend.FLASH_ATTENTION only, as torch's sdpa_kernel sets
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash_only = _sdp_enabled()
    assert seen['flags']['ViT-L/14 softmax [flash]'] == flash_only
    assert seen['flags']['ViT-L/14 softmax'] == before == seen['flags']['ViT-L/14 elu']
    assert _sdp_enabled() == before


def test_section_backbones_times_a_model_whose_partners_failed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant bb16 (timing only with two models or more): the softmax model ran out of
    memory at build, the flash member reuses it (fails too); the ELU model is still timed."""
    members = [('ViT-L/14 softmax', 'softmax', lambda: _Tiny(fail=True), 'default'),
               ('ViT-L/14 softmax [flash]', 'softmax-flash', 'ViT-L/14 softmax', 'flash'),
               ('ViT-L/14 elu', 'linear', _Tiny, None)]
    rows, seen = _cuda_backbones(monkeypatch, {'ViT-L/14 elu': [3.0, 4.0, 5.0]},
                                 {'ViT-L/14 elu': [2.0, 2.0, 2.0]}, {}, members)
    soft, flash, elu = rows
    assert soft['error'] == 'RuntimeError: CUDA out of memory'
    assert flash['error'].startswith('KeyError')
    assert elu['ms'] == 4.0 and elu['graph ms'] == 2.0 and 'error' not in elu
    assert elu['speed x'] is None  # the failed baseline has no time
    assert seen['replays'] == {'ViT-L/14 elu': 20}


def test_block_tokens_removes_its_hook() -> None:
    """Mutant bb01 (hook left on): a hook left on the first block would run in every timed
    call after it (and grow its list); none is left."""
    model = torch.nn.Module()
    model.block_list = torch.nn.ModuleList([torch.nn.Identity()])
    x = torch.zeros(1, 9, 4)
    assert backbone_sections.block_tokens(model, lambda: model.block_list[0](x)) == 9
    assert len(model.block_list[0]._forward_pre_hooks) == 0


def test_vit_l_pair_is_dinov2_patch_14_with_elu_attention() -> None:
    """Mutants bb02 (patch 16) and bb03 (the linear member built with softmax attention):
    DINOv2 ViT-L/14 (facebookresearch/dinov2 ``vit_large``: patch 14, 518 px) has
    1 + (112 / 14)^2 = 65 tokens at 112x112 (patch 16: 1 + 7^2 = 50); the softmax member runs
    the softmax operator, the linear member ELU + 1 linear attention in every block."""
    from mmlinvit.backbones.vit import operator_name
    (pair, hw, members), *_ = backbone_sections.backbone_pairs(dry_sizes())
    assert pair == 'ViT-L/14'
    softmax, elu = members[0][2](), members[2][2]()
    for model in (softmax, elu):
        assert model.patch_size == 14 and model.img_size == (518, 518)
        images = torch.zeros(1, 3, 112, 112)
        with torch.no_grad():
            assert backbone_sections.block_tokens(model, lambda m=model: m(images)) == 65
    assert {operator_name(c) for c in softmax.attn_cfgs} == {'softmax'}
    assert {operator_name(c) for c in elu.attn_cfgs} == {'elu'}


def _event(key: str, us: float, count: int = 1, device: str = 'CPU') -> SimpleNamespace:
    return SimpleNamespace(key=key, count=count, cpu_time_total=us, device_time_total=us,
                           device_type=SimpleNamespace(name=device))


def _profile(monkeypatch: pytest.MonkeyPatch, device: object, events: List[SimpleNamespace],
             top: int) -> Tuple[Dict[str, List[Dict[str, object]]], Dict[str, list]]:
    """section_profile with the backbones replaced by :class:`_Tiny` (their arguments and
    input sizes recorded) and the profiler by :class:`_FakeProfile`."""
    import torch.profiler

    import mmlinvit.backbones as backbones
    built: Dict[str, list] = {'vit': [], 'adventurer': [], 'images': []}

    def vit(*args: object, **kwargs: object) -> _Tiny:
        built['vit'].append((args, kwargs))
        return _Tiny()

    def adventurer(*args: object, **kwargs: object) -> _Tiny:
        built['adventurer'].append((args, kwargs))
        return _Tiny()

    _FakeProfile.events = events
    monkeypatch.setattr(torch.profiler, 'profile', _FakeProfile)
    monkeypatch.setattr(backbones, 'VisionTransformer', vit)
    monkeypatch.setattr(backbones, 'Adventurer', adventurer)
    monkeypatch.setattr(backbone_sections, 'synchronize', lambda device: None)
    monkeypatch.setattr(backbone_sections, 'torch', _TorchOnCpu(built['images']))
    sizes = dry_sizes()
    sizes.pair_sizes = [(16, 32), (32, 48)]
    run = SuiteRun(device, dry=device is CPU)
    out: Dict[str, List[Dict[str, object]]] = {}
    backbone_sections.section_profile(run, sizes, out, top=top)
    assert run.result['errors'] == {}, run.result['errors']
    return out, built


def test_section_profile_lists_the_heaviest_kernels_in_ms_with_shares(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants bb09 (ascending), bb10 (us / 1e6), bb12 (one row too many), bb13 (Adventurer
    at the smaller pair size): CPU times 100, 600, 300 us and an idle op: top 2 are 600 us
    (0.6 ms, 60 %) and 300 us (30 %), then the total 1.0 ms of 4 calls."""
    events = [_event('aten::add', 100.0), _event('aten::mm', 600.0, count=2),
              _event('aten::idle', 0.0, count=5), _event('aten::softmax', 300.0)]
    out, built = _profile(monkeypatch, CPU, events, top=2)
    assert list(out) == ['ViT-L/14 softmax 42', 'ViT-L/14 elu 42', 'Adventurer-B 32x48']
    assert out['ViT-L/14 elu 42'] == [
        {'kernel': 'aten::mm', 'calls': 2, 'ms': pytest.approx(0.6), 'share': pytest.approx(0.6)},
        {'kernel': 'aten::softmax', 'calls': 1, 'ms': pytest.approx(0.3),
         'share': pytest.approx(0.3)},
        {'kernel': 'TOTAL (all kernels)', 'calls': 4, 'ms': pytest.approx(1.0), 'share': 1.0}]
    assert [shape[2:] for shape, _ in built['images']] == [(42, 42), (42, 42), (32, 48)]
    assert [k['attn_cfg'] for _, k in built['vit']] == ['softmax', 'elu']
    assert all(k['patch_size'] == 14 and k['family'] == 'dinov2' for _, k in built['vit'])
    assert _FakeProfile.activities == [torch.profiler.ProfilerActivity.CPU]


def test_section_profile_on_cuda_counts_device_kernels_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant bb11 (CPU ops kept on CUDA): a CPU op's device time is the sum of its kernels
    (aten::mm 400 us = gemm 300 + 100); only the kernels are listed and summed: the gemm's
    share is 300 / 400, not 300 / 800, the total 0.4 ms."""
    events = [_event('aten::mm', 400.0, device='CPU'),
              _event('sm90_gemm_bf16', 300.0, device='CUDA'),
              _event('elementwise_kernel', 100.0, count=3, device='CUDA')]
    out, built = _profile(monkeypatch, FAKE_CUDA, events, top=12)
    rows = out['ViT-L/14 softmax 42']
    assert [r['kernel'] for r in rows] == ['sm90_gemm_bf16', 'elementwise_kernel',
                                           'TOTAL (all kernels)']
    assert rows[0]['share'] == pytest.approx(0.75) and rows[-1]['ms'] == pytest.approx(0.4)
    assert rows[-1]['calls'] == 4
    assert {dtype for _, dtype in built['images']} == {torch.bfloat16}
    assert _FakeProfile.activities == [torch.profiler.ProfilerActivity.CUDA]


# ----------------------------------------------------------------------------- sweeps


def test_sweep_on_cuda_takes_graph_replay_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant sw01 (eager times on CUDA): the sweep's times are CUDA-graph replays (the
    module's docstring), the eager timer is not used on CUDA."""
    class LaunchConfig:
        def __init__(self) -> None:
            self.tile = 1

    module = SimpleNamespace(_LaunchConfig=LaunchConfig, __name__='fake_kernel')
    monkeypatch.setattr(sweeps, 'graph_ms', lambda call, device, *a, **k: 7.0)
    monkeypatch.setattr(sweeps, 'bench_ms', lambda call, device, repeats: 99.0)
    x = torch.ones(3)
    rows = sweeps.sweep(module, [dict(tile=2)], [('c', lambda: x, lambda o: [o])],
                        deadline=float('inf'), device=FAKE_CUDA)
    assert rows == [{'variant': 'tile=2', 'c ms': 7.0, 'max rel err vs default': 0.0}]


def _section_sweeps(monkeypatch: pytest.MonkeyPatch, sizes: Sizes, dry: bool,
                    kernels: Tuple[str, ...] = ('la', 'ssd')
                    ) -> Tuple[Dict[str, dict], List[torch.dtype]]:
    """section_sweeps with ``sweep`` replaced by a recorder (nothing launched)."""
    from mmlinvit.analysis.kernel_checks import make_qkv
    la_module = SimpleNamespace(name='la')
    ssd_module = SimpleNamespace(name='ssd')
    calls: Dict[str, dict] = {}
    dtypes: List[torch.dtype] = []

    def record(module, variants, cases, deadline, device, exact=None, exact_names=None):
        calls[module.name] = dict(variants=variants, cases=[c[0] for c in cases], exact=exact,
                                  exact_names=exact_names)
        return []

    def qkv(*args: object) -> Tuple[torch.Tensor, ...]:
        dtypes.append(args[5])
        return make_qkv(*args)

    monkeypatch.setattr(sweeps, 'triton_kernels', lambda device: (la_module, ssd_module))
    monkeypatch.setattr(sweeps, 'sweep', record)
    monkeypatch.setattr(sweeps, 'make_qkv', qkv)
    sweeps.section_sweeps(SuiteRun(CPU, dry=dry), sizes, float('inf'), kernels)
    return calls, dtypes


def test_every_full_sweep_variant_names_a_launch_config_field(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant sw06 (a misspelt field past the dry run's first two variants): the dry run
    tries two variants per list; on the GPU every variant of every list runs, and a field
    ``_LaunchConfig`` lacks makes that variant an AttributeError row.  Every override of the
    full lists (``sweep_limit`` None) is a field of the real kernels' default configuration."""
    pytest.importorskip('triton')
    from mmlinvit.ops.linear_attention import triton_kernel as la_kernel
    from mmlinvit.ops.ssd import triton_kernel as ssd_kernel
    sizes = dry_sizes()
    sizes.sweep_limit = None
    calls, _ = _section_sweeps(monkeypatch, sizes, dry=False)
    la_fields = set(vars(la_kernel._LaunchConfig(64, 64, CPU, 'tf32')))
    ssd_fields = set(vars(ssd_kernel._LaunchConfig(256, 64, 64, 'tf32')))
    la_keys = {k for v in calls['la']['variants'] for k in v}
    ssd_keys = {k for v in calls['ssd']['variants'] for k in v}
    assert la_keys <= la_fields, la_keys - la_fields
    assert ssd_keys <= ssd_fields, ssd_keys - ssd_fields
    assert len(calls['la']['variants']) == 4 + 16 + 12 + 1 + 2
    assert len(calls['ssd']['variants']) == 16 + 8


def test_section_sweeps_cases_dtypes_limits_and_exact_outputs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants sw02 (fp32 on the GPU run), sw03 (SSD sweep only when not asked for), sw04 /
    sw08 (SSD gradient columns out of leaf order), sw05 (limit not applied to the last list),
    sw07 (the fp32 references keep autograd graphs), sw09 (small and large N swapped).

    The GPU run times bf16 inputs; the cases are the forward at the small then the large N and
    the f+b at the small N; each list holds at most ``sweep_limit`` variants; the SSD f+b
    references are the gradients of (x, dt, A, B, C, D), ``ssd_scan_torch``'s order, under the
    names d<leaf>."""
    from mmlinvit.ops.ssd import ssd_scan_torch
    sizes = dry_sizes()
    sizes.sweep_programs_out = (2, 4)
    calls, dtypes = _section_sweeps(monkeypatch, sizes, dry=False)
    assert dtypes and set(dtypes) == {torch.bfloat16}
    small, big = sizes.sweep_tokens
    assert small < big
    assert calls['la']['cases'] == [f'fwd N={small}', f'fwd N={big}', f'f+b N={small}']
    assert len(calls['la']['variants']) == 2 + 2 + 2 + len(sizes.sweep_programs) + 2
    assert calls['la']['variants'][-2:] == [dict(target_programs_out=2, num_stages=2),
                                            dict(target_programs_out=2, num_stages=3)]
    for ref in calls['la']['exact'].values():
        assert ref[0].dtype == torch.float32 and not ref[0].requires_grad
    length = sizes.sweep_ssd_length
    leaves = list(inspect.signature(ssd_scan_torch).parameters)[:6]
    assert calls['ssd']['exact_names'] == {f'f+b L={length}': tuple('d' + n for n in leaves)}
    s = sizes.ssd_shape
    want_shapes = {'x': (1, length, s['heads'], s['headdim']), 'dt': (1, length, s['heads']),
                   'A': (s['heads'], ), 'B': (1, length, s['groups'], s['d_state']),
                   'C': (1, length, s['groups'], s['d_state']), 'D': (s['heads'], )}
    grads = calls['ssd']['exact'][f'f+b L={length}']
    assert [tuple(g.shape) for g in grads] == [want_shapes[n] for n in leaves]
    assert calls['ssd']['cases'] == [f'fwd L={length}', f'f+b L={length}']
    calls, dtypes = _section_sweeps(monkeypatch, dry_sizes(), dry=True, kernels=('la', ))
    assert list(calls) == ['la'] and set(dtypes) == {torch.float32}


# ----------------------------------------------------------------------------- op sections


def test_ceilings_copy_one_gib_and_multiply_8192_squared(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Mutants op01 (half the copy) and op04 (a smaller matmul): the formulas count a 1 GiB
    bf16 copy (``2**30`` bytes read and written) and an 8192^3 matmul (the docstring), so the
    tensors must be those sizes."""
    shapes: List[tuple] = []

    def randn(*shape: int, device: object = None, dtype: torch.dtype = torch.float32
              ) -> torch.Tensor:
        shapes.append((shape, dtype))
        return torch.zeros(1)

    fake_torch = SimpleNamespace(randn=randn, empty_like=torch.empty_like,
                                 bfloat16=torch.bfloat16,
                                 cuda=SimpleNamespace(empty_cache=lambda: None))
    monkeypatch.setattr(op_sections, 'torch', fake_torch)
    monkeypatch.setattr(op_sections, 'bench_ms', lambda fn, device, repeats: 1.0)
    op_sections.section_ceilings(FAKE_CUDA)
    (copy_shape, copy_dtype), *matmul = shapes
    assert copy_dtype == torch.bfloat16
    assert copy_shape[0] * torch.finfo(torch.bfloat16).bits // 8 == 2**30
    assert matmul == [((8192, 8192), torch.bfloat16)] * 2


def _la_cuda(monkeypatch: pytest.MonkeyPatch, graphs: List[Tuple[Optional[float],
                                                                Optional[str]]]
             ) -> Tuple[Dict[str, object], List[Optional[float]], List[tuple],
                        List[Dict[str, object]]]:
    """Section 2 at N = 32 (H = 2, d = 16, bf16: 2048 bytes per tensor) on the fake CUDA
    device. Eager ms in call order: triton 2, triton f+b 5, torch 8, flash 3, flash f+b 9."""
    from mmlinvit.analysis.kernel_checks import make_qkv
    from mmlinvit.ops import linear_attention as la_package
    from mmlinvit.ops.linear_attention import linear_attention_torch
    eager: Iterator[float] = iter([2.0, 5.0, 8.0, 3.0, 9.0])
    graph_results = iter(graphs)
    eager_args: List[Optional[float]] = []
    torch_calls: List[tuple] = []
    real_la = la_package.linear_attention

    def bench(fn: Callable[[], object], device: object, repeats: int) -> float:
        fn()
        return next(eager)

    def try_graph(fn: Callable[[], object], device: object, eager_ms: Optional[float] = None
                  ) -> Tuple[Optional[float], Optional[str]]:
        eager_args.append(eager_ms)
        return next(graph_results)

    def spy_la(q, k, v, *args, **kwargs):
        torch_calls.append((q, args, kwargs))
        return real_la(q, k, v, *args, **kwargs)

    fake = SimpleNamespace(linear_attention_triton=lambda q, k, v, mode: (
        torch_calls.append((q, ('triton', mode), {})) or linear_attention_torch(q, k, v, mode)))
    monkeypatch.setattr(op_sections, 'triton_kernels', lambda device: (fake, fake))
    monkeypatch.setattr(op_sections, 'bench_ms', bench)
    monkeypatch.setattr(op_sections, 'try_graph_ms', try_graph)
    monkeypatch.setattr(op_sections, 'l2_bytes', lambda device: 1)
    monkeypatch.setattr(op_sections, 'L2_RULE_TOKENS', 16)
    monkeypatch.setattr(op_sections, 'make_qkv',
                        lambda n, m, h, d, e, dtype, device: make_qkv(n, m, h, d, e, dtype, CPU))
    monkeypatch.setattr(op_sections, 'sdpa_unavailable',
                        lambda fn, backend: None if backend == 'flash' else 'not here')
    monkeypatch.setattr(op_sections, 'attention_kernels', lambda fn, device: {'aten op': 'x'})
    monkeypatch.setattr(la_package, 'linear_attention', spy_la)
    sizes = dry_sizes()
    sizes.la_bench_tokens = [32]
    run = SuiteRun(FAKE_CUDA, dry=False)
    run.copy_bw = None
    rows: List[Dict[str, object]] = []
    sdpa_rows: List[Dict[str, object]] = []
    op_sections.section_linear_attention(run, sizes, 1.6384e7, rows, sdpa_rows)
    assert run.result['errors'] == {}, run.result['errors']
    return rows[0], eager_args, torch_calls, sdpa_rows


def test_section_2_bandwidth_from_a_graph_forward_and_an_eager_backward(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants op02 (``BW from`` written f+b first) and op03 (the note without the f+b
    reason): the forward captured (1 ms), the f+b not: ``'graph/eager'`` (the verdict reads
    the first part), HBM fwd 4 x 2048 B / 1 ms = 8.192e6 B/s = 50 % of 1.6384e7, HBM f+b
    11 x 2048 B / 5 ms (eager) = 27.5 %, and the note names the f+b capture's failure."""
    row, _, _, _ = _la_cuda(monkeypatch, [(1.0, None), (None, 'capture failed: f+b'),
                                       (1.5, None)])
    assert row['BW from'] == 'graph/eager'
    assert row['BW note'] == 'eager times used: capture failed: f+b'
    assert row['HBM fwd'] == pytest.approx(0.5)
    assert row['HBM f+b'] == pytest.approx(0.275)
    monkeypatch.setattr(verdicts_module, 'L2_RULE_TOKENS', 16)  # N = 32 stands for >= 16k
    assert verdicts([row], [])[0].startswith(
        'kernel HBM bandwidth (forward, N >= 16k, working set > L2; CUDA graph replay)')


def test_section_2_graph_replays_sized_by_each_calls_eager_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants op09 / op13 (``eager_ms`` not handed on: 20 replays x 5 rounds of a slow call
    on the GPU budget): each graph timing gets the eager time of the same call (triton 2,
    triton f+b 5, flash 3 ms); the PyTorch path (mutant op14) is timed in the kernel's ELU + 1
    mode on the kernel's inputs, with backend 'torch'; the default SDPA row (mutant op08) holds
    its profiled aten op only."""
    row, eager_args, torch_calls, sdpa_rows = _la_cuda(monkeypatch, [(1.0, None), (4.0, None),
                                                                     (1.5, None)])
    assert eager_args == [2.0, 5.0, 3.0]
    # mutant op08: the default dispatch is profiled (its aten op), never probed nor timed
    default = next(r for r in sdpa_rows if r['sdpa'] == 'default')
    assert default == {'N': 32, 'sdpa': 'default', 'aten op': 'x'}
    triton_q = [q for q, args, _ in torch_calls if args[:1] == ('triton', )]
    torch_runs = [(q, args, kwargs) for q, args, kwargs in torch_calls
                  if args[:1] != ('triton', )]
    assert torch_runs and all(args == ('elu', ) and kwargs == {'backend': 'torch'}
                              for _, args, kwargs in torch_runs)
    assert all(q is triton_q[0] for q, _, _ in torch_runs)
    assert {args[1] for _, args, _ in torch_calls if args[:1] == ('triton', )} == {'elu'}
    assert row['torch/triton'] == pytest.approx(4.0)
