"""Training hooks and the checkpoint-coverage checks on branches that the rest of the suite
let pass (mutation round 21): each test below failed on at least one single-line change of
the module that no other test caught.

Guarded here, each against mmengine's own ``OptimWrapper`` run in the test, the backbone's
own ``load_state_dict`` or a hand-written expectation:

* ``AtomicCheckpointHook``: a single unfinished write is removed and named; an ``out_dir``
  that mmengine creates only at the first save is no error before training; the
  accumulation warning for a window of 2 that an odd epoch cuts, exactly when mmengine's
  ``OptimWrapper`` ends the epoch holding unapplied gradients;
* ``SegVisualizationHook``: an ``interval`` that is a bool or a float is refused;
* ``DistillLossScheduleHook``: an epoch schedule resumed mid-run sets the factor of the
  epoch (not of the iteration count) in ``before_train``;
* ``checkpoint_coverage``: missing weights are reported before tensors of another shape (with
  the per-module counts); a linear-operator checkpoint given to a softmax model is left to the
  backbone's load (which refuses it); the suggested ``attn_cfg`` is one string for one
  operator; a deeper model's operator record is a shape mismatch, not an operator mismatch;
  ``load_from`` checks a partly frozen backbone, accepts a position grid of another size,
  exactly half of the required weights (optional records not counted) and a backbone with
  ``pretrained=``.
"""
import logging
import os
import types
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from mmengine.fileio import LocalBackend
from mmengine.optim import OptimWrapper
from mmengine.runner import EpochBasedTrainLoop

from mmlinvit.engine.hooks import AtomicCheckpointHook, SegVisualizationHook

from train_testing import captured_log

pytestmark = pytest.mark.usefixtures('one_thread')


# ------------------------------------------------------------------ AtomicCheckpointHook
def test_a_single_unfinished_write_is_removed_and_named(tmp_path: Path) -> None:
    (tmp_path / 'iter_8.pth.part').write_bytes(b'x')
    (tmp_path / 'iter_4.pth').write_bytes(b'x')
    hook = AtomicCheckpointHook(interval=1)
    hook.out_dir, hook.file_backend = str(tmp_path), LocalBackend()
    with captured_log(logging.WARNING) as warned:
        hook._remove_stale_parts()
    assert sorted(os.listdir(tmp_path)) == ['iter_4.pth']
    assert len(warned) == 1 and "Removed 1 unfinished checkpoint write(s)" in warned[0] \
        and "['iter_8.pth.part']" in warned[0], warned


def test_an_out_dir_that_does_not_exist_yet_is_no_error(tmp_path: Path) -> None:
    """``out_dir`` given in the config is created by mmengine at the first save: before
    training there is nothing to clear, and the check must not fail on the missing folder."""
    hook = AtomicCheckpointHook(interval=1)
    hook.out_dir, hook.file_backend = str(tmp_path / 'later' / 'run'), LocalBackend()
    with captured_log(logging.WARNING) as warned:
        hook._remove_stale_parts()
    assert warned == [] and not (tmp_path / 'later').exists()


def _epoch_loop(per_epoch: int) -> EpochBasedTrainLoop:
    loop = EpochBasedTrainLoop.__new__(EpochBasedTrainLoop)  # only its data loader is read
    loop.dataloader = list(range(per_epoch))
    return loop


def _gradients_left_at_the_epoch_end(counts: int, per_epoch: int) -> bool:
    """Whether mmengine's ``OptimWrapper`` (run here, 2 epochs) ends the first epoch with
    gradients accumulated but not applied."""
    weight = nn.Parameter(torch.zeros(1))
    wrapper = OptimWrapper(torch.optim.SGD([weight], lr=1.0), accumulative_counts=counts)
    wrapper.initialize_count_status(nn.Linear(1, 1), 0, 2 * per_epoch)
    for _ in range(per_epoch):
        wrapper.update_params((weight - 1).pow(2).sum())
    return weight.grad is not None and bool(weight.grad.abs().sum() > 0)


@pytest.mark.parametrize('counts,per_epoch', [(2, 3), (2, 4), (1, 3)])
def test_a_window_of_two_cut_by_the_epoch_end_is_warned(counts: int, per_epoch: int) -> None:
    """The smallest accumulation (2) that an odd epoch cuts is warned about, exactly when
    mmengine's wrapper is left holding unapplied gradients at the epoch end."""
    runner = types.SimpleNamespace(
        train_loop=_epoch_loop(per_epoch),
        optim_wrapper=OptimWrapper(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1),
                                   accumulative_counts=counts))
    hook = AtomicCheckpointHook(interval=1, by_epoch=True)
    with captured_log(logging.WARNING) as warned:
        hook._warn_epoch_checkpoints_inside_windows(runner)
    if _gradients_left_at_the_epoch_end(counts, per_epoch):
        assert len(warned) == 1 and f'accumulative_counts={counts} and {per_epoch}' in \
            warned[0], warned
    else:
        assert warned == [], warned
    assert (counts, per_epoch) != (2, 3) or warned  # the case this test is about


# ------------------------------------------------------------------ SegVisualizationHook
@pytest.mark.parametrize('interval', [True, False, 1.0])
def test_an_interval_that_is_not_a_positive_count_is_refused(
        interval, monkeypatch: pytest.MonkeyPatch) -> None:
    """``True`` is an ``int`` to Python but no count (mmseg's hook would take it as 1)."""
    from mmengine.visualization import Visualizer

    # mmseg's hook only looks the visualizer up; no global instance is created
    monkeypatch.setattr(Visualizer, 'get_current_instance', classmethod(lambda cls: object()))
    with pytest.raises(ValueError, match='interval must be a positive integer'):
        SegVisualizationHook(draw=True, interval=interval)


# ------------------------------------------------------------------ DistillLossScheduleHook
class _Scaled(nn.Module):
    """What the hook needs of a ``DistillationModel``: ``set_distill_scale``."""

    def __init__(self) -> None:
        super().__init__()
        self.scales: dict = {}

    def set_distill_scale(self, term: str, value: float) -> None:
        self.scales[term] = value


def test_an_epoch_schedule_resumed_mid_run_starts_from_the_epoch() -> None:
    """Resumed at epoch 1 (iteration 20) of an epoch ramp 0 -> 1 over epochs 0..4: the factor
    set in ``before_train`` is that of epoch 1, 0.25 (by hand), not that of position 20."""
    from mmengine.logging import MessageHub

    from mmlinvit.engine.hooks import DistillLossScheduleHook
    hook = DistillLossScheduleHook('attn_out', begin=0, end=4, start_factor=0.0,
                                   end_factor=1.0, by_epoch=True)
    runner = types.SimpleNamespace(
        train_loop=EpochBasedTrainLoop.__new__(EpochBasedTrainLoop), model=_Scaled(),
        message_hub=MessageHub('round21_epoch_resume'), epoch=1, iter=20, max_epochs=5,
        max_iters=100)
    hook.before_train(runner)
    assert runner.model.scales == {'attn_out': 0.25}
    assert runner.message_hub.log_scalars['train/distill.scale_attn_out'].current() == 0.25


# ------------------------------------------------------------------ checkpoint coverage
def _tiny_vit(attn: str = 'softmax', img_size: int = 32) -> nn.Module:
    from mmlinvit.backbones.vit import VisionTransformer
    return VisionTransformer(dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32),
                             img_size=img_size, patch_size=8, attn_cfg=attn)


def _task_model() -> nn.Module:
    """A trainable backbone (no ``pretrained=``) and a head."""
    return nn.ModuleDict(dict(backbone=_tiny_vit(), head=nn.Linear(16, 3)))


def test_missing_weights_are_reported_before_weights_of_another_shape() -> None:
    """A checkpoint that lacks the head and holds the backbone's weight in another shape: the
    missing weights are the message (2 of the 4, all of ``head``'s), counted by hand."""
    from mmlinvit.engine.checkpoint_coverage import (CheckpointCoverageError,
                                                     check_checkpoint_covers)
    model = nn.ModuleDict(dict(backbone=nn.Linear(2, 2), head=nn.Linear(2, 3)))
    state = {'backbone.weight': torch.zeros(3, 2), 'backbone.bias': torch.zeros(2)}
    with pytest.raises(CheckpointCoverageError) as caught:
        check_checkpoint_covers(model, {'state_dict': state}, 'part.pth')
    message = str(caught.value)
    assert message.startswith('part.pth does not hold 2 of the 4 weights'), message
    assert 'missing per module: head 2/2 (' in message, message


def test_weights_of_another_linear_operator_are_left_to_the_backbones_load() -> None:
    """An ``elu``-trained checkpoint given to a softmax model: not the evaluated-operator
    error (which is about softmax weights only); the backbone's own load refuses it (the
    reference, run here) with its operator-mismatch error."""
    from mmlinvit.engine.checkpoint_coverage import check_checkpoint_covers
    elu = _tiny_vit('elu').state_dict()
    softmax = _tiny_vit('softmax')
    check_checkpoint_covers(softmax, {'state_dict': elu}, 'elu.pth')
    with pytest.raises(Exception, match="'elu' in the checkpoint, 'softmax' in the model"):
        softmax.load_state_dict(elu, strict=False)


def test_the_operator_fix_names_one_operator_as_a_string() -> None:
    """All blocks trained with softmax: the suggested ``attn_cfg`` is the one name, as the
    backbone's ``attn_cfg='softmax'`` argument takes it (the model then loads the file)."""
    from mmlinvit.engine.checkpoint_coverage import (CheckpointCoverageError,
                                                     check_checkpoint_covers)
    softmax = _tiny_vit('softmax').state_dict()
    with pytest.raises(CheckpointCoverageError) as caught:
        check_checkpoint_covers(_tiny_vit('elu'), {'state_dict': softmax}, 'softmax.pth')
    assert "--cfg-options \"model.attn_cfg='softmax'\"" in str(caught.value), caught.value
    check_checkpoint_covers(_tiny_vit('softmax'), {'state_dict': softmax}, 'softmax.pth')


def test_a_deeper_models_operator_record_is_a_shape_mismatch() -> None:
    """A softmax checkpoint of a 3-block model given to a 2-block ``elu`` model: its operator
    record has another length, so it is not compared block by block (the suggested
    ``attn_cfg`` would not make the file load); the depth shows as tensors of another shape,
    ``block_operators`` among them (3 rows vs 2)."""
    from mmlinvit.backbones.vit import VisionTransformer
    from mmlinvit.engine.checkpoint_coverage import (CheckpointCoverageError,
                                                     check_checkpoint_covers)
    deeper = VisionTransformer(dict(embed_dims=16, num_layers=3, num_heads=2,
                                    mlp_hidden_dims=32), img_size=32, patch_size=8,
                               attn_cfg='softmax').state_dict()
    model = _tiny_vit('elu')
    assert deeper['block_operators'].shape[0] == 3 and model.block_operators.shape[0] == 2
    with pytest.raises(CheckpointCoverageError) as caught:
        check_checkpoint_covers(model, {'state_dict': deeper}, 'deeper.pth')
    message = str(caught.value)
    assert 'of another shape' in message and 'block_operators: checkpoint (3, ' in message, \
        message
    assert 'trained with attention operators' not in message, message


def test_a_partly_frozen_backbone_is_still_checked() -> None:
    """A backbone with some trainable parameters (ViT-AdaLA Stage 1 freezes the rest) trains
    from ``load_from``: a file with none of its weights is refused; only a wholly frozen
    backbone (a teacher) is skipped."""
    from mmlinvit.engine.checkpoint_coverage import (CheckpointCoverageError,
                                                     check_training_load_from)
    model = _task_model()
    for p in model.backbone.patch_embed.parameters():
        p.requires_grad = False
    assert any(p.requires_grad for p in model.backbone.parameters())
    head_only = {k: v for k, v in model.state_dict().items() if k.startswith('head.')}
    with pytest.raises(CheckpointCoverageError, match=r"holds 0 of the \d+ weights of the "
                                                      r"trainable backbone 'backbone'"):
        check_training_load_from(model, head_only, 'head.pth')
    model.backbone.requires_grad_(False)
    check_training_load_from(model, head_only, 'head.pth')


def test_a_position_grid_of_another_size_is_resampled_not_refused_in_training() -> None:
    """``load_from`` written at another image size: the backbone resamples ``pos_embed`` on
    load (its own ``load_state_dict``, run here, matches every key), so it is no shape
    mismatch."""
    from mmlinvit.engine.checkpoint_coverage import check_training_load_from
    model = _task_model()
    state = model.state_dict()
    larger = _tiny_vit(img_size=48).state_dict()
    for key in ('pos_embed', 'pos_embed_grid'):
        state[f'backbone.{key}'] = larger[key]
    assert state['backbone.pos_embed'].shape != model.backbone.pos_embed.shape
    check_training_load_from(model, state, 'larger.pth')
    result = model.load_state_dict(state, strict=False)
    assert not result.missing_keys and not result.unexpected_keys


def test_exactly_half_of_the_required_backbone_weights_is_enough_in_training() -> None:
    """The refusal is for less than half of the backbone's required weights (the optional
    records do not count): exactly half passes, one fewer is refused."""
    from mmlinvit.backbones.vit import VisionTransformer
    from mmlinvit.engine.checkpoint_coverage import (CheckpointCoverageError,
                                                     check_training_load_from)
    model = _task_model()
    optional = set(VisionTransformer.OPTIONAL_CHECKPOINT_KEYS)
    own = [k for k in model.backbone.state_dict() if k not in optional]
    assert len(own) % 2 == 0
    state = model.state_dict()
    half = {f'backbone.{k}': state[f'backbone.{k}'] for k in own[:len(own) // 2]}
    check_training_load_from(model, half, 'half.pth')
    del half[f'backbone.{own[0]}']
    with pytest.raises(CheckpointCoverageError,
                       match=rf'holds {len(own) // 2 - 1} of the {len(own)} weights'):
        check_training_load_from(model, half, 'fewer.pth')


def test_a_backbone_with_pretrained_weights_needs_nothing_from_load_from() -> None:
    from mmlinvit.engine.checkpoint_coverage import check_training_load_from
    model = _task_model()
    model.backbone.pretrained = 'backbone.pth'
    check_training_load_from(model, {'head.weight': torch.zeros(3, 16)}, 'head.pth')
