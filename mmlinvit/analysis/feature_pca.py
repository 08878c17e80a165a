"""Patch features of a ViT and their first principal components shown as RGB (torch only).

The usual picture of what a ViT has learned (DINO, DINOv2): project every patch feature on
the first three principal components and show the three coordinates as red, green and blue.
To compare a teacher with its linearized student, :func:`pca_rgb` fits the components (and
the colour range) on one *reference* set of features (the teacher's) and projects every other
set on the same basis, so equal colours mean equal features.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn


def patch_features(model: nn.Module, images: torch.Tensor,
                   layer: Optional[int] = None) -> torch.Tensor:
    """Patch-token features of a VisionTransformer on its patch grid.

    Args:
        model: A :class:`~mmlinvit.backbones.VisionTransformer` (``forward_tokens``,
            ``num_prefix_tokens``, ``blocks``).
        images: (B, 3, H, W) normalised images.
        layer: ``None`` for the final normalised tokens (what the heads see), or a block
            index (negative allowed) for that block's output (residual stream, before the
            final norm).

    Returns:
        (B, h, w, C) float32 features, prefix (class / register) tokens dropped.
    """
    for attr in ('forward_tokens', 'num_prefix_tokens', 'blocks'):
        if not hasattr(model, attr):
            raise TypeError(f'{type(model).__name__} has no `{attr}`; patch_features expects '
                            f'an mmlinvit VisionTransformer')
    captured = {}
    handle = None
    if layer is not None:
        depth = len(model.blocks)
        real = layer + depth if layer < 0 else layer
        if not 0 <= real < depth:
            raise IndexError(f'layer {layer} is out of range for a model with {depth} blocks')
        handle = model.blocks[real].register_forward_hook(
            lambda module, args, out: captured.__setitem__('tokens', out))
    try:
        with torch.no_grad():
            tokens, hw_shape = model.forward_tokens(images)
    finally:
        if handle is not None:
            handle.remove()
    tokens = captured.get('tokens', tokens)
    patches = tokens[:, model.num_prefix_tokens:].float()
    return patches.reshape(patches.shape[0], hw_shape[0], hw_shape[1], patches.shape[-1])


def principal_components(features: torch.Tensor,
                         num: int = 3) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, first ``num`` principal directions and explained-variance ratios.

    Directions have a deterministic sign: the entry of largest magnitude is positive (the
    convention of scikit-learn's ``svd_flip``).

    Args:
        features: (..., C) features; every leading position is one sample.
        num: Number of components.

    Returns:
        ``(mean (C,), components (num, C), explained_variance_ratio (num,))``.
    """
    x = features.reshape(-1, features.shape[-1]).double()
    if x.shape[0] < 2 or num > min(x.shape):
        raise ValueError(f'{num} principal components need at least {num} samples and '
                         f'channels, got {tuple(x.shape)}')
    mean = x.mean(0)
    _, s, vh = torch.linalg.svd(x - mean, full_matrices=False)
    comps = vh[:num]
    signs = torch.sign(comps.gather(1, comps.abs().argmax(1, keepdim=True)))
    comps = comps * signs
    var = s.pow(2)
    ratio = var[:num] / var.sum().clamp_min(1e-30)
    return mean.float(), comps.float(), ratio.float()


def pca_rgb(reference: torch.Tensor, others: Sequence[torch.Tensor] = (),
            num: int = 3) -> Tuple[torch.Tensor, List[torch.Tensor], torch.Tensor]:
    """First three principal components of patch features as RGB colours in [0, 1].

    The components and the colour range (per component, the reference's min..max) come
    from ``reference``; ``others`` are projected on the same basis and clipped to that range.

    Args:
        reference: (B, h, w, C) features that define the basis (e.g. the teacher's).
        others: Feature tensors of the same width (e.g. the student's).
        num: Number of components (3 for RGB).

    Returns:
        ``(reference_rgb, [other_rgb, ...], explained_variance_ratio)``; each rgb is
        (B, h, w, num) float32.
    """
    mean, comps, ratio = principal_components(reference, num)

    def project(feats: torch.Tensor) -> torch.Tensor:
        if feats.shape[-1] != reference.shape[-1]:
            raise ValueError(f'features of width {feats.shape[-1]} cannot be projected on '
                             f'components of width {reference.shape[-1]}')
        return (feats.float() - mean) @ comps.t()

    ref_proj = project(reference)
    flat = ref_proj.reshape(-1, num)
    lo, hi = flat.min(0).values, flat.max(0).values
    span = (hi - lo).clamp_min(1e-12)

    def colour(proj: torch.Tensor) -> torch.Tensor:
        return ((proj - lo) / span).clamp(0.0, 1.0)

    return colour(ref_proj), [colour(project(o)) for o in others], ratio
