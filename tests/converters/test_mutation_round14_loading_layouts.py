"""Mutation round 14 over :mod:`mmlinvit.converters.layouts` and ``.loading``.

Guards conversions whose mistake loads a checkpoint "fine" with wrong weights: the
``pos_embed`` rows of timm models without a class token (register rows folded from row 0),
the load-time resampling of an official DINOv2 hub file (518 px, 37x37 grid) into a model of
another size (DINOv2's bicubic with its 0.1 offset, antialias for the register models),
which must give the official model's features at that size.  The references are official
model code run in the test (timm's ``VisionTransformer`` with random weights) or the golden
file written by facebookresearch/dinov2's own ``DinoVisionTransformer``
(``tests/fixtures/make_dinov2_reference.py``), and key layouts written by hand.
"""
import math
import os.path as osp
import sys
import warnings
from typing import Dict, Mapping

import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.backbones.training_record import MLP_ACT_RECORD, decode_names, encode_names
from mmlinvit.converters import convert_timm, load_pretrained, read_checkpoint

TESTS = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random (norm weights around 1), so a wrong row or name shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.ndim == 1 and name.endswith('weight'):
                p.copy_(1.0 + 0.2 * noise)
            elif p.ndim >= 2 and name not in ('cls_token', 'reg_token', 'pos_embed'):
                p.copy_(noise / math.sqrt(p[0].numel()))
            else:
                p.copy_(0.5 * noise)
    model.eval()  # some OpenMMLab backbones' train() returns None
    return model


# ------------------------------------------------------------- timm without a class token


@pytest.mark.parametrize('no_embed_class', [False, True])
def test_timm_registers_without_class_token_reproduce_timm(no_embed_class: bool):
    """timm ``class_token=False, reg_tokens=2``: with ``no_embed_class=False`` the first two
    ``pos_embed`` rows are the register positions (there is no class row before them), with
    ``True`` every row is a grid position.  The converted model's tokens equal timm's."""
    timm = pytest.importorskip('timm')
    ref = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, mlp_ratio=2,
        class_token=False, reg_tokens=2, no_embed_class=no_embed_class, global_pool='avg', fc_norm=False,
        num_classes=0)
    _randomise(ref)
    sd = ref.state_dict()
    assert sd['pos_embed'].shape[1] == (16 if no_embed_class else 18)
    ours = VisionTransformer(arch=dict(embed_dims=32, num_layers=1, num_heads=2,
                                       mlp_hidden_dims=64),
                             img_size=32, patch_size=8, with_cls_token=False, num_reg_tokens=2,
                             out_type='raw', norm_eps=1e-6).eval()
    load_pretrained(ours, sd, layout='timm')
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = ref.forward_features(x)
        got = ours.forward_tokens(x)[0]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_timm_without_class_token_reads_no_class_row():
    """Without a class token the canonical reading has no prefix row: 17 rows (a class row
    plus 4x4 in a model with one) fit no reading, and are refused, not loaded."""
    sd = {'pos_embed': torch.zeros(1, 17, 8), 'patch_embed.proj.weight': torch.zeros(8, 3, 4, 4)}
    with pytest.raises(ValueError, match='no square grid'):
        convert_timm(sd)
    sd['pos_embed'] = torch.arange(16.).reshape(1, 16, 1).expand(1, 16, 8).clone()
    out, _ = convert_timm(sd)
    assert torch.equal(out['pos_embed'], sd['pos_embed'])


# ------------------------------------------------- DINOv2 hub file into another image size


@pytest.fixture(scope='module')
def dinov2_golden() -> dict:
    sys.path.insert(0, TESTS)
    try:
        from official_golden import load_generator, load_golden
        return dict(gen=load_generator('make_dinov2_reference'),
                    golden=load_golden('dinov2_official_reference.pt'))
    finally:
        sys.path.remove(TESTS)


@pytest.mark.parametrize('name', ['plain', 'reg4'])
def test_dinov2_518_file_resampled_at_load_gives_official_224_features(dinov2_golden, name):
    """The hub file has a 37x37 grid (518 px); a 224 px model resamples it once at load.  The
    official model interpolates at 224 in its forward (bicubic, scale (16 + 0.1) / 37 for the
    plain models, antialias and no offset for the register ones): the same tokens."""
    gen, golden = dinov2_golden['gen'], dinov2_golden['golden']
    variant = golden['variants'][name]
    assert variant['state_dict']['pos_embed'].shape[1] == 1 + 37 * 37
    model = VisionTransformer(family='dinov2', img_size=224, out_type='raw',
                              **variant['mmlinvit_kwargs']).eval()
    report = load_pretrained(model, dict(variant['state_dict']))
    assert tuple(model.pos_grid) == (16, 16)
    assert any('37x37 grid to the model grid 16x16' in n for n in report.notes)
    x = gen.reference_input(224, 224, gen.input_seed(224, 224))
    with torch.no_grad():
        got = model.forward_tokens(x)[0]
    torch.testing.assert_close(got, variant['outputs']['tokens_224x224'], atol=1e-5, rtol=1e-5)


def test_dinov2_teacher_checkpoint_file_loads_the_teacher_backbone(dinov2_golden, tmp_path):
    """DINOv2's training writes ``eval/<iter>/teacher_checkpoint.pth`` as
    ``torch.save({"teacher": model.teacher.state_dict()})`` (dinov2/train/train.py
    ``do_test``): the teacher's ``backbone.*`` and its ``dino_head.*``.  The file is unwrapped
    under ``teacher`` and its backbone gives the official features; the head is dropped."""
    gen, golden = dinov2_golden['gen'], dinov2_golden['golden']
    variant = golden['variants']['plain']
    teacher = {f'backbone.{k}': v for k, v in variant['state_dict'].items()}
    teacher['dino_head.mlp.0.weight'] = torch.zeros(32, 16)
    teacher['dino_head.last_layer.weight_g'] = torch.ones(64, 1)
    path = str(tmp_path / 'teacher_checkpoint.pth')
    torch.save({'teacher': teacher}, path)
    model = VisionTransformer(family='dinov2', img_size=224, out_type='raw',
                              **variant['mmlinvit_kwargs']).eval()
    report = load_pretrained(model, path)
    assert report.source_layout == 'dinov2' and report.prefix == 'backbone.'
    assert {'dino_head.mlp.0.weight', 'dino_head.last_layer.weight_g'} <= set(report.dropped)
    x = gen.reference_input(224, 224, gen.input_seed(224, 224))
    with torch.no_grad():
        got = model.forward_tokens(x)[0]
    torch.testing.assert_close(got, variant['outputs']['tokens_224x224'], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------- CLIP TorchScript archives


def _scripted_holding(state_dict: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """A module whose ``state_dict`` is ``state_dict`` (the released archives' dotted names)."""
    root = torch.nn.Module()
    for key, value in state_dict.items():
        *path, leaf = key.split('.')
        module = root
        for name in path:
            if not hasattr(module, name):
                module.add_module(name, torch.nn.Module())
            module = getattr(module, name)
        module.register_buffer(leaf, value.clone())
    return torch.jit.script(root)


def _tiny_clip_visual(width: int = 8) -> Dict[str, torch.Tensor]:
    """The OpenAI CLIP ``visual.`` names of a one-block tower (4x4 grid of 4 px patches)."""
    gen = torch.Generator().manual_seed(7)
    sd = {'visual.class_embedding': torch.randn(width, generator=gen),
          'visual.positional_embedding': torch.randn(17, width, generator=gen),
          'visual.conv1.weight': torch.randn(width, 3, 4, 4, generator=gen),
          'visual.proj': torch.randn(width, 4, generator=gen)}
    for name in ('ln_pre', 'ln_post', 'transformer.resblocks.0.ln_1',
                 'transformer.resblocks.0.ln_2'):
        sd[f'visual.{name}.weight'] = torch.ones(width)
        sd[f'visual.{name}.bias'] = torch.zeros(width)
    return sd


@pytest.mark.filterwarnings('ignore::FutureWarning')
@pytest.mark.parametrize('recorded', [None, 'gelu'])
def test_torchscript_clip_archive_activation_record(tmp_path, recorded):
    """A TorchScript CLIP archive gets the QuickGELU record of the OpenAI releases only when
    it carries no activation record of its own; a record in the file is never overwritten."""
    sd = _tiny_clip_visual()
    if recorded is not None:
        sd[f'visual.{MLP_ACT_RECORD}'] = encode_names([recorded])
    path = str(tmp_path / 'clip.pt')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        torch.jit.save(_scripted_holding(sd), path)
    converted, report, _ = read_checkpoint(path, trust_checkpoint=True)
    assert report.source_layout == 'openai_clip'
    assert decode_names(converted[MLP_ACT_RECORD]) == [recorded or 'quick_gelu']
    assert torch.equal(converted['cls_token'], sd['visual.class_embedding'].reshape(1, 1, -1))


# ------------------------------------------- mmpretrain keys converted on load_state_dict


def test_mmpretrain_keys_load_strictly_through_load_state_dict():
    """mmengine loads whole-model files by name; the backbone converts mmpretrain's keys
    (``layers.i.ln1`` / ``attn.qkv`` / ``ffn.layers`` / ``gamma1``...) in its first
    ``load_state_dict`` pre-hook.  The source names must be replaced, not kept beside the
    converted ones: a strict load of mmpretrain's own ViT state dict succeeds and gives
    mmpretrain's tokens."""
    mmpretrain_backbones = pytest.importorskip('mmpretrain.models.backbones')
    ref = mmpretrain_backbones.VisionTransformer(
        arch=dict(embed_dims=32, num_layers=2, num_heads=2, feedforward_channels=64),
        img_size=32, patch_size=8, out_type='raw', layer_scale_init_value=0.1)
    _randomise(ref)
    ours = VisionTransformer(arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                                       mlp_hidden_dims=64),
                             img_size=32, patch_size=8, out_type='raw', family='deit3',
                             pos_interp='bicubic').eval()
    result = ours.load_state_dict(ref.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = ref(x)[0]
        got = ours.forward_tokens(x)[0]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_mmpretrain_file_of_another_grid_is_resampled_like_mmpretrain(tmp_path):
    """A 4x4-grid (32 px) mmpretrain file into 48 px models: mmpretrain's own ViT resizes the
    grid in its load pre-hook (``resize_pos_embed``, bicubic, the class row kept apart);
    mmlinvit with ``pos_interp='bicubic'`` resamples it once at load.  Same tokens."""
    mmpretrain_backbones = pytest.importorskip('mmpretrain.models.backbones')
    arch = dict(embed_dims=32, num_layers=1, num_heads=2, feedforward_channels=64)
    src = _randomise(mmpretrain_backbones.VisionTransformer(
        arch=arch, img_size=32, patch_size=8, out_type='raw'))
    path = str(tmp_path / 'mmpretrain_32px.pth')
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in src.state_dict().items()}}, path)
    ref = mmpretrain_backbones.VisionTransformer(arch=arch, img_size=48, patch_size=8,
                                                 out_type='raw')
    ref.eval()
    ref.load_state_dict({k[len('backbone.'):]: v for k, v in
                         torch.load(path, weights_only=True)['state_dict'].items()})
    ours = VisionTransformer(arch=dict(embed_dims=32, num_layers=1, num_heads=2,
                                       mlp_hidden_dims=64),
                             img_size=48, patch_size=8, out_type='raw', norm_eps=1e-6,
                             pos_interp='bicubic').eval()
    report = load_pretrained(ours, path)
    assert any('4x4 grid to the model grid 6x6' in n for n in report.notes)
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = ref(x)[0]
        got = ours.forward_tokens(x)[0]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_own_checkpoint_with_a_stray_key_is_not_converted_on_load():
    """The load pre-hook converts only when the conversion places more keys (or leaves fewer
    unplaced): a model's own state dict plus one key no layout knows is left as it is (no
    'converted on load' report), and the stray key stays unexpected."""
    from mmlinvit.converters.loading import convert_foreign_keys_on_load
    model = VisionTransformer(arch=dict(embed_dims=16, num_layers=1, num_heads=2,
                                        mlp_hidden_dims=32), img_size=16, patch_size=8)
    own = {k: v.clone() for k, v in model.state_dict().items()}
    sd = {**{f'backbone.{k}': v for k, v in own.items()}, 'backbone.extra.weight': torch.ones(2)}
    before = dict(sd)
    assert convert_foreign_keys_on_load(model, sd, 'backbone.') is None
    assert sd.keys() == before.keys() and all(sd[k] is before[k] for k in sd)
    result = model.load_state_dict({**own, 'extra.weight': torch.ones(2)}, strict=False)
    assert result.unexpected_keys == ['extra.weight'] and not result.missing_keys


def test_timm_training_checkpoint_with_ema_is_named(tmp_path, caplog):
    """timm's train.py saves ``state_dict`` and ``state_dict_ema``; timm's own
    ``load_checkpoint`` (``use_ema=True`` by default) loads the EMA weights.  mmlinvit loads the
    live weights, as documented by its wrapper-key order, and says so, naming the other key."""
    import logging

    from timm.models import load_checkpoint as timm_load_checkpoint

    from mmlinvit.converters.loading import load_checkpoint_file
    torch.manual_seed(0)
    live = {'w': torch.randn(3, 2)}
    ema = {'w': torch.randn(3, 2)}
    path = str(tmp_path / 'timm_train.pth.tar')
    torch.save(dict(epoch=3, state_dict=live, state_dict_ema=ema), path)
    oracle = torch.nn.Module()
    oracle.w = torch.nn.Parameter(torch.zeros(3, 2))
    timm_load_checkpoint(oracle, path)
    torch.testing.assert_close(oracle.w.data, ema['w'])  # timm's default: the EMA weights
    with caplog.at_level(logging.WARNING, logger='mmlinvit.converters.loading'):
        loaded = load_checkpoint_file(path)
    torch.testing.assert_close(loaded['w'], live['w'])
    assert any("'state_dict_ema'" in r.getMessage() and 'live weights' in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    torch.save(dict(epoch=3, state_dict=live), path)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger='mmlinvit.converters.loading'):
        load_checkpoint_file(path)
    assert not any('state_dict_ema' in r.getMessage() for r in caplog.records)
