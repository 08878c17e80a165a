"""When a block runs under activation checkpointing (``with_cp``): the rule shared by the
backbones' blocks (:mod:`mmlinvit.backbones.checkpointing`) and the teacher-forced attention of
ViT-AdaLA Stage 1 (:mod:`mmlinvit.distill.teacher_forcing`)."""
import torch
import torch.nn as nn


def checkpoint_active(block: nn.Module, x: torch.Tensor, with_cp: bool) -> bool:
    """Whether ``block`` run on ``x`` should be checkpointed: ``with_cp`` while training with
    gradients, and only where it saves something (the block has a trainable parameter or its
    input carries a gradient; frozen blocks and ``torch.no_grad`` / eval forwards run plainly).

    Args:
        block: The block about to run.
        x: Its token input.
        with_cp: The backbone's ``with_cp`` switch.
    """
    if not (with_cp and block.training and torch.is_grad_enabled()):
        return False
    return x.requires_grad or any(p.requires_grad for p in block.parameters())
