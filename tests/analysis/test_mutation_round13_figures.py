"""Mutation round 13 over the analysis modules behind the teacher-vs-student figures, the
digits task, the kernel checks and the SASS report.

Guards what the existing analysis tests left open, each against a reference that does not
run the code under test: values worked out by hand, scikit-learn's PCA, PIL's bicubic resize
of a crop indexed here, scikit-learn's digits upsampled by a bilinear formula written here,
real SASS lines in the format of the ``cuobjdump`` that Triton bundles, and plain hooks:

* ``mmlinvit.analysis.feature_pca``: prefix (class + register) tokens dropped, the block hook
  removed, the sign convention of scikit-learn's ``svd_flip``, the sample / channel limits,
  per-component colour ranges, clipping of the other feature sets, tiny feature scales;
* ``mmlinvit.analysis.teacher_student``: patch size and depth checks, the teacher run in
  eval mode, the cosine gap of the two models' patch tokens, small-norm vectors, shapes;
* ``mmlinvit.analysis.figures``: colour ranges (inferno 0..max, signed coolwarm, shared
  cosine-gap scale), the labels of each row, the query marker, the title, nested folders;
* ``mmlinvit.analysis.photos``: the crop geometry (rounding), bicubic resize, the left view
  of the motorcycle pair, one-pixel crops, non-RGB photos and empty sizes refused;
* ``mmlinvit.analysis.compared_models``: the ViT-L/14 pair and the smoke pair;
* ``mmlinvit.analysis.digits_distill``: the warm-up + cosine factor, the [-1, 1] scale, the
  bilinear 32 x 32 digits, the accuracy helper, the data split, epoch-wise batches and the
  (student, teacher) order of the distillation loss;
* ``mmlinvit.analysis.kernel_checks``: input shapes and ranges, the InLine "trained" inputs;
* ``mmlinvit.analysis.sass_report``: the instruction parser on real SASS lines, the resource
  usage parser, de-duplication of compiled kernels and the restored Triton state.

FINDING (fails on the code before the fix): ``sass_summary`` counted ``LDGDEPBAR`` (the
``cp.async`` commit barrier) as a 32-bit ``LDG`` and ``LDSM`` (``ldmatrix``) as a 32-bit
``LDS``: the sm_90 report of ``_state_kernel`` showed ``LDG: 4`` (four 32-bit global loads)
where its SASS has none, only four ``LDGDEPBAR``; ``test_sass_summary_of_real_lines``.

FINDING (fails on the code before the fix): ``compare_teacher_student(..., layer=-3)`` of a
2-block model ended in a bare ``KeyError: -1``; ``test_compare_refuses_a_layer_out_of_range``.
"""
import math
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Tuple

import numpy as np
import pytest
import torch
import torch.nn as nn

from mmlinvit.analysis import digits_distill, kernel_checks, photos, sass_report
from mmlinvit.analysis.compared_models import COMPARED_MODELS, SMOKE_MODEL
from mmlinvit.analysis.feature_pca import patch_features, pca_rgb, principal_components
from mmlinvit.analysis.figures import COMPARISON_COLUMNS, save_teacher_student_figure
from mmlinvit.analysis.teacher_student import (TeacherStudentComparison,
                                               compare_teacher_student, feature_cosine_gap)
from mmlinvit.backbones import VisionTransformer

TINY = dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32)


def _tiny_vit(operator: str = 'softmax', **kwargs) -> VisionTransformer:
    kwargs.setdefault('patch_size', 8)
    return VisionTransformer(TINY, attn_cfg=operator, img_size=32, **kwargs).eval()


def _nvidia_tools() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return (Path(triton.__file__).parent / 'backends' / 'nvidia' / 'bin' / 'cuobjdump').exists()


# ----------------------------------------------------------------------------- feature_pca
def test_patch_features_drop_class_and_register_tokens_and_the_hook():
    """A ViT with a class token and 2 registers: the first 3 tokens are not patches; the
    block hook of ``layer=`` is gone afterwards."""
    torch.manual_seed(0)
    model = _tiny_vit(num_reg_tokens=2)
    images = torch.randn(1, 3, 16, 24)
    with torch.no_grad():
        tokens, _ = model.forward_tokens(images)
    assert tokens.shape[1] == 3 + 6
    feats = patch_features(model, images)
    torch.testing.assert_close(feats.reshape(1, 6, 16), tokens[:, 3:])
    patch_features(model, images, layer=-1)
    assert len(model.blocks[1]._forward_hooks) == 0


def _axes_points(offset: float = 5.0, scale: float = 1.0) -> torch.Tensor:
    """(+-3, 0, 0), (0, +-2, 0), (0, 0, +-1) around ``offset``: variances 18 : 8 : 2 along the
    axes, so the components are e1, e2, e3 and the ratios 18/28, 8/28, 2/28."""
    pts = torch.tensor([[3., 0, 0], [-3, 0, 0], [0, 2, 0], [0, -2, 0], [0, 0, 1], [0, 0, -1]])
    return (pts * scale + offset).reshape(1, 2, 3, 3)


def test_principal_components_by_hand_and_svd_flip_signs():
    mean, comps, ratio = principal_components(_axes_points(), 3)  # num == channels is allowed
    torch.testing.assert_close(mean, torch.full((3, ), 5.0))
    torch.testing.assert_close(comps, torch.eye(3))
    torch.testing.assert_close(ratio, torch.tensor([18., 8., 2.]) / 28)
    # a line along (-3, 4) / 5: the largest entry (0.8) is positive
    t = torch.tensor([-2., -1., 0., 1., 2.])[:, None]
    _, line, _ = principal_components(t * torch.tensor([[-0.6, 0.8]]), 1)
    torch.testing.assert_close(line, torch.tensor([[-0.6, 0.8]]))
    with pytest.raises(ValueError, match='samples'):
        principal_components(torch.randn(1, 4), 1)  # one sample has no variance
    with pytest.raises(ValueError, match='samples'):
        principal_components(torch.randn(10, 2), 3)


def test_principal_components_equal_sklearn_components_with_their_signs():
    from sklearn.decomposition import PCA
    gen = torch.Generator().manual_seed(3)
    feats = torch.randn(40, 6, generator=gen) @ torch.randn(6, 6, generator=gen)
    _, comps, _ = principal_components(feats, 3)
    ref = PCA(n_components=3, svd_solver='full').fit(feats.double().numpy())
    np.testing.assert_allclose(comps.numpy(), ref.components_, atol=1e-5)


@pytest.mark.parametrize('scale', [1.0, 1e-3])
def test_pca_rgb_per_component_ranges_and_clipping_by_hand(scale: float):
    """Colours (x + 3) / 6, (y + 2) / 4, (z + 1) / 2 of the centred point; the others are
    clipped to [0, 1] (also when every feature is a thousand times smaller)."""
    ref = _axes_points(offset=5 * scale, scale=scale)
    rgb, others, _ = pca_rgb(ref, [(torch.tensor([[6., -1, 0.5]]) + 5) * scale,
                                   (torch.tensor([[-6., 0, 0]]) + 5) * scale])
    torch.testing.assert_close(rgb[0, 0, 0], torch.tensor([1.0, 0.5, 0.5]))
    torch.testing.assert_close(rgb[0, 1, 0], torch.tensor([0.5, 0.0, 0.5]))
    torch.testing.assert_close(rgb[0, 1, 1], torch.tensor([0.5, 0.5, 1.0]))
    torch.testing.assert_close(rgb[0, 1, 2], torch.tensor([0.5, 0.5, 0.0]))
    assert len(others) == 2
    torch.testing.assert_close(others[0][0], torch.tensor([1.0, 0.25, 0.75]))
    torch.testing.assert_close(others[1][0], torch.tensor([0.0, 0.5, 0.5]))


# ----------------------------------------------------------------------------- teacher_student
def test_compare_refuses_other_patch_sizes_and_depths():
    teacher = _tiny_vit()
    with pytest.raises(ValueError, match='patch size'):
        compare_teacher_student(teacher, _tiny_vit('elu', patch_size=16),
                                torch.randn(1, 3, 32, 32))
    deeper = VisionTransformer(dict(TINY, num_layers=3), attn_cfg='elu', img_size=32,
                               patch_size=8).eval()
    with pytest.raises(ValueError, match='blocks'):
        compare_teacher_student(teacher, deeper, torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize('layer', [2, -3])
def test_compare_refuses_a_layer_out_of_range(layer: int):
    """FINDING (fails on the code before the fix): ``layer=-3`` of a 2-block model became
    block -1 and ended in a bare ``KeyError: -1``; like :func:`patch_features`, an
    IndexError names the layer."""
    with pytest.raises(IndexError, match='out of range'):
        compare_teacher_student(_tiny_vit(), _tiny_vit('elu'), torch.randn(1, 3, 32, 32),
                                layer=layer)


def test_compare_runs_a_training_teacher_in_eval_mode_and_gaps_its_tokens():
    """A teacher with dropout left in training mode gives the eval-mode maps; the cosine gap
    is 1 - cos of the two models' final patch tokens (numpy)."""
    torch.manual_seed(0)
    teacher = _tiny_vit(drop_rate=0.5)
    student = _tiny_vit('elu')
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        t_tok = teacher.forward_tokens(images)[0][:, 1:].numpy()
        s_tok = student.forward_tokens(images)[0][:, 1:].numpy()
    cos = (t_tok * s_tok).sum(-1) / (np.linalg.norm(t_tok, axis=-1) *
                                     np.linalg.norm(s_tok, axis=-1))
    cmp = compare_teacher_student(teacher.train(), student, images, layer=0)
    assert teacher.training
    np.testing.assert_allclose(cmp.feature_cosine_gap.reshape(2, 16).numpy(), 1 - cos,
                               atol=1e-5)
    assert cmp.feature_cosine_gap.max() > 1e-3
    again = compare_teacher_student(teacher.eval(), student, images, layer=0)
    torch.testing.assert_close(cmp.teacher_pca, again.teacher_pca)
    torch.testing.assert_close(cmp.teacher_attention, again.teacher_attention)


def test_feature_cosine_gap_of_small_vectors_and_other_shapes():
    a = torch.tensor([[1e-3, 0.0], [2e-4, 0.0]])
    b = torch.tensor([[1e-3, 1e-3], [-1e-4, 0.0]])
    torch.testing.assert_close(feature_cosine_gap(a, b), torch.tensor([1 - 0.5**0.5, 2.0]))
    with pytest.raises(ValueError, match='differ in shape'):
        feature_cosine_gap(torch.ones(2, 3), torch.ones(1, 3))


# ----------------------------------------------------------------------------- figures
def _hand_comparison() -> TeacherStudentComparison:
    """Two images on a 2 x 3 grid: row 0 non-negative maps (teacher min 0.1, student max
    0.7), row 1 a signed student map (-0.3) and a teacher map with an exact 0."""
    t = torch.tensor([[[0.1, 0.2, 0.3], [0.2, 0.1, 0.1]], [[0.0, 0.5, 0.1], [0.1, 0.2, 0.1]]])
    s = torch.tensor([[[0.2, 0.7, 0.1], [0.2, 0.2, 0.2]], [[0.6, -0.3, 0.1], [0.2, 0.3, 0.1]]])
    d = s - t
    gap = torch.tensor([[[0.1, 0.2, 0.0], [0.0, 0.1, 0.2]], [[0.6, 0.3, 0.0], [0.0, 0.3, 0.0]]])
    rgb_t = torch.linspace(0, 1, 36).reshape(2, 2, 3, 3)
    return TeacherStudentComparison(
        query=(1, 2), layer=3, teacher_attention=t, student_attention=s,
        attention_difference=d, attention_tv=0.5 * d.abs().flatten(1).sum(1),
        teacher_pca=rgb_t, student_pca=1 - rgb_t,
        explained_variance=torch.tensor([0.5, 0.25, 0.1]), feature_cosine_gap=gap)


def _saved_figure(monkeypatch, tmp_path: Path, cmp: TeacherStudentComparison,
                  captions: List[str]):
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib.figure import Figure
    saved = {}
    original = Figure.savefig

    def savefig(fig, *args, **kwargs):
        saved['fig'] = fig
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, 'savefig', savefig)
    images = [np.full((8, 12, 3), 40 * i, np.uint8) for i in range(2)]
    path = tmp_path / 'a' / 'b' / 'cmp.png'  # folders are created
    assert save_teacher_student_figure(str(path), images, captions, cmp, 4, 'T') == str(path)
    assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    fig = saved['fig']
    return fig, [fig.axes[r * 7:(r + 1) * 7] for r in range(2)]


def test_figure_colour_ranges_by_hand(monkeypatch, tmp_path):
    fig, rows = _saved_figure(monkeypatch, tmp_path, _hand_comparison(), ['cat', 'cup'])
    # row 0: both maps >= 0: inferno from the smaller minimum (0.1) to the larger max (0.7)
    for c in (1, 2):
        over = rows[0][c].get_images()[1]
        assert over.get_cmap().name == 'inferno'
        np.testing.assert_allclose(over.get_clim(), (0.1, 0.7), rtol=1e-6)
    # row 1: the student map is signed (-0.3): coolwarm, symmetric around 0 at max |.| = 0.6
    for c in (1, 2):
        over = rows[1][c].get_images()[1]
        assert over.get_cmap().name == 'coolwarm'
        np.testing.assert_allclose(over.get_clim(), (-0.6, 0.6), rtol=1e-6)
    # difference: +-max |s - t| per row: 0.5 (row 0), 0.8 (row 1: -0.3 - 0.5)
    for r, bound in ((0, 0.5), (1, 0.8)):
        np.testing.assert_allclose(rows[r][3].get_images()[0].get_clim(), (-bound, bound),
                                   rtol=1e-6)
    # cosine gap: one 0..0.6 scale for both rows (row 0 alone reaches only 0.2)
    for r in range(2):
        np.testing.assert_allclose(rows[r][6].get_images()[0].get_clim(), (0.0, 0.6),
                                   rtol=1e-6)
    # PCA panels: the teacher's and the student's own colours
    cmp = _hand_comparison()
    for r in range(2):
        np.testing.assert_allclose(rows[r][4].get_images()[0].get_array(),
                                   cmp.teacher_pca[r].numpy())
        np.testing.assert_allclose(rows[r][5].get_images()[0].get_array(),
                                   cmp.student_pca[r].numpy())


def test_figure_non_negative_maps_with_a_zero_stay_inferno(monkeypatch, tmp_path):
    """A teacher map with an exact 0 and a non-negative student map: 0..max on inferno."""
    cmp = _hand_comparison()
    cmp.student_attention = cmp.student_attention.clamp_min(0.0)
    cmp.attention_difference = cmp.student_attention - cmp.teacher_attention
    _, rows = _saved_figure(monkeypatch, tmp_path, cmp, ['cat', 'cup'])
    over = rows[1][1].get_images()[1]
    assert over.get_cmap().name == 'inferno'
    np.testing.assert_allclose(over.get_clim(), (0.0, 0.6), rtol=1e-6)


def test_figure_labels_marker_and_title(monkeypatch, tmp_path):
    cmp = _hand_comparison()
    fig, rows = _saved_figure(monkeypatch, tmp_path, cmp, ['cat', 'cup'])
    assert [ax.get_title() for ax in rows[0]] == list(COMPARISON_COLUMNS)
    assert [row[0].get_ylabel() for row in rows] == ['cat', 'cup']
    # TV: row 0 |d| = .1 .5 .2 0 .1 .1 -> 0.5; row 1 |d| = .6 .8 0 .1 .1 0 -> 0.8
    assert [row[3].get_xlabel() for row in rows] == ['TV distance 0.500', 'TV distance 0.800']
    # mean gap: row 0 0.6 / 6 = 0.1; row 1 1.2 / 6 = 0.2
    assert [row[6].get_xlabel() for row in rows] == ['mean 0.1', 'mean 0.2']
    for row in rows:
        for c in range(7):
            marks = row[c].patches
            if c < 3:  # query (row 1, col 2) of 4-pixel patches: x = 8, y = 4
                assert len(marks) == 1
                assert marks[0].get_xy() == (8, 4)
                assert (marks[0].get_width(), marks[0].get_height()) == (4, 4)
            else:
                assert len(marks) == 0
    title = fig.get_suptitle()
    assert title.startswith('T\nattention of the query patch in block 3')
    assert title.endswith('(explained variance 50%, 25%, 10%)')


def test_figure_refuses_a_caption_count_that_differs():
    cmp = _hand_comparison()
    images = [np.zeros((8, 12, 3), np.uint8)] * 2
    with pytest.raises(ValueError, match='must agree'):
        save_teacher_student_figure('unused.png', images, ['one'], cmp, 4)


# ----------------------------------------------------------------------------- photos
def _pil_bicubic(crop: np.ndarray, size_hw: Tuple[int, int]) -> np.ndarray:
    from PIL import Image
    return np.array(Image.fromarray(np.ascontiguousarray(crop)).resize(
        (size_hw[1], size_hw[0]), Image.BICUBIC))


def test_photo_crops_by_hand_then_bicubic():
    from skimage import data
    # astronaut 512 x 512 to 32 x 64: the middle 256 rows
    astronaut = data.astronaut()
    np.testing.assert_array_equal(photos.load_photo('astronaut', (32, 64)),
                                  _pil_bicubic(astronaut[128:384], (32, 64)))
    # chelsea 300 x 451 to 70 x 30: 300 * 3 / 7 = 128.6 -> 129 columns from (451 - 129) // 2
    chelsea = data.chelsea()
    assert chelsea.shape[:2] == (300, 451)
    np.testing.assert_array_equal(photos.load_photo('chelsea', (70, 30)),
                                  _pil_bicubic(chelsea[:, 161:290], (70, 30)))


def test_motorcycle_is_the_left_view():
    from skimage import data
    left, right = data.stereo_motorcycle()[:2]
    h, w = left.shape[:2]
    side = min(h, w)
    top, lft = (h - side) // 2, (w - side) // 2
    expected = _pil_bicubic(left[top:top + side, lft:lft + side], (24, 24))
    np.testing.assert_array_equal(photos.load_photo('motorcycle', (24, 24)), expected)
    assert not np.array_equal(
        expected, _pil_bicubic(right[top:top + side, lft:lft + side], (24, 24)))


def test_one_pixel_crop_and_bad_sizes_and_images(monkeypatch):
    """A 100 x 1 column to a 1 x 1000 strip: a 1-row crop at row (100 - 1) // 2 = 49."""
    column = np.repeat(np.arange(100, dtype=np.uint8)[:, None, None], 3, axis=2)
    strip = photos.center_crop_resize(column, (1, 1000))
    assert strip.shape == (1, 1000, 3) and (strip == 49).all()
    with pytest.raises(ValueError, match='positive'):
        photos.center_crop_resize(column, (0, 8))
    from skimage import data
    monkeypatch.setattr(photos, '_load_skimage_photo', lambda name: data.camera())  # grey
    with pytest.raises(ValueError, match='expected'):
        photos.load_photo('astronaut', (8, 8))


# ----------------------------------------------------------------------------- compared_models
def test_compared_pairs_by_their_papers():
    """ViT-L/14 (DINOv2): 24 blocks of width 1024 with a 24-block Adventurer-L; the smoke pair
    is a 2-layer DeiT-style ViT of width 64 with 16-pixel patches."""
    large = COMPARED_MODELS['vit-l14']
    with torch.device('meta'):
        adventurer = large.build_adventurer(large.patch_size)
        smoke = SMOKE_MODEL.build_vit('elu')
        smoke_adv = SMOKE_MODEL.build_adventurer(SMOKE_MODEL.patch_size)
    assert large.vit_dims == dict(embed_dims=1024, num_layers=24, num_heads=16,
                                  mlp_hidden_dims=4096)
    assert adventurer.embed_dims == 1024 and len(adventurer.layers) == 24
    assert smoke.patch_size == SMOKE_MODEL.patch_size == 16 and len(smoke.blocks) == 2
    assert smoke_adv.embed_dims == 64 and len(smoke_adv.layers) == 2
    assert smoke_adv.patch_size == 16
    # the pair's mixer options (d_state 16, headdim 32) reach the Adventurer's blocks
    mixer = smoke_adv.layers[1].mixer
    assert (mixer.d_state, mixer.headdim) == (16, 32)


# ----------------------------------------------------------------------------- digits_distill
def test_cosine_schedule_factors_by_hand():
    """total 10, warm-up 2: 1/2, 2/2, then 1e-3 + (1 - 1e-3) (1 + cos(pi p)) / 2 with
    p = (step - 2) / 8."""
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = digits_distill.cosine_schedule(opt, total=10, warmup=2)
    lrs = []
    for _ in range(11):
        lrs.append(opt.param_groups[0]['lr'])
        opt.step()
        sched.step()
    expected = [0.5, 1.0] + [1e-3 + (1 - 1e-3) * 0.5 * (1 + math.cos(math.pi * (s - 2) / 8))
                             for s in range(2, 11)]
    np.testing.assert_allclose(lrs, expected, rtol=1e-12)
    assert lrs[6] == pytest.approx(0.5005) and lrs[10] == pytest.approx(1e-3)


def test_normalise_digits_to_minus_one_one():
    x = torch.tensor([0, 51, 255], dtype=torch.uint8)
    torch.testing.assert_close(digits_distill.normalise_digits(x),
                               torch.tensor([-1.0, -0.6, 1.0]))


def test_load_digits_are_bilinear_upsampled_sklearn_digits_in_a_fixed_order():
    """Each image is one of sklearn's digits, values / 16 upsampled 8 -> 32 with half-pixel
    centres (the bilinear matrix written here), x 255; the labels follow the images."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    src = (np.arange(32) + 0.5) / 4 - 0.5
    src = np.clip(src, 0, None)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, 7)
    w = src - lo
    up = np.zeros((32, 8))
    up[np.arange(32), lo] += 1 - w
    up[np.arange(32), hi] += w
    ref = np.einsum('ij,njk,lk->nil', up, digits.images / 16.0, up) * 255  # (1797, 32, 32)
    x, y = digits_distill.load_digits()
    assert x.shape == (1797, 3, 32, 32) and x.dtype == torch.uint8
    assert torch.equal(x[:, 0], x[:, 2])
    got = x[:, 0].double().reshape(1797, -1).numpy()
    flat = ref.reshape(1797, -1)
    # nearest sklearn image of each returned one (|a - b|^2 = a.a - 2 a.b + b.b)
    dist = (got**2).sum(1)[:, None] - 2 * got @ flat.T + (flat**2).sum(1)[None]
    match = dist.argmin(1)
    assert len(set(match.tolist())) == 1797  # a permutation
    assert np.abs(got - flat[match]).max() <= 0.5 + 1e-3  # rounded, not another scale
    np.testing.assert_array_equal(y.numpy(), digits.target[match])
    assert (match[:20] != np.arange(20)).any()  # shuffled
    x2, _ = digits_distill.load_digits()
    assert torch.equal(x, x2)


class _Constant(nn.Module):
    """A backbone returning fixed 'features' (one-hot of the wanted class), recording its
    mode at each call."""

    def __init__(self, classes: torch.Tensor) -> None:
        super().__init__()
        self.classes = classes
        self.modes: List[bool] = []

    def forward(self, x: torch.Tensor):
        self.modes.append(self.training)
        return (nn.functional.one_hot(self.classes, 10).float(), )


def test_digits_accuracy_in_eval_mode_then_back_to_train():
    backbone = _Constant(torch.tensor([1, 2, 3, 4]))
    acc = digits_distill.digits_accuracy(backbone, nn.Identity(),
                                         torch.zeros(4, 3, 32, 32, dtype=torch.uint8),
                                         torch.tensor([1, 2, 0, 0]))
    assert acc == 0.5  # 2 of 4
    assert backbone.modes == [False] and backbone.training


def test_prepare_digits_split_and_frozen_teacher(monkeypatch):
    """Teacher training stubbed out (its head predicts 0): the 1400 / 397 split, the
    student's images are the first of the teacher's, the teacher is frozen and its score is
    the share of zeros among the held-out labels."""
    def untrained(x, y, epochs, batch_size):
        torch.manual_seed(0)
        backbone = VisionTransformer(attn_cfg='softmax', **digits_distill.DIGITS_VIT)
        head = nn.Linear(32, 10)
        with torch.no_grad():
            head.weight.zero_()
            head.bias.copy_(torch.arange(10, 0, -1).float())
        return backbone.eval(), head

    monkeypatch.setattr(digits_distill, 'train_digits_teacher', untrained)
    data = digits_distill.prepare_digits(student_train=50, teacher_epochs=1)
    x, y = digits_distill.load_digits()
    assert torch.equal(data['x_train'], x[:1400]) and torch.equal(data['x_test'], x[1400:])
    assert torch.equal(data['x_student'], x[:50]) and torch.equal(data['y_student'], y[:50])
    assert not any(p.requires_grad for p in data['teacher'].parameters())
    assert data['teacher_score'] == pytest.approx(100 * float((y[1400:] == 0).float().mean()))
    assert len(data['teacher_attn_mean_square']) == 4


def test_run_digits_batches_are_epochs_and_the_loss_gets_student_then_teacher():
    """16 distinct images, batches of 8: steps 0 and 1 see every image once; the loss gets
    the student's attention outputs (with gradients) first and the teacher's second."""
    torch.manual_seed(0)
    teacher = VisionTransformer(attn_cfg='softmax', **digits_distill.DIGITS_VIT).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    x = torch.arange(16, dtype=torch.uint8)[:, None, None, None].expand(16, 3, 32, 32) * 10
    data = dict(teacher=teacher, x_student=x.clone(), y_student=torch.arange(16) % 10,
                x_test=x[:4].clone(), y_test=torch.arange(4))
    calls = []

    class SpyLoss(nn.Module):

        def forward(self, student, teacher_out):
            calls.append((student, teacher_out))
            return sum(s.float().pow(2).mean() for s in student) * 0.0

    seen = []
    handle = teacher.register_forward_pre_hook(lambda m, args: seen.append(args[0][:, 0, 0, 0]))
    try:
        out = digits_distill.run_digits(data, 'random', SpyLoss(), 0, 'elu', 3, 8)
    finally:
        handle.remove()
    assert out['loss'] == 'SpyLoss' and len(calls) == 3
    # teacher forwards: 3 distillation steps, then attention_output_stats on x_test
    first_two = torch.cat(seen[:2])
    values = sorted(round((float(v) * 127.5 + 127.5) / 10) for v in first_two)
    assert values == list(range(16))
    student, teacher_out = calls[0]
    assert all(s.requires_grad for s in student)
    assert not any(t.requires_grad for t in teacher_out)


# ----------------------------------------------------------------------------- kernel_checks
def test_check_inputs_shapes_and_ranges():
    q, k, v = kernel_checks.make_qkv(5, 7, 2, 4, 3, torch.float32, torch.device('cpu'))
    assert (q.shape, k.shape, v.shape) == ((1, 2, 5, 4), (1, 2, 7, 4), (1, 2, 7, 3))
    x, dt, A, B, C, D = kernel_checks.make_ssd_inputs(2, 64, 8, 4, 2, 16, torch.float32,
                                                      torch.device('cpu'))
    assert x.shape == (2, 64, 8, 4) and dt.shape == (2, 64, 8) and A.shape == (8, )
    assert B.shape == C.shape == (2, 64, 2, 16) and D.shape == (8, )
    assert (dt > 0).all() and (A <= -1).all() and (A >= -16).all()
    A16 = kernel_checks.make_ssd_inputs(1, 8, 16, 4, 1, 16, torch.float32,
                                        torch.device('cpu'))[2].detach()
    assert (A16 <= -1).all() and (A16 >= -16).all()  # -(u * 15 + 1) for u in [0, 1)
    # B, C ~ N(0, 1 / d_state): 2048 samples each, std within 10 % of 0.25
    for t in (B, C):
        assert abs(float(t.detach().std()) - 0.25) < 0.025


def test_inline_trained_check_feeds_shifted_and_scaled_inputs():
    """``'inline trained'``: the kernel gets q, k = 10 (q0 + 1), 10 (k0 + 1) and v = v0 + 0.5
    of the seeded inputs, and the reference uses the scale d ** -0.5 (d = 8, e = 6)."""
    from mmlinvit.ops.linear_attention import inline_attention_torch
    got = {}

    def kernel(q, k, v, scale):
        got.update(q=q.detach(), k=k.detach(), v=v.detach(), scale=scale)
        return inline_attention_torch(q, k, v, 8**-0.5)

    fake = SimpleNamespace(inline_attention_triton=kernel)
    row = kernel_checks.check_linear_attention(fake, 'x', 9, 11, 2, 8, 6, torch.float32,
                                               'inline trained', torch.device('cpu'))
    q0, k0, v0 = kernel_checks.make_qkv(9, 11, 2, 8, 6, torch.float32, torch.device('cpu'))
    torch.testing.assert_close(got['q'], (q0.detach() + 1) * 10)
    torch.testing.assert_close(got['k'], (k0.detach() + 1) * 10)
    torch.testing.assert_close(got['v'], v0.detach() + 0.5)
    assert got['scale'] == 8**-0.5
    assert row['ok'] == 'PASS' and row['out'] < 1e-5


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_kernel_checks_compare_16_bit_kernels_with_an_fp32_reference(monkeypatch, dtype):
    """The documented contract: the kernel gets the 16-bit inputs, the PyTorch reference the
    same rounded values in fp32 (a 16-bit reference would share the kernel's rounding)."""
    import mmlinvit.ops.linear_attention as la_ops
    import mmlinvit.ops.ssd as ssd_ops
    seen: Dict[str, List[torch.dtype]] = {'kernel': [], 'reference': []}
    la_reference, ssd_reference = la_ops.linear_attention_torch, ssd_ops.ssd_scan_torch

    def spied_la(q, k, v, mode):
        seen['reference'].append(q.dtype)
        return la_reference(q, k, v, mode)

    def spied_ssd(*leaves, chunk_size):
        seen['reference'].append(leaves[0].dtype)
        return ssd_reference(*leaves, chunk_size=chunk_size)

    def la_kernel(q, k, v, mode):
        seen['kernel'].append(q.dtype)
        return la_reference(q.float(), k.float(), v.float(), mode).to(q.dtype)

    def ssd_kernel(*leaves, chunk_size):
        seen['kernel'].append(leaves[0].dtype)
        return ssd_reference(*[t.float() for t in leaves], chunk_size=chunk_size).to(
            leaves[0].dtype)

    monkeypatch.setattr(la_ops, 'linear_attention_torch', spied_la)
    monkeypatch.setattr(ssd_ops, 'ssd_scan_torch', spied_ssd)
    cpu = torch.device('cpu')
    kernel_checks.check_linear_attention(SimpleNamespace(linear_attention_triton=la_kernel), 'x',
                                         9, 11, 2, 8, 6, dtype, 'elu', cpu)
    kernel_checks.check_ssd(SimpleNamespace(ssd_scan_triton=ssd_kernel), 'x', 1, 16, 2, 4, 1, 8,
                            8, dtype, cpu)
    assert seen == {'kernel': [dtype, dtype], 'reference': [torch.float32, torch.float32]}


# ----------------------------------------------------------------------------- sass_report
#: cuobjdump --dump-resource-usage of one sm_90 kernel (format of Triton's bundled cuobjdump).
USAGE = """
Resource usage:
 Common:
  GLOBAL:0
 Function _state_kernel:
  REG:168 STACK:24 SHARED:0 LOCAL:0 CONSTANT[0]:568 TEXTURE:0 SURFACE:0 SAMPLER:0
"""

#: Real lines of cuobjdump --dump-sass of the sm_90 kernels (plus the header), one per kind.
SASS = """
\tcode for sm_90a
\t\tFunction : _state_kernel
\t.headerflags\t@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                    /* 0x00000a00ff017b82 */
                                                                             /* 0x000e220000000800 */
        /*0020*/                   LDC.64 R4, c[0x0][0x210] ;                /* 0x00008400ff047b82 */
        /*0140*/                   LDG.E.128 R8, desc[UR16][R36.64+0x3010] ;                           /* 0x0030101024087981 */
        /*00e0*/              @!P0 LDG.E.128 R8, desc[UR4][R4.64] ;          /* 0x0000000404088981 */
        /*0d60*/                   LDG.E.64 R90, desc[UR12][R2.64] ;                                   /* 0x0000000c025a7981 */
        /*03b0*/                   LDG.E R4, desc[UR8][R4.64] ;                   /* 0x0000000804047981 */
        /*03c0*/                   LDG.E.U16 R6, desc[UR8][R4.64] ;                   /* 0x0000000804067981 */
        /*0790*/                   LDGSTS.E.BYPASS.128 [R114+0x8000], desc[UR28][R12.64], P3 ;  /* 0x080000000c727fae */
        /*0f00*/              @!P2 LDGSTS.E [R98+0xc000], desc[UR30][R12.64], !P5 ;            /* 0x0c0000000c62afae */
        /*07d0*/                   LDGDEPBAR ;                                                  /* 0x00000000000079af */
        /*0800*/                   UTMALDG.2D [UR8], [UR14] ;                                   /* 0x00000008000075b4 */
        /*0cc0*/                   LDS.128 R16, [R114+0x8000] ;                                 /* 0x0080000072107984 */
        /*2610*/                   LDS.U16 R28, [R45+UR5+0x8000] ;                            /* 0x008000052d1c7984 */
        /*27d0*/                   LDSM.16.M88.4 R56, [R5+UR10+0x4000] ;                               /* 0x0040000a0538783b */
        /*2470*/                   STS.128 [R113], R16 ;                                        /* 0x0000001071007388 */
        /*2680*/                   STS [R111+UR38+0x240], R122 ;                                /* 0x0002407a6f007988 */
        /*31c0*/                   WARPGROUP.ARRIVE ;                                           /* 0x00000000000079c5 */
        /*31d0*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR40], R24 ;          /* 0x04e0002838187df0 */
        /*3250*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;                              /* 0x00008000000079c5 */
        /*0c80*/                   STL [R1+0x20], R89 ;                                                /* 0x0000205901007387 */
        /*0e70*/                   STL.64 [R1], R90 ;                                                  /* 0x0000005a01007387 */
        /*3db0*/                   LDL.LU R90, [R1+0x6c] ;                                             /* 0x00006c00015a7983 */
        /*28c0*/                   LDL.LU.64 R22, [R1+0x128] ;                                 /* 0x0001280001167983 */
        /*41a0*/                   STG.E.128 desc[UR28][R48.64], R16 ;                          /* 0x0000001030007986 */
        /*4440*/                   STG.E desc[UR28][R2.64], R5 ;                                /* 0x0000000502007986 */
        /*0160*/                   EXIT ;                                    /* 0x000000000000794d */
        /*0170*/                   BRA 0x170;                                /* 0xfffffffc00fc7947 */
\t\t..........
"""


def _fake_cuobjdump(usage: str, sass: str):
    def run(*args: str) -> str:
        assert Path(args[-1]).read_bytes() == b'cubin bytes'
        return {'--dump-resource-usage': usage, '--dump-sass': sass}[args[0]]
    return run


def test_sass_summary_of_real_lines(monkeypatch, tmp_path):
    """Counts by family and width; ``LDGDEPBAR``, ``LDSM`` (ldmatrix) and ``UTMALDG`` (TMA)
    are not 32-bit LDG / LDS loads (FINDING: the first two were counted as such)."""
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    monkeypatch.setattr(sass_report, '_cuobjdump', _fake_cuobjdump(USAGE, SASS))
    summary = sass_report.sass_summary(b'cubin bytes')
    assert summary['regs'] == 168 and summary['stack'] == 24
    assert summary['counts'] == {
        'LDG.128': 2, 'LDG.64': 1, 'LDG': 1, 'LDG.U16': 1, 'LDGSTS.128': 1, 'LDGSTS': 1,
        'LDS.128': 1, 'LDS.U16': 1, 'STS.128': 1, 'STS': 1, 'HGMMA': 1, 'STL': 1,
        'STL.64': 1, 'LDL': 1, 'LDL.64': 1, 'STG.128': 1, 'STG': 1}
    assert list(summary['counts']) == sorted(summary['counts'])


def test_sass_summary_without_resource_lines(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    monkeypatch.setattr(sass_report, '_cuobjdump', _fake_cuobjdump('\nResource usage:\n', ''))
    assert sass_report.sass_summary(b'cubin bytes') == dict(regs=None, stack=None, counts={})


def test_compile_launches_keeps_one_row_per_distinct_kernel(monkeypatch):
    """Launches of one kernel compiled to the same code give one row; the same kernel with
    other code (another specialisation) keeps its own row, in launch order."""
    summaries: Dict[bytes, dict] = {
        b'a1': dict(regs=32, stack=0, counts={'LDG.128': 2}),
        b'a2': dict(regs=32, stack=0, counts={'LDG.128': 2, 'LDG.U16': 1}),
        b'b': dict(regs=40, stack=8, counts={})}
    monkeypatch.setattr(sass_report, 'sass_summary', lambda cubin: dict(summaries[cubin]))

    def kernel(name: str) -> SimpleNamespace:
        def warmup(*args, grid, **kwargs):
            return SimpleNamespace(asm={'cubin': kwargs['code']})
        return SimpleNamespace(__name__=name, warmup=warmup)

    a, b = kernel('_a'), kernel('_b')
    launches = [(a, (1, ), (), dict(code=b'a1')), (b, (2, ), (), dict(code=b'b')),
                (a, (3, ), (), dict(code=b'a1')), (a, (1, ), (), dict(code=b'a2'))]
    rows = sass_report.compile_launches(launches)
    assert rows == [dict(kernel='_a', **summaries[b'a1']), dict(kernel='_b', **summaries[b'b']),
                    dict(kernel='_a', **summaries[b'a2'])]


@pytest.mark.skipif(not _nvidia_tools(), reason="needs triton's NVIDIA back end")
def test_recorded_launches_target_and_restore_triton():
    import triton.runtime.jit as jit
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    import mmlinvit.ops.linear_attention.triton_kernel as la_kernel
    import mmlinvit.ops.ssd.triton_kernel as ssd_kernel
    before = (jit.JITFunction.__getitem__, driver._active, la_kernel.check_kernel_device,
              ssd_kernel.check_kernel_device)
    with sass_report.recorded_launches(arch=89) as launches:
        assert driver.active.get_current_target() == GPUTarget('cuda', 89, 32)
        assert launches == []
    after = (jit.JITFunction.__getitem__, driver._active, la_kernel.check_kernel_device,
             ssd_kernel.check_kernel_device)
    assert all(x is y for x, y in zip(before, after))
