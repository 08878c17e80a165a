"""A distillation config's ``weight_transfer`` against the student's own ``pretrained=`` and
against a teacher whose structure the student does not share, both at build time.

* ``model.student.backbone.pretrained=<file>`` (e.g. a ``tools/linearize.py`` output) with the
  Copy-MLP config's default ``weight_transfer=dict(type='mlp_copy')``: ``init_weights`` loaded
  the file and then overwrote its MLPs with the teacher's, logging only the usual INFO line.
* ``model.teacher.family=deit3`` with the student left at ``family='deit'``: the copied MLP
  branch ran at 1/gamma of the teacher's.
"""
import pytest
import torch

import mmlinvit.models  # noqa: F401  (registers mmlinvit's models)
from mmlinvit.backbones import VisionTransformer
from mmlinvit.models.distill import DistillationConfigError
from mmlinvit.registry import MODELS

ARCH = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
COMMON = dict(arch=ARCH, img_size=32, patch_size=8, out_type='raw')


def config(student=None, teacher=None, weight_transfer=dict(type='mlp_copy')):
    # Scoped names: an earlier test in the same process may have set another default scope.
    return dict(type='mmlinvit.DistillationModel',
                student=dict(type='mmlinvit.VisionTransformer', attn_cfg='elu', **COMMON,
                             **(student or {})),
                teacher=dict(type='mmlinvit.VisionTransformer', attn_cfg='softmax', **COMMON,
                             **(teacher or {})),
                weight_transfer=weight_transfer, check_input_size=(32, 32))


@pytest.fixture
def student_file(tmp_path):
    """A student file of the kind tools/linearize.py writes (random weights, elu operator)."""
    torch.manual_seed(3)
    student = VisionTransformer(attn_cfg='elu', **COMMON)
    path = str(tmp_path / 'student.pth')
    torch.save(dict(state_dict=student.state_dict()), path)
    return path, student.state_dict()


def test_pretrained_student_with_a_weight_transfer_is_refused(student_file):
    path, _ = student_file
    with pytest.raises(DistillationConfigError) as info:
        MODELS.build(config(student=dict(pretrained=path)))
    message = str(info.value)
    assert 'model.student.pretrained' in message and path in message
    assert 'model.weight_transfer=None' in message and "'mlp_copy'" in message


def test_the_fix_keeps_the_files_weights(student_file):
    path, saved = student_file
    model = MODELS.build(config(student=dict(pretrained=path), weight_transfer=None))
    model.init_weights()
    state = model.student.state_dict()
    for key in ('blocks.0.mlp.fc1.weight', 'blocks.1.attn.qkv.weight'):
        assert torch.equal(state[key], saved[key]), key
    # 'random' writes nothing: allowed together with pretrained=
    model = MODELS.build(config(student=dict(pretrained=path),
                                weight_transfer=dict(type='random')))
    model.init_weights()
    assert torch.equal(model.student.state_dict()['blocks.0.mlp.fc1.weight'],
                       saved['blocks.0.mlp.fc1.weight'])


def test_a_task_model_student_names_the_backbone_path(student_file):
    path, _ = student_file
    student = dict(type='ImageClassifier',
                   backbone=dict(type='mmlinvit.VisionTransformer', attn_cfg='elu',
                                 pretrained=path, **dict(COMMON, out_type='cls_token')),
                   head=dict(type='LinearClsHead', num_classes=3, in_channels=32))
    cfg = config()
    cfg['student'] = student
    cfg['teacher'] = dict(cfg['teacher'], out_type='cls_token')
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        with pytest.raises(DistillationConfigError,
                           match=r'model\.student\.backbone\.pretrained=.*'
                                 r'model\.weight_transfer=None'):
            MODELS.build(cfg)


@pytest.mark.parametrize('how', ['pretrained', 'init_cfg'])
def test_a_task_model_student_with_a_model_level_pretrained_is_refused(student_file, how):
    """mmpretrain's ImageClassifier(pretrained=PATH) becomes init_cfg=Pretrained, which
    init_weights() loads before the transfer: 72 tensors of the file were overwritten."""
    path, _ = student_file
    student = dict(type='ImageClassifier',
                   backbone=dict(type='mmlinvit.VisionTransformer', attn_cfg='elu',
                                 **dict(COMMON, out_type='cls_token')),
                   head=dict(type='LinearClsHead', num_classes=3, in_channels=32))
    student.update(dict(pretrained=path) if how == 'pretrained' else
                   dict(init_cfg=dict(type='Pretrained', checkpoint=path)))
    cfg = config()
    cfg['student'] = student
    cfg['teacher'] = dict(cfg['teacher'], out_type='cls_token')
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        with pytest.raises(DistillationConfigError,
                           match=r'model\.student\.init_cfg \(Pretrained\)=.*'
                                 r'model\.weight_transfer=None'):
            MODELS.build(cfg)


def test_a_pretrained_head_is_not_a_pretrained_student(student_file):
    """A head's Pretrained init_cfg does not touch the backbone the transfer writes."""
    path, _ = student_file
    student = dict(type='ImageClassifier',
                   backbone=dict(type='mmlinvit.VisionTransformer', attn_cfg='elu',
                                 **dict(COMMON, out_type='cls_token')),
                   head=dict(type='LinearClsHead', num_classes=3, in_channels=32,
                             init_cfg=dict(type='Pretrained', checkpoint=path)))
    cfg = config()
    cfg['student'] = student
    cfg['teacher'] = dict(cfg['teacher'], out_type='cls_token')
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        MODELS.build(cfg)


def test_teacher_layer_scale_without_place_is_refused_at_build_time():
    with pytest.raises(DistillationConfigError) as info:
        MODELS.build(config(teacher=dict(family='deit3')))
    message = str(info.value)
    assert 'blocks.0.ls2.gamma' in message and 'layer_scale_init' in message
    assert 'model.weight_transfer' in message
    # the student option that gives the gamma a place, or the deliberate opt-out
    MODELS.build(config(teacher=dict(family='deit3'), student=dict(family='deit3')))
    model = MODELS.build(config(teacher=dict(family='deit3'),
                                weight_transfer=dict(type='mlp_copy',
                                                     include_layer_scale=False)))
    model.init_weights()
    assert 'blocks.0.ls2.gamma' in model.transfer_report.no_counterpart
