"""Every segmentation config builds and runs one train step plus whole and sliding-window
inference at reduced size, on generated data in the real ADE20K / Cityscapes layouts (CPU)."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.model import is_model_wrapper

from mmlinvit.engine.launch import build_runner, prepare_train_config
from seg_helpers import REPO, tiny_config


#: The short entry file users type, and the config it names.
ADALA_ALIAS = 'adala_dinov2_ade20k.py'
ADALA_FULL = 'adala/mask2former_adala-dinov2-l-elu_8xb2-160k_ade20k-518x518.py'


def _segmentation_configs():
    """Every non-base config whose (student) model is an mmseg EncoderDecoder."""
    found = []
    for path in sorted(glob.glob(osp.join(REPO, 'configs', '**', '*.py'), recursive=True)):
        rel = osp.relpath(path, osp.join(REPO, 'configs'))
        if rel.startswith(('_base_', 'demo')):  # the demo's configs run in test_seg_demo.py
            continue
        if rel == ADALA_ALIAS:  # the same config as ADALA_FULL (test_adala_config_recipe)
            continue
        cfg = Config.fromfile(path)
        if cfg.get('default_scope') != 'mmseg':
            continue
        model = cfg.model['student'] if cfg.model['type'] == 'mmlinvit.DistillationModel' \
            else cfg.model
        if model['type'] in ('EncoderDecoder', 'mmlinvit.EncoderDecoder'):
            found.append(rel)
    return found


SEG_CONFIGS = _segmentation_configs()


def test_expected_configs_are_discovered():
    expected = {
        ADALA_FULL,
        'segmentation/upernet_adala-dinov2-l-elu_8xb2-160k_ade20k-518x518.py',
        'segmentation/mask2former_dinov2-l_8xb2-160k_ade20k-518x518.py',
        'segmentation/mask2former_adala-dinov2-l-elu_8xb2-80k_cityscapes-512x1024.py',
        'segmentation/mask2former_adala-dinov2-l-elu_8xb1-80k_cityscapes-1024x1024.py',
        'segmentation/upernet_deit-b-relu-fullcopy_8xb2-160k_ade20k-512x512.py',
        'segmentation/upernet_deit-b-relu-fullcopy-distill_8xb2-160k_ade20k-512x512.py',
    }
    assert expected <= set(SEG_CONFIGS)


def test_adala_config_recipe():
    cfg = Config.fromfile(osp.join(REPO, 'configs', ADALA_ALIAS))
    full = Config.fromfile(osp.join(REPO, 'configs', ADALA_FULL))
    assert cfg.to_dict() == full.to_dict()  # the entry file is the adala/ config, unchanged
    backbone = cfg.model.backbone
    assert backbone.type == 'mmlinvit.LinearVisionTransformer'
    assert (backbone.arch, backbone.family, backbone.attn_cfg) == ('l', 'dinov2', 'elu')
    assert backbone.pretrained == cfg.adala_stage2_checkpoint
    assert backbone.pretrained.endswith('student_backbone.pth')
    assert cfg.model.decode_head.type == 'Mask2FormerHead'
    assert cfg.model.decode_head.num_classes == 150
    assert cfg.train_dataloader.dataset.type == 'ADE20KDataset'
    assert cfg.train_dataloader.dataset.reduce_zero_label
    crops = [t['crop_size'] for t in cfg.train_dataloader.dataset.pipeline if 'crop_size' in t]
    assert crops == [(518, 518)] and 518 % 14 == 0
    assert cfg.optim_wrapper.constructor == 'mmlinvit.LayerDecayOptimWrapperConstructor'


@pytest.mark.parametrize('rel', [r for r in SEG_CONFIGS if 'dinov2' in r])
def test_dinov2_configs_pad_as_dinov2(rel):
    """DINOv2's segmentation evaluation pads inputs to a multiple of 14 with CenterPadding:
    the segmentor pads centred, and the data preprocessor pads no further than the crop (a
    size_divisor of 14, or a size beyond the crop, there would pad at the bottom / right
    before the segmentor sees the image)."""
    cfg = Config.fromfile(osp.join(REPO, 'configs', rel))
    assert cfg.model.type == 'mmlinvit.EncoderDecoder'
    assert cfg.model.patch_padding == 'center'
    pre = cfg.model.data_preprocessor
    crop = next(tuple(t['crop_size']) for t in cfg.train_dataloader.dataset.pipeline
                if 'crop_size' in t)
    for stage in (pre, pre.get('test_cfg') or {}):
        assert stage.get('size_divisor') in (None, 1)
        size = stage.get('size')
        assert size is None or tuple(size) == crop


def _seg_model(runner):
    model = runner.model.module if is_model_wrapper(runner.model) else runner.model
    return model.student if hasattr(model, 'student') else model


@pytest.mark.parametrize('rel', SEG_CONFIGS)
def test_config_train_step_and_inference(rel, tmp_path, ade_root, city_root):
    probe = Config.fromfile(osp.join(REPO, 'configs', rel))
    root = city_root if probe.train_dataloader.dataset.type == 'CityscapesDataset' else ade_root
    cfg = tiny_config(rel, root, str(tmp_path))
    cfg.train_cfg['val_begin'] = 2  # validate explicitly below, in both modes
    cfg.experiment_name = f'test_{osp.basename(rel)}_{tmp_path.name}'
    prepare_train_config(cfg, rel, work_dir=str(tmp_path))
    runner = build_runner(cfg, mode='train')
    seg = _seg_model(runner)

    head_cfg = (cfg.model.student if 'student' in cfg.model else cfg.model).decode_head
    if head_cfg['type'] == 'Mask2FormerHead':
        import mmdet.models.dense_heads as mmdet_heads
        import mmdet.models.layers as mmdet_layers
        assert isinstance(seg.decode_head, mmdet_heads.MaskFormerHead)
        assert isinstance(seg.decode_head.pixel_decoder, mmdet_layers.MSDeformAttnPixelDecoder)

    runner.train()
    assert runner.iter == 1

    # The configured checkpoint really initialised the backbone (tiny stand-in written by
    # tiny_config); one warm-up step at lr * 1e-6 leaves the weights where they were.
    pretrained = cfg.model.get('student', cfg.model).backbone.get('pretrained')
    if pretrained:
        saved = torch.load(pretrained, map_location='cpu', weights_only=True)
        # first mixer weight: ViT attention or Adventurer Mamba-2 input projection
        key = next(k for k in ('blocks.0.attn.qkv.weight', 'layers.0.mixer.in_proj.weight')
                   if k in seg.backbone.state_dict())
        value = next(v for k, v in saved.items() if k.endswith(key))
        torch.testing.assert_close(seg.backbone.state_dict()[key], value, atol=1e-3, rtol=0)

    whole = runner.val_loop.run()
    seg.test_cfg['mode'] = 'slide'
    slide = runner.val_loop.run()
    for metrics in (whole, slide):
        assert 0.0 <= metrics['mIoU'] <= 100.0


def test_cityscapes_1024_pads_short_crops_to_the_whole_crop():
    """A random scale < 1 makes 1024 x 1024 crops of 1024 x 2048 images shorter (e.g. 614 x
    1024); mmseg's and ViT-Adapter's recipes pad them to the crop (labels ignored), the config
    padded them only to the next patch multiple (616 x 1036)."""
    from mmseg.registry import MODELS
    from mmseg.structures import SegDataSample
    from mmengine.structures import PixelData
    cfg = Config.fromfile(osp.join(
        REPO, 'configs', 'segmentation',
        'mask2former_adala-dinov2-l-elu_8xb1-80k_cityscapes-1024x1024.py'))
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmseg'):  # whatever scope is current
        pre = MODELS.build(cfg.model.data_preprocessor).train()
    sample = SegDataSample(gt_sem_seg=PixelData(data=torch.zeros(1, 614, 1024, dtype=torch.long)))
    out = pre(dict(inputs=[torch.zeros(3, 614, 1024, dtype=torch.uint8)],
                   data_samples=[sample]), training=True)
    assert tuple(out['inputs'].shape[-2:]) == (1024, 1024)
    labels = out['data_samples'][0].gt_sem_seg.data
    assert (labels[:, 614:] == 255).all() and (labels[:, :614] == 0).all()
