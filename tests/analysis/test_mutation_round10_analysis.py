"""Mutation round 10 over the analysis modules whose printed numbers guide users' choices.

Guards what the existing analysis tests left open, each against numbers worked out here by
hand (or hooks / formulas written here), not by re-running the code under test:

* ``mmlinvit.analysis.layer_sensitivity``: the ``--keep`` range, a hybrid exactly at the time
  budget, the error's "all linear" fraction, the noisy-timing thresholds, the per-layer shares
  of the sensitivity table, the Pareto speed-up, the predicted-time column, Stage 1 training
  only the attention on the teacher's *block* input, and the fastest-of-repeats timer;
* ``mmlinvit.analysis.attention_gaps``: the feature gap's denominator is the teacher's, a grid
  operator gets the class-token count, the student's training mode is restored;
* ``mmlinvit.analysis.distill_weight_sweep``: regret only for settings run on every init, the
  worst task is the largest regret, runs of different lengths are different runs, and the
  best-of-init uses the mean over seeds;
* ``tools/analysis/sweep_distill_weight.py``: ``--no-baseline`` drops the baseline and the
  tables use only this grid's seeds and lengths;
* ``mmlinvit.analysis.curves``: booleans are not scalars, blank lines are skipped;
* ``mmlinvit.analysis.attention_maps``: negative heads are refused, the Adventurer class
  token is the LAST token, bilinear upsampling uses half-pixel centres;
* ``mmlinvit.analysis.teacher_student``: difference is student minus teacher, PCA in the
  teacher's basis, training modes restored;
* ``tools/analysis/layer_sensitivity.py`` / ``visualize_attention.py``: argument defaults and
  checks, relative depth rounding, image normalisation.
"""
import json
from pathlib import Path
from types import ModuleType
from typing import List, Tuple

import numpy as np
import pytest
import torch

from mmlinvit.analysis import (activation_similarity_maps, attention_gap,
                               attention_output_stats, compare_teacher_student, feature_gap,
                               query_attention_maps, read_scalars, upsample_map)
from mmlinvit.analysis import layer_sensitivity as ls
from mmlinvit.analysis.distill_weight_sweep import load_results, summarise, sweep_settings
from mmlinvit.analysis.feature_pca import patch_features
from mmlinvit.backbones import VisionTransformer
from mmlinvit.utils.cli import load_script

ROOT = Path(__file__).resolve().parents[2]
ADVENTURER_EXISTS = (ROOT / 'mmlinvit/backbones/adventurer.py').exists()
TINY = dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32)


def _load_tool(name: str) -> ModuleType:
    return load_script(str(ROOT / 'tools' / 'analysis' / f'{name}.py'), f'{name}_round10')


def _teacher_block_io(teacher: VisionTransformer, index: int,
                      images: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(block ``index``'s input, its attention output) in a teacher forward, captured with
    plain forward hooks: the reference the alignment and the gaps are checked against."""
    seen = {}
    handles = [teacher.blocks[index].register_forward_pre_hook(
        lambda m, args: seen.__setitem__('x', args[0])),
        teacher.blocks[index].attn.register_forward_hook(
            lambda m, args, out: seen.__setitem__('t', out))]
    with torch.no_grad():
        teacher.forward_tokens(images)
    for handle in handles:
        handle.remove()
    return seen['x'], seen['t']

def _table_cells(line: str) -> List[str]:
    return [c.strip() for c in line.strip().strip('|').split('|')]


# ----------------------------------------------------------------------------- choose / warnings
def _two_layer_proposals(teacher_s: float = 8.0) -> List[dict]:
    """k = 0: 8 - (3 + 2) = 3 s; k = 1: 8 - 2 = 6 s; k = 2: 8 s (exact binary fractions)."""
    sensitivity = [dict(feature_gap=0.3), dict(feature_gap=0.05)]
    blocks = [dict(softmax_s=4.0, linear_s=1.0, softmax_flops=40, linear_flops=10),
              dict(softmax_s=3.0, linear_s=1.0, softmax_flops=30, linear_flops=10)]
    costs = dict(teacher_s=teacher_s, teacher_flops=80, blocks=blocks, resolution=[8, 8])
    return ls.propose(sensitivity, costs, 'elu')


def test_choose_refuses_a_negative_keep():
    """``--keep -1`` is not "the last proposal" (all softmax): it is out of range."""
    with pytest.raises(ValueError, match='out of range'):
        ls.choose(_two_layer_proposals(), 8.0, None, -1)


def test_choose_takes_a_hybrid_exactly_at_the_budget():
    """Predicted 3 s against a budget of 0.375 x 8 s = 3 s: it fits ("at most")."""
    assert ls.choose(_two_layer_proposals(), 8.0, 0.375, None)['keep'] == 0


def test_no_fit_error_quotes_the_all_linear_fraction():
    """Linearizing every layer (k = 0) is predicted at 3 / 8 = 0.375 -> '0.38' (the all-softmax
    k = L would read 1.00)."""
    with pytest.raises(ValueError, match=r'predicted at 0\.38 of the teacher time'):
        ls.choose(_two_layer_proposals(), 8.0, 0.1, None)


def test_timing_warnings_thresholds():
    """Blocks summing to 120 % of the teacher are warned (limit 115 %), and a predicted time
    of exactly 0 s is warned as well."""
    sensitivity = [dict(feature_gap=0.3), dict(feature_gap=0.05)]
    blocks = [dict(softmax_s=3.0, linear_s=1.0, softmax_flops=40, linear_flops=10),
              dict(softmax_s=3.0, linear_s=1.0, softmax_flops=30, linear_flops=10)]
    costs = dict(teacher_s=5.0, teacher_flops=80, blocks=blocks, resolution=[8, 8])
    proposals = ls.propose(sensitivity, costs, 'elu')  # k = 0: 5 - 2 - 2 = 1 s
    for p in proposals:
        p['measured_s'] = 1.0
    text = ' '.join(ls.timing_warnings(costs, proposals, proposals[0], None))
    assert '120% of the teacher time' in text
    zero = dict(costs, teacher_s=4.0, blocks=[dict(b, softmax_s=2.0, linear_s=0.0)
                                              for b in blocks])  # k = 0: 4 - 2 - 2 = 0 s
    proposals = ls.propose(sensitivity, zero, 'elu')
    for p in proposals:
        p['measured_s'] = 1.0
    assert proposals[0]['predicted_s'] == 0.0
    text = ' '.join(ls.timing_warnings(zero, proposals, proposals[0], None))
    assert 'predicted times <= 0 for keep k = [0]' in text


# ----------------------------------------------------------------------------- tables
def test_sensitivity_table_shares_are_of_the_whole_teacher():
    """Time 4 ms -> 1 ms of a 10 ms teacher: 40.0% -> 10.0% (not 1/4 of the block's own);
    FLOPs likewise; a discarded alignment is marked, a kept one is not."""
    costs = dict(resolution=[8, 8], teacher_s=0.010, teacher_flops=1e9,
                 blocks=[dict(softmax_s=0.004, linear_s=0.001, softmax_flops=4e8,
                              linear_flops=1e8),
                         dict(softmax_s=0.002, linear_s=0.001, softmax_flops=2e8,
                              linear_flops=1.5e8)])
    sensitivity = [dict(attn_gap_before=0.5, attn_gap=0.25, alignment_kept=False,
                        feature_gap=0.125),
                   dict(attn_gap_before=0.5, attn_gap=0.125, alignment_kept=True,
                        feature_gap=0.0625)]
    lines = ls.sensitivity_table(sensitivity, costs).splitlines()
    assert _table_cells(lines[2]) == ['0', '5.00e-01 -> 2.50e-01 (discarded)', '1.25e-01',
                                      '40.0% -> 10.0%', '40.0% -> 10.0%']
    assert _table_cells(lines[3]) == ['1', '5.00e-01 -> 1.25e-01', '6.25e-02',
                                      '20.0% -> 10.0%', '20.0% -> 15.0%']


def test_proposal_predicted_column_and_pareto_speed_up():
    """The predicted column shows the prediction (8 ms), not the measurement (10 ms); the Pareto
    speed-up is teacher / hybrid (20 ms / 10 ms = 2.00x)."""
    costs = dict(resolution=(64, 64), teacher_s=0.020)
    proposals = [dict(keep=0, softmax_layers=[], predicted_s=0.008, measured_s=0.010,
                      predicted_flops=1e9, feature_gap=0.1)]
    cells = _table_cells(ls.proposal_table(proposals, costs).splitlines()[2])
    assert cells[2:4] == ['8.0 ms', '10.0 ms']
    rows = [dict(keep=0, softmax_layers=[], measured_s=0.010, predicted_flops=1e9,
                 feature_gap=0.1, mIoU=42.0)]
    cells = _table_cells(ls.pareto_table(rows, costs).splitlines()[2])
    assert cells[2:4] == ['10.0 ms', '2.00x']


# ----------------------------------------------------------------------------- Stage 1, timer
def test_align_layer_trains_only_attention_on_the_teacher_block_input():
    """The first loss is the MSE of the student's attention on the teacher's block input
    (through the student's norm1) against the teacher's attention output, both captured by
    hooks written here; norm1 / MLP (outside the attention module) never change."""
    arch = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
    cfg = dict(type='mmlinvit.VisionTransformer', arch=arch, family='deit', img_size=16,
               patch_size=8)
    torch.manual_seed(0)
    teacher = VisionTransformer(**{k: v for k, v in cfg.items() if k != 'type'}).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    student = ls.clone_with_attn(cfg, teacher, ls.hybrid_attn_cfg(2, [0], 'elu'))
    with torch.no_grad():  # a norm1 away from the identity tells norm1(x) from x
        student.blocks[1].norm1.weight.uniform_(0.5, 2.0)
    images = torch.randn(1, 3, 16, 16).repeat(3, 1, 1, 1)  # any sampled batch is the same
    block_in, t_attn = _teacher_block_io(teacher, 1, images[:2])
    blk = student.blocks[1]
    with torch.no_grad():
        expected = float((blk.attn(blk.norm1(block_in), (2, 2), 1) - t_attn).pow(2).mean())
    frozen = {k: v.clone() for k, v in blk.state_dict().items() if not k.startswith('attn.')}
    attn_before = {k: v.clone() for k, v in blk.attn.state_dict().items()}
    losses = ls.align_layer(student, teacher, 1, images, iters=2, lr=1e-2, batch_size=2, seed=0)
    assert losses[0] == pytest.approx(expected, rel=1e-4)
    for key, value in blk.state_dict().items():
        if key in frozen:
            assert torch.equal(value, frozen[key]), key
    assert any(not torch.equal(blk.attn.state_dict()[k], v) for k, v in attn_before.items())


def test_best_seconds_is_the_fastest_call_after_one_warm_up(monkeypatch):
    """A fake clock: the warm-up takes 0.5 s (not timed), the timed calls 3, 1 and 2 s."""
    clock = [0.0]
    durations = iter([0.5, 3.0, 1.0, 2.0])
    calls = []

    def fn():
        calls.append(1)
        clock[0] += next(durations)

    monkeypatch.setattr(ls.time, 'perf_counter', lambda: clock[0])
    assert ls.best_seconds(fn, 3) == 1.0
    assert len(calls) == 4


# ----------------------------------------------------------------------------- gaps
def test_attention_output_stats_restores_the_student_training_mode():
    torch.manual_seed(0)
    teacher = VisionTransformer(TINY, attn_cfg='softmax', img_size=16, patch_size=8).eval()
    student = VisionTransformer(TINY, attn_cfg='elu', img_size=16, patch_size=8).train()
    attention_output_stats(student, teacher, torch.randn(1, 3, 16, 16))
    assert student.training


def test_feature_gap_has_the_teacher_mean_square_in_the_denominator():
    """A student equal to the teacher but with a final norm of weight 2 has f_s = 2 f_t:
    mean((2 f_t - f_t)^2) / mean(f_t^2) = 1 (the reverse direction would read 0.25)."""
    torch.manual_seed(0)
    teacher = VisionTransformer(TINY, attn_cfg='softmax', img_size=16, patch_size=8).eval()
    student = VisionTransformer(TINY, attn_cfg='softmax', img_size=16, patch_size=8).eval()
    student.load_state_dict(teacher.state_dict())
    with torch.no_grad():
        student.norm.weight.mul_(2.0)
        student.norm.bias.mul_(2.0)
    assert feature_gap(student, teacher, torch.randn(2, 3, 16, 16)) == pytest.approx(1.0,
                                                                                   rel=1e-5)


@pytest.mark.filterwarnings('ignore:check_operator_setting=False')  # a deliberate deviation
def test_attention_gap_passes_the_prefix_count_to_a_grid_operator():
    """MHLA groups the patch tokens on the grid, so it needs the class-token count: the gap is
    the relative MSE of the student's attention on the teacher's block input (hooked here)."""
    cfg = dict(type='mmlinvit.VisionTransformer', arch=dict(TINY, embed_dims=32),
               family='deit', img_size=32, patch_size=8, with_cls_token=True,
               pos_embed_type='learned', out_type='cls_token', check_operator_setting=False)
    torch.manual_seed(0)
    teacher = VisionTransformer(**{k: v for k, v in cfg.items() if k != 'type'}).eval()
    student = ls.clone_with_attn(cfg, teacher, ls.hybrid_attn_cfg(2, [0], 'mhla'))
    assert teacher.num_prefix_tokens == 1
    images = torch.randn(2, 3, 32, 32)
    block_in, t_attn = _teacher_block_io(teacher, 1, images)
    blk = student.blocks[1]
    with torch.no_grad():
        out = blk.attn(blk.norm1(block_in), (4, 4), 1)
    expected = float((out - t_attn).pow(2).mean() / t_attn.pow(2).mean())
    assert attention_gap(student, teacher, 1, images) == pytest.approx(expected, rel=1e-5)


# ----------------------------------------------------------------------------- weight sweep
def _record(init, kind, weight, seed, score, task='digits', iters=3):
    return dict(task=task, init=init, kind=kind, weight=weight, seed=seed, iters=iters,
                operator='relu', score=score)


def test_regret_needs_the_setting_on_every_init():
    """raw 50 ran on Random only: it gets no regret row (a regret over one init would read 0.00
    and win the choice)."""
    results = [_record('random', 'none', 0.0, 0, 50.0), _record('random', 'raw', 50.0, 0, 70.0),
               _record('copy', 'none', 0.0, 0, 80.0)]
    tables = summarise(results, sweep_settings([50], []), ['random', 'copy'], {})
    assert not any(line.startswith('| raw 50 |') for line in tables.splitlines())
    assert '**w/o distill** (10.00 points)' in tables  # (20 + 0) / 2


def test_worst_task_is_the_largest_regret():
    """digits: none 50, raw 60 -> regrets 10, 0; scenes: none 40, raw 35 -> 0, 5.  Worst task:
    none 10, raw 5 -> raw 50 is chosen."""
    results = [_record('copy', 'none', 0.0, 0, 50.0), _record('copy', 'raw', 50.0, 0, 60.0),
               _record('copy', 'none', 0.0, 0, 40.0, task='scenes'),
               _record('copy', 'raw', 50.0, 0, 35.0, task='scenes')]
    lines = summarise(results, sweep_settings([50], []), ['copy'], {}).splitlines()
    assert '| w/o distill | 10.00 | 0.00 | 10.00 |' in lines
    assert '| raw 50 | 0.00 | 5.00 | 5.00 |' in lines
    assert lines[-1] == 'setting with the smallest worst-task regret: **raw 50** (5.00 points)'


def test_best_of_init_is_the_mean_over_seeds():
    """none: seeds 0, 0, 90 (mean 30, median 0); raw: 20, 20, 20.  Best is none (30): regret of
    none 0, of raw 10."""
    results = [_record('copy', 'none', 0.0, s, v) for s, v in enumerate((0.0, 0.0, 90.0))]
    results += [_record('copy', 'raw', 50.0, s, 20.0) for s in range(3)]
    lines = summarise(results, sweep_settings([50], []), ['copy'], {}).splitlines()
    assert '| w/o distill | 0.00 | 0.00 |' in lines
    assert '| raw 50 | 10.00 | 10.00 |' in lines


def test_runs_of_different_lengths_are_different_runs(tmp_path):
    path = tmp_path / 'results.jsonl'
    records = [_record('copy', 'raw', 50.0, 0, 1.0, iters=3),
               _record('copy', 'raw', 50.0, 0, 2.0, iters=300)]
    path.write_text(''.join(json.dumps(r) + '\n' for r in records))
    assert sorted(r['score'] for r in load_results(str(path))) == [1.0, 2.0]


def test_sweep_tool_no_baseline_and_tables_of_this_grid_only(tmp_path, monkeypatch):
    """``--no-baseline`` drops ('none', 0); a run of another length (iters 999) or another seed
    (5) in results.jsonl stays out of this invocation's table (teacher and runs faked)."""
    tool = _load_tool('sweep_distill_weight')
    args = tool.parse_args(['--no-baseline', '--raw', '5'])
    assert tool.settings_of(args) == [('raw', 5.0), ('normalized', 0.1), ('normalized', 1.0),
                                      ('normalized', 10.0)]
    monkeypatch.setattr(tool, 'prepare_digits', lambda n, epochs: dict(
        teacher_score=90.0, teacher_attn_mean_square=[1.0]))
    monkeypatch.setattr(tool, 'run_digits', lambda *a: dict(score=70.0, attn_rel_gap=0.1))
    work = tmp_path / 'sweep'
    work.mkdir()
    stale = [_record('copy', 'raw', 50.0, 0, 10.0, iters=999),
             _record('copy', 'raw', 50.0, 5, 10.0, iters=3)]
    (work / 'results.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in stale))
    tables = tool.main(['--quick', '--tasks', 'digits', '--seeds', '0', '--inits', 'copy',
                        '--raw', '50', '--normalized', '--no-baseline', '--work-dir', str(work)])
    assert '| Copy | **70.0** |' in tables.splitlines()


# ----------------------------------------------------------------------------- curves
def test_read_scalars_skips_booleans_and_blank_lines(tmp_path):
    path = tmp_path / 'scalars.json'
    path.write_text(json.dumps(dict(loss=1.0, is_best=True, step=1)) + '\n\n' +
                    json.dumps(dict(loss=0.5, step=2)) + '\n')
    series = read_scalars(str(path))
    assert series == {'loss': ([1, 2], [1.0, 0.5])}


# ----------------------------------------------------------------------------- attention maps
def _tiny_vit(operator: str) -> VisionTransformer:
    return VisionTransformer(TINY, attn_cfg=operator, img_size=32, patch_size=8).eval()


def test_negative_head_is_refused():
    with pytest.raises(IndexError, match='out of range'):
        query_attention_maps(_tiny_vit('softmax'), torch.randn(1, 3, 32, 32), (0, 0), [0],
                             head=-1)


@pytest.mark.skipif(not ADVENTURER_EXISTS, reason='Adventurer backbone not present')
def test_adventurer_map_drops_the_last_token():
    """Adventurer tokens are ``[patches, cls]``: the map is the cosine of the query patch to
    the first h * w tokens of the block output (hooked and computed here)."""
    from mmlinvit.backbones.adventurer import Adventurer
    torch.manual_seed(0)
    model = Adventurer(dict(embed_dims=32, num_layers=2), patch_size=8,
                       mixer_cfg=dict(d_state=8, headdim=16)).eval()
    images = torch.randn(1, 3, 16, 24)  # 2 x 3 patches
    seen = {}
    handle = model.layers[1].register_forward_hook(
        lambda m, a, out: seen.__setitem__('out', out))
    with torch.no_grad():
        model(images)
    handle.remove()
    patches = seen['out'][0, :6].double()
    q = patches[1 * 3 + 2]
    expected = (patches @ q) / (patches.norm(dim=-1) * q.norm())
    maps = activation_similarity_maps(model, images, (1, 2), [1])
    torch.testing.assert_close(maps[1][0].double().flatten(), expected, atol=1e-5, rtol=1e-4)


def test_bilinear_upsample_uses_half_pixel_centres():
    """A 2 x 1 grid [0, 4] to 4 rows: sources -0.25, 0.25, 0.75, 1.25 -> 0, 1, 3, 4."""
    up = upsample_map(torch.tensor([[0.0], [4.0]]), (4, 1), mode='bilinear')
    torch.testing.assert_close(up.flatten(), torch.tensor([0.0, 1.0, 3.0, 4.0]))


# ----------------------------------------------------------------------------- teacher vs student
def test_comparison_sign_basis_and_modes():
    """difference = student - teacher; explained variance is the teacher's (hand SVD of the
    teacher's patch features); both models get their training modes back."""
    torch.manual_seed(0)
    teacher = _tiny_vit('softmax').train()
    student = _tiny_vit('elu')  # its own weights: features far from the teacher's
    images = torch.randn(2, 3, 32, 32)
    cmp = compare_teacher_student(teacher, student, images, query=(1, 1), layer=0)
    assert teacher.training and not student.training
    torch.testing.assert_close(cmp.attention_difference,
                               cmp.student_attention - cmp.teacher_attention)
    assert cmp.attention_difference.abs().max() > 0
    with torch.no_grad():
        feats = patch_features(teacher.eval(), images).reshape(-1, TINY['embed_dims'])
    x = feats.double().numpy()
    s = np.linalg.svd(x - x.mean(0), compute_uv=False)
    ratio = (s**2 / (s**2).sum())[:3]
    np.testing.assert_allclose(cmp.explained_variance.numpy(), ratio, rtol=1e-4)


# ----------------------------------------------------------------------------- tools' arguments
def test_layer_sensitivity_tool_budget_arguments():
    tool = _load_tool('layer_sensitivity')
    assert tool.parse_args(['cfg.py', 'ckpt.pth']).time_budget == 0.5  # the documented default
    assert tool.parse_args(['cfg.py', 'ckpt.pth', '--keep', '2']).time_budget is None
    with pytest.raises(SystemExit):
        tool.parse_args(['cfg.py', 'ckpt.pth', '--time-budget', '0'])



@pytest.mark.parametrize('flags, named', [(['--repeats', '0'], '--repeats'),
                                          (['--align-iters', '-1'], '--align-iters')])
def test_layer_sensitivity_tool_refuses_empty_timings_and_negative_steps(flags, named, capsys):
    """``--repeats 0`` ended in ``min() arg is an empty sequence`` after the alignment of every
    layer; a negative ``--align-iters`` in a bare IndexError at ``losses[0]``."""
    tool = _load_tool('layer_sensitivity')
    with pytest.raises(SystemExit):
        tool.parse_args(['cfg.py', 'ckpt.pth'] + flags)
    assert named in capsys.readouterr().err
    assert tool.parse_args(['cfg.py', 'ckpt.pth', '--align-iters', '0']).align_iters == 0


def test_sweep_tool_help_states_the_plans_defaults(capsys):
    """The ``-h`` text of the step counts names the full plan's values (it said 300 digits
    steps where the plan and the README's results use 150)."""
    tool = _load_tool('sweep_distill_weight')
    with pytest.raises(SystemExit):
        tool.parse_args(['-h'])
    text = ' '.join(capsys.readouterr().out.split())
    full, quick = tool.PLANS['full'], tool.PLANS['quick']
    assert (f"student steps on digits (default: {full['digits_iters']}; --quick: "
            f"{quick['digits_iters']})") in text
    assert (f"(default: {full['scenes_iters']}; --quick: {quick['scenes_iters']})") in text

def test_visualize_attention_tool_helpers():
    tool = _load_tool('visualize_attention')
    # layer 1 of 4 sits at 1/3 of the depth: 11 / 3 = 3.67 -> block 4 of a 12-block model
    assert [tool.relative_block(i, 4, 12) for i in range(4)] == [0, 4, 7, 11]
    args = tool.parse_args(['--students', 'elu', 'inline', '--student-ckpt', 'one.pth'])
    assert args.student_ckpt == ['one.pth']  # one checkpoint for every student
    white = np.full((2, 2, 3), 255, dtype=np.uint8)
    expected = [(1 - m) / s for m, s in zip((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]
    torch.testing.assert_close(tool.to_tensor(white)[0, :, 0, 0], torch.tensor(expected))


def test_layer_sensitivity_main_keeps_alignments_and_builds_proposals_from_them(tmp_path):
    """``main()`` without ``--quick`` (10 alignment steps of lr 1e-4 per layer): an alignment
    that lowers the training gap is kept, and a proposal's hybrid carries the aligned weights
    in its linear layers and the teacher's in its softmax ones, so the hybrid with one linear
    layer j is the model of layer j's sensitivity row and has its feature gap exactly (the
    check flipped, or the aligned weights loaded into the softmax layers, gave other gaps)."""
    from mmlinvit.datasets import make_ade20k_layout
    tool = _load_tool('layer_sensitivity')
    demo_teacher = load_script(str(ROOT / 'tools' / 'demo.py'), 'demo_round10').TEACHER_CFG
    root = str(tmp_path / 'scenes')
    make_ade20k_layout(root, num_train=16, num_val=4, size=(64, 64), seed=0)
    torch.manual_seed(0)
    teacher = VisionTransformer(arch=dict(embed_dims=64, num_layers=4, num_heads=4,
                                          mlp_hidden_dims=128),
                                family='deit', img_size=64, patch_size=8)
    ckpt = str(tmp_path / 'teacher.pth')
    torch.save(teacher.state_dict(), ckpt)
    result = tool.main([
        demo_teacher, ckpt, '--resolution', '64', '--keep', '3', '--align-iters', '10',
        '--align-lr', '1e-4', '--eval-images', '4', '--repeats', '1',
        '--work-dir', str(tmp_path / 'work'),
        '--cfg-options', f'train_dataloader.dataset.data_root={root}',
        f'val_dataloader.dataset.data_root={root}'])
    rows = result['sensitivity']
    assert all(row['alignment_kept'] for row in rows)  # 10 steps on the same images help
    assert all(row['attn_gap'] < row['attn_gap_before'] for row in rows)
    one_linear = result['proposals'][3]
    (j, ) = set(range(4)) - set(one_linear['softmax_layers'])
    assert one_linear['feature_gap'] == pytest.approx(rows[j]['feature_gap'], rel=1e-6)
    assert rows[j]['feature_gap'] > 0
