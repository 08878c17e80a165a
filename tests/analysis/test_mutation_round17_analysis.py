"""Mutation round 17 over the analysis modules, their tools and the operator setting.

Guards what rounds 10-16 left open, each against a reference written here (hand-worked
numbers, closed forms, PyTorch's own ``AdamW`` / ``CosineAnnealingLR`` formula, plain
forward hooks), never against values pasted from the code under test:

* ``mmlinvit.analysis.layer_sensitivity``: Stage 1 is AdamW without weight decay on a cosine
  schedule down to 1 % of the peak, its batches are drawn with the given seed from every
  image, the student comes back in eval mode; a non-square resolution is measured as given;
  the timing-warning boundaries (115 %, exactly at the budget); the table footers and the
  GFLOPs / gap / mIoU columns;
* ``tools/analysis/layer_sensitivity.py``: ``--resolution H W``, ``--align-iters 0`` keeps the
  copied layer (not "discarded"), a discarded alignment restores the teacher-initialised
  layer, the default config name, the written config's absolute paths, the error of a config
  without ``model.backbone``;
* ``mmlinvit.analysis.attention_gaps``: the feature gap puts the student in eval mode, the
  attention statistics are taken in eval mode;
* ``mmlinvit.analysis.attention_maps``: the query / head ranges, float32 maps, the nearest
  default of ``upsample_map``, its height check, the type errors of unsuitable models;
* ``mmlinvit.analysis.curves``: undecodable / non-object lines, non-numeric values, the order of
  the loss terms, the log-scale rule, nested output folders, an empty run list;
* ``mmlinvit.analysis.distill_weight_sweep`` / ``tools/analysis/sweep_distill_weight.py``: the raw
  loss weight, the Markdown separators, missing cells, the header's iteration counts, the
  operator in the run key, the baseline-only sweep, ``--digits-iters``, resuming, the scenes
  config (loss weight, init, seed), tables of this operator only;
* ``tools/analysis/visualize_attention.py``: a one-block model, negative ``--layers``, one
  checkpoint per student, the ``--student-ckpt`` count;
* ``mmlinvit.backbones.operator_setting``: the ``out_type`` fix of an operator that declares
  only ``with_cls_token``, and the warnings pointing at the caller's line.
"""
import json
import math
import os.path as osp
import warnings
from pathlib import Path
from types import ModuleType
from typing import Iterator, List, Tuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmlinvit.analysis import (attention_output_stats, feature_gap, loss_keys,
                               query_attention_maps, read_scalars, save_loss_curves,
                               upsample_map)
from mmlinvit.analysis import attention_maps as am
from mmlinvit.analysis import layer_sensitivity as ls
from mmlinvit.analysis.distill_weight_sweep import (build_distill_loss, load_results,
                                                    summarise, sweep_settings)
from mmlinvit.backbones import VisionTransformer
from mmlinvit.distill.losses import AttentionOutputMSELoss
from mmlinvit.utils.cli import load_script

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32)
ARCH = dict(embed_dims=64, num_layers=4, num_heads=4, mlp_hidden_dims=128)  # the demo's


def _load_tool(name: str) -> ModuleType:
    return load_script(str(ROOT / 'tools' / 'analysis' / f'{name}.py'), f'{name}_round17')


def _table_cells(line: str) -> List[str]:
    return [c.strip() for c in line.strip().strip('|').split('|')]


def _teacher_block_io(teacher: VisionTransformer, index: int,
                      images: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(block ``index``'s input, its attention output), captured with plain hooks."""
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


# ----------------------------------------------------------------------------- Stage 1
def _stage1_pair() -> Tuple[dict, VisionTransformer, VisionTransformer]:
    arch = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
    cfg = dict(type='mmlinvit.VisionTransformer', arch=arch, family='deit', img_size=16,
               patch_size=8)
    torch.manual_seed(0)
    teacher = VisionTransformer(**{k: v for k, v in cfg.items() if k != 'type'}).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    student = ls.clone_with_attn(cfg, teacher, ls.hybrid_attn_cfg(2, [0], 'elu'))
    return cfg, teacher, student


def test_align_layer_is_adamw_without_decay_on_a_cosine_to_one_percent():
    """Three steps of ``align_layer`` against a reference loop written here: batches drawn with
    ``torch.randint`` from a generator seeded with ``seed`` over ALL images, the MSE of the
    student attention on the teacher's block input (hooks), ``torch.optim.AdamW`` with
    ``weight_decay=0`` and the learning rate of PyTorch's documented cosine closed form
    ``eta_min + (lr - eta_min) (1 + cos(pi t / T)) / 2`` with ``eta_min = 0.01 lr``, T = iters.
    The losses and the trained attention weights must agree; the student ends in eval mode."""
    cfg, teacher, student = _stage1_pair()
    reference = ls.clone_with_attn(cfg, teacher, ls.hybrid_attn_cfg(2, [0], 'elu'))
    reference.load_state_dict(student.state_dict())
    torch.manual_seed(1)
    images = torch.randn(5, 3, 16, 16)  # five distinct images
    iters, lr, batch, seed = 3, 0.05, 2, 7
    blk = reference.blocks[1]
    optimizer = torch.optim.AdamW(blk.attn.parameters(), lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    expected_losses = []
    for t in range(iters):
        for group in optimizer.param_groups:
            group['lr'] = 0.01 * lr + (lr - 0.01 * lr) * (1 + math.cos(math.pi * t / iters)) / 2
        idx = torch.randint(0, 5, (batch, ), generator=generator)
        block_in, target = _teacher_block_io(teacher, 1, images[idx])
        loss = F.mse_loss(blk.attn(blk.norm1(block_in), (2, 2), 1), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        expected_losses.append(loss.item())
    student.train()
    losses = ls.align_layer(student, teacher, 1, images, iters, lr, batch, seed)
    assert losses == pytest.approx(expected_losses, rel=1e-5)
    for (name, got), want in zip(student.blocks[1].attn.named_parameters(),
                                 blk.attn.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
    assert not any(m.training for m in student.modules())  # "left in eval mode"


# ----------------------------------------------------------------------------- costs, warnings
def test_layer_costs_measure_a_non_square_resolution_as_given():
    """At 64 x 32 with 8-pixel patches: 8 x 4 = 32 patches + the class token, N = 33.  Block
    FLOPs by the closed form of tests/analysis/test_layer_sensitivity.py (2 x MACs of the GEMMs,
    4 N^2 d for Q K^T and A V; kernel linear attention 4 N d D + 2 N d)."""
    cfg = dict(type='mmlinvit.VisionTransformer', arch=ARCH, family='deit', img_size=64,
               patch_size=8)
    torch.manual_seed(0)
    teacher = VisionTransformer(**{k: v for k, v in cfg.items() if k != 'type'}).eval()
    costs = ls.layer_costs(cfg, teacher, 'elu', (64, 32), repeats=1)
    n, d, m, h = 33, ARCH['embed_dims'], ARCH['mlp_hidden_dims'], ARCH['num_heads']
    gemms = 2 * n * d * 3 * d + 2 * n * d * d + 2 * 2 * n * d * m
    assert costs['resolution'] == [64, 32]
    for block in costs['blocks']:
        assert block['softmax_flops'] == gemms + 4 * n * n * d
        assert block['linear_flops'] == gemms + 4 * n * (d // h) * d + 2 * n * d


def _costs_and_proposals(teacher_s: float, block_s: Tuple[float, float]) -> Tuple[dict, list]:
    sensitivity = [dict(feature_gap=0.3), dict(feature_gap=0.05)]
    blocks = [dict(softmax_s=s, linear_s=1.0, softmax_flops=40, linear_flops=10)
              for s in block_s]
    costs = dict(teacher_s=teacher_s, teacher_flops=80, blocks=blocks, resolution=[8, 8])
    return costs, ls.propose(sensitivity, costs, 'elu')


def test_blocks_at_exactly_115_percent_are_not_warned():
    """23 s of blocks in a 20 s teacher is 115 %: the limit itself ("> 1.15") is quiet."""
    costs, proposals = _costs_and_proposals(20.0, (11.5, 11.5))  # k = 0: 20 - 21 < 0
    for p in proposals:
        p['measured_s'] = 1.0
    text = ' '.join(ls.timing_warnings(costs, proposals, proposals[2], None))
    assert 'of the teacher time (their sum' not in text
    assert 'predicted times <= 0 for keep k = [0]' in text  # the other check still runs


def test_a_hybrid_measured_exactly_at_the_budget_is_not_warned():
    """Budget 0.5 x 8 s = 4 s and the chosen hybrid measured 4 s: within ("at most")."""
    costs, proposals = _costs_and_proposals(8.0, (4.0, 3.0))  # blocks 87.5 %, k=0 at 3 s
    for p in proposals:
        p['measured_s'] = 4.0
    assert ls.timing_warnings(costs, proposals, proposals[0], 0.5) == []
    proposals[0]['measured_s'] = 4.5
    assert 'measured 0.56 of the teacher time' in ' '.join(
        ls.timing_warnings(costs, proposals, proposals[0], 0.5))


def test_table_footer_and_the_gflops_gap_and_miou_columns():
    """Teacher 12.5 ms and 2.5e9 FLOPs -> '12.5 ms, 2.50 GFLOPs'; a 1.5e9-FLOP hybrid reads
    1.50 GFLOPs; the gap is in 2-digit scientific notation, the mIoU as given (percent)."""
    costs = dict(resolution=[64, 32], teacher_s=0.0125, teacher_flops=2.5e9,
                 blocks=[dict(softmax_s=0.005, linear_s=0.0025, softmax_flops=1e9,
                              linear_flops=5e8)])
    sensitivity = [dict(attn_gap_before=0.5, attn_gap=0.25, alignment_kept=True,
                        feature_gap=0.125)]
    text = ls.sensitivity_table(sensitivity, costs)
    assert text.splitlines()[-1] == (f'teacher backbone at 64x32: 12.5 ms, 2.50 GFLOPs '
                                     f'({ls.FLOP_CONVENTION})')
    assert 'time share at 64x32 (softmax -> linear)' in text.splitlines()[0]
    proposals = [dict(keep=0, softmax_layers=[], predicted_s=0.01, measured_s=0.0125,
                      predicted_flops=1.5e9, feature_gap=0.0375)]
    cells = _table_cells(ls.proposal_table(proposals, costs).splitlines()[2])
    assert cells[4:] == ['1.00x', '1.50', '3.75e-02']
    rows = [dict(keep=0, softmax_layers=[], measured_s=0.00625, predicted_flops=1.5e9,
                 feature_gap=0.0375, mIoU=42.125)]
    cells = _table_cells(ls.pareto_table(rows, costs).splitlines()[2])
    assert cells[3:] == ['2.00x', '1.50', '3.75e-02', '42.12']


# ----------------------------------------------------------------------------- the tool
@pytest.fixture
def restore_default_scope() -> Iterator[None]:
    """The tool's data loading sets mmengine's default scope; the previous one comes back."""
    from mmengine.registry import DefaultScope
    saved = dict(DefaultScope._instance_dict)
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(saved)


@pytest.fixture(scope='module')
def scenes_root(tmp_path_factory) -> str:
    from mmlinvit.datasets import make_ade20k_layout
    root = str(tmp_path_factory.mktemp('scenes17'))
    make_ade20k_layout(root, num_train=4, num_val=4, size=(64, 64), seed=0)
    return root


def _tool_argv(tmp_path: Path, scenes_root: str, *extra: str) -> List[str]:
    demo_teacher = load_script(str(ROOT / 'tools' / 'demo.py'), 'demo_round17').TEACHER_CFG
    torch.manual_seed(0)
    teacher = VisionTransformer(arch=ARCH, family='deit', img_size=64, patch_size=8)
    ckpt = str(tmp_path / 'teacher.pth')
    torch.save(teacher.state_dict(), ckpt)
    return [demo_teacher, ckpt, '--eval-images', '4', '--repeats', '1', '--work-dir',
            str(tmp_path / 'work'), *extra, '--cfg-options',
            f'train_dataloader.dataset.data_root={scenes_root}',
            f'val_dataloader.dataset.data_root={scenes_root}']


def test_tool_keeps_unchanged_layers_and_restores_discarded_ones(tmp_path, scenes_root,
                                                                 monkeypatch,
                                                                 restore_default_scope):
    """One run of the tool with a faked Stage 1: layer 0's "alignment" scrambles its attention
    (it raises the training gap), the other layers' leaves them as copied (what
    ``--align-iters 0`` does: "the copied teacher layer, no alignment").  Layer 0 is discarded
    and its gap after is the teacher-initialised one; an unchanged layer is kept, not reported
    "(discarded)".  ``--resolution 32 16`` measures at H 32, W 16; the default config name is
    ``hybrid_<operator>_keep<k>.py``."""
    monkeypatch.setattr(torch, 'set_num_threads', lambda n: None)  # leave the thread count
    tool = _load_tool('layer_sensitivity')

    def fake_align(student, teacher, index, images, iters, lr, batch_size, seed):
        if index == 0:
            with torch.no_grad():
                for p in student.blocks[index].attn.parameters():
                    p.add_(torch.randn_like(p) * 5.0)
        return []

    monkeypatch.setattr(tool, 'align_layer', fake_align)
    result = tool.main(_tool_argv(tmp_path, scenes_root, '--align-iters', '0',
                                  '--resolution', '32', '16', '--keep', '1'))
    rows = result['sensitivity']
    assert [row['alignment_kept'] for row in rows] == [False, True, True, True]
    for row in rows:
        assert row['attn_gap'] == pytest.approx(row['attn_gap_before'], rel=1e-6)
    table_rows = [line for line in result['summary'].splitlines() if '(discarded)' in line]
    assert len(table_rows) == 1 and table_rows[0].startswith('| 0 |')
    assert result['costs']['resolution'] == [32, 16]
    assert result['config'] == str(tmp_path / 'work' / 'hybrid_elu_keep1.py')
    assert osp.isfile(result['config'])


@pytest.mark.parametrize('flags, named', [
    (['--stages-1-3', '--pareto-ks', '0', '9'], '--pareto-ks 9 is'),
    (['--stages-1-3', '--pareto-ks', '-1'], '--pareto-ks -1 is'), (['--keep', '5'], '--keep 5 is')])
def test_tool_refuses_budgets_outside_the_model_before_any_work(tmp_path, scenes_root,
                                                                monkeypatch,
                                                                restore_default_scope,
                                                                flags: List[str], named: str):
    """FINDING of round 17 (fixed in this round's copy of the tool): a 4-layer model has the
    hybrids k = 0..4.  ``--pareto-ks 9`` ended in a bare ``IndexError: list index out of
    range`` after every layer had been aligned and timed, and ``--pareto-ks -1`` silently
    trained the all-softmax hybrid under the label "keep -1"; ``--keep 5`` was refused only
    after the whole analysis.  Now each is refused by name before the first alignment (a
    faked Stage 1 that must never run proves it)."""
    monkeypatch.setattr(torch, 'set_num_threads', lambda n: None)
    tool = _load_tool('layer_sensitivity')

    def must_not_run(*args, **kwargs):
        raise AssertionError('the analysis started before the arguments were checked')

    monkeypatch.setattr(tool, 'align_layer', must_not_run)
    with pytest.raises(ValueError, match=rf'{named} out of range.*k = 0\.\.4'):
        tool.main(_tool_argv(tmp_path, scenes_root, *flags))


def test_written_config_uses_absolute_paths(tmp_path, monkeypatch):
    """Relative CONFIG and checkpoint paths are written absolute, so the config loads from any
    folder and points at the checkpoint the user named."""
    from mmengine.config import Config
    tool = _load_tool('layer_sensitivity')
    monkeypatch.chdir(ROOT)
    base = osp.relpath(load_script(str(ROOT / 'tools' / 'demo.py'),
                                   'demo_round17b').TEACHER_CFG, str(ROOT))
    chosen = dict(softmax_layers=[1], attn_cfg=['elu', 'softmax', 'elu', 'elu'])
    path = tool.write_config(str(tmp_path / 'out' / 'hybrid.py'), base, 'ckpt/teacher.pth',
                             chosen, 'line one\n\nline two')
    text = Path(path).read_text()
    assert '# line one\n#\n# line two\n' in text
    cfg = Config.fromfile(path)
    assert cfg.model.backbone.pretrained == str(ROOT / 'ckpt' / 'teacher.pth')
    assert cfg.model.backbone.attn_cfg == chosen['attn_cfg']
    assert cfg.model.backbone.type == 'mmlinvit.LinearVisionTransformer'


def test_a_config_without_a_backbone_is_named():
    from mmengine.config import Config
    tool = _load_tool('layer_sensitivity')
    with pytest.raises(ValueError, match=r"model.backbone.*model.type='Classifierless'"):
        tool.teacher_backbone_cfg(Config(dict(model=dict(type='Classifierless'))))


# ----------------------------------------------------------------------------- gaps
def test_feature_gap_puts_the_student_in_eval_mode():
    torch.manual_seed(0)
    teacher = VisionTransformer(TINY, attn_cfg='softmax', img_size=16, patch_size=8).train()
    student = VisionTransformer(TINY, attn_cfg='elu', img_size=16, patch_size=8).train()
    feature_gap(student, teacher, torch.randn(1, 3, 16, 16))
    assert not student.training and not teacher.training


def test_attention_stats_run_the_student_in_eval_mode():
    """A 3-block student with the teacher's weights and stochastic depth (0, 0.45, 0.9), left
    in training mode: evaluated in eval mode (as documented) it IS the teacher, every gap is
    exactly 0 (in training mode block 1's drop path would change block 2's input)."""
    arch = dict(TINY, num_layers=3)
    torch.manual_seed(0)
    teacher = VisionTransformer(arch, attn_cfg='softmax', img_size=16, patch_size=8).eval()
    student = VisionTransformer(arch, attn_cfg='softmax', img_size=16, patch_size=8,
                                drop_path_rate=0.9)
    student.load_state_dict(teacher.state_dict())
    student.train()
    torch.manual_seed(3)
    _, gaps = attention_output_stats(student, teacher, torch.randn(4, 3, 16, 16))
    assert gaps == [0.0, 0.0, 0.0]
    assert student.training


# ----------------------------------------------------------------------------- attention maps
def _tiny_vit(operator: str = 'softmax') -> VisionTransformer:
    return VisionTransformer(TINY, attn_cfg=operator, img_size=32, patch_size=8).eval()


@pytest.mark.parametrize('query', [(0, 4), (0, -1), (-1, 0)])
def test_queries_off_the_grid_are_refused(query: Tuple[int, int]):
    """A 4 x 4 grid: column 4 would be patch (1, 0), column -1 or row -1 a prefix / wrapped
    token; each is refused by name."""
    with pytest.raises(IndexError, match='outside the 4 x 4 patch grid'):
        query_attention_maps(_tiny_vit(), torch.randn(1, 3, 32, 32), query, [0])


def test_head_equal_to_the_head_count_is_refused_by_name():
    with pytest.raises(IndexError, match='head 2 is out of range for 2 heads'):
        query_attention_maps(_tiny_vit(), torch.randn(1, 3, 32, 32), (0, 0), [0], head=2)


def test_maps_are_float32_for_a_double_model():
    model = _tiny_vit().double()
    maps = query_attention_maps(model, torch.randn(1, 3, 32, 32, dtype=torch.float64), (1, 1),
                                [0])
    assert maps[0].dtype == torch.float32


def test_upsample_default_is_nearest_and_height_is_checked():
    """A 2 x 1 grid [0, 4] to 4 rows: nearest repeats each value twice (bilinear would give
    0, 1, 3, 4); a 2-row grid of 8-pixel patches does not cover 17 rows."""
    up = upsample_map(torch.tensor([[0.0], [4.0]]), (4, 1))
    torch.testing.assert_close(up.flatten(), torch.tensor([0.0, 0.0, 4.0, 4.0]))
    with pytest.raises(ValueError, match='does not cover a 17x8 image'):
        upsample_map(torch.zeros(2, 1), (17, 8), patch_size=8)


def test_unsuitable_models_get_type_errors_naming_the_fix():
    with pytest.raises(TypeError, match='use activation_similarity_maps for Adventurer'):
        am.capture_attention_inputs(nn.Linear(2, 2), torch.randn(1, 3, 8, 8), [0])
    layers_only = nn.Module()
    layers_only.layers = nn.ModuleList([nn.Identity()])
    with pytest.raises(TypeError, match='expect an Adventurer backbone'):
        am.activation_similarity_maps(layers_only, torch.randn(1, 3, 8, 8), (0, 0), [0])


# ----------------------------------------------------------------------------- curves
def test_read_scalars_names_bad_lines_and_skips_non_numbers(tmp_path):
    good = json.dumps(dict(loss=1.0, mode='train', extra=None, step=1))
    path = tmp_path / 'scalars.json'
    path.write_text(good + '\n')
    assert read_scalars(str(path)) == {'loss': ([1], [1.0])}
    path.write_text(good + '\n{"loss": 1.0, step}\n')
    with pytest.raises(ValueError, match=r'scalars.json:2 is not JSON'):
        read_scalars(str(path))
    for line in ('"step"', '[1, 2]'):
        path.write_text(line + '\n')
        with pytest.raises(ValueError, match=r'scalars.json:1 has no "step"'):
            read_scalars(str(path))


def test_loss_keys_are_sorted_after_the_total():
    series = {'distill.loss_b': ([1], [1.0]), 'lr': ([1], [0.1]), 'loss': ([1], [2.0]),
              'decode.loss_a': ([1], [1.0])}
    assert loss_keys(series) == ['loss', 'decode.loss_a', 'distill.loss_b']


@pytest.fixture
def closed_figures(monkeypatch) -> List:
    """The figures ``save_loss_curves`` closes (caught on their way to ``plt.close``)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    figures = []
    real_close = plt.close

    def close(fig=None):
        figures.append(fig)
        real_close(fig)

    monkeypatch.setattr(plt, 'close', close)
    return figures


def _yscales(tmp_path: Path, figures: List, name: str, values: List[float]) -> List[str]:
    """Y scales of the axes of ``save_loss_curves`` for one run of these ``loss`` values."""
    path = tmp_path / name / 'scalars.json'
    path.parent.mkdir(parents=True)
    path.write_text(''.join(json.dumps(dict(loss=v, step=i)) + '\n'
                            for i, v in enumerate(values)))
    png = tmp_path / 'png' / name / 'curves.png'
    save_loss_curves(str(png), {'run': str(path)})
    assert png.is_file()  # the folders are created
    return [ax.get_yscale() for ax in figures[-1].axes]


def test_log_scale_only_for_positive_values_spanning_more_than_a_decade(tmp_path,
                                                                         closed_figures):
    """Documented rule: positive terms spanning more than a decade.  1 -> 10 is exactly a
    decade (linear), 1 -> 11 more (log), -1 -> 20 not positive (linear), and a non-finite
    value does not count (inf, 1, 5: linear)."""
    assert _yscales(tmp_path, closed_figures, 'a', [1.0, 10.0]) == ['linear']
    assert _yscales(tmp_path, closed_figures, 'b', [1.0, 11.0]) == ['log']
    assert _yscales(tmp_path, closed_figures, 'c', [-1.0, 20.0]) == ['linear']
    assert _yscales(tmp_path, closed_figures, 'd', [float('inf'), 1.0, 5.0]) == ['linear']


def test_save_loss_curves_needs_a_run(tmp_path):
    with pytest.raises(ValueError, match='at least one run'):
        save_loss_curves(str(tmp_path / 'x.png'), {})


# ----------------------------------------------------------------------------- weight sweep
def _record(init: str, kind: str, weight: float, seed: int, score: float,
            operator: str = 'relu', iters: int = 3) -> dict:
    return dict(task='digits', init=init, kind=kind, weight=weight, seed=seed, iters=iters,
                operator=operator, score=score)


def test_raw_setting_builds_the_raw_loss_with_its_weight():
    loss = build_distill_loss(('raw', 50.0))
    assert type(loss) is AttentionOutputMSELoss and loss.loss_weight == 50.0


def test_tables_are_well_formed_markdown_with_a_dash_for_missing_cells():
    """Every separator row has as many columns as its header; a setting not run on an init
    shows '-'; the header names the iteration counts (3, 30) and the seeds (0, 1)."""
    results = [_record('random', 'none', 0.0, 0, 50.0), _record('random', 'raw', 50.0, 1, 70.0),
               _record('copy', 'none', 0.0, 0, 80.0, iters=30)]
    lines = summarise(results, sweep_settings([50], []), ['random', 'copy'], {}).splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith('| ')
               and i + 1 < len(lines) and lines[i + 1].startswith('|---')]
    assert len(headers) == 2  # the task table and the regret table
    for i in headers:
        assert lines[i + 1].count('|---') == len(_table_cells(lines[i]))
    assert '| Copy | **80.0** | - |' in lines
    assert any('over seeds [0, 1] (relu students, 3/30 iterations)' in line for line in lines)


def test_runs_of_different_operators_are_different_runs(tmp_path):
    path = tmp_path / 'results.jsonl'
    records = [_record('copy', 'raw', 50.0, 0, 1.0, operator='relu'),
               _record('copy', 'raw', 50.0, 0, 2.0, operator='elu')]
    path.write_text(''.join(json.dumps(r) + '\n' for r in records))
    assert sorted(r['score'] for r in load_results(str(path))) == [1.0, 2.0]


def test_sweep_tool_baseline_only_is_a_valid_sweep():
    tool = _load_tool('sweep_distill_weight')
    args = tool.parse_args(['--raw', '--normalized'])
    assert tool.settings_of(args) == [('none', 0.0)]


def test_sweep_tool_iterations_resume_and_operator(tmp_path, monkeypatch):
    """``--digits-iters 7`` reaches the run and its record; a second invocation finds the run
    in results.jsonl and trains nothing; a record of another operator stays out of the table
    (teacher and runs faked)."""
    tool = _load_tool('sweep_distill_weight')
    monkeypatch.setattr(torch, 'set_num_threads', lambda n: None)
    monkeypatch.setattr(tool, 'prepare_digits', lambda n, epochs: dict(
        teacher_score=90.0, teacher_attn_mean_square=[1.0]))
    calls = []

    def fake_run(data, init, loss, seed, operator, iters, batch):
        calls.append(iters)
        return dict(score=70.0, attn_rel_gap=0.1)

    monkeypatch.setattr(tool, 'run_digits', fake_run)
    work = tmp_path / 'sweep'
    work.mkdir()
    (work / 'results.jsonl').write_text(
        json.dumps(_record('copy', 'raw', 50.0, 0, 10.0, operator='elu', iters=7)) + '\n')
    argv = ['--tasks', 'digits', '--seeds', '0', '--inits', 'copy', '--raw', '50',
            '--normalized', '--no-baseline', '--digits-iters', '7', '--work-dir', str(work)]
    tables = tool.main(argv)
    assert calls == [7]
    records = [json.loads(line) for line in (work / 'results.jsonl').read_text().splitlines()]
    assert records[-1]['iters'] == 7 and records[-1]['operator'] == 'relu'
    assert '| Copy | **70.0** |' in tables.splitlines()
    tool.main(argv)
    assert calls == [7]


def test_scenes_config_carries_the_setting_init_and_seed(tmp_path):
    tool = _load_tool('sweep_distill_weight')
    info = dict(data_root=str(tmp_path / 'data'), teacher_backbone=str(tmp_path / 'b.pth'))
    cfg = tool.scenes_config(info, 'mlp_copy', ('normalized', 0.1), 3, 'elu', 4, 2,
                             str(tmp_path / 'runs'))
    loss = cfg.model.distill_losses['attn_out']['loss']
    assert loss['type'] == 'mmlinvit.NormalizedAttentionOutputMSELoss'
    assert loss['loss_weight'] == 0.1
    assert cfg.model.weight_transfer['type'] == 'mlp_copy'
    assert cfg.randomness['seed'] == 3
    assert cfg.model.student['backbone']['attn_cfg'] == 'elu'


# ----------------------------------------------------------------------------- visualize tool
def test_relative_block_of_a_one_block_model_is_the_last():
    assert _load_tool('visualize_attention').relative_block(0, 1, 12) == 11


def test_visualize_tool_student_checkpoints(tmp_path):
    """Two students, two checkpoints: each student loads its own; three paths for two students
    are refused."""
    tool = _load_tool('visualize_attention')
    paths = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        paths.append(str(tmp_path / f's{seed}.pth'))
        torch.save(tool.MODELS['tiny'].build_vit('elu').state_dict(), paths[-1])
    args = tool.parse_args(['--model', 'tiny', '--students', 'elu', 'elu', '--student-ckpt',
                            *paths])
    _, students = tool.build_vits(args)
    for student, path in zip(students, paths):
        saved = torch.load(path)
        torch.testing.assert_close(student.blocks[0].attn.qkv.weight,
                                   saved['blocks.0.attn.qkv.weight'], rtol=0, atol=0)
    with pytest.raises(SystemExit):
        tool.parse_args(['--students', 'elu', 'elu', '--student-ckpt', 'a', 'b', 'c'])


def test_visualize_tool_takes_negative_layers(tmp_path):
    tool = _load_tool('visualize_attention')
    out = tmp_path / 'maps.png'
    tool.main(['--model', 'tiny', '--image', 'scene', '--img-size', '32', '--layers', '-1',
               '--no-adventurer', '--out', str(out)])
    assert out.is_file()


# ----------------------------------------------------------------------------- operator setting
@pytest.fixture
def cls_only_ttt(monkeypatch) -> type:
    """TTT declaring only ``with_cls_token=(False, )`` (no ``out_type``)."""
    from mmlinvit.layers.attention import ATTENTION_OPERATORS
    ttt = ATTENTION_OPERATORS.get('ttt')
    monkeypatch.setattr(ttt, 'paper_backbone_setting', dict(with_cls_token=(False, )))
    return ttt


def test_class_token_fix_adds_average_pooling_when_out_type_is_undeclared(cls_only_ttt):
    """With a class token given, ``out_type`` resolves to 'cls_token', which needs it: the fix
    names ``out_type='avg_featmap'`` too (the documented default without a class token)."""
    with pytest.raises(ValueError, match=r"Build it with with_cls_token=False, "
                                         r"out_type='avg_featmap', i\.e\."):
        VisionTransformer(TINY, attn_cfg='ttt', img_size=32, patch_size=8, with_cls_token=True)


def test_operator_setting_warnings_point_at_the_callers_line(cls_only_ttt):
    """Both warnings (the applied setting; a deliberate deviation) are attributed to the line
    that builds the backbone, not to mmlinvit's own files."""
    for kwargs in (dict(), dict(with_cls_token=True, check_operator_setting=False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            VisionTransformer(TINY, attn_cfg='ttt', img_size=32, patch_size=8, **kwargs)
        ours = [w for w in caught if 'ttt' in str(w.message)]
        assert ours and all(w.filename == __file__ for w in ours), [
            (w.filename, str(w.message)[:60]) for w in ours]
