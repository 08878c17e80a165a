"""Training curves: the runtime bases' visualiser switch, scalars.json parsing and the plot."""
import glob
import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from mmlinvit.analysis import find_scalars, loss_keys, read_scalars, save_loss_curves

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
CONFIGS = (ROOT / 'configs/demo/upernet_vit-tiny-softmax_1xb8-300it_toy-64x64.py',  # seg runtime
           ROOT / 'configs/adala/'
                  'vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512.py')  # cls


def _write_lines(path: Path, records) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(''.join(json.dumps(r) + '\n' for r in records))
    return str(path)


def test_read_scalars_and_loss_keys(tmp_path):
    path = _write_lines(tmp_path / 'scalars.json', [
        dict(lr=0.1, loss=2.0, **{'decode.loss_ce': 1.5, 'distill.gap_attn': 0.3}, step=1),
        dict(lr=0.05, loss=1.0, **{'decode.loss_ce': 0.7}, step=2),
        dict(mIoU=12.5, step=2),
    ])
    series = read_scalars(path)
    assert series['loss'] == ([1, 2], [2.0, 1.0])
    assert series['decode.loss_ce'] == ([1, 2], [1.5, 0.7])
    assert series['mIoU'] == ([2], [12.5])
    assert loss_keys(series) == ['loss', 'decode.loss_ce']  # gaps and lr are not losses
    bad = _write_lines(tmp_path / 'bad.json', [dict(loss=1.0)])
    with pytest.raises(ValueError, match='bad.json:1 has no "step"'):
        read_scalars(bad)
    with pytest.raises(FileNotFoundError, match='LocalVisBackend'):
        read_scalars(str(tmp_path / 'missing.json'))


def test_find_scalars_picks_the_newest_run(tmp_path):
    old = _write_lines(tmp_path / '20260101_000000' / 'vis_data' / 'scalars.json', [])
    new = _write_lines(tmp_path / '20260102_000000' / 'vis_data' / 'scalars.json', [])
    os.utime(old, (1, 1))
    assert find_scalars(str(tmp_path)) == new
    with pytest.raises(FileNotFoundError, match='vis_data'):
        find_scalars(str(tmp_path / 'nothing'))


@pytest.mark.parametrize('config', CONFIGS, ids=lambda p: p.parent.name)
def test_runtime_bases_tensorboard_switch(config, monkeypatch):
    from mmengine.config import Config
    monkeypatch.delenv('MMLINVIT_TENSORBOARD', raising=False)
    cfg = Config.fromfile(str(config))
    assert [b['type'] for b in cfg.visualizer.vis_backends] == ['LocalVisBackend']
    monkeypatch.setenv('MMLINVIT_TENSORBOARD', '1')
    cfg = Config.fromfile(str(config))
    assert [b['type'] for b in cfg.visualizer.vis_backends] == [
        'LocalVisBackend', 'TensorboardVisBackend'
    ]
    monkeypatch.setenv('MMLINVIT_TENSORBOARD', 'yes')
    with pytest.raises(ValueError, match="MMLINVIT_TENSORBOARD must be 0 or 1, got 'yes'"):
        Config.fromfile(str(config))


def _toy_model(seen: list) -> nn.Module:
    """An mmengine model whose per-iteration losses are appended to ``seen``."""
    from mmengine.model import BaseModel

    class Toy(BaseModel):

        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.tensor([3.0]))

        def forward(self, inputs, data_samples=None, mode='tensor'):
            loss = (self.w * inputs.mean()).pow(2).sum()
            seen.append(loss.item())
            return dict(loss=loss)

    return Toy()


def _run_toy(work_dir: Path, vis_backends) -> list:
    from mmengine.runner import Runner
    seen: list = []
    runner = Runner(
        model=_toy_model(seen),
        work_dir=str(work_dir),
        train_dataloader=dict(dataset=[dict(inputs=torch.ones(2))] * 8, batch_size=1,
                              sampler=dict(type='DefaultSampler', shuffle=False),
                              collate_fn=dict(type='default_collate')),
        train_cfg=dict(by_epoch=False, max_iters=4),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.05)),
        default_hooks=dict(logger=dict(type='LoggerHook', interval=1),
                           checkpoint=dict(type='CheckpointHook', interval=100)),
        visualizer=dict(type='Visualizer', vis_backends=vis_backends,
                        name=f'curves_{id(seen)}'),
        log_processor=dict(by_epoch=False, window_size=1),  # no smoothing
        default_scope='mmengine')
    runner.train()
    return seen


def test_real_runner_scalars_to_png(tmp_path):
    seen = _run_toy(tmp_path / 'run', [dict(type='LocalVisBackend')])
    scalars = find_scalars(str(tmp_path / 'run'))
    steps, values = read_scalars(scalars)['loss']
    assert steps == [1, 2, 3, 4]
    assert values == pytest.approx(seen, rel=1e-4)  # each iteration's own loss
    out = save_loss_curves(str(tmp_path / 'curves.png'), {'toy': scalars, 'again': scalars},
                           title='toy')
    assert Path(out).read_bytes()[:8] == PNG_SIGNATURE
    with pytest.raises(ValueError, match='no loss scalars'):
        empty = _write_lines(tmp_path / 'e' / 'scalars.json', [dict(lr=1.0, step=1)])
        save_loss_curves(str(tmp_path / 'x.png'), {'empty': empty})


def test_tensorboard_backend_writes_event_files(tmp_path):
    pytest.importorskip('tensorboard', reason='optional: pip install tensorboard')
    _run_toy(tmp_path / 'tb', [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')])
    assert glob.glob(str(tmp_path / 'tb' / '*' / 'vis_data' / 'events.out.tfevents.*'))
