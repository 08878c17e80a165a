"""Converted checkpoints reproduce timm 1.0.31 (the independent reference) to 1e-5 in fp32.

Each case builds a tiny timm model with random weights (every parameter randomised), writes
its state dict in the family's ORIGINAL layout (DINOv2 hub, OpenAI CLIP, or timm's own),
converts it with :mod:`mmlinvit.converters`, loads it into mmlinvit's VisionTransformer and
compares the final tokens (timm ``forward_features`` vs ``forward_tokens(x)[0]``) at the
native resolution with family defaults and at a non-square resolution, where timm
interpolates with ``dynamic_img_size`` (bicubic with antialias: ``'bicubic_antialias'``).
"""
import math
from typing import Dict

import pytest
import torch
import torch.nn.functional as F

from mmlinvit.backbones import VisionTransformer
from mmlinvit.converters import (convert_dinov2, convert_state_dict, detect_layout,
                                 load_pretrained)

timm = pytest.importorskip('timm')

TOL = 1e-5


def randomise_(model: torch.nn.Module, seed: int = 0) -> None:
    """Sets every parameter to random values of a sensible scale (not the default init)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith('gamma'):  # layer scale
                p.copy_(0.2 + 0.8 * torch.rand(p.shape, generator=gen))
            elif p.ndim == 1 and name.endswith('weight'):  # norms
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith('bias'):
                p.copy_(0.1 * noise)
            elif name in ('cls_token', 'reg_token', 'pos_embed'):
                p.copy_(0.5 * noise)
            else:
                fan_in = p[0].numel()
                p.copy_(noise / math.sqrt(fan_in))


def timm_to_dinov2_hub(sd: Dict[str, torch.Tensor], chunks: int = 0) -> Dict[str, torch.Tensor]:
    """Rewrites a timm DINOv2 state dict into the facebookresearch hub layout.

    Registers: timm keeps no class position (``no_embed_class``) and has the class position
    folded into ``cls_token``; the hub stores it in ``pos_embed`` row 0.  A random row is
    split off so the hub pos_embed has a non-zero class position.
    """
    gen = torch.Generator().manual_seed(1)
    depth = len({k.split('.')[1] for k in sd if k.startswith('blocks.')})
    per_chunk = math.ceil(depth / chunks) if chunks else 0
    out = {}
    for key, value in sd.items():
        if key == 'reg_token':
            out['register_tokens'] = value
        elif key.startswith('blocks.') and chunks:
            # Hub BlockChunk: blocks.<chunk>.<global index>.<rest>
            idx = int(key.split('.')[1])
            out[f'blocks.{idx // per_chunk}.' + key[len('blocks.'):]] = value
        else:
            out[key] = value
    if 'register_tokens' in out:
        class_pos = 0.5 * torch.randn(1, 1, sd['pos_embed'].shape[-1], generator=gen)
        out['cls_token'] = sd['cls_token'] - class_pos
        out['pos_embed'] = torch.cat([class_pos, sd['pos_embed']], dim=1)
    out['mask_token'] = 0.5 * torch.randn(1, sd['pos_embed'].shape[-1], generator=gen)
    return out


def timm_to_swiglu_hub(sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """timm packed SwiGLU (``mlp.fc1``/``mlp.fc2``) -> hub ``mlp.w12``/``mlp.w3``, chunked."""
    renamed = {k.replace('.mlp.fc1.', '.mlp.w12.').replace('.mlp.fc2.', '.mlp.w3.'): v
               for k, v in sd.items()}
    return timm_to_dinov2_hub(renamed, chunks=2)


def timm_to_openai_clip(sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Rewrites a timm CLIP image tower into the OpenAI CLIP layout, with a text tower."""
    gen = torch.Generator().manual_seed(2)
    out = {}
    for key, value in sd.items():
        if key.startswith('head.'):
            continue
        new = (key.replace('patch_embed.proj.', 'conv1.').replace('norm_pre.', 'ln_pre.')
               .replace('blocks.', 'transformer.resblocks.').replace('.norm1.', '.ln_1.')
               .replace('.norm2.', '.ln_2.').replace('attn.qkv.weight', 'attn.in_proj_weight')
               .replace('attn.qkv.bias', 'attn.in_proj_bias')
               .replace('attn.proj.', 'attn.out_proj.').replace('mlp.fc1.', 'mlp.c_fc.')
               .replace('mlp.fc2.', 'mlp.c_proj.'))
        if new.startswith('norm.'):
            new = 'ln_post.' + new[len('norm.'):]
        if key == 'cls_token':
            new, value = 'class_embedding', value.reshape(-1)
        elif key == 'pos_embed':
            new, value = 'positional_embedding', value[0]
        out['visual.' + new] = value
    width = sd['cls_token'].shape[-1]
    out['visual.proj'] = torch.randn(width, 32, generator=gen)
    # A few text-tower entries, which must be dropped.
    out['positional_embedding'] = torch.randn(77, 64, generator=gen)
    out['token_embedding.weight'] = torch.randn(100, 64, generator=gen)
    out['transformer.resblocks.0.attn.in_proj_weight'] = torch.randn(192, 64, generator=gen)
    out['ln_final.weight'] = torch.ones(64)
    out['text_projection'] = torch.randn(64, 32, generator=gen)
    out['logit_scale'] = torch.tensor(4.6)
    return out


def timm_with_mae_decoder(sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A timm-layout MAE encoder plus the decoder keys of an MAE pretraining checkpoint."""
    gen = torch.Generator().manual_seed(3)
    out = dict(sd)
    out['mask_token'] = torch.randn(1, 1, 64, generator=gen)
    out['decoder_embed.weight'] = torch.randn(64, sd['cls_token'].shape[-1], generator=gen)
    out['decoder_pos_embed'] = torch.randn(1, 17, 64, generator=gen)
    out['decoder_blocks.0.norm1.weight'] = torch.ones(64)
    out['decoder_pred.weight'] = torch.randn(768, 64, generator=gen)
    return out


def timm_layout_as_is(sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """timm's own layout, unchanged (timm families, timm DINOv2 with registers)."""
    return dict(sd)


def two_layer_arch(width: int = 384, heads: int = 6, mlp: int = 1536) -> dict:
    """A 2-block arch dict for mmlinvit's VisionTransformer."""
    return dict(embed_dims=width, num_layers=2, num_heads=heads, mlp_hidden_dims=mlp)


# name: (timm model, timm kwargs, to-source-layout fn, expected detected layout,
#        our family, our kwargs, non-square (H, W))
CASES = {
    'dinov2_hub': ('vit_small_patch14_dinov2', dict(img_size=98, depth=2), timm_to_dinov2_hub,
                   'dinov2', 'dinov2', dict(arch=two_layer_arch(), img_size=98), (126, 70)),
    'dinov2_reg4_hub': ('vit_small_patch14_reg4_dinov2', dict(img_size=98, depth=2),
                        timm_to_dinov2_hub, 'dinov2', 'dinov2',
                        dict(arch=two_layer_arch(), img_size=98, num_reg_tokens=4), (70, 126)),
    'dinov2_swiglu_chunked_hub': ('vit_giant_patch14_dinov2',
                                  dict(img_size=56, depth=2, embed_dim=96, num_heads=2),
                                  timm_to_swiglu_hub, 'dinov2', 'dinov2',
                                  dict(arch=two_layer_arch(96, 2, 256), img_size=56, mlp_type='swiglu'),
                                  (84, 42)),
    'dinov2_reg4_timm_layout': ('vit_small_patch14_reg4_dinov2', dict(img_size=98, depth=2),
                                timm_layout_as_is, 'timm', 'dinov2',
                                dict(arch=two_layer_arch(), img_size=98, num_reg_tokens=4),
                                (126, 70)),
    'deit3': ('deit3_small_patch16_224', dict(img_size=64, depth=2), timm_layout_as_is, 'timm', 'deit3',
              dict(arch=two_layer_arch(), img_size=64), (96, 48)),
    'clip_openai': ('vit_base_patch16_clip_quickgelu_224',
                    dict(img_size=64, depth=2, embed_dim=192, num_heads=3), timm_to_openai_clip,
                    'openai_clip', 'clip', dict(arch=two_layer_arch(192, 3, 768), img_size=64,
                                                   act='quick_gelu'), (48, 96)),
    # open_clip LAION-2B / DataComp weights (timm vit_*_clip_224.laion2b*): GELU, given as act
    'clip_gelu': ('vit_base_patch16_clip_224',
                  dict(img_size=64, depth=2, embed_dim=192, num_heads=3), timm_to_openai_clip,
                  'openai_clip', 'clip', dict(arch=two_layer_arch(192, 3, 768), img_size=64,
                                              act='gelu'), (48, 96)),
    # DeiT distilled: the distillation token is read as one register token
    'deit_distilled': ('deit_small_distilled_patch16_224', dict(img_size=64, depth=2),
                       timm_layout_as_is, 'timm', 'deit',
                       dict(arch=two_layer_arch(), img_size=64, num_reg_tokens=1), (96, 48)),
    'mae': ('vit_base_patch16_224.mae', dict(img_size=64, depth=2, embed_dim=192, num_heads=3),
            timm_with_mae_decoder, 'timm', 'mae', dict(arch=two_layer_arch(192, 3, 768), img_size=64),
            (96, 48)),
    'deit': ('deit_small_patch16_224', dict(img_size=64, depth=2), timm_layout_as_is, 'timm', 'deit',
             dict(arch=two_layer_arch(), img_size=64), (96, 48)),
    'timm_reg_with_positions': ('vit_small_patch16_224',
                                dict(img_size=64, depth=2, reg_tokens=2, no_embed_class=False),
                                timm_layout_as_is, 'timm', 'deit',
                                dict(arch=two_layer_arch(), img_size=64, num_reg_tokens=2), (96, 48)),
}


def _build_timm(name: str, kwargs: dict) -> torch.nn.Module:
    model = timm.create_model(name, pretrained=False, dynamic_img_size=True, **kwargs)
    randomise_(model)
    return model.eval()


@pytest.mark.parametrize('case', sorted(CASES))
def test_converted_checkpoint_matches_timm(case):
    timm_name, timm_kw, to_source, layout, family, ours_kw, other_hw = CASES[case]
    ref = _build_timm(timm_name, timm_kw)
    source = to_source(ref.state_dict())
    assert detect_layout(source) == layout

    native = ours_kw['img_size']
    resolutions = [((native, native), None), (other_hw, 'bicubic_antialias')]
    for (h, w), pos_interp in resolutions:
        kwargs = dict(ours_kw, family=family, out_type='raw')
        if pos_interp is not None:
            kwargs['pos_interp'] = pos_interp
        ours = VisionTransformer(**kwargs).eval()
        report = load_pretrained(ours, source, layout='auto')
        assert report.source_layout == layout
        x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h * w))
        with torch.no_grad():
            expected = ref.forward_features(x)
            got = ours.forward_tokens(x)[0]
        assert got.shape == expected.shape, (case, h, w)
        err = (got - expected).abs().max().item()
        assert err <= TOL, f'{case} at {h}x{w}: max abs diff {err:.3g}'


def test_clip_projection_dropped_or_kept():
    ref = _build_timm('vit_base_patch16_clip_quickgelu_224',
                      dict(img_size=64, depth=1, embed_dim=192, num_heads=3))
    source = timm_to_openai_clip(ref.state_dict())
    converted, report = convert_state_dict(source)
    assert 'visual.proj' in report.dropped and 'proj' not in report.extras
    assert 'text_projection' in report.dropped and 'logit_scale' in report.dropped
    assert not any('proj' == k or k.startswith('visual') for k in converted)
    _, kept = convert_state_dict(source, keep_projection=True)
    assert torch.equal(kept.extras['proj'], source['visual.proj'])
    with pytest.raises(TypeError, match='keep_projection'):
        convert_state_dict(ref.state_dict(), layout='timm', keep_projection=True)


def test_dinov2_hub_register_layout_is_exact():
    """pos_embed keeps the class row; registers get no position; mask token is (1, C)."""
    ref = _build_timm('vit_small_patch14_reg4_dinov2', dict(img_size=98, depth=1))
    hub = timm_to_dinov2_hub(ref.state_dict())
    converted, report = convert_dinov2(hub)
    assert converted['pos_embed'].shape == (1, 50, 384)
    assert torch.equal(converted['reg_token'], hub['register_tokens'])
    assert converted['mask_token'].shape == (1, 384)
    assert report.renamed == {'register_tokens': 'reg_token'}
    # Same model through timm's own layout: class position folded, zero row prepended.
    from_timm, timm_report = convert_state_dict(ref.state_dict(), layout='timm')
    assert torch.equal(from_timm['pos_embed'][:, 0], torch.zeros(1, 384))
    assert any('zero class position' in n for n in timm_report.notes)


def _hub_interpolate(pos_embed: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Direct transcription of the DINOv2 hub ``interpolate_pos_encoding`` on patch rows."""
    n = pos_embed.shape[1] - 1
    m = int(math.sqrt(n))
    dim = pos_embed.shape[-1]
    patch = pos_embed[:, 1:].float().reshape(1, m, m, dim).permute(0, 3, 1, 2)
    patch = F.interpolate(patch, scale_factor=((h + 0.1) / m, (w + 0.1) / m), mode='bicubic',
                          antialias=False)
    assert patch.shape[-2:] == (h, w)
    return patch.permute(0, 2, 3, 1).reshape(1, -1, dim)


@pytest.mark.parametrize('hw', [(9, 5), (5, 9), (4, 4), (16, 12)])
def test_dinov2_default_interpolation_is_the_hub_formula(hw):
    ref = _build_timm('vit_small_patch14_dinov2', dict(img_size=98, depth=1))
    hub = timm_to_dinov2_hub(ref.state_dict())
    ours = VisionTransformer(arch=dict(two_layer_arch(), num_layers=1), family='dinov2', img_size=98)
    load_pretrained(ours, hub)  # the checkpoint's 7 x 7 grid
    assert ours.pos_grid == (7, 7) and ours.pos_interp == 'dinov2'
    got = ours.patch_pos_embed(hw, None, torch.float32)
    expected = _hub_interpolate(hub['pos_embed'], *hw)
    assert torch.allclose(got, expected, atol=1e-6, rtol=0)
    # And it is really different from plain bicubic resizing.
    plain = F.interpolate(hub['pos_embed'][:, 1:].reshape(1, 7, 7, -1).permute(0, 3, 1, 2),
                          size=hw, mode='bicubic', align_corners=False)
    assert (plain.permute(0, 2, 3, 1).reshape(1, -1, 384) - got).abs().max() > 1e-4
