"""Checkpoint file checks and the ONNX deployment tools on branches no other test reached
(mutation round 19): each test below failed on at least one single-line change of
:mod:`mmlinvit.converters.checkpoint_file`, ``tools/deployment/onnx_tools.py``,
or ``tools/deployment/export_onnx.py`` that the rest
of the suite let pass.

Guarded here, each against an independent reference:

* ``checkpoint_file_problem``: a directory is "not a file" (``os.path.isfile``), legacy
  ``torch.save`` files of every pickle protocol 2-5 are recognised (``torch.load`` reads them
  back), a zip archive without ``data.pkl`` is refused (``torch.load`` refuses it too), a
  changed ``data.pkl`` byte is found without the data pass (``zipfile``'s own CRC check
  agrees), a safetensors file shorter than its 8-byte header length is named as such;
  ``check_checkpoint_file`` names the cause and a missing file as documented
  (``describe_read_error``: round 13);
* ``onnx_tools``: ``BackboneExport`` turns a list of outputs into the tuple it documents,
  ``build_export_module`` validates ``part`` / ``which`` before reading anything,
  ``export_onnx`` writes into a folder that does not exist yet and names every output
  (``out0``, ``out1``), with onnxruntime giving PyTorch's outputs, and the session does not
  spin (as its comment says);
* ``export_onnx.py``: a missing checkpoint is a usage error naming ``none``, ``--no-check``
  opens no onnxruntime session, a backbone export with ONE side off the patch grid gets
  the padding note;
* findings of round 19 (tests that fail on the code before the fixes): unexpected keys
  under a key prefix in ``load_weights`` and a NaN onnxruntime output in the export check.
"""
import pickle
import os.path as osp
import zipfile
from pathlib import Path
from typing import Any, List, Tuple

import pytest
import torch
import torch.nn as nn

from mmlinvit.converters.checkpoint_file import (CheckpointFileError, check_checkpoint_file,
                                                 checkpoint_file_problem)

from test_mutation_round16_infer_demo_deploy import _fake_build

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


# ------------------------------------------------------------------------------ fixtures


# -------------------------------------------------------------------------- file checks


def test_a_directory_is_not_a_file(tmp_path: Path) -> None:
    """A folder passed as the checkpoint is named, not opened (``open`` on a folder raises
    ``IsADirectoryError`` naming neither the cause nor the checkpoint)."""
    assert osp.isdir(tmp_path) and not osp.isfile(tmp_path)
    assert checkpoint_file_problem(tmp_path) == 'is not a file'
    with pytest.raises(CheckpointFileError, match='is not a file'):
        check_checkpoint_file(str(tmp_path))


@pytest.mark.parametrize('protocol', [2, 3, 4, 5])
def test_legacy_files_of_every_pickle_protocol_are_recognised(tmp_path: Path,
                                                              protocol: int) -> None:
    """The legacy (pre-1.6) format written with pickle protocols 2 to 5 (4 and 5 put a
    9-byte FRAME opcode before the magic number): ``torch.load`` reads each back, so the
    check must not refuse any of them."""
    state = {'w': torch.arange(6.0).reshape(2, 3)}
    path = str(tmp_path / f'legacy_p{protocol}.pth')
    torch.save(state, path, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    head = open(path, 'rb').read(2)
    assert head == bytes([0x80, protocol])  # pickle's PROTO opcode and the protocol number
    # the reference: torch reads it back (a full unpickle of this test's own file: the
    # weights-only unpickler has no FRAME opcode, which protocols 4 / 5 write)
    read = torch.load(path, weights_only=False)
    assert torch.equal(read['w'], state['w'])
    assert checkpoint_file_problem(path) is None
    check_checkpoint_file(path)


@pytest.mark.parametrize('protocol', [2, 4])
def test_a_plain_pickle_is_not_a_legacy_torch_file(tmp_path: Path, protocol: int) -> None:
    """A plain pickle (same PROTO opcode, no torch magic number) is no checkpoint:
    ``torch.load`` refuses it (``Invalid magic number``), so the check must not pass it."""
    path = str(tmp_path / 'plain.pth')
    with open(path, 'wb') as f:
        pickle.dump({'w': [1.0, 2.0]}, f, protocol=protocol)
    with pytest.raises(Exception, match='(?i)magic number'):
        torch.load(path, weights_only=False)
    problem = checkpoint_file_problem(path)
    assert problem is not None and problem.startswith('is not a PyTorch checkpoint')


def test_a_zip_archive_without_a_pickle_record_is_refused(tmp_path: Path) -> None:
    """A zip archive (``PK\\x03\\x04``) that holds no ``data.pkl`` is no ``torch.save`` file:
    ``torch.load`` refuses it as well."""
    path = str(tmp_path / 'model.pth')
    with zipfile.ZipFile(path, 'w') as archive:
        archive.writestr('archive/data/0', b'\x00' * 16)
    with pytest.raises(Exception):
        torch.load(path, weights_only=True)
    problem = checkpoint_file_problem(path)
    assert problem is not None and 'without the data.pkl record' in problem
    with pytest.raises(CheckpointFileError, match='without the data.pkl'):
        check_checkpoint_file(path)


def test_a_changed_pickle_byte_is_found_without_the_data_pass(tmp_path: Path) -> None:
    """``verify_data=False`` skips the tensor records' CRCs only: the ``data.pkl`` record is
    read (and so CRC-checked) anyway, as the module docstring says.  zipfile's own
    ``testzip`` names the record; ``torch.load`` reads the renamed key silently."""
    path = str(tmp_path / 'model.pth')
    torch.save({'weight': torch.arange(4.0)}, path)
    data = bytearray(open(path, 'rb').read())
    at = data.find(b'weight')
    data[at + 5] = ord('u')  # 'weight' -> 'weighu' inside data.pkl (stored, not deflated)
    with open(path, 'wb') as f:
        f.write(bytes(data))
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip().endswith('data.pkl')
    assert 'weighu' in torch.load(path, weights_only=True)
    problem = checkpoint_file_problem(path, verify_data=False)
    assert problem is not None and 'data.pkl record fails its check' in problem


def test_a_safetensors_file_shorter_than_its_header_length(tmp_path: Path) -> None:
    """safetensors files start with an 8-byte little-endian header length: a 5-byte file has
    none (safetensors itself refuses it)."""
    safetensors_torch = pytest.importorskip('safetensors.torch')
    path = str(tmp_path / 'model.safetensors')
    with open(path, 'wb') as f:
        f.write(b'\x02\x00\x00\x00\x00')
    with pytest.raises(Exception):
        safetensors_torch.load_file(path)
    assert checkpoint_file_problem(path) == (
        'is truncated: a safetensors file of only 5 bytes (no header length)')


def test_a_record_whose_data_runs_past_the_end_is_named_damaged(tmp_path: Path) -> None:
    """A local header whose extra-field length (bytes 28-29; zip format: ``PK\\x03\\x04``,
    name length at 26, name at 30) points the record's data past the end of the file:
    zipfile's own ``testzip`` raises ``EOFError`` there (the reference), which the check must
    turn into a named damaged file."""
    path = str(tmp_path / 'model.pth')
    torch.save({'w': torch.arange(64.0)}, path)
    data = bytearray(open(path, 'rb').read())
    at, changed = data.find(b'PK\x03\x04'), 0
    while at != -1:
        n = int.from_bytes(data[at + 26:at + 28], 'little')
        if bytes(data[at + 30:at + 30 + n]).endswith(b'/data/0'):
            data[at + 28:at + 30] = (0xffff).to_bytes(2, 'little')
            changed += 1
        at = data.find(b'PK\x03\x04', at + 4)
    assert changed == 1 and len(data) < 0xffff
    with open(path, 'wb') as f:
        f.write(bytes(data))
    with zipfile.ZipFile(path) as archive, pytest.raises(EOFError):
        archive.testzip()
    problem = checkpoint_file_problem(path)
    assert problem is not None and problem.startswith('is damaged: its zip archive')
    with pytest.raises(CheckpointFileError, match='is damaged'):
        check_checkpoint_file(path)


def test_a_missing_checkpoint_is_file_not_found(tmp_path: Path) -> None:
    """Documented: a missing file raises ``FileNotFoundError`` (what ``open`` raises), not
    the damaged-file error."""
    missing = str(tmp_path / 'missing.pth')
    with pytest.raises(FileNotFoundError, match='does not exist'):
        check_checkpoint_file(missing)
    assert not isinstance(FileNotFoundError(), CheckpointFileError)


# ------------------------------------------------------------------------------ onnx_tools


class _ListBackbone(nn.Module):
    """A backbone that returns its features as a list (two of them)."""

    def forward(self, images: torch.Tensor) -> List[torch.Tensor]:
        return [images * 2, images.mean(dim=1, keepdim=True)]


class _TwoOutputs(nn.Module):
    """A tiny module with two outputs of different shapes (a conv and a pooled vector)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 2, stride=2)

    def forward(self, images: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        feat = self.conv(images)
        return feat, feat.mean(dim=(2, 3))


def test_backbone_export_returns_a_tuple_of_tensors_for_a_list(onnx_tools: Any) -> None:
    """A list of features becomes the documented tuple of tensors (``out0``...), not a
    one-element tuple holding the list."""
    x = torch.randn(1, 3, 4, 4)
    outs = onnx_tools.BackboneExport(_ListBackbone())(x)
    assert isinstance(outs, tuple) and len(outs) == 2
    assert torch.equal(outs[0], x * 2) and torch.equal(outs[1], x.mean(1, keepdim=True))


@pytest.mark.parametrize('kwargs, message', [
    (dict(part='head'), 'part must be one of'),
    (dict(which='ema'), 'which must be one of'),
])
def test_build_export_module_validates_its_choices_first(onnx_tools: Any, tmp_path: Path,
                                                         kwargs: dict, message: str) -> None:
    """``part`` / ``which`` outside :data:`PARTS` / :data:`WHICH` are refused before the
    config is read (this config does not exist)."""
    with pytest.raises(ValueError, match=message):
        onnx_tools.build_export_module(str(tmp_path / 'no_config.py'), None, **kwargs)


def test_export_writes_a_new_folder_and_names_every_output(onnx_tools: Any,
                                                           tmp_path: Path) -> None:
    """``export_onnx`` creates the output folder, names the outputs ``out0``, ``out1`` and
    the file gives PyTorch's outputs in onnxruntime on another input."""
    pytest.importorskip('onnxruntime')
    pytest.importorskip('onnxscript')
    torch.manual_seed(0)
    module = _TwoOutputs().eval()
    path = str(tmp_path / 'new' / 'folder' / 'two.onnx')
    names = onnx_tools.export_onnx(module, torch.randn(1, 3, 8, 8), path)
    assert names == ['out0', 'out1'] and osp.isfile(path)
    session = onnx_tools.onnxruntime_session(path, threads=1)
    assert [o.name for o in session.get_outputs()] == ['out0', 'out1']
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    got = onnx_tools.onnxruntime_outputs(session, x)
    with torch.no_grad():
        ref = module(x)
    assert [tuple(g.shape) for g in got] == [(1, 4, 4, 4), (1, 4)]
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)


def test_onnxruntime_session_does_not_spin(onnx_tools: Any, tmp_path: Path) -> None:
    """The session's idle pool threads do not busy-wait (``allow_spinning`` 0, as the
    comment on a shared CPU says) and inter-op work runs on one thread."""
    pytest.importorskip('onnxruntime')
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node('Identity', ['images'], ['out0'])], 'g',
                              [helper.make_tensor_value_info('images', TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info('out0', TensorProto.FLOAT, None)])
    path = str(tmp_path / 'id.onnx')
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid('', 18)]), path)
    options = onnx_tools.onnxruntime_session(path, threads=1).get_session_options()
    assert options.get_session_config_entry('session.intra_op.allow_spinning') == '0'
    assert options.inter_op_num_threads == 1 and options.intra_op_num_threads == 1


# ------------------------------------------------------------------------------ export_onnx


def test_a_missing_checkpoint_is_a_usage_error_naming_none(export_tool: Any,
                                                           tmp_path: Path) -> None:
    """A checkpoint path that does not exist stops the tool with the hint to pass ``none``,
    before the config is read."""
    missing = str(tmp_path / 'missing.pth')
    with pytest.raises(SystemExit, match=r'does not exist \(pass "none"'):
        export_tool.main([str(tmp_path / 'cfg.py'), missing])


def test_no_check_opens_no_session(export_tool: Any, monkeypatch: pytest.MonkeyPatch,
                                   tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--no-check`` skips the onnxruntime check: no session, no error fields."""
    _fake_build(export_tool, monkeypatch)

    def no_session(path: str, threads: int) -> Any:
        raise AssertionError('--no-check opened an onnxruntime session')

    monkeypatch.setattr(export_tool, 'onnxruntime_session', no_session)
    info = export_tool.main(['cfg.py', 'none', '--out', str(tmp_path / 'id.onnx'),
                             '--no-check'])
    assert 'max_abs_error' not in info and 'tolerance' not in info
    capsys.readouterr()


@pytest.mark.parametrize('shape, noted', [(('8', '12'), True), (('12', '8'), True),
                                          (('8', '16'), False)])
def test_one_side_off_the_grid_is_noted(export_tool: Any, monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path, capsys: pytest.CaptureFixture,
                                        shape: Tuple[str, str], noted: bool) -> None:
    """A backbone export (padding inside the graph) whose height OR width is no multiple of
    the patch size (8) gets the note; both sides on the grid get none."""
    _fake_build(export_tool, monkeypatch)
    export_tool.main(['cfg.py', 'none', '--out', str(tmp_path / 'id.onnx'), '--no-check',
                      '--shape', *shape])
    out = capsys.readouterr().out
    assert ('is not a multiple of the patch size 8' in out) == noted


# ------------------------------------------------------------------ findings of round 19


@pytest.mark.parametrize('case', ['extra key', 'deeper file'])
def test_unexpected_keys_under_a_prefix_are_named(onnx_tools: Any, tmp_path: Path,
                                                  case: str) -> None:
    """FINDING of round 19 (fails on the code before the fix in ``onnx_tools.load_weights``):
    under a key prefix (``model.``, ``backbone.``...) keys the module does not have were not
    counted as unexpected; the shape check then looked one up and raised a bare
    ``KeyError: 'extra'``, and a deeper checkpoint of the same width (a 2-layer file for a
    1-layer module) was loaded cut to the module's depth without a word.  Now they are named
    as with no prefix.  The reference: ``load_state_dict(strict=True)`` refuses the same
    keys."""
    torch.manual_seed(0)
    source = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    state = dict(source.state_dict())
    if case == 'extra key':
        state['extra'] = torch.zeros(1)
        target, named = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)), 'extra'
    else:
        target, named = nn.Sequential(nn.Linear(2, 2)), '2.bias'
    with pytest.raises(RuntimeError, match='Unexpected key'):
        type(target)(*[type(m)(2, 2) if isinstance(m, nn.Linear) else type(m)()
                       for m in target]).load_state_dict(state, strict=True)
    path = str(tmp_path / 'w.pth')
    torch.save({f'model.{k}': v for k, v in state.items()}, path)
    with pytest.raises(KeyError) as err:
        onnx_tools.load_weights(target, path, 'model')
    assert "closest key prefix 'model.'" in str(err.value)
    assert f"'{named}'" in str(err.value).split('unexpected', 1)[1]


def test_a_nan_onnxruntime_output_fails_the_check(export_tool: Any,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    """FINDING of round 19 (fails on the code before the fix in ``export_onnx.main``): the
    check compared ``max(errors) > bound``, which is False for a NaN error, so an ONNX file
    whose onnxruntime output is NaN passed with exit status 0.  ``|nan - x| <= tol`` is
    False for every tolerance (IEEE 754), so the exit status must be 1."""
    pytest.importorskip('onnxruntime')

    _fake_build(export_tool, monkeypatch)
    monkeypatch.setattr(export_tool, 'onnxruntime_outputs',
                        lambda session, images: [torch.full_like(images, float('nan'))])
    nan = torch.tensor(float('nan'))
    assert not bool((nan - 1.0).abs() <= 1e9)  # no tolerance covers a NaN
    out = str(tmp_path / 'id.onnx')
    with pytest.raises(SystemExit) as exc:
        export_tool.main(['cfg.py', 'none', '--out', out, '--threads', '1'])
    assert exc.value.code == 1
    capsys.readouterr()
