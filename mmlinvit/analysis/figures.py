"""Matplotlib figure of a teacher-vs-student comparison on photos (torch + matplotlib).

matplotlib is imported inside the function (Agg backend), so importing
:mod:`mmlinvit.analysis` stays cheap.
"""
import os
from typing import Sequence

import numpy as np

from .attention_maps import upsample_map
from .teacher_student import TeacherStudentComparison

#: Column titles of :func:`save_teacher_student_figure`, left to right.
COMPARISON_COLUMNS = ('photo (query patch)', 'teacher attention', 'student attention',
                      'student - teacher', 'teacher features PCA', 'student features PCA',
                      '1 - cos(teacher, student)')


def save_teacher_student_figure(path: str, images: Sequence[np.ndarray],
                                captions: Sequence[str], cmp: TeacherStudentComparison,
                                patch_size: int, title: str = '') -> str:
    """One row per photo, the columns of :data:`COMPARISON_COLUMNS`, saved as a PNG.

    Attention maps are overlaid on the photo (shared colour range per row, so teacher and
    student are comparable); the difference uses a diverging map centred at 0 with its
    total-variation distance below it; the PCA panels share the teacher's basis and colour
    range; the cosine gap uses one 0..max scale for all rows (its colour bar gives the
    values).

    Args:
        path: Output PNG path (folders are created).
        images: (H, W, 3) uint8 photos, the ones ``cmp`` was computed on.
        captions: One caption per photo (row label).
        cmp: The comparison (:func:`~mmlinvit.analysis.compare_teacher_student`).
        patch_size: Patch size in pixels (for the query marker).
        title: Figure title.

    Returns:
        ``path``.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n = len(images)
    if n != cmp.teacher_attention.shape[0] or n != len(captions):
        raise ValueError(f'{n} images, {len(captions)} captions and '
                         f'{cmp.teacher_attention.shape[0]} compared images must agree')
    ncols = len(COMPARISON_COLUMNS)
    fig, axes = plt.subplots(n, ncols, figsize=(2.3 * ncols, 2.4 * n + 0.6), squeeze=False)
    row_q, col_q = cmp.query
    gap_max = max(float(cmp.feature_cosine_gap.max()), 1e-6)
    for r, image in enumerate(images):
        hw = image.shape[:2]
        t_map = upsample_map(cmp.teacher_attention[r], hw, patch_size=patch_size).numpy()
        s_map = upsample_map(cmp.student_attention[r], hw, patch_size=patch_size).numpy()
        d_map = upsample_map(cmp.attention_difference[r], hw, patch_size=patch_size).numpy()
        lo = min(float(t_map.min()), float(s_map.min()))
        hi = max(float(t_map.max()), float(s_map.max()))
        signed = lo < 0
        panels = axes[r]
        panels[0].imshow(image)
        for c, grid_map in ((1, t_map), (2, s_map)):
            panels[c].imshow(image)
            if signed:
                bound = max(abs(lo), abs(hi)) or 1.0
                panels[c].imshow(grid_map, cmap='coolwarm', vmin=-bound, vmax=bound, alpha=0.65)
            else:
                panels[c].imshow(grid_map, cmap='inferno', vmin=lo, vmax=max(hi, lo + 1e-12),
                                 alpha=0.65)
        bound = float(np.abs(d_map).max()) or 1e-12
        diff_im = panels[3].imshow(d_map, cmap='coolwarm', vmin=-bound, vmax=bound)
        fig.colorbar(diff_im, ax=panels[3], fraction=0.046, pad=0.02)
        panels[3].set_xlabel(f'TV distance {float(cmp.attention_tv[r]):.3f}', fontsize=8)
        for c, rgb in ((4, cmp.teacher_pca[r]), (5, cmp.student_pca[r])):
            panels[c].imshow(rgb.numpy(), interpolation='nearest')
        gap = cmp.feature_cosine_gap[r]
        gap_im = panels[6].imshow(gap.numpy(), cmap='magma', vmin=0.0, vmax=gap_max,
                                  interpolation='nearest')
        panels[6].set_xlabel(f'mean {float(gap.mean()):.2g}', fontsize=8)
        fig.colorbar(gap_im, ax=panels[6], fraction=0.046, pad=0.02)
        for c in range(3):
            panels[c].add_patch(Rectangle((col_q * patch_size, row_q * patch_size), patch_size,
                                          patch_size, fill=False, edgecolor='cyan', linewidth=1.5))
        panels[0].set_ylabel(captions[r], fontsize=9)
        for ax in panels:
            ax.set_xticks([])
            ax.set_yticks([])
    for c, name in enumerate(COMPARISON_COLUMNS):
        axes[0, c].set_title(name, fontsize=9)
    ratio = ', '.join(f'{100 * float(v):.0f}%' for v in cmp.explained_variance)
    fig.suptitle(f'{title}\nattention of the query patch in block {cmp.layer} (mean over heads); '
                 f'PCA in the teacher basis (explained variance {ratio})', fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
