"""Per-teacher input normalisation: the teacher sees its own statistics, the student the batch's.

A teacher trained with other input statistics than the data preprocessor's (e.g. an OpenAI
CLIP teacher under ImageNet statistics) gets ``teacher_input_norm=dict(mean=..., std=...)``
in the distillation model config; its batch is converted from the student's normalisation on
the fly: ``x_t = (x_s * std_s + mean_s - mean_t) / std_t``.
"""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .errors import DistillationConfigError


def student_input_stats(data_preprocessor: nn.Module) -> Tuple[torch.Tensor, torch.Tensor]:
    """The (C,) fp32 mean and std the data preprocessor normalises the batch with.

    Args:
        data_preprocessor: An mmengine data preprocessor (its ``mean`` / ``std`` buffers).

    Raises:
        DistillationConfigError: when the data preprocessor does not normalise.
    """
    pre = data_preprocessor
    mean, std = getattr(pre, 'mean', None), getattr(pre, 'std', None)
    enabled = getattr(pre, '_enable_normalize', mean is not None)
    if not (enabled and isinstance(mean, torch.Tensor) and isinstance(std, torch.Tensor)):
        raise DistillationConfigError(
            f'teacher_input_norm converts the batch normalised with the student statistics '
            f'into the teacher statistics, but the data preprocessor '
            f'({type(pre).__name__}) does not normalise, so the student statistics are '
            f'unknown. Give the model a normalising data preprocessor, e.g. '
            f"data_preprocessor=dict(type='ClsDataPreprocessor', mean=[123.675, 116.28, "
            f'103.53], std=[58.395, 57.12, 57.375], to_rgb=True) (top level of an '
            f'mmpretrain config, or inside the student task model), or drop '
            f'teacher_input_norm')
    return mean.detach().flatten().float(), std.detach().flatten().float()


def _pixel_units(mean: torch.Tensor, std: torch.Tensor) -> Optional[str]:
    """``'0-1'`` or ``'0-255'``: the pixel units a set of statistics is given in.

    A pixel std is at most 0.5 in 0-1 units and far above 1 in 0-255 units, a mean at most 1
    in 0-1 units; a std of exactly 1 (caffe-style 0-255 preprocessing: mean subtraction only)
    is told by its mean.  None for mean 0 and std 1 (no normalisation: either units).
    """
    if float(std.max()) > 1.0 or float(mean.abs().max()) > 1.0:
        return '0-255'
    if bool((std == 1.0).all()) and bool((mean == 0.0).all()):
        return None
    return '0-1'


class TeacherInputNorm(nn.Module):
    """Converts a batch from the data preprocessor's statistics into the teacher's.

    The teacher statistics are non-persistent buffers: like the teacher, they are rebuilt
    from the config and never saved.  The student statistics are read from the data
    preprocessor at each call.

    Args:
        mean: Per-channel mean the teacher was trained with, in the data preprocessor's
            units (0-255 for the mmpretrain / mmseg preprocessors).
        std: Per-channel std, same units.
        data_preprocessor: The data preprocessor the batch comes from, to check that it
            normalises, with as many channels and in the same units.

    Raises:
        DistillationConfigError: naming a non-normalising preprocessor, a channel-count
            mismatch, a non-positive std or statistics in other units (0-1 vs 0-255).
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float],
                 data_preprocessor: nn.Module) -> None:
        super().__init__()
        mean_t = torch.as_tensor(mean, dtype=torch.float32).flatten()
        std_t = torch.as_tensor(std, dtype=torch.float32).flatten()
        mean_s, std_s = student_input_stats(data_preprocessor)
        if not mean_t.numel() == std_t.numel() == mean_s.numel():
            raise DistillationConfigError(
                f'teacher_input_norm has {mean_t.numel()} mean and {std_t.numel()} std values, '
                f'the data preprocessor normalises {mean_s.numel()} channels')
        if not bool((std_t > 0).all()):
            raise DistillationConfigError(f'teacher_input_norm.std must be positive, got '
                                          f'{std_t.tolist()}')
        # Both sets must be in the same units: a 0-1 set next to a 0-255 one is a typo that
        # would silently feed the teacher images scaled by 255.
        units_t, units_s = _pixel_units(mean_t, std_t), _pixel_units(mean_s, std_s)
        if None not in (units_t, units_s) and units_t != units_s:
            raise DistillationConfigError(
                f'teacher_input_norm std {std_t.tolist()} and the data preprocessor std '
                f'{std_s.tolist()} are in different units (0-1 vs 0-255): give the teacher '
                f'statistics in the data preprocessor units (e.g. multiply 0-1 statistics by '
                f'255 for mmpretrain / mmseg preprocessors)')
        self.register_buffer('teacher_mean', mean_t.view(1, -1, 1, 1), persistent=False)
        self.register_buffer('teacher_std', std_t.view(1, -1, 1, 1), persistent=False)

    @classmethod
    def from_config(cls, cfg: dict, data_preprocessor: nn.Module) -> 'TeacherInputNorm':
        """Builds it from ``dict(mean=[...], std=[...])``.

        Raises:
            DistillationConfigError: when a key is missing or unknown, and as ``__init__``.
        """
        cfg = dict(cfg)
        if set(cfg) != {'mean', 'std'}:
            raise DistillationConfigError(f"teacher_input_norm takes 'mean' and 'std' (both "
                                          f'required), got keys {sorted(cfg)}')
        return cls(cfg['mean'], cfg['std'], data_preprocessor)

    @property
    def stats(self) -> dict:
        """The teacher statistics, ``dict(mean=[...], std=[...])``."""
        return dict(mean=self.teacher_mean.flatten().tolist(),
                    std=self.teacher_std.flatten().tolist())

    def forward(self, inputs: torch.Tensor, data_preprocessor: nn.Module) -> torch.Tensor:
        """The teacher's view of a preprocessed batch.

        Args:
            inputs: (B, C, H, W) batch normalised by ``data_preprocessor``.
            data_preprocessor: The data preprocessor (read for the student statistics).

        Returns:
            ``(inputs * std_s + mean_s - mean_t) / std_t``, computed in fp32 and returned in
            the dtype of ``inputs``.
        """
        mean_s, std_s = student_input_stats(data_preprocessor)
        mean_s = mean_s.to(inputs.device).view(1, -1, 1, 1)
        std_s = std_s.to(inputs.device).view(1, -1, 1, 1)
        pixels = inputs.float() * std_s + mean_s
        return ((pixels - self.teacher_mean) / self.teacher_std).to(inputs.dtype)


@torch.no_grad()
def fold_into_patch_embedding(proj: nn.Conv2d, mean_s: torch.Tensor, std_s: torch.Tensor,
                              mean_t: torch.Tensor, std_t: torch.Tensor) -> None:
    """Makes a patch projection copied from the teacher read the student's normalisation.

    The teacher's projection expects ``x_t = (x_s * std_s + mean_s - mean_t) / std_t``; a
    convolution is linear in its input, so ``W' = W * std_s / std_t`` (per input channel) and
    ``b' = b + sum W * (mean_s - mean_t) / std_t`` give the same patch tokens from the
    student's batch ``x_s``, the data preprocessor's batch padding included (the teacher sees
    converted zeros too).  Border patches of an input whose sides are not multiples of the
    patch, which the backbone pads with zeros after normalising, differ: a student zero is the
    teacher's ``(mean_s - mean_t) / std_t``, not its zero (about 1e-2 on 0-255 ImageNet vs CLIP
    statistics), so a folded FullCopy student equals its teacher exactly on patch-multiple
    inputs only.

    Args:
        proj: The student's patch projection (a convolution with a bias), changed in place.
        mean_s: (C,) mean of the student's batch; ``std_s`` its std.
        mean_t: (C,) mean the teacher expects; ``std_t`` its std.
    """
    if proj.bias is None:
        raise DistillationConfigError(
            'the copied patch projection has no bias, so the teacher_input_norm shift cannot '
            'be folded into it; give student and teacher the same input statistics')
    weight = proj.weight.double()
    scale = (std_s.double() / std_t.double()).view(1, -1, 1, 1).to(weight.device)
    shift = ((mean_s.double() - mean_t.double()) / std_t.double()).view(1, -1, 1, 1)
    proj.bias.add_((weight * shift.to(weight.device)).sum(dim=(1, 2, 3)).to(proj.bias))
    proj.weight.copy_((weight * scale).to(proj.weight))
