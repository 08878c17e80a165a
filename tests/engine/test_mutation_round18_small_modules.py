"""Small engine / distillation / op modules on branches no earlier test reached (mutation
round 18): each test below failed on at least one single-line change of the module that the
rest of the suite let pass.

Guarded here, each against an independent reference (mmengine's own classes run in the test,
or a float64 formula written here):

* ``capturing_graph``: a CUDA-graph capture on the current stream counts as a capture
  (mutant G5: the CUDA term dropped);
* ``NormalizedAttentionOutputMSELoss``: a NaN ``eps`` is refused like 0 and negative ones
  (mutant N9: ``not eps > 0`` written ``eps <= 0``, which NaN passes);
* ``token_records_mse`` (through ``AttentionOutputMSELoss``): the "token counts differ"
  hint only for two (B, N, C) records (mutant T18: ``and`` of the two 3-D tests made ``or``);
* ``FrozenAwareOptimWrapperConstructor``: only mmengine's exact per-parameter sentence
  "<name> is skipped since its requires_grad=False" is counted and held back; another
  "... is skipped ..." warning logged while the optimizer is built reaches the log as with
  mmengine's ``DefaultOptimWrapperConstructor`` run in the test (mutant F14: the pattern cut
  to ``^(\\S+) is skipped``);
* ``DistillLossScheduleHook``: the end-of-run warning is about ``begin`` only; a ramp that
  starts inside the run and ends after it is not warned about (mutant D26: ``end`` tested);
  ``by_epoch=True`` is refused in a subclass of ``IterBasedTrainLoop`` too (mutant D29:
  ``type(...) is`` instead of ``isinstance``).
"""
import logging
from types import SimpleNamespace
from typing import Dict

import pytest
import torch


# ------------------------------------------------------------------ graph capture
def test_a_cuda_graph_capture_counts_as_a_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside ``torch.cuda.graph`` (capture on the current stream) a host read of a device
    value is an error, so the whole-tensor forms must be taken; without a capture (or
    without CUDA) it is no capture.  The CUDA state is simulated: this machine has no GPU."""
    from mmlinvit.ops.graph_capture import capturing_graph
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'is_current_stream_capturing', lambda: True)
    assert capturing_graph() is True
    monkeypatch.setattr(torch.cuda, 'is_current_stream_capturing', lambda: False)
    assert capturing_graph() is False
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.cuda, 'is_current_stream_capturing', lambda: True)
    assert capturing_graph() is False


# ------------------------------------------------------------------ normalised attention loss
@pytest.mark.parametrize('eps', [0.0, -1e-6, float('nan')])
def test_normalized_loss_refuses_an_eps_that_is_not_positive(eps: float) -> None:
    """A NaN ``eps`` is no positive number: accepted, every loss value would be NaN."""
    from mmlinvit.distill.losses import NormalizedAttentionOutputMSELoss
    with pytest.raises(ValueError, match='eps must be positive'):
        NormalizedAttentionOutputMSELoss(eps=eps)



def test_a_pooled_record_against_tokens_gets_no_token_layout_hint() -> None:
    """A (B, C) teacher record against (B, N, C) student tokens is a record mismatch, not a
    token-count one: the error names both shapes and does not send the user to
    ``patch_tokens_only`` (which would then fail on the 2-D record)."""
    from mmlinvit.distill.losses import AttentionOutputMSELoss
    with pytest.raises(ValueError, match=r'student shape \(2, 5, 4\) does not match teacher '
                                         r'shape \(2, 4\)') as error:
        AttentionOutputMSELoss()(torch.zeros(2, 5, 4), torch.zeros(2, 4))
    assert 'patch_tokens_only' not in str(error.value)

# ------------------------------------------------------------------ frozen-aware constructor
def test_only_mmengines_exact_frozen_parameter_warning_is_counted() -> None:
    """Another "<word> is skipped ..." warning logged while the optimizer is built (here by
    the optimizer class itself) reaches the log unchanged and is not counted as a frozen
    parameter: the filter matches mmengine's whole sentence "<name> is skipped since its
    requires_grad=False" only.  mmengine's own constructor, run on the same model, shows the
    same record."""
    from mmengine.logging import print_log
    from mmengine.optim import DefaultOptimWrapperConstructor
    from mmengine.registry import OPTIMIZERS

    from mmlinvit.engine.optimizers import FrozenAwareOptimWrapperConstructor
    from train_testing import captured_log
    note = 'weight_decay is skipped for the 1-d parameters (round18)'

    class Round18NotingSGD(torch.optim.SGD):

        def __init__(self, params, **kwargs) -> None:
            print_log(note, logger='current', level=logging.WARNING)
            super().__init__(params, **kwargs)

    OPTIMIZERS.register_module(module=Round18NotingSGD)
    try:
        cfg = dict(type='OptimWrapper',
                   optimizer=dict(type='Round18NotingSGD', lr=0.1, weight_decay=0.01))
        paramwise = dict(bias_decay_mult=0.0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
        with captured_log(logging.INFO) as theirs:
            DefaultOptimWrapperConstructor(dict(cfg), dict(paramwise))(model)
        with captured_log(logging.INFO) as ours:
            FrozenAwareOptimWrapperConstructor(dict(cfg), dict(paramwise))(model)
    finally:
        OPTIMIZERS._module_dict.pop('Round18NotingSGD')
    assert note in theirs
    assert note in ours
    assert not [m for m in ours if m.startswith('Not optimised')], ours


# ------------------------------------------------------------------ distillation schedule
class _Scaled(torch.nn.Module):
    """What the hook needs of a ``DistillationModel``: ``set_distill_scale``."""

    def __init__(self) -> None:
        super().__init__()
        self.scales: Dict[str, float] = {}

    def set_distill_scale(self, term: str, value: float) -> None:
        self.scales[term] = value


def test_a_ramp_that_ends_after_the_run_is_not_warned_about() -> None:
    """A ramp from iteration 10 to 1000 in a 300-iteration run changes the factor during the
    run (it only does not complete): no "keeps the factor for the whole run" warning, which
    is about ``begin`` alone; the last iteration (299) trains with 1 - 289 / 990."""
    from mmengine.logging import MessageHub
    from mmengine.runner import IterBasedTrainLoop

    from mmlinvit.engine.hooks import DistillLossScheduleHook
    from train_testing import captured_log
    hook = DistillLossScheduleHook('attn_out', begin=10, end=1000, start_factor=1.0,
                                   end_factor=0.0)
    runner = SimpleNamespace(train_loop=IterBasedTrainLoop.__new__(IterBasedTrainLoop),
                             model=_Scaled(), message_hub=MessageHub('round18_ramp'),
                             epoch=0, iter=0, max_epochs=1, max_iters=300)
    with captured_log(logging.WARNING) as messages:
        hook.before_train(runner)
    assert messages == []
    assert runner.model.scales == {'attn_out': 1.0}
    runner.iter = 299
    hook.before_train_iter(runner, batch_idx=299)
    assert runner.model.scales['attn_out'] == pytest.approx(1 - 289 / 990, rel=1e-12)


def test_epochs_are_refused_in_a_subclass_of_the_iteration_loop() -> None:
    """A project's own subclass of mmengine's ``IterBasedTrainLoop`` keeps the epoch at 0 like
    its base: ``by_epoch=True`` is refused there too, not left to keep ``start_factor``."""
    from mmengine.logging import MessageHub
    from mmengine.runner import IterBasedTrainLoop

    from mmlinvit.engine.hooks import DistillLossScheduleHook

    class Round18IterLoop(IterBasedTrainLoop):
        pass

    hook = DistillLossScheduleHook('attn_out', begin=1, by_epoch=True)
    runner = SimpleNamespace(train_loop=Round18IterLoop.__new__(Round18IterLoop),
                             model=_Scaled(), message_hub=MessageHub('round18_subclass'),
                             epoch=0, iter=0, max_epochs=3, max_iters=30)
    with pytest.raises(ValueError, match=r'iteration-based loop \(Round18IterLoop\)'):
        hook.before_train(runner)
    assert runner.model.scales == {}


@pytest.mark.parametrize('kind,eps,message', [
    ('identity', 0.0, 'must be > 0'), ('identity', -0.1, 'must be > 0'),
    ('identity', float('nan'), 'must be > 0'), ('relu', 0.0, 'must be > 0'),
    ('elu', -1e-6, 'must be > 0'), ('hedgehog', float('nan'), 'must be > 0'),
    ('elu', 0.0, 'must be > 0'), ('hedgehog', 0.0, 'must be > 0')])
def test_normaliser_eps_that_breaks_the_division_is_refused(kind: str, eps: float,
                                                            message: str) -> None:
    """Finding (round 18): ``eps`` was stored unchecked.  With the signed identity normaliser
    ``eps=0`` gives 0/0 = NaN where q.z = 0 and a negative eps flips the normaliser's sign
    (|den| >= eps is the operator's promise); an all-zero ReLU row is 0/0 at eps=0.  ELU+1 and
    Hedgehog features are > 0 only in exact arithmetic (they underflow to 0 in fp32, round 21),
    so 0 is refused there too."""
    from mmlinvit.ops.identity_attention import identity_linear_attention
    from mmlinvit.layers.attention.kernel_linear import (HedgehogLinearAttention,
                                                         IdentityLinearAttention,
                                                         KernelLinearAttention)
    build = {'identity': lambda e: IdentityLinearAttention(8, 2, eps=e),
             'relu': lambda e: KernelLinearAttention(8, 2, feature_map='relu', eps=e),
             'elu': lambda e: KernelLinearAttention(8, 2, feature_map='elu', eps=e),
             'hedgehog': lambda e: HedgehogLinearAttention(8, 2, feature_dims=4, eps=e)}[kind]
    with pytest.raises(ValueError, match=message):
        build(eps)
    q = torch.tensor([1., 0.]).view(1, 1, 1, 2)
    k = torch.tensor([[0., 1.], [0., 1.]]).view(1, 1, 2, 2)
    if kind == 'identity':  # the worked case: q.k = 0 for every key, so den = 0 without eps
        out = identity_linear_attention(q, k, torch.ones(1, 1, 2, 1), 1e-6)
        assert torch.isfinite(out).all()
