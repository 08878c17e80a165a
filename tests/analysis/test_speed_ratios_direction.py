"""tools/analysis/speed_ratios.py prints speed = softmax ms / model ms and
flop = softmax FLOPs / model FLOPs (> 1: the model is faster / cheaper), as its header says."""
import importlib.util
import os.path as osp

import torch


REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
LAST = {}


class Fake(torch.nn.Module):
    def __init__(self, name):
        super().__init__()
        self.name = name

    def forward(self, x):
        LAST['name'] = self.name
        return x


class FakeCounter:
    FLOPS = {'softmax': 8e9, 'elu': 2e9}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.total = self.FLOPS[LAST['name']]
        return False


def test_speed_and_flop_ratios_are_softmax_over_model(monkeypatch):
    spec = importlib.util.spec_from_file_location(
        'speed_ratios_tool', osp.join(REPO, 'tools', 'analysis', 'speed_ratios.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    monkeypatch.setattr(tool, 'FlopCounter', FakeCounter)
    monkeypatch.setattr(tool, 'time_round_robin',
                        lambda calls, device, rounds, warmups=0: {'softmax': 30.0, 'elu': 10.0})
    rows = tool.measure_size({'softmax': Fake('softmax'), 'elu': Fake('elu')}, (8, 8),
                             torch.device('cpu'), 1)
    elu = [r for r in rows if r['model'] == 'elu'][0]
    assert elu['speed'] == '3.00x'  # 30 ms / 10 ms
    assert elu['flop'] == '4.00x'  # 8 / 2 GFLOPs
    assert elu['quotient'] == '0.75'
