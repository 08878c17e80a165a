"""A segmentor student's patch padding is the teacher's too.

``mmlinvit.EncoderDecoder`` pads its batch to a multiple of the patch size before its backbone,
at the bottom / right or, with ``patch_padding='center'``, as DINOv2's ``CenterPadding``.  The
teacher (a bare backbone, or a segmentor run with ``mode='tensor'``) padded its unpadded batch
itself, always at the bottom / right: with centred padding every teacher token covered pixels
shifted against the student's (final features 2.0x their own mean square apart with the same
weights), a silently wrong distillation target.  The oracle: the tensor the student's backbone
receives, recorded by a forward pre-hook, is the tensor the teacher's backbone receives, and a
student with the teacher's weights has a zero attention-output loss.
"""
from typing import Dict, List

import pytest
import torch
from mmengine.registry import DefaultScope
from mmengine.structures import PixelData
from mmseg.structures import SegDataSample

from mmlinvit.registry import MODELS

from distill_testing import tiny_arch

PATCH = 4


def _vit() -> dict:
    return dict(type='mmlinvit.VisionTransformer', arch=tiny_arch(embed_dims=16),
                patch_size=PATCH, img_size=16, attn_cfg='softmax', out_type='featmap')


def _model(padding: str, teacher_kind: str):
    student = dict(type='mmlinvit.EncoderDecoder', patch_padding=padding, backbone=_vit(),
                   decode_head=dict(type='mmseg.FCNHead', in_channels=16, channels=8,
                                    num_convs=1, num_classes=3))
    teacher = _vit() if teacher_kind == 'backbone' else dict(student, patch_padding='corner')
    prefix = '' if teacher_kind == 'backbone' else 'backbone.'
    cfg = dict(
        type='mmlinvit.DistillationModel', student=student, teacher=teacher,
        data_preprocessor=dict(type='mmseg.SegDataPreProcessor', mean=[0., 0., 0.],
                               std=[1., 1., 1.]),
        student_recorders=dict(a=dict(type='ModuleOutputs', source='backbone.blocks.{i}.attn')),
        teacher_recorders=dict(a=dict(type='ModuleOutputs', source=prefix + 'blocks.{i}.attn')),
        distill_losses=dict(a=dict(
            loss=dict(type='mmlinvit.AttentionOutputMSELoss', loss_weight=1.0),
            inputs=dict(student_outputs='student.a', teacher_outputs='teacher.a'))),
        check_input_size=None)
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(cfg)
    teacher_backbone = model.teacher if teacher_kind == 'backbone' else model.teacher.backbone
    teacher_backbone.load_state_dict(model.student.backbone.state_dict())
    return model, teacher_backbone


@pytest.mark.parametrize('teacher_kind', ['backbone', 'segmentor'])
@pytest.mark.parametrize('padding', ['corner', 'center'])
@pytest.mark.parametrize('size', [(30, 30), (29, 34), (32, 32)])
def test_the_teacher_sees_the_pixels_the_student_backbone_sees(padding, teacher_kind, size):
    model, teacher_backbone = _model(padding, teacher_kind)
    seen: Dict[str, List[torch.Tensor]] = {'student': [], 'teacher': []}
    hooks = [model.student.backbone.register_forward_pre_hook(
                 lambda module, args: seen['student'].append(args[0].detach().clone())),
             teacher_backbone.register_forward_pre_hook(
                 lambda module, args: seen['teacher'].append(args[0].detach().clone()))]
    h, w = size
    inputs = torch.randn(2, 3, h, w)
    samples = [SegDataSample(gt_sem_seg=PixelData(data=torch.zeros(1, h, w, dtype=torch.long)),
                             metainfo=dict(img_shape=size, pad_shape=size, ori_shape=size))
               for _ in range(2)]
    with DefaultScope.overwrite_default_scope('mmseg'):
        losses = model.loss(inputs, samples)
    for hook in hooks:
        hook.remove()
    student_in, = seen['student']
    teacher_in, = seen['teacher']
    # the reference padding: DINOv2's CenterPadding (smaller half first) or bottom / right
    pad_h, pad_w = -h % PATCH, -w % PATCH
    top, left = (pad_h // 2, pad_w // 2) if padding == 'center' else (0, 0)
    assert student_in.shape[-2:] == (h + pad_h, w + pad_w)
    assert torch.equal(student_in[..., top:top + h, left:left + w], inputs)
    assert torch.equal(teacher_in, student_in)
    assert float(losses['distill.loss_a']) == 0.0  # same weights, same pixels
