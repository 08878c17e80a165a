"""Gradient accumulation, the layer-decay / frozen-aware optimizer constructors and per-sample
seeding on branches earlier rounds left open (mutation round 20): each test failed on at
least one single change of the module that the rest of the suite let pass.

Guarded here, each against an independent reference:

* ``adapt_to_accumulation``: the mid-window checkpoint warning follows the iterations at
  which mmengine's ``OptimWrapper`` steps (intervals of 1, below k, multiples of k); an
  older run's ``_accumulation_applied=True`` flag is not read as the divisor 1; a rerun
  without accumulation logs the recipe's restored base batch; hooks and wrappers given as
  classes (pure-Python configs) are recognised as ``mmlinvit.utils.config_types`` reads
  them.  FINDING of this round (two tests fail on the old code): only type strings were
  matched, so ``type=EMAHook`` got no momentum warning and ``type=AmpOptimWrapper`` passed
  the device check on a CPU-only machine that mmengine's own assertion refuses;
* ``SampleSeedSampler(seed=None)`` draws its run seed as mmengine's ``DefaultSampler`` does;
* ``LayerDecayOptimWrapperConstructor``: groups ordered by numeric depth past ten depths
  (lr scale by the BEiT / mmpretrain formula), a missing ``paramwise_cfg`` named clearly;
* the same class-form types elsewhere (fixed with the finding): ``PretrainedInit`` given as
  the class is mmengine's ``Pretrained`` for the teacher / student / ``--no-pretrained``
  checks, and ``--amp`` / ``--out`` read a ``TestLoop`` / ``IoUMetric`` class.
"""
from typing import List

import pytest
import torch
import torch.nn as nn
from mmengine.config import Config

import mmlinvit.engine.accumulation as acc


# ------------------------------------------------------------------ gradient accumulation
@pytest.fixture
def acc_log(monkeypatch: pytest.MonkeyPatch) -> List[str]:
    """The messages ``mmlinvit.engine.accumulation`` logs."""
    seen: List[str] = []
    monkeypatch.setattr(acc, 'print_log', lambda msg, **kw: seen.append(msg))
    return seen


def _acc_cfg(counts: int, **extra) -> Config:
    return Config(dict(optim_wrapper=dict(type='OptimWrapper', accumulative_counts=counts),
                       **extra))


def _mmengine_step_iterations(counts: int, max_iters: int) -> List[int]:
    """The 1-based iterations after which mmengine's ``OptimWrapper`` steps."""
    from mmengine.optim import OptimWrapper
    model = nn.Linear(1, 1)
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
                           accumulative_counts=counts)
    wrapper.initialize_count_status(model, 0, max_iters)
    steps = []
    for it in range(1, max_iters + 1):
        wrapper.update_params(model(torch.ones(1, 1)).sum())
        if wrapper.should_update():
            steps.append(it)
    return steps


@pytest.mark.parametrize('interval,counts', [(1, 4), (2, 4), (8, 4), (4, 4), (6, 4), (12, 3)])
def test_mid_window_checkpoints_are_those_between_mmengines_steps(acc_log: List[str],
                                                                  interval: int, counts: int):
    """A checkpoint every ``interval`` iterations is warned about exactly when one of them is
    taken where mmengine's ``OptimWrapper`` has not just stepped (gradients pending)."""
    max_iters = 48
    steps = set(_mmengine_step_iterations(counts, max_iters))
    mid_window = any(it not in steps for it in range(interval, max_iters, interval))
    acc.adapt_to_accumulation(_acc_cfg(counts, default_hooks=dict(checkpoint=dict(
        type='CheckpointHook', interval=interval, by_epoch=False))))
    assert any('fall inside accumulation windows' in m for m in acc_log) == mid_window, acc_log


def test_an_ema_hook_given_as_a_class_is_warned_about(acc_log: List[str]):
    """FINDING (fails on the old code): a pure-Python config names the hook by its class;
    mmengine builds the same ``EMAHook`` from it, so the warning is due as for ``'EMAHook'``."""
    from mmengine.hooks import EMAHook
    acc.adapt_to_accumulation(_acc_cfg(4, custom_hooks=[dict(type=EMAHook, momentum=0.01)]))
    per_step = 1 - (1 - 0.01)**4
    assert any(f'momentum 0.01 then acts as {per_step:.3g} per step' in m for m in acc_log), \
        acc_log


def test_an_amp_wrapper_given_as_a_class_is_checked(monkeypatch: pytest.MonkeyPatch):
    """FINDING (fails on the old code): ``optim_wrapper.type=AmpOptimWrapper`` (the class) is
    refused without a device, as mmengine's own assertion would refuse it later."""
    from mmengine.optim import AmpOptimWrapper
    from mmengine.optim.optimizer import amp_optimizer_wrapper as amp
    for name in ('is_cuda_available', 'is_npu_available', 'is_mlu_available',
                 'is_musa_available'):
        monkeypatch.setattr(amp, name, lambda: False)
    with pytest.raises(AssertionError):  # the reference: mmengine refuses it
        AmpOptimWrapper(optimizer=torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1))
    with pytest.raises(acc.AmpDeviceError):
        acc.check_amp_device(Config(dict(optim_wrapper=dict(type=AmpOptimWrapper))))


def test_a_true_applied_flag_is_never_read_as_a_divisor_of_one(acc_log: List[str]):
    """``_accumulation_applied=True`` (an older mmlinvit's flag: divided by an unknown k) is
    not the number 1 (``True == 1`` in Python): the base batch is used as it is and the
    warning says so, even where ``base == recipe / True`` happens to hold."""
    cfg = _acc_cfg(4, auto_scale_lr=dict(enable=True, base_batch_size=64,
                                         recipe_base_batch_size=64,
                                         _accumulation_applied=True))
    acc.adapt_to_accumulation(cfg)
    assert cfg.auto_scale_lr.base_batch_size == 64
    assert any('is used as it is' in m for m in acc_log), acc_log


def test_a_rerun_without_accumulation_says_the_recipes_base_is_restored(acc_log: List[str]):
    """A config saved by a k = 4 run (base 64 / 4 = 16) run again with k = 1: mmengine then
    scales against the recipe's 64 (lr x bs / 64), and the log says 16 was restored to 64."""
    cfg = _acc_cfg(1, auto_scale_lr=dict(enable=True, base_batch_size=16,
                                         recipe_base_batch_size=64, _accumulation_applied=4))
    acc.adapt_to_accumulation(cfg)
    assert cfg.auto_scale_lr == dict(enable=True, base_batch_size=64)
    assert any('base_batch_size 16 of the earlier run (accumulative_counts=4) restored to '
               "the recipe's 64" in m for m in acc_log), acc_log


# ------------------------------------------------------------------ per-sample seeding
def test_without_a_seed_the_sampler_draws_the_seed_as_mmengines_samplers():
    """``SampleSeedSampler(sampler, seed=None)`` draws its run seed as mmengine's
    ``DefaultSampler(seed=None)`` does (``sync_random_seed``: from numpy's global stream in a
    single process), not a fixed one."""
    import numpy as np
    from mmengine.dataset import DefaultSampler

    from mmlinvit.engine.sample_seeding import SampleSeedSampler
    state = np.random.get_state()
    try:
        seeds = []
        for numpy_seed in (123, 456):
            np.random.seed(numpy_seed)
            expected = DefaultSampler(list(range(4)), shuffle=False, seed=None).seed
            np.random.seed(numpy_seed)
            seeds.append(SampleSeedSampler(range(4), seed=None).seed)
            assert seeds[-1] == expected
        assert seeds[0] != seeds[1]
    finally:
        np.random.set_state(state)


# ------------------------------------------------------------------ layer-wise lr decay
def test_groups_are_ordered_by_numeric_depth_past_ten_depths():
    """A 10-block ViT has depths 0 .. 11 (BEiT / mmpretrain rule: stem 0, block i at i + 1,
    the rest at num_layers + 1): the groups follow the depth as a number (``layer_10_*``
    after ``layer_9_*``, not after ``layer_1_*`` as the group names sort), each with
    lr scale ``rate ** (11 - depth)``."""
    from mmlinvit.backbones import VisionTransformer
    from mmlinvit.engine.optimizers import LayerDecayOptimWrapperConstructor
    num_layers, rate = 10, 0.8
    model = nn.Module()
    model.backbone = VisionTransformer(dict(embed_dims=8, num_layers=num_layers, num_heads=2,
                                            mlp_hidden_dims=16), img_size=16, patch_size=8,
                                       out_type='featmap')
    model.head = nn.Linear(8, 2)
    groups = LayerDecayOptimWrapperConstructor(
        dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.0, weight_decay=0.1)),
        paramwise_cfg=dict(layer_decay_rate=rate))(model).optimizer.param_groups
    depths = [g['layer_depth'] for g in groups]
    assert set(depths) == set(range(num_layers + 2))
    assert depths == sorted(depths)
    for group in groups:
        assert group['lr_scale'] == pytest.approx(rate**(num_layers + 1 - group['layer_depth']))


def test_a_missing_paramwise_cfg_names_the_rate():
    """No ``paramwise_cfg`` at all (mmengine's builder passes ``None``) is the same clear
    error as one without ``layer_decay_rate``, not a ``TypeError`` about ``None``."""
    from mmlinvit.engine.optimizers import LayerDecayOptimWrapperConstructor
    cfg = dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1))
    with pytest.raises(KeyError, match='layer_decay_rate'):
        LayerDecayOptimWrapperConstructor(dict(cfg))
    with pytest.raises(KeyError, match='layer_decay_rate'):
        LayerDecayOptimWrapperConstructor(dict(cfg), paramwise_cfg=None)


def test_a_run_shorter_than_one_window_is_warned_with_its_single_step(acc_log: List[str]):
    """3 iterations accumulated over 4: mmengine steps once (at the last iteration,
    ``should_update`` at ``max_counts``); the max_iters warning is due and says so."""
    steps = _mmengine_step_iterations(4, 3)
    assert steps == [3]
    acc.adapt_to_accumulation(_acc_cfg(4, train_cfg=dict(type='IterBasedTrainLoop',
                                                         max_iters=3)))
    assert any(f'the run makes {len(steps)} optimizer steps' in m for m in acc_log), acc_log


def test_a_pretrained_init_given_as_the_class_is_read_as_pretrained() -> None:
    """Pure-Python configs give mmengine's initialiser as its class, ``PretrainedInit``
    (registered as ``'Pretrained'``); the checks that ask whether a module loads a file
    (teacher weights, the student's own ``Pretrained`` before a transfer, ``--no-pretrained``
    clearing) read it as the string forms, and mmengine builds the same initialiser."""
    from mmengine.model import BaseModule
    from mmengine.model.weight_init import PretrainedInit
    from mmengine.registry import WEIGHT_INITIALIZERS

    from mmlinvit.models.distill.teacher import _loads_weights
    from mmlinvit.utils.config_types import is_pretrained_init
    assert WEIGHT_INITIALIZERS.get('Pretrained') is PretrainedInit
    for spelling in ('Pretrained', 'mmengine.Pretrained', PretrainedInit):
        assert is_pretrained_init(dict(type=spelling, checkpoint='t.pth'))
        assert _loads_weights(BaseModule(init_cfg=dict(type=spelling, checkpoint='t.pth')))
    assert not is_pretrained_init(dict(type='Normal', std=0.01))
    assert not is_pretrained_init('Pretrained')


def test_amp_test_loop_and_output_metric_given_as_classes(tmp_path) -> None:
    """``--amp`` sets ``fp16`` on mmengine's ``TestLoop`` (given as the class: accepted; a
    ``ValLoop`` class: named), and ``--out`` finds an ``IoUMetric`` given as the class."""
    from mmengine.runner import TestLoop, ValLoop
    from mmseg.evaluation import IoUMetric

    from mmlinvit.engine import launch
    from mmlinvit.engine.launch import EvaluationFlagError
    cfg = Config(dict(test_evaluator=dict(type=IoUMetric, iou_metrics=['mIoU'])))
    launch._seg_output_dump(cfg, str(tmp_path / 'maps'))
    assert cfg.test_evaluator['output_dir'] == str(tmp_path / 'maps')
    with pytest.raises(EvaluationFlagError, match='test_evaluator has none'):
        launch._seg_output_dump(Config(dict(test_evaluator=dict(type='Accuracy'))),
                                str(tmp_path / 'none'))
    base = dict(default_scope='mmseg', model=dict(type='EncoderDecoder'),
                test_dataloader=dict(dataset=dict(type='X')),
                test_evaluator=dict(type='X'))
    for loop, ok in ((TestLoop, True), (ValLoop, False)):
        cfg = Config(dict(base, test_cfg=dict(type=loop)))
        if ok:
            launch.prepare_test_config(cfg, 'c.py', 'c.pth', work_dir=str(tmp_path), amp=True)
            assert cfg.test_cfg['fp16'] is True
        else:
            with pytest.raises(EvaluationFlagError, match='ValLoop: drop --amp'):
                launch.prepare_test_config(cfg, 'c.py', 'c.pth', work_dir=str(tmp_path),
                                           amp=True)
