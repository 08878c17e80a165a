"""The ``'mimetic'`` strategy against the public Mimetic implementation, fed the same noise.

No code by Trockman & Kolter (2023) is public.  The reference is the public implementation
that ``../shared/reference/algorithms.md`` lists: osiriszjq/structured_init (Zheng, Li & Lucey
2024; Mimetic is their baseline), ``get_ortho_like`` and the ``'mimetic0.7_0.7'`` branch of its
``VisionTransformer._init_weights`` (its timm fork).  It is NOT the paper authors' code.  The
``mimetic`` entry of ``tests/fixtures/hedgehog_mimetic_official_reference.pt`` (written by
``tests/fixtures/make_hedgehog_mimetic_references.py``) holds that model's ``qkv`` / ``proj``
weights for C = 32, 2 heads, depth 2, built with its noise draws replaced by the exact matrices
mmlinvit drew for ``seed=7`` when it was written (stored as ``z``; layer i from
``manual_seed(7 + i)``, the per-layer seeding before the audit s11 F2 fix), so the two can be
compared weight by weight: the student below is initialised with those per-layer generators
(``mmlinvit.transfer.mimetic.layer_generator`` patched; what is compared is the algorithm given
the noise, not the seeding, which ``test_mimetic_seeds.py`` covers).

Agreement (asserted): the same per-head q.k targets ``0.7 Z_h + 0.7 I`` (one fresh C x C target
per head), the same split (SVD, ``U sqrt(S)`` / ``V sqrt(S)`` truncated to the head's d
directions, i.e. the best rank-d product), the same orientation of q and k rows, the same
defaults (0.7, 0.7, 0.4, 0.4), the same identity signs (+ for q.k, - for v / proj) and the same
noise variance 1 / C.

Differences (strict xfails; mmlinvit realises the products as ``algorithms.md`` records the
paper's formulas, ``W_q W_k^T ~ alpha Z + beta I``, ``W_v W_proj ~ alpha Z - beta I``; the public
code does not for v / proj):

* v / proj: structured_init writes ``qkv.weight[2C:] = L`` and ``proj.weight = R`` (``L = U
  sqrt(S)``, ``R = sqrt(S) V^T`` of the target ``A = 0.4 Z - 0.4 I``), so x -> x L^T R^T: the
  product is ``(R L)^T = -0.4 I + 0.4 (S^-1/2 U^T Z U S^1/2)^T``, similar to A (same trace, same
  eigenvalues) but not A; its off-diagonal noise has variance ~0.48 / C instead of 1 / C, and it
  even depends on the SVD's arbitrary signs (flipping a singular pair flips a row and a column
  of it: here, mmlinvit's fp32 SVD flips one pair of layer 1, and the official layout built
  from mmlinvit's factors differs from the stored official product by 0.25).  mmlinvit writes
  the transposes (``qkv.weight[2C:] = L^T``, ``proj.weight = R^T``): x -> x L R = x A, exactly
  the paper's ``W_v W_proj = alpha Z - beta I`` (sign-invariant).
* noise distribution: structured_init's default ``dist='uniform'`` draws U(-sqrt(3/C),
  sqrt(3/C)) (variance 1 / C, kurtosis 1.8); mmlinvit draws N(0, 1 / C) (kurtosis 3), as its
  ``dist='normal'`` option does (the paper's method text was not available to settle which
  distribution the paper uses; only the variance is asserted equal).

Not compared: biases (structured_init leaves PyTorch's default ``nn.Linear`` init in
``qkv.bias`` / ``proj.bias``, its timm init being skipped for ``'mimetic'``; mmlinvit keeps the
student's zeros) and the draw order / generator (numpy's global state there; here the same
matrices are fed to both).
"""

from unittest import mock

import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.transfer import mimetic, mimetic_targets, transfer_weights
from official_golden import load_generator, load_golden

TOL = 1e-5
#: Factors (not products) come from mmlinvit's fp32 SVD: see
#: :func:`test_qk_factors_equal_official_up_to_svd_signs`.
FACTOR_TOL = 1e-3


GEN = load_generator('make_hedgehog_mimetic_references')
C, HEADS, D, DEPTH = GEN.EMBED_DIMS, GEN.NUM_HEADS, GEN.HEAD_DIMS, GEN.MIM_DEPTH
ARCH = dict(embed_dims=C, num_layers=DEPTH, num_heads=HEADS, mlp_hidden_dims=2 * C)
COMMON = dict(img_size=GEN.MIM_IMG, patch_size=GEN.MIM_PATCH)


@pytest.fixture(scope='module')
def golden() -> dict:
    return load_golden('hedgehog_mimetic_official_reference.pt')['mimetic']


def golden_layer_generator(seed: int, layer: int) -> torch.Generator:
    """The per-layer generators the golden noise ``z`` was drawn from."""
    return torch.Generator().manual_seed(seed + layer)


@pytest.fixture(scope='module')
def student(golden) -> VisionTransformer:
    """mmlinvit's Mimetic init with its defaults (alpha, beta, v_alpha, v_beta), the seed of
    the golden file and the golden file's per-layer generators."""
    torch.manual_seed(0)
    teacher = VisionTransformer(ARCH, **COMMON)
    model = VisionTransformer(ARCH, attn_cfg='elu', **COMMON)
    with mock.patch.object(mimetic, 'layer_generator', golden_layer_generator):
        report = transfer_weights(model, teacher, 'mimetic', seed=golden['config']['seed'])
    cfg = golden['config']
    assert report.options['alpha'] == cfg['alpha'] and report.options['beta'] == cfg['beta']
    assert report.options['v_alpha'] == cfg['v_alpha']
    assert report.options['v_beta'] == cfg['v_beta']
    return model


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors: one intra-op thread is fastest on the shared cores."""


def rel_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """Max abs error, relative to the reference's largest magnitude when that exceeds 1."""
    assert got.shape == expected.shape, (got.shape, expected.shape)
    scale = max(1.0, expected.abs().max().item())
    return (got.double() - expected.double()).abs().max().item() / scale


# Weights in PyTorch's (out, in) layout; row-vector maps x -> x W with W = weight.T.
def qk_factors(qkv_weight: torch.Tensor, h: int):
    """(W_q^h, W_k^h), each C x d, of head ``h``."""
    w = qkv_weight.detach().double()
    return w[h * D:(h + 1) * D].T, w[C + h * D:C + (h + 1) * D].T


def vo_product(qkv_weight: torch.Tensor, proj_weight: torch.Tensor) -> torch.Tensor:
    """W_v W_proj (C x C): x -> x W_v W_proj."""
    return qkv_weight.detach().double()[2 * C:].T @ proj_weight.detach().double().T


def ours(student: VisionTransformer, i: int):
    attn = student.blocks[i].attn
    return attn.qkv.weight, attn.proj.weight


def official(golden: dict, i: int):
    block = golden['blocks'][i]
    return block['qkv_weight'], block['proj_weight']


def column_signs(got: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Per-column signs s with got[:, j] ~ s_j expected[:, j] (SVD sign freedom)."""
    return torch.sign((got * expected).sum(0))


# ---------------------------------------------------------------------- inputs
def test_golden_noise_is_what_mmlinvit_draws(golden):
    """The matrices fed to the official code are mmlinvit's draws (:func:`mimetic_targets`)
    from the generators the student is initialised with, so the comparisons below use the same
    Z on both sides."""
    cfg = golden['config']
    eye = torch.eye(C, dtype=torch.float64)
    for i in range(DEPTH):
        gen = golden_layer_generator(cfg['seed'], i)
        qk, vo = mimetic_targets(C, HEADS, cfg['alpha'], cfg['beta'], cfg['v_alpha'],
                                 cfg['v_beta'], gen)
        for h in range(HEADS):
            torch.testing.assert_close((qk[h] - cfg['beta'] * eye) / cfg['alpha'],
                                       golden['z'][i, h], rtol=0, atol=1e-12)
        torch.testing.assert_close((vo + cfg['v_beta'] * eye) / cfg['v_alpha'],
                                   golden['z'][i, HEADS], rtol=0, atol=1e-12)


# ---------------------------------------------------------------------- q.k
def test_qk_products_equal_official(golden, student):
    """W_q^h W_k^h^T (the best rank-d approximation of 0.7 Z_h + 0.7 I) = the official one,
    every layer and head."""
    errors = {}
    for i in range(DEPTH):
        for h in range(HEADS):
            q, k = qk_factors(ours(student, i)[0], h)
            q_off, k_off = qk_factors(official(golden, i)[0], h)
            errors[(i, h)] = rel_error(q @ k.T, q_off @ k_off.T)
    assert max(errors.values()) <= TOL, errors


def test_qk_factors_equal_official_up_to_svd_signs(golden, student):
    """W_q^h = U_d sqrt(S_d) and W_k^h = V_d sqrt(S_d) column by column (same orientation: q
    rows are the left factor), each column pair up to one common sign."""
    errors = {}
    for i in range(DEPTH):
        for h in range(HEADS):
            q, k = qk_factors(ours(student, i)[0], h)
            q_off, k_off = qk_factors(official(golden, i)[0], h)
            signs = column_signs(q, q_off)
            errors[(i, h)] = max(rel_error(q * signs, q_off), rel_error(k * signs, k_off))
    # mmlinvit splits in fp32: singular vectors accurate to ~eps * ||A|| / gap, and the
    # smallest gap between singular values is 2.5e-3 here (errors up to ~1.5e-4 measured).  A
    # wrong split (sign pairs, orientation, S instead of sqrt(S)) errs by O(0.1) or more.
    assert golden['min_singular_gap'] > 1e-3
    assert max(errors.values()) <= FACTOR_TOL, errors


# ---------------------------------------------------------------------- v / proj
@pytest.mark.xfail(strict=True, reason='structured_init writes qkv.weight[2C:] = U sqrt(S) and '
                   'proj.weight = sqrt(S) V^T, so its W_v W_proj is (R L)^T, similar to but not '
                   'the target 0.4 Z - 0.4 I; mmlinvit writes the transposes and realises the '
                   "paper's target exactly")
def test_vo_product_equals_official(golden, student):
    errors = [rel_error(vo_product(*ours(student, i)), vo_product(*official(golden, i)))
              for i in range(DEPTH)]
    assert max(errors) <= TOL, errors


def test_vo_official_is_the_transposed_split(golden, student):
    """What the difference is, exactly: the official v rows and proj weight are mmlinvit's
    transposed (up to SVD signs); mmlinvit's product is the target, the official one is similar
    to it (equal traces of powers: same eigenvalues, same identity term)."""
    cfg = golden['config']
    eye = torch.eye(C, dtype=torch.float64)
    for i in range(DEPTH):
        qkv, proj = (w.detach().double() for w in ours(student, i))
        qkv_off, proj_off = (w.double() for w in official(golden, i))
        signs = column_signs(qkv[2 * C:].T, qkv_off[2 * C:])
        assert rel_error(qkv[2 * C:].T * signs, qkv_off[2 * C:]) <= FACTOR_TOL
        assert rel_error(signs[:, None] * proj.T, proj_off) <= FACTOR_TOL
        target = cfg['v_alpha'] * golden['z'][i, HEADS] - cfg['v_beta'] * eye
        mine, theirs = vo_product(qkv, proj), vo_product(qkv_off, proj_off)
        assert rel_error(mine, target) <= TOL
        assert rel_error(theirs, target) > 0.1
        for power in (1, 2, 3):
            a = torch.linalg.matrix_power(mine, power).trace()
            b = torch.linalg.matrix_power(theirs, power).trace()
            assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (power, a, b)


def noise_of(student: VisionTransformer, golden: dict) -> torch.Tensor:
    """(W_v W_proj + v_beta I) / v_alpha of every mmlinvit layer: its Z_v, flattened."""
    cfg = golden['config']
    eye = torch.eye(C, dtype=torch.float64)
    return torch.stack([(vo_product(*ours(student, i)) + cfg['v_beta'] * eye) / cfg['v_alpha']
                        for i in range(DEPTH)])


def test_noise_variance_is_one_over_c_as_official(golden, student):
    """Both draw noise of variance 1 / C: the official bound is sqrt(3 / C) (uniform), and
    mmlinvit's recovered Z_v has C * var ~ 1 (2 x 1024 samples: 3% standard error)."""
    assert abs(golden['noise_bound'] - (3.0 / C)**0.5) < 1e-12
    assert abs(golden['v_noise_stats']['noise_var_times_c'] - 1.0) < 0.05
    z = noise_of(student, golden)
    assert abs(z.var().item() * C - 1.0) < 0.15
    assert abs(z.mean().item()) < 0.1 / C**0.5


@pytest.mark.xfail(strict=True, reason="structured_init's default noise is uniform "
                   "(kurtosis 1.8; its dist='normal' option is Gaussian); mmlinvit draws "
                   'N(0, 1/C) (kurtosis 3)')
def test_noise_distribution_matches_official(golden, student):
    z = noise_of(student, golden)
    kurtosis = ((z - z.mean())**4).mean() / z.var()**2
    assert abs(kurtosis.item() - golden['v_noise_stats']['noise_kurtosis']) < 0.5


@pytest.mark.xfail(strict=True, reason="through structured_init's transposed v / proj split, "
                   '(W_v W_proj + 0.4 I) / 0.4 has off-diagonal variance ~0.48 / C; '
                   "mmlinvit's is Z_v itself (1 / C)")
def test_vo_noise_variance_matches_official(golden, student):
    z = noise_of(student, golden)
    off = z[:, ~torch.eye(C, dtype=torch.bool)]
    assert abs(off.var().item() * C - golden['v_noise_stats']['offdiag_var_times_c']) < 0.15
