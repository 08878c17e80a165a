"""Mutation round 21: the tools' wiring (``tools/train.py``, ``tools/test.py``), config scopes
and log forwarding, conversion reports, checkpoint file checks, the model-converter scripts
and the ONNX export tools, on branches the earlier rounds (11-20) left open.  Each test below
failed on at least one single-line change of these modules that the rest of the suite let
pass.

Guarded here, each against an independent reference (the official tools' parsers, mmengine's
``Config`` / ``MMLogger``, ``torch.save`` / ``safetensors`` files written in the test and read
back by their own readers, onnxruntime on a tiny graph, or values written out by hand):

* ``converters.report``: ``summarise_keys``'s line limit (exactly ``limit`` lines need no
  "more" line; the count of what was left out), ``ConversionReport.format`` / ``summary`` /
  ``describe_initialised`` written out by hand;
* ``converters.checkpoint_file``: a safetensors file of no tensors (header filling the file, as
  ``safetensors.torch.save_file({})`` writes it) is intact; a safetensors file without its
  suffix is named as such; the documented ``verify_data=False`` fast path; the suffix test
  ignores case as the reader does;
* ``tools/model_converters``: ``convert_checkpoint.py`` records the DETECTED layout, writes into
  a new folder and exits 1 on a refused file; ``export_student.py`` writes into a new folder;
* ``tools/deployment``: ``--cfg-options`` values that are no Python literal stay text, the
  default file name is ``..._HxW.onnx``, the tolerance takes the largest reference output,
  ``max_abs_errors`` refuses output lists of another length or shape, a checkpoint without
  the backbone's optional keys (mask token, records) loads, a teacher export is a WARNING;
* ``tools/test.py``: ``--interval``'s default is the official tools', metrics are dumped by
  the main process only, the process group is closed;
* ``config_scopes`` / ``log_forwarding``: ``register_config_scopes`` reports the ``mmlinvit``
  scope; a record whose logger does not propagate, with no handler of its own, still reaches
  stderr as Python's last resort prints it; the forwarder writes to the run's log FILES only.
"""
import logging
import os.path as osp
import sys
import zipfile
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


def _tool(path: str, name: str) -> Any:
    """A tool script loaded as a module under a name of this file."""
    return load_script(path, f'round21_{name}')


# ------------------------------------------------------------------------------ report


def test_exactly_limit_lines_need_no_more_line() -> None:
    """``limit`` lines are returned as they are; one more turns the last into a count."""
    keys = [f'k{i:02d}' for i in range(5)]
    assert summarise_keys(keys, limit=5) == keys
    six = keys + ['k05']
    assert summarise_keys(six, limit=5) == keys[:5] + ['... and 1 more']
    nine = [f'k{i:02d}' for i in range(9)]
    assert summarise_keys(nine, limit=4) == nine[:4] + ['... and 5 more']


def test_format_and_summary_by_hand() -> None:
    """The report of a plain backbone file (no prefix) says nothing about a prefix, counts the
    dropped keys with their reasons, and its one-line summary has no indentation."""
    report = ConversionReport(source_layout='timm')
    report.renamed['norm.weight'] = 'ln1.weight'
    report.drop('head.weight', 'classifier head')
    report.drop('head.bias', 'classifier head')
    assert report.format() == ('source layout: timm\n'
                               'renamed keys: 1\n'
                               'dropped keys: 2\n'
                               '  classifier head: head.bias, head.weight')
    assert report.summary() == ('source layout: timm; renamed keys: 1; dropped keys: 2; '
                                'classifier head: head.bias, head.weight')
    assert str(report) == report.format()


def test_describe_initialised_of_given_keys_only() -> None:
    """``keys`` restricts the description to those keys; keys without a recorded reason are
    'skipped (strict=False)'; at most 8 lines per reason."""
    report = ConversionReport(source_layout='dinov2',
                              missing=['mask_token', 'blocks.0.x', 'blocks.1.x', 'extra'],
                              initialised={'mask_token': 'mask token'})
    assert report.describe_initialised(['mask_token']) == ['mask_token (mask token)']
    assert report.describe_initialised() == [
        'mask_token (mask token)', 'extra, blocks.{0-1}.x (skipped (strict=False))']
    many = [f'key{i:02d}' for i in range(10)]
    report = ConversionReport(source_layout='timm', missing=many)
    assert report.describe_initialised() == [
        ', '.join(many[:8]) + ', ... and 2 more (skipped (strict=False))']


# ----------------------------------------------------------------------- checkpoint file


def test_a_safetensors_file_of_no_tensors_is_intact(tmp_path: Path) -> None:
    """``save_file({})`` writes a header that fills the file exactly (no data bytes):
    safetensors reads it back, so the check finds nothing; without the suffix the file is
    named a safetensors file, not 'no PyTorch checkpoint'."""
    from safetensors.torch import load_file, save_file
    path = tmp_path / 'empty.safetensors'
    save_file({}, str(path))
    size = path.stat().st_size
    assert 8 + int.from_bytes(path.read_bytes()[:8], 'little') == size  # the header fills it
    assert load_file(str(path)) == {}
    assert checkpoint_file_problem(path) is None
    renamed = tmp_path / 'empty.bin'
    renamed.write_bytes(path.read_bytes())
    assert 'safetensors file without the .safetensors suffix' in checkpoint_file_problem(
        renamed)


def test_safetensors_suffix_in_upper_case_is_a_safetensors_file(tmp_path: Path) -> None:
    """The reader takes ``.SAFETENSORS`` as safetensors (``is_safetensors_path``); the check
    agrees instead of asking to rename the file."""
    from safetensors.torch import load_file, save_file
    from mmlinvit.converters import load_checkpoint_file
    path = tmp_path / 'W.SAFETENSORS'
    weight = torch.arange(6.).reshape(2, 3)
    save_file({'w': weight}, str(path))
    assert torch.equal(load_file(str(path))['w'], weight)
    assert checkpoint_file_problem(path) is None
    assert torch.equal(load_checkpoint_file(str(path))['w'], weight)


def _flip_tensor_byte(path: Path) -> str:
    """Changes one byte of the first tensor record of a ``torch.save`` file in place (stored
    uncompressed); returns the record's name."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if '/data/' in i.filename)
    data = bytearray(path.read_bytes())
    # local header: 30 fixed bytes + file name + extra field, then the record's bytes
    name_len = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], 'little')
    extra_len = int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], 'little')
    start = info.header_offset + 30 + name_len + extra_len
    data[start] ^= 0xFF
    path.write_bytes(bytes(data))
    return info.filename


def test_verify_data_false_keeps_to_the_directory_and_the_pickle(tmp_path: Path) -> None:
    """A changed tensor byte: ``torch.load`` loads another value without a word, the data pass
    names the record, and ``verify_data=False`` (documented: directory and pickle record only)
    does not read it."""
    path = tmp_path / 'w.pth'
    torch.save({'w': torch.zeros(4)}, str(path))
    record = _flip_tensor_byte(path)
    assert not torch.equal(torch.load(str(path), weights_only=True)['w'], torch.zeros(4))
    problem = checkpoint_file_problem(path)
    assert problem is not None and repr(record) in problem and 'CRC-32' in problem
    assert checkpoint_file_problem(path, verify_data=False) is None


# ------------------------------------------------------------------------ model converters


def _dinov2_hub_file() -> Dict[str, torch.Tensor]:
    """A 1-block DINOv2 hub state dict (keys of facebookresearch/dinov2's
    ``DinoVisionTransformer``), dims 8, patch 4, 2 x 2 grid."""
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    d = 8
    sd = {'cls_token': r(1, 1, d), 'pos_embed': r(1, 5, d), 'mask_token': r(1, d),
          'patch_embed.proj.weight': r(d, 3, 4, 4), 'patch_embed.proj.bias': r(d),
          'norm.weight': r(d), 'norm.bias': r(d)}
    block = {'norm1.weight': r(d), 'norm1.bias': r(d), 'attn.qkv.weight': r(3 * d, d),
             'attn.qkv.bias': r(3 * d), 'attn.proj.weight': r(d, d), 'attn.proj.bias': r(d),
             'ls1.gamma': r(d), 'norm2.weight': r(d), 'norm2.bias': r(d),
             'mlp.fc1.weight': r(4 * d, d), 'mlp.fc1.bias': r(4 * d),
             'mlp.fc2.weight': r(d, 4 * d), 'mlp.fc2.bias': r(d), 'ls2.gamma': r(d)}
    sd.update({f'blocks.0.{k}': v for k, v in block.items()})
    return sd


def test_convert_checkpoint_records_the_detected_layout(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    """``--layout auto`` (the default) records the layout it detected, as the report
    prints it, and writes into a folder that does not exist yet."""
    tool = _tool(osp.join(CONVERTERS, 'convert_checkpoint.py'), 'convert_checkpoint')
    src = tmp_path / 'hub.pth'
    torch.save(_dinov2_hub_file(), str(src))
    dst = tmp_path / 'new' / 'folder' / 'out.pth'
    assert tool.main([str(src), str(dst)]) == 0
    out = torch.load(str(dst), weights_only=True)
    assert out['meta']['source_layout'] == 'dinov2'
    assert out['meta']['report']['source_layout'] == 'dinov2'
    assert 'source layout: dinov2' in capsys.readouterr().out
    assert 'extras' not in out  # nothing set aside without --keep-projection


def test_convert_checkpoint_refused_file_exits_1(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    """A file of no known layout is an error line and exit status 1, and no output file."""
    tool = _tool(osp.join(CONVERTERS, 'convert_checkpoint.py'), 'convert_checkpoint_bad')
    src = tmp_path / 'other.pth'
    torch.save({'resnet.conv1.weight': torch.zeros(2, 3, 1, 1)}, str(src))
    dst = tmp_path / 'out.pth'
    assert tool.main([str(src), str(dst)]) == 1
    assert capsys.readouterr().err.startswith('error: ')
    assert not dst.exists()


def test_export_student_writes_into_a_new_folder(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    tool = _tool(osp.join(CONVERTERS, 'export_student.py'), 'export_student')
    src = tmp_path / 'run.pth'
    weight = torch.arange(3.)
    torch.save(dict(state_dict={'student.backbone.w': weight, 'teacher.w': weight}), str(src))
    dst = tmp_path / 'a' / 'b' / 'student.pth'
    assert tool.main([str(src), str(dst)]) == 0
    assert torch.equal(torch.load(str(dst), weights_only=True)['w'], weight)
    assert "kept the 1 tensors under 'student.backbone.'" in capsys.readouterr().out


def test_whole_student_export_names_the_student_prefix(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    """``--whole-student`` keeps every ``student.*`` key without the prefix and says so
    (the prefix removed is ``'student.'``, as the module docstring states)."""
    tool = _tool(osp.join(CONVERTERS, 'export_student.py'), 'export_whole_student')
    src = tmp_path / 'run.pth'
    weight = torch.arange(3.)
    torch.save(dict(state_dict={'student.backbone.w': weight, 'student.head.b': weight,
                                'teacher.w': weight}), str(src))
    dst = tmp_path / 'whole.pth'
    assert tool.main([str(src), str(dst), '--whole-student']) == 0
    assert set(torch.load(str(dst), weights_only=True)) == {'backbone.w', 'head.b'}
    assert capsys.readouterr().out.splitlines()[0] == (
        "kept the 2 tensors under 'student.'; dropped 1: teacher.w")


# ------------------------------------------------------------------------------ deployment


class _TwoOutputs(torch.nn.Module):
    """(x, 100 x): two outputs of different magnitudes."""

    def forward(self, images: torch.Tensor) -> Any:
        return images, 100 * images


def _identity_onnx(path: str) -> None:
    """A valid one-node ONNX file (images -> out0), for the metadata writer."""
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node('Identity', ['images'], ['out0'])], 'g',
                              [helper.make_tensor_value_info('images', TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info('out0', TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid('', 18)]), path)


def _fake_build(export_tool: Any, monkeypatch: pytest.MonkeyPatch, module: torch.nn.Module,
                names: List[str]) -> None:
    """``main`` without a config: ``module`` as a backbone of patch 8 (padded in the graph)."""
    pytest.importorskip('onnx')
    info = dict(crop=(8, 8), pads_outside_backbone=False, patch_size=8, which='student',
                part='backbone', model='M', backbone='M', input=dict(prepare='as is'))
    monkeypatch.setattr(export_tool, 'build_export_module',
                        lambda *args, **kwargs: (module, dict(info)))
    monkeypatch.setattr(export_tool, 'export_onnx',
                        lambda module, images, out, opset: _identity_onnx(out) or list(names))


def test_cfg_options_that_are_no_literal_stay_text(export_tool: Any) -> None:
    """Values Python cannot read as a literal are kept as text, whether ``ast.literal_eval``
    says so with a ValueError (a name) or a SyntaxError (two words, an unclosed bracket)."""
    import ast
    for text in ('a b', '[1,'):
        with pytest.raises(SyntaxError):
            ast.literal_eval(text)
    with pytest.raises(ValueError):
        ast.literal_eval('slide')
    assert export_tool._cfg_options(['x.mode=slide', 'y=a b', 'z=[1,', 'n=3']) == {
        'x.mode': 'slide', 'y': 'a b', 'z': '[1,', 'n': 3}


def test_default_file_name_is_height_by_width(export_tool: Any, monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    """Without ``--out`` the file goes next to the checkpoint, named
    ``<config>_<which>_<part>_<H>x<W>.onnx`` (``--shape H W``)."""
    _fake_build(export_tool, monkeypatch, _TwoOutputs(), ['out0', 'out1'])
    ckpt = tmp_path / 'ckpt.pth'
    torch.save({}, str(ckpt))
    info = export_tool.main(['some/dir/my_cfg.py', str(ckpt), '--shape', '8', '16',
                             '--no-check'])
    expected = str(tmp_path / 'my_cfg_student_backbone_8x16.onnx')
    assert info['onnx'] == expected and osp.isfile(expected)
    assert info['shape'] == [1, 3, 8, 16]
    capsys.readouterr()


def test_tolerance_takes_the_largest_reference_output(export_tool: Any,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    """Documented: the bound is ``--atol`` plus ``--rtol`` times the largest |PyTorch output|
    over ALL outputs; the check input is ``randn`` of a generator seeded 1."""
    _fake_build(export_tool, monkeypatch, _TwoOutputs(), ['out0', 'out1'])
    monkeypatch.setattr(export_tool, 'onnxruntime_session', lambda path, threads: None)
    monkeypatch.setattr(export_tool, 'onnxruntime_outputs',
                        lambda session, images: [images.clone(), 100 * images])
    info = export_tool.main(['cfg.py', 'none', '--out', str(tmp_path / 'm.onnx'),
                             '--atol', '0.5', '--rtol', '0.25'])
    check = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    largest = 100 * float(check.abs().max())
    assert info['max_abs_reference'] == pytest.approx(largest, rel=1e-6)
    assert info['tolerance'] == pytest.approx(0.5 + 0.25 * largest, rel=1e-6)
    assert info['max_abs_error'] == [0.0, 0.0]
    capsys.readouterr()


def _tiny_vit() -> torch.nn.Module:
    from mmlinvit.backbones import VisionTransformer
    torch.manual_seed(0)
    return VisionTransformer(arch=dict(embed_dims=16, num_layers=1, num_heads=2,
                                       mlp_hidden_dims=32), img_size=16, patch_size=8)


def test_a_checkpoint_without_the_optional_keys_loads_exactly(onnx_tools: Any,
                                                              tmp_path: Path) -> None:
    """The backbone's optional keys (mask token, operator / grid records) may be absent: the
    file's own keys load at the exact match (prefix ``''``), not through the converters."""
    source, target = _tiny_vit(), _tiny_vit()
    optional = set(type(source).OPTIONAL_CHECKPOINT_KEYS)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(1.0)
    state = {k: v for k, v in source.state_dict().items() if k not in optional}
    assert set(source.state_dict()) - set(state)  # something optional was left out
    path = str(tmp_path / 'w.pth')
    torch.save(state, path)
    assert onnx_tools.load_weights(target, path, 'backbone') == ''
    for key, value in state.items():
        torch.testing.assert_close(target.state_dict()[key], value, msg=key)


# ------------------------------------------------------------------------------- test.py

DEMO = osp.join(REPO, 'configs', 'demo', 'upernet_vit-tiny-softmax_1xb8-300it_toy-64x64.py')


def _run_test_tool(monkeypatch: pytest.MonkeyPatch, argv: List[str],
                   main_process: bool = True) -> Dict[str, Any]:
    """Runs test.py's main() with the runner, the rank test and the teardown replaced."""
    tool = _tool(osp.join(REPO, 'tools', 'test.py'), 'test_tool')
    seen: Dict[str, Any] = dict(calls=[])

    class Runner:
        def test(self) -> Dict[str, float]:
            seen['calls'].append('test')
            return {'mIoU': 1.5}

    def record(cfg: Any, path: str, ckpt: str, **kwargs: Any) -> Any:
        seen['prepare'] = kwargs
        return cfg

    monkeypatch.setattr(tool, 'prepare_test_config', record)
    monkeypatch.setattr(tool, 'build_runner', lambda cfg, mode, checkpoint: Runner())
    monkeypatch.setattr(tool, 'is_main_process', lambda: main_process)
    monkeypatch.setattr(tool, 'finish_distributed', lambda: seen['calls'].append('finish'))
    seen['returned'] = tool.main(argv)
    return seen


def test_interval_default_is_mmpretrains(clean_launch_env: pytest.MonkeyPatch) -> None:
    """``--interval`` (visualise every N-th sample) defaults as in mmpretrain's own
    tools/test.py (read from its parser)."""
    import mmpretrain
    official_path = osp.join(osp.dirname(mmpretrain.__file__), '.mim', 'tools', 'test.py')
    if not osp.isfile(official_path):
        pytest.skip(f'{official_path} is not shipped')
    official = load_script(official_path, 'round21_mmpretrain_test')
    clean_launch_env.setattr(sys, 'argv', ['test.py', 'c.py', 'ckpt.pth'])
    expected = official.parse_args().interval
    seen = _run_test_tool(clean_launch_env, [DEMO, 'ckpt.pth'])
    assert seen['prepare']['interval'] == expected == 1


def test_metrics_are_dumped_by_the_main_process_only(clean_launch_env: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    """``--out-item metrics``: every process gets the metrics back, the main one writes the
    file (one writer per file), and each closes the process group after testing."""
    import mmengine
    out = tmp_path / 'metrics.json'
    other = _run_test_tool(clean_launch_env, [DEMO, 'ckpt.pth', '--out', str(out),
                                              '--out-item', 'metrics'], main_process=False)
    assert other['returned'] == {'mIoU': 1.5} and not out.exists()
    assert other['calls'] == ['test', 'finish']
    main = _run_test_tool(clean_launch_env, [DEMO, 'ckpt.pth', '--out', str(out),
                                             '--out-item', 'metrics'])
    assert mmengine.load(str(out)) == {'mIoU': 1.5}
    assert main['calls'] == ['test', 'finish']


def test_test_tool_hands_tta_amp_show_dir_and_interval_on(clean_launch_env: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """Each of these flags reaches the config preparation with the value given."""
    seen = _run_test_tool(clean_launch_env, [DEMO, 'ckpt.pth', '--tta', '--amp', '--interval',
                                             '3', '--show-dir', str(tmp_path / 'vis')])
    kwargs = seen['prepare']
    assert kwargs['tta'] is True and kwargs['amp'] is True and kwargs['interval'] == 3
    assert kwargs['show_dir'] == str(tmp_path / 'vis')
    seen = _run_test_tool(clean_launch_env, [DEMO, 'ckpt.pth'])
    assert seen['prepare']['tta'] is False and seen['prepare']['amp'] is False
    assert seen['prepare']['show_dir'] is None


def test_train_tool_hands_amp_auto_scale_lr_and_no_validate_on(
        clean_launch_env: pytest.MonkeyPatch) -> None:
    """``--amp`` / ``--auto-scale-lr`` / ``--no-validate`` reach the config preparation."""
    tool = _tool(osp.join(REPO, 'tools', 'train.py'), 'train_tool')
    seen: Dict[str, Any] = {}

    class Runner:
        def train(self) -> None:
            seen['trained'] = True

    def record(cfg: Any, path: str, **kwargs: Any) -> Any:
        seen['prepare'] = kwargs
        return cfg

    clean_launch_env.setattr(tool, 'prepare_train_config', record)
    clean_launch_env.setattr(tool, 'build_runner', lambda cfg, mode: Runner())
    clean_launch_env.setattr(tool, 'finish_distributed', lambda: None)
    tool.main([DEMO, '--amp', '--auto-scale-lr', '--no-validate'])
    kwargs = seen['prepare']
    assert kwargs['amp'] is True and kwargs['auto_scale_lr'] is True
    assert kwargs['no_validate'] is True and seen['trained']
    tool.main([DEMO])
    kwargs = seen['prepare']
    assert not kwargs['amp'] and not kwargs['auto_scale_lr'] and not kwargs['no_validate']


# ---------------------------------------------------------------- config scopes, logging


def test_register_config_scopes_reports_what_it_registered() -> None:
    """The returned map names the installed distribution of each scope (pip metadata read
    here) and the ``mmlinvit`` scope, exactly what ``MODULE2PACKAGE`` then holds."""
    from importlib.metadata import PackageNotFoundError, distribution
    from mmengine.config import utils as config_utils
    from mmlinvit import config_scopes
    registered = config_scopes.register_config_scopes()
    assert registered['mmlinvit'] == 'mmlinvit'
    for scope, candidates in config_scopes.SCOPE_DISTRIBUTIONS.items():
        installed = []
        for name in candidates:
            try:
                distribution(name)
                installed.append(name)
            except PackageNotFoundError:
                pass
        if installed:
            assert registered[scope] == installed[0]
        else:
            assert scope not in registered
    for scope, dist in registered.items():
        assert config_utils.MODULE2PACKAGE[scope] == dist


def test_a_non_propagating_logger_still_prints_as_python_does(
        mmlinvit_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    """Python prints a WARNING of a logger without handlers that does not propagate through
    its last-resort handler (reference: a plain logger here); the forwarder must not swallow
    it (it stands in for that handler)."""
    reference = logging.getLogger('round21_reference_logger')
    monkeypatch.setattr(reference, 'handlers', [])
    monkeypatch.setattr(reference, 'propagate', False)
    reference.warning('round21 reference warning')
    assert capsys.readouterr().err == 'round21 reference warning\n'
    monkeypatch.setattr(mmlinvit_logger, 'propagate', False)
    mmlinvit_logger.warning('round21 mmlinvit warning')
    assert capsys.readouterr().err == 'round21 mmlinvit warning\n'


def test_forwarding_writes_to_log_files_only_and_creates_no_logger(
        mmlinvit_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """Without an MMLogger nothing is created (mmengine's current-instance lookup would make
    one); with one, the record goes to its FILE handler, not to its console handler (the
    record reaches the console once, by propagation)."""
    import io
    from collections import OrderedDict
    from mmengine.logging import MMLogger
    monkeypatch.setattr(MMLogger, '_instance_dict', OrderedDict())
    child = logging.getLogger('mmlinvit.round21')
    child.warning('before any run logger')
    assert len(MMLogger._instance_dict) == 0
    log_file = tmp_path / 'run.log'
    run_logger = MMLogger.get_instance('round21_run', log_file=str(log_file))
    console = io.StringIO()
    file_handlers = [h for h in run_logger.handlers if isinstance(h, logging.FileHandler)]
    assert len(file_handlers) == 1
    monkeypatch.setattr(run_logger, 'handlers',
                        file_handlers + [logging.StreamHandler(console)])
    try:
        child.warning('round21 forwarded warning')
        file_handlers[0].flush()
        assert 'round21 forwarded warning' in log_file.read_text()
        assert console.getvalue() == ''
    finally:
        file_handlers[0].close()


def test_hook_install_with_mmengine_config_loaded_adds_no_finder(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Documented: with ``mmengine.config`` imported the scopes are registered at once; no
    import hook is left waiting on ``sys.meta_path`` for a module that is already there."""
    from mmlinvit import _config_scope_hook
    assert _config_scope_hook._TRIGGER in sys.modules
    calls: List[str] = []
    monkeypatch.setattr(_config_scope_hook, '_register', lambda: calls.append('register'))
    without = [f for f in sys.meta_path
               if not isinstance(f, _config_scope_hook.ConfigScopeFinder)]
    monkeypatch.setattr(sys, 'meta_path', list(without))
    _config_scope_hook.install()
    assert calls == ['register'] and sys.meta_path == without


def test_importing_the_registry_installs_the_forwarder(
        fresh_interpreter: Callable[[str], List[str]]) -> None:
    """Documented (``log_forwarding``): importing :mod:`mmlinvit.registry` attaches the
    forwarder; checked in a fresh interpreter, where nothing else has installed it."""
    code = ('import logging, mmlinvit.registry\n'
            'from mmlinvit.log_forwarding import MMLoggerForwarder\n'
            "print(sum(isinstance(h, MMLoggerForwarder) "
            "for h in logging.getLogger('mmlinvit').handlers))\n")
    assert fresh_interpreter(code) == ['1']
