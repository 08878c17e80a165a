"""The digits distillation task: a linear ViT student distilled from a softmax ViT teacher on
scikit-learn's 8 x 8 digits, in a plain PyTorch loop (torch only; scikit-learn for the data).

Real images, upsampled to 32 x 32; a 4-block softmax ViT teacher trained here from scratch
(:func:`train_digits_teacher`); a linear student of the same architecture with a new linear
head, initialised by a :mod:`mmlinvit.transfer` strategy and trained on a small labelled subset
with an optional attention-output distillation loss (:func:`run_digits`).  The metric is the
held-out top-1 accuracy (397 images).  ``tools/analysis/sweep_distill_weight.py`` sweeps the
distillation weight on it.
"""
import math
from typing import Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmlinvit.backbones import LinearVisionTransformer, VisionTransformer
from mmlinvit.distill import ModuleOutputsRecorder
from mmlinvit.transfer import transfer_weights
from .attention_gaps import attention_output_stats

#: The digits ViT: 4 blocks of width 32, 8 px patches on 32 x 32 images (16 patches + cls).
DIGITS_VIT = dict(arch=dict(embed_dims=32, num_layers=4, num_heads=2, mlp_hidden_dims=64),
                  family='deit', patch_size=8, img_size=32, out_type='cls_token')
DIGITS_TRAIN = 1400  # the rest (397) is the held-out set


def load_digits() -> Tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn digits as (1797, 3, 32, 32) uint8 and labels, in a fixed random order."""
    from sklearn.datasets import load_digits as sk_load_digits
    digits = sk_load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(32, 32), mode='bilinear', align_corners=False)
    x = (x.clamp(0, 1) * 255).round().to(torch.uint8).repeat(1, 3, 1, 1)
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    return x[order], y[order]


def normalise_digits(x_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 images -> [-1, 1]."""
    return (x_uint8.float() - 127.5) / 127.5


def cosine_schedule(optimizer: torch.optim.Optimizer, total: int,
                    warmup: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup`` steps, then cosine from 1 to 1e-3 of the base lr at
    ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 1e-3 + (1 - 1e-3) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@torch.no_grad()
def digits_accuracy(backbone: nn.Module, head: nn.Module, x: torch.Tensor,
                    y: torch.Tensor) -> float:
    """Top-1 accuracy of ``head(backbone(x)[0])`` on uint8 images ``x`` (eval mode, then the
    backbone is put back in train mode)."""
    backbone.eval()
    logits = head(backbone(normalise_digits(x))[0])
    backbone.train()
    return float((logits.argmax(1) == y).float().mean())


def train_digits_teacher(x: torch.Tensor, y: torch.Tensor, epochs: int,
                         batch_size: int) -> Tuple[VisionTransformer, nn.Linear]:
    """The softmax teacher (seed 0), trained from scratch with AdamW + one-cycle."""
    torch.manual_seed(0)
    backbone = VisionTransformer(attn_cfg='softmax', **DIGITS_VIT)
    head = nn.Linear(DIGITS_VIT['arch']['embed_dims'], 10)
    params = list(backbone.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=5e-3, weight_decay=0.01)
    steps = epochs * -(-len(x) // batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=5e-3, total_steps=steps,
                                                   pct_start=0.1)
    generator = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch_size):
            idx = order[start:start + batch_size]
            loss = F.cross_entropy(head(backbone(normalise_digits(x[idx]))[0]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return backbone.eval(), head.eval()


def run_digits(data: dict, init: str, loss_fn: Optional[nn.Module], seed: int, operator: str,
               iters: int, batch_size: int) -> dict:
    """One student run on digits (seed 000's recipe: AdamW lr 2e-3, wd 0.05, clip 3, label
    smoothing 0.1, linear warm-up over the first tenth of the steps (at least one), then
    cosine to 1e-3 of the lr).

    Args:
        data: :func:`prepare_digits`.
        init: The weight-transfer strategy (:mod:`mmlinvit.transfer` name).
        loss_fn: The attention-output distillation loss (``None``: no distillation).
        seed: Seed of the student's head, its operator parameters and the batches.
        operator: The student's attention operator.
        iters: AdamW steps.
        batch_size: Images per step.

    Returns:
        ``score`` (held-out accuracy, %), ``attn_rel_gap`` (mean over blocks),
        ``copied`` (tensors the init copied) and ``loss`` (the loss class name or ``None``).
    """
    teacher = data['teacher']
    torch.manual_seed(seed)
    student = LinearVisionTransformer(attn_cfg=operator, **DIGITS_VIT)
    head = nn.Linear(DIGITS_VIT['arch']['embed_dims'], 10)
    report = transfer_weights(student, teacher, strategy=init)
    params = list(student.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.05)
    schedule = cosine_schedule(optimizer, iters, warmup=max(1, iters // 10))
    x, y = data['x_student'], data['y_student']
    generator = torch.Generator().manual_seed(1000 + seed)
    order, cursor = torch.randperm(len(x), generator=generator), 0
    student.train()
    s_rec = ModuleOutputsRecorder('blocks.{i}.attn').attach(student)
    t_rec = ModuleOutputsRecorder('blocks.{i}.attn').attach(teacher)
    with s_rec, t_rec:
        for _ in range(iters):
            if cursor + batch_size > len(x):
                order, cursor = torch.randperm(len(x), generator=generator), 0
            idx = order[cursor:cursor + batch_size]
            cursor += batch_size
            images = normalise_digits(x[idx])
            loss = F.cross_entropy(head(student(images)[0]), y[idx], label_smoothing=0.1)
            if loss_fn is not None:
                with torch.no_grad():
                    teacher(images)
                loss = loss + loss_fn(s_rec.get(), t_rec.get())
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(params, 3.0)
            optimizer.step()
            schedule.step()
    accuracy = digits_accuracy(student, head, data['x_test'], data['y_test'])
    _, gaps = attention_output_stats(student, teacher, normalise_digits(data['x_test']))
    return dict(score=100 * accuracy, attn_rel_gap=float(np.mean(gaps)),
                copied=len(report.copied),
                loss=None if loss_fn is None else type(loss_fn).__name__)


def prepare_digits(student_train: int, teacher_epochs: int) -> dict:
    """Loads digits, trains the teacher, measures its accuracy and attention scale.

    Args:
        student_train: Labelled images of the student's downstream set (the first of the
            teacher's training images).
        teacher_epochs: Epochs of the teacher's training.

    Returns:
        The train / test / student images (uint8) and labels, ``teacher``, ``teacher_score``
        (held-out accuracy, %) and ``teacher_attn_mean_square`` (per block).
    """
    x, y = load_digits()
    data = dict(x_train=x[:DIGITS_TRAIN], y_train=y[:DIGITS_TRAIN], x_test=x[DIGITS_TRAIN:],
                y_test=y[DIGITS_TRAIN:])
    # the downstream set: a small labelled subset of the teacher's training images
    data['x_student'] = data['x_train'][:student_train]
    data['y_student'] = data['y_train'][:student_train]
    teacher, head = train_digits_teacher(data['x_train'], data['y_train'],
                                         teacher_epochs, 64)
    for p in teacher.parameters():
        p.requires_grad_(False)
    data['teacher'] = teacher
    data['teacher_score'] = 100 * digits_accuracy(teacher, head, data['x_test'], data['y_test'])
    teacher.eval()
    mean_sq, _ = attention_output_stats(teacher, teacher, normalise_digits(data['x_test']))
    data['teacher_attn_mean_square'] = mean_sq
    return data
