"""Every file under ``configs/`` loads, and every config's model builds.

How the models are built cheaply (about 1 s per config on 2 CPU cores, with the real
structure: every ``type`` resolved, every constructor argument checked):

* Configs whose build runs nothing (mmseg / mmpretrain task models, Mask2Former included) are
  built **at full size on** ``torch.device('meta')``: parameters get shapes but no storage
  and no initialisation, so DINOv2-L with Mask2Former costs no memory.  Their parameter
  count must equal the ``Parameters`` of the model index (``configs/**/metafile.yml``,
  counted by ``tools/analysis/count_flops.py``).
* ``mmlinvit.DistillationModel`` configs run a build-time forward of teacher, student and
  every loss (the dry run), which the meta device cannot execute (data-dependent shapes in
  MHLA, ``torch.autocast`` in the linear-attention kernels).  They are built on the CPU
  with one documented override, :func:`shrink_width`: every backbone keeps its depth,
  family, operator, patch size and token layout, and only its width is divided by
  ``WIDTH_DIVISOR`` (heads and MLP with it); the module widths that are copies of a backbone
  width (``in_channels`` / ``out_channels`` / ``embed_dim`` of heads, necks, connectors) follow.
  Recorders, block indices, teacher forcing, weight transfer and the dry run itself then run
  as configured.  Checkpoint paths are cleared in both cases (no file is read).

The configs' runtime builds (Runner, data) are covered by the recipe tests
(tests/segmentation, tests/distill, tests/linearizer) on generated data.
"""
import copy
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope

from config_testing import (ALL_FILES, CONFIG_ROOT, DISTILLATION_TYPES, MODEL_CONFIGS,
                            metafile_parameters, model_config, shrink_width)


def test_every_config_file_is_found():
    assert 'adala_dinov2_ade20k.py' in MODEL_CONFIGS
    assert len(MODEL_CONFIGS) == len(metafile_parameters())  # each one is indexed
    assert any(rel.startswith('_base_/models/') for rel in ALL_FILES)


@pytest.mark.parametrize('rel', [r for r in ALL_FILES if r.startswith('_base_')])
def test_base_file_loads(rel):
    cfg = Config.fromfile(osp.join(CONFIG_ROOT, rel))
    assert len(cfg.keys()) > 0


@pytest.mark.parametrize('rel', MODEL_CONFIGS)
def test_config_builds(rel):
    cfg, model_cfg = model_config(rel)
    init_default_scope(cfg.default_scope)
    if model_cfg['type'] in DISTILLATION_TYPES:
        widths = shrink_width(model_cfg)
        assert widths, 'a distillation config without an mmlinvit backbone'
        model = MODELS.build(model_cfg)  # CPU: runs the build-time dry run
        assert model.teacher is not None
        student = model.student_backbone()
        assert student.embed_dims in widths.values()
    else:
        with torch.device('meta'):
            model = MODELS.build(model_cfg)
        params = sum(p.numel() for p in model.parameters())
        assert params == metafile_parameters()[rel], 'parameters differ from the model index'
    assert isinstance(model, torch.nn.Module)


def test_width_override_keeps_the_structure():
    """shrink_width changes widths only: depth, indices, operators and key set are kept."""
    rel = 'linearizer/vit-linearizer_clip-b16_adventurer-b_16xb64-300e_in1k-224x224.py'
    _, original = model_config(rel)
    shrunk = copy.deepcopy(original)
    assert shrink_width(shrunk) == {768: 96}
    assert shrunk['student']['arch'] == dict(embed_dims=96, num_layers=12)
    assert shrunk['teacher']['arch'] == dict(embed_dims=96, num_layers=12, num_heads=1,
                                             mlp_hidden_dims=384)
    assert shrunk['connectors']['proj']['out_channels'] == 96
    for side in ('student_recorders', 'teacher_recorders', 'distill_losses',
                 'patch_masking', 'teacher_input_norm'):
        assert shrunk[side] == original[side], side


def test_adala_entry_file_is_reachable_as_mmlinvit_scope(tmp_path):
    """The short entry file is the adala/ config, so other repositories can inherit it."""
    user = tmp_path / 'my_adala.py'
    user.write_text("_base_ = ['mmlinvit::adala/"
                    "mask2former_adala-dinov2-l-elu_8xb2-160k_ade20k-518x518.py']\n"
                    "model = dict(decode_head=dict(num_classes=21))\n")
    cfg = Config.fromfile(str(user))
    entry = Config.fromfile(osp.join(CONFIG_ROOT, 'adala_dinov2_ade20k.py'))
    assert cfg.model.backbone == entry.model.backbone
    assert cfg.model.decode_head.num_classes == 21 and cfg.default_scope == 'mmseg'


def test_teacher_segmentation_config_does_not_inherit_the_student():
    """The softmax teacher's recipe stands alone; the AdaLA student is built from it."""
    teacher = osp.join(CONFIG_ROOT, 'segmentation',
                       'mask2former_dinov2-l_8xb2-160k_ade20k-518x518.py')
    bases = Config._get_base_files(teacher)
    assert not any('adala' in b for b in bases), bases
    cfg = Config.fromfile(teacher)
    assert cfg.model.backbone.type == 'mmlinvit.VisionTransformer'
    assert cfg.model.backbone.attn_cfg == 'softmax'


def test_one_base_for_the_adala_stage3_backbone():
    """Each Stage-3 config takes its backbone from _base_/models/adala-dinov2-l-elu.py."""
    base = Config.fromfile(osp.join(CONFIG_ROOT, '_base_', 'models', 'adala-dinov2-l-elu.py'))
    stage3 = [rel for rel in MODEL_CONFIGS if 'adala-dinov2-l-elu' in rel]
    assert len(stage3) >= 5
    for rel in stage3:
        cfg = Config.fromfile(osp.join(CONFIG_ROOT, rel))
        backbone = cfg.model.backbone
        for key, value in base.adala_backbone.items():
            assert backbone[key] == value, (rel, key)
        assert cfg.missing_path_hints == base.adala_missing_path_hints, rel
        with open(osp.join(CONFIG_ROOT, rel)) as f:
            text = f.read()
        assert 'LinearVisionTransformer' not in text, f'{rel} pastes the backbone again'


@pytest.mark.parametrize('rel', MODEL_CONFIGS)
def test_lr_scaling_is_off_and_can_be_switched_on(rel):
    """README: `--cfg-options auto_scale_lr.enable=True` rescales the lr to the real batch;
    mmengine needs the config's base_batch_size for that, which must equal the config name's
    GPUs x images (e.g. 8xb2 -> 16)."""
    import re
    cfg = Config.fromfile(osp.join(CONFIG_ROOT, rel))
    scale = cfg.get('auto_scale_lr', None)
    assert scale is not None and 'base_batch_size' in scale, rel
    assert not scale.get('enable', False), rel
    match = re.search(r'_(\d+)xb(\d+)-', osp.basename(rel))
    if match and rel.startswith(('segmentation/', 'adala/mask2former', 'linearizer/upernet')):
        assert scale['base_batch_size'] == int(match.group(1)) * int(match.group(2)), rel


@pytest.mark.parametrize('rel', [
    '_base_/datasets/imagenet_bs64.py',
    'adala/linear-head_adala-dinov2-l-elu_64xb16-30e_in1k-512x512.py'])
def test_imagenet_pipelines_decode_as_pil_without_exif_rotation(rel, tmp_path):
    """torchvision's / timm's loaders (DeiT, DINOv2 evaluations) open images with PIL and do
    not apply the EXIF orientation; mmcv's default decoding rotates such JPEGs."""
    import numpy as np
    from mmengine.registry import TRANSFORMS
    from PIL import Image
    init_default_scope('mmpretrain')
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display
    path = str(tmp_path / 'rotated.jpg')
    Image.fromarray(pixels).save(path, exif=exif.tobytes(), quality=95)
    reference = np.asarray(Image.open(path).convert('RGB'))[..., ::-1]  # as BGR
    cfg = Config.fromfile(osp.join(CONFIG_ROOT, rel))
    for pipeline in (cfg.train_pipeline, cfg.test_pipeline):
        load = TRANSFORMS.build(pipeline[0])
        img = load(dict(img_path=path))['img']
        assert img.shape == reference.shape == (30, 40, 3)
        np.testing.assert_array_equal(img, reference)


@pytest.mark.parametrize('rel', MODEL_CONFIGS)
def test_validated_configs_keep_their_best_checkpoint(rel):
    """A config that validates keeps its best checkpoint besides the last max_keep_ckpts
    (mmseg's configs by mIoU; DeiT keeps its best by top-1): without save_best, the rotation
    deleted the best epoch of a run whose accuracy later fell."""
    cfg = Config.fromfile(osp.join(CONFIG_ROOT, rel))
    if not cfg.get('val_evaluator', None) or not cfg.get('val_dataloader', None):
        return
    hook = cfg.default_hooks.checkpoint
    if rel.startswith('demo/'):  # one checkpoint, at the end, after the only validation
        assert hook.interval == cfg.train_cfg.max_iters == cfg.train_cfg.val_interval, rel
        return
    assert hook.get('save_best') in ('auto', 'mIoU'), rel


@pytest.mark.parametrize('rel', [rel for rel in MODEL_CONFIGS if 'mask2former' in rel])
def test_mask2former_schedule_is_vit_adapters(rel):
    """ViT-Adapter-L + Mask2Former (the recipe these configs follow) uses mmcv's poly policy
    with a linear warm-up: lr_t = base (1 - t / T) x warm(t), the poly counted from 0. mmseg's
    UPerNet schedule (poly from the end of the warm-up) ran 1-2 % above it. Checked on a
    shortened copy of the configured schedulers (T / 50) against that formula."""
    from mmengine.optim.scheduler import LinearLR, PolyLR
    cfg = Config.fromfile(osp.join(CONFIG_ROOT, rel))
    warm, poly = cfg.param_scheduler
    total = cfg.train_cfg.max_iters
    assert (warm.type, warm.begin, warm.end, warm.start_factor) == ('LinearLR', 0, 1500, 1e-6)
    assert (poly.type, poly.begin, poly.end, poly.power, poly.eta_min) == ('PolyLR', 0, total,
                                                                          1.0, 0.0)
    scale = 50
    w, t_total = warm.end // scale, total // scale
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    schedulers = [LinearLR(optimizer, start_factor=1e-6, by_epoch=False, begin=0, end=w),
                  PolyLR(optimizer, eta_min=0.0, power=1.0, by_epoch=False, begin=0,
                         end=t_total)]
    for t in range(t_total):
        lr = optimizer.param_groups[0]['lr']
        warm_factor = 1 - (1 - t / w) * (1 - 1e-6) if t < w else 1.0  # mmcv linear warm-up
        expected = (1 - t / t_total) * warm_factor
        if t < w:  # mmengine's LinearLR reaches the base one step early: t / (w - 1)
            assert abs(lr - expected) <= 1.0 / w, (t, lr, expected)
        else:
            assert abs(lr - expected) <= 1e-3, (t, lr, expected)  # old schedule: 9e-3
        optimizer.step()
        for scheduler in schedulers:
            scheduler.step()
