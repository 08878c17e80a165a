"""``tools/test.py --tta``: multi-scale + flip evaluation as mmseg's, for segmentors and
distillation configs, with the checkpoint-coverage check on.

The reference is written here without mmseg's test-time machinery: each image is rescaled
to every scale of the config's ``tta_pipeline`` (``mmcv.imrescale``, as ``Resize(keep_ratio=
True)``), flipped or not, normalised, run through the model's ``inference``, flipped back,
resized to the original size, and the softmax of the 12 predictions is averaged.
"""
import copy
import glob
import importlib.util
import os.path as osp

import mmcv
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from seg_helpers import REPO, tiny_config

UPERNET = 'segmentation/upernet_deit-b-relu-fullcopy_8xb2-160k_ade20k-512x512.py'
DISTILL = 'segmentation/upernet_deit-b-relu-fullcopy-distill_8xb2-160k_ade20k-512x512.py'
#: The tiny configs shrink every size by 4 * 16 / 512 (seg_helpers.tiny_config).
FACTOR = 4 * 16 / 512


def _test_tool():
    spec = importlib.util.spec_from_file_location('mmlinvit_tool_test_tta',
                                                  osp.join(REPO, 'tools', 'test.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _shrink_tta(cfg) -> list:
    """The tta_pipeline's scales at the tiny configs' size; returns them."""
    resizes = cfg.tta_pipeline[1]['transforms'][0]
    scales = []
    for resize in resizes:
        resize['scale'] = tuple(max(int(s * FACTOR), 1) for s in resize['scale'])
        scales.append(resize['scale'])
    return scales


def _build(model_cfg: dict, scope: str, seed: int):
    from mmengine.registry import MODELS, DefaultScope

    from mmlinvit.engine.preflight import clear_checkpoints
    model_cfg = copy.deepcopy(model_cfg)
    clear_checkpoints(model_cfg)
    torch.manual_seed(seed)
    with DefaultScope.overwrite_default_scope(scope):
        model = MODELS.build(model_cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def _manual_tta(model, preprocessor: dict, scales, path: str) -> torch.Tensor:
    mean = torch.tensor(preprocessor['mean']).view(1, 3, 1, 1)
    std = torch.tensor(preprocessor['std']).view(1, 3, 1, 1)
    img = mmcv.imread(path)  # BGR
    h, w = img.shape[:2]
    acc = 0
    for scale in scales:
        resized = mmcv.imrescale(img, scale, interpolation='bilinear')
        for flip in (False, True):
            x = resized[:, ::-1] if flip else resized
            x = torch.from_numpy(np.ascontiguousarray(x[..., ::-1])).permute(2, 0, 1)[None]
            x = (x.float() - mean) / std
            meta = [dict(ori_shape=(h, w), img_shape=tuple(x.shape[-2:]),
                         pad_shape=tuple(x.shape[-2:]))]
            with torch.no_grad():
                logits = model.inference(x, meta)
            if flip:
                logits = logits.flip(-1)
            logits = F.interpolate(logits, size=(h, w), mode='bilinear', align_corners=False)
            acc = acc + logits[0].softmax(0)
    return (acc / (2 * len(scales))).argmax(0)


@pytest.mark.parametrize('rel', [UPERNET, DISTILL])
def test_tta_is_the_average_of_rescaled_and_flipped_predictions(tmp_path, ade_root, rel):
    cfg = tiny_config(rel, ade_root, str(tmp_path / 'wd'))
    scales = _shrink_tta(cfg)
    assert len(scales) == 6
    distill = cfg.model.type == 'mmlinvit.DistillationModel'
    seg_cfg = cfg.model.student if distill else cfg.model
    model = _build(seg_cfg, cfg.default_scope, seed=3)
    prefix = 'student.' if distill else ''
    ckpt = str(tmp_path / 'iter_1.pth')
    torch.save(dict(meta=dict(iter=1),
                    state_dict={prefix + k: v for k, v in model.state_dict().items()}), ckpt)
    cfg_file = str(tmp_path / 'cfg.py')
    cfg.dump(cfg_file)
    out = str(tmp_path / 'out')
    metrics = _test_tool().main([cfg_file, ckpt, '--tta', '--out', out,
                                 '--work-dir', str(tmp_path / 't')])
    assert 0.0 <= metrics['mIoU'] <= 100.0
    preds = sorted(glob.glob(osp.join(out, '*.png')))
    images = sorted(glob.glob(osp.join(ade_root, 'images', 'validation', '*.jpg')))
    assert len(preds) == len(images) == 2
    preprocessor = seg_cfg.data_preprocessor
    for pred_file, image in zip(preds, images):
        assert osp.basename(pred_file)[:-4] == osp.basename(image)[:-4]
        got = torch.from_numpy(np.asarray(Image.open(pred_file)).astype(np.int64)) - 1
        expected = _manual_tta(model, preprocessor, scales, image)
        assert got.shape == expected.shape
        agree = (got == expected).float().mean().item()
        assert agree == 1.0, f'{osp.basename(image)}: {agree:.4f} of the pixels agree'


def test_tta_without_a_pipeline_is_refused(tmp_path, ade_root):
    cfg = tiny_config(UPERNET, ade_root, str(tmp_path / 'wd'))
    cfg.tta_pipeline = None
    cfg_file = str(tmp_path / 'cfg.py')
    cfg.dump(cfg_file)
    with pytest.raises(SystemExit, match='--tta needs tta_pipeline'):
        _test_tool().main([cfg_file, str(tmp_path / 'x.pth'), '--tta'])
