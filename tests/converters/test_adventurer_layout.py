"""The ``'adventurer'`` checkpoint layout: detection, the public code's key names, prefixes.

The reference layout is written here from the public code (wangf3014/Adventurer
``models_mamba.py`` and ``mamba_custom.py``, read for this test): every key and shape a
released checkpoint (``torch.save({'model': model.state_dict(), ...})``) holds, built from the
formulas of those files, not from :class:`Adventurer`.
"""
import pytest
import torch

from mmlinvit.backbones import Adventurer, VisionTransformer
from mmlinvit.backbones.adventurer import FlipScheduleMismatchError
from mmlinvit.converters import (BACKBONE_PREFIXES, STUDENT_PREFIXES, CheckpointMismatchError,
                                 convert_state_dict, detect_layout)

DIM, DEPTH, PATCH, GRID = 32, 2, 16, 4
D_STATE, HEADDIM, EXPAND, D_CONV, NGROUPS = 8, 16, 2, 4, 1


def official_checkpoint(num_classes: int = 10) -> dict:
    """Random weights under the key names and shapes of the public Adventurer code."""
    d_inner = EXPAND * DIM
    nheads = d_inner // HEADDIM
    conv_dim = d_inner + 2 * NGROUPS * D_STATE
    hidden = int(DIM * 2.5)
    shapes = {
        'cls_token': (1, 1, DIM),
        'pos_embed': (1, GRID * GRID + 1, DIM),  # class position last
        'patch_embed.proj.weight': (DIM, 3, PATCH, PATCH),
        'patch_embed.proj.bias': (DIM, ),
        'head.weight': (num_classes, DIM),
        'head.bias': (num_classes, ),
        'norm_f.weight': (DIM, ),
    }
    for i in range(DEPTH):
        p = f'layers.{i}.'
        shapes.update({
            p + 'mixer.in_proj.weight': (2 * d_inner + 2 * NGROUPS * D_STATE + nheads, DIM),
            p + 'mixer.conv1d.weight': (conv_dim, 1, D_CONV),
            p + 'mixer.conv1d.bias': (conv_dim, ),
            p + 'mixer.dt_bias': (nheads, ),
            p + 'mixer.A_log': (nheads, ),
            p + 'mixer.D': (nheads, ),
            p + 'mixer.norm.weight': (d_inner, ),
            p + 'mixer.out_proj.weight': (DIM, d_inner),
            p + 'norm.weight': (DIM, ),
            p + 'mlp.w1.weight': (hidden, DIM),
            p + 'mlp.w1.bias': (hidden, ),
            p + 'mlp.w2.weight': (hidden, DIM),
            p + 'mlp.w2.bias': (hidden, ),
            p + 'mlp.w3.weight': (DIM, hidden),
            p + 'mlp.w3.bias': (DIM, ),
            p + 'norm_mlp.weight': (DIM, ),
        })
    gen = torch.Generator().manual_seed(0)
    return {k: 0.1 * torch.randn(s, generator=gen) for k, s in shapes.items()}


def tiny(flip_schedule='official', **kwargs) -> Adventurer:
    return Adventurer(arch=dict(embed_dims=DIM, num_layers=DEPTH), img_size=GRID * PATCH,
                      patch_size=PATCH, flip_schedule=flip_schedule,
                      mixer_cfg=dict(d_state=D_STATE, headdim=HEADDIM, chunk_size=16),
                      **kwargs)


def test_released_checkpoint_is_detected_and_loads(tmp_path):
    official = official_checkpoint()
    assert detect_layout(official) == 'adventurer'
    converted, report = convert_state_dict({'model': official, 'epoch': 3})
    assert report.source_layout == 'adventurer' and report.prefix == ''
    assert set(report.dropped) == {'head.weight', 'head.bias'}
    # plus the record of the public code's flips (blocks n // 2 == 1: none of 2)
    assert set(converted) == set(official) - {'head.weight', 'head.bias'} | {'flipped_blocks'}
    assert converted['flipped_blocks'].tolist() == [False, False]

    path = str(tmp_path / 'adventurer_tiny.pth')
    torch.save({'model': official, 'epoch': 3}, path)
    model = tiny(with_mask_token=False, pretrained=path)
    model.init_weights()
    # the model adds its grid record, which the public code's files lack
    assert set(model.state_dict()) == set(converted) | {'pos_embed_grid'}
    assert set(model.load_report.initialised) == {'pos_embed_grid'}
    for key, value in converted.items():
        assert torch.equal(model.state_dict()[key], value), key
    assert model.load_report.loaded == len(converted)


def test_one_prefix_table_for_task_models_and_students(tmp_path):
    official = official_checkpoint()
    weights = {k: v for k, v in official.items() if not k.startswith('head.')}
    # an mmpretrain / mmseg task model: backbone.* plus its head
    task = {'backbone.' + k: v for k, v in weights.items()}
    task['head.fc.weight'] = torch.zeros(10, DIM)
    path = str(tmp_path / 'task.pth')
    torch.save({'state_dict': task, 'meta': {'epoch': 1}}, path)
    model = tiny(with_mask_token=False, pretrained=path)
    model.init_weights()
    assert model.load_report.prefix == 'backbone.'
    assert model.load_report.dropped == {'head.fc.weight': "outside 'backbone.'"}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    # the student prefixes export_student.py uses are those of the same table
    assert STUDENT_PREFIXES == ('student.backbone.', 'student.')
    assert set(STUDENT_PREFIXES) < set(BACKBONE_PREFIXES)


def test_adventurer_checkpoint_into_a_vit_names_the_keys():
    vit = VisionTransformer(arch=dict(embed_dims=DIM, num_layers=DEPTH, num_heads=2,
                                      mlp_hidden_dims=4 * DIM), img_size=64, patch_size=16)
    from mmlinvit.converters import load_pretrained
    with pytest.raises(CheckpointMismatchError, match=r'(?s)missing keys.*unexpected keys '
                       r'\(\d+\): .*layers\.\{0-1\}\.mixer'):
        load_pretrained(vit, official_checkpoint())


def test_public_code_weights_refuse_other_flips(tmp_path):
    """The public code trains with flip_schedule='official' (n // 2 == 1: none of 2 blocks);
    its weights in a model that flips block 1 ('paper', the default) would be silently wrong.
    Refused on every loading path: pretrained=, load_pretrained (teacher_ckpt) and the output
    of convert_checkpoint.py (the converter records the flips; only pretrained= was checked)."""
    from mmlinvit.converters import load_pretrained
    path = str(tmp_path / 'adventurer_tiny.pth')
    torch.save({'model': official_checkpoint(), 'epoch': 3}, path)
    refusal = (r"(?s)blocks \[\] \(flip_schedule='official'.*public Adventurer code.*"
               r"\[1\] \(flip_schedule='paper'\).*check_flip_schedule=False")
    paper = tiny(with_mask_token=False, pretrained=path, flip_schedule='paper')
    with pytest.raises(FlipScheduleMismatchError, match=refusal):
        paper.init_weights()
    with pytest.raises(FlipScheduleMismatchError, match=refusal):
        load_pretrained(tiny(with_mask_token=False, flip_schedule='paper'), path)
    converted, report = convert_state_dict(torch.load(path))
    assert converted['flipped_blocks'].tolist() == [False, False]
    assert any('public Adventurer code file' in note for note in report.notes)
    converted_path = str(tmp_path / 'converted.pth')
    torch.save(converted, converted_path)
    with pytest.raises(FlipScheduleMismatchError, match=refusal):
        tiny(with_mask_token=False, pretrained=converted_path, flip_schedule='paper').init_weights()
    official = tiny(with_mask_token=False, pretrained=converted_path)
    official.init_weights()
    assert official.load_report.loaded > 0
    on_purpose = tiny(with_mask_token=False, pretrained=path, flip_schedule='paper',
                      check_flip_schedule=False)
    with pytest.warns(UserWarning, match=r'check_flip_schedule=False'):
        on_purpose.init_weights()
    assert on_purpose.load_report.loaded > 0
    assert on_purpose.flipped_blocks.tolist() == [False, True]  # its own flips are recorded
    # the same weights inside an mmlinvit task model (backbone.* + head.fc.*) are not the
    # public code's: no record, no check
    task = {'backbone.' + k: v for k, v in official_checkpoint().items()
            if not k.startswith('head.')}
    task['head.fc.weight'] = torch.zeros(10, DIM)
    task_path = str(tmp_path / 'task.pth')
    torch.save({'state_dict': task}, task_path)
    tiny(with_mask_token=False, pretrained=task_path, flip_schedule='paper').init_weights()
