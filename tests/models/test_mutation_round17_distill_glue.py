"""Distillation glue and package plumbing (mutation round 17): branches the suite let pass.

Guarded here, each against a reference written in the test or run in it:

* ``stage_depths``: the fix named for repeated recorder indices (more records than student
  blocks) is still a :class:`DistillationConfigError`, with the student blocks worked out by
  hand from ``(i + 1) / depth``;
* ``teacher_input_norm``: the conversion behind the real mmseg ``SegDataPreProcessor``
  (``bgr_to_rgb``, ``size_divisor`` padding) and the real mmpretrain ``ClsDataPreprocessor``
  equals the official teacher normalisation (OpenAI CLIP, ImageNet for DINOv2 / DeiT) of the
  raw RGB pixels, worked out in the test; a non-normalising real preprocessor is named;
  the folded patch projection equals the teacher projection on converted pixels;
* ``NameRegistry``, ``config_scopes``, ``_config_scope_hook`` and ``log_forwarding``: the
  branches listed in each test's docstring.

Findings of this round (each test marked FINDING failed on the code before the fix):

* ``log_forwarding``: a handler a user put on the ``mmlinvit`` logger (no root handler) got
  each WARNING, and Python's last-resort handler printed it a second time on stderr, which
  plain Python logging never does; and with ``propagate = False`` on ``mmlinvit`` and a root
  handler, the WARNING reached no console at all (fix: Python's own handler search,
  ``log_forwarding._other_handlers``);
* ``NameRegistry.get``: a class given as ``type`` (as mmengine's registries take it, e.g.
  ``weight_transfer=dict(type=QKVCopy)``) failed with ``AttributeError: type object 'QKVCopy'
  has no attribute 'startswith'``; it is a ``TypeError`` listing the registered names.
"""
import importlib.abc
import importlib.machinery
import logging
import sys
import types
from typing import List, Optional, Sequence, Tuple

import pytest
import torch
import torch.nn as nn
from mmengine.structures import PixelData

from mmlinvit.distill.recorders import ModuleOutputsRecorder
from mmlinvit.models.distill import DistillationConfigError
from mmlinvit.models.distill.input_specs import InputSpec
from mmlinvit.models.distill.stage_depths import check_stage_depths
from mmlinvit.models.distill.teacher_input_norm import (TeacherInputNorm,
                                                        fold_into_patch_embedding,
                                                        student_input_stats)

#: OpenAI CLIP's normalisation (openai/CLIP ``clip.py`` ``_transform``), 0-1 RGB units.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: ImageNet normalisation (torchvision / DINOv2 / DeiT), 0-1 RGB units.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _times_255(values: Sequence[float]) -> List[float]:
    return [v * 255 for v in values]


# ---------------------------------------------------------------- stage_depths
class _Stack(nn.Module):
    """A model whose ``name`` child is a list of ``depth`` identity blocks."""

    def __init__(self, name: str, depth: int) -> None:
        super().__init__()
        self.add_module(name, nn.ModuleList(nn.Identity() for _ in range(depth)))


def _check(student: Tuple[List[int], int], teacher: Tuple[List[int], int]) -> None:
    """``check_stage_depths`` on a ``layers.{i}`` student and a ``blocks.{i}`` teacher."""
    models = {'student': _Stack('layers', student[1]), 'teacher': _Stack('blocks', teacher[1])}
    recorders = {'student': {'rec': ModuleOutputsRecorder('layers.{i}', student[0])},
                 'teacher': {'rec': ModuleOutputsRecorder('blocks.{i}', teacher[0])}}
    for side in ('student', 'teacher'):
        recorders[side]['rec'].resolve(models[side], side)
    specs = {'t': [InputSpec('student_feats', 'student', 'rec'),
                   InputSpec('teacher_feats', 'teacher', 'rec')]}
    check_stage_depths(specs, recorders, models)


def test_repeated_indices_get_the_named_fix_not_a_stage_error():
    """Three records of block 1 of a 2-block student against block 1 of a 4-block teacher:
    (1 + 1) / 2 != (1 + 1) / 4.  The teacher's fraction 2/4 is student block 2 * 2 / 4 - 1 = 0,
    so the fix is ``[0, 0, 0]``; three stages of a two-block student do not exist, so no stage
    hint (and no ``ValueError`` from ``stage_block_indices(2, 3)``)."""
    with pytest.raises(DistillationConfigError) as info:
        _check(([1, 1, 1], 2), ([1, 1, 1], 4))
    message = str(info.value)
    assert 'indices=[0, 0, 0]' in message
    assert '2/2 vs 2/4' in message
    assert 'equal stages' not in message


# ---------------------------------------------------------------- teacher_input_norm
def _raw_bgr(seed: int, size: int = 8) -> torch.Tensor:
    """(2, 3, size, size) uint8 BGR images (what mmcv's LoadImageFromFile gives)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (2, 3, size, size), generator=generator, dtype=torch.uint8)


def _official(raw_bgr: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """torchvision-style ``Normalize(mean, std)(ToTensor()(rgb))`` of BGR uint8 images, fp64."""
    rgb = raw_bgr.flip(1).double() / 255
    return (rgb - torch.tensor(mean, dtype=torch.float64).view(1, 3, 1, 1)) / \
        torch.tensor(std, dtype=torch.float64).view(1, 3, 1, 1)


def test_a_clip_teacher_behind_the_real_mmseg_preprocessor_sees_clips_normalisation():
    """mmseg ``SegDataPreProcessor`` (ImageNet statistics in 0-255, ``bgr_to_rgb``, padding to
    a size divisor) then ``teacher_input_norm`` = CLIP's statistics * 255: the image region is
    OpenAI CLIP's own normalisation of the RGB pixels; the padding the preprocessor added after
    normalising (student zeros) is the converted zero ``(mean_s - mean_t) / std_t``."""
    from mmseg.models.data_preprocessor import SegDataPreProcessor
    from mmseg.structures import SegDataSample
    pre = SegDataPreProcessor(mean=_times_255(IMAGENET_MEAN), std=_times_255(IMAGENET_STD),
                              bgr_to_rgb=True, size_divisor=16, pad_val=0, seg_pad_val=255)
    raw = _raw_bgr(0)
    samples = []
    for _ in range(2):
        sample = SegDataSample()
        sample.set_metainfo(dict(img_shape=(8, 8), ori_shape=(8, 8)))
        sample.gt_sem_seg = PixelData(data=torch.zeros(1, 8, 8, dtype=torch.long))
        samples.append(sample)
    batch = pre(dict(inputs=list(raw), data_samples=samples), training=True)['inputs']
    assert batch.shape == (2, 3, 16, 16)
    norm = TeacherInputNorm(_times_255(CLIP_MEAN), _times_255(CLIP_STD), pre)
    teacher = norm(batch, pre).double()
    torch.testing.assert_close(teacher[..., :8, :8], _official(raw, CLIP_MEAN, CLIP_STD),
                               rtol=0, atol=1e-5)
    pad = (torch.tensor(IMAGENET_MEAN, dtype=torch.float64) -
           torch.tensor(CLIP_MEAN, dtype=torch.float64)) / torch.tensor(CLIP_STD,
                                                                        dtype=torch.float64)
    torch.testing.assert_close(teacher[..., 8:, 8:],
                               pad.view(1, 3, 1, 1).expand(2, 3, 8, 8), rtol=0, atol=1e-5)


def test_an_imagenet_teacher_behind_a_clip_normalising_mmpretrain_preprocessor():
    """mmpretrain ``ClsDataPreprocessor`` with CLIP statistics and ``to_rgb`` (a CLIP recipe)
    and a DINOv2 / DeiT teacher: the teacher sees the ImageNet normalisation of the pixels."""
    from mmpretrain.models import ClsDataPreprocessor
    pre = ClsDataPreprocessor(mean=_times_255(CLIP_MEAN), std=_times_255(CLIP_STD), to_rgb=True)
    raw = _raw_bgr(1)
    batch = pre(dict(inputs=list(raw)), training=False)['inputs']
    torch.testing.assert_close(batch.double(), _official(raw, CLIP_MEAN, CLIP_STD),
                               rtol=0, atol=1e-5)
    norm = TeacherInputNorm.from_config(
        dict(mean=_times_255(IMAGENET_MEAN), std=_times_255(IMAGENET_STD)), pre)
    torch.testing.assert_close(norm(batch, pre).double(),
                               _official(raw, IMAGENET_MEAN, IMAGENET_STD), rtol=0, atol=1e-5)


def test_a_real_preprocessor_without_normalisation_is_named():
    """mmseg's ``SegDataPreProcessor(mean=None, std=None)`` registers no statistics."""
    from mmseg.models.data_preprocessor import SegDataPreProcessor
    pre = SegDataPreProcessor(mean=None, std=None)
    with pytest.raises(DistillationConfigError, match='SegDataPreProcessor.*does not normalise'):
        student_input_stats(pre)


def test_the_folded_projection_reads_the_student_batch_as_the_teacher_reads_its_own():
    """conv_folded(x_s) == conv_teacher((x_s * std_s + mean_s - mean_t) / std_t), with distinct
    per-channel statistics, a non-square patch grid and more input channels than 1."""
    torch.manual_seed(0)
    teacher = nn.Conv2d(3, 5, kernel_size=4, stride=4)
    student = nn.Conv2d(3, 5, kernel_size=4, stride=4)
    student.load_state_dict(teacher.state_dict())
    mean_s, std_s = torch.tensor([10.0, 100.0, 200.0]), torch.tensor([2.0, 20.0, 50.0])
    mean_t, std_t = torch.tensor([30.0, 60.0, 90.0]), torch.tensor([5.0, 10.0, 40.0])
    fold_into_patch_embedding(student, mean_s, std_s, mean_t, std_t)
    x_s = torch.randn(2, 3, 8, 12)
    x_t = (x_s * std_s.view(1, 3, 1, 1) + mean_s.view(1, 3, 1, 1) - mean_t.view(1, 3, 1, 1)) / \
        std_t.view(1, 3, 1, 1)
    with torch.no_grad():
        torch.testing.assert_close(student(x_s), teacher(x_t), rtol=1e-5, atol=1e-4)
    no_bias = nn.Conv2d(3, 5, kernel_size=4, stride=4, bias=False)
    with pytest.raises(DistillationConfigError, match='no bias'):
        fold_into_patch_embedding(no_bias, mean_s, std_s, mean_t, std_t)



def test_any_channel_std_above_1_means_0_255_units():
    """A std above 1 exists only in 0-255 units (a 0-1 pixel std is at most 0.5), whichever
    channel has it: a caffe-style std of 1 on two channels does not make the set 0-1."""
    from mmlinvit.models.distill.teacher_input_norm import _pixel_units
    assert _pixel_units(torch.zeros(3), torch.tensor([1.0, 1.0, 58.395])) == '0-255'
    assert _pixel_units(torch.zeros(3), torch.tensor([58.395, 0.5, 0.5])) == '0-255'


class _MeanOnly(nn.Module):
    """A preprocessor that subtracts a mean and keeps no ``std`` (e.g. a user's own)."""

    def __init__(self) -> None:
        super().__init__()
        self._enable_normalize = True
        self.register_buffer('mean', torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1))
        self.std = None


def test_a_preprocessor_without_a_std_tensor_is_named_not_an_attribute_error():
    with pytest.raises(DistillationConfigError, match='_MeanOnly.*does not normalise'):
        student_input_stats(_MeanOnly())


# ---------------------------------------------------------------- NameRegistry
def test_a_class_given_as_type_is_named_not_an_attribute_error():
    """FINDING: ``build(dict(type=SomeClass))`` (mmengine's registries take a class there)
    failed with ``AttributeError: type object 'X' has no attribute 'startswith'``; a
    ``TypeError`` now says the type must be a registered name and lists them."""
    from mmlinvit.utils.name_registry import NameRegistry
    registry = NameRegistry('strategy')

    @registry.register_module()
    class Alpha:
        pass

    with pytest.raises(TypeError, match=r'registered name.*Alpha.*got <class'):
        registry.build(dict(type=Alpha))
    assert isinstance(registry.build(dict(type='Alpha')), Alpha)



@pytest.mark.parametrize('kind, plural', [('checkpoint', 'checkpoints'), ('mask', 'masks'),
                                          ('weight-transfer strategy',
                                           'weight-transfer strategies')])
def test_plural_of_words_not_ending_in_y(kind: str, plural: str):
    """Only a consonant + ``y`` ending becomes ``ies`` (English plural, worked out by hand)."""
    from mmlinvit.utils.name_registry import NameRegistry
    assert NameRegistry(kind).plural == plural


# ---------------------------------------------------------------- config_scopes
def test_a_local_base_named_like_the_scope_is_mmengines(tmp_path):
    """``_base_ = 'mmlinvit'`` (no ``::``) is a file next to the config, as mmengine resolves
    any plain path: no scope, no reading of mmlinvit's configs."""
    from mmengine.config import Config

    import mmlinvit.config_scopes  # noqa: F401  (wraps Config._get_cfg_path)
    filename = str(tmp_path / 'user.py')
    assert Config._get_cfg_path('mmlinvit', filename) == (str(tmp_path / 'mmlinvit'), None)

# ---------------------------------------------------------------- log_forwarding
class _Collect(logging.Handler):
    """Keeps the messages it handles."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


def _stderr_copies(logger_name: str, message: str, capsys: pytest.CaptureFixture) -> int:
    """How often a WARNING of ``logger_name`` reaches stderr (Python's last resort)."""
    capsys.readouterr()
    logging.getLogger(logger_name).warning(message)
    return capsys.readouterr().err.count(message)


def test_a_handler_on_the_mmlinvit_logger_gets_each_warning_once(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """FINDING: with a handler on the ``mmlinvit`` logger and none on the root, Python prints
    nothing more (its last resort runs only when no handler was met); the forwarder printed a
    second, bare copy on stderr.  Reference: the same set-up on a plain logger tree."""
    from mmlinvit import log_forwarding
    monkeypatch.setattr(logging.getLogger(), 'handlers', [])
    # reference: plain Python logging
    plain = _Collect()
    monkeypatch.setattr(logging.getLogger('round17plain'), 'handlers', [plain])
    assert _stderr_copies('round17plain.child', 'round17 plain', capsys) == 0
    assert plain.seen == ['round17 plain']
    # the mmlinvit tree, with the forwarder installed
    user = _Collect()
    mmlinvit_logger = logging.getLogger(log_forwarding.LOGGER_NAME)
    monkeypatch.setattr(mmlinvit_logger, 'handlers', list(mmlinvit_logger.handlers) + [user])
    log_forwarding.install()
    assert any(isinstance(h, log_forwarding.MMLoggerForwarder) for h in mmlinvit_logger.handlers)
    assert _stderr_copies('mmlinvit.converters.loading', 'round17 user', capsys) == 0
    assert user.seen == ['round17 user']


def test_a_non_propagating_mmlinvit_logger_falls_back_to_the_last_resort_as_in_python(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """FINDING (same fix): ``propagate = False`` on ``mmlinvit`` with a root handler: Python
    meets no handler and prints the WARNING once through its last resort; the forwarder
    looked at the root's handlers (never reached) and dropped it from the console."""
    from mmlinvit import log_forwarding
    monkeypatch.setattr(logging.getLogger(), 'handlers', [_Collect()])
    plain = logging.getLogger('round17plain2')
    monkeypatch.setattr(plain, 'handlers', [])
    monkeypatch.setattr(plain, 'propagate', False)
    assert _stderr_copies('round17plain2.child', 'round17 plain2', capsys) == 1
    mmlinvit_logger = logging.getLogger(log_forwarding.LOGGER_NAME)
    monkeypatch.setattr(mmlinvit_logger, 'handlers', list(mmlinvit_logger.handlers))
    monkeypatch.setattr(mmlinvit_logger, 'propagate', False)
    log_forwarding.install()
    assert _stderr_copies('mmlinvit.converters.loading', 'round17 alone', capsys) == 1


def test_without_a_run_logger_no_mmlogger_is_created(monkeypatch: pytest.MonkeyPatch):
    """Before any Runner / tool logger exists, a record adds nothing: asking mmengine for the
    current instance would create a default ``mmengine`` MMLogger as a side effect."""
    from collections import OrderedDict

    from mmengine.logging import MMLogger
    monkeypatch.setattr(MMLogger, '_instance_dict', OrderedDict())
    monkeypatch.setattr(logging.getLogger(), 'handlers', [_Collect()])
    logging.getLogger('mmlinvit.converters.loading').warning('round17 no run logger')
    assert len(MMLogger._instance_dict) == 0


# ---------------------------------------------------------------- _config_scope_hook
class _SpecFinder:
    """A meta-path finder that answers one module name with a fixed spec."""

    def __init__(self, name: str, spec) -> None:
        self.name, self.spec = name, spec

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target=None):
        return self.spec if fullname == self.name else None


def test_hook_finder_wraps_only_the_trigger_and_only_a_real_loader(
        monkeypatch: pytest.MonkeyPatch):
    """``mmengine.config.<sub>`` (a submodule, not the trigger) is not answered; a spec without
    a loader (a namespace package) is returned as found, not wrapped."""
    from mmlinvit import _config_scope_hook as hook
    trigger = hook._TRIGGER
    loaderless = importlib.machinery.ModuleSpec(trigger, None)
    sub = importlib.machinery.ModuleSpec(trigger + '.utils', None)
    finder = hook.ConfigScopeFinder()
    monkeypatch.setattr(sys, 'meta_path', [finder, _SpecFinder(trigger, loaderless),
                                           _SpecFinder(trigger + '.utils', sub)])
    spec = finder.find_spec(trigger, None)
    assert spec is loaderless and spec.loader is None
    assert finder.find_spec(trigger + '.utils', None) is None
    assert finder.find_spec(trigger + 'x', None) is None


def test_two_hook_finders_do_not_ask_each_other_without_end(monkeypatch: pytest.MonkeyPatch):
    """Two copies of mmlinvit (an installed one and a source tree) each put a finder on
    ``sys.meta_path``: the first asks the second, which must not ask the first back."""
    from mmlinvit import _config_scope_hook as hook
    trigger = hook._TRIGGER

    class _Loader(importlib.machinery.SourceFileLoader):
        pass

    found = importlib.machinery.ModuleSpec(trigger, _Loader(trigger, 'x.py'))
    first, second = hook.ConfigScopeFinder(), hook.ConfigScopeFinder()
    monkeypatch.setattr(sys, 'meta_path', [first, second, _SpecFinder(trigger, found)])
    spec = first.find_spec(trigger, None)
    assert spec is found
    assert isinstance(spec.loader, hook._RegisterAfterExec)
    assert not first._searching and not second._searching



def test_the_wrapped_loader_creates_the_module_its_loader_creates():
    """``create_module`` is the wrapped loader's (a loader may make its own module object)."""
    from mmlinvit import _config_scope_hook as hook
    made = types.ModuleType('round17_made')

    class _Maker(importlib.abc.Loader):
        def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
            return made

        def exec_module(self, module: types.ModuleType) -> None:
            pass

    spec = importlib.machinery.ModuleSpec('round17_made', None)
    assert hook._RegisterAfterExec(_Maker()).create_module(spec) is made

def test_install_with_the_trigger_loaded_registers_and_adds_no_finder(
        monkeypatch: pytest.MonkeyPatch):
    from mmlinvit import _config_scope_hook as hook
    assert hook._TRIGGER in sys.modules
    calls: List[str] = []
    monkeypatch.setattr(hook, '_register', lambda: calls.append('now'))
    monkeypatch.setattr(sys, 'meta_path', [f for f in sys.meta_path
                                           if not isinstance(f, hook.ConfigScopeFinder)])
    hook.install()
    assert calls == ['now']
    assert not any(isinstance(f, hook.ConfigScopeFinder) for f in sys.meta_path)
