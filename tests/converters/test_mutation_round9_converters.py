"""Mutation round 9 over the checkpoint converters (:mod:`mmlinvit.converters`).

Guards behaviour that no other test pinned down and whose change would load a checkpoint
"fine" with wrong weights, or refuse / mangle a file that reads: the ``pos_embed`` readings of
timm files with register tokens (an ambiguous row count is refused; ``no_embed_class`` decides
it), timm keys besides the blocks (``norm_pre``, DeiT-III ``gamma_1`` / ``gamma_2``,
``attn_pool``), mmpretrain's DeiT distillation token, OpenAI CLIP ResNet files, the file-level
checks (safetensors and legacy files read; a damaged pickle record is refused), prefix
selection, and the conversion report.  Expected values are written by hand from the official
layouts (timm ``VisionTransformer`` / ``checkpoint_filter_fn``, mmpretrain's
``DistilledVisionTransformer``, the safetensors header format), or come from the official
model code (timm, mmpretrain) run on the same weights.
"""
import zipfile
from typing import Dict

import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.converters import (ConversionReport, convert_dinov2, convert_openai_clip,
                                 convert_state_dict, convert_timm, detect_layout,
                                 load_checkpoint_file, load_pretrained, select_backbone)
from mmlinvit.converters.checkpoint_file import CheckpointFileError, checkpoint_file_problem
from mmlinvit.converters.report import summarise_keys

C = 8  # embedding width of the hand-written state dicts


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def timm_tokens(num_reg: int, rows: int) -> Dict[str, torch.Tensor]:
    """A timm-layout state dict with a class token, ``num_reg`` register tokens and a
    ``pos_embed`` of ``rows`` rows (values distinct per row, so a wrong slice shows)."""
    sd = {'cls_token': _randn(1, 1, C, seed=1), 'pos_embed': _randn(1, rows, C, seed=2),
          'patch_embed.proj.weight': _randn(C, 3, 4, 4, seed=3)}
    if num_reg:
        sd['reg_token'] = _randn(1, num_reg, C, seed=4)
    return sd


# --------------------------------------------------------------------------- timm pos_embed


def test_register_row_count_fitting_two_readings_is_refused_not_guessed():
    """Class token + 4 registers and 9 rows: a 3x3 grid without prefix rows (timm
    ``no_embed_class=True``) or a 2x2 grid after 1 + 4 prefix rows (``no_embed_class=False``).
    Picking one silently gives wrong positions for the other; it must be refused."""
    with pytest.raises(ValueError, match='ambiguous.*no_embed_class=True or False'):
        convert_timm(timm_tokens(num_reg=4, rows=9))


def test_no_embed_class_true_decides_an_ambiguous_count():
    """``no_embed_class=True``: every row is a grid position; a zero class row is prepended
    (timm adds no position to the class token) and the registers are unchanged."""
    sd = timm_tokens(num_reg=4, rows=9)
    out, report = convert_timm(sd, no_embed_class=True)
    expected = torch.cat([torch.zeros(1, 1, C), sd['pos_embed']], dim=1)
    assert torch.equal(out['pos_embed'], expected)
    assert torch.equal(out['reg_token'], sd['reg_token'])
    assert any('zero class position' in n for n in report.notes)


def test_no_embed_class_false_decides_an_ambiguous_count():
    """``no_embed_class=False``: rows are [class, 4 registers, 2x2 grid]; the register rows
    are added to the register tokens (timm adds them before the blocks)."""
    sd = timm_tokens(num_reg=4, rows=9)
    pos = sd['pos_embed']
    out, _ = convert_timm(sd, no_embed_class=False)
    assert torch.equal(out['reg_token'], sd['reg_token'] + pos[:, 1:5])
    assert torch.equal(out['pos_embed'], torch.cat([pos[:, :1], pos[:, 5:]], dim=1))
    assert out['pos_embed'].shape == (1, 5, C)


def test_no_embed_class_false_prefers_the_timm_reading_over_the_canonical_one():
    """Class + 5 registers and 10 rows: 1 + 5 prefix rows + 2x2 (timm's reading of
    ``no_embed_class=False``) or 1 class row + 3x3 (mmlinvit's own layout).  The option names
    timm's reading, so the register rows are folded, not read as grid positions."""
    sd = timm_tokens(num_reg=5, rows=10)
    pos = sd['pos_embed']
    out, report = convert_timm(sd, no_embed_class=False)
    assert torch.equal(out['reg_token'], sd['reg_token'] + pos[:, 1:6])
    assert torch.equal(out['pos_embed'], torch.cat([pos[:, :1], pos[:, 6:]], dim=1))
    assert any('folded 5 register positions' in n for n in report.notes)
    with pytest.raises(ValueError, match='ambiguous'):  # and without the option: refused
        convert_timm(sd)


def test_no_embed_class_false_without_registers_keeps_pos_embed():
    """Without registers ``no_embed_class=False`` is the canonical layout: nothing changes
    (and no register token appears)."""
    sd = timm_tokens(num_reg=0, rows=17)
    out, report = convert_timm(sd, no_embed_class=False)
    assert torch.equal(out['pos_embed'], sd['pos_embed'])
    assert 'reg_token' not in out and not report.notes


# --------------------------------------------------------------------------- timm keys


def test_old_deit3_gamma_keys_become_layer_scale():
    """The first DeiT-III releases name LayerScale ``blocks.i.gamma_1`` / ``gamma_2``
    (timm's ``checkpoint_filter_fn`` renames them ``ls1.gamma`` / ``ls2.gamma``)."""
    g1, g2 = _randn(C, seed=6), _randn(C, seed=7)
    sd = dict(timm_tokens(0, 17), **{'blocks.0.gamma_1': g1, 'blocks.0.gamma_2': g2})
    out, report = convert_timm(sd)
    assert torch.equal(out['blocks.0.ls1.gamma'], g1)
    assert torch.equal(out['blocks.0.ls2.gamma'], g2)
    assert report.renamed['blocks.0.gamma_1'] == 'blocks.0.ls1.gamma'


def test_attention_pooling_head_is_dropped_and_reported():
    """timm ``global_pool='map'`` models (SigLIP...) keep an ``attn_pool`` head: not part of
    the backbone, so dropped and named in the report."""
    sd = dict(timm_tokens(0, 17), **{'attn_pool.latent': _randn(1, 1, C, seed=8),
                                     'attn_pool.q.weight': _randn(C, C, seed=9)})
    out, report = convert_timm(sd)
    assert not any(k.startswith('attn_pool.') for k in out)
    assert set(report.dropped) == {'attn_pool.latent', 'attn_pool.q.weight'}
    assert 'attention-pooling' in report.dropped['attn_pool.latent']



def test_mae_pretraining_mask_token_is_the_decoders():
    """An MAE pretraining file's ``mask_token`` (1, 1, decoder width) belongs to the decoder
    (MAE ``models_mae.py``): dropped with the decoder, never offered to the encoder."""
    sd = dict(timm_tokens(0, 17), mask_token=_randn(1, 1, 16, seed=32),
              **{'decoder_embed.weight': _randn(16, C, seed=33)})
    out, report = convert_timm(sd)
    assert 'mask_token' not in out and 'decoder_embed.weight' not in out
    assert report.dropped == {'mask_token': 'MAE decoder', 'decoder_embed.weight': 'MAE decoder'}

# --------------------------------------------------------------------------- CLIP


def test_resnet_clip_file_is_refused():
    """OpenAI CLIP RN50 ... files (``visual.layer1`` / ``visual.attnpool``) have no ViT to
    load into; converting them would pass their keys through unnamed."""
    sd = {'visual.conv1.weight': _randn(C, 3, 3, 3, seed=11),
          'visual.layer1.0.conv1.weight': _randn(C, C, 1, 1, seed=12),
          'visual.attnpool.positional_embedding': _randn(50, C, seed=13),
          'transformer.resblocks.0.ln_1.weight': torch.ones(C)}
    assert detect_layout(sd) == 'openai_clip'
    with pytest.raises(ValueError, match='ResNet CLIP'):
        convert_openai_clip(sd)


def test_clip_report_names_the_source_keys_with_their_prefix():
    """The report's renamed map has the file's own key names (``visual.class_embedding``)."""
    sd = {'visual.class_embedding': _randn(C, seed=14),
          'visual.positional_embedding': _randn(5, C, seed=15),
          'visual.conv1.weight': _randn(C, 3, 4, 4, seed=16)}
    out, report = convert_openai_clip(sd)
    assert report.renamed == {'visual.class_embedding': 'cls_token',
                              'visual.positional_embedding': 'pos_embed',
                              'visual.conv1.weight': 'patch_embed.proj.weight'}
    assert torch.equal(out['cls_token'].reshape(-1), sd['visual.class_embedding'])


# --------------------------------------------------------------------------- DINOv2


def test_dinov2_head_is_dropped_and_a_3d_mask_token_is_flattened():
    """A hub-layout file with a linear head (``head.*``) and a ``(1, 1, C)`` mask token: the
    head is dropped (reported), the mask token becomes the canonical ``(1, C)``."""
    mask = _randn(1, 1, C, seed=17)
    sd = {'register_tokens': _randn(1, 4, C, seed=18), 'mask_token': mask,
          'head.weight': _randn(10, C, seed=19), 'head.bias': torch.zeros(10)}
    out, report = convert_dinov2(sd)
    assert torch.equal(out['mask_token'], mask.reshape(1, C))
    assert set(report.dropped) == {'head.weight', 'head.bias'}
    assert 'head.weight' not in out


def test_dinov2_chunked_blocks_take_their_global_index():
    """Hub ``BlockChunk`` files (ViT-g: ``block_chunks=4``) name a block
    ``blocks.<chunk>.<global index>``: 4 blocks in 2 chunks are ``blocks.0.0``,
    ``blocks.0.1``, ``blocks.1.2``, ``blocks.1.3``.  The global index is the block; the chunk
    index is not (with one block per chunk the two agree, which hides the difference)."""
    weights = [_randn(C, seed=40 + i) for i in range(4)]
    hub = {f'blocks.{i // 2}.{i}.norm1.weight': w for i, w in enumerate(weights)}
    out, chunked = convert_dinov2(hub)
    assert set(out) == {f'blocks.{i}.norm1.weight' for i in range(4)}
    assert all(torch.equal(out[f'blocks.{i}.norm1.weight'], w) for i, w in enumerate(weights))
    assert any('chunked' in n for n in chunked.notes)
    _, plain = convert_dinov2({'blocks.3.norm1.weight': weights[0]})
    assert not any('chunked' in n for n in plain.notes)


def test_a_file_mixing_chunked_and_flat_blocks_is_refused():
    """Two source keys for one canonical key (``blocks.0.1.*`` chunked and ``blocks.1.*``
    flat) mean mixed layouts: refused, never one of them silently kept."""
    a, b = _randn(C, seed=28), _randn(C, seed=29)
    with pytest.raises(ValueError, match="Two checkpoint keys map to 'blocks.1.norm1.weight'"):
        convert_dinov2({'blocks.0.1.norm1.weight': a, 'blocks.1.norm1.weight': b})



def test_adventurer_file_with_a_flip_record_keeps_it():
    """The official flips (blocks with ``n // 2 == 1``) are recorded only for files without a
    record: a file with a classifier head and its own ``flipped_blocks`` keeps its record
    (overwriting it would let the file load into a model of other flips)."""
    from mmlinvit.converters import convert_adventurer
    own = torch.tensor([True, False, True, False])
    sd = {f'layers.{i}.norm.weight': _randn(C, seed=50 + i) for i in range(4)}
    sd.update({'head.weight': _randn(10, C, seed=54), 'flipped_blocks': own})
    out, _ = convert_adventurer(sd)
    assert torch.equal(out['flipped_blocks'], own)
    del sd['flipped_blocks']  # the public code's file: the official flips are recorded
    out, _ = convert_adventurer(sd)
    assert out['flipped_blocks'].tolist() == [False, False, True, True]  # n // 2 == 1

# --------------------------------------------------------------------------- files


def test_safetensors_file_is_read(tmp_path):
    """timm's hub weights are ``.safetensors`` files; they are read (not refused as
    'not a PyTorch checkpoint')."""
    safetensors_torch = pytest.importorskip('safetensors.torch')
    sd = timm_tokens(0, 17)
    path = str(tmp_path / 'model.safetensors')
    safetensors_torch.save_file(sd, path)
    assert checkpoint_file_problem(path) is None
    read = load_checkpoint_file(path)
    assert read.keys() == sd.keys() and all(torch.equal(read[k], sd[k]) for k in sd)


def test_safetensors_header_past_the_end_of_the_file_is_named(tmp_path):
    """The header is 8 bytes of length N, then N bytes: a file of fewer than 8 + N bytes is
    truncated, even when it has more than N."""
    safetensors_torch = pytest.importorskip('safetensors.torch')
    path = str(tmp_path / 'model.safetensors')
    safetensors_torch.save_file({'w': torch.zeros(4)}, path)
    data = open(path, 'rb').read()
    header_len = int.from_bytes(data[:8], 'little')
    cut = str(tmp_path / 'cut.safetensors')
    with open(cut, 'wb') as f:
        f.write(data[:8 + header_len - 4])  # more than N bytes, fewer than 8 + N
    problem = checkpoint_file_problem(cut)
    assert problem is not None and 'truncated' in problem
    with pytest.raises(CheckpointFileError, match='truncated'):
        load_checkpoint_file(cut)


def test_legacy_torch_file_is_read(tmp_path):
    """Files saved before PyTorch 1.6 (``_use_new_zipfile_serialization=False``) start with
    pickle protocol 2 and torch's magic number; they are read."""
    sd = timm_tokens(0, 17)
    path = str(tmp_path / 'legacy.pth')
    torch.save(sd, path, _use_new_zipfile_serialization=False)
    assert checkpoint_file_problem(path) is None
    read = load_checkpoint_file(path)
    assert all(torch.equal(read[k], sd[k]) for k in sd)


def test_empty_file_is_named_empty(tmp_path):
    path = str(tmp_path / 'empty.pth')
    open(path, 'wb').close()
    assert 'is empty (0 bytes)' in checkpoint_file_problem(path)


def test_damaged_pickle_record_is_refused_not_read_with_other_names(tmp_path):
    """One changed byte in ``data.pkl`` renames a key, and ``torch.load`` reads it without
    complaint (it does not check the CRC); the CRC of the record must refuse the file."""
    path = str(tmp_path / 'model.pth')
    torch.save({'weight': torch.arange(4.0)}, path)
    data = bytearray(open(path, 'rb').read())
    with zipfile.ZipFile(path) as archive:
        assert archive.infolist()[0].compress_type == zipfile.ZIP_STORED
    at = data.find(b'weight')
    data[at + 5] = ord('u')  # 'weight' -> 'weighu'
    with open(path, 'wb') as f:
        f.write(bytes(data))
    assert 'weighu' in torch.load(path, weights_only=True)  # what the check prevents
    with pytest.raises(CheckpointFileError, match='CRC') as refused:
        load_checkpoint_file(path)
    message = str(refused.value)  # a changed byte, not a cut-short write
    assert 'changed after it was written' in message and 'cut short' not in message


# --------------------------------------------------------------------------- prefixes


def test_module_prefix_is_stripped_only_when_every_key_has_it():
    """DDP's ``module.`` is stripped from a file where every key carries it; a file where only
    some do keeps its names (never cuts 7 characters off other keys)."""
    w = _randn(C, seed=21)
    out, report = select_backbone({'module.norm.weight': w, 'module.norm.bias': w})
    assert set(out) == {'norm.weight', 'norm.bias'} and report.notes
    mixed = {'module.norm.weight': w, 'blocks.0.norm1.weight': w}
    out, report = select_backbone(mixed)
    assert set(out) == set(mixed) and not report.notes


def test_task_model_backbone_is_preferred_to_a_bare_student():
    """``backbone.`` (a task model) comes before the bare-backbone ``student.`` in the table."""
    w, v = _randn(C, seed=22), _randn(C, seed=23)
    out, report = select_backbone({'backbone.norm.weight': w, 'student.norm.weight': v})
    assert report.prefix == 'backbone.' and torch.equal(out['norm.weight'], w)
    assert report.dropped == {'student.norm.weight': "outside 'backbone.'"}


def test_student_only_search_is_not_refused_for_a_teacher():
    """The mmrazor refusal is for searches that would pick the teacher; a student-only
    search (:data:`STUDENT_PREFIXES`, the student export) takes the student."""
    from mmlinvit.converters import STUDENT_PREFIXES
    w, v = _randn(C, seed=30), _randn(C, seed=31)
    state = {'teacher.backbone.norm.weight': v, 'architecture.backbone.norm.weight': v,
             'student.backbone.norm.weight': w}
    out, report = select_backbone(state, STUDENT_PREFIXES)
    assert report.prefix == 'student.backbone.' and torch.equal(out['norm.weight'], w)
    with pytest.raises(CheckpointFileError, match='mmrazor'):
        select_backbone(state)  # the full table would take the teacher: refused


# --------------------------------------------------------------------------- detection


def test_huggingface_clip_encoder_keys_are_named():
    """HF CLIP's ``encoder.layers.N.self_attn`` keys alone name the HF layout."""
    state = {'vision_model.encoder.layers.0.self_attn.k_proj.weight': torch.zeros(2),
             'vision_model.post_layernorm.weight': torch.zeros(2)}
    with pytest.raises(ValueError, match='HuggingFace transformers layout'):
        detect_layout(state)


def test_adventurer_blocks_name_the_layout_without_a_final_norm():
    """Adventurer's block keys (``layers.N.mixer`` / ``norm_mlp``) are Adventurer even in a
    file without ``norm_f``; read as timm, a public-code file would lose its flip record."""
    state = {'patch_embed.proj.weight': torch.zeros(C, 3, 4, 4),
             'layers.0.mixer.A_log': torch.zeros(2), 'layers.0.norm_mlp.weight': torch.zeros(C)}
    assert detect_layout(state) == 'adventurer'


# --------------------------------------------------------------------------- report


def test_summarise_keys_groups_blocks_and_counts_the_rest():
    keys = [f'layers.{i}.mixer.A_log' for i in range(4)] + [
        'blocks.0.ls1.gamma', 'blocks.1.ls1.gamma', 'blocks.5.ls1.gamma',
        'blocks.7.ls2.gamma', 'cls_token']
    assert summarise_keys(keys) == ['cls_token', 'blocks.{0,1,5}.ls1.gamma',
                                    'blocks.7.ls2.gamma', 'layers.{0-3}.mixer.A_log']
    assert summarise_keys(['blocks.2.a', 'blocks.3.a']) == ['blocks.{2-3}.a']
    many = [f'k{i}' for i in range(12)]
    assert summarise_keys(many, limit=10)[-1] == '... and 2 more'


def test_report_format_and_plain_data():
    report = ConversionReport(source_layout='openai_clip', prefix='backbone.')
    report.extras['proj'] = torch.zeros(4, 2)
    report.missing = ['mask_token', 'blocks.0.attn.x']
    report.initialised = {'mask_token': 'kept at init'}
    report.unexpected = ['head.weight']
    text = report.format()
    assert 'missing (left at init): mask_token (kept at init); blocks.0.attn.x ' \
           '(skipped (strict=False))' in text
    assert 'unexpected (ignored): head.weight' in text
    assert 'set aside: proj (4, 2)' in text
    plain = report.to_dict()
    assert plain['extras'] == {'proj': [4, 2]}
    only_missing = ConversionReport(source_layout='timm', missing=['x'])
    assert 'unexpected' not in only_missing.format()


# --------------------------------------------------------------------------- loading


def test_state_dict_wrapper_comes_before_model():
    """Wrappers are unwrapped in the documented order: ``state_dict`` (mmengine) before
    ``model`` (DeiT / MAE / DINOv2 training files)."""
    a, b = _randn(C, seed=24), _randn(C, seed=25)
    out, report = convert_state_dict({'state_dict': {'norm.weight': a},
                                      'model': {'norm.weight': b}}, layout='timm')
    assert torch.equal(out['norm.weight'], a)
    assert "unwrapped checkpoint['state_dict']" in report.notes


def test_a_wrapper_is_unwrapped_even_beside_top_level_tensors():
    """A file with its weights under ``state_dict`` and a stray tensor beside it (a step
    counter) is read from the wrapper, not as the one-tensor top level."""
    w = _randn(C, seed=26)
    out, _ = convert_state_dict({'state_dict': {'norm.weight': w}, 'step': torch.tensor(3)},
                                layout='timm')
    assert set(out) == {'norm.weight'} and torch.equal(out['norm.weight'], w)


def test_prefix_notes_reach_the_report():
    """The ``module.`` strip is a fact of the conversion the report keeps."""
    w = _randn(C, seed=27)
    _, report = convert_state_dict({'module.norm.weight': w}, layout='timm')
    assert "stripped the 'module.' prefix of every key" in report.notes


def test_mismatch_message_recognises_a_swiglu_checkpoint():
    """A packed-SwiGLU file (``fc1`` rows = 2 x hidden) into a plain-MLP model: the message
    says which build options the file needs (``mlp_type='swiglu'`` and its hidden width)."""
    from mmlinvit.converters import CheckpointMismatchError
    arch = dict(embed_dims=32, num_layers=1, num_heads=2, mlp_hidden_dims=48)
    source = VisionTransformer(arch=arch, family='dinov2', mlp_type='swiglu', img_size=32,
                               patch_size=8).state_dict()
    assert source['blocks.0.mlp.fc1.weight'].shape == (96, 32)
    model = VisionTransformer(arch=arch, family='dinov2', img_size=32, patch_size=8)
    with pytest.raises(CheckpointMismatchError) as info:
        load_pretrained(model, source)
    assert "mlp_type='swiglu', mlp_hidden_dims=48" in str(info.value)


# --------------------------------------------------------------------------- official code


def test_timm_clip_layout_norm_pre_is_the_pre_norm():
    """timm's CLIP towers (``vit_*_clip_224``) keep ``norm_pre``: it is mmlinvit's
    ``pre_norm``, not the final ``norm``; the converted model reproduces timm's tokens."""
    timm = pytest.importorskip('timm')
    ref = timm.create_model('vit_base_patch16_clip_224', pretrained=False, img_size=32,
                            patch_size=8, depth=1, embed_dim=32, num_heads=2,
                            num_classes=0).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            base = 1.0 if (p.ndim == 1 and name.endswith('weight')) else 0.0
            p.copy_(base + 0.3 * torch.randn(p.shape, generator=gen))
    sd = ref.state_dict()
    assert 'norm_pre.weight' in sd and 'norm.weight' in sd
    converted, _ = convert_timm(sd)
    assert torch.equal(converted['pre_norm.weight'], sd['norm_pre.weight'])
    assert torch.equal(converted['norm.weight'], sd['norm.weight'])
    ours = VisionTransformer(arch=dict(embed_dims=32, num_layers=1, num_heads=2,
                                       mlp_hidden_dims=128),
                             family='clip', act='gelu', img_size=32, patch_size=8,
                             out_type='raw').eval()
    load_pretrained(ours, sd)
    x = _randn(1, 3, 32, 32, seed=5)
    with torch.no_grad():
        err = (ours.forward_tokens(x)[0] - ref.forward_features(x)).abs().max().item()
    assert err < 1e-5


def test_mmpretrain_distilled_deit_reproduces_its_patch_tokens():
    """mmpretrain's ``DistilledVisionTransformer`` ([cls, dist, patches], a position for each)
    loads with its ``dist_token`` as one register token whose position is folded in: the
    patch tokens equal mmpretrain's own output."""
    backbones = pytest.importorskip('mmpretrain.models.backbones')
    ref = backbones.DistilledVisionTransformer(
        arch=dict(embed_dims=32, num_layers=2, num_heads=2, feedforward_channels=64),
        img_size=32, patch_size=8, out_type='featmap')
    ref.eval()  # mmpretrain's train() override returns None: no chaining
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            base = 1.0 if (p.ndim == 1 and name.endswith('weight')) else 0.0
            p.copy_(base + 0.3 * torch.randn(p.shape, generator=gen))
    state = {'state_dict': {f'backbone.{k}': v for k, v in ref.state_dict().items()}}
    sd = ref.state_dict()
    converted, report = convert_state_dict(state)
    assert report.source_layout == 'mmpretrain'
    assert torch.equal(converted['reg_token'], sd['dist_token'] + sd['pos_embed'][:, 1:2])
    ours = VisionTransformer(arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                                       mlp_hidden_dims=64),
                             family='deit', img_size=32, patch_size=8, num_reg_tokens=1,
                             out_type='featmap').eval()
    load_pretrained(ours, state)
    x = _randn(2, 3, 32, 32, seed=10)
    with torch.no_grad():
        err = (ours(x)[-1] - ref(x)[-1]).abs().max().item()
    assert err < 1e-5


def test_same_count_other_grid_is_reported_as_resampled():
    """A recorded 4x8 grid into an 8x4 model (same row count): the report says it was
    resampled, from which grid to which."""
    arch = dict(embed_dims=16, num_layers=1, num_heads=2, mlp_hidden_dims=32)
    source = VisionTransformer(arch=arch, img_size=(16, 32), patch_size=4)
    model = VisionTransformer(arch=arch, img_size=(32, 16), patch_size=4)
    report = load_pretrained(model, source.state_dict())
    assert any('from a 4x8 grid to the model grid 8x4' in n for n in report.notes)
    assert model.pos_embed_grid.tolist() == [8, 4]


def test_recorded_non_square_grid_loads_into_another_grid():
    """A recorded 4x8 grid (32 rows, no square) into a 6x6 model through ``pretrained=``:
    the fit check reads the file's record, so the rows are resampled from the true grid
    (bicubic, as the model's ``pos_interp``) instead of being refused as a shape mismatch."""
    arch = dict(embed_dims=16, num_layers=1, num_heads=2, mlp_hidden_dims=32)
    source = VisionTransformer(arch=arch, img_size=(16, 32), patch_size=4, pos_interp='bicubic')
    model = VisionTransformer(arch=arch, img_size=24, patch_size=4, pos_interp='bicubic')
    load_pretrained(model, source.state_dict())
    grid = source.pos_embed[:, 1:].detach().reshape(1, 4, 8, 16).permute(0, 3, 1, 2)
    want = torch.nn.functional.interpolate(grid, size=(6, 6), mode='bicubic',
                                           align_corners=False)
    torch.testing.assert_close(model.pos_embed[:, 1:].detach(),
                               want.permute(0, 2, 3, 1).reshape(1, 36, 16))
    assert torch.equal(model.pos_embed[:, :1], source.pos_embed[:, :1])
