"""Optimizer constructors, gradient accumulation, per-sample seeding and the pad-size check on
branches no other test reached (mutation round 10): each test below failed on at least one
single-line change of the module that the rest of the suite let pass.

Guarded here, each against an independent computation:

* ``LayerDecayOptimWrapperConstructor``: per parameter, the lr / lr_scale / weight decay that
  mmseg's own ``LearningRateDecayOptimizerConstructor`` (BEiT / MAE rule) gives the same
  ViT, tokens without weight decay as in the BEiT / MAE / DINOv2 code, register tokens at
  depth 0 (DINOv2's ``get_vit_lr_decay_rate``); the checks of ``get_layer_depth`` results,
  of the decay rate, of unknown keys and of ``first_depth_names``;
* ``FrozenAwareOptimWrapperConstructor``: the one-line summary (none without frozen
  parameters, indices of frozen list entries collapsed) and mmengine's other log records;
* ``adapt_to_accumulation`` / ``check_amp_device``: scoped hook / wrapper types, mmengine's
  EMA and checkpoint defaults, the per-step EMA momentum measured on mmengine's EMA, a base
  batch not divisible by k;
* ``sample_seeding``: seed 0 and negative seeds, ``set_epoch`` reaching a shuffling sampler,
  the inner sampler's seed, ``skip`` only where the wrapped sampler has it, CUDA generators
  untouched, unseeded plain indices, iterable data sets refused;
* ``find_pad_size_problem``: the pixel factor of a non-square crop, scoped transform types,
  non-dict pipeline entries, ``RandomResizedCrop`` (always resized to its scale).
"""
import inspect
import logging
import random
from types import SimpleNamespace
from typing import Dict, List, Tuple

import numpy as np
import pytest
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.dataset import DefaultSampler, InfiniteSampler
from mmengine.hooks import CheckpointHook
from mmengine.model import ExponentialMovingAverage
from mmseg.engine.optimizers import LearningRateDecayOptimizerConstructor

import mmlinvit.engine.accumulation as acc
from mmlinvit.backbones import VisionTransformer
from mmlinvit.engine.optimizers import (FrozenAwareOptimWrapperConstructor,
                                        LayerDecayOptimWrapperConstructor)
from mmlinvit.engine.pad_size_check import find_pad_size_problem
from mmlinvit.engine.sample_seeding import (SampleSeedDataset, SampleSeedSampler,
                                            build_sample_seed_sampler, sample_seed,
                                            seeded_streams)

from train_testing import captured_log

TINY = dict(embed_dims=16, num_layers=3, num_heads=2, mlp_hidden_dims=32)
WRAPPER = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.0, weight_decay=0.1))


# ------------------------------------------------------------------ layer-wise lr decay
class TinySegmentor(nn.Module):
    """A DINOv2-style ViT (class, register and mask tokens) and a head outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = VisionTransformer(TINY, family='dinov2', img_size=32, patch_size=8,
                                          out_type='featmap', num_reg_tokens=1,
                                          with_mask_token=True)
        self.head = nn.Conv2d(16, 4, 1)


class MAEMirror(nn.Module):
    """The same parameter objects under mmseg's MAE / BEiT names (``layers.i``): mmseg's
    constructor picks its ViT rule from the class name (``'MAE'`` in it)."""

    def __init__(self, vit: nn.Module) -> None:
        super().__init__()
        for name, param in vit.named_parameters(recurse=False):
            setattr(self, name, param)
        for name, child in vit.named_children():
            setattr(self, 'layers' if name == 'blocks' else name, child)


class Mirror(nn.Module):
    """``backbone`` (as :class:`MAEMirror`) and ``head`` of a :class:`TinySegmentor`."""

    def __init__(self, model: TinySegmentor) -> None:
        super().__init__()
        self.backbone = MAEMirror(model.backbone)
        self.head = model.head


def _by_param(optimizer) -> Dict[int, Tuple[float, float, float]]:
    """id(param) -> (lr, lr_scale, weight_decay) of its group."""
    return {id(p): (g['lr'], g['lr_scale'], g['weight_decay'])
            for g in optimizer.param_groups for p in g['params']}


def _ours(model: nn.Module, rate: float = 0.5, **extra):
    return LayerDecayOptimWrapperConstructor(
        dict(WRAPPER), paramwise_cfg=dict(layer_decay_rate=rate, **extra))(model).optimizer


@pytest.mark.parametrize('rate', [0.5, 0.75])
def test_groups_match_mmsegs_layer_decay_constructor(rate: float):
    """lr, lr_scale and weight decay of every parameter equal those of mmseg's
    ``LearningRateDecayOptimizerConstructor`` on the same parameters, except:

    * class / mask tokens and pos_embed: mmseg compares the full name with ``'pos_embed'`` /
      ``'cls_token'``, which never matches ``backbone.pos_embed``, so it decays them; the
      BEiT / MAE / DINOv2 code (and mmpretrain's configs, ``custom_keys``) do not;
    * the register token (mmseg's ViTs have none) is at depth 0 as in DINOv2's
      ``get_vit_lr_decay_rate``: lr ``rate ** (num_layers + 1)``, no weight decay.
    """
    model = TinySegmentor()
    ours = _by_param(_ours(model, rate))
    mmseg_ctor = LearningRateDecayOptimizerConstructor(
        dict(WRAPPER), dict(num_layers=TINY['num_layers'], decay_rate=rate))
    theirs = _by_param(mmseg_ctor(Mirror(model)).optimizer)
    params = dict(model.named_parameters())
    assert set(ours) == {id(p) for p in params.values()}
    stem = rate**(TINY['num_layers'] + 1)
    tokens = {'backbone.cls_token', 'backbone.mask_token', 'backbone.pos_embed'}
    for name, param in params.items():
        lr, lr_scale, wd = ours[id(param)]
        if name == 'backbone.reg_token':
            assert (lr, lr_scale, wd) == (pytest.approx(stem), pytest.approx(stem), 0.0)
            continue
        t_lr, t_scale, t_wd = theirs[id(param)]
        assert lr == pytest.approx(t_lr) and lr_scale == pytest.approx(t_scale), name
        assert wd == (0.0 if name in tokens else t_wd), name


def test_groups_match_mmpretrains_constructor_with_its_vit_depths():
    """mmpretrain's ``LearningRateDecayOptimWrapperConstructor`` with its ViT's
    ``get_layer_depth`` (``layers.i``) and its recipe (``flat_decay_mult=0``, ``.cls_token`` /
    ``.pos_embed`` without decay): the same lr, lr_scale and weight decay per parameter."""
    from mmpretrain.engine.optimizers import LearningRateDecayOptimWrapperConstructor
    from mmpretrain.models.backbones import VisionTransformer as PretrainViT

    model = nn.Module()
    model.backbone = VisionTransformer(TINY, img_size=32, patch_size=8, out_type='featmap')
    model.head = nn.Linear(16, 4)
    depth_of = SimpleNamespace(num_layers=TINY['num_layers'])

    def get_layer_depth(name: str) -> Tuple[int, int]:
        return PretrainViT.get_layer_depth(depth_of, name.replace('.blocks.', '.layers.'),
                                           'backbone.')

    model.get_layer_depth = get_layer_depth
    theirs = LearningRateDecayOptimWrapperConstructor(dict(WRAPPER), dict(
        layer_decay_rate=0.6, flat_decay_mult=0.0,
        custom_keys={'.cls_token': dict(decay_mult=0.0),
                     '.pos_embed': dict(decay_mult=0.0)}))(model).optimizer
    ours = _by_param(_ours(model, 0.6))
    for group in theirs.param_groups:
        (param, ) = group['params']
        assert ours[id(param)] == (pytest.approx(group['lr']), pytest.approx(group['lr_scale']),
                                   group['weight_decay']), group['param_name']


class _BadDepths(VisionTransformer):
    """A backbone whose ``get_layer_depth`` returns ``answer`` for block 0's parameters."""

    answer: Tuple[int, int] = (0, 0)

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        if param_name.startswith(prefix + 'blocks.0.'):
            return self.answer
        return super().get_layer_depth(param_name, prefix)


@pytest.mark.parametrize('answer', [(1, 6), (5, 5), (-1, 5)])
def test_out_of_range_depths_are_refused(answer: Tuple[int, int]):
    """3 blocks: 5 depths 0..4.  Another total, depth 5 (= total, lr ``rate ** -1``) and a
    negative depth (lr above the base lr) are refused, naming the parameter."""
    model = nn.Module()
    model.backbone = _BadDepths(TINY, img_size=32, patch_size=8, out_type='featmap')
    model.backbone.answer = answer
    with pytest.raises(ValueError, match=r"get_layer_depth\('backbone\.blocks\.0\..*expected "
                                         r"0 <= depth < 5"):
        _ours(model)


@pytest.mark.parametrize('rate,ok', [(0.0, False), (1.0, True), (1.5, False)])
def test_decay_rate_bounds(rate: float, ok: bool):
    """``layer_decay_rate`` in (0, 1]: 1 is no decay (every lr the base lr); 0 would zero every
    lr below the head, above 1 raises the early layers' lr."""
    if not ok:
        with pytest.raises(ValueError, match='layer_decay_rate must be in'):
            _ours(TinySegmentor(), rate)
        return
    optimizer = _ours(TinySegmentor(), rate)
    assert {g['lr'] for g in optimizer.param_groups} == {1.0}


def test_unknown_paramwise_keys_are_refused():
    """mmpretrain-style keys (``custom_keys``, ``norm_decay_mult``) are not read here: refused
    instead of silently ignored."""
    with pytest.raises(KeyError, match=r"Unknown paramwise_cfg keys \['custom_keys'\]"):
        _ours(TinySegmentor(), 0.5, custom_keys={'head': dict(lr_mult=10.0)})


def test_missing_lr_is_named():
    """An optimizer config without ``lr``."""
    ctor = LayerDecayOptimWrapperConstructor(
        dict(type='OptimWrapper', optimizer=dict(type='SGD')),
        paramwise_cfg=dict(layer_decay_rate=0.5))
    with pytest.raises(KeyError, match='needs optimizer.lr'):
        ctor(TinySegmentor())


def test_first_depth_names_each_fragment_and_only_outside_the_backbone():
    """Each of several fragments places its parameter at depth 0; a fragment that matches a
    backbone parameter only is refused; without the option a head ``*_embed`` stays at the
    head's depth."""
    model = TinySegmentor()
    model.query_embed = nn.Embedding(4, 16)
    model.level_embed = nn.Embedding(2, 16)
    stem = 0.5**(TINY['num_layers'] + 1)
    optimizer = _ours(model, first_depth_names=['query_embed', 'level_embed'])
    lr_of = {n: g['lr'] for g in optimizer.param_groups for n in g['param_names']}
    assert lr_of['query_embed.weight'] == lr_of['level_embed.weight'] == pytest.approx(stem)
    with pytest.raises(KeyError, match=r"\['pos_embed'\] match no parameter outside"):
        _ours(model, first_depth_names=['query_embed', 'pos_embed'])
    lr_of = {n: g['lr'] for g in _ours(model).param_groups for n in g['param_names']}
    assert lr_of['query_embed.weight'] == lr_of['level_embed.weight'] == 1.0


def test_groups_record_the_backbones_depth():
    """Each group's ``layer_depth`` is the backbone's depth of its parameters."""
    model = TinySegmentor()
    for group in _ours(model).param_groups:
        for name in group['param_names']:
            expected = (model.backbone.get_layer_depth(name, 'backbone.')[0]
                        if name.startswith('backbone.') else TINY['num_layers'] + 1)
            assert group['layer_depth'] == expected, name


# ------------------------------------------------------------ frozen-aware constructor
FROZEN_CFG = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05))


def _frozen_summary(model: nn.Module, **paramwise) -> Tuple[List[str], List[str]]:
    """(summary lines, all INFO+ messages) of building the optimizer of ``model`` (with a
    ``paramwise_cfg``: without one mmengine hands ``model.parameters()`` over as they are)."""
    paramwise = dict(dict(norm_decay_mult=0.0), **paramwise)
    with captured_log(logging.INFO) as messages:
        FrozenAwareOptimWrapperConstructor(dict(FROZEN_CFG), paramwise)(model)
    return [m for m in messages if m.startswith('Not optimised')], list(messages)


def test_no_summary_without_frozen_parameters():
    """A fully trained model, parameter-free modules (activations, dropout) included: no
    'Not optimised' line."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Dropout(0.1), nn.Linear(4, 2))
    summary, _ = _frozen_summary(model)
    assert summary == []


def test_frozen_list_entries_are_collapsed_and_other_names_kept():
    """``trunk.0`` and ``trunk.1`` (frozen whole, beside a trained ``trunk.2``) are reported as
    ``trunk.*``; a name that merely contains digits (``stage2``) is kept as it is."""
    model = nn.Module()
    model.trunk = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
    model.stage2 = nn.Linear(4, 4)
    for module in (model.trunk[0], model.trunk[1], model.stage2):
        module.requires_grad_(False)
    summary, _ = _frozen_summary(model)
    assert summary == ['Not optimised (requires_grad=False): 6 parameter tensors of '
                       'stage2 (2), trunk.* (4)'], summary


def test_mmengines_other_log_records_still_pass():
    """Only the per-parameter 'is skipped' warnings are counted away: mmengine's
    ``paramwise_options -- <name>:<key>=<value>`` lines of a ``custom_keys`` entry stay."""
    model = nn.Module()
    model.body = nn.Linear(4, 4)
    model.head = nn.Linear(4, 2)
    model.body.requires_grad_(False)
    _, messages = _frozen_summary(model, custom_keys={'head': dict(lr_mult=10.0)})
    assert any(m.startswith('paramwise_options -- head.weight:lr=') for m in messages), messages


# ------------------------------------------------------------------ gradient accumulation
@pytest.fixture
def acc_log(monkeypatch) -> List[str]:
    """The messages ``mmlinvit.engine.accumulation`` logs."""
    seen: List[str] = []
    monkeypatch.setattr(acc, 'print_log', lambda msg, **kw: seen.append(msg))
    return seen


def _acc_cfg(counts: int, **extra) -> Config:
    return Config(dict(optim_wrapper=dict(type='OptimWrapper', accumulative_counts=counts),
                       **extra))


def _ema_weight_after(momentum: float, updates: int) -> float:
    """The weight of new parameters after ``updates`` EMA updates (mmengine's EMA), i.e. the
    momentum those updates act with together."""
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    ema = ExponentialMovingAverage(model, momentum=momentum)
    ema.update_parameters(model)  # the first update copies the weights (0)
    with torch.no_grad():
        model.weight.fill_(1.0)
    for _ in range(updates):
        ema.update_parameters(model)
    return float(ema.module.weight)


@pytest.mark.parametrize('hook_type', ['EMAHook', 'mmengine.EMAHook'])
def test_ema_warning_states_the_per_step_momentum(acc_log: List[str], hook_type: str):
    """k = 4 updates with momentum 0.01 act as one with the momentum measured on mmengine's
    EMA; a scoped hook type is recognised."""
    acc.adapt_to_accumulation(_acc_cfg(4, custom_hooks=[dict(type=hook_type, momentum=0.01)]))
    per_step = _ema_weight_after(0.01, 4)
    assert any(f'momentum 0.01 then acts as {per_step:.3g} per step' in m for m in acc_log), \
        acc_log


def test_ema_warning_uses_mmengines_default_momentum(acc_log: List[str]):
    """An EMAHook without ``momentum`` runs with ``ExponentialMovingAverage``'s default."""
    default = inspect.signature(ExponentialMovingAverage).parameters['momentum'].default
    acc.adapt_to_accumulation(_acc_cfg(2, custom_hooks=[dict(type='EMAHook')]))
    assert any(f'momentum {default} then acts as' in m for m in acc_log), acc_log


def test_base_batch_not_divisible_by_k():
    """Base batch 100 accumulated over 8: the lr scales against 12.5 (the effective batch
    ratio), not against a rounded 12."""
    cfg = _acc_cfg(8, auto_scale_lr=dict(enable=True, base_batch_size=100))
    acc.adapt_to_accumulation(cfg)
    assert cfg.auto_scale_lr.base_batch_size == 12.5


def test_disabled_auto_scale_lr_is_left_alone(acc_log: List[str]):
    """``auto_scale_lr.enable=False``: mmengine scales nothing, so the base batch is not
    divided and no scaling is announced."""
    cfg = _acc_cfg(4, auto_scale_lr=dict(enable=False, base_batch_size=64))
    acc.adapt_to_accumulation(cfg)
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=64)
    assert not any(m.startswith('auto_scale_lr') for m in acc_log), acc_log


@pytest.mark.parametrize('hook,warned', [
    (dict(type='CheckpointHook', interval=6), False),  # mmengine's default: by epoch
    (dict(type='CheckpointHook', interval=-1, by_epoch=False), False),  # never by iteration
    (dict(type='CheckpointHook', interval=6, by_epoch=False), True),
])
def test_mid_window_checkpoint_warning_follows_mmengines_defaults(acc_log: List[str], hook,
                                                                  warned: bool):
    """Only checkpoints taken every n iterations with n not a multiple of k are warned;
    ``CheckpointHook`` counts epochs unless told otherwise, and ``interval=-1`` saves none."""
    defaults = inspect.signature(CheckpointHook).parameters
    assert defaults['by_epoch'].default is True and defaults['interval'].default == -1
    acc.adapt_to_accumulation(_acc_cfg(4, default_hooks=dict(checkpoint=hook)))
    assert any('fall inside accumulation windows' in m for m in acc_log) == warned, acc_log


@pytest.mark.parametrize('available', [None, 'cuda', 'npu', 'mlu', 'musa'])
@pytest.mark.parametrize('wrapper_type', ['AmpOptimWrapper', 'mmengine.AmpOptimWrapper'])
def test_amp_device_check_accepts_every_device_mmengine_runs_on(monkeypatch, available,
                                                                wrapper_type: str):
    """``AmpOptimWrapper`` (scoped or not) is refused only without any of the CUDA / NPU /
    MLU / MUSA devices mmengine's wrapper asserts on."""
    from mmengine.optim.optimizer import amp_optimizer_wrapper as amp
    for device in ('cuda', 'npu', 'mlu', 'musa'):
        monkeypatch.setattr(amp, f'is_{device}_available', lambda d=device: d == available)
    cfg = Config(dict(optim_wrapper=dict(type=wrapper_type)))
    if available is None:
        with pytest.raises(acc.AmpDeviceError, match='needs a CUDA, NPU, MLU or MUSA device'):
            acc.check_amp_device(cfg)
    else:
        acc.check_amp_device(cfg)


# --------------------------------------------------------------------- per-sample seeding
class RandomValues(torch.utils.data.Dataset):
    """Sample i: (i, a python, a numpy and a torch random number)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int):
        return index, random.random(), float(np.random.rand()), float(torch.rand(()))


def _seed_sequence(seed: int, epoch: int, position: int) -> int:
    """numpy's SeedSequence over (seed mod 2**64, epoch, position), the documented formula."""
    return int(np.random.SeedSequence([seed % 2**64, epoch, position]).generate_state(1)[0])


def test_seed_zero_is_the_run_seed():
    """``seed=0`` is a seed like any other, not 'draw one'."""
    sampler = SampleSeedSampler(DefaultSampler(list(range(4)), shuffle=False, seed=0), seed=0)
    assert sampler.seed == 0
    assert [s for _, s in sampler] == [_seed_sequence(0, 0, p) for p in range(4)]


def test_negative_run_seeds_are_taken_modulo_2_64():
    """SeedSequence refuses negative entropy; a negative run seed is taken mod 2**64."""
    assert sample_seed(-1, 2, 3) == _seed_sequence(-1, 2, 3)
    assert sample_seed(-1, 2, 3) == sample_seed(2**64 - 1, 2, 3)


def test_set_epoch_reshuffles_the_wrapped_sampler():
    """``set_epoch`` reaches a shuffling ``DefaultSampler``: its epoch-e order is
    ``randperm(n)`` under seed + e (mmengine's formula)."""
    sampler = SampleSeedSampler(DefaultSampler(list(range(8)), shuffle=True, seed=7), seed=7)
    for epoch in (0, 1, 2):
        sampler.set_epoch(epoch)
        order = torch.randperm(8, generator=torch.Generator().manual_seed(7 + epoch)).tolist()
        assert list(sampler) == [(i, _seed_sequence(7, epoch, p)) for p, i in enumerate(order)]


def test_without_a_seed_the_wrapped_samplers_seed_is_used():
    """mmengine passes ``seed=None`` with ``diff_rank_seed``: the sampler draws one shared seed,
    and the sample seeds use that seed (not a second draw)."""
    wrapper = build_sample_seed_sampler(list(range(4)), dict(type='DefaultSampler'), seed=None)
    assert wrapper.seed == wrapper.sampler.seed


def test_skip_only_where_the_wrapped_sampler_has_it():
    """mmengine's loop calls ``sampler.skip`` when the sampler has it: a wrapped
    ``DefaultSampler`` (no skip) must not pretend to."""
    data = list(range(4))
    assert not hasattr(build_sample_seed_sampler(data, dict(type='DefaultSampler'), seed=1),
                       'skip')
    assert hasattr(build_sample_seed_sampler(data, dict(type='InfiniteSampler'), seed=1), 'skip')
    assert hasattr(InfiniteSampler(data, seed=1), 'skip') and not hasattr(
        DefaultSampler(data, seed=1), 'skip')


def test_seeded_streams_leave_cuda_generators_alone(monkeypatch):
    """Only torch's CPU generator is seeded: the CUDA generators feed the model (dropout,
    drop-path) and are neither seeded nor restored here."""
    calls = []
    monkeypatch.setattr(torch.cuda, 'manual_seed_all', lambda seed: calls.append(seed))
    monkeypatch.setattr(torch.cuda, 'manual_seed', lambda seed: calls.append(seed))
    with seeded_streams(123):
        value = float(torch.rand(()))
    torch.random.default_generator.manual_seed(123)
    assert value == float(torch.rand(())) and calls == []


def test_plain_indices_draw_from_the_callers_streams():
    """``dataset[index]`` (no seed) runs unseeded: it draws what the dataset draws from the
    caller's streams at that point."""
    dataset = SampleSeedDataset(RandomValues())
    with seeded_streams(5):
        wrapped = [dataset[1], dataset[1]]
    with seeded_streams(5):
        plain = [RandomValues()[1], RandomValues()[1]]
    assert wrapped == plain and wrapped[0] != wrapped[1]


def test_iterable_datasets_are_refused():
    """An ``IterableDataset`` has no positions to seed: refused, naming the switch."""

    class Stream(torch.utils.data.IterableDataset):

        def __iter__(self):
            return iter(range(3))

    with pytest.raises(TypeError, match='exact_resume = False'):
        SampleSeedDataset(Stream())


# ---------------------------------------------------------------------- pad-size check
def _pad_cfg(pipeline: list, size) -> Config:
    return Config(dict(model=dict(data_preprocessor=dict(type='SegDataPreProcessor', size=size)),
                       train_dataloader=dict(dataset=dict(type='ADE20KDataset',
                                                          data_root='data/none',
                                                          pipeline=pipeline))))


def test_pixel_factor_of_a_non_square_crop():
    """A 64 x 128 crop padded to 128 x 256: 128 * 256 / (64 * 128) = 4x the pixels."""
    problem = find_pad_size_problem(_pad_cfg([dict(type='RandomCrop', crop_size=(64, 128))],
                                             (128, 256)))
    assert problem is not None and 'pads every (64, 128) training crop' in problem
    assert '4x the pixels per step' in problem, problem


def test_scoped_crop_types_and_non_dict_transforms():
    """``mmseg.RandomCrop`` is a RandomCrop; a transform object in the pipeline is passed over."""
    pipeline = [lambda results: results, dict(type='mmseg.RandomCrop', crop_size=(32, 32))]
    problem = find_pad_size_problem(_pad_cfg(pipeline, (64, 64)))
    assert problem is not None and 'pipeline[1].crop_size' in problem, problem


def test_random_resized_crop_above_the_preprocessor_size_is_not_refused():
    """``RandomResizedCrop`` resizes every crop to its scale, so all crops have one size: a
    preprocessor size below it leaves no unequal batch (unlike a larger RandomCrop)."""
    cfg = _pad_cfg([dict(type='RandomResizedCrop', scale=(512, 512))], (256, 256))
    assert find_pad_size_problem(cfg) is None
    cfg = _pad_cfg([dict(type='RandomCrop', crop_size=(512, 512))], (256, 256))
    assert 'is smaller than the (512, 512) training crop' in find_pad_size_problem(cfg)
