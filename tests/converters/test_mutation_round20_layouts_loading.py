"""Mutation round 20 over :mod:`mmlinvit.converters.layouts` and ``.loading``.

Guards what rounds 9, 14 and 16 left open, each against a reference written in the test from
the official layouts or run in it:

* layout detection: HuggingFace CLIP's vision embeddings (``embeddings.patch_embedding`` and
  ``embeddings.class_embedding``, the latter also an OpenAI CLIP name) are named HF, not read
  as OpenAI CLIP;
* timm heads: the pre-logits layer of timm's first ImageNet-21k releases
  (``pre_logits.fc``, ``representation_size``) is a head part, dropped and reported, and the
  file gives timm's own tokens;
* reading files: the four wrapper keys nest into each other (one level each); a layout
  without options says it accepts none;
* mismatch messages: the checkpoint summary counts Adventurer's ``layers.i`` blocks and the
  file's register tokens; a long list of shape mismatches is cut at 40
  lines with the rest counted; an operator parameter missing from a block that carries
  others names them; the final-norm hint is only for ViT files;
* loading: no resampling note for a model without a position embedding; OpenAI CLIP keys
  loaded by name (mmengine ``load_from``) go through the same activation check as
  ``pretrained=``;
* a safetensors file is told by its content when its name lacks the suffix (the rename is
  named) and its suffix is read in any case.

Finding of this round (``test_no_embed_class_true_refuses_rows_that_are_no_grid``, which fails
on the code before the fix in ``layouts._fix_timm_pos_embed``): ``no_embed_class=True``
skipped the check that the ``pos_embed`` rows form a grid, so a file with a class row got a
second (zero) one and failed later on a ``pos_embed`` shape the file does not have.

Expected values are written by hand from the official layouts (timm ``VisionTransformer``,
HuggingFace ``CLIPVisionEmbeddings``, OpenAI CLIP ``VisionTransformer``, the public Adventurer
code) or come from the official code (timm) run in the test.
"""
from typing import Any, Dict, Optional

import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.backbones.training_record import TrainingRecordMismatchError
from mmlinvit.converters import (CheckpointMismatchError, convert_state_dict, convert_timm,
                                 detect_layout, load_pretrained)

from test_mutation_round14_loading_layouts import _randomise

C = 8  # embedding width of the hand-written state dicts


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- detection


def test_huggingface_clip_embeddings_alone_name_the_hf_layout() -> None:
    """HF ``CLIPVisionEmbeddings`` names its parameters ``class_embedding``,
    ``patch_embedding`` (a Conv2d) and ``position_embedding`` (an Embedding).  Its
    ``class_embedding`` ends like OpenAI CLIP's, so the HF check must recognise the singular
    ``patch_embedding`` itself: otherwise a file of these keys reads as OpenAI CLIP."""
    sd = {'vision_model.embeddings.class_embedding': _randn(C, seed=1),
          'vision_model.embeddings.patch_embedding.weight': _randn(C, 3, 4, 4, seed=2),
          'vision_model.embeddings.position_embedding.weight': _randn(5, C, seed=3),
          'vision_model.pre_layrnorm.weight': torch.ones(C)}
    with pytest.raises(ValueError, match='HuggingFace transformers layout') as info:
        detect_layout(sd)
    assert 'vision_model.embeddings.patch_embedding.weight' in str(info.value)


# --------------------------------------------------------------------------- timm heads


def test_timm_pre_logits_layer_is_a_head_part() -> None:
    """timm's first ImageNet-21k ViTs (``representation_size``) have a ``pre_logits.fc``
    layer between the pooled token and the classifier: part of the head.  It is dropped (and
    reported), and the file loads strictly and gives timm's own tokens."""
    timm = pytest.importorskip('timm')
    ref = timm.models.vision_transformer.VisionTransformer(
        img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, mlp_ratio=2,
        num_classes=3)
    _randomise(ref)
    sd = dict(ref.state_dict())
    sd['pre_logits.fc.weight'] = _randn(16, 16, seed=4)
    sd['pre_logits.fc.bias'] = _randn(16, seed=5)
    out, report = convert_timm(sd)
    assert not any(k.startswith(('pre_logits.', 'head.')) for k in out)
    assert {'pre_logits.fc.weight', 'pre_logits.fc.bias', 'head.weight'} <= set(report.dropped)
    ours = VisionTransformer(arch=dict(embed_dims=16, num_layers=1, num_heads=2,
                                       mlp_hidden_dims=32),
                             img_size=16, patch_size=8, out_type='raw', norm_eps=1e-6).eval()
    load_pretrained(ours, sd, layout='timm')
    x = _randn(2, 3, 16, 16, seed=6)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_tokens(x)[0], ref.forward_features(x),
                                   atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- unwrapping


def test_every_wrapper_key_nested_once_is_unwrapped() -> None:
    """``state_dict`` -> ``model`` -> ``module`` -> ``teacher`` -> tensors: each of the four
    wrapper keys is one level, and every level is unwrapped (in that order, named in the
    notes); a fifth level is refused as too deep."""
    w = _randn(C, seed=7)
    nested: Dict[str, Any] = {'norm.weight': w}
    for key in ('teacher', 'module', 'model', 'state_dict'):
        nested = {key: nested}
    out, report = convert_state_dict(nested, layout='timm')
    assert set(out) == {'norm.weight'} and torch.equal(out['norm.weight'], w)
    assert [n for n in report.notes if n.startswith('unwrapped')] == [
        f"unwrapped checkpoint[{k!r}]" for k in ('state_dict', 'model', 'module', 'teacher')]
    with pytest.raises(ValueError, match='nests wrapper keys too deeply'):
        convert_state_dict({'state_dict': nested}, layout='timm')


def test_option_message_of_a_layout_without_options_says_none() -> None:
    """The DINOv2 converter takes no options besides the state dict itself: the message
    says it accepts none (the state dict is the input, not an option)."""
    sd = {'cls_token': _randn(1, 1, C, seed=8), 'register_tokens': _randn(1, 4, C, seed=9)}
    with pytest.raises(TypeError, match=r"Layout 'dinov2' takes no option\(s\) "
                                        r"\['no_embed_class'\]; it accepts none$"):
        convert_state_dict(sd, layout='dinov2', no_embed_class=True)


# --------------------------------------------------------------------------- mismatch messages

ARCH = dict(embed_dims=16, num_layers=1, num_heads=2, mlp_hidden_dims=32)


def _vit(arch: Optional[Dict[str, int]] = None, **kwargs: Any) -> VisionTransformer:
    """A one-block width-16 ViT on a 2x2 grid; ``arch`` overrides entries of :data:`ARCH`."""
    return VisionTransformer(arch=dict(ARCH, **(arch or {})), img_size=16, patch_size=8,
                             **kwargs)


def _summary(err: CheckpointMismatchError) -> str:
    """The message line that describes the checkpoint."""
    return next(line for line in str(err).splitlines()
                if line.startswith('the checkpoint looks like:'))


def test_checkpoint_summary_counts_register_tokens() -> None:
    """A file with 4 register tokens (``reg_token`` (1, 4, C)) into a model with 2: the
    summary names the file's 4 (the register hint is only for models without registers)."""
    sd = _vit(num_reg_tokens=4).state_dict()
    with pytest.raises(CheckpointMismatchError) as info:
        load_pretrained(_vit(num_reg_tokens=2), sd, layout='timm')
    assert 'num_reg_tokens=4,' in _summary(info.value)


def test_checkpoint_summary_counts_adventurer_layers() -> None:
    """An Adventurer file (public names: ``layers.i.mixer``, ``norm_f``) read into a ViT: the
    summary counts its ``layers.i`` blocks (3) and leaves out the ViT-only facts."""
    sd = {'patch_embed.proj.weight': _randn(16, 3, 8, 8, seed=14),
          'cls_token': _randn(1, 1, 16, seed=15), 'norm_f.weight': torch.ones(16)}
    for i in range(3):
        sd[f'layers.{i}.mixer.in_proj.weight'] = _randn(40, 16, seed=20 + i)
        sd[f'layers.{i}.norm.weight'] = torch.ones(16)
    with pytest.raises(CheckpointMismatchError) as info:
        load_pretrained(_vit(), sd, layout='adventurer')
    summary = _summary(info.value)
    assert 'num_layers=3,' in summary and 'layer_scale' not in summary


def test_long_shape_mismatch_lists_are_cut_at_forty_lines() -> None:
    """A 4-block width-8 file into a width-16 model: every tensor but the records disagrees.
    The message gives the count, the first 40 disagreements and how many more there are."""
    model = _vit(dict(num_layers=4))
    sd = _vit(dict(num_layers=4, embed_dims=8, mlp_hidden_dims=16)).state_dict()
    own = model.state_dict()
    mismatched = [k for k, v in sd.items() if k in own and v.shape != own[k].shape]
    assert len(mismatched) > 41
    with pytest.raises(CheckpointMismatchError) as info:
        load_pretrained(model, sd, layout='timm')
    lines = str(info.value).splitlines()
    start = lines.index(f'shape mismatches ({len(mismatched)}):')
    listed = lines[start + 1:start + 41]
    assert all(': checkpoint (' in line for line in listed)
    assert lines[start + 41] == f'  ... and {len(mismatched) - 40} more'



def test_missing_operator_parameter_names_the_blocks_other_ones() -> None:
    """A Hedgehog file (feature maps ``attn.feature_q`` / ``attn.feature_k``) without its
    ``feature_q`` and without a ``block_operators`` record: the evidence that the block comes
    from a linearized operator is the ``feature_k`` it still carries, which the message names."""
    model = _vit(attn_cfg='hedgehog', with_cls_token=False, pos_embed_type='sincos',
                 out_type='avg_featmap')
    sd = {k: v for k, v in model.state_dict().items()
          if k not in ('block_operators', 'blocks.0.attn.feature_q')}
    assert 'blocks.0.attn.feature_k' in sd
    with pytest.raises(CheckpointMismatchError) as info:
        load_pretrained(model, sd, layout='timm')
    assert ('1 of them are attention-operator parameters missing from checkpoint blocks that '
            'carry other operator parameters (blocks.0.attn.feature_k)' in str(info.value))


def test_final_norm_hint_needs_a_vit_checkpoint() -> None:
    """The 'no final norm' hint (a global-pool fine-tuned release) is for ViT files that have
    blocks but no ``norm``; a file of nothing but a mask token gets no such hint."""
    with pytest.raises(CheckpointMismatchError, match='no tensor of the checkpoint') as info:
        load_pretrained(_vit(family='dinov2', with_mask_token=True),
                        {'mask_token': torch.ones(1, 16)}, layout='dinov2')
    assert 'final_norm=False' not in str(info.value)


def test_no_resampling_note_for_a_model_without_position_embedding() -> None:
    """A model without a position embedding (``pos_embed_type='none'``) resamples no grid,
    so the report says nothing about position-grid resampling."""
    model = _vit(pos_embed_type='none')
    assert model.pos_embed is None
    report = load_pretrained(model, _vit(pos_embed_type='none').state_dict(), layout='timm')
    assert not any('pos_interp' in note for note in report.notes)


def _openai_clip_visual(model: VisionTransformer) -> Dict[str, torch.Tensor]:
    """The model's weights under the OpenAI CLIP ``visual.`` names (written from CLIP's
    ``VisionTransformer``: conv1, class_embedding, positional_embedding, ln_pre,
    transformer.resblocks.i.{ln_1, attn.in_proj_*, attn.out_proj, ln_2, mlp.c_fc, mlp.c_proj},
    ln_post, proj)."""
    out = {}
    for key, value in model.state_dict().items():
        if key in model.TRAINING_RECORDS:
            continue
        if key == 'cls_token':
            out['visual.class_embedding'] = value.reshape(-1)
            continue
        if key == 'pos_embed':
            out['visual.positional_embedding'] = value[0]
            continue
        new = key
        for old, repl in (('blocks.', 'transformer.resblocks.'), ('.norm1.', '.ln_1.'),
                          ('.norm2.', '.ln_2.'), ('attn.qkv.weight', 'attn.in_proj_weight'),
                          ('attn.qkv.bias', 'attn.in_proj_bias'),
                          ('attn.proj.', 'attn.out_proj.'), ('mlp.fc1.', 'mlp.c_fc.'),
                          ('mlp.fc2.', 'mlp.c_proj.')):
            new = new.replace(old, repl)
        for old, repl in (('patch_embed.proj.', 'conv1.'), ('pre_norm.', 'ln_pre.'),
                          ('norm.', 'ln_post.')):
            if new.startswith(old):
                new = repl + new[len(old):]
        out['visual.' + new] = value
    out['visual.proj'] = _randn(model.embed_dims, 8, seed=10)
    return out


def test_whole_model_load_of_clip_keys_checks_the_activation() -> None:
    """OpenAI CLIP weights do not say their MLP activation (QuickGELU for OpenAI's, GELU for
    LAION's).  Loaded by name into a CLIP-family model without ``act`` (mmengine's
    ``load_from`` / model-level ``Pretrained``), the converted keys are refused like through
    ``pretrained=``, and nothing is loaded; with ``act`` given they load."""
    src = _randomise(_vit(family='clip', act='quick_gelu'))
    clip = _openai_clip_visual(src)
    model = _vit(family='clip')
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TrainingRecordMismatchError, match="read as layout 'openai_clip'"):
        model.load_state_dict(dict(clip))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    given = _vit(family='clip', act='quick_gelu')
    given.load_state_dict(dict(clip))
    for key, value in src.state_dict().items():
        if key not in src.TRAINING_RECORDS:
            assert torch.equal(given.state_dict()[key], value), key


# --------------------------------------------------------------------------- finding


def test_no_embed_class_true_refuses_rows_that_are_no_grid() -> None:
    """FINDING of round 20 (fails on the code before the fix in
    ``layouts._fix_timm_pos_embed``): ``no_embed_class=True`` reads every ``pos_embed`` row
    as a grid position.  Given for a file whose 17 rows are [class, 4x4 grid], the converter
    prepended a zero class row without checking the reading (``no_embed_class=False`` and
    ``None`` do check), and the load then failed on an 18-row ``pos_embed`` the file does
    not have.  The reading is refused, naming the option; a file it fits (16 rows, a 4x4
    grid) still gets its zero class row."""
    sd = {'cls_token': _randn(1, 1, C, seed=11), 'pos_embed': _randn(1, 17, C, seed=12),
          'patch_embed.proj.weight': _randn(C, 3, 4, 4, seed=13)}
    with pytest.raises(ValueError, match=r'no_embed_class=True reads all 17 pos_embed rows '
                                         r'as grid positions, but they are not a square grid'):
        convert_timm(sd, no_embed_class=True)
    out, _ = convert_timm(sd)  # inferred: class row + 4x4 grid, kept as it is
    assert torch.equal(out['pos_embed'], sd['pos_embed'])
    grid_only = dict(sd, pos_embed=sd['pos_embed'][:, 1:])
    out, _ = convert_timm(grid_only, no_embed_class=True)
    expected = torch.cat([torch.zeros(1, 1, C), grid_only['pos_embed']], dim=1)
    assert torch.equal(out['pos_embed'], expected)


# ------------------------------------------------------------------ safetensors by content
def test_a_safetensors_file_is_named_by_its_content_and_its_suffix_in_any_case(
        tmp_path) -> None:
    """A safetensors file (written by the safetensors package itself) saved as ``.pth`` was
    "not a PyTorch checkpoint ... damaged or something else"; it is named as a safetensors
    file with the rename that reads it. ``.SAFETENSORS`` is read as ``.safetensors``."""
    from safetensors.torch import save_file

    from mmlinvit.converters.checkpoint_file import CheckpointFileError
    from mmlinvit.converters.loading import load_checkpoint_file
    tensors = {'pos_embed': torch.arange(6.).reshape(1, 3, 2), 'cls_token': torch.ones(1, 1, 2)}
    misnamed = tmp_path / 'vit_small.pth'
    save_file(tensors, str(misnamed))
    with pytest.raises(CheckpointFileError,
                       match=r'is a safetensors file .*rename it to vit_small\.safetensors'):
        load_checkpoint_file(str(misnamed))
    upper = tmp_path / 'vit_small.SAFETENSORS'
    save_file(tensors, str(upper))
    loaded = load_checkpoint_file(str(upper))
    assert loaded.keys() == tensors.keys()
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())
    # a torch file is still told from it: bytes that start with '{' after 8 are not enough
    # when the claimed header does not fit the file
    junk = tmp_path / 'junk.pth'
    junk.write_bytes((10**6).to_bytes(8, 'little') + b'{"a": 1}')
    with pytest.raises(CheckpointFileError, match='is not a PyTorch checkpoint'):
        load_checkpoint_file(str(junk))
