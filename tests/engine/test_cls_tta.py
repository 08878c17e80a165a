"""tools/test.py --tta on a classification config without TTA settings: mmpretrain's default,
scores averaged over the test pipeline with and without a horizontal flip (it was refused)."""
import copy
import pickle

import pytest
import torch

from train_testing import dump, load_tool, make_image_folder, toy_cls_config

pytestmark = pytest.mark.usefixtures('one_thread')


def _test_config(data_root: str, work_dir: str, flip: bool = False):
    cfg = toy_cls_config(data_root, work_dir)
    pipeline = [dict(type='LoadImageFromFile'),
                dict(type='Resize', scale=32, backend='pillow', interpolation='bicubic'),
                dict(type='PackInputs')]
    if flip:
        pipeline.insert(2, dict(type='RandomFlip', prob=1.0, direction='horizontal'))
    cfg.test_dataloader = dict(
        batch_size=2, num_workers=0, sampler=dict(type='DefaultSampler', shuffle=False),
        dataset=dict(type='CustomDataset', data_root=data_root, data_prefix='train',
                     with_label=True, pipeline=pipeline))
    cfg.test_evaluator = dict(type='Accuracy', topk=(1, ))
    cfg.test_cfg = dict()
    return cfg


def _scores(path: str) -> torch.Tensor:
    with open(path, 'rb') as f:
        return torch.stack([torch.as_tensor(r['pred_score']) for r in pickle.load(f)])


def test_classification_tta_averages_flipped_and_plain_scores(tmp_path):
    from mmengine.registry import MODELS, init_default_scope
    data = make_image_folder(str(tmp_path / 'data'))
    cfg = _test_config(data, str(tmp_path / 'wd'))
    init_default_scope('mmpretrain')
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(cfg.model))
    for param in model.parameters():  # weights that tell the images apart (not ViT init)
        if param.ndim > 1:
            torch.nn.init.normal_(param, std=0.3)
    ckpt = str(tmp_path / 'model.pth')
    torch.save({'meta': {}, 'state_dict': model.state_dict()}, ckpt)
    test = load_tool('test')
    outs = {}
    for name, flip, flags in (('plain', False, []), ('flipped', True, []),
                              ('tta', False, ['--tta'])):
        path = dump(_test_config(data, str(tmp_path / name), flip), str(tmp_path / f'{name}.py'))
        outs[name] = str(tmp_path / f'{name}.pkl')
        test.main([path, ckpt, '--work-dir', str(tmp_path / name), '--out', outs[name], *flags])
    plain, flipped, tta = (_scores(outs[k]) for k in ('plain', 'flipped', 'tta'))
    assert (plain - flipped).abs().max() > 5e-6  # the flip changes the scores
    torch.testing.assert_close(tta, (plain + flipped) / 2, rtol=0, atol=5e-7)
