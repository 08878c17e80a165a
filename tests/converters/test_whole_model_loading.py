"""Whole-model loads of files in another layout: mmengine loads a model-level
``init_cfg=dict(type='Pretrained')`` (mmpretrain's ``ImageClassifier(pretrained=...)``) and
``load_from`` by name, so an mmpretrain classifier file loaded only its ``cls_token`` /
``pos_embed`` into an mmlinvit backbone (logits 7.8 off, exit 0, mmengine's key-mismatch
warning only) and ``weights_loaded`` said True.  The backbone converts its keys on load now.
mmseg's own ViT files (``attn.attn.in_proj_*``) load through ``pretrained=``.

The references are the models that wrote the files (mmpretrain's and mmseg's own ViTs).
"""
import pytest
import torch

from mmlinvit.backbones import VisionTransformer

ARCH = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)


def randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1 + (1.0 if p.ndim == 1 else 0.0))
    model.eval()  # mmseg's ViT.train() returns None
    return model


def classifier(backbone: dict, **kwargs):
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    return MODELS.build(dict(type='ImageClassifier', backbone=backbone, neck=None,
                             head=dict(type='VisionTransformerClsHead', num_classes=5,
                                       in_channels=32), **kwargs))


@pytest.fixture(scope='module')
def mmpretrain_file(tmp_path_factory):
    """A tiny mmpretrain ViT classifier, saved as its runner saves it."""
    torch.manual_seed(0)
    ref = randomise(classifier(dict(type='VisionTransformer',
                                    arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                                              feedforward_channels=64),
                                    img_size=32, patch_size=8, out_type='cls_token')))
    path = str(tmp_path_factory.mktemp('mmpretrain') / 'classifier.pth')
    torch.save({'state_dict': ref.state_dict(), 'meta': {}}, path)
    return ref, path


MMLINVIT_BACKBONE = dict(type='mmlinvit.VisionTransformer', arch=ARCH, img_size=32,
                         patch_size=8, out_type='cls_token')


@pytest.mark.parametrize('how', ['init_cfg', 'pretrained'])
def test_mmpretrain_classifier_file_through_a_model_level_load(mmpretrain_file, how):
    ref, path = mmpretrain_file
    kwargs = (dict(init_cfg=dict(type='Pretrained', checkpoint=path)) if how == 'init_cfg'
              else dict(pretrained=path))
    model = classifier(dict(MMLINVIT_BACKBONE), **kwargs)
    model.init_weights()
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
    assert model.backbone.weights_loaded


def test_whole_model_state_dict_and_load_from_convert(mmpretrain_file):
    """load_state_dict of the whole model (what load_from / --resume do); the backbone's own
    checkpoints load as they are."""
    ref, _ = mmpretrain_file
    model = classifier(dict(MMLINVIT_BACKBONE)).eval()
    model.load_state_dict(ref.state_dict())  # strict: every key placed
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
    again = classifier(dict(MMLINVIT_BACKBONE)).eval()
    again.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(again(x), model(x))


def test_a_load_of_records_only_does_not_count_as_loaded_weights():
    """The records hook puts the model's own records into the incoming dict: a state dict
    with no weight of the backbone left weights_loaded True before."""
    model = VisionTransformer(arch=ARCH, img_size=32, patch_size=8)
    model.load_state_dict({'unrelated.weight': torch.zeros(1)}, strict=False)
    assert not model.weights_loaded
    model.load_state_dict({'cls_token': model.cls_token.detach().clone()}, strict=False)
    assert model.weights_loaded


@pytest.mark.parametrize('pre_norm', [False, True])
def test_mmseg_vit_file_loads_through_pretrained(tmp_path, pre_norm):
    """mmseg's ViT keeps nn.MultiheadAttention (attn.attn.in_proj_* / out_proj): read as the
    mmpretrain layout it was refused, and strict=False left every q / k / v / proj random.
    Its pre_norm is ``ln_pre``."""
    from mmseg.models.backbones import VisionTransformer as MMSegViT
    ref = randomise(MMSegViT(img_size=32, patch_size=8, embed_dims=32, num_layers=2,
                             num_heads=2, mlp_ratio=2, final_norm=True, out_indices=(1, ),
                             pre_norm=pre_norm))
    path = str(tmp_path / 'mmseg.pth')
    head = {'decode_head.conv_seg.weight': torch.zeros(3, 32, 1, 1)}
    torch.save({'state_dict': {**{f'backbone.{k}': v for k, v in ref.state_dict().items()},
                               **head}}, path)
    model = VisionTransformer(arch=ARCH, img_size=32, patch_size=8, out_type='featmap',
                              out_indices=(1, ), norm_eps=1e-5, patch_bias=False,
                              pre_norm=pre_norm, pretrained=path).eval()
    model.init_weights()
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], ref(x)[0], atol=1e-5, rtol=1e-5)


def test_the_fix_line_does_not_offer_strict_false_when_most_tensors_would_stay_random():
    """A file missing most of the model (e.g. every q / k / v / proj of a layout read wrongly)
    was refused with 'or load with strict=False', which loaded the rest and left those random."""
    from mmlinvit.converters import CheckpointMismatchError, load_pretrained
    model = VisionTransformer(arch=ARCH, img_size=32, patch_size=8)
    partial = {k: v for k, v in model.state_dict().items() if '.attn.' not in k}
    partial.update({f'blocks.{i}.attn.attn.in_proj_weight': torch.zeros(96, 32)
                    for i in range(2)})
    partial = {k: v for k, v in partial.items() if not k.startswith('blocks.1.mlp')}
    with pytest.raises(CheckpointMismatchError,
                       match=r'strict=False would leave \d+ of the model\'s \d+ tensors') as err:
        load_pretrained(model, partial, layout='timm')
    assert 'or load with strict=False' not in str(err.value)
    few = {k: v for k, v in model.state_dict().items() if k != 'blocks.1.mlp.fc2.bias'}
    with pytest.raises(CheckpointMismatchError, match='or load with strict=False'):
        load_pretrained(VisionTransformer(arch=ARCH, img_size=32, patch_size=8), few,
                        layout='timm')


def test_an_mhla_model_names_the_options_that_load_a_softmax_file():
    """The fix line offered strict=False, which no config reaches; the options that load the
    class token and positions are named."""
    from mmlinvit.converters import CheckpointMismatchError, load_pretrained
    teacher = VisionTransformer(arch=ARCH, img_size=32, patch_size=8)
    with pytest.warns(UserWarning):  # MHLA takes its paper setting (no class token)
        student = VisionTransformer(arch=ARCH, img_size=32, patch_size=8, attn_cfg='mhla')
    with pytest.raises(CheckpointMismatchError,
                       match=r'with_cls_token=True pos_embed_type=learned '
                             r'check_operator_setting=False'):
        load_pretrained(student, teacher.state_dict())
