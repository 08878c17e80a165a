"""Weight-transfer behaviour that survived mutation round 10 (session 16).

Each test pins one behaviour of :mod:`mmlinvit.transfer` against an independent computation
(a hand formula in float64, a literal list, numpy's ``SeedSequence``) rather than the code
path under test:

* guards: options given together with a built strategy, a teacher with other heads, a
  teacher state dict recording another MLP activation, a student final norm the teacher
  lacks, a base strategy that copies QKV, a strategy that overwrites copied tensors, Impulse
  students with register tokens, even windows, grids that do not match the tokens;
* the position grid recorded in a teacher state dict (``pos_embed_grid``);
* Mimetic: the value / projection weights (``v_alpha``, ``v_beta``), the 64-bit
  ``SeedSequence`` seeding of each layer;
* Impulse: the row-major shift list, the peak fraction, the position tokens LN(P), the
  reported fit loss (cross-entropy over in-grid queries at ``1/sqrt(d)``), the Adam update,
  the cache key, ``use_cache=False``, and the per-head shift draws (seeded, every shift
  reachable).
"""
import math
from typing import List, Tuple

import numpy as np
import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.layers.pos_embed import resample_pos_grid
from mmlinvit.transfer import (MLPCopy, TransferStructureError, build_transfer_strategy,
                               impulse_peak_fraction, transfer_weights)
from mmlinvit.transfer.impulse import (ImpulseInit, fit_impulse_bank, impulse_shifts,
                                       load_or_fit_impulse_bank)
from mmlinvit.transfer.mimetic import layer_generator

TINY = dict(embed_dims=64, num_layers=2, num_heads=2, mlp_hidden_dims=128)
COMMON = dict(img_size=32, patch_size=8)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors: one intra-op thread."""


def _randomized(model: VisionTransformer, seed: int = 5) -> VisionTransformer:
    """Every weight drawn at random, so a copy is visible."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen))
    return model


def _impulse_student(arch: dict = TINY, **kwargs) -> VisionTransformer:
    """A student Impulse accepts: no prefix tokens, sin-cos positions, average pooling."""
    cfg = dict(attn_cfg='softmax', with_cls_token=False, pos_embed_type='sincos',
               out_type='avg_featmap', **COMMON)
    cfg.update(kwargs)
    return VisionTransformer(arch, **cfg)


def _sincos_fp64(grid: Tuple[int, int], dims: int) -> torch.Tensor:
    """MoCo-v3 2-D sin-cos embedding written out in float64: [sin, cos](row), [sin, cos](col)."""
    quarter = dims // 4
    omega = [1.0 / 10000.0**(k / quarter) for k in range(quarter)]
    rows = []
    for r in range(grid[0]):
        for c in range(grid[1]):
            rows.append([math.sin(r * o) for o in omega] + [math.cos(r * o) for o in omega] +
                        [math.sin(c * o) for o in omega] + [math.cos(c * o) for o in omega])
    return torch.tensor(rows, dtype=torch.float64)


def _layer_norm_fp64(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Parameter-free LayerNorm over the last dim (biased variance), float64."""
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean)**2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps)


def _targets(grid: Tuple[int, int], shift: Tuple[int, int]) -> List[int]:
    """Key index of each query under ``shift`` (raster order), -1 outside the grid."""
    h, w = grid
    out = []
    for r in range(h):
        for c in range(w):
            rr, cc = r + shift[0], c + shift[1]
            out.append(rr * w + cc if 0 <= rr < h and 0 <= cc < w else -1)
    return out


def _ce_loss_fp64(tokens: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor,
                  grid: Tuple[int, int], shifts, head_dims: int) -> torch.Tensor:
    """Mean over (shift, in-grid query) of -log softmax(t Wq (t Wk)^T / sqrt(d))[target]."""
    terms = []
    for s, shift in enumerate(shifts):
        logits = (tokens @ wq[s]) @ (tokens @ wk[s]).T / math.sqrt(head_dims)
        log_prob = logits.log_softmax(-1)
        for q, key in enumerate(_targets(grid, shift)):
            if key >= 0:
                terms.append(-log_prob[q, key])
    return torch.stack(terms).mean()


# ---------------------------------------------------------------------- guards
def test_options_with_an_already_built_strategy_are_refused():
    """``include_layer_scale=False`` next to a built MLPCopy would be silently dropped."""
    built = MLPCopy()
    assert build_transfer_strategy(built) is built
    with pytest.raises(TypeError, match='include_layer_scale'):
        build_transfer_strategy(built, include_layer_scale=False)


def test_a_teacher_module_with_other_heads_is_refused():
    """Same width and depth, 2 vs 4 heads: every tensor has the same shape, yet the copied
    QKV would be split into other heads."""
    teacher = VisionTransformer(TINY, **COMMON)
    student = VisionTransformer(dict(TINY, num_heads=4), attn_cfg='elu', **COMMON)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    with pytest.raises(ValueError, match='num_heads=2'):
        transfer_weights(student, teacher, 'full_copy')
    for key, value in student.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_a_teacher_state_dict_recording_another_mlp_activation_is_refused():
    """The state dict's MLP activation record is read, not only a module's ``act``."""
    teacher = VisionTransformer(TINY, act='gelu', **COMMON)
    state = teacher.state_dict()
    student = VisionTransformer(TINY, attn_cfg='elu', act='quick_gelu', **COMMON)
    with pytest.raises(ValueError, match="act='gelu'"):
        transfer_weights(student, state, 'mlp_copy')


def test_a_student_final_norm_the_teacher_lacks_is_refused_under_full_copy():
    """An MAE fine-tuned teacher without final norm: FullCopy would leave the student's norm
    at its init (weight 1, bias 0), another function than the teacher's."""
    teacher = VisionTransformer(TINY, final_norm=False, **COMMON)
    student = VisionTransformer(TINY, final_norm=True, **COMMON)
    with pytest.raises(TransferStructureError, match=r'norm\.weight.*final_norm=False'):
        transfer_weights(student, teacher, 'full_copy')


def test_a_student_pre_norm_the_teacher_lacks_is_refused_under_full_copy():
    """A DeiT teacher into a DeiT student built with ``pre_norm=True`` (nothing else differs):
    the student's pre-norm would stay at its init in front of the copied blocks."""
    teacher = VisionTransformer(TINY, **COMMON)
    student = VisionTransformer(TINY, pre_norm=True, **COMMON)
    with pytest.raises(TransferStructureError, match=r'pre_norm\.weight.*pre_norm=False'):
        transfer_weights(student, teacher, 'full_copy')


@pytest.mark.parametrize('strategy', ['random', 'copy', 'mimetic'])
def test_a_student_layer_scale_no_strategy_copies_is_allowed(strategy):
    """Only tensors the strategy would copy are refused: Random / Copy / Mimetic never copy
    LayerScale, so a DeiT-III student from a DeiT teacher keeps its own gammas."""
    teacher = _randomized(VisionTransformer(TINY, **COMMON))
    student = VisionTransformer(TINY, family='deit3', attn_cfg='elu', **COMMON)
    gammas = {k: v.clone() for k, v in student.state_dict().items() if k.endswith('gamma')}
    assert len(gammas) == 4
    report = transfer_weights(student, teacher, strategy, **(
        dict(seed=0) if strategy == 'mimetic' else {}))
    assert set(gammas) <= report.student_only
    for key, value in gammas.items():
        assert torch.equal(student.state_dict()[key], value), key


def test_structured_inits_refuse_a_base_that_copies_qkv():
    """Mimetic / Impulse write ``attn.qkv``; a ``copy`` base would be overwritten."""
    for strategy in ('mimetic', 'impulse'):
        with pytest.raises(ValueError, match="got base='copy'"):
            build_transfer_strategy(strategy, base='copy')


class _OverwritingMLPCopy(MLPCopy):
    """A faulty strategy: copies the MLP, then writes over a copied tensor."""

    name = 'overwriting_mlp_copy'

    def initialize(self, student, report):
        student.blocks[0].mlp.fc1.weight.zero_()
        return {'blocks.0.mlp.fc1.weight'}


def test_a_strategy_that_overwrites_copied_tensors_is_refused():
    teacher = _randomized(VisionTransformer(TINY, **COMMON))
    student = VisionTransformer(TINY, attn_cfg='elu', **COMMON)
    with pytest.raises(RuntimeError, match=r"overwrote copied tensors \['blocks.0.mlp.fc1"):
        transfer_weights(student, teacher, _OverwritingMLPCopy())


def test_impulse_refuses_register_tokens_without_class_token(tmp_path):
    """Register tokens are prefix tokens too: the fitted maps cover the patch grid only."""
    teacher = VisionTransformer(TINY, family='dinov2', num_reg_tokens=1, **COMMON)
    student = _impulse_student(family='dinov2', num_reg_tokens=1)
    assert student.num_prefix_tokens == 1 and not student.with_cls_token
    with pytest.raises(ValueError, match='prefix tokens.*register tokens: 1'):
        transfer_weights(student, teacher, 'impulse', cache_dir=str(tmp_path), steps=1)


def test_impulse_window_must_be_odd():
    with pytest.raises(ValueError, match='odd'):
        impulse_shifts(4)
    with pytest.raises(ValueError, match='odd'):
        ImpulseInit(window=2)


def test_fit_refuses_tokens_that_do_not_match_the_grid():
    tokens = torch.randn(16, 32)
    with pytest.raises(ValueError, match='16 position tokens do not match the 3x5 grid'):
        fit_impulse_bank(tokens, (3, 5), 8, [(0, 0)], steps=1, lr=0.0, seed=0)


# ---------------------------------------------------------------------- position grid
def test_a_state_dict_teacher_grid_record_is_resampled_not_copied_row_for_row():
    """A 2 x 8 teacher grid given as a state dict (its ``pos_embed_grid`` record says so)
    into a 4 x 4 student: the same number of rows, but resampled."""
    teacher = VisionTransformer(dict(TINY, embed_dims=32), img_size=(16, 64), patch_size=8)
    with torch.no_grad():
        teacher.pos_embed.normal_(generator=torch.Generator().manual_seed(2))
    state = teacher.state_dict()
    assert state['pos_embed_grid'].tolist() == [2, 8]
    student = VisionTransformer(dict(TINY, embed_dims=32), attn_cfg='elu', img_size=32,
                                patch_size=8)
    report = transfer_weights(student, state, 'full_copy')
    pos = teacher.pos_embed.detach()
    expected = torch.cat([pos[:, :1], resample_pos_grid(pos[:, 1:], (2, 8), (4, 4),
                                                        student.pos_interp)], dim=1)
    assert 'resampled' in report.adapted['pos_embed']
    assert not torch.equal(student.pos_embed.detach(), pos)
    torch.testing.assert_close(student.pos_embed.detach(), expected)


# ---------------------------------------------------------------------- Mimetic
def test_mimetic_value_projection_uses_v_alpha_noise_and_minus_v_beta_identity():
    """``W_v W_proj = v_alpha Z_v - v_beta I`` with ``Z_v ~ N(0, 1/C)``: with v_alpha 0.2 and
    v_beta 0.6 the diagonal averages -0.6 and the residual / v_alpha has variance 1/C."""
    arch = dict(embed_dims=128, num_layers=1, num_heads=2, mlp_hidden_dims=128)
    teacher = VisionTransformer(arch, **COMMON)
    student = VisionTransformer(arch, attn_cfg='elu', **COMMON)
    transfer_weights(student, teacher, 'mimetic', v_alpha=0.2, v_beta=0.6, seed=11)
    c = arch['embed_dims']
    attn = student.blocks[0].attn
    w_v = attn.qkv.weight.detach().double()[2 * c:]
    vo = w_v.T @ attn.proj.weight.detach().double().T  # x -> x W_v W_proj
    assert abs(torch.diagonal(vo).mean().item() + 0.6) < 0.01  # noise: 0.2 / C per entry
    residual = (vo + 0.6 * torch.eye(c, dtype=torch.float64)) / 0.2
    assert abs(residual.var().item() * c - 1.0) < 0.05  # 16k samples of N(0, 1/C)


def test_mimetic_query_key_uses_alpha_noise_plus_beta_identity():
    """One head (d = C, so the split is exact): ``W_q W_k^T = alpha Z + beta I`` with
    ``Z ~ N(0, 1/C)``; alpha 0.2, beta 1.0 tell the two weights apart."""
    arch = dict(embed_dims=128, num_layers=1, num_heads=1, mlp_hidden_dims=128)
    teacher = VisionTransformer(arch, **COMMON)
    student = VisionTransformer(arch, attn_cfg='elu', **COMMON)
    transfer_weights(student, teacher, 'mimetic', alpha=0.2, beta=1.0, seed=11)
    c = arch['embed_dims']
    w = student.blocks[0].attn.qkv.weight.detach().double()
    qk = w[:c].T @ w[c:2 * c]  # x -> (x W_q) (x W_k)^T
    assert abs(torch.diagonal(qk).mean().item() - 1.0) < 0.01
    residual = (qk - torch.eye(c, dtype=torch.float64)) / 0.2
    assert abs(residual.var().item() * c - 1.0) < 0.05


@pytest.mark.parametrize('seed,layer', [(5, 0), (5, 3), (2**40 + 5, 1), (-1, 0)])
def test_layer_generator_is_seeded_from_the_64_bit_seed_sequence(seed, layer):
    """Documented seeding: 64 bits of ``SeedSequence(seed mod 2**64, spawn_key=(layer,))``;
    seeds that differ above bit 31 are different seeds."""
    sequence = np.random.SeedSequence(seed % 2**64, spawn_key=(layer, ))
    expected = int(sequence.generate_state(1, np.uint64)[0])
    assert layer_generator(seed, layer).initial_seed() == expected


def test_seeds_equal_modulo_2_31_draw_different_mimetic_layers():
    a = torch.randn(4, generator=layer_generator(5, 0))
    b = torch.randn(4, generator=layer_generator(2**40 + 5, 0))
    assert not torch.equal(a, b)


# ---------------------------------------------------------------------- Impulse
def test_impulse_shifts_are_row_major():
    """The shift index drawn per head is a row-major index of the window."""
    assert impulse_shifts(3) == [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 0), (0, 1),
                                 (1, -1), (1, 0), (1, 1)]
    assert impulse_shifts(1) == [(0, 0)]
    assert len(impulse_shifts(5)) == 25 and impulse_shifts(5)[1] == (-2, -1)


def test_peak_fraction_counts_the_query_whose_target_is_key_zero():
    """Grid 2 x 2, shift (-1, 0): queries 2 and 3 target keys 0 and 1; query 2 peaks at 3."""
    attn = torch.zeros(4, 4)
    attn[:, 3] = 1.0  # every row peaks at key 3 ...
    attn[3] = torch.tensor([0.0, 1.0, 0.0, 0.0])  # ... except query 3, at its target 1
    assert impulse_peak_fraction(attn, (2, 2), (-1, 0)) == pytest.approx(0.5)
    attn[2] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert impulse_peak_fraction(attn, (2, 2), (-1, 0)) == pytest.approx(1.0)


@pytest.mark.parametrize('grid_size', [(32, 32), (16, 48)])
def test_impulse_position_tokens_are_the_layer_normed_sincos_grid(grid_size):
    """LN(P) over the student's (rows, cols) grid, written out in float64."""
    student = _impulse_student(img_size=grid_size)
    grid = tuple(student.pos_grid)
    assert grid == (grid_size[0] // 8, grid_size[1] // 8)
    tokens = ImpulseInit(use_cache=False).position_tokens(student)
    expected = _layer_norm_fp64(_sincos_fp64(grid, TINY['embed_dims']),
                                student.blocks[0].norm1.eps)
    torch.testing.assert_close(tokens.double(), expected, atol=1e-4, rtol=1e-4)


def test_impulse_fit_reports_cross_entropy_over_in_grid_queries_at_one_over_sqrt_d():
    """With lr 0 the weights stay at their init and the reported loss is the cross-entropy
    of softmax(t Wq Wk^T t^T / sqrt(d)) at the targets of in-grid queries only."""
    grid, shifts, d = (3, 4), [(0, 0), (-1, 1), (1, 0), (0, -1)], 8
    tokens = _layer_norm_fp64(_sincos_fp64(grid, 32), 1e-6).float()
    bank = fit_impulse_bank(tokens, grid, d, shifts, steps=1, lr=0.0, seed=4)
    expected = _ce_loss_fp64(tokens.double(), bank['wq'].double(), bank['wk'].double(), grid,
                             shifts, d)
    assert bank['loss'] == pytest.approx(expected.item(), rel=1e-5)


def test_impulse_fit_is_plain_adam():
    """Three steps of the fit equal textbook Adam (betas 0.9 / 0.999, eps 1e-8, bias
    corrected) on the cross-entropy loss, run here in float64 from the same init."""
    grid, shifts, d, lr = (3, 3), [(0, 1), (1, -1)], 4, 0.05
    tokens = _layer_norm_fp64(_sincos_fp64(grid, 16), 1e-6).float()
    init = fit_impulse_bank(tokens, grid, d, shifts, steps=1, lr=0.0, seed=9)
    fitted = fit_impulse_bank(tokens, grid, d, shifts, steps=3, lr=lr, seed=9)
    params = [init['wq'].double().requires_grad_(True), init['wk'].double().requires_grad_(True)]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t in range(1, 4):
        loss = _ce_loss_fp64(tokens.double(), params[0], params[1], grid, shifts, d)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(params, grads)):
                m[i] = 0.9 * m[i] + 0.1 * g
                v[i] = 0.999 * v[i] + 0.001 * g * g
                m_hat, v_hat = m[i] / (1 - 0.9**t), v[i] / (1 - 0.999**t)
                p -= lr * m_hat / (v_hat.sqrt() + 1e-8)
    torch.testing.assert_close(fitted['wq'].double(), params[0].detach(), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(fitted['wk'].double(), params[1].detach(), atol=2e-5, rtol=1e-4)
    assert (fitted['wq'] - init['wq']).abs().max() > 0.05  # it did move


@pytest.mark.parametrize('change', ['head_dims', 'lr', 'seed', 'tokens'])
def test_every_fit_input_is_part_of_the_impulse_cache_key(tmp_path, change):
    """A bank fitted for other inputs is never loaded from the cache."""
    grid = (3, 3)
    tokens = _layer_norm_fp64(_sincos_fp64(grid, 16), 1e-6).float()
    args = dict(tokens=tokens, grid=grid, head_dims=4, window=3, steps=2, lr=1e-2, seed=0)
    first = load_or_fit_impulse_bank(cache_dir=str(tmp_path), **args)
    assert first['cache_hit'] is False
    again = load_or_fit_impulse_bank(cache_dir=str(tmp_path), **args)
    assert again['cache_hit'] is True
    other = dict(args)
    other[change] = dict(head_dims=8, lr=2e-2, seed=1, tokens=tokens.flip(0))[change]
    bank = load_or_fit_impulse_bank(cache_dir=str(tmp_path), **other)
    assert bank['cache_hit'] is False and bank['cache_file'] != first['cache_file']
    if change == 'head_dims':
        assert bank['wq'].shape == (9, 16, 8)


def test_use_cache_false_writes_and_reads_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr('mmlinvit.transfer.impulse.DEFAULT_IMPULSE_CACHE', str(tmp_path / 'd'))
    strategy = ImpulseInit(use_cache=False, cache_dir=str(tmp_path / 'c'), steps=1, seed=0)
    assert strategy.options()['cache_dir'] is None
    teacher = VisionTransformer(TINY, **COMMON)
    report = transfer_weights(_impulse_student(), teacher, strategy)
    assert report.details['cache_file'] is None and report.details['cache_hit'] is False
    assert list(tmp_path.iterdir()) == []


def _drawn_shifts(seed: int, heads: int = 16, layers: int = 2) -> List[List[List[int]]]:
    arch = dict(embed_dims=64, num_layers=layers, num_heads=heads, mlp_hidden_dims=64)
    teacher = VisionTransformer(arch, **COMMON)
    report = transfer_weights(_impulse_student(arch), teacher, 'impulse', seed=seed, steps=1,
                              use_cache=False, share_across_layers=False)
    return report.details['shifts']


def test_impulse_head_shifts_follow_the_seed_and_reach_every_shift():
    """The per-head shifts are drawn from the strategy seed (other seeds, other shifts) and
    uniformly over all 9 shifts of the window (64 draws per seed here)."""
    first, second = _drawn_shifts(0), _drawn_shifts(1)
    assert first != second
    assert first == _drawn_shifts(0)
    drawn = {tuple(s) for layers in (first, second) for layer in layers for s in layer}
    assert drawn == set(impulse_shifts(3))
