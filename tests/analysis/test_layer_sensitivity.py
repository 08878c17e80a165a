"""Layer sensitivity (mmlinvit.analysis.layer_sensitivity and its tool
tools/analysis/layer_sensitivity.py): proposals against hand-computed sums, FLOPs against the
closed form written here, gaps against hooks written here, and a tiny end-to-end run of the
tool (demo config, drawn scenes)."""
import importlib.util
import json
import os.path as osp

import pytest
import torch

from mmlinvit.analysis import attention_gap, attention_output_stats, feature_gap
from mmlinvit.analysis.layer_sensitivity import (choose, clone_with_attn, hybrid_attn_cfg,
                                                 layer_costs, propose, timing_warnings)
from mmlinvit.backbones import VisionTransformer

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
ARCH = dict(embed_dims=64, num_layers=4, num_heads=4, mlp_hidden_dims=128)  # the demo's


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, osp.join(REPO, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def tool():
    return _load('layer_sensitivity_tool', 'tools/analysis/layer_sensitivity.py')


def test_proposals_keep_the_most_sensitive_layers_and_sum_the_savings():
    sensitivity = [dict(feature_gap=g) for g in (0.3, 0.05, 0.2, 0.01)]
    blocks = [dict(softmax_s=4.0, linear_s=1.0, softmax_flops=40, linear_flops=10),
              dict(softmax_s=3.0, linear_s=1.0, softmax_flops=30, linear_flops=10),
              dict(softmax_s=2.0, linear_s=1.5, softmax_flops=20, linear_flops=15),
              dict(softmax_s=5.0, linear_s=1.0, softmax_flops=50, linear_flops=10)]
    costs = dict(teacher_s=20.0, teacher_flops=200, blocks=blocks, resolution=[8, 8])
    proposals = propose(sensitivity, costs, 'elu')
    assert [p['softmax_layers'] for p in proposals] == [[], [0], [0, 2], [0, 1, 2], [0, 1, 2, 3]]
    assert proposals[1]['attn_cfg'] == ['softmax', 'elu', 'elu', 'elu']
    # k = 1 linearizes layers 1, 2, 3: saves (3-1) + (2-1.5) + (5-1) s and 20 + 5 + 40 FLOPs
    assert proposals[1]['predicted_s'] == pytest.approx(20.0 - 2.0 - 0.5 - 4.0)
    assert proposals[1]['predicted_flops'] == 200 - 65
    assert proposals[1]['predicted_gap_sum'] == pytest.approx(0.05 + 0.2 + 0.01)
    assert proposals[4]['predicted_s'] == 20.0
    # predicted: k = 0 10.5 s, k = 1 13.5 s, k = 2 14 s; budget 0.6 x 20 = 12 s, 0.68 x 20 = 13.6 s
    assert choose(proposals, 20.0, 0.6, None)['keep'] == 0
    assert choose(proposals, 20.0, 0.68, None)['keep'] == 1
    assert choose(proposals, 20.0, 0.7, None)['keep'] == 2
    assert choose(proposals, 20.0, None, 3)['keep'] == 3
    with pytest.raises(ValueError, match='time-budget'):
        choose(proposals, 20.0, 0.1, None)
    with pytest.raises(ValueError, match='out of range'):
        choose(proposals, 20.0, None, 5)


def test_noisy_timings_are_warned():
    """On a loaded machine the blocks' shares added up to 195 % of the teacher, predictions
    were negative and the chosen hybrid measured slower than the budget, printed as fact."""
    sensitivity = [dict(feature_gap=g) for g in (0.3, 0.05)]
    blocks = [dict(softmax_s=4.0, linear_s=1.0, softmax_flops=40, linear_flops=10),
              dict(softmax_s=3.0, linear_s=1.0, softmax_flops=30, linear_flops=10)]
    quiet = dict(teacher_s=8.0, teacher_flops=80, blocks=blocks, resolution=[8, 8])
    proposals = propose(sensitivity, quiet, 'elu')
    for p, measured in zip(proposals, (3.1, 6.0, 8.0)):
        p['measured_s'] = measured
    chosen = choose(proposals, 8.0, 0.5, None)
    assert timing_warnings(quiet, proposals, chosen, 0.5) == []
    busy = dict(quiet, teacher_s=4.0)  # blocks 7 s of a 4 s whole
    proposals = propose(sensitivity, busy, 'elu')
    for p, measured in zip(proposals, (3.1, 6.0, 8.0)):
        p['measured_s'] = measured
    chosen = choose(proposals, 4.0, 0.5, None)
    text = ' '.join(timing_warnings(busy, proposals, chosen, 0.5))
    assert '175% of the teacher time' in text and 'predicted times <= 0' in text
    assert 'k = 1) measured 1.50 of the teacher time' in text and '--repeats' in text


def test_block_flops_match_the_closed_form():
    backbone_cfg = dict(type='mmlinvit.VisionTransformer', arch=ARCH, family='deit',
                        img_size=64, patch_size=8)
    torch.manual_seed(0)
    teacher = VisionTransformer(**{k: v for k, v in backbone_cfg.items() if k != 'type'})
    costs = layer_costs(backbone_cfg, teacher.eval(), 'elu', (64, 64), repeats=1)
    n, d, m, h = 64 + 1, ARCH['embed_dims'], ARCH['mlp_hidden_dims'], ARCH['num_heads']
    gemms = 2 * n * d * 3 * d + 2 * n * d * d + 2 * 2 * n * d * m
    for block in costs['blocks']:
        assert block['softmax_flops'] == gemms + 4 * n * n * d  # Q K^T and A V
        # kernel linear attention: phi(K)^T V and phi(Q) (K^T V) per head (4 N d D), plus
        # the normaliser mat-vec (2 N D)
        assert block['linear_flops'] == gemms + 4 * n * (d // h) * d + 2 * n * d


def test_gaps_are_relative_mse_of_the_hooked_outputs():
    backbone_cfg = dict(type='mmlinvit.VisionTransformer', arch=ARCH, family='deit',
                        img_size=32, patch_size=8)
    torch.manual_seed(0)
    teacher = VisionTransformer(**{k: v for k, v in backbone_cfg.items() if k != 'type'}).eval()
    student = clone_with_attn(backbone_cfg, teacher, hybrid_attn_cfg(4, [0, 2, 3], 'elu'))
    images = torch.randn(2, 3, 32, 32)
    # independent reference: plain forward hooks on the teacher's layer 1
    seen = {}
    handles = [teacher.blocks[1].register_forward_pre_hook(
        lambda m, args: seen.__setitem__('block_in', args[0])),
        teacher.blocks[1].attn.register_forward_hook(
            lambda m, args, out: seen.__setitem__('t_attn', out))]
    with torch.no_grad():
        f_t = teacher.forward_tokens(images)[0]
        forced = student.blocks[1].forward_attn(seen['block_in'], (4, 4), 1)
        f_s = student.forward_tokens(images)[0]
    for handle in handles:
        handle.remove()

    def rel(a, b):
        return float(((a - b)**2).sum() / (b**2).sum())

    assert attention_gap(student, teacher, 1, images) == pytest.approx(
        rel(forced, seen['t_attn']), rel=1e-5)
    assert feature_gap(student, teacher, images) == pytest.approx(rel(f_s, f_t), rel=1e-5)
    mean_sq, gaps = attention_output_stats(student, teacher, images)
    assert len(gaps) == 4 and gaps[0] == 0.0 and gaps[1] > 0  # layer 0 is the teacher's
    assert mean_sq[1] == pytest.approx(float(seen['t_attn'].pow(2).mean()), rel=1e-5)
    assert attention_gap(teacher, teacher, 2, images) == 0.0


def test_end_to_end_on_drawn_scenes(tool, tmp_path):
    from mmengine.config import Config
    from mmlinvit.datasets import make_ade20k_layout
    from mmlinvit.registry import MODELS
    root = str(tmp_path / 'scenes')
    make_ade20k_layout(root, num_train=8, num_val=4, size=(64, 64), seed=0)
    torch.manual_seed(0)
    teacher = VisionTransformer(arch=ARCH, family='deit', img_size=64, patch_size=8)
    ckpt = str(tmp_path / 'teacher.pth')
    torch.save(teacher.state_dict(), ckpt)
    out_config = str(tmp_path / 'hybrid.py')
    demo_teacher = _load('demo_tool', 'tools/demo.py').TEACHER_CFG  # the demo's teacher config
    result = tool.main([
        demo_teacher, ckpt, '--quick', '--resolution', '64', '--keep', '1', '--stages-1-3',
        '--pareto-ks', '0', '--work-dir', str(tmp_path / 'work'), '--out-config', out_config,
        '--cfg-options', f'train_dataloader.dataset.data_root={root}',
        f'val_dataloader.dataset.data_root={root}'
    ])
    assert len(result['sensitivity']) == 4
    assert all(0 <= s['feature_gap'] < float('inf') for s in result['sensitivity'])
    assert [p['keep'] for p in result['proposals']] == [0, 1, 2, 3, 4]
    assert result['proposals'][4]['feature_gap'] == 0.0  # all softmax: the teacher itself
    assert result['proposals'][0]['feature_gap'] > 0.0
    assert result['pareto'][0]['keep'] == 0 and 0 <= result['pareto'][0]['mIoU'] <= 100
    saved = json.load(open(tmp_path / 'work' / 'layer_sensitivity.json'))
    assert saved['chosen']['keep'] == 1
    # the written config inherits the teacher config and builds the chosen hybrid
    cfg = Config.fromfile(out_config)
    keep = saved['chosen']['softmax_layers']
    assert cfg.model.backbone.attn_cfg == ['softmax' if i in keep else 'elu' for i in range(4)]
    assert cfg.model.decode_head.num_classes == 6
    hybrid = MODELS.build(cfg.model.backbone)
    hybrid.init_weights()
    assert torch.equal(hybrid.state_dict()['blocks.2.mlp.fc1.weight'],
                       teacher.state_dict()['blocks.2.mlp.fc1.weight'])
