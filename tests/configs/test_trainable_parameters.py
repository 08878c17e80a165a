"""Every trainable parameter of every config's model gets a gradient from one training step.

Multi-GPU runs wrap the model in DDP with ``find_unused_parameters=False`` (mmengine's and
``tools/dist_train.sh``'s default): a parameter that requires a gradient but takes no part in
the loss stops the run at its second iteration.  It is also weight decay and optimizer state
spent on nothing.  Each config's model is built as in ``test_all_configs`` (every backbone's
width divided by ``WIDTH_DIVISOR``, depth and structure kept), then one loss is computed on
generated data at a 4 x 4 patch grid and back-propagated.
"""
import os.path as osp
from typing import List

import pytest
import torch
from mmengine.config import Config
from mmengine.model import BaseModel
from mmengine.registry import MODELS, init_default_scope

from config_testing import (CONFIG_ROOT, MODEL_CONFIGS, build_shrunk_model, model_config,
                            shrink_width)

BATCH = 2


def _patch_size(model: torch.nn.Module) -> int:
    backbone = model.student_backbone() if hasattr(model, 'student_backbone') else model.backbone
    patch = backbone.patch_size
    return patch if isinstance(patch, int) else patch[0]


def _data_samples(world: str, size: int, task_model: bool) -> List:
    if not task_model:
        return None
    if world == 'mmseg':
        from mmengine.structures import PixelData
        from mmseg.structures import SegDataSample
        samples = []
        for i in range(BATCH):
            sample = SegDataSample(metainfo=dict(img_shape=(size, size), pad_shape=(size, size),
                                                 ori_shape=(size, size)))
            # two classes per image, and the ignore index
            labels = torch.full((1, size, size), i, dtype=torch.long)
            labels[:, size // 2:] = i + 1
            labels[:, :, :2] = 255
            sample.gt_sem_seg = PixelData(data=labels)
            samples.append(sample)
        return samples
    from mmpretrain.structures import DataSample
    return [DataSample().set_gt_label(i) for i in range(BATCH)]


def params_without_gradient(model: BaseModel, world: str) -> List[str]:
    """Names of the parameters that require a gradient but get none from one loss."""
    model.train()
    size = 4 * _patch_size(model)
    task_model = not hasattr(model, 'student_is_task_model') or model.student_is_task_model
    inputs = torch.randn(BATCH, 3, size, size)
    losses = model(inputs, _data_samples(world, size, task_model), mode='loss')
    loss, _ = model.parse_losses(losses)
    model.zero_grad(set_to_none=True)
    loss.backward()
    return [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]


@pytest.mark.parametrize('rel', MODEL_CONFIGS)
def test_every_trainable_parameter_gets_a_gradient(rel):
    cfg, model = build_shrunk_model(rel)
    model.init_weights()
    unused = params_without_gradient(model, cfg.default_scope)
    assert not unused, (
        f'{rel}: trainable parameters that get no gradient (DDP with '
        f'find_unused_parameters=False stops at iteration 2): {unused}')


def test_the_check_finds_an_unused_mask_token():
    """The DINOv2 family keeps the official checkpoint's mask token by default; only masked
    training uses it, so a trainable one is reported."""
    rel = 'segmentation/mask2former_dinov2-l_8xb2-160k_ade20k-518x518.py'
    cfg, model_cfg = model_config(rel)
    init_default_scope(cfg.default_scope)
    shrink_width(model_cfg)
    model_cfg['backbone']['with_mask_token'] = True
    model = MODELS.build(model_cfg)
    assert params_without_gradient(model, cfg.default_scope) == ['backbone.mask_token']


def test_config_files_are_checked():
    assert len(MODEL_CONFIGS) >= 20
    assert all(osp.isfile(osp.join(CONFIG_ROOT, rel)) for rel in MODEL_CONFIGS)
    assert isinstance(Config.fromfile(osp.join(CONFIG_ROOT, MODEL_CONFIGS[0])), Config)
