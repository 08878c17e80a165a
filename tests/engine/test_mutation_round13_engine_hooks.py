"""Engine helpers and hooks on branches that no other test reached (mutation round 13): each
test below failed on at least one single-line change of the module that the rest of the
suite let pass.

Guarded here, each against mmengine's / mmpretrain's own classes or a hand-written
expectation:

* ``checkpoint_coverage``: a bare backbone as the model (no ``backbone.`` prefix) keeps its
  optional keys, its resampled position grid and the conversion of an mmpretrain-layout
  file, as the backbone's own ``load_state_dict`` sees them; the message's hints (a bare
  backbone at exactly half, a distillation student, six tensors then ``...``); the
  ``load_from`` hints (half a bare backbone, ``pretrained=`` weights kept);
* ``CheckpointCoverageHook``: the model inside mmengine's ``MMDistributedDataParallel``
  around a test-time-augmentation model (``tools/test.py --tta --launcher pytorch``), the
  ``train`` / ``test`` modes and their validation, its check running before ``EMAHook``
  loads the checkpoint in a real ``Runner.load_checkpoint``;
* ``DistillLossScheduleHook``: a real ``Runner`` under ``--launcher pytorch`` trains the
  ``DistillationModel`` inside ``MMDistributedDataParallel``; the hook scales the term of
  the wrapped model;
* ``ema_modules``: one averaged module per built ``EMAHook`` (mmpretrain's subclass too);
* ``current_logger_filter``: records of mmengine's ``print_log`` held back only inside the
  block, also after an error;
* ``checkpoint_due`` with several ``CheckpointHook`` instances, against mmengine's own
  ``after_train_iter`` / ``after_train_epoch`` decisions.
"""
import importlib.util
import os.path as osp
from pathlib import Path
from typing import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from mmengine.model import BaseModel, BaseTTAModel, MMDistributedDataParallel

from mmlinvit.backbones.vit import VisionTransformer
from mmlinvit.engine.checkpoint_coverage import (CheckpointCoverageError,
                                                 check_checkpoint_covers, uncovered_keys)

pytestmark = pytest.mark.usefixtures('one_thread')

HERE = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(osp.dirname(HERE))


def _distill_testing():
    """``tests/distill/distill_testing.py`` (the tiny distillation runs) as a module."""
    spec = importlib.util.spec_from_file_location(
        'distill_testing_round13', osp.join(REPO, 'tests', 'distill', 'distill_testing.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_process_group(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A gloo group of one process (what ``--launcher pytorch`` runs under torchrun on CPU),
    destroyed after the test."""
    for key, value in dict(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0',
                           MASTER_ADDR='127.0.0.1').items():
        monkeypatch.setenv(key, value)
    dist.init_process_group('gloo', init_method=f'file://{tmp_path / "store"}', rank=0,
                            world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _tiny_vit(img_size: int = 32) -> VisionTransformer:
    return VisionTransformer(dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32),
                             img_size=img_size, patch_size=8)


# ------------------------------------------------------------------ checkpoint coverage
def test_a_bare_backbone_may_lack_its_optional_keys_and_resample_its_grid():
    """The model is the backbone itself (no prefix): a checkpoint without the optional
    training records, with a position grid of another size, is what the backbone loads."""
    model = _tiny_vit()
    optional = set(VisionTransformer.OPTIONAL_CHECKPOINT_KEYS)
    state = {k: v for k, v in model.state_dict().items() if k not in optional}
    assert len(state) < len(model.state_dict())
    state['pos_embed'] = _tiny_vit(img_size=48).state_dict()['pos_embed']
    assert state['pos_embed'].shape != model.pos_embed.shape
    assert uncovered_keys(model, state) == []
    check_checkpoint_covers(model, {'state_dict': state}, 'bare.pth')
    with pytest.raises(CheckpointCoverageError, match=r'bare\.pth does not hold 1 of the'):
        check_checkpoint_covers(model, {k: v for k, v in state.items() if k != 'cls_token'},
                                'bare.pth')


def test_an_mmpretrain_layout_file_covers_a_bare_backbone_as_its_load_does():
    """The backbone's load hook converts an mmpretrain ``VisionTransformer`` file (no
    prefix); what its own ``load_state_dict`` leaves missing is what the check refuses."""
    from mmpretrain.models.backbones import VisionTransformer as MMPretrainViT
    ref = MMPretrainViT(arch=dict(embed_dims=16, num_layers=2, num_heads=2,
                                  feedforward_channels=32), img_size=32, patch_size=8)
    foreign = ref.state_dict()
    model = _tiny_vit()
    assert not set(foreign) >= {k for k in model.state_dict() if 'blocks.0.' in k}
    missing = model.load_state_dict(foreign, strict=False).missing_keys
    assert set(missing) <= set(VisionTransformer.OPTIONAL_CHECKPOINT_KEYS), missing
    check_checkpoint_covers(model, foreign, 'mmpretrain_vit.pth')


def _two_part_model() -> nn.Module:
    """``backbone`` (2 keys) and ``head`` (2 keys): what the message's hint reads."""
    return nn.ModuleDict(dict(backbone=nn.Linear(2, 2), head=nn.Linear(2, 3)))


def test_hint_names_a_bare_backbone_holding_half_of_the_backbone():
    """At least half of the backbone's weights without the ``backbone.`` prefix: an exported
    bare backbone (the fix: ``pretrained=``)."""
    model = _two_part_model()
    bare = {'weight': model.backbone.weight.detach()}  # 1 of the 2 backbone weights
    with pytest.raises(CheckpointCoverageError,
                       match=r'does not hold 4 of the 4 weights.*It holds a bare backbone '
                             r'\(e\.g\. an exported student_backbone\.pth\): load it as '
                             r'model\.backbone\.pretrained=PATH'):
        check_checkpoint_covers(model, bare, 'bare.pth')


def test_hint_names_the_student_of_a_distillation_run():
    """``student.*`` keys that are not a bare backbone (a whole student task model): the
    distillation config that wrote them evaluates them."""
    model = _two_part_model()
    student = {f'student.{k}': v for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointCoverageError,
                       match=r'It holds the student of a distillation run \(student\.\*\): '
                             r'evaluate it with the distillation config that wrote it\.'):
        check_checkpoint_covers(model, {'state_dict': student}, 'distill.pth')
    unknown = {'other.weight': torch.zeros(1)}
    with pytest.raises(CheckpointCoverageError,
                       match=r'Check that CHECKPOINT was written by a run of this config\.'):
        check_checkpoint_covers(model, unknown, 'other.pth')


@pytest.mark.parametrize('count', [6, 7])
def test_shape_message_lists_six_tensors_and_marks_more(count: int):
    """Six mismatched tensors are named; a seventh is left out and marked with ``...``."""
    model = nn.Sequential(*[nn.Linear(2, 2, bias=False) for _ in range(count)])
    wide = {f'{i}.weight': torch.zeros(3, 2) for i in range(count)}
    with pytest.raises(CheckpointCoverageError) as caught:
        check_checkpoint_covers(model, wide, 'wide.pth')
    message = str(caught.value)
    assert message.startswith(f'wide.pth holds {count} weight(s) of another shape')
    listed = '; '.join(f'{i}.weight: checkpoint (3, 2) vs model (2, 2)' for i in range(6))
    assert f'{listed}{" ..." if count > 6 else ""}. Check that' in message, message
    assert '6.weight: checkpoint' not in message


def _task_model() -> nn.Module:
    """A trainable backbone (no ``pretrained=``) and a head."""
    return nn.ModuleDict(dict(backbone=_tiny_vit(), head=nn.Linear(16, 3)))


def test_training_load_from_of_half_a_bare_backbone_suggests_pretrained():
    """``load_from`` holding no ``backbone.`` key but (exactly) half of the backbone's
    weights without the prefix: a bare backbone file, to be given as ``pretrained=``."""
    from mmlinvit.engine.checkpoint_coverage import check_training_load_from
    model = _task_model()
    optional = set(VisionTransformer.OPTIONAL_CHECKPOINT_KEYS)
    own = [k for k in model.backbone.state_dict() if k not in optional]
    assert len(own) % 2 == 0
    half = {k: model.backbone.state_dict()[k] for k in own[:len(own) // 2]}
    with pytest.raises(CheckpointCoverageError,
                       match=rf"holds 0 of the {len(own)} weights of the trainable backbone "
                             r"'backbone'.*The file holds a bare backbone \(e\.g\. an exported "
                             r"student_backbone\.pth\): load it as model\.backbone\.pretrained"
                             r"=PATH and leave load_from unset\."):
        check_training_load_from(model, half, 'bare.pth')
    fewer = {k: model.backbone.state_dict()[k] for k in own[:len(own) // 2 - 1]}
    with pytest.raises(CheckpointCoverageError,
                       match=r'Check that it was written by a run of a model with this '
                             r'backbone\.'):
        check_training_load_from(model, fewer, 'fewer.pth')


def test_training_load_from_of_another_width_names_what_the_backbone_keeps():
    """Tensors of another shape are skipped by mmengine: a backbone with ``pretrained=``
    keeps those weights, one without keeps its random initialisation."""
    from mmlinvit.engine.checkpoint_coverage import check_training_load_from
    model = _task_model()
    wider = nn.ModuleDict(dict(backbone=VisionTransformer(
        dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=64), img_size=32,
        patch_size=8), head=nn.Linear(16, 3))).state_dict()
    with pytest.raises(CheckpointCoverageError,
                       match=r'train them from their random initialisation: '
                             r'backbone\.blocks\.0\.mlp\.fc1\.weight: checkpoint \(64, 16\) vs '
                             r'model \(32, 16\)'):
        check_training_load_from(model, wider, 'wider.pth')
    model.backbone.pretrained = 'backbone.pth'
    with pytest.raises(CheckpointCoverageError,
                       match=r'train them from their pretrained= weights: '):
        check_training_load_from(model, wider, 'wider.pth')


# ------------------------------------------------------------------ CheckpointCoverageHook
class _Linear(BaseModel):
    """One linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, inputs, data_samples=None, mode: str = 'tensor'):
        return self.linear(inputs)


class _TTA(BaseTTAModel):

    def merge_preds(self, data_samples_list):
        return data_samples_list[0]


def test_coverage_sees_the_model_inside_ddp_around_a_tta_model(one_process_group):
    """mmengine's runner wraps the ``--tta`` model in ``MMDistributedDataParallel`` under a
    launcher: both wrappers are taken off before the keys are compared."""
    from types import SimpleNamespace

    from mmlinvit.engine.hooks import CheckpointCoverageHook
    model = _Linear()
    runner = SimpleNamespace(model=MMDistributedDataParallel(module=_TTA(module=model)))
    hook = CheckpointCoverageHook('ckpt.pth')
    hook.after_load_checkpoint(runner, dict(state_dict=model.state_dict()))
    partial = {'linear.weight': model.linear.weight.detach()}
    with pytest.raises(CheckpointCoverageError, match=r'ckpt\.pth does not hold 1 of the 2'):
        hook.after_load_checkpoint(runner, dict(state_dict=partial))


def test_training_mode_allows_a_new_head_that_the_test_mode_refuses():
    """``mode='train'`` (``load_from`` of a fine-tuning run): a checkpoint without the head
    trains a new head; only a backbone left without weights is refused.  ``mode='test'``
    refuses the missing head; other modes are refused when the hook is built."""
    from types import SimpleNamespace

    from mmlinvit.engine.hooks import CheckpointCoverageHook
    model = _task_model()
    runner = SimpleNamespace(model=model)
    no_head = {k: v for k, v in model.state_dict().items() if k.startswith('backbone.')}
    CheckpointCoverageHook('no_head.pth', mode='train').after_load_checkpoint(
        runner, dict(state_dict=no_head))
    with pytest.raises(CheckpointCoverageError, match=r'no_head\.pth does not hold 2 of the'):
        CheckpointCoverageHook('no_head.pth').after_load_checkpoint(runner,
                                                                    dict(state_dict=no_head))
    with pytest.raises(CheckpointCoverageError,
                       match=r"load_from empty\.pth holds 0 of the \d+ weights of the trainable "
                             r"backbone 'backbone'"):
        CheckpointCoverageHook('empty.pth', mode='train').after_load_checkpoint(
            runner, dict(state_dict={}))
    with pytest.raises(ValueError, match=r"mode must be 'test' or 'train', got 'val'"):
        CheckpointCoverageHook(mode='val')


def test_coverage_is_checked_before_an_ema_hook_loads_the_checkpoint(tmp_path):
    """mmengine's runner calls ``after_load_checkpoint`` in priority order: the coverage
    check (VERY_HIGH) names the missing weight before ``EMAHook`` (NORMAL) copies the
    checkpoint into its averaged model, which with ``strict_load=True`` fails with a bare
    ``Missing key(s)``."""
    from mmengine.hooks import EMAHook
    from mmengine.runner import Runner

    from mmlinvit.engine.hooks import CheckpointCoverageHook
    model = _Linear()
    path = str(tmp_path / 'partial.pth')
    torch.save({'state_dict': {'linear.weight': model.linear.weight.detach()}}, path)
    runner = Runner(model=model, work_dir=str(tmp_path / 'wd'), default_scope='mmengine',
                    custom_hooks=[EMAHook(strict_load=True), CheckpointCoverageHook(path)],
                    log_level='WARNING', experiment_name='round13_coverage_before_ema')
    runner.call_hook('before_run')  # EMAHook builds its averaged model
    with pytest.raises(CheckpointCoverageError, match=r'does not hold 1 of the 2'):
        runner.load_checkpoint(path)


# ------------------------------------------------------------------ DistillLossScheduleHook
def test_schedule_hook_scales_the_distillation_model_inside_ddp(tmp_path, one_process_group):
    """A ``--launcher pytorch`` run: mmengine wraps the model in ``MMDistributedDataParallel``
    and the hook switches the term of the wrapped ``DistillationModel`` off at iteration 1
    (2 iterations: 4 images, batch 2)."""
    from mmengine.config import Config
    from mmengine.runner import Runner

    from mmlinvit.engine.launch import adapt_to_device
    testing = _distill_testing()
    cfg = Config.fromfile(osp.join(testing.CONFIGS, 'adala', 'vit-adala-stage1-attn-align_'
                                   'dinov2-l-elu_8xb8-4e_coco-512x512.py'))
    data = testing.write_image_folder(str(tmp_path / 'data'), num_per_class=2)
    testing.shrink_config(cfg, data, str(tmp_path / 'work'), max_epochs=1)
    cfg.custom_hooks = [dict(type='mmlinvit.DistillLossScheduleHook', terms='attn_out',
                             begin=1, start_factor=1.0, end_factor=0.0)]
    cfg.launcher = 'pytorch'
    adapt_to_device(cfg, 'pytorch')
    runner = Runner.from_cfg(cfg)
    recorder = testing.LossRecorderHook()
    runner.register_hook(recorder)
    runner.train()
    assert isinstance(runner.model, MMDistributedDataParallel)
    steps = recorder.history
    assert [s['iter'] for s in steps] == [0, 1]
    assert steps[0]['distill.gap_attn_out'] > 0 and steps[1]['distill.gap_attn_out'] > 0
    assert steps[0]['distill.loss_attn_out'] == pytest.approx(steps[0]['distill.gap_attn_out'])
    assert steps[1]['distill.loss_attn_out'] == 0.0
    assert runner.model.module.distill_scales['attn_out'] == 0.0


# ------------------------------------------------------------------ EMA models
def test_ema_modules_are_the_averaged_models_of_every_built_ema_hook():
    """One averaged module (``ema_model.module``, whose keys are the model's) per
    ``EMAHook`` whose ``before_run`` built it, mmpretrain's subclass included; a hook not
    built yet is skipped."""
    from types import SimpleNamespace

    from mmengine.hooks import CheckpointHook, EMAHook
    from mmpretrain.engine.hooks import EMAHook as MMPretrainEMAHook

    from mmlinvit.engine.hooks.ema_models import ema_modules
    runner = SimpleNamespace(model=_Linear())
    built, subclass, unbuilt = EMAHook(), MMPretrainEMAHook(), EMAHook()
    assert type(subclass) is not EMAHook and isinstance(subclass, EMAHook)
    for hook in (built, subclass):
        hook.before_run(runner)  # mmengine builds the averaged copy here
    runner.hooks = [CheckpointHook(), unbuilt, built, subclass]
    modules = ema_modules(runner)
    assert [id(m) for m in modules] == [id(built.ema_model.module),
                                        id(subclass.ema_model.module)]
    assert all(set(m.state_dict()) == set(runner.model.state_dict()) for m in modules)


# ------------------------------------------------------------------ log filtering
def test_logger_filter_holds_back_rejected_records_only_inside_the_block():
    """Records of mmengine's ``print_log(logger='current')`` pass the current MMLogger's
    handlers only when ``keep`` accepts them, inside the block; after it (also after an
    error inside it) every record passes again."""
    import logging

    from mmengine.logging import print_log

    from mmlinvit.engine.log_filtering import current_logger_filter
    from train_testing import captured_log
    seen = []

    def keep(record: logging.LogRecord) -> bool:
        seen.append(record.getMessage())
        return 'drop' not in record.getMessage()

    with captured_log(logging.INFO) as emitted:
        with current_logger_filter(keep):
            print_log('round13 keep 1', logger='current', level=logging.WARNING)
            print_log('round13 drop 1', logger='current', level=logging.WARNING)
        print_log('round13 drop 2', logger='current', level=logging.WARNING)
        with pytest.raises(KeyError):
            with current_logger_filter(keep):
                print_log('round13 drop 3', logger='current', level=logging.WARNING)
                raise KeyError('inside the block')
        print_log('round13 drop 4', logger='current', level=logging.WARNING)
    assert seen == ['round13 keep 1', 'round13 drop 1', 'round13 drop 3']
    assert [m for m in emitted if m.startswith('round13')] == [
        'round13 keep 1', 'round13 drop 2', 'round13 drop 4']


# ------------------------------------------------------------------ checkpoint schedule
def _saves(hook, runner, stage: str) -> bool:
    """Whether mmengine's own ``CheckpointHook`` code saves in this stage (its
    ``_save_checkpoint`` recorded instead of run)."""
    saved = []
    hook._save_checkpoint = lambda runner: saved.append(True)
    if stage == 'iter':
        hook.after_train_iter(runner, batch_idx=0)
    else:
        hook.after_train_epoch(runner)
    return bool(saved)


def test_checkpoint_due_when_any_of_several_checkpoint_hooks_saves():
    """A run with two checkpoint hooks (an iteration one and an epoch one, or two intervals)
    writes a checkpoint when either does; ``checkpoint_due`` agrees with mmengine's own
    hooks at every step."""
    from types import SimpleNamespace

    from mmengine.hooks import CheckpointHook
    from mmengine.logging import MMLogger

    from mmlinvit.engine.hooks.checkpoint_schedule import checkpoint_due
    logger = MMLogger.get_instance('round13_checkpoint_due', log_level='WARNING')
    for hooks in ([CheckpointHook(interval=3, by_epoch=False, save_last=False),
                   CheckpointHook(interval=2, by_epoch=False, save_last=False)],
                  [CheckpointHook(interval=2, by_epoch=True, save_last=False),
                   CheckpointHook(interval=3, by_epoch=False, save_last=False)],
                  [CheckpointHook(interval=3, by_epoch=True, save_last=False),
                   CheckpointHook(interval=2, by_epoch=True, save_last=False)]):
        for stage in ('iter', 'epoch'):
            due = []
            for step in range(6):
                runner = SimpleNamespace(hooks=hooks, iter=step, epoch=step, max_iters=100,
                                         max_epochs=100, logger=logger)
                expected = any(_saves(hook, runner, stage) for hook in hooks)
                assert checkpoint_due(runner, stage) == expected, (hooks, stage, step)
                due.append(expected)
            assert any(due) == any(h.by_epoch == (stage == 'epoch') for h in hooks)
