"""How far a linearized student's attention outputs and features are from its teacher's
(torch only).

Every gap is a relative mean square error, ``mean((s - t)^2) / mean(t^2)`` (:func:`relative_mse`),
so it reads the same for teachers whose activations have different scales:

* :func:`feature_gap`: the final normalised tokens of two ViTs on the same images;
* :func:`attention_gap`: one block's attention output under teacher forcing (the student's
  attention sees the teacher's block input);
* :func:`attention_output_stats`: every block's attention output, each model on its own
  stream, plus the teacher's attention-output mean square (the scale a raw MSE loss sees).
"""
from typing import List, Tuple

import torch
import torch.nn as nn

from mmlinvit.backbones import VisionTransformer
from mmlinvit.distill import ModuleInputsRecorder, ModuleOutputsRecorder


def relative_mse(student: torch.Tensor, teacher: torch.Tensor) -> float:
    """``mean((student - teacher)^2) / mean(teacher^2)``."""
    return float((student - teacher).pow(2).mean() / teacher.pow(2).mean())


@torch.no_grad()
def feature_gap(student: VisionTransformer, teacher: VisionTransformer,
                images: torch.Tensor) -> float:
    """Relative MSE of the final normalised tokens (both models are put in eval mode).

    Args:
        student: The student ViT.
        teacher: The teacher ViT.
        images: (B, 3, H, W) images, already normalised.
    """
    f_s, _ = student.eval().forward_tokens(images)
    f_t, _ = teacher.eval().forward_tokens(images)
    return relative_mse(f_s, f_t)


@torch.no_grad()
def attention_gap(student: VisionTransformer, teacher: VisionTransformer, index: int,
                  images: torch.Tensor) -> float:
    """Teacher-forced relative attention-output gap of block ``index``.

    Args:
        student: The student ViT (its block ``index`` is run on the teacher's block input).
        teacher: The teacher ViT.
        index: The block.
        images: (B, 3, H, W) images, already normalised.
    """
    with ModuleInputsRecorder(f'blocks.{index}').attach(teacher) as t_in, \
            ModuleOutputsRecorder(f'blocks.{index}.attn').attach(teacher) as t_out:
        _, hw_shape = teacher.forward_tokens(images)
        block_in, target = t_in.get(), t_out.get()
    out = student.blocks[index].forward_attn(block_in, hw_shape, teacher.num_prefix_tokens)
    return relative_mse(out, target)


@torch.no_grad()
def attention_output_stats(student: nn.Module, teacher: nn.Module,
                           x: torch.Tensor) -> Tuple[List[float], List[float]]:
    """Per block: the teacher's attention-output mean square, and the student's relative gap.

    Both models run on the same images, each on its own stream (no teacher forcing); the
    student is evaluated in eval mode and put back in its former mode.

    Args:
        student: A backbone with ``blocks[i].attn`` modules.
        teacher: A backbone with as many ``blocks[i].attn`` modules.
        x: The images, already normalised.

    Returns:
        (teacher mean squares, student relative gaps), one value per block.
    """
    was_training = student.training
    student.eval()
    with ModuleOutputsRecorder('blocks.{i}.attn').attach(teacher) as t_rec, \
            ModuleOutputsRecorder('blocks.{i}.attn').attach(student) as s_rec:
        teacher(x)
        student(x)
        t_out, s_out = t_rec.get(), s_rec.get()
    student.train(was_training)
    mean_sq = [float(t.pow(2).mean()) for t in t_out]
    gaps = [relative_mse(s, t) for s, t in zip(s_out, t_out)]
    return mean_sq, gaps
