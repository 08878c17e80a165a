"""Mutation round 16: the segmentor, the neck and the distillation model's glue.

Each test fails on a one-line change of its module that the rest of the suite let through,
and checks the behaviour against a reference written or run in the test (a formula or a hand
value, mmseg / mmengine / mmpretrain classes, torch's ``adaptive_max_pool2d``):

* ``mmlinvit.EncoderDecoder``: a non-square ``(p_h, p_w)`` patch pads each side to its own
  multiple (``-size % p``, mmseg's ``PatchEmbed`` corner formula; DINOv2's ``CenterPadding``
  split); ``loss`` leaves ``pad_shape`` in the metas as mmseg's ``SegDataPreProcessor`` with
  ``size_divisor`` does when it pads the batch;
* ``CoveringMaxPool2d(1)`` is ``MaxPool2d(1, 1)`` (only factors below 1 are refused); the
  0.25x level of ``FullGridFeature2Pyramid`` covers an odd grid as ``adaptive_max_pool2d``;
* ``DistillationModel``: ``teacher_input_norm`` folds into the student's patch projection only
  when the weight transfer copied the teacher's (``mlp_copy`` leaves the student's own);
  ``mode='predict'`` of a bare-backbone student is refused;
* the teacher counts as loaded (no "random initialisation" warning) for a scoped
  ``'mmengine.Pretrained'`` init_cfg and for a backbone loaded with ``load_state_dict``;
* an input spec without a ``.`` is a config error naming the expected form.

Finding of this round (fixed in ``mmlinvit/models/distill/student_preprocessing.py``; its test
is marked FINDING and fails on the code before): a student whose own ``data_preprocessor`` has
no ``batch_augments`` next to ``train_cfg.augments`` was refused although the model's
preprocessor had the same batch augments (mmpretrain's ``ImageClassifier`` does
``data_preprocessor.setdefault('batch_augments', train_cfg)``), also after following the
message's "make both the same".
"""
from typing import Dict, Iterator, Optional, Tuple, Union

import pytest
import torch
import torch.nn.functional as F

TINY = dict(embed_dims=16, num_layers=1, num_heads=2, mlp_hidden_dims=32)


def _segmentor(patch_padding: str = 'corner') -> torch.nn.Module:
    """A tiny ``mmlinvit.EncoderDecoder`` (ViT with patch 16, FCN head, 3 classes)."""
    from mmengine.registry import DefaultScope
    from mmseg.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmseg'):  # restored on exit
        model = MODELS.build(dict(
            type='mmlinvit.EncoderDecoder',
            patch_padding=patch_padding,
            data_preprocessor=dict(type='SegDataPreProcessor', mean=[0.] * 3, std=[1.] * 3),
            backbone=dict(type='mmlinvit.VisionTransformer', arch=TINY, family='deit',
                          img_size=32, out_type='featmap', out_indices=[0]),
            decode_head=dict(type='FCNHead', in_channels=16, channels=8, num_convs=1,
                             num_classes=3, norm_cfg=dict(type='GN', num_groups=4),
                             dropout_ratio=0.0, align_corners=False),
            train_cfg=dict(), test_cfg=dict(mode='whole')))
    return model.eval()


# ---------------------------------------------------------------- segmentor
@pytest.mark.parametrize('patch_padding', ['corner', 'center'])
def test_non_square_patch_pads_each_side_to_its_own_multiple(patch_padding: str) -> None:
    """A backbone with ``patch_size=(8, 16)`` (rows, cols) on a 20 x 20 input: the rows pad
    by -20 % 8 = 4, the columns by -20 % 16 = 12 (mmseg's ``PatchEmbed`` corner formula);
    'center' puts the smaller half first (DINOv2's ``CenterPadding``)."""
    model = _segmentor(patch_padding)
    model.backbone.patch_size = (8, 16)
    assert model.patch_multiple() == (8, 16)
    pad_h, pad_w = -20 % 8, -20 % 16
    assert (pad_h, pad_w) == (4, 12)
    left, top = (pad_w // 2, pad_h // 2) if patch_padding == 'center' else (0, 0)
    assert model.patch_pads((20, 20)) == (left, pad_w - left, top, pad_h - top)
    assert model.patch_pads((24, 32)) == (0, 0, 0, 0)


def test_training_metas_get_the_padded_shape_as_mmsegs_preprocessor_sets_it() -> None:
    """``loss`` pads the batch to whole patches inside the model, so it must leave the samples'
    metas as mmseg's ``SegDataPreProcessor`` with ``size_divisor=16`` leaves them when it pads
    the batch: ``pad_shape`` is the padded size (Mask2Former's ``predict`` upsamples to it)."""
    from mmengine.structures import PixelData
    from mmseg.models.data_preprocessor import SegDataPreProcessor
    from mmseg.structures import SegDataSample

    h, w = 20, 36
    label = torch.randint(0, 3, (1, h, w))

    def sample() -> SegDataSample:
        out = SegDataSample(metainfo=dict(ori_shape=(h, w), img_shape=(h, w)))
        out.gt_sem_seg = PixelData(data=label.clone())
        return out

    model = _segmentor().train()
    ours = [sample()]
    model.loss(torch.randn(1, 3, h, w), ours)
    pre = SegDataPreProcessor(mean=[0.] * 3, std=[1.] * 3, size_divisor=16, seg_pad_val=255)
    theirs = pre(dict(inputs=[torch.randint(0, 256, (3, h, w), dtype=torch.uint8)],
                      data_samples=[sample()]), training=True)['data_samples']
    assert tuple(ours[0].metainfo['pad_shape']) == tuple(theirs[0].metainfo['pad_shape'])
    assert tuple(theirs[0].metainfo['pad_shape']) == (32, 48)


# ---------------------------------------------------------------- neck
def test_covering_pool_of_factor_one_is_the_identity_pooling() -> None:
    """``factor=1`` is a valid (identity) pooling, ``MaxPool2d(1, 1)``; only factors below 1
    are refused."""
    from mmlinvit.models.necks import CoveringMaxPool2d
    x = torch.randn(1, 2, 5, 7)
    torch.testing.assert_close(CoveringMaxPool2d(1)(x), F.max_pool2d(x, 1, 1), rtol=0, atol=0)
    with pytest.raises(ValueError, match='factor must be >= 1'):
        CoveringMaxPool2d(0)


def test_the_quarter_level_covers_an_odd_grid_too() -> None:
    """With ``rescales=[2, 1, 0.5, 0.25]`` the 0.25x level of a 37 x 37 grid is
    ``adaptive_max_pool2d`` to ceil(37 / 4) = 10 cells (every patch read), as the 0.5x level
    is to 19; mmseg's ``MaxPool2d(4, 4)`` gives 9 cells covering 36 patches."""
    from mmlinvit.models.necks import FullGridFeature2Pyramid
    neck = FullGridFeature2Pyramid(8, [2, 1, 0.5, 0.25], dict(type='BN', requires_grad=True))
    inputs = [torch.randn(1, 8, 37, 37) for _ in range(4)]
    outs = neck.eval()(inputs)
    torch.testing.assert_close(outs[2], F.adaptive_max_pool2d(inputs[2], (19, 19)),
                               rtol=0, atol=0)
    torch.testing.assert_close(outs[3], F.adaptive_max_pool2d(inputs[3], (10, 10)),
                               rtol=0, atol=0)


# ---------------------------------------------------------------- distillation glue
PATCH = 4
IMG = 16


def _vit(attn: str = 'softmax', **kwargs: object) -> dict:
    cfg = dict(type='mmlinvit.VisionTransformer',
               arch=dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32),
               patch_size=PATCH, img_size=IMG, attn_cfg=attn, out_type='raw')
    cfg.update(kwargs)
    return cfg


def _distill_cfg(**overrides: object) -> dict:
    """Recipe 2's attention-output term between two tiny ViTs (as the distill tests)."""
    cfg = dict(
        type='mmlinvit.DistillationModel', student=_vit('elu'), teacher=_vit('softmax'),
        student_recorders=dict(attn_out=dict(type='ModuleOutputs', source='blocks.{i}.attn')),
        teacher_recorders=dict(attn_out=dict(type='ModuleOutputs', source='blocks.{i}.attn')),
        distill_losses=dict(attn_out=dict(
            loss=dict(type='mmlinvit.AttentionOutputMSELoss', loss_weight=50.0),
            inputs=dict(student_outputs='student.attn_out',
                        teacher_outputs='teacher.attn_out'))))
    cfg.update(overrides)
    return cfg


@pytest.fixture
def mmpretrain_scope() -> Iterator[None]:
    """mmpretrain as the default scope during the test, restored after."""
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


def _build(cfg: dict) -> torch.nn.Module:
    from mmlinvit.registry import MODELS
    return MODELS.build(cfg)


IMAGENET_PRE = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True)
MIXUP = dict(augments=[dict(type='Mixup', alpha=0.8)])


def _classifier(**overrides: object) -> dict:
    cfg = dict(type='mmpretrain.ImageClassifier', backbone=_vit(out_type='cls_token'),
               head=dict(type='mmpretrain.LinearClsHead', num_classes=2, in_channels=16))
    cfg.update(overrides)
    return cfg


def copy_cfg(cfg: dict) -> dict:
    import copy
    return copy.deepcopy(cfg)


def test_student_augments_that_the_model_preprocessor_has_are_accepted(
        mmpretrain_scope: None) -> None:
    """FINDING (fails on the code before this round): a student with its own
    ``data_preprocessor`` (no ``batch_augments``) and ``train_cfg=dict(augments=[Mixup])``
    preprocesses exactly as a model preprocessor with those settings and
    ``batch_augments=Mixup`` (mmpretrain's ``ImageClassifier`` sets
    ``data_preprocessor.setdefault('batch_augments', train_cfg)``; both built here), so
    nothing is dropped; it was refused with ``batch_augments: None != {...}``, also after
    following the message's "make both the same"."""
    from mmlinvit.models.distill.student_preprocessing import check_student_preprocessing
    model_pre = dict(type='ClsDataPreprocessor', batch_augments=MIXUP, **IMAGENET_PRE)
    student = _classifier(data_preprocessor=dict(type='ClsDataPreprocessor', **IMAGENET_PRE),
                          train_cfg=MIXUP)
    built_student = _build(copy_cfg(student)).data_preprocessor
    built_model = _build(copy_cfg(model_pre))
    for pre in (built_student, built_model):
        assert [type(a).__name__ for a in pre.batch_augments.augments] == ['Mixup']
        assert pre.batch_augments.augments[0].alpha == 0.8
    check_student_preprocessing(student, model_pre)
    # an explicit batch_augments of the student wins over train_cfg (setdefault), also None:
    # mmpretrain then applies no augments, like a model preprocessor without them
    check_student_preprocessing(
        dict(student, data_preprocessor=dict(student['data_preprocessor'],
                                             batch_augments=MIXUP)), model_pre)
    no_augments = dict(student, data_preprocessor=dict(student['data_preprocessor'],
                                                       batch_augments=None))
    assert _build(copy_cfg(no_augments)).data_preprocessor.batch_augments is None
    check_student_preprocessing(no_augments, dict(type='ClsDataPreprocessor', **IMAGENET_PRE))


TEACHER_NORM = dict(mean=[127.5] * 3, std=[127.5] * 3)
PRE_CFG = dict(type='mmpretrain.ClsDataPreprocessor', **IMAGENET_PRE)


def _initialised_student(teacher_input_norm: Optional[dict],
                         strategy: str) -> Tuple[Dict[str, torch.Tensor], torch.nn.Module]:
    """The student state after ``init_weights`` with a seeded RNG (same draws for all)."""
    torch.manual_seed(0)
    model = _build(_distill_cfg(data_preprocessor=dict(PRE_CFG),
                                teacher_input_norm=teacher_input_norm,
                                weight_transfer=dict(type=strategy)))
    torch.manual_seed(123)
    model.init_weights()
    return {k: v.clone() for k, v in model.student.state_dict().items()}, model


def test_the_input_norm_fold_touches_only_a_copied_patch_projection(
        mmpretrain_scope: None) -> None:
    """``mlp_copy`` leaves the student's own patch projection, which reads the student's
    batch: ``teacher_input_norm`` must not fold the teacher statistics into it (the student
    is then initialised exactly as without ``teacher_input_norm``).  ``full_copy`` copies the
    teacher's projection, which gets ``W * std_s / std_t`` (hand formula)."""
    plain, _ = _initialised_student(None, 'mlp_copy')
    normed, _ = _initialised_student(dict(TEACHER_NORM), 'mlp_copy')
    for key in ('patch_embed.proj.weight', 'patch_embed.proj.bias'):
        torch.testing.assert_close(normed[key], plain[key], rtol=0, atol=0, msg=key)
    folded, model = _initialised_student(dict(TEACHER_NORM), 'full_copy')
    std_s = torch.tensor(IMAGENET_PRE['std']).view(1, 3, 1, 1)
    want = model.teacher.patch_embed.proj.weight * std_s / 127.5
    torch.testing.assert_close(folded['patch_embed.proj.weight'], want)


def test_predict_of_a_bare_backbone_student_is_refused(mmpretrain_scope: None) -> None:
    """A bare backbone has no predictions: ``mode='predict'`` is refused naming the fix,
    ``'tensor'`` returns the student's output."""
    model = _build(_distill_cfg()).eval()
    x = torch.randn(1, 3, IMG, IMG)
    with pytest.raises(RuntimeError, match='predict needs a task-model student'):
        model(x, mode='predict')
    with torch.no_grad():
        torch.testing.assert_close(model(x, mode='tensor'), model.student(x))


def test_a_teacher_counts_as_loaded_by_a_scoped_pretrained_init_or_a_state_dict_load() -> None:
    """The "random initialisation" warning is for teachers that read no file: a
    ``Pretrained`` init_cfg counts under any scope (mmengine's registry resolves
    ``'mmengine.Pretrained'`` to the same initialiser), and so does a backbone whose weights
    were loaded with ``load_state_dict`` (its ``weights_loaded`` flag)."""
    from mmengine.model import BaseModule
    from mmengine.registry import WEIGHT_INITIALIZERS

    from mmlinvit.backbones import VisionTransformer
    from mmlinvit.models.distill.teacher import _loads_weights
    assert WEIGHT_INITIALIZERS.get('mmengine.Pretrained') is WEIGHT_INITIALIZERS.get('Pretrained')
    scoped = BaseModule(init_cfg=dict(type='mmengine.Pretrained', checkpoint='teacher.pth'))
    assert _loads_weights(scoped)
    assert not _loads_weights(BaseModule(init_cfg=dict(type='Normal', std=0.01)))
    arch = dict(embed_dims=16, num_layers=1, num_heads=2, mlp_hidden_dims=32)
    teacher = VisionTransformer(arch, patch_size=PATCH, img_size=IMG)
    assert not _loads_weights(teacher)
    teacher.load_state_dict(VisionTransformer(arch, patch_size=PATCH, img_size=IMG).state_dict())
    assert _loads_weights(teacher)


@pytest.mark.parametrize('spec', ['student', dict(source='teacher')])
def test_an_input_spec_without_a_dot_names_the_expected_form(spec: Union[str, dict]) -> None:
    """``'student'`` (no recorder name) is a config error naming ``'student.<recorder>'``,
    not the ``ValueError`` of unpacking a one-element split."""
    from mmlinvit.models.distill import DistillationConfigError
    from mmlinvit.models.distill.input_specs import parse_input_spec
    with pytest.raises(DistillationConfigError, match=r"'student\.<recorder>'"):
        parse_input_spec('attn_out', 'student_outputs', spec)
