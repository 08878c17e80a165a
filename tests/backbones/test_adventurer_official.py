"""mmlinvit's ``Adventurer(flip_schedule='official')`` reproduces the official Adventurer code.

The reference is ``tests/fixtures/adventurer_official_reference.pt``, written by
``tests/fixtures/make_adventurer_reference.py`` from wangf3014/Adventurer's own
``models_mamba.Adventurer`` and ``mamba_custom.MambaCustom`` (random weights; the Triton /
CUDA kernels replaced by the PyTorch references that state-spaces/mamba and causal-conv1d ship
with them; see that script for the variants and how to regenerate it).  Each variant's
checkpoint, exactly as the public code saves it (``{'model': state_dict}``, classifier
``head.*`` included), is written to a file and loaded with ``pretrained=`` (the
``'adventurer'`` layout, ``head.*`` dropped, the strict key check); only the architecture
(widths, depth, image size, mixer sizes) is passed to mmlinvit.

The official scan there is the token-by-token recurrence (``selective_scan_ref``), so the
golden values do not depend on any chunking and mmlinvit's chunked scan is checked at several
chunk sizes, with and without autograd (different code paths).
"""
import copy
from typing import Dict

import pytest
import torch
import torch.nn.functional as F

from mmlinvit.backbones.adventurer import Adventurer
from official_golden import load_generator, load_golden

#: fp32; the measured errors are about 1e-6 (fp32 vs fp64 outputs differ by about 5e-6).
TOL = 1e-5


GEN = load_generator('make_adventurer_reference')
NAMES = sorted(GEN.VARIANTS)


@pytest.fixture(scope='module')
def golden() -> dict:
    return load_golden('adventurer_official_reference.pt')


@pytest.fixture(scope='module')
def checkpoints(golden, tmp_path_factory) -> Dict[str, str]:
    """Each variant's checkpoint file, as the public code writes it."""
    root = tmp_path_factory.mktemp('adventurer_public')
    paths = {}
    for name, variant in golden['variants'].items():
        paths[name] = str(root / f'adventurer_{name}.pth')
        torch.save(variant['checkpoint'], paths[name])
    return paths


def build(golden: dict, checkpoints: Dict[str, str], name: str, mixer_cfg: dict = None,
          **kwargs) -> Adventurer:
    """mmlinvit's model of a variant: its architecture, the official flips, its weights."""
    arch = copy.deepcopy(golden['variants'][name]['mmlinvit_kwargs'])
    assert set(arch) == {'arch', 'img_size', 'mixer_cfg'}
    arch['mixer_cfg'].update(mixer_cfg or {})
    model = Adventurer(**arch, flip_schedule='official', with_mask_token=False,
                       pretrained=checkpoints[name], **kwargs)
    model.init_weights()
    return model.eval()


def forward(model: Adventurer, name: str) -> torch.Tensor:
    """The first output of ``model`` on the variant's reference batch (no autograd)."""
    x = GEN.reference_batch(GEN.VARIANTS[name]['img_size'])
    with torch.no_grad():
        return model(x)[0]


def max_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape
    return (got - expected).abs().max().item()


def test_golden_file_matches_its_generator(golden):
    """Inputs are re-derived bit-exactly; the file holds what the generator describes."""
    assert sorted(golden['variants']) == NAMES
    for name, variant in golden['variants'].items():
        x = GEN.reference_batch(GEN.VARIANTS[name]['img_size'])
        assert x.double().sum().item() == variant['outputs']['input_sum'].item()
        assert variant['official_kwargs'] == GEN.official_kwargs(name)
        assert variant['mmlinvit_kwargs'] == GEN.mmlinvit_arch(name)
        state_dict = variant['checkpoint']['model']  # the public code's checkpoint layout
        assert {'head.weight', 'head.bias', 'norm_f.weight', 'layers.0.mixer.A_log',
                'layers.0.mixer.norm.weight', 'layers.0.norm_mlp.weight'} <= set(state_dict)
        assert not any(k.startswith('backbone.') or k == 'flipped_blocks' for k in state_dict)
        assert variant['outputs']['tokens'].shape[0] == GEN.BATCH
    assert max(golden['meta']['unfused_max_abs_diff'].values()) <= GEN.UNFUSED_TOL


@pytest.mark.parametrize('name', NAMES)
def test_tokens_match_official(golden, checkpoints, name):
    """Every token after ``norm_f`` (patches in raster order, class token last)."""
    model = build(golden, checkpoints, name, out_type='raw')
    report = model.load_report
    assert report.source_layout == 'adventurer' and 'head.weight' in report.dropped
    depth = GEN.VARIANTS[name]['depth']
    assert [i for i in range(depth) if model.layers[i].flip] == [2, 3]
    err = max_error(forward(model, name), golden['variants'][name]['outputs']['tokens'])
    assert err <= TOL, f'{name}: max abs error {err:.3g}'


@pytest.mark.parametrize('name', NAMES)
def test_class_token_features_and_head_logits_match_official(golden, checkpoints, name):
    """``forward_features`` and the official ``head`` applied to mmlinvit's class token."""
    variant = golden['variants'][name]
    cls = forward(build(golden, checkpoints, name, out_type='cls_token'), name)
    err = max_error(cls, variant['outputs']['features'])
    assert err <= TOL, f'{name}: features, max abs error {err:.3g}'
    state_dict = variant['checkpoint']['model']
    logits = F.linear(cls, state_dict['head.weight'], state_dict['head.bias'])
    err = max_error(logits, variant['outputs']['logits'])
    assert err <= TOL, f'{name}: logits, max abs error {err:.3g}'


@pytest.mark.parametrize('grad', [False, True], ids=['no_grad', 'autograd'])
@pytest.mark.parametrize('chunk_size', [16, 256])
@pytest.mark.parametrize('name', NAMES)
def test_tokens_do_not_depend_on_chunk_size(golden, checkpoints, name, chunk_size, grad):
    """The chunked scan at other chunk sizes, in its inference form (chunks capped at
    ``torch_impl.INFERENCE_CHUNK``) and in the vectorised autograd form (256: one chunk for
    every sequence here)."""
    model = build(golden, checkpoints, name, mixer_cfg=dict(chunk_size=chunk_size),
                  out_type='raw')
    x = GEN.reference_batch(GEN.VARIANTS[name]['img_size'])
    with torch.set_grad_enabled(grad):
        tokens = model(x)[0]
    assert tokens.requires_grad == grad
    err = max_error(tokens.detach(), golden['variants'][name]['outputs']['tokens'])
    assert err <= TOL, f'{name}, chunk_size {chunk_size}: max abs error {err:.3g}'


@pytest.mark.parametrize('name', NAMES)
def test_naive_scan_backend_matches_official(golden, checkpoints, name):
    model = build(golden, checkpoints, name, mixer_cfg=dict(ssd_backend='naive'),
                  out_type='raw')
    err = max_error(forward(model, name), golden['variants'][name]['outputs']['tokens'])
    assert err <= TOL, f'{name}: max abs error {err:.3g}'


@pytest.mark.parametrize('name', NAMES)
def test_paper_flips_give_other_features(golden, checkpoints, name):
    """Control: the same weights with ``flip_schedule='paper'`` (odd blocks reversed) are far
    from the official outputs, so the comparisons above can fail."""
    official = build(golden, checkpoints, name, out_type='raw')
    arch = golden['variants'][name]['mmlinvit_kwargs']
    paper = Adventurer(**arch, flip_schedule='paper', with_mask_token=False, out_type='raw')
    # The weights without the flips record (the public code's checkpoints have none).
    paper.load_state_dict(
        {k: v for k, v in official.state_dict().items() if k != 'flipped_blocks'})
    paper.eval()
    depth = GEN.VARIANTS[name]['depth']
    assert [i for i in range(depth) if paper.layers[i].flip] == list(range(1, depth, 2))
    err = max_error(forward(paper, name), golden['variants'][name]['outputs']['tokens'])
    assert err > 0.1, f'{name}: paper flips are only {err:.3g} from the official outputs'


def test_released_weights_refuse_the_default_flips(golden, checkpoints):
    """...which is why a public-code checkpoint into a model with other flips (the default
    'paper') fails at load time instead of giving those features."""
    from mmlinvit.backbones.adventurer import FlipScheduleMismatchError
    name = NAMES[0]
    arch = copy.deepcopy(golden['variants'][name]['mmlinvit_kwargs'])
    model = Adventurer(**arch, with_mask_token=False, pretrained=checkpoints[name])
    assert model.flip_schedule == 'paper'
    with pytest.raises(FlipScheduleMismatchError, match="flip_schedule='official'"):
        model.init_weights()
