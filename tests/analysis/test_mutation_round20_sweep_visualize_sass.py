"""Mutation round 20 over the weight sweep, the attention-map tool and the SASS report.

Guards what rounds 10-17 left open, each against a reference written here (hand-worked numbers,
the documented defaults, plain file bytes, Matplotlib's own figure objects), never against
values pasted from the code under test:

* ``mmlinvit.analysis.distill_weight_sweep``: an empty results file and a last line cut inside
  a multi-byte character when resuming; an init without any run (row of dashes, no regret, no
  choice); a teacher without its attention statistics;
* ``tools/analysis/sweep_distill_weight.py``: the "nothing to run" check, the documented
  defaults, ``--threads``, ``--digits-iters 0``, records of another task kept out of the
  tables; the scenes config (no distillation terms for the baseline, the softmax teacher, the
  attention-output recorders, the student's preprocessor, no checkpoints, the warm-up length);
* ``tools/analysis/visualize_attention.py``: default images, a file wins over a photo name,
  centre crop of files, non-square scenes, unknown images, students right after
  linearization carry the teacher's weights, the centre query of a non-square grid, the
  default / negative layers, ``--no-adventurer``, the Adventurer's relative block, the
  title's weights, the comparison at the last layer, and the rendered overlays (query box,
  diverging colour map of signed maps and its symmetric bound);
* ``mmlinvit.analysis.sass_report``: one row per kernel even for equal code, recorded launches
  keep their keyword arguments.

Fixed in this round (each test failed before): ``--layers`` below ``-depth`` ended in a bare
``KeyError``; 16- and 8-bit signed / byte accesses were counted as 32-bit; a value repeated
on the sweep's command line was trained (and tabulated) twice.
"""
import json
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest
import torch

from mmlinvit.analysis import sass_report
from mmlinvit.analysis.compared_models import ComparedModel
from mmlinvit.analysis.distill_weight_sweep import (drop_partial_last_line, summarise,
                                                    sweep_settings)
from mmlinvit.utils.cli import load_script

ROOT = Path(__file__).resolve().parents[2]
TINY4 = ComparedModel('tiny4/16', dict(embed_dims=32, num_layers=4, num_heads=2,
                                       mlp_hidden_dims=64), 'deit',
                      dict(embed_dims=32, num_layers=2),
                      adventurer_mixer=dict(d_state=16, headdim=16))


def _load_tool(name: str) -> ModuleType:
    return load_script(str(ROOT / 'tools' / 'analysis' / f'{name}.py'), f'{name}_round20')


def _record(init: str, kind: str, weight: float, seed: int, score: float,
            task: str = 'digits', iters: int = 3) -> dict:
    return dict(task=task, init=init, kind=kind, weight=weight, seed=seed, iters=iters,
                operator='relu', score=score)


# ----------------------------------------------------------------------------- weight sweep
def test_empty_results_file_is_left_alone(tmp_path: Path) -> None:
    """Mutant D03: an empty results file (a sweep stopped before its first record) has no
    unfinished line: nothing is dropped (``None``) and the file stays."""
    path = tmp_path / 'results.jsonl'
    path.write_bytes(b'')
    assert drop_partial_last_line(str(path)) is None
    assert path.is_file() and path.read_bytes() == b''


def test_partial_line_cut_inside_a_multibyte_character(tmp_path: Path) -> None:
    """Mutant D04: a line cut between the two bytes of 'e-acute' is still dropped and reported
    (the lone lead byte as U+FFFD) instead of a UnicodeDecodeError that blocks the resume."""
    path = tmp_path / 'results.jsonl'
    whole = b'{"score": 1.0}\n'
    path.write_bytes(whole + b'{"note": "caf\xc3')
    assert drop_partial_last_line(str(path)) == '{"note": "caf\ufffd'
    assert path.read_bytes() == whole


def test_init_without_any_run_gets_dashes_and_no_choice() -> None:
    """Mutants D06 / D07: Random has no run at all, so its row is dashes, no setting ran on
    every init (no regret row) and no setting is chosen, instead of max() / min() of
    nothing."""
    results = [_record('copy', 'none', 0.0, 0, 80.0), _record('copy', 'raw', 50.0, 0, 90.0)]
    lines = summarise(results, sweep_settings([50], []), ['random', 'copy'], {}).splitlines()
    assert '| Random | - | - |' in lines
    assert '| Copy | 80.0 | **90.0** |' in lines
    assert not any(line.startswith('| w/o distill |') or line.startswith('| raw 50 |')
                   for line in lines)
    assert not any('smallest worst-task regret' in line for line in lines)


def test_teacher_without_attention_statistics() -> None:
    """Mutant D08: a teacher entry with only its score prints the score and an empty list."""
    tables = summarise([_record('copy', 'none', 0.0, 0, 80.0)], sweep_settings([], []),
                       ['copy'], {'digits': dict(teacher_score=91.5)})
    assert 'softmax teacher: 91.50; teacher attention-output mean square per block: \n' \
        in tables


# ----------------------------------------------------------------------------- sweep tool
def test_sweep_tool_refuses_an_empty_grid(capsys: pytest.CaptureFixture) -> None:
    """Mutant S01: no lambda and ``--no-baseline`` is refused up front."""
    tool = _load_tool('sweep_distill_weight')
    with pytest.raises(SystemExit):
        tool.parse_args(['--raw', '--normalized', '--no-baseline'])
    assert 'nothing to run' in capsys.readouterr().err


def test_sweep_tool_documented_defaults() -> None:
    """Mutants S02 / S03: the module docstring's lambdas (raw 5, 50, 500; normalised 0.1, 1,
    10), the README's seeds 0 1 2, both tasks, the four inits and one thread."""
    tool = _load_tool('sweep_distill_weight')
    assert '``--raw`` (5, 50, 500)' in tool.__doc__
    assert '``--normalized`` (0.1, 1, 10)' in tool.__doc__
    args = tool.parse_args([])
    assert args.raw == [5.0, 50.0, 500.0] and args.normalized == [0.1, 1.0, 10.0]
    assert args.seeds == [0, 1, 2] and args.tasks == ['digits', 'scenes']
    assert args.inits == ['random', 'copy', 'mlp_copy', 'full_copy']
    assert args.threads == 1 and not args.no_baseline


def _fake_digits(tool: ModuleType, monkeypatch: pytest.MonkeyPatch,
                 calls: List[Tuple[str, int]]) -> List[int]:
    """Teacher and runs of the digits task faked; returns the thread counts set."""
    threads: List[int] = []
    monkeypatch.setattr(torch, 'set_num_threads', threads.append)
    monkeypatch.setattr(tool, 'prepare_digits', lambda n, epochs: dict(
        teacher_score=90.0, teacher_attn_mean_square=[1.0]))

    def fake_run(data, init, loss, seed, operator, iters, batch):
        calls.append((init, iters))
        return dict(score=70.0, attn_rel_gap=0.1)

    monkeypatch.setattr(tool, 'run_digits', fake_run)
    return threads


def test_sweep_tool_threads_zero_steps_and_other_tasks(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants S04 / S05 / S14: ``--threads 3`` reaches torch; ``--digits-iters 0`` trains 0
    steps (not the plan's 3); a scenes record already in results.jsonl stays out of a
    digits-only invocation's tables (no scenes table, no scenes regret column), even when
    its seed, init, setting, length and operator match this grid."""
    tool = _load_tool('sweep_distill_weight')
    calls: List[Tuple[str, int]] = []
    threads = _fake_digits(tool, monkeypatch, calls)
    work = tmp_path / 'sweep'
    work.mkdir()
    (work / 'results.jsonl').write_text(
        json.dumps(_record('copy', 'none', 0.0, 0, 12.0, task='scenes',
                           iters=tool.PLANS['quick']['scenes_iters'])) + '\n')
    tables = tool.main(['--quick', '--tasks', 'digits', '--seeds', '0', '--inits', 'copy',
                        '--raw', '--normalized', '--digits-iters', '0', '--threads', '3',
                        '--work-dir', str(work)])
    assert threads == [3]
    assert calls == [('copy', 0)]
    assert 'scenes' not in tables
    assert '| setting | digits | worst task |' in tables.splitlines()


def _scenes_cfg(tool: ModuleType, tmp_path: Path, setting: Tuple[str, float], iters: int = 20):
    info = dict(data_root=str(tmp_path / 'data'), teacher_backbone=str(tmp_path / 'b.pth'))
    return tool.scenes_config(info, 'copy', setting, 0, 'relu', iters, 2,
                              str(tmp_path / 'runs')), info


def test_scenes_config_of_the_baseline_and_a_distilled_run(tmp_path: Path) -> None:
    """Mutants S07-S12: the baseline has no recorders and no distillation terms; the teacher
    is the softmax ViT loading the exported backbone; the distilled run records the output of
    every block's ``attn`` module (the attention output of the loss) in both models; the
    DistillationModel gets the student's own data preprocessor; no checkpoint hook; the
    warm-up is a tenth of the iterations (20 -> 2), then the poly decay to the end."""
    tool = _load_tool('sweep_distill_weight')
    cfg, info = _scenes_cfg(tool, tmp_path, ('none', 0.0))
    for key in ('student_recorders', 'teacher_recorders', 'distill_losses'):
        assert key not in cfg.model
    teacher = cfg.model.teacher
    assert teacher['type'] == 'mmlinvit.VisionTransformer'
    assert teacher['attn_cfg'] == 'softmax'
    assert teacher['pretrained'] == info['teacher_backbone']
    assert cfg.model.data_preprocessor == cfg.model.student['data_preprocessor']
    assert cfg.default_hooks.checkpoint is None
    schedulers = {s['type']: s for s in cfg.param_scheduler}
    assert schedulers['LinearLR']['end'] == 2 and schedulers['PolyLR']['begin'] == 2
    assert schedulers['PolyLR']['end'] == 20
    cfg, _ = _scenes_cfg(tool, tmp_path, ('raw', 5.0))
    assert cfg.model.student_recorders['attn_out']['source'] == 'backbone.blocks.{i}.attn'
    assert cfg.model.teacher_recorders['attn_out']['source'] == 'blocks.{i}.attn'
    assert cfg.model.distill_losses['attn_out']['loss'] == dict(
        type='mmlinvit.AttentionOutputMSELoss', loss_weight=5.0)


# ----------------------------------------------------------------------------- visualize tool
def test_visualize_default_images_are_the_documented_photos() -> None:
    """Mutant V01: the docstring's default ``astronaut chelsea``."""
    tool = _load_tool('visualize_attention')
    assert 'the default is\n``astronaut chelsea``' in tool.__doc__
    assert tool.parse_args([]).image == ['astronaut', 'chelsea']


def _write_png(path: Path, pixels: np.ndarray) -> None:
    from PIL import Image
    Image.fromarray(pixels).save(path, format='PNG')


def test_load_image_files_photos_scenes_and_errors(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants V02-V05: an existing file named like a photo wins (its solid colour comes
    back); a 20 x 40 file is centre-cropped to its middle 20 x 20 (green columns 10-29
    between red and blue) before the resize; a 24 x 40 scene is 24 rows high; an unknown
    name is a FileNotFoundError."""
    tool = _load_tool('visualize_attention')
    monkeypatch.chdir(tmp_path)
    _write_png(tmp_path / 'coffee', np.full((12, 12, 3), (10, 200, 30), dtype=np.uint8))
    image, caption = tool.load_image('coffee', (8, 8), 0)
    assert caption == 'coffee' and image.shape == (8, 8, 3)
    assert (image.reshape(-1, 3) == (10, 200, 30)).all()
    wide = np.zeros((20, 40, 3), dtype=np.uint8)
    wide[:, :10, 0] = 255
    wide[:, 10:30, 1] = 255
    wide[:, 30:, 2] = 255
    _write_png(tmp_path / 'wide.png', wide)
    image, caption = tool.load_image(str(tmp_path / 'wide.png'), (16, 16), 0)
    assert caption == 'wide.png' and image.shape == (16, 16, 3)
    assert (image[..., 1] >= 250).all() and (image[..., [0, 2]] <= 5).all()
    scene, caption = tool.load_image('scene', (24, 40), 0)
    assert scene.shape == (24, 40, 3) and caption == 'generated scene'
    with pytest.raises(FileNotFoundError, match='neither an existing file'):
        tool.load_image('no_such_photo', (8, 8), 0)


def test_students_without_checkpoint_carry_the_teacher_weights() -> None:
    """Mutant V06: with no ``--student-ckpt`` the students are the teacher right after
    linearization: every parameter equals the teacher's (the operator-name buffers differ)."""
    tool = _load_tool('visualize_attention')
    torch.manual_seed(0)
    teacher, students = tool.build_vits(tool.parse_args(['--model', 'tiny', '--students',
                                                         'elu']))
    student_params = dict(students[0].named_parameters())
    teacher_params = dict(teacher.named_parameters())
    assert set(student_params) == set(teacher_params)
    for name, value in teacher_params.items():
        torch.testing.assert_close(student_params[name], value, rtol=0, atol=0)


def test_default_query_of_a_non_square_grid() -> None:
    """Mutant V07: 40 x 64 pixels, patch 16 -> a corner-padded grid of ceil(40/16) = 3 rows
    and 4 columns; the centre is (3 // 2, 4 // 2) = (1, 2)."""
    assert _load_tool('visualize_attention').default_query((40, 64), 16) == (1, 2)


def _captured_main(tool: ModuleType, monkeypatch: pytest.MonkeyPatch, argv: List[str]) -> dict:
    """Runs ``main`` on the 4-block tiny model with ``render`` and the comparison captured."""
    monkeypatch.setitem(tool.MODELS, 'tiny4', TINY4)
    seen: Dict[str, Any] = {}

    def render(images, captions, columns, layers, query, patch, path, title):
        seen.update(columns=columns, layers=layers, title=title)

    def compare(teacher, student, images, query, layer):
        seen['compare_layer'] = layer
        return None

    monkeypatch.setattr(tool, 'render', render)
    monkeypatch.setattr(tool, 'compare_teacher_student', compare)
    monkeypatch.setattr(tool, 'save_teacher_student_figure', lambda *a, **k: None)
    tool.main(['--model', 'tiny4', '--image', 'scene', '--img-size', '32', *argv])
    return seen


def test_visualize_main_layers_columns_and_comparison(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants V08-V10 / V15: 4 blocks -> default layers {0, 4 // 2, 3} = [0, 2, 3];
    ``--layers -1 -4`` are blocks 3 and 0; ``--no-adventurer`` leaves only the teacher and
    student columns; the comparison is taken at the last shown layer; random weights are
    named in the title."""
    tool = _load_tool('visualize_attention')
    seen = _captured_main(tool, monkeypatch, ['--no-adventurer', '--compare-out',
                                              str(tmp_path / 'cmp.png')])
    assert seen['layers'] == [0, 2, 3]
    assert [name for name, _ in seen['columns']] == ['softmax (teacher)',
                                                     'elu (student, implied)']
    assert seen['compare_layer'] == 3
    assert 'random weights' in seen['title']
    seen = _captured_main(tool, monkeypatch, ['--no-adventurer', '--layers', '-1', '-4'])
    assert seen['layers'] == [3, 0]
    assert sorted(seen['columns'][0][1]) == [0, 3]


def test_visualize_layers_below_minus_depth_are_refused_clearly(tmp_path: Path) -> None:
    """FINDING (fails on the code before the fix): ``--layers -3`` on a 2-block model was
    shifted once to -1, which ``query_attention_maps`` resolves to block 1 (its maps keyed
    1), and ``render`` then looked up -1: ``KeyError: -1``.  Like ``--layers 5`` (and like
    mmlinvit's own ``resolve_out_indices``), it must name the entry and the depth."""
    tool = _load_tool('visualize_attention')
    with pytest.raises(IndexError, match='layers entry -3 is out of range for 2 layers'):
        tool.main(['--model', 'tiny', '--image', 'scene', '--img-size', '32',
                   '--no-adventurer', '--layers', '-3', '--out', str(tmp_path / 'x.png')])


def test_visualize_adventurer_block_at_the_same_relative_depth(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant V16: ViT layers 0, 2, 3 of 4 sit at depths 0, 2/3, 1; of the 2-block Adventurer
    that is blocks round(0), round(2/3), round(1) = 0, 1, 1."""
    tool = _load_tool('visualize_attention')
    seen = _captured_main(tool, monkeypatch, [])
    name, maps = seen['columns'][-1]
    assert name == 'Adventurer cos-sim'
    assert {layer: suffix for layer, (_, suffix) in maps.items()} == {
        0: ' (block 0)', 2: ' (block 1)', 3: ' (block 1)'}


def test_visualize_title_names_student_checkpoints(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant V11: a student checkpoint alone makes the maps 'checkpoints', not random."""
    tool = _load_tool('visualize_attention')
    ckpt = tmp_path / 'student.pth'
    torch.save(TINY4.build_vit('elu').state_dict(), ckpt)
    seen = _captured_main(tool, monkeypatch, ['--no-adventurer', '--student-ckpt', str(ckpt)])
    assert 'checkpoints' in seen['title'] and 'random' not in seen['title']


def test_render_query_box_and_colour_maps(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants V12-V14: the query box of (row 0, col 1) starts at x = 1 * 16, y = 0; a map with
    values in [-1, 3] is signed: coolwarm with the symmetric bound 3; a map with minimum 0 is
    unsigned: inferno from 0 to its maximum."""
    import matplotlib.pyplot as plt
    tool = _load_tool('visualize_attention')
    figures = []
    real_close = plt.close
    monkeypatch.setattr(plt, 'close', figures.append)
    image = np.zeros((32, 32, 3), dtype=np.uint8)
    signed = torch.tensor([[[-1.0, 3.0], [0.0, 1.0]]])
    unsigned = torch.tensor([[[0.0, 2.0], [0.5, 1.0]]])
    columns = [('signed', {0: (signed, '')}), ('plain', {0: (unsigned, '')})]
    tool.render([image], ['img'], columns, [0], (0, 1), 16, str(tmp_path / 'r.png'), 'title')
    fig = figures[0]
    try:
        axes = fig.axes
        assert axes[0].patches[0].get_xy() == (16, 0)
        assert axes[1].get_title() == 'signed (signed)'
        assert axes[1].images[1].get_cmap().name == 'coolwarm'
        assert axes[1].images[1].get_clim() == (-3.0, 3.0)
        assert axes[2].get_title() == 'plain'
        assert axes[2].images[1].get_cmap().name == 'inferno'
        assert axes[2].images[1].get_clim() == (0.0, 2.0)
    finally:
        real_close(fig)


# ----------------------------------------------------------------------------- sass report
def test_compile_launches_keeps_kernels_with_equal_code_apart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant A01: two kernels whose summaries happen to be equal are two rows."""
    monkeypatch.setattr(sass_report, 'sass_summary',
                        lambda cubin: dict(regs=32, stack=0, counts={'LDG.128': 1}))

    def kernel(name: str) -> SimpleNamespace:
        return SimpleNamespace(__name__=name, warmup=lambda *a, grid, **k: SimpleNamespace(
            asm={'cubin': b''}))

    rows = sass_report.compile_launches([(kernel('_a'), (1, ), (), {}),
                                         (kernel('_b'), (1, ), (), {})])
    assert [r['kernel'] for r in rows] == ['_a', '_b']


def _toy_kernel(X, BLOCK):
    pass


def test_recorded_launches_keep_grid_args_and_kwargs() -> None:
    """Mutant A02: a launch ``kernel[grid](*args, **kwargs)`` of a Triton ``JITFunction`` is
    recorded whole (built directly: the test session may run Triton's interpreter)."""
    pytest.importorskip('triton')
    from triton.runtime.jit import JITFunction
    fn = JITFunction(_toy_kernel)
    with sass_report.recorded_launches() as launches:
        fn[(2, 3)](1, 'x', BLOCK=16)
    assert launches == [(fn, (2, 3), (1, 'x'), {'BLOCK': 16})]


def test_narrow_signed_and_byte_accesses_are_not_counted_as_32_bit(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``LDG.E.S16`` / ``LDG.E.U8`` / ``STG.E.S8`` move 2 and 1 bytes; the plain ``LDG`` /
    ``STG`` counts are documented as the 32-bit accesses (they took these three)."""
    import tempfile

    from test_mutation_round13_figures import _fake_cuobjdump
    sass = ('        /*0010*/   LDG.E.S16 R2, desc[UR4][R2.64] ;\n'
            '        /*0020*/   LDG.E.U8 R3, desc[UR4][R4.64] ;\n'
            '        /*0030*/   STG.E.S8 desc[UR4][R6.64], R5 ;\n'
            '        /*0040*/   LDG.E R7, desc[UR4][R8.64] ;\n')
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    monkeypatch.setattr(sass_report, '_cuobjdump', _fake_cuobjdump('REG:16 STACK:0', sass))
    assert sass_report.sass_summary(b'cubin bytes')['counts'] == {
        'LDG': 1, 'LDG.S16': 1, 'LDG.U8': 1, 'STG.S8': 1}


def test_a_repeated_sweep_value_runs_and_tabulates_once(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``--seeds 0 0 --inits copy copy --raw 50 50`` trained each run twice (the finished
    runs are read once, before the loop) and gave the table a second ``raw 50`` row; one
    run and one row each now."""
    tool = _load_tool('sweep_distill_weight')
    calls: List[Tuple[str, int]] = []
    _fake_digits(tool, monkeypatch, calls)
    work = tmp_path / 'sweep'
    tables = tool.main(['--quick', '--tasks', 'digits', 'digits', '--seeds', '0', '0',
                        '--inits', 'copy', 'copy', '--raw', '50', '50', '--normalized',
                        '--no-baseline', '--work-dir', str(work)])
    assert len(calls) == 1
    assert len((work / 'results.jsonl').read_text().splitlines()) == 1
    assert sum(line.startswith('| raw 50 ') for line in tables.splitlines()) == 1
