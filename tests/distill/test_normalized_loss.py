"""NormalizedAttentionOutputMSELoss against the formula written here, and its scale invariance."""
import numpy as np
import pytest
import torch

from mmlinvit.distill.losses import AttentionOutputMSELoss, NormalizedAttentionOutputMSELoss


def _records(seed, blocks=3, shape=(2, 5, 8), scales=(0.03, 1.0, 7.0)):
    g = torch.Generator().manual_seed(seed)
    teacher = [scales[i % len(scales)] * torch.randn(*shape, generator=g) for i in range(blocks)]
    student = [t + 0.5 * t.std() * torch.randn(*shape, generator=g) for t in teacher]
    return student, teacher


def _formula(student, teacher, weight, eps, reduction='mean'):
    """lambda * reduce_i [ sum((s-t)^2)/n / (sum(t^2)/n + eps) ] in float64 numpy."""
    per_block = []
    for s, t in zip(student, teacher):
        s, t = s.double().numpy(), t.double().numpy()
        per_block.append(((s - t)**2).sum() / s.size / ((t**2).sum() / t.size + eps))
    return weight * (np.mean(per_block) if reduction == 'mean' else np.sum(per_block))


@pytest.mark.parametrize('reduction', ['mean', 'sum'])
def test_matches_the_formula(reduction):
    student, teacher = _records(0)
    loss = NormalizedAttentionOutputMSELoss(loss_weight=2.5, block_reduction=reduction, eps=1e-6)
    value = loss(student, teacher).item()
    assert value == pytest.approx(_formula(student, teacher, 2.5, 1e-6, reduction), rel=1e-5)


@pytest.mark.parametrize('c', [0.1, 30.0])
def test_scale_invariant_while_raw_mse_scales_by_c_squared(c):
    # teacher mean squares >= 0.09 * 0.01: eps = 1e-8 shifts the value by < 1e-5 (relative)
    student, teacher = _records(1, scales=(0.3, 1.0, 7.0))
    norm = NormalizedAttentionOutputMSELoss(loss_weight=1.0)
    raw = AttentionOutputMSELoss(loss_weight=1.0)
    scaled_s, scaled_t = [c * s for s in student], [c * t for t in teacher]
    assert norm(scaled_s, scaled_t).item() == pytest.approx(norm(student, teacher).item(),
                                                            rel=3e-5)
    assert raw(scaled_s, scaled_t).item() == pytest.approx(c**2 * raw(student, teacher).item(),
                                                           rel=1e-5)


def test_predicting_zeros_costs_one_per_block():
    _, teacher = _records(2)
    zeros = [torch.zeros_like(t) for t in teacher]
    loss = NormalizedAttentionOutputMSELoss(loss_weight=1.0, block_reduction='sum')
    assert loss(zeros, teacher).item() == pytest.approx(len(teacher), rel=1e-4)


def test_gradient_treats_the_denominator_as_a_constant():
    student, teacher = _records(3, blocks=1)
    s = student[0].clone().requires_grad_(True)
    t = teacher[0].clone().requires_grad_(True)
    NormalizedAttentionOutputMSELoss(loss_weight=3.0, eps=1e-8)(s, t).backward()
    denom = t.detach().pow(2).mean() + 1e-8
    expected = 3.0 * 2 * (s.detach() - t.detach()) / s.numel() / denom
    torch.testing.assert_close(s.grad, expected, rtol=1e-5, atol=1e-9)
    assert t.grad is None or torch.count_nonzero(t.grad) == 0


def test_patch_tokens_only_drops_special_tokens_before_normalising():
    g = torch.Generator().manual_seed(4)
    teacher = torch.randn(2, 1 + 6, 4, generator=g)  # class token first
    teacher[:, 0] *= 100.0  # a huge class token must not enter the denominator
    student = torch.randn(2, 6, 4, generator=g)  # no class token (MHLA / TTT students)
    loss = NormalizedAttentionOutputMSELoss(loss_weight=1.0, patch_tokens_only=True)
    value = loss(student, teacher, (0, 0), (1, 0)).item()
    assert value == pytest.approx(_formula([student], [teacher[:, 1:]], 1.0, 1e-8), rel=1e-5)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match='block_reduction'):
        NormalizedAttentionOutputMSELoss(block_reduction='max')
    with pytest.raises(ValueError, match='eps'):
        NormalizedAttentionOutputMSELoss(eps=0.0)
    with pytest.raises(ValueError, match='patch_tokens_only=True'):
        NormalizedAttentionOutputMSELoss()(torch.zeros(1, 5, 4), torch.zeros(1, 6, 4))


def test_registered_under_the_mmlinvit_scope():
    from mmlinvit.registry import MODELS
    loss = MODELS.build(dict(type='mmlinvit.NormalizedAttentionOutputMSELoss', loss_weight=1.0))
    assert isinstance(loss, NormalizedAttentionOutputMSELoss)


def test_sweep_tool_smoke(tmp_path):
    """tools/analysis/sweep_distill_weight.py --quick on both tasks (a few steps each)."""
    import importlib.util
    import json
    import os.path as osp
    pytest.importorskip('sklearn.datasets')
    repo = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    spec = importlib.util.spec_from_file_location(
        'sweep_distill_weight_tool', osp.join(repo, 'tools/analysis/sweep_distill_weight.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    work = str(tmp_path / 'sweep')
    tool.main(['--quick', '--tasks', 'digits', '--seeds', '0', '--inits', 'random', 'full_copy',
               '--raw', '50', '--normalized', '1', '--work-dir', work])
    tables = tool.main(['--quick', '--tasks', 'scenes', '--seeds', '0', '--inits', 'full_copy',
                        '--raw', '--normalized', '1', '--no-baseline', '--work-dir', work])
    records = [json.loads(line) for line in open(osp.join(work, 'results.jsonl'))]
    digits = [r for r in records if r['task'] == 'digits']
    assert len(digits) == 2 * 3  # 2 inits x (w/o, raw 50, norm 1)
    assert {r['loss'] for r in digits} == {None, 'AttentionOutputMSELoss',
                                           'NormalizedAttentionOutputMSELoss'}
    assert {r['copied'] > 0 for r in digits if r['init'] == 'full_copy'} == {True}
    assert {r['copied'] for r in digits if r['init'] == 'random'} == {0}
    scenes = [r for r in records if r['task'] == 'scenes']
    assert len(scenes) == 1 and scenes[0]['loss'] == 'NormalizedAttentionOutputMSELoss'
    assert 0 <= scenes[0]['score'] <= 100
    assert '| FullCopy |' in tables and 'norm 1' in tables
    # the student sees the 64 x 64 crops: the DistillationModel gets the segmentor's data
    # preprocessor, not the config's top-level one (size 512 x 512, inherited from the base)
    info = json.load(open(osp.join(work, 'scenes', 'teacher.json')))
    cfg = tool.scenes_config(info, 'random', ('raw', 50.0), 0, 'relu', 2, 4,
                             str(tmp_path / 'cfg'))
    assert tuple(cfg.model.data_preprocessor['size']) == (64, 64)
    assert tuple(cfg.data_preprocessor['size']) == (512, 512)
    # a rerun finds every run in results.jsonl and trains nothing
    tool.main(['--quick', '--tasks', 'scenes', '--seeds', '0', '--inits', 'full_copy', '--raw',
               '--normalized', '1', '--no-baseline', '--work-dir', work])
    assert len(open(osp.join(work, 'results.jsonl')).readlines()) == len(records)
