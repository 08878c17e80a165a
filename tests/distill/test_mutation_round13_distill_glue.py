"""Distillation glue (mutation round 13): recorders, their attachment, block-depth checks,
activation checkpointing, checkpoint-file diagnosis and conversion reports.

Guarded here, each against a reference written in the test (own forward hooks, values by
hand, ``torch.utils.checkpoint`` semantics, mmengine's own checkpoint loading):

* ``attach_recorders`` refuses recorders set for a missing model and names the recorder
  (side and name) in build and attach errors; ``recording`` starts empty and forgets on exit;
* recorders: an empty source, indices on a non-template source and an index equal to the
  block count are refused; a missing module's message lists the parent's children; a
  recorder used as a context manager starts empty; ``output_index=0`` selects the first
  element; an ``arg_index`` one past the positional arguments is named; an attention map is
  computed with the keyword arguments of the forward; a plain recorder resolves to index 0; an
  unattached recorder's ``get`` says so;
* ``matching_indices`` returns ``None`` when any (not only every) fraction falls between
  blocks; ``check_stage_depths`` skips pairs that are not both templates, or of different
  lengths, and pairs student / teacher specs by side;
* ``run_block`` checkpoints only when ``checkpoint_active`` says so and gives gradients equal
  to the plain run;
* ``checkpoint_file_problem``: a directory, a 1-byte file, a file of exactly the record's end,
  safetensors header lengths, ``describe_read_error`` naming the cause; every file mmengine's
  ``CheckpointLoader`` loads is found intact;
* ``summarise_keys`` / ``ConversionReport``: ``resblocks`` grouping, duplicate indices, the
  count line at exactly ``limit`` lines, ``describe_initialised`` of given keys, ``summary``.

Findings of this round (fixed; each test failed on the code before): legacy ``torch.save``
files of pickle protocol 3-5 were refused as "not a PyTorch checkpoint" though mmengine loads
them; ``indices=[]`` attached nothing and ``get()`` then said "not attached"; ``output_index``
on a module returning a tensor silently recorded the batch's first sample; attention maps of a
``torch.no_grad`` forward carried an autograd graph into the teacher.
"""
from typing import Any, List

import pytest
import torch
import torch.nn as nn

from mmlinvit.distill.recorders import (AttentionMapsRecorder, ModuleInputsRecorder,
                                        ModuleOutputsRecorder, describe_missing_module)
from mmlinvit.models.distill import DistillationConfigError
from mmlinvit.models.distill.recorders import attach_recorders, recording


class _Block(nn.Module):
    """y = 2 x + 1, and ``(x + 1, x * 10)`` pairs when asked."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x + 1


class _Net(nn.Module):
    """Three blocks in a ``blocks`` list, plus a branch that may be skipped."""

    def __init__(self, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(depth))
        self.head = nn.Identity()

    def forward(self, x: torch.Tensor, use_head: bool = True) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x) if use_head else x


# ---------------------------------------------------------------- attach_recorders / recording
def test_recorders_for_a_missing_model_are_refused_and_none_are_fine():
    assert attach_recorders(None, None, 'teacher') == {}
    assert attach_recorders({}, None, 'teacher') == {}
    with pytest.raises(DistillationConfigError,
                       match='teacher_recorders are set but there is no teacher'):
        attach_recorders({'feat': 'blocks.0'}, None, 'teacher')


def test_build_and_attach_errors_name_the_recorder():
    model = _Net()
    # an unknown keyword: TypeError of the class, reported with the recorder's name
    with pytest.raises(DistillationConfigError,
                       match=r"student recorder 'feat': cannot build .*output_idx"):
        attach_recorders({'feat': dict(type='ModuleOutputs', source='blocks.{i}',
                                       output_idx=0)}, model, 'student')
    # an unknown type: KeyError of the recorder registry
    with pytest.raises(DistillationConfigError, match=r"student recorder 'feat': cannot build"):
        attach_recorders({'feat': dict(type='ModuleOutput', source='blocks.{i}')}, model,
                         'student')
    with pytest.raises(DistillationConfigError, match=r"teacher recorder 'attn': module "
                       r"'blocks.0.attn' does not exist"):
        attach_recorders({'attn': 'blocks.0.attn'}, model, 'teacher')
    recs = attach_recorders({'a': 'blocks.{i}', 'b': 'head'}, model, 'student')
    assert sorted(recs) == ['a', 'b'] and recs['a'].paths == ['blocks.0', 'blocks.1', 'blocks.2']


def test_recording_starts_empty_and_forgets_on_exit():
    model = _Net()
    rec = attach_recorders({'head': 'head'}, model, 'student')['head']
    x = torch.ones(1, 2)
    rec.enabled = True  # a record left from outside the block
    model(x)
    rec.enabled = False
    with recording([rec]):
        with pytest.raises(RuntimeError, match=r"\['head'\] did not run"):
            rec.get()
        model(x)
        torch.testing.assert_close(rec.get(), torch.full((1, 2), 15.0))  # ((1*2+1)*2+1)*2+1
    assert not rec.enabled
    with pytest.raises(RuntimeError, match=r"\['head'\] did not run"):
        rec.get()
    model(x)  # hooks stay registered but record nothing
    with pytest.raises(RuntimeError, match='did not run'):
        rec.get()


# ---------------------------------------------------------------- recorders
def test_bad_sources_and_indices_are_refused():
    with pytest.raises(DistillationConfigError, match='must be a module path'):
        ModuleOutputsRecorder('')
    with pytest.raises(DistillationConfigError, match=r"'blocks.0' has no \{i\} template"):
        ModuleOutputsRecorder('blocks.0', indices=[0])
    model = _Net(depth=3)
    for idx in (3, -4):  # one past either end of blocks 0..2
        with pytest.raises(DistillationConfigError,
                           match=rf'index {idx} is out of range.*indices 0\.\.2'):
            ModuleOutputsRecorder('blocks.{i}', indices=[idx]).attach(model)
    rec = ModuleOutputsRecorder('blocks.{i}', indices=[2, -3]).attach(model)
    assert rec.indices == [2, 0] and rec.paths == ['blocks.2', 'blocks.0']


def test_a_missing_module_names_every_child_of_its_parent():
    model = nn.Module()
    model.trunk = nn.Module()
    names = ['stem', 'a', 'b', 'c', 'd', 'e']
    for name in names:
        setattr(model.trunk, name, nn.Identity())
    text = describe_missing_module(model, 'trunk.f.g')
    assert text == f"'trunk' (Module) has children {names}"
    assert describe_missing_module(model, 'x') == "the model root (Module) has children ['trunk']"


def test_a_plain_recorder_resolves_to_one_path_at_index_0():
    rec = ModuleOutputsRecorder('blocks.1').attach(_Net())
    assert (rec.indices, rec.paths, rec.is_template) == ([0], ['blocks.1'], False)


def test_a_recorder_context_starts_empty():
    model = _Net()
    rec = ModuleOutputsRecorder('head').attach(model)
    rec.enabled = True
    model(torch.ones(1, 2))
    rec.enabled = False
    with rec:
        with pytest.raises(RuntimeError, match=r"\['head'\] did not run"):
            rec.get()


def test_leaving_the_context_stops_recording():
    """After the ``with`` block the recorder is off: attached again (plain attach, no
    context), it records nothing until it is enabled."""
    model = _Net()
    rec = ModuleOutputsRecorder('head').attach(model)
    with rec:
        model(torch.ones(1, 2))
    assert not rec.enabled
    rec.attach(model)
    model(torch.ones(1, 2))
    with pytest.raises(RuntimeError, match=r"\['head'\] did not run"):
        rec.get()


def test_records_follow_the_paths_of_the_latest_attachment():
    """Re-attached from a 3-block to a 2-block model while enabled, the recorder returns the
    2 records of its current paths (an older slot 2 is no record of this model)."""
    deep, shallow = _Net(depth=3), _Net(depth=2)
    rec = ModuleOutputsRecorder('blocks.{i}').attach(deep)
    rec.enabled = True
    deep(torch.zeros(1))
    rec.attach(shallow)
    shallow(torch.ones(1))
    torch.testing.assert_close(rec.get(), [torch.full((1, ), 3.0), torch.full((1, ), 7.0)])


def test_an_unattached_recorder_says_so():
    for rec in (ModuleOutputsRecorder('blocks.{i}'), ModuleOutputsRecorder('head')):
        with pytest.raises(RuntimeError, match='not attached to a model'):
            rec.get()


class _Pair(nn.Module):

    def forward(self, x: torch.Tensor):
        return x + 1, x * 10


class _TwoArgs(nn.Module):

    def __init__(self) -> None:
        super().__init__()
        self.pair = _Pair()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pair(x)[1]


def test_output_index_0_keeps_the_first_element():
    model = _TwoArgs()
    x = torch.arange(3.0)
    with ModuleOutputsRecorder('pair', output_index=0).attach(model) as first, \
            ModuleOutputsRecorder('pair', output_index=-1).attach(model) as last:
        model(x)
        torch.testing.assert_close(first.get(), x + 1)
        torch.testing.assert_close(last.get(), x * 10)


def test_an_arg_index_past_the_arguments_is_named():
    model = _TwoArgs()
    with ModuleInputsRecorder('pair', arg_index=1).attach(model):
        with pytest.raises(RuntimeError, match='called with 1 positional arguments, '
                           'arg_index is 1'):
            model(torch.ones(2))


class _MapOp(nn.Module):
    """An operator whose map depends on a keyword argument of its forward."""

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x * scale

    def attention_map(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return (x * scale)[:, None, :, None] * x[:, None, None, :]  # (B, 1, N, N)


class _UsesMap(nn.Module):

    def __init__(self) -> None:
        super().__init__()
        self.op = _MapOp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x, scale=3.0)


def test_attention_maps_are_computed_with_the_forward_keywords():
    model = _UsesMap()
    x = torch.randn(2, 4)
    with AttentionMapsRecorder('op').attach(model) as rec:
        model(x)
        torch.testing.assert_close(rec.get(), 3.0 * x[:, None, :, None] * x[:, None, None, :])
    # an operator that declares it has no explicit map is refused
    model.op.has_attention_map = False
    with pytest.raises(DistillationConfigError, match='no explicit attention map'):
        AttentionMapsRecorder('op').attach(model)


# ---------------------------------------------------------------- block depths
def _stack(name: str, depth: int) -> nn.Module:
    model = nn.Module()
    model.add_module(name, nn.ModuleList(nn.Identity() for _ in range(depth)))
    return model


def _depth_check(student_src: str, student_idx: Any, teacher_src: str, teacher_idx: Any,
                 specs: List[Any], monkeypatch: pytest.MonkeyPatch) -> List[str]:
    """Runs ``check_stage_depths`` on a 2-block 'layers' student and a 4-block 'blocks'
    teacher; returns the sources whose blocks it counted (only templates may be counted:
    counting a plain path would never end)."""
    from mmlinvit.models.distill import stage_depths
    models = {'student': _stack('layers', 2), 'teacher': _stack('blocks', 4)}
    recorders = {'student': {'rec': ModuleOutputsRecorder(student_src, student_idx)},
                 'teacher': {'rec': ModuleOutputsRecorder(teacher_src, teacher_idx)}}
    for side in ('student', 'teacher'):
        recorders[side]['rec'].resolve(models[side], side)
    counted: List[str] = []
    real = stage_depths.count_blocks

    def count(model: nn.Module, template: str) -> int:
        counted.append(template)
        assert '{i}' in template, f'counting the blocks of the plain path {template!r}'
        return real(model, template)

    monkeypatch.setattr(stage_depths, 'count_blocks', count)
    stage_depths.check_stage_depths({'t': specs}, recorders, models)
    return counted


def test_depth_check_skips_what_it_cannot_pair(monkeypatch):
    from mmlinvit.models.distill.input_specs import InputSpec
    pair = [InputSpec('student_feats', 'student', 'rec'),
            InputSpec('teacher_feats', 'teacher', 'rec')]
    # 1/2 vs 1/4 at equal counts: refused (the check is live in this set-up)
    with pytest.raises(DistillationConfigError, match=r'1/2 vs 1/4'):
        _depth_check('layers.{i}', [0], 'blocks.{i}', [0], pair, monkeypatch)
    # a template against a plain path: not compared
    assert _depth_check('layers.{i}', [0], 'blocks.0', None, pair, monkeypatch) == []
    assert _depth_check('layers.0', None, 'blocks.{i}', [0], pair, monkeypatch) == []
    # different numbers of records: left to the term's shape check
    _depth_check('layers.{i}', [0, 1], 'blocks.{i}', [0], pair, monkeypatch)
    # an argument named student_* fed from the teacher, or teacher_* from the student: no pair
    _depth_check('layers.{i}', [0], 'blocks.{i}', [0],
                 [InputSpec('student_feats', 'teacher', 'rec'),
                  InputSpec('teacher_feats', 'teacher', 'rec')], monkeypatch)
    _depth_check('layers.{i}', [0], 'blocks.{i}', [0],
                 [InputSpec('student_feats', 'student', 'rec'),
                  InputSpec('teacher_feats', 'student', 'rec')], monkeypatch)


# ---------------------------------------------------------------- activation checkpointing
class _Counted(nn.Module):
    """A block with dropout (RNG replayed in a recomputation) that counts its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)
        self.calls = 0

    def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        self.calls += 1
        return self.drop(torch.tanh(self.fc(x))) * scale


def _run(with_cp: bool, train: bool = True, frozen: bool = False):
    from mmlinvit.backbones.checkpointing import run_block
    torch.manual_seed(0)
    block = _Counted().train(train).requires_grad_(not frozen)
    x = torch.randn(2, 3, 4, requires_grad=True)
    torch.manual_seed(5)
    out = run_block(block, x, 2.0, with_cp=with_cp)
    (out * torch.arange(4.0)).sum().backward()
    return out.detach(), x.grad, block


def test_run_block_checkpoints_with_equal_gradients_and_only_when_active():
    """Reference: torch.utils.checkpoint semantics, i.e. the plain run's output and gradients
    (dropout masks included), and one recomputation of the block in the backward pass."""
    out, grad, block = _run(with_cp=False)
    out_cp, grad_cp, block_cp = _run(with_cp=True)
    torch.testing.assert_close(out_cp, out, rtol=0, atol=0)
    torch.testing.assert_close(grad_cp, grad, rtol=0, atol=0)
    torch.testing.assert_close(block_cp.fc.weight.grad, block.fc.weight.grad, rtol=0, atol=0)
    assert (block.calls, block_cp.calls) == (1, 2)
    assert _run(with_cp=True, train=False)[2].calls == 1  # eval: not checkpointed
    # a frozen block still passes gradients to its input, so it is checkpointed
    frozen = _run(with_cp=True, frozen=True)
    torch.testing.assert_close(frozen[1], grad, rtol=0, atol=0)


# ---------------------------------------------------------------- checkpoint files
def _problem(path: str):
    from mmlinvit.converters.checkpoint_file import checkpoint_file_problem
    return checkpoint_file_problem(path)


def _mmengine_loads(path: str) -> bool:
    """Reference: whether mmengine's own checkpoint loading reads the file."""
    from mmengine.runner import CheckpointLoader
    try:
        CheckpointLoader.load_checkpoint(path, map_location='cpu')
    except Exception:  # noqa: BLE001 (any failure: the file does not load)
        return False
    return True


def test_files_mmengine_loads_are_intact_and_others_are_named(tmp_path):
    state = {'state_dict': {'w': torch.arange(6.0)}, 'meta': {'epoch': 1}}
    new = str(tmp_path / 'new.pth')
    torch.save(state, new)
    legacy = str(tmp_path / 'legacy.pth')
    torch.save(state, legacy, _use_new_zipfile_serialization=False)
    for path in (new, legacy):
        assert _mmengine_loads(path) and _problem(path) is None, path
    # a plain pickle (protocol 2, like a legacy file's first bytes) is no torch file
    import pickle
    plain = str(tmp_path / 'plain.pth')
    with open(plain, 'wb') as f:
        pickle.dump({'w': [0.0, 1.0]}, f, protocol=2)
    assert not _mmengine_loads(plain)
    assert 'is not a PyTorch checkpoint' in _problem(plain)
    # an archive cut short and a 1-byte file
    cut = str(tmp_path / 'cut.pth')
    with open(cut, 'wb') as f:
        f.write(open(new, 'rb').read()[:-30])
    one = str(tmp_path / 'one.pth')
    with open(one, 'wb') as f:
        f.write(b'P')
    for path in (cut, one):
        assert not _mmengine_loads(path) and _problem(path) is not None, path
    assert 'truncated or damaged' in _problem(cut)


@pytest.mark.parametrize('protocol', [3, 4, 5])
def test_legacy_files_of_any_pickle_protocol_are_intact(tmp_path, protocol):
    path = str(tmp_path / f'legacy{protocol}.pth')
    torch.save({'w': torch.ones(2)}, path, _use_new_zipfile_serialization=False,
               pickle_protocol=protocol)
    assert _mmengine_loads(path)
    assert _problem(path) is None


def test_a_directory_and_a_missing_file_are_named(tmp_path):
    from mmlinvit.converters.checkpoint_file import CheckpointFileError, check_checkpoint_file
    assert _problem(str(tmp_path)) == 'is not a file'
    assert _problem(str(tmp_path / 'nope.pth')) == 'does not exist'
    with pytest.raises(FileNotFoundError, match="'.*nope.pth' does not exist"):
        check_checkpoint_file(str(tmp_path / 'nope.pth'))
    assert not issubclass(CheckpointFileError, FileNotFoundError)


def test_short_safetensors_files_are_named(tmp_path):
    """safetensors layout: 8 bytes little-endian header length N, then N header bytes."""
    short = str(tmp_path / 'short.safetensors')
    with open(short, 'wb') as f:
        f.write(b'\x02\x00\x00\x00\x00')
    assert _problem(short) == ('is truncated: a safetensors file of only 5 bytes '
                               '(no header length)')
    header = b'{}'
    whole = str(tmp_path / 'whole.safetensors')
    with open(whole, 'wb') as f:
        f.write(len(header).to_bytes(8, 'little') + header)  # exactly 8 + N bytes
    assert _problem(whole) is None
    big_endian = str(tmp_path / 'big.safetensors')
    with open(big_endian, 'wb') as f:
        f.write(len(header).to_bytes(8, 'big') + header)
    assert 'its header claims 144115188075855872 bytes but the file has 10' in _problem(
        big_endian)


def test_read_errors_name_the_file_and_the_cause(tmp_path):
    from mmlinvit.converters.checkpoint_file import describe_read_error
    empty = str(tmp_path / 'empty.pth')
    open(empty, 'wb').close()
    text = describe_read_error(empty, EOFError('Ran out of input'))
    assert text.startswith(f'Checkpoint {empty!r} is empty (0 bytes)')
    assert text.endswith('(EOFError: Ran out of input)')
    intact = str(tmp_path / 'ok.pth')
    torch.save({'w': torch.zeros(1)}, intact)
    assert describe_read_error(intact, KeyError('x')) == (
        f"Checkpoint {intact!r} could not be read (KeyError: 'x')")


# ---------------------------------------------------------------- conversion reports
def test_summarise_keys_groups_resblocks_and_repeated_indices():
    from mmlinvit.converters.report import summarise_keys
    keys = [f'transformer.resblocks.{i}.ln_1.weight' for i in range(3)]
    assert summarise_keys(keys) == ['transformer.resblocks.{0-2}.ln_1.weight']
    assert summarise_keys(['blocks.1.a', 'blocks.1.a', 'blocks.2.a']) == ['blocks.{1-2}.a']
    assert summarise_keys(['blocks.4.a']) == ['blocks.4.a']
    assert summarise_keys(['blocks.4.a', 'blocks.6.a']) == ['blocks.{4,6}.a']
    ten = [f'k{i}' for i in range(10)]
    assert summarise_keys(ten, limit=10) == sorted(ten)  # exactly the limit: no count line
    assert summarise_keys(ten, limit=9) == sorted(ten)[:9] + ['... and 1 more']


def test_report_lines_and_summary():
    from mmlinvit.converters.report import ConversionReport
    report = ConversionReport(source_layout='timm', prefix='student.')
    report.renamed = {'norm.weight': 'ln1.weight'}
    for i in range(12):
        report.drop(f'blocks.{i}.attn.q_bias', 'no counterpart')
    report.loaded = 5
    report.unexpected = [f'head.layers.{i}.w' for i in range(3)]
    report.missing = ['mask_token', 'blocks.0.x']
    report.initialised = {'mask_token': 'kept at init'}
    lines = report.format().splitlines()
    assert lines == [
        'source layout: timm', "keys under 'student.'", 'renamed keys: 1', 'dropped keys: 12',
        '  no counterpart: blocks.{0-11}.attn.q_bias', 'loaded tensors: 5',
        'missing (left at init): mask_token (kept at init); blocks.0.x (skipped (strict=False))',
        'unexpected (ignored): head.layers.{0-2}.w']
    assert report.summary() == '; '.join(line.strip() for line in lines)
    assert '; no counterpart: blocks' in report.summary()
    assert report.describe_initialised(['blocks.0.x']) == ['blocks.0.x (skipped (strict=False))']
    assert str(report) == report.format()


# -------------------------------------- findings of this round (fixed; each failed before)
def test_empty_indices_are_refused_when_built():
    with pytest.raises(DistillationConfigError, match='indices'):
        ModuleOutputsRecorder('blocks.{i}', indices=[])


def test_output_index_on_a_tensor_output_is_refused():
    model = _Net()
    with ModuleOutputsRecorder('head', output_index=0).attach(model) as rec:
        with pytest.raises(RuntimeError, match='output_index'):
            model(torch.ones(3, 2))
            rec.get()  # shape (2,): sample 0 of the batch, without a word


# ---------------------------------------------------------------- registration
def test_every_backbone_is_built_by_its_scoped_name():
    import mmlinvit.models  # noqa: F401  (performs the registration)
    from mmlinvit.backbones import Adventurer, LinearVisionTransformer, VisionTransformer
    from mmlinvit.registry import MODELS
    for cls in (VisionTransformer, LinearVisionTransformer, Adventurer):
        assert MODELS.get(f'mmlinvit.{cls.__name__}') is cls, cls


def test_a_name_taken_by_another_class_is_not_silently_kept():
    """Registering twice is a no-op, but a clash with another class of the same name is
    refused (mmengine's ``register_module`` without ``force``), not hidden."""
    from mmlinvit.models.register import _register
    from mmlinvit.registry import MODELS
    name = '_Round13Probe'
    first = type(name, (nn.Module, ), {})
    second = type(name, (nn.Module, ), {})
    try:
        _register([first])
        _register([first])
        assert MODELS.module_dict[name] is first
        with pytest.raises(KeyError, match='already registered'):
            _register([second])
    finally:
        MODELS.module_dict.pop(name, None)


# ---------------------------------------------------------------- student preprocessing
def test_own_batch_augments_win_over_train_cfg_as_in_mmpretrain():
    """Reference: mmpretrain's ImageClassifier keeps its data_preprocessor's batch_augments
    and ignores train_cfg.augments then (``setdefault``); a model preprocessor equal to the
    student's own therefore drops nothing."""
    from mmengine.registry import DefaultScope
    from mmpretrain.models.utils.batch_augments import CutMix
    from mmpretrain.registry import MODELS as PRETRAIN_MODELS

    from mmlinvit.models.distill.student_preprocessing import check_student_preprocessing
    own = dict(type='ClsDataPreprocessor', num_classes=4,
               batch_augments=dict(augments=[dict(type='CutMix', alpha=1.0)]))
    student = dict(type='ImageClassifier',
                   backbone=dict(type='mmpretrain.ResNet', depth=18),
                   head=dict(type='LinearClsHead', num_classes=4, in_channels=512),
                   train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8)]),
                   data_preprocessor=own)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        built = PRETRAIN_MODELS.build(
            dict(student, data_preprocessor=dict(own), train_cfg=dict(student['train_cfg'])))
    augments = built.data_preprocessor.batch_augments.augments
    assert [type(a) for a in augments] == [CutMix]
    check_student_preprocessing(student, dict(own))


def test_tuples_and_lists_of_the_same_values_are_the_same_setting():
    from mmlinvit.models.distill.student_preprocessing import check_student_preprocessing
    stats = dict(mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375))
    student = dict(type='ImageClassifier', data_preprocessor=dict(type='ClsDataPreprocessor',
                                                                  **stats))
    model = dict(type='ClsDataPreprocessor', **{k: list(v) for k, v in stats.items()})
    check_student_preprocessing(student, model)
    with pytest.raises(DistillationConfigError, match=r'data_preprocessor\.std'):
        check_student_preprocessing(student, dict(model, std=[1.0, 1.0, 1.0]))


def test_maps_of_a_no_grad_forward_carry_no_graph():
    from mmlinvit.backbones import VisionTransformer
    torch.manual_seed(0)
    teacher = VisionTransformer(dict(embed_dims=16, num_layers=1, num_heads=2,
                                     mlp_hidden_dims=32), attn_cfg='softmax', img_size=16,
                                patch_size=8).eval()  # parameters not frozen
    with AttentionMapsRecorder('blocks.{i}.attn').attach(teacher) as maps, \
            ModuleOutputsRecorder('blocks.{i}.attn').attach(teacher) as outs:
        with torch.no_grad():
            teacher(torch.randn(1, 3, 16, 16))
        assert not outs.get()[0].requires_grad  # torch: no_grad results carry no graph
        assert not maps.get()[0].requires_grad
