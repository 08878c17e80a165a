"""Real photographs (scikit-image), feature PCA and the teacher-vs-student comparison.

References are independent of the code under test: scikit-learn's PCA, cosine similarity
written with numpy, and the attention rows recomputed from q and k.
"""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from mmlinvit.analysis import (COMPARISON_COLUMNS, REAL_PHOTOS, capture_attention_inputs,
                               center_crop_resize, compare_teacher_student, feature_cosine_gap,
                               load_photo, patch_features, pca_rgb, principal_components,
                               save_teacher_student_figure)
from mmlinvit.backbones import VisionTransformer

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32)
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'


def _tiny_vit(operator: str) -> VisionTransformer:
    return VisionTransformer(TINY, attn_cfg=operator, img_size=32, patch_size=8).eval()


@pytest.mark.parametrize('name', sorted(REAL_PHOTOS))
def test_real_photos_load_offline_at_any_size(name):
    photo = load_photo(name, (48, 80))
    assert photo.shape == (48, 80, 3) and photo.dtype == np.uint8
    # a natural photograph: many distinct colours and a wide intensity range
    assert len(np.unique(photo.reshape(-1, 3), axis=0)) > 500
    assert photo.std() > 20


def test_unknown_photo_names_the_choices():
    with pytest.raises(KeyError, match='astronaut.*chelsea'):
        load_photo('lena', (32, 32))


def test_center_crop_keeps_the_middle():
    image = np.zeros((4, 8, 3), np.uint8)
    image[:, 2:6] = 200  # the centred 4 x 4 square
    out = center_crop_resize(image, (4, 4))
    assert out.shape == (4, 4, 3) and (out == 200).all()
    tall = np.zeros((8, 2, 3), np.uint8)
    tall[3:5] = 100
    np.testing.assert_array_equal(center_crop_resize(tall, (2, 2)), np.full((2, 2, 3), 100))


def test_principal_components_match_sklearn():
    from sklearn.decomposition import PCA
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(2, 5, 6, 12, generator=gen) @ torch.randn(12, 12, generator=gen)
    mean, comps, ratio = principal_components(feats, 3)
    x = feats.reshape(-1, 12).double().numpy()
    ref = PCA(n_components=3, svd_solver='full').fit(x)
    np.testing.assert_allclose(ratio.numpy(), ref.explained_variance_ratio_, rtol=1e-4)
    ours = (feats.reshape(-1, 12) - mean) @ comps.t()
    theirs = ref.transform(x)
    for k in range(3):  # equal up to the sign of each component
        sign = np.sign(np.dot(ours[:, k].numpy(), theirs[:, k]))
        np.testing.assert_allclose(ours[:, k].numpy() * sign, theirs[:, k], atol=1e-4)


def test_pca_rgb_shares_the_reference_basis_and_range():
    gen = torch.Generator().manual_seed(1)
    teacher = torch.randn(1, 4, 4, 8, generator=gen)
    t_rgb, (same, shifted), _ = pca_rgb(teacher, [teacher.clone(), teacher + 100.0])
    assert t_rgb.shape == (1, 4, 4, 3)
    assert t_rgb.min() >= 0 and t_rgb.max() <= 1
    # each component spans exactly 0..1 on the reference
    flat = t_rgb.reshape(-1, 3)
    torch.testing.assert_close(flat.min(0).values, torch.zeros(3))
    torch.testing.assert_close(flat.max(0).values, torch.ones(3))
    torch.testing.assert_close(same, t_rgb)
    assert not torch.allclose(shifted, t_rgb)  # other features are not re-fitted
    with pytest.raises(ValueError, match='width 5'):
        pca_rgb(teacher, [torch.randn(1, 4, 4, 5)])


def test_feature_cosine_gap_formula():
    a = torch.tensor([[1.0, 0.0], [1.0, 1.0], [2.0, 0.0]])
    b = torch.tensor([[0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    a_np, b_np = a.numpy(), b.numpy()
    expected = 1 - (a_np * b_np).sum(1) / (np.linalg.norm(a_np, axis=1) *
                                           np.linalg.norm(b_np, axis=1))
    np.testing.assert_allclose(feature_cosine_gap(a, b).numpy(), expected, atol=1e-6)


def test_patch_features_are_the_final_normalised_patch_tokens():
    model = _tiny_vit('softmax')
    images = torch.randn(2, 3, 16, 24)
    feats = patch_features(model, images)
    assert feats.shape == (2, 2, 3, 16)
    with torch.no_grad():
        tokens, _ = model.forward_tokens(images)
    torch.testing.assert_close(feats.reshape(2, 6, 16), tokens[:, model.num_prefix_tokens:])
    # layer=i: block i's output, captured here with a bare forward hook
    captured = {}
    handle = model.blocks[0].register_forward_hook(
        lambda mod, args, out: captured.__setitem__('out', out))
    with torch.no_grad():
        model(images)
    handle.remove()
    block0 = patch_features(model, images, layer=0)
    torch.testing.assert_close(block0.reshape(2, 6, 16),
                               captured['out'][:, model.num_prefix_tokens:])
    with pytest.raises(IndexError, match='out of range'):
        patch_features(model, images, layer=2)


def test_compare_identical_models_shows_no_difference():
    teacher = _tiny_vit('softmax')
    student = _tiny_vit('softmax')
    student.load_state_dict(teacher.state_dict())
    cmp = compare_teacher_student(teacher, student, torch.randn(2, 3, 32, 32))
    assert cmp.query == (2, 2) and cmp.layer == 1
    assert cmp.attention_difference.abs().max() == 0 and cmp.attention_tv.abs().max() == 0
    assert cmp.feature_cosine_gap.abs().max() < 1e-5
    torch.testing.assert_close(cmp.student_pca, cmp.teacher_pca)


def test_compare_softmax_vs_elu_matches_hand_computed_rows():
    teacher = _tiny_vit('softmax')
    student = _tiny_vit('elu')
    student.load_state_dict(teacher.state_dict())
    images = torch.randn(1, 3, 32, 32)
    cmp = compare_teacher_student(teacher, student, images, query=(1, 3), layer=0)
    x, _, prefix = capture_attention_inputs(teacher, images, [0])[0]
    attn = teacher.blocks[0].attn
    q, k, _ = attn.split_qkv(x)
    q_idx = prefix + 1 * 4 + 3
    soft = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)[0, :, q_idx, prefix:].mean(0)
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    lin = fq @ fk.transpose(-2, -1)
    lin = (lin / lin.sum(-1, keepdim=True))[0, :, q_idx, prefix:].mean(0)
    torch.testing.assert_close(cmp.teacher_attention[0].flatten(), soft)
    torch.testing.assert_close(cmp.student_attention[0].flatten(), lin)
    torch.testing.assert_close(cmp.attention_tv[0], 0.5 * (lin - soft).abs().sum())
    assert cmp.feature_cosine_gap.min() >= -1e-6 and cmp.attention_tv[0] > 0


def test_teacher_student_figure_on_photos(tmp_path):
    teacher = _tiny_vit('softmax')
    student = _tiny_vit('elu')
    names = ['astronaut', 'coffee']
    photos = [load_photo(n, (32, 48)) for n in names]
    images = torch.stack([torch.from_numpy(p).permute(2, 0, 1).float() / 255 for p in photos])
    cmp = compare_teacher_student(teacher, student, images)
    out = save_teacher_student_figure(str(tmp_path / 'cmp.png'), photos, names, cmp, 8)
    assert Path(out).read_bytes()[:8] == PNG_SIGNATURE
    assert len(COMPARISON_COLUMNS) == 7
    with pytest.raises(ValueError, match='must agree'):
        save_teacher_student_figure(str(tmp_path / 'x.png'), photos[:1], names, cmp, 8)


def test_visualize_attention_on_real_photos(tmp_path):
    spec = importlib.util.spec_from_file_location(
        'visualize_attention', ROOT / 'tools' / 'analysis' / 'visualize_attention.py')
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out, cmp_out = tmp_path / 'maps.png', tmp_path / 'compare.png'
    tool.main(['--model', 'tiny', '--img-size', '48x64', '--image', 'chelsea', 'rocket',
               '--students', 'elu', '--no-adventurer', '--out', str(out),
               '--compare-out', str(cmp_out)])
    assert out.read_bytes()[:8] == PNG_SIGNATURE and cmp_out.read_bytes()[:8] == PNG_SIGNATURE
    with pytest.raises(FileNotFoundError, match='neither an existing file'):
        tool.main(['--model', 'tiny', '--image', 'no_such_photo', '--out', str(out)])
