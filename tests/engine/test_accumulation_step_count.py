"""The accumulation warning states how many optimizer steps the run makes: with
max_iters=10 and accumulative_counts=4, mmengine's OptimWrapper steps at iterations 4, 8 and at
the last one (a partial window): ceil(10 / 4) = 3 steps."""
from mmengine.config import Config

import mmlinvit.engine.accumulation as acc


def test_steps_are_rounded_up(monkeypatch):
    seen = []
    monkeypatch.setattr(acc, 'print_log', lambda msg, **kw: seen.append(msg))
    cfg = Config(dict(optim_wrapper=dict(type='OptimWrapper', accumulative_counts=4),
                      train_cfg=dict(type='IterBasedTrainLoop', max_iters=10)))
    acc.adapt_to_accumulation(cfg)
    text = '\n'.join(seen)
    assert 'the run makes 3 optimizer steps' in text, text
