"""How many patches ViT-Linearizer's patch masking masks per image.

Guards :func:`mmlinvit.distill.patch_masking.sample_patch_mask` and
:meth:`~mmlinvit.distill.patch_masking.PatchMasking.sample`, whose documented contract is MAE's
``random_masking`` count: ``int(N * (1 - ratio))`` patches kept, the other
``N - int(N * (1 - ratio))`` masked in every image of the batch (N = patches of the
corner-padded grid).  The default 196 x 0.75 = 147 is an integer, so other roundings changed
nothing the earlier tests looked at (mutation-audit survivor m44: truncating ``ratio * N``).
The cases below are chosen where the count differs from ``int(ratio * N)`` (3.75, 4.9, 4.95,
11.7, 1026.75 on DINOv2's 518 px grid) and from ``round(ratio * N)``, the count before the
MAE convention (7 x 0.75 = 5.25 -> 6; the .5 ties 10 x 0.25 and 5 x 0.5 -> 3), plus integer
products up to fp error (10 x 0.3, 196 x 0.75) and ratio 0.
"""
import pytest
import torch

from mmlinvit.distill import PatchMasking, sample_patch_mask

# (N, ratio, N - int(N * (1 - ratio)))
CASES = [
    (5, 0.75, 4),       # 3.75: int(ratio * N) would give 3
    (7, 0.7, 5),        # 4.9
    (9, 0.55, 5),       # 4.95
    (13, 0.9, 12),      # 11.7
    (37 * 37, 0.75, 1027),  # 1026.75
    (7, 0.75, 6),       # 5.25: round(ratio * N) would give 5
    (10, 0.25, 3),      # 2.5: round() gives 2 (to even)
    (5, 0.5, 3),        # 2.5: round() gives 2 (to even)
    (10, 0.3, 3),       # 3.0000000000000004 (an integer up to fp error)
    (196, 0.75, 147),   # the default ViT-B/16 grid
    (50, 0.0, 0),
]


@pytest.mark.parametrize('num_patches,ratio,expected', CASES)
def test_masks_mae_count_per_image(num_patches, ratio, expected):
    assert expected == num_patches - int(num_patches * (1 - ratio))  # the docstring's formula
    for step in (0, 1, 7):
        for rank in (0, 3):
            mask = sample_patch_mask(4, num_patches, ratio, seed=0, step=step, rank=rank)
            assert mask.shape == (4, num_patches) and mask.dtype == torch.bool
            assert mask.sum(dim=1).tolist() == [expected] * 4, (num_patches, ratio, step, rank)


def test_each_image_draws_its_own_set():
    """Same count, different patches: the images of a batch are masked independently."""
    mask = sample_patch_mask(8, 37 * 37, 0.75, seed=1, step=0)
    assert mask.sum(dim=1).eq(1027).all()
    assert len({tuple(row.nonzero().flatten().tolist()) for row in mask}) == 8


def test_patch_masking_component_counts_on_the_corner_padded_grid():
    """``PatchMasking.sample``: a 40 x 40 batch at patch 14 has a 3 x 3 corner-padded grid,
    N = 9, and 0.75 x 9 = 6.75 -> 7 masked patches per image (truncation would give 6)."""
    component = PatchMasking(ratio=0.75, seed=0)
    mask = component.sample(torch.zeros(3, 3, 40, 40), patch_size=14, step=2)
    assert mask.shape == (3, 9)
    assert mask.sum(dim=1).tolist() == [7, 7, 7]
    # 5 x 0.75 = 3.75 -> 4 on a 1 x 5 grid (16 x 80 images at patch 16).
    mask = PatchMasking(ratio=0.75, seed=0).sample(torch.zeros(2, 3, 16, 80), 16, step=0)
    assert mask.shape == (2, 5) and mask.sum(dim=1).tolist() == [4, 4]


@pytest.mark.parametrize('num_patches,ratio', [(9, 0.9), (3, 0.75), (1, 0.5)])
def test_a_ratio_that_leaves_no_patch_visible_is_refused(num_patches, ratio):
    """MAE's count keeps int(N (1 - ratio)) patches, 0 on small grids at high ratios: the
    activation-matching loss of such a batch would see no token (it added 0 to the mean)."""
    from mmlinvit.distill import DistillationConfigError
    with pytest.raises(DistillationConfigError, match='masks all'):
        sample_patch_mask(2, num_patches, ratio, seed=0, step=0)
    assert sample_patch_mask(2, num_patches + 4, 0.5, seed=0, step=0).sum(1).lt(
        num_patches + 4).all()
