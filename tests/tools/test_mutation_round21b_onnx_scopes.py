"""Mutation round 21 (second pass): the ONNX export tools, config scopes, log forwarding,
conversion reports, checkpoint file checks and the tools' error exits, on branches that
``test_mutation_round21_tools_scopes_export.py`` and the earlier rounds left open.  Each test
below failed on at least one single-line change of these modules that the rest of the suite
let pass.

Guarded here, each against an independent reference (mmengine's ``Config`` / ``MMLogger``,
files written by ``torch.save`` / ``safetensors`` and read back by their own readers, Python's
``logging`` / ``inspect`` / import semantics, or values written out by hand):

* ``tools/train.py`` / ``tools/test.py``: a ``mmlinvit::`` base read from configs that are not
  installed, and a config the flags cannot apply to, are one ``error:`` line (SystemExit),
  not a traceback;
* ``tools/model_converters``: ``export_student.py`` prints "..." only past 12 dropped keys and
  exits 1 on a refused file;
* ``tools/deployment``: the patch-size check of a segmentor export (refused shape, next
  multiple named) vs the in-graph padding note of a classifier / backbone, the closest-prefix
  message of a refused checkpoint (ties: the first candidate), ``max_abs_errors``'s refusals,
  the log level of a teacher export and the random-teacher note filter, ``none`` in any
  case, an error exactly at the tolerance passing, only a REQUIRED ``batch_data_samples``
  blocking a whole export, an int crop size being square, the benchmark's reference
  magnitude over all outputs;
* ``log_forwarding``: the INFO level of the load-report logger (a level a user set kept), no
  failure when an application removed Python's last-resort handler;
* ``config_scopes`` / ``_config_scope_hook`` / ``registry``: the first installed
  distribution wins, the OneDL forks first, a scope with nothing installed left alone,
  ``mmlinvit::`` bases tagged with their declared ``default_scope`` (none: untagged) and
  nothing else touched, the wrapper installed once, the hook first on ``sys.meta_path``, two
  hooks not asking each other without end, ``_register`` importing the scopes module, the
  model registry importing the models on first lookup (fresh interpreters);
* ``converters.report`` / ``checkpoint_file``: CLIP ``resblocks`` grouping, the loaded count,
  the reason of a key skipped by a non-strict load, ``to_dict`` of set-aside tensors (plain
  data for ``weights_only=True``), 0- and 1-byte files, the first 8 bytes of an unknown
  file, legacy files of pickle protocol 2 and 4 (written by torch).

FINDING (failed on the previous code):
``test_a_safetensors_header_of_no_json_object_is_named``: a ``.safetensors`` file whose
header is empty or no JSON object passes ``checkpoint_file_problem`` although the
safetensors reader refuses it.
"""
import logging
import os.path as osp
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest
import torch

from mmlinvit.converters.checkpoint_file import checkpoint_file_problem
from mmlinvit.converters.report import ConversionReport, summarise_keys
from mmlinvit.utils.cli import load_script

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
pytestmark = pytest.mark.usefixtures('restore_globals')
CONVERTERS = osp.join(REPO, 'tools', 'model_converters')
DEMO = osp.join(REPO, 'configs', 'demo', 'upernet_vit-tiny-softmax_1xb8-300it_toy-64x64.py')


def _tool(path: str, name: str) -> Any:
    """A tool script loaded as a module under a name of this file."""
    return load_script(path, f'round21b_{name}')


# --------------------------------------------------------------------- train.py / test.py


def _configs_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``mmlinvit_config_root`` as on a checkout that was only put on PYTHONPATH."""
    from mmlinvit import config_scopes

    def root() -> str:
        raise config_scopes.ConfigsNotInstalledError('round21b: configs are not installed')

    monkeypatch.setattr(config_scopes, 'mmlinvit_config_root', root)


@pytest.mark.parametrize('script', ['train.py', 'test.py'])
def test_tools_turn_configs_not_installed_into_one_error_line(
        script: str, clean_launch_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A config inheriting ``mmlinvit::`` bases read where the configs are not installed
    exits with ``error: <the explanation>``, through mmengine's real ``Config.fromfile``."""
    _configs_not_installed(clean_launch_env)
    cfg = tmp_path / 'child.py'
    cfg.write_text("_base_ = ['mmlinvit::demo/upernet_vit-tiny-softmax_1xb8-300it_toy-64x64.py']"
                   '\n')
    tool = _tool(osp.join(REPO, 'tools', script), script[:-3])
    argv = [str(cfg)] if script == 'train.py' else [str(cfg), 'ckpt.pth']
    with pytest.raises(SystemExit) as exc:
        tool.main(argv)
    assert exc.value.code == 'error: round21b: configs are not installed'


def test_train_tool_turns_a_config_value_error_into_one_error_line(
        clean_launch_env: pytest.MonkeyPatch) -> None:
    """``prepare_train_config`` refusing the flags (ValueError) is an ``error:`` exit."""
    tool = _tool(osp.join(REPO, 'tools', 'train.py'), 'train_value_error')

    def refuse(cfg: Any, path: str, **kwargs: Any) -> None:
        raise ValueError('round21b: cannot resume')

    clean_launch_env.setattr(tool, 'prepare_train_config', refuse)
    clean_launch_env.setattr(tool, 'build_runner', lambda cfg, mode: pytest.fail('built'))
    with pytest.raises(SystemExit) as exc:
        tool.main([DEMO])
    assert exc.value.code == 'error: round21b: cannot resume'


# ------------------------------------------------------------------------ model converters


def _run_file_with_dropped(count: int) -> Dict[str, torch.Tensor]:
    weight = torch.zeros(2)
    state = {'student.backbone.w': weight}
    state.update({f'teacher.k{i:02d}': weight for i in range(count)})
    return dict(state_dict=state)


@pytest.mark.parametrize('count', [12, 13])
def test_export_student_lists_twelve_dropped_keys_without_dots(
        count: int, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The dropped keys are listed up to 12; "..." marks that more were left out, so exactly
    12 need none."""
    tool = _tool(osp.join(CONVERTERS, 'export_student.py'), f'export_student_{count}')
    src = tmp_path / 'run.pth'
    torch.save(_run_file_with_dropped(count), str(src))
    assert tool.main([str(src), str(tmp_path / 'out.pth')]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    shown = ', '.join(f'teacher.k{i:02d}' for i in range(12))
    expected = (f"kept the 1 tensors under 'student.backbone.'; dropped {count}: {shown}"
                + (' ...' if count > 12 else ''))
    assert first == expected


def test_export_student_refused_file_exits_1(tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    """A file without student keys is an ``error:`` line and exit status 1, no output."""
    tool = _tool(osp.join(CONVERTERS, 'export_student.py'), 'export_student_refused')
    src = tmp_path / 'run.pth'
    torch.save(dict(state_dict={'teacher.w': torch.zeros(2)}), str(src))
    dst = tmp_path / 'out.pth'
    assert tool.main([str(src), str(dst)]) == 1
    assert capsys.readouterr().err.startswith('error: ')
    assert not dst.exists()


# ------------------------------------------------------------------------------ deployment


class _Identity(torch.nn.Module):
    """One output: the input itself."""

    def forward(self, images: torch.Tensor) -> Any:
        return (images, )


def _fake_build(export_tool: Any, monkeypatch: pytest.MonkeyPatch,
                pads_outside_backbone: bool) -> None:
    """``main`` without a config: a module of patch 8 whose export writes no file."""
    info = dict(crop=(8, 8), pads_outside_backbone=pads_outside_backbone, patch_size=8,
                which='student', part='model', model='M', backbone='B',
                input=dict(prepare='as is'))
    monkeypatch.setattr(export_tool, 'build_export_module',
                        lambda *args, **kwargs: (_Identity(), dict(info)))
    monkeypatch.setattr(export_tool, 'export_onnx', lambda module, images, out, opset: ['out0'])
    monkeypatch.setattr(export_tool, 'write_onnx_metadata', lambda path, entries: None)


def test_a_segmentor_shape_off_the_patch_grid_is_refused(export_tool: Any,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    """A segmentor pads outside the graph: ``--shape`` off the patch grid is an ``error:``
    naming the next multiple (``check_export_shape``); a backbone / classifier pads inside
    the graph, so the same shape only prints a note and exports."""
    _fake_build(export_tool, monkeypatch, pads_outside_backbone=True)
    out = str(tmp_path / 'm.onnx')
    with pytest.raises(SystemExit) as exc:
        export_tool.main(['cfg.py', 'none', '--shape', '12', '16', '--out', out, '--no-check'])
    assert str(exc.value.code).startswith('error: --shape 12 16 is not a multiple of the '
                                          'patch size 8')
    assert '--shape 16 16' in str(exc.value.code)
    # on the grid: exported
    info = export_tool.main(['cfg.py', 'none', '--shape', '16', '8', '--out', out,
                             '--no-check'])
    assert info['shape'] == [1, 3, 16, 8]
    assert 'note:' not in capsys.readouterr().out
    _fake_build(export_tool, monkeypatch, pads_outside_backbone=False)
    info = export_tool.main(['cfg.py', 'none', '--shape', '12', '16', '--out', out,
                             '--no-check'])
    assert info['shape'] == [1, 3, 12, 16]
    assert 'note: 12x16 is not a multiple of the patch size 8' in capsys.readouterr().out


def test_closest_prefix_of_a_tie_is_the_first_candidate(onnx_tools: Any,
                                                         tmp_path: Path) -> None:
    """Two prefixes equally close: the message names the one tried first (``'backbone.'``
    before ``'student.'``) with its missing keys, written out by hand."""
    module = torch.nn.Linear(2, 2)
    path = str(tmp_path / 'w.pth')
    torch.save({'backbone.weight': torch.zeros(2, 2), 'student.bias': torch.zeros(2)}, path)
    with pytest.raises(KeyError) as exc:
        onnx_tools.load_weights(module, path, 'model')
    assert ("closest key prefix 'backbone.' misses ['bias'] and has unexpected []"
            in str(exc.value))


def test_max_abs_errors_refuses_other_counts_and_shapes(onnx_tools: Any) -> None:
    """Outputs are compared one to one: another count or another shape is a ValueError
    (broadcasting (2, 1) against (2, 3) would give a number)."""
    a = torch.zeros(2, 3)
    with pytest.raises(ValueError, match='1 onnxruntime outputs vs 2 PyTorch outputs'):
        onnx_tools.max_abs_errors([a], [a, a])
    with pytest.raises(ValueError, match=r'output 1: onnxruntime shape \(2, 1\) vs PyTorch '
                                         r'\(2, 3\)'):
        onnx_tools.max_abs_errors([a, torch.zeros(2, 1)], [a, a])
    assert onnx_tools.max_abs_errors([a, a + 0.5], [a, a - 0.25]) == [0.0, 0.75]


DISTILL_CLS = osp.join(REPO, 'configs', 'copy_mlp_distill_attn',
                       'copy-mlp-distill-attn_deit-t-elu_8xb64-300e_cifar10-224x224.py')


def test_export_log_levels_and_the_random_teacher_note(onnx_tools: Any, tmp_path: Path) -> None:
    """The distillation teacher says it keeps its random initialisation when built without
    weights (export with ``checkpoint=None``); with the export's checkpoint that note is
    dropped.  "Exporting ... with the weights of" is a WARNING for the teacher (a softmax
    teacher deployed from a distillation config is unusual)."""
    from mmengine.logging import MMLogger
    records: List[Any] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        module, _ = onnx_tools.build_export_module(DISTILL_CLS, None, which='teacher')
        note = [r for r in records
                if r.getMessage().startswith(onnx_tools.RANDOM_TEACHER_NOTE)]
        assert len(note) == 1 and note[0].levelno == logging.WARNING
        teacher_file = str(tmp_path / 'teacher.pth')
        torch.save(module.backbone.state_dict(), teacher_file)

        records.clear()
        onnx_tools.build_export_module(DISTILL_CLS, teacher_file, which='teacher')
        assert not [r for r in records
                    if r.getMessage().startswith(onnx_tools.RANDOM_TEACHER_NOTE)]
        export = [r for r in records if r.getMessage().startswith('Exporting the')]
        assert [(r.levelno, r.getMessage()) for r in export] == [
            (logging.WARNING, f'Exporting the teacher backbone with the weights of '
                              f'{teacher_file}')]
    finally:
        logger.removeHandler(handler)


# ------------------------------------------------------------------------- log forwarding


def test_the_load_report_logger_is_set_to_info_unless_a_level_was_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Documented: the loggers of ``INFO_LOGGERS`` are set to INFO when no level was set on
    them (so their INFO records pass Python's level test); a level a user set is kept."""
    from mmlinvit import log_forwarding
    name = log_forwarding.INFO_LOGGERS[0]
    assert name == 'mmlinvit.converters.loading'
    logger = logging.getLogger(name)
    monkeypatch.setattr(logger, 'level', logging.NOTSET)
    log_forwarding.install()
    assert logger.level == logging.INFO
    assert logger.isEnabledFor(logging.INFO) and not logger.isEnabledFor(logging.DEBUG)
    monkeypatch.setattr(logger, 'level', logging.ERROR)
    log_forwarding.install()
    assert logger.level == logging.ERROR


# -------------------------------------------------------------------------- config scopes


def test_the_first_installed_candidate_wins() -> None:
    """A missing candidate is skipped, not the end of the search (pip metadata read here)."""
    from importlib.metadata import version
    from mmlinvit.config_scopes import installed_distribution
    version('torch')  # installed: the reference
    assert installed_distribution(('round21b-no-such-distribution', 'torch')) == 'torch'
    assert installed_distribution(('round21b-no-such-distribution', )) is None


def test_the_onedl_forks_are_preferred() -> None:
    """Documented: the OneDL forks (the pinned stack) come first, the upstream names after."""
    from mmlinvit.config_scopes import SCOPE_DISTRIBUTIONS
    assert SCOPE_DISTRIBUTIONS['mmseg'] == ('onedl-mmsegmentation', 'mmsegmentation')
    assert SCOPE_DISTRIBUTIONS['mmpretrain'] == ('onedl-mmpretrain', 'mmpretrain')
    assert SCOPE_DISTRIBUTIONS['mmdet'] == ('onedl-mmdetection', 'mmdet')


def test_a_scope_without_installed_distribution_is_left_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A scope none of whose candidates is installed keeps mmengine's own entry (so its
    "X is not installed" error names the upstream package) and is not reported."""
    from mmengine.config import utils as config_utils
    from mmlinvit import config_scopes
    monkeypatch.setitem(config_scopes.SCOPE_DISTRIBUTIONS, 'round21b',
                        ('round21b-no-such-distribution', ))
    monkeypatch.setitem(config_utils.MODULE2PACKAGE, 'round21b', 'round21b-upstream')
    registered = config_scopes.register_config_scopes()
    assert 'round21b' not in registered
    assert config_utils.MODULE2PACKAGE['round21b'] == 'round21b-upstream'


def test_mmlinvit_bases_take_the_scope_their_file_declares(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The ``_get_cfg_path`` wrapper tags a ``mmlinvit::`` base with the ``default_scope`` it
    declares (read by mmengine's ``Config``), leaves one without it untagged (None), and
    hands every other path to mmengine's function unchanged."""
    from mmlinvit import config_scopes
    monkeypatch.setattr(config_scopes, 'mmlinvit_config_root', lambda: str(tmp_path))
    declared = tmp_path / 'declared.py'
    declared.write_text("default_scope = 'mmpretrain'\nmodel = dict(type='X')\n")
    plain = tmp_path / 'plain.py'
    plain.write_text("model = dict(type='X')\n")
    files = {'mmlinvit::declared.py': str(declared), 'mmlinvit::plain.py': str(plain),
             'mmseg::x.py': 'mmseg-file', 'mmlinvit_local.py': 'local-file',
             'mmlinvitx::y.py': 'other-scope-file'}
    calls: List[str] = []

    def original(cfg_path: str, filename: str) -> Any:
        calls.append(cfg_path)
        return files[cfg_path], 'from-mmengine'

    wrapped = config_scopes._wrap_get_cfg_path(original)
    assert wrapped('mmlinvit::declared.py', 'child.py') == (str(declared), 'mmpretrain')
    assert wrapped('mmlinvit::plain.py', 'child.py') == (str(plain), None)
    assert wrapped('mmseg::x.py', 'child.py') == ('mmseg-file', 'from-mmengine')
    # a plain relative base and another scope that only start with the name are not ours
    assert wrapped('mmlinvit_local.py', 'child.py') == ('local-file', 'from-mmengine')
    assert wrapped('mmlinvitx::y.py', 'child.py') == ('other-scope-file', 'from-mmengine')
    assert calls == ['mmlinvit::declared.py', 'mmlinvit::plain.py', 'mmseg::x.py',
                     'mmlinvit_local.py', 'mmlinvitx::y.py']


def test_registering_twice_wraps_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Idempotent: a second call keeps the wrapper in place (no wrapper of a wrapper)."""
    from mmengine.config import Config
    from mmlinvit import config_scopes
    monkeypatch.setattr(Config, '_get_cfg_path', Config.__dict__['_get_cfg_path'])
    config_scopes.register_config_scopes()
    first = Config.__dict__['_get_cfg_path'].__func__
    config_scopes.register_config_scopes()
    assert Config.__dict__['_get_cfg_path'].__func__ is first
    inner = getattr(first, config_scopes._WRAPPED_MARK)
    assert not hasattr(inner, config_scopes._WRAPPED_MARK)


# ----------------------------------------------------------------------- import hook


def test_the_hook_goes_first_on_the_meta_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed before ``mmengine.config`` is imported, the finder is put FIRST on
    ``sys.meta_path`` (after the path finder it would never be asked: that one finds
    ``mmengine.config`` itself)."""
    from mmlinvit import _config_scope_hook
    monkeypatch.delitem(sys.modules, _config_scope_hook._TRIGGER)
    without = [f for f in sys.meta_path
               if not isinstance(f, _config_scope_hook.ConfigScopeFinder)]
    monkeypatch.setattr(sys, 'meta_path', list(without))
    _config_scope_hook.install()
    assert isinstance(sys.meta_path[0], _config_scope_hook.ConfigScopeFinder)
    assert sys.meta_path[1:] == without
    _config_scope_hook.install()  # idempotent
    assert len(sys.meta_path) == len(without) + 1


def test_two_finders_ask_each_other_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two copies of the finder (an installed mmlinvit and a source tree): the one asked
    asks the other, which answers nothing while the first is searching... and the real path
    finder gives the spec (no endless recursion)."""
    import importlib.machinery

    import mmengine
    from mmlinvit import _config_scope_hook
    first = _config_scope_hook.ConfigScopeFinder()
    second = _config_scope_hook.ConfigScopeFinder()
    monkeypatch.setattr(sys, 'meta_path', [first, second, importlib.machinery.PathFinder])
    spec = first.find_spec(_config_scope_hook._TRIGGER, list(mmengine.__path__))
    assert spec is not None and spec.name == 'mmengine.config'
    assert isinstance(spec.loader, _config_scope_hook._RegisterAfterExec)


def test_register_imports_the_scopes_module_when_it_is_not_loaded(
        fresh_interpreter: Callable[[str], List[str]]) -> None:
    """``_register`` with ``mmlinvit.config_scopes`` not imported yet imports it, which
    registers the scopes (fresh interpreter: nothing imported it before)."""
    code = ('import sys\n'
            'from mmlinvit import _config_scope_hook\n'
            "assert 'mmlinvit.config_scopes' not in sys.modules\n"
            '_config_scope_hook._register()\n'
            'from mmengine.config import utils\n'
            "print(utils.MODULE2PACKAGE.get('mmlinvit'))\n")
    assert fresh_interpreter(code) == ['mmlinvit']


def test_the_model_registry_imports_the_models_on_first_lookup(
        fresh_interpreter: Callable[[str], List[str]]) -> None:
    """Documented (``mmlinvit.registry``): each registry imports its ``locations`` lazily on
    first lookup; the model registry's must register the backbones (fresh interpreter, where
    nothing imported ``mmlinvit.models`` before)."""
    code = ('import sys\n'
            'import mmlinvit.registry as registry\n'
            "assert 'mmlinvit.models' not in sys.modules\n"
            "cls = registry.MODELS.get('VisionTransformer')\n"
            "print(cls.__module__ if cls is not None else None)\n")
    assert fresh_interpreter(code) == ['mmlinvit.backbones.vit']


# ----------------------------------------------------------------- report, checkpoint file


def test_clip_resblocks_are_grouped() -> None:
    """OpenAI CLIP's ``transformer.resblocks.N.`` keys group like ``blocks.N.``."""
    keys = [f'transformer.resblocks.{i}.ln_1.weight' for i in (0, 1, 2)] + ['proj']
    assert summarise_keys(keys) == ['proj', 'transformer.resblocks.{0-2}.ln_1.weight']


def test_report_lines_of_loaded_count_and_skipped_keys() -> None:
    """No "loaded tensors" line before a load; a missing key without a reason is named as
    skipped by the non-strict load (written out by hand)."""
    report = ConversionReport('timm')
    assert report.format() == 'source layout: timm\nrenamed keys: 0'
    report.missing = ['head.w']
    assert report.describe_initialised() == ['head.w (skipped (strict=False))']
    report.loaded = 3
    assert report.format().splitlines()[-2:] == [
        'loaded tensors: 3', 'missing (left at init): head.w (skipped (strict=False))']


def test_to_dict_records_set_aside_tensors_as_shapes(tmp_path: Path) -> None:
    """``to_dict`` is plain data: a set-aside tensor is its shape (a list), and the dict
    round-trips through ``torch.load(weights_only=True)``."""
    report = ConversionReport('openai_clip', extras={'proj': torch.zeros(4, 2)})
    data = report.to_dict()
    assert data['extras'] == {'proj': [4, 2]}
    path = tmp_path / 'r.pth'
    torch.save(data, str(path))
    assert torch.load(str(path), weights_only=True) == data


def test_an_empty_file_and_a_one_byte_file(tmp_path: Path) -> None:
    """0 bytes: "is empty"; 1 byte: not empty, not a checkpoint."""
    empty = tmp_path / 'e.pth'
    empty.write_bytes(b'')
    assert checkpoint_file_problem(empty).startswith('is empty (0 bytes)')
    one = tmp_path / 'o.pth'
    one.write_bytes(b'x')
    assert checkpoint_file_problem(one).startswith('is not a PyTorch checkpoint')


def test_an_unknown_file_is_described_by_its_first_8_bytes(tmp_path: Path) -> None:
    """The message shows the first 8 bytes in hex, as written out here."""
    path = tmp_path / 'x.pth'
    path.write_bytes(bytes(range(1, 17)))
    assert '(its 16 bytes start with 01 02 03 04 05 06 07 08)' in checkpoint_file_problem(path)


def test_a_safetensors_header_of_no_json_object_is_named(tmp_path: Path) -> None:
    """FINDING (failed on the previous code; the check now reads the header's first byte, as
    ``_starts_safetensors`` does): an 8-byte file whose header length is 0
    has no header at all, and a header that does not start with ``{`` is no JSON object; the
    safetensors reader refuses both (run here), so the check must not call them intact."""
    safetensors_torch = pytest.importorskip('safetensors.torch')
    for name, data in (('empty_header', (0).to_bytes(8, 'little')),
                       ('no_object', (2).to_bytes(8, 'little') + b'[]')):
        path = tmp_path / f'{name}.safetensors'
        path.write_bytes(data)
        with pytest.raises(Exception, match='header'):
            safetensors_torch.load_file(str(path))
        problem = checkpoint_file_problem(path)
        assert problem is not None and 'not a safetensors file' in problem, (name, problem)
    # the smallest valid file, as safetensors writes it, stays intact
    valid = tmp_path / 'valid.safetensors'
    safetensors_torch.save_file({}, str(valid))
    assert safetensors_torch.load_file(str(valid)) == {}
    assert checkpoint_file_problem(valid) is None


# ------------------------------------------------------------- own mutants (second pass)


def test_checkpoint_none_in_any_case_means_random_weights(
        export_tool: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture) -> None:
    """``None`` / ``NONE`` are the documented ``'none'`` (random weights), not a file name;
    an error exactly at the tolerance passes (the bound is inclusive: ``err <= bound``)."""
    _fake_build(export_tool, monkeypatch, pads_outside_backbone=False)
    monkeypatch.setattr(export_tool, 'onnxruntime_session', lambda path, threads: None)
    monkeypatch.setattr(export_tool, 'onnxruntime_outputs',
                        lambda session, images: [images.clone()])
    for word in ('None', 'NONE'):
        info = export_tool.main(['cfg.py', word, '--out', str(tmp_path / 'm.onnx'),
                                 '--atol', '0', '--rtol', '0'])
        assert info['max_abs_error'] == [0.0] and info['tolerance'] == 0.0
    capsys.readouterr()


def test_only_a_required_data_samples_argument_blocks_a_whole_export(onnx_tools: Any) -> None:
    """A decode head whose ``forward`` REQUIRES ``batch_data_samples`` (Mask2Former) cannot
    run in ``mode='tensor'``; one with a default can (checked with ``inspect`` semantics)."""

    class Required(torch.nn.Module):
        def forward(self, x: Any, batch_data_samples: Any) -> Any:
            return x

    class Optional_(torch.nn.Module):
        def forward(self, x: Any, batch_data_samples: Any = None) -> Any:
            return x

    assert onnx_tools._needs_data_samples(Required()) is True
    assert onnx_tools._needs_data_samples(Optional_()) is False
    assert onnx_tools._needs_data_samples(torch.nn.Identity()) is False


def test_an_int_crop_size_is_square(onnx_tools: Any) -> None:
    """``crop_size = 32`` is a 32 x 32 crop (mmseg / mmcv read an int size as square)."""
    from mmengine.config import Config
    cfg = Config(dict(crop_size=32, model=dict()))
    assert onnx_tools._config_crop(cfg, torch.nn.Identity()) == (32, 32)
    cfg = Config(dict(model=dict(data_preprocessor=dict(size=(24, 40)))))
    assert onnx_tools._config_crop(cfg, torch.nn.Identity()) == (24, 40)


@pytest.mark.parametrize('protocol', [2, 4])
def test_a_legacy_torch_file_of_any_protocol_is_intact(protocol: int, tmp_path: Path) -> None:
    """Legacy (pre-zip) ``torch.save`` files, written here by torch itself with pickle
    protocol 2 and 4 (FRAME opcode first), are recognised and read back."""
    path = tmp_path / f'legacy{protocol}.pth'
    torch.save({'w': torch.arange(3.)}, str(path), _use_new_zipfile_serialization=False,
               pickle_protocol=protocol)
    # written here, so trusted (weights_only=True does not read protocol 4's FRAME)
    assert torch.equal(torch.load(str(path), weights_only=False)['w'], torch.arange(3.))
    assert checkpoint_file_problem(path) is None


def test_forwarding_without_a_last_resort_handler(mmlinvit_logger: logging.Logger,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    """An application may set ``logging.lastResort = None`` (Python then prints nothing for
    a record without handlers); the forwarder must then print nothing either, and not fail
    (a failing handler prints "--- Logging error ---" on stderr)."""
    monkeypatch.setattr(logging, 'lastResort', None)
    monkeypatch.setattr(mmlinvit_logger, 'propagate', False)
    mmlinvit_logger.warning('round21b without last resort')
    assert capsys.readouterr().err == ''


def test_benchmark_reference_magnitude_is_the_largest_output(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The table's "(max |pytorch|)" is the largest magnitude over ALL outputs (two outputs
    of magnitude 1 and 3 here; export and timing replaced by stand-ins)."""
    monkeypatch.setattr(sys, 'path', list(sys.path))
    bench = _tool(osp.join(REPO, 'tools', 'deployment', 'benchmark_onnx.py'), 'bench')
    outs = (torch.ones(1, 4, 2, 2), torch.full((1, 4, 2, 2), -3.0))
    monkeypatch.setattr(bench, 'export_onnx', lambda module, images, path: ['out0', 'out1'])
    monkeypatch.setattr(bench, 'onnxruntime_session', lambda path, threads: path)
    monkeypatch.setattr(bench, 'onnxruntime_outputs', lambda session, images: list(outs))
    monkeypatch.setattr(bench, 'build', lambda name, arch: (lambda images: outs))
    monkeypatch.setattr(bench, 'time_round_robin', lambda fns, device, repeats, max_seconds: {
        name: 1.0 for name in fns})
    threads = torch.get_num_threads()
    rows = bench.main(['--arch', 'tiny', '--sizes', '32', '--students', 'vit-elu',
                       '--repeats', '1', '--threads', str(threads)])
    assert rows[0]['teacher-softmax max abs ref'] == 3.0
    assert rows[0]['vit-elu max abs ref'] == 3.0
    assert capsys.readouterr().out.splitlines()[-1].split()[-2:] == ['0.0e+00', '(3.0)']
