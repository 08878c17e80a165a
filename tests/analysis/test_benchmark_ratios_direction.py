"""The benchmark tools print ratios in the direction their headers state:
benchmark_attention_op 'speed sdpa/la' = SDPA ms / linear ms; benchmark_adventurer
'speed ratio (Adv/ViT)' = Adventurer img/s / ViT img/s; benchmark_backbones 'x' = softmax ms /
operator ms, and its closing line 'measured speed ratio' the same."""
import importlib.util
import os.path as osp
import sys


REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _load(name):
    spec = importlib.util.spec_from_file_location(
        f'{name}_under_check', osp.join(REPO, 'tools', 'analysis', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.__file__.startswith(REPO)
    return module


def test_attention_op_speed_column(monkeypatch, capsys):
    tool = _load('benchmark_attention_op')
    monkeypatch.setattr(tool, 'time_ms', lambda fns, *a, **k: {'sdpa': 6.0, 'torch': 2.0})
    monkeypatch.setattr(sys, 'argv', ['x', '--device', 'cpu', '--tokens', '65', '--repeats',
                                      '1', '--heads', '2', '--threads', '1', '--no-memory'])
    tool.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].rstrip().endswith('speed sdpa/la'), lines[-2]
    assert lines[-1].split()[-1] == '3.00x', lines[-1]  # 6 ms / 2 ms: linear 3x faster


def test_adventurer_table_ratio():
    tool = _load('benchmark_adventurer')
    table = tool.format_table([dict(size='512x512', tokens=1025,
                                    adventurer=dict(img_per_s=4.0, peak_mib=100.0),
                                    vit=dict(img_per_s=2.0, peak_mib=200.0))])
    cells = [c.strip() for c in table.splitlines()[-1].strip('|').split('|')]
    assert cells[4] == '2.00x' and cells[7] == '0.50x'


def _rows():
    return [dict(model='ViT-B/16', size='1024', tokens=4097, operator='softmax',
                 backbone=dict(ms=30.0, mib=100.0, gflops=8.0)),
            dict(model='ViT-B/16', size='1024', tokens=4097, operator='elu',
                 backbone=dict(ms=10.0, mib=50.0, gflops=2.0))]


def test_backbones_table_and_closing_line(monkeypatch, capsys):
    tool = _load('benchmark_backbones')
    seen = {}
    monkeypatch.setattr(tool, 'print_table', lambda cols, table: seen.update(table=table))
    tool.print_rows(_rows(), ['backbone'])
    elu = seen['table'][1]
    assert elu['backbone x'] == '3.00x' and elu['FLOP x'] == '4.00x'
    assert elu['x / FLOP x'] == '0.75'
    monkeypatch.setattr(tool, 'analytic_ratio', lambda *a: None)
    tool.print_flop_comparison(_rows(), {'ViT-B/16': 'vit-b16'})
    out = capsys.readouterr().out
    assert 'measured speed ratio 3.00x / counted FLOP ratio 4.00x = 0.75' in out, out
