"""Each teacher sees its own input normalisation (``teacher_input_norm``).

Every recipe config is checked against a table of the statistics each teacher family was
trained with, written here independently of the configs; the conversion itself is checked
against a plain normalisation of the same pixels.  The CLIP preprocessing end to end through
a Runner is in ``tests/linearizer/test_clip_teacher_preprocessing.py``.
"""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope

from mmlinvit.models.distill import DistillationConfigError
from mmlinvit.registry import MODELS

from distill_testing import CONFIGS, IMG_SIZE, PATCH, tiny_arch

IMAGENET = dict(mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375))
#: OpenAI CLIP's preprocess (clip/clip.py ``_transform``), 0-1 units, times 255.
CLIP = dict(mean=tuple(255 * v for v in (0.48145466, 0.4578275, 0.40821073)),
            std=tuple(255 * v for v in (0.26862954, 0.26130258, 0.27577711)))
#: The statistics each teacher family was trained with (0-255 units).
TRAINED_WITH = dict(deit=IMAGENET, deit3=IMAGENET, dinov2=IMAGENET, mae=IMAGENET, clip=CLIP)


def distillation_configs():
    paths = sorted(glob.glob(osp.join(CONFIGS, '**', '*.py'), recursive=True))
    found = []
    for path in paths:
        rel = osp.relpath(path, CONFIGS)
        if rel.startswith('_base_'):
            continue
        model = Config.fromfile(path).get('model') or {}
        if model.get('type') == 'mmlinvit.DistillationModel' and model.get('teacher'):
            found.append(rel)
    return found


DISTILL_CONFIGS = distillation_configs()


def test_the_sweep_sees_every_recipe_family():
    names = ' '.join(DISTILL_CONFIGS)
    assert 'linearizer/' in names and 'copy_mlp_distill_attn/' in names
    assert 'adala/' in names and 'segmentation/' in names and 'cifar10' in names


@pytest.mark.parametrize('rel', DISTILL_CONFIGS)
def test_every_teacher_sees_the_statistics_it_was_trained_with(rel):
    cfg = Config.fromfile(osp.join(CONFIGS, rel))
    model = cfg.model
    teacher = model.teacher.get('backbone', model.teacher)
    family = teacher.get('family', 'deit')  # VisionTransformer's default family
    # the data preprocessor the Runner gives the model (top level), else the model's /
    # the student task model's own
    pre = model.get('data_preprocessor') or cfg.get('data_preprocessor') or model.student.get(
        'data_preprocessor')
    assert pre is not None and pre.get('mean') is not None, rel
    seen = model.get('teacher_input_norm') or dict(mean=pre['mean'], std=pre['std'])
    expected = TRAINED_WITH[family]
    torch.testing.assert_close(torch.tensor(seen['mean'], dtype=torch.float64),
                               torch.tensor(expected['mean'], dtype=torch.float64),
                               rtol=0, atol=1e-6, msg=f'{rel}: teacher ({family}) mean')
    torch.testing.assert_close(torch.tensor(seen['std'], dtype=torch.float64),
                               torch.tensor(expected['std'], dtype=torch.float64),
                               rtol=0, atol=1e-6, msg=f'{rel}: teacher ({family}) std')


# ---------------------------------------------------------------- the model
@pytest.fixture(autouse=True)
def _mmpretrain_scope():
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


CIFAR = dict(mean=[125.307, 122.961, 113.8575], std=[51.5865, 50.847, 51.255])


def model_cfg(teacher_input_norm, data_preprocessor=None):
    vit = dict(type='mmlinvit.VisionTransformer', arch=tiny_arch(), patch_size=PATCH,
               img_size=IMG_SIZE, out_type='raw')
    return dict(
        type='mmlinvit.DistillationModel',
        student=dict(vit, attn_cfg='elu'),
        teacher=dict(vit, attn_cfg='softmax'),
        teacher_recorders=dict(final=dict(type='ModuleOutputs', source='norm')),
        student_recorders=dict(final=dict(type='ModuleOutputs', source='norm')),
        distill_losses=dict(
            feat=dict(loss=dict(type='mmlinvit.FeatureMSELoss'),
                      inputs=dict(student_feats='student.final',
                                  teacher_feats='teacher.final'))),
        teacher_input_norm=teacher_input_norm,
        data_preprocessor=data_preprocessor if data_preprocessor is not None else dict(
            type='ClsDataPreprocessor', to_rgb=True, **CIFAR))


def test_teacher_input_is_the_pixels_normalised_with_the_teacher_statistics():
    model = MODELS.build(model_cfg(dict(IMAGENET)))
    torch.manual_seed(0)
    pixels = torch.randint(0, 256, (2, 3, IMG_SIZE, IMG_SIZE), dtype=torch.uint8)
    # what the data preprocessor gives the model: CIFAR-normalised RGB (input is BGR)
    batch = model.data_preprocessor(dict(inputs=list(pixels.flip(1))), training=True)['inputs']
    seen = []
    handle = model.teacher.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    model.loss(batch)
    handle.remove()
    mean = torch.tensor(IMAGENET['mean']).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET['std']).view(1, 3, 1, 1)
    expected = (pixels.float() - mean) / std
    err = (seen[0] - expected).abs().max().item()
    print(f'\nteacher input vs ImageNet normalisation of the same pixels: max abs {err:.2e}')
    assert err < 1e-5
    # the student's batch is untouched (CIFAR statistics)
    cifar = (pixels.float() - torch.tensor(CIFAR['mean']).view(1, 3, 1, 1)) / torch.tensor(
        CIFAR['std']).view(1, 3, 1, 1)
    torch.testing.assert_close(batch, cifar, rtol=0, atol=1e-5)
    assert (seen[0] - batch).abs().max() > 0.05
    # no teacher_input_norm: the teacher sees the student's batch, as before
    plain = MODELS.build(model_cfg(None))
    seen.clear()
    plain.teacher.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    plain.loss(batch)
    assert torch.equal(seen[0], batch)
    # the conversion is not part of checkpoints
    assert not any('teacher_mean' in k or 'teacher_std' in k for k in model.state_dict())


@pytest.mark.parametrize('norm, preprocessor, match', [
    (dict(IMAGENET), dict(type='BaseDataPreprocessor'), 'does not normalise'),
    (dict(IMAGENET), dict(type='ClsDataPreprocessor'), 'does not normalise'),
    (dict(mean=[0.48145466, 0.4578275, 0.40821073], std=[0.26862954, 0.26130258, 0.27577711]),
     None, 'different units'),
    (dict(mean=[1.0, 2.0], std=[1.0, 1.0]), None, '2 mean and 2 std values'),
    (dict(mean=IMAGENET['mean']), None, "'mean' and 'std'"),
    (dict(mean=IMAGENET['mean'], std=[58.0, 0.0, 57.0]), None, 'positive'),
])
def test_bad_teacher_input_norm_fails_at_build_time(norm, preprocessor, match):
    with pytest.raises(DistillationConfigError, match=match):
        MODELS.build(model_cfg(norm, preprocessor))


def test_full_copy_under_another_normalisation_starts_as_the_teacher():
    """FullCopy's student equals the teacher, also when the student's batch has other
    statistics than the teacher's (CIFAR configs): the copied patch projection read CIFAR-
    normalised pixels as ImageNet-normalised ones (5.9e-3 attention-output MSE at step 0)."""
    cfg = model_cfg(dict(IMAGENET))
    cfg['student'] = dict(cfg['student'], attn_cfg='softmax')
    cfg['weight_transfer'] = dict(type='full_copy')
    model = MODELS.build(cfg)
    model.init_weights()
    assert model.transfer_report.details['patch_embed_input_norm_folded'] is True
    torch.manual_seed(0)
    pixels = torch.randint(0, 256, (2, 3, IMG_SIZE, IMG_SIZE), dtype=torch.uint8)
    batch = model.data_preprocessor(dict(inputs=list(pixels)), training=False)['inputs']
    model.eval()
    with torch.no_grad():
        student = model.student(batch)[-1]
        teacher = model.teacher(model.teacher_inputs(batch))[-1]
    torch.testing.assert_close(student, teacher, rtol=1e-5, atol=1e-5)
    # the same statistics on both sides: nothing to fold
    same = MODELS.build(dict(cfg, teacher_input_norm=None))
    same.init_weights()
    assert 'patch_embed_input_norm_folded' not in same.transfer_report.details
    torch.testing.assert_close(same.student.patch_embed.proj.weight,
                               same.teacher.patch_embed.proj.weight, rtol=0, atol=0)
