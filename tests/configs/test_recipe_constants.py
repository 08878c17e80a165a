"""Recipe constants no other test pins, as the configs' headers and the README state them:
the ViT-Linearizer loss (L_act + 1.0 L_mask, 75 % of the patches masked), the AdaLA Stage-1 /
Stage-2 optimisers, and the blocks the AdaLA segmentation backbones read (8, 12, 16, 24 of
DINOv2-L's 24)."""
import glob
import os.path as osp

import pytest
from mmengine.config import Config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
LINEARIZER = sorted(glob.glob(osp.join(REPO, 'configs', 'linearizer', 'vit-linearizer_*.py')))
ADALA_SEG = sorted(p for p in glob.glob(osp.join(REPO, 'configs', '**', '*adala*.py'),
                                        recursive=True)
                   if '_base_' not in p and ('mask2former' in p or 'upernet' in p
                                             or p.endswith('adala_dinov2_ade20k.py')))
STAGE1 = 'configs/adala/vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512.py'
STAGE2 = 'configs/adala/vit-adala-stage2-feat-align_dinov2-l-elu_8xb8-10e_in22k-512x512.py'


def test_the_recipes_are_found():
    assert len(LINEARIZER) == 2, LINEARIZER
    assert len(ADALA_SEG) >= 3, ADALA_SEG


@pytest.mark.parametrize('path', LINEARIZER, ids=osp.basename)
def test_linearizer_loss_weights_and_mask_ratio(path):
    model = Config.fromfile(path).model
    losses = model.distill_losses
    assert losses.act.loss.type == 'mmlinvit.ActivationMatchingLoss'
    assert losses.act.loss.loss_weight == 1.0
    assert losses.act.loss.get('stage_reduction', 'mean') == 'mean'
    assert losses.mask.loss.type == 'mmlinvit.MaskedPredictionLoss'
    assert losses.mask.loss.loss_weight == 1.0
    assert model.patch_masking.ratio == 0.75


def test_adala_stage_optimisers():
    stage1 = Config.fromfile(osp.join(REPO, STAGE1))
    optimizer = stage1.optim_wrapper.optimizer
    assert (optimizer.type, optimizer.lr, optimizer.weight_decay) == ('AdamW', 1e-4, 0.05)
    assert stage1.param_scheduler[0].end == 500 and stage1.train_cfg.max_epochs == 4
    assert stage1.auto_scale_lr.base_batch_size == 64
    stage2 = Config.fromfile(osp.join(REPO, STAGE2)).optim_wrapper.optimizer
    assert (stage2.lr, stage2.weight_decay) == (5e-5, 0.05)


@pytest.mark.parametrize('path', ADALA_SEG, ids=osp.basename)
def test_adala_segmentation_backbones_read_blocks_8_12_16_24(path):
    backbone = Config.fromfile(path).model.backbone
    assert backbone.arch == 'l'
    assert list(backbone.out_indices) == [7, 11, 15, 23]
