"""mmlinvit with family 'clip' defaults reproduces the official OpenAI CLIP image tower.

The reference is ``tests/fixtures/clip_official_reference.pt``, written by
``tests/fixtures/make_clip_reference.py`` from openai/CLIP's own ``clip/model.py``
(``CLIP``, ``build_model``) and ``clip/clip.py`` (``_transform``), with random weights (see
that script for the model and how to regenerate it).  The official state dict, in the released
key layout with its text tower, is written to a real checkpoint file and loaded with
``pretrained=`` (layout auto-detection ``'openai_clip'``, the converter, the strict key check);
only the architecture (widths, depth, heads, image size) is passed to mmlinvit, everything
else comes from the family defaults (``ln_pre``, QuickGELU, class token, final norm, eps).

Compared (fp32, native resolution, a batch of two images): every block output (the
features the ViT-Linearizer's ``blocks.{i}`` recorders read), the final tokens (``ln_post`` on
every token), the class-token output (the official ``ln_post(x[:, 0])``), the patch feature
map, the projected embedding (``proj`` set aside by ``keep_projection``), and the
ViT-Linearizer teacher's input normalisation against the official ``clip.load`` preprocessing.
"""
import os.path as osp
from typing import Dict

import pytest
import torch
from mmengine.config import Config

from mmlinvit.backbones import VisionTransformer
from mmlinvit.backbones.training_record import TrainingRecordMismatchError
from mmlinvit.converters import convert_state_dict, load_pretrained
from mmlinvit.distill import build_recorder
from mmlinvit.layers.transformer import QuickGELU
from official_golden import load_generator, load_golden

TESTS = osp.dirname(osp.dirname(osp.abspath(__file__)))
REPO = osp.dirname(TESTS)
#: The ViT-Linearizer distillation configs with the OpenAI CLIP ViT-B/16 teacher.
LINEARIZER_CONFIGS = (
    'linearizer/vit-linearizer_clip-b16_vit-b-elu_16xb64-300e_in1k-224x224.py',
    'linearizer/vit-linearizer_clip-b16_adventurer-b_16xb64-300e_in1k-224x224.py',
)
TOL = 1e-5


GEN = load_generator('make_clip_reference')


@pytest.fixture(scope='module')
def golden() -> dict:
    return load_golden('clip_official_reference.pt')


@pytest.fixture(scope='module')
def outputs(golden) -> Dict[str, torch.Tensor]:
    return golden['outputs']


@pytest.fixture(scope='module')
def checkpoint(golden, tmp_path_factory) -> str:
    """The official state dict as a checkpoint file (released key layout, text tower and all)."""
    path = str(tmp_path_factory.mktemp('clip_openai') / 'ViT-tiny-16.pt')
    torch.save(golden['state_dict'], path)
    return path


@pytest.fixture(scope='module')
def batch() -> torch.Tensor:
    return GEN.reference_batch()


def build(golden: dict, checkpoint: str, **kwargs) -> VisionTransformer:
    """mmlinvit's model: family 'clip' defaults, the golden model's architecture only, and
    the activation: a plain state dict does not say it (OpenAI's TorchScript release does,
    see tests/converters/test_clip_torchscript.py)."""
    arch = golden['mmlinvit_kwargs']
    assert set(arch) == {'arch', 'img_size'}  # no family option is passed
    kwargs.setdefault('act', 'quick_gelu')
    model = VisionTransformer(family='clip', pretrained=checkpoint, **arch, **kwargs)
    model.init_weights()
    return model.eval()


def max_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape, (tuple(got.shape), tuple(expected.shape))
    return (got - expected).abs().max().item()


def linearizer_config(rel: str) -> Config:
    return Config.fromfile(osp.join(REPO, 'configs', rel))


def test_golden_file_matches_its_generator(golden, outputs, batch):
    """Inputs are re-derived bit-exactly; the checkpoint has the released layout."""
    assert batch.double().sum().item() == outputs['input_sum'].item()
    pixels = GEN.reference_pixels(GEN.IMG_SIZE, GEN.IMG_SIZE, GEN.PIXEL_SEED)
    assert pixels.long().sum().item() == outputs['pixels_sum'].item()
    assert golden['meta']['clip_kwargs'] == GEN.CLIP_KWARGS
    assert golden['mmlinvit_kwargs'] == GEN.mmlinvit_kwargs()
    sd = golden['state_dict']
    for key in ('visual.class_embedding', 'visual.positional_embedding', 'visual.conv1.weight',
                'visual.ln_pre.weight', 'visual.transformer.resblocks.1.attn.in_proj_weight',
                'visual.ln_post.bias', 'visual.proj', 'text_projection', 'logit_scale',
                'token_embedding.weight', 'transformer.resblocks.0.mlp.c_fc.weight',
                'input_resolution'):
        assert key in sd, key
    assert all(v.dtype == torch.float16 for v in sd.values() if v.is_floating_point())
    assert sd['visual.positional_embedding'].shape == (17, GEN.WIDTH)
    assert golden['meta']['num_heads'] == 2  # build_model's width // 64


def test_checkpoint_loads_as_openai_clip_with_family_defaults(golden, checkpoint):
    model = build(golden, checkpoint)
    report = model.load_report
    assert report.source_layout == 'openai_clip'
    assert any("detected as 'openai_clip'" in n for n in report.notes)
    visual = [k for k in golden['state_dict'] if k.startswith('visual.')]
    assert report.loaded == len(visual) - 1 and not report.unexpected  # all but proj
    # Every parameter comes from the checkpoint (only non-parameter records may be missing).
    assert not set(report.missing) & {name for name, _ in model.named_parameters()}
    assert set(report.dropped) == set(golden['state_dict']) - set(visual) | {'visual.proj'}
    # The family defaults are the official architecture.
    assert isinstance(model.pre_norm, torch.nn.LayerNorm) and model.pre_norm.eps == 1e-5
    assert isinstance(model.blocks[0].mlp.act, QuickGELU)
    assert model.patch_embed.proj.bias is None and model.out_type == 'cls_token'
    assert model.token_layout == (0, slice(1, None))  # class token first, as the official


def test_block_outputs_match_official_resblocks(golden, checkpoint, batch, outputs):
    """``out_indices`` over every block, ``'raw'``: the intermediate block is the official
    ``resblocks[0]`` output (un-normalised); the last is ``ln_post`` of every token."""
    model = build(golden, checkpoint, out_indices=[0, 1], out_type='raw')
    with torch.no_grad():
        first, last = model(batch)
    errors = dict(block_0=max_error(first, outputs['block_0']),
                  last_normed=max_error(last, outputs['tokens_ln_post']))
    assert max(errors.values()) <= TOL, errors


def test_final_tokens_are_ln_post_of_every_token(golden, checkpoint, batch, outputs):
    model = build(golden, checkpoint, out_type='raw')
    with torch.no_grad():
        (tokens,) = model(batch)
        forward_tokens = model.forward_tokens(batch)[0]
    assert max_error(tokens, outputs['tokens_ln_post']) <= TOL
    assert max_error(forward_tokens, outputs['tokens_ln_post']) <= TOL


def test_cls_token_output_is_the_official_pooled_feature(golden, checkpoint, batch, outputs):
    """The default ``out_type`` ('cls_token') is what the official forward feeds ``proj``."""
    model = build(golden, checkpoint)
    with torch.no_grad():
        (pooled,) = model(batch)
    assert max_error(pooled, outputs['pooled']) <= TOL


def test_featmap_is_the_official_patch_grid(golden, checkpoint, batch, outputs):
    """``'featmap'``: patch tokens in the raster order of the official ``conv1`` flatten."""
    model = build(golden, checkpoint, out_type='featmap')
    with torch.no_grad():
        (featmap,) = model(batch)
    grid = GEN.IMG_SIZE // GEN.PATCH
    patches = outputs['tokens_ln_post'][:, 1:]
    expected = patches.transpose(1, 2).reshape(batch.shape[0], GEN.WIDTH, grid, grid)
    assert max_error(featmap, expected) <= TOL


def test_kept_projection_gives_the_official_image_embedding(golden, checkpoint, batch,
                                                            outputs):
    """The backbone's features are pre-projection; ``keep_projection=True`` sets ``proj``
    aside, and the class-token output times it is the official ``encode_image``."""
    model = VisionTransformer(family='clip', act='quick_gelu', **golden['mmlinvit_kwargs']).eval()
    report = load_pretrained(model, checkpoint, keep_projection=True)
    proj = report.extras['proj']
    assert torch.equal(proj, golden['state_dict']['visual.proj'])
    assert 'visual.proj' not in report.dropped
    with torch.no_grad():
        (pooled,) = model(batch)
    assert max_error(pooled @ proj.float(), outputs['embedding']) <= TOL
    _, default = convert_state_dict(golden['state_dict'])
    assert 'visual.proj' in default.dropped and 'proj' not in default.extras


def test_linearizer_teacher_records_match_official(golden, checkpoint, batch, outputs):
    """The ViT-Linearizer config's teacher and recorders ('blocks.{i}' stage ends, 'norm'
    final features), shrunk to the golden architecture, read the official block outputs and
    the official ``ln_post`` of every token."""
    cfg = linearizer_config(LINEARIZER_CONFIGS[0]).model
    teacher = dict(cfg.teacher)
    assert teacher.pop('type') == 'mmlinvit.VisionTransformer' and teacher['family'] == 'clip'
    teacher.update(golden['mmlinvit_kwargs'], pretrained=checkpoint, act='quick_gelu')
    model = VisionTransformer(**teacher)
    model.init_weights()
    model.eval()
    stages_cfg = dict(cfg.teacher_recorders.stages, indices=[0, 1])
    stages = build_recorder(stages_cfg).attach(model)
    final = build_recorder(dict(cfg.teacher_recorders.final)).attach(model)
    pre = build_recorder('pre_norm').attach(model)
    with stages, final, pre, torch.no_grad():
        model(batch)
        got = dict(ln_pre=pre.get(), block_0=stages.get()[0], block_1=stages.get()[1],
                   tokens_ln_post=final.get())
    errors = {name: max_error(value, outputs[name]) for name, value in got.items()}
    assert max(errors.values()) <= TOL, errors


@pytest.mark.parametrize('rel', LINEARIZER_CONFIGS)
def test_teacher_input_norm_constants_are_clip_preprocessing(golden, rel):
    """``teacher_input_norm`` is the official ``Normalize`` mean / std, in 0-255 units."""
    official = golden['meta']['preprocess']
    assert 'interpolation=bicubic' in official['repr'] and 'CenterCrop' in official['repr']
    norm = linearizer_config(rel).model.teacher_input_norm
    assert list(norm.mean) == [m * 255 for m in official['mean']]
    assert list(norm.std) == [s * 255 for s in official['std']]
    assert [m / 255 for m in norm.mean] == pytest.approx(official['mean'], rel=1e-15, abs=0)
    assert [s / 255 for s in norm.std] == pytest.approx(official['std'], rel=1e-15, abs=0)


def test_teacher_path_reproduces_official_preprocessing_and_features(golden, checkpoint,
                                                                     outputs):
    """Pixels -> the config's ImageNet data preprocessor -> ``teacher_input_norm`` -> teacher
    equals the official ``_transform`` -> official image tower."""
    from mmpretrain.models.utils import ClsDataPreprocessor

    from mmlinvit.models.distill import TeacherInputNorm

    cfg = linearizer_config(LINEARIZER_CONFIGS[0])
    pre_cfg = dict(cfg.data_preprocessor)
    assert pre_cfg.pop('type') == 'ClsDataPreprocessor'
    data_preprocessor = ClsDataPreprocessor(**pre_cfg)
    pixels = GEN.reference_pixels(GEN.IMG_SIZE, GEN.IMG_SIZE, GEN.PIXEL_SEED)
    bgr = pixels.permute(2, 0, 1).flip(0).contiguous()  # LoadImageFromFile + PackInputs
    student_view = data_preprocessor(dict(inputs=[bgr]), training=False)['inputs']
    norm = TeacherInputNorm.from_config(cfg.model.teacher_input_norm, data_preprocessor)
    teacher_view = norm(student_view, data_preprocessor)
    input_err = max_error(teacher_view, outputs['preprocessed'])
    assert input_err <= TOL, input_err
    assert max_error(student_view, outputs['preprocessed']) > 0.1  # ImageNet != CLIP stats
    model = build(golden, checkpoint, out_type='raw')
    with torch.no_grad():
        tokens = model.forward_tokens(teacher_view)[0]
    err = max_error(tokens, outputs['preprocessed_tokens_ln_post'])
    assert err <= 1e-4, err


def test_gelu_instead_of_quick_gelu_is_far_off(golden, checkpoint, batch, outputs):
    """Control: the golden outputs see the activation (exact GELU is not QuickGELU)."""
    model = build(golden, checkpoint, out_type='raw', act='gelu')
    with torch.no_grad():
        tokens = model.forward_tokens(batch)[0]
    assert max_error(tokens, outputs['tokens_ln_post']) > 1e-2


def test_plain_state_dict_needs_the_activation(golden, checkpoint):
    """A plain CLIP state dict does not say its activation (OpenAI: QuickGELU; open_clip
    LAION-2B / DataComp: GELU): family 'clip' refuses it until act= is given."""
    model = VisionTransformer(family='clip', pretrained=checkpoint, **golden['mmlinvit_kwargs'])
    with pytest.raises(TrainingRecordMismatchError, match="act='gelu'") as info:
        model.init_weights()
    assert "act='quick_gelu'" in str(info.value) and not model.weights_loaded
    # mmlinvit files record it: a GELU-trained file is refused by a QuickGELU model
    trained = build(golden, checkpoint, act='gelu')
    with pytest.raises(TrainingRecordMismatchError, match="act='gelu'"):
        VisionTransformer(family='clip', **golden['mmlinvit_kwargs']).load_state_dict(
            trained.state_dict())
