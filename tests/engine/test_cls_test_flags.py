"""tools/test.py takes mmpretrain's ``--out-item`` and ``--no-pin-memory`` (they were argparse
errors): ``--out-item metrics`` dumps the metrics to ``--out``, ``pred`` the predictions."""
import pickle

import pytest
import torch
from mmengine.config import Config

from train_testing import dump, load_tool, make_image_folder, toy_cls_config

pytestmark = pytest.mark.usefixtures('one_thread')


def _test_config(data_root: str, work_dir: str) -> Config:
    cfg = toy_cls_config(data_root, work_dir)
    cfg.test_dataloader = dict(
        batch_size=2, num_workers=0, pin_memory=True,
        sampler=dict(type='DefaultSampler', shuffle=False),
        dataset=dict(type='CustomDataset', data_root=data_root, data_prefix='train',
                     with_label=True, pipeline=[dict(type='LoadImageFromFile'),
                                                dict(type='Resize', scale=32),
                                                dict(type='PackInputs')]))
    cfg.test_evaluator = dict(type='Accuracy', topk=(1, ))
    cfg.test_cfg = dict()
    return cfg


def test_out_item_metrics_and_pred(tmp_path):
    from mmengine.registry import MODELS, init_default_scope
    data = make_image_folder(str(tmp_path / 'data'))
    cfg = _test_config(data, str(tmp_path / 'wd'))
    init_default_scope('mmpretrain')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    ckpt = str(tmp_path / 'model.pth')
    torch.save({'meta': {}, 'state_dict': model.state_dict()}, ckpt)
    path = dump(cfg, str(tmp_path / 'cfg.py'))
    test = load_tool('test')
    out = {}
    for item in ('metrics', 'pred'):
        out[item] = str(tmp_path / f'{item}.pkl')
        metrics = test.main([path, ckpt, '--work-dir', str(tmp_path / item), '--out', out[item],
                             '--out-item', item, '--no-pin-memory'])
    with open(out['metrics'], 'rb') as f:
        dumped = pickle.load(f)
    assert dumped == metrics and 'accuracy/top1' in dumped
    with open(out['pred'], 'rb') as f:
        preds = pickle.load(f)
    assert isinstance(preds, list) and len(preds) > 0 and 'pred_score' in preds[0]


def test_no_pin_memory_and_out_item_refusals(tmp_path):
    from mmlinvit.engine.launch import EvaluationFlagError, prepare_test_config
    cfg = _test_config(str(tmp_path), str(tmp_path / 'wd'))
    prepare_test_config(cfg, 'x.py', 'c.pth', pin_memory=False)
    assert cfg.test_dataloader['pin_memory'] is False
    with pytest.raises(EvaluationFlagError, match='needs --out'):
        prepare_test_config(_test_config(str(tmp_path), str(tmp_path / 'wd')), 'x.py', 'c.pth',
                            out_item='metrics')
    seg = Config(dict(default_scope='mmseg', model=dict(type='EncoderDecoder'),
                      test_evaluator=dict(type='IoUMetric'), test_dataloader=dict()))
    with pytest.raises(EvaluationFlagError, match="mmpretrain's flag"):
        prepare_test_config(seg, 'x.py', 'c.pth', out='d', out_item='pred')
