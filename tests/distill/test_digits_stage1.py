"""Real data, small scale: a softmax ViT trained on scikit-learn's digits, then AdaLA Stage 1.

The teacher is trained for real (8 x 8 digits upsampled to 32 x 32, 3 channels); the ELU+1
student starts from the teacher's weights, and Stage 1 (teacher forcing, attention parameters
only) runs through ``Runner.from_cfg`` with the recipe config on a CustomDataset folder of the
same images.  The attention-output gap on held-out digits must drop by a clear margin.
"""
import os
import os.path as osp

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.runner import Runner
from PIL import Image

from mmlinvit.backbones import LinearVisionTransformer, VisionTransformer

from distill_testing import CONFIGS, LossRecorderHook

ARCH = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
VIT = dict(arch=ARCH, family='deit', patch_size=8, img_size=32, out_type='cls_token')
STAGE1 = 'adala/vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512.py'


def digits_uint8():
    sklearn_datasets = pytest.importorskip('sklearn.datasets')
    digits = sklearn_datasets.load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(32, 32), mode='bilinear', align_corners=False)
    x = (x.clamp(0, 1) * 255).round().to(torch.uint8).repeat(1, 3, 1, 1)
    return x, torch.tensor(digits.target)


def normalise(x_uint8):
    return (x_uint8.float() - 127.5) / 127.5


def train_teacher(x, y, epochs=15, batch_size=64, lr=5e-3):
    torch.manual_seed(0)
    backbone = VisionTransformer(attn_cfg='softmax', **VIT)
    head = nn.Linear(ARCH['embed_dims'], 10)
    params = list(backbone.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    steps_per_epoch = -(-len(x) // batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=lr, total_steps=epochs * steps_per_epoch, pct_start=0.1)
    generator = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch_size):
            idx = order[start:start + batch_size]
            logits = head(backbone(normalise(x[idx]))[0])
            loss = F.cross_entropy(logits, y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return backbone.eval(), head.eval()


@torch.no_grad()
def attention_gap(student, teacher, x):
    """Mean over blocks of MSE(student attn(teacher block input), teacher attn output)."""
    inputs, outputs = {}, {}
    handles = []
    for i, blk in enumerate(teacher.blocks):
        handles.append(blk.register_forward_pre_hook(
            lambda m, args, i=i: inputs.__setitem__(i, args[0])))
        handles.append(blk.attn.register_forward_hook(
            lambda m, args, out, i=i: outputs.__setitem__(i, out)))
    teacher(x)
    for handle in handles:
        handle.remove()
    gaps = []
    for i, blk in enumerate(student.blocks):
        s_out = blk.forward_attn(inputs[i], (4, 4), student.num_prefix_tokens)
        gaps.append(F.mse_loss(s_out, outputs[i]).item())
    return float(np.mean(gaps))


def write_folder(root, x, y):
    for idx, (img, label) in enumerate(zip(x, y)):
        folder = osp.join(root, 'train', str(int(label)))
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(img.permute(1, 2, 0).numpy()).save(osp.join(folder, f'{idx:04d}.png'))


def test_stage1_lowers_the_attention_output_gap_on_digits(tmp_path):
    x, y = digits_uint8()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]
    teacher, head = train_teacher(x_train, y_train)
    with torch.no_grad():
        accuracy = (head(teacher(normalise(x_test))[0]).argmax(1) == y_test).float().mean().item()
    assert accuracy > 0.85, f'the digits teacher did not learn (accuracy {accuracy:.3f})'
    ckpt = str(tmp_path / 'digits_teacher.pth')
    torch.save(teacher.state_dict(), ckpt)

    student = LinearVisionTransformer(attn_cfg='elu', **VIT).eval()
    student.load_state_dict(teacher.state_dict())
    gap_before = attention_gap(student, teacher, normalise(x_test))

    write_folder(str(tmp_path / 'data'), x_train[:512], y_train[:512])
    cfg = Config.fromfile(osp.join(CONFIGS, STAGE1))
    for side in ('student', 'teacher'):
        cfg.model[side].update(VIT, pretrained=ckpt, out_type='raw')
    cfg.model.check_input_size = None  # dry run at the digits' 32 x 32
    cfg.data_preprocessor = dict(type='ClsDataPreprocessor', mean=[127.5] * 3, std=[127.5] * 3)
    cfg.train_dataloader.update(batch_size=32, num_workers=0, persistent_workers=False)
    cfg.train_dataloader.dataset = dict(
        type='CustomDataset', data_root=str(tmp_path / 'data'), data_prefix='train',
        with_label=False, pipeline=[dict(type='LoadImageFromFile'), dict(type='PackInputs')])
    cfg.optim_wrapper.optimizer.lr = 3e-3
    cfg.param_scheduler = [
        dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=5),
        dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=0, end=4,
             convert_to_iter_based=True),
    ]
    cfg.work_dir = str(tmp_path / 'work')
    cfg.log_level = 'WARNING'
    runner = Runner.from_cfg(cfg)
    recorder = LossRecorderHook()
    runner.register_hook(recorder)
    runner.train()

    trained = runner.model.student.eval()
    gap_after = attention_gap(trained, teacher, normalise(x_test))
    logged = [s['distill.gap_attn_out'] for s in recorder.history]
    print(f'\ndigits teacher accuracy {accuracy:.3f}; Stage 1 ({len(logged)} iterations): '
          f'held-out attention-output MSE {gap_before:.5f} -> {gap_after:.5f} '
          f'({gap_after / gap_before:.2%}); logged train gap {logged[0]:.5f} -> {logged[-1]:.5f}')
    assert gap_after < 0.5 * gap_before
    # nothing but attention parameters moved
    for name, value in trained.state_dict().items():
        if '.attn.' not in name and name not in trained.TRAINING_RECORDS:
            assert torch.equal(value, teacher.state_dict()[name]), name
