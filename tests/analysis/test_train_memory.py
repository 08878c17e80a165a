"""tools/analysis/train_memory.py: one real training step per case, with_cp set on the config."""
import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = 'configs/demo/upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py'


def _tool():
    spec = importlib.util.spec_from_file_location(
        'train_memory_under_test', ROOT / 'tools' / 'analysis' / 'train_memory.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_helpers_set_with_cp_and_drop_checkpoints():
    from mmlinvit.engine.launch import load_config
    tool = _tool()
    cfg = load_config(str(ROOT / 'configs/copy_mlp_distill_attn/'
                               'copy-mlp-distill-attn_deit-t-elu_8xb64-300e_cifar10-224x224.py'))
    assert tool.set_with_cp(cfg.model, True) == 2  # student backbone and teacher
    assert cfg.model.student.backbone.with_cp is True and cfg.model.teacher.with_cp is True
    assert cfg.model.teacher.pretrained
    assert tool.drop_pretrained(cfg.model) >= 1 and not cfg.model.teacher.pretrained
    assert tool.config_crop(load_config(str(ROOT / CONFIG))) == 64


def test_with_cp_reaches_class_typed_and_scoped_backbones():
    """Pure-Python configs give ``type`` as the class and inherited ones may scope the name:
    both are the backbone mmengine builds, so both get ``with_cp`` (a class was skipped: the
    "with_cp" rows then measured the model without checkpointing)."""
    from mmlinvit.backbones import Adventurer, LinearVisionTransformer
    tool = _tool()
    model = dict(type='EncoderDecoder', backbone=dict(type=LinearVisionTransformer),
                 teacher=dict(type='mmlinvit.VisionTransformer', img_size=96),
                 neck=dict(type=Adventurer), head=dict(type='UPerHead'))
    assert tool.set_with_cp(model, True) == 3
    assert model['backbone']['with_cp'] and model['teacher']['with_cp']
    assert model['neck']['with_cp'] and 'with_cp' not in model['head']
    from mmengine.config import ConfigDict
    cfg = ConfigDict(model=dict(backbone=dict(type=Adventurer, img_size=(64, 128))))
    assert tool.config_crop(cfg) == (64, 128)


@pytest.mark.skipif(not os.access('/proc/self/clear_refs', os.W_OK),
                    reason='the CPU measurement resets the peak-RSS mark via /proc/self/clear_refs')
def test_train_memory_runs_real_steps_with_and_without_cp(tmp_path, capsys):
    rows = _tool().main([str(ROOT / CONFIG), '--crop', '128', '--precision', 'fp32', 'bf16',
                         '--with-cp', 'off', 'on', '--json', str(tmp_path / 'rows.json')])
    assert len(rows) == 4 and not any('error' in r for r in rows), rows
    for r in rows:
        assert r['cp_backbones'] == 1 and r['crop'] == 128 and r['batch'] == 2
        assert r['step_mib'] > 0 and r['params_mib'] > 0 and r['optimizer_mib'] > 0
        assert r['loss'] == r['loss'] and r['loss'] > 0  # finite, positive CE
        # children measure with the fixed glibc mmap threshold (RSS tracks live tensors)
        assert 'EXACT_RSS_ENV' in r['memory_method'], r['memory_method']
    assert {(r['precision'], r['with_cp']) for r in rows} == {
        ('fp32', False), ('fp32', True), ('bf16', False), ('bf16', True)}
    out = capsys.readouterr().out
    assert 'step MiB/img' in out and 'vs no-cp' in out
    assert (tmp_path / 'rows.json').exists()
