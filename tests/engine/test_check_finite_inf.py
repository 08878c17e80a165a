"""CheckFiniteHook refuses an infinite loss and an infinite gradient norm, not only NaN."""
import math
import types

import pytest
import torch
from mmengine.logging import MessageHub
from mmlinvit.engine.hooks.check_finite_hook import CheckFiniteHook


def _runner(tmp_path, grad_norm=None):
    hub = MessageHub.get_instance(f'check_finite_inf_{id(tmp_path)}')
    if grad_norm is not None:
        hub.update_scalar('train/grad_norm', grad_norm)
    return types.SimpleNamespace(iter=0, work_dir=str(tmp_path), message_hub=hub,
                                 optim_wrapper=object(), model=torch.nn.Linear(2, 2))


@pytest.mark.parametrize('value', [math.inf, -math.inf, math.nan])
def test_non_finite_loss_stops(tmp_path, value):
    hook = CheckFiniteHook(check_params_every_iter=True)
    runner = _runner(tmp_path)
    hook.before_train(runner)
    with pytest.raises(FloatingPointError, match='Non-finite loss'):
        hook.after_train_iter(runner, 0, outputs={'loss': torch.tensor(value)})


@pytest.mark.parametrize('value', [math.inf, math.nan])
def test_non_finite_gradient_norm_stops(tmp_path, value):
    hook = CheckFiniteHook(check_params_every_iter=True)
    runner = _runner(tmp_path)
    hook.before_train(runner)
    runner.message_hub.update_scalar('train/grad_norm', value)
    with pytest.raises(FloatingPointError, match='Non-finite gradient'):
        hook.after_train_iter(runner, 0, outputs={'loss': torch.tensor(1.0)})


def test_the_message_names_the_non_finite_loss_term(tmp_path):
    """mmseg / distillation loss keys are 'decode.loss_ce', 'distill.loss_attn'...: the
    message names the term."""
    hook = CheckFiniteHook(check_params_every_iter=True)
    runner = _runner(tmp_path)
    hook.before_train(runner)
    outputs = {'loss': torch.tensor(math.nan), 'decode.loss_ce': torch.tensor(math.nan),
               'decode.acc_seg': torch.tensor(50.0)}
    with pytest.raises(FloatingPointError, match=r'Non-finite loss \(loss=nan, '
                                                 r'decode.loss_ce=nan\)'):
        hook.after_train_iter(runner, 0, outputs=outputs)
