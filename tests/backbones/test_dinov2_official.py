"""mmlinvit with family 'dinov2' defaults reproduces the official DINOv2 model at any size.

The reference is ``tests/fixtures/dinov2_official_reference.pt``, written by
``tests/fixtures/make_dinov2_reference.py`` from facebookresearch/dinov2's own
``DinoVisionTransformer`` (random weights; see that script for the variants and how to
regenerate it).  Each variant's hub-layout weights are written to a real checkpoint file and
loaded with ``pretrained=`` (layout auto-detection, the converters, the strict key check), and
mmlinvit's features are compared with the official ones at 518, 224, 280 x 420 and 1024.
Only the architecture is passed to mmlinvit (widths, depth, registers, SwiGLU): everything
else, the position-grid interpolation included, comes from the family defaults.
"""
from typing import Dict, Tuple

import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from official_golden import load_generator, load_golden

TOL = 1e-5


GEN = load_generator('make_dinov2_reference')


@pytest.fixture(scope='module')
def golden() -> dict:
    return load_golden('dinov2_official_reference.pt')


@pytest.fixture(scope='module')
def checkpoints(golden, tmp_path_factory) -> Dict[str, str]:
    """Each variant's official state dict as a checkpoint file (hub key layout)."""
    root = tmp_path_factory.mktemp('dinov2_hub')
    paths = {}
    for name, variant in golden['variants'].items():
        paths[name] = str(root / f'dinov2_{name}_pretrain.pth')
        torch.save(variant['state_dict'], paths[name])
    return paths


def build(golden: dict, checkpoints: Dict[str, str], name: str, **kwargs) -> VisionTransformer:
    """mmlinvit's model of a variant: family defaults, the variant's architecture only."""
    arch = golden['variants'][name]['mmlinvit_kwargs']
    assert set(arch) <= {'arch', 'num_reg_tokens', 'mlp_type'}  # no interpolation options
    model = VisionTransformer(family='dinov2', pretrained=checkpoints[name], **arch, **kwargs)
    model.init_weights()
    return model.eval()


def tokens_at(model: VisionTransformer, hw: Tuple[int, int]) -> torch.Tensor:
    """mmlinvit's final normalised tokens (prefix first), as stored in the golden file."""
    h, w = hw
    x = GEN.reference_input(h, w, GEN.input_seed(h, w))
    with torch.no_grad():
        tokens = model.forward_tokens(x)[0]
    if hw == (1024, 1024):
        prefix = model.num_prefix_tokens
        tokens = tokens[:, GEN.subsample_index(prefix, tokens.shape[1] - prefix)]
    return tokens


def max_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape
    return (got - expected).abs().max().item()


def test_golden_file_matches_its_generator(golden):
    """Inputs are re-derived bit-exactly, and the file covers every variant and size."""
    assert sorted(golden['variants']) == sorted(GEN.VARIANTS)
    assert [tuple(r) for r in golden['meta']['resolutions']] == list(GEN.RESOLUTIONS)
    for h, w in GEN.RESOLUTIONS:
        x = GEN.reference_input(h, w, GEN.input_seed(h, w))
        stored = golden['variants']['plain']['outputs'][f'input_sum_{h}x{w}']
        assert x.double().sum().item() == stored.item()
    # The hub key layouts under test really are there.
    chunked = golden['variants']['chunked']['state_dict']
    assert 'blocks.1.2.attn.qkv.weight' in chunked and 'blocks.0.0.norm1.weight' in chunked
    assert 'blocks.0.mlp.w12.weight' in golden['variants']['swiglu_g']['state_dict']
    assert golden['variants']['reg4']['state_dict']['register_tokens'].shape[1] == 4
    assert golden['variants']['reg4']['hub_kwargs']['interpolate_antialias'] is True
    assert golden['variants']['plain']['hub_kwargs']['interpolate_offset'] == 0.1


@pytest.mark.parametrize('name', sorted(GEN.VARIANTS))
def test_matches_official_dinov2_at_every_resolution(golden, checkpoints, name):
    model = build(golden, checkpoints, name, out_type='raw')
    expected_mode = 'dinov2_reg' if golden['variants'][name]['hub_kwargs'][
        'num_register_tokens'] else 'dinov2'
    assert model.pos_interp == expected_mode
    outputs = golden['variants'][name]['outputs']
    errors = {}
    for h, w in GEN.RESOLUTIONS:
        errors[f'{h}x{w}'] = max_error(tokens_at(model, (h, w)), outputs[f'tokens_{h}x{w}'])
    assert max(errors.values()) <= TOL, f'{name}: max abs error per resolution {errors}'


@pytest.mark.parametrize('name', ['plain', 'reg4'])
def test_masked_tokens_match_official(golden, checkpoints, name):
    model = build(golden, checkpoints, name, out_type='raw')
    h, w = GEN.MASK_HW
    mask = GEN.reference_mask((h // GEN.PATCH) * (w // GEN.PATCH), seed=h + w)
    x = GEN.reference_input(h, w, GEN.input_seed(h, w))
    with torch.no_grad():
        got = model.forward_tokens(x, patch_mask=mask)[0]
    err = max_error(got, golden['variants'][name]['outputs'][f'masked_tokens_{h}x{w}'])
    assert err <= TOL, err


@pytest.mark.parametrize('name', sorted(GEN.VARIANTS))
def test_normed_intermediate_featmaps_match_official(golden, checkpoints, name):
    """``get_intermediate_layers(n=[0, last], reshape=True, norm=True)``, the DINOv2
    segmentation read-out, against ``out_indices`` + ``norm_all_outputs`` + ``featmap``."""
    depth = golden['variants'][name]['mmlinvit_kwargs']['arch']['num_layers']
    model = build(golden, checkpoints, name, out_indices=[0, depth - 1], norm_all_outputs=True,
                  out_type='featmap')
    h, w = GEN.INTERMEDIATE_HW
    with torch.no_grad():
        got = torch.stack(model(GEN.reference_input(h, w, GEN.input_seed(h, w))))
    err = max_error(got, golden['variants'][name]['outputs'][f'intermediate_{h}x{w}'])
    assert err <= TOL, err


def test_plain_hub_interpolation_on_a_register_model_is_far_off(golden, checkpoints):
    """Control: the plain models' interpolation (the old default for every DINOv2 model) is
    visibly wrong for the register variant, and an explicit pos_interp still overrides."""
    model = build(golden, checkpoints, 'reg4', out_type='raw', pos_interp='dinov2')
    assert model.pos_interp == 'dinov2' and model.pos_interp_source == 'explicit'
    outputs = golden['variants']['reg4']['outputs']
    assert max_error(tokens_at(model, (518, 518)), outputs['tokens_518x518']) <= TOL
    assert max_error(tokens_at(model, (224, 224)), outputs['tokens_224x224']) > 1e-2
