"""Released files that no layout reads, or that need one build option, are refused with the
cause and the fix; mmpretrain's DeiT-III (no class position) loads."""
import re

import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.converters import (CheckpointMismatchError, convert_state_dict, detect_layout,
                                 load_pretrained)
from mmlinvit.converters.checkpoint_file import CheckpointFileError

ARCH = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)

#: First keys of HuggingFace transformers vision models (transformers 4 and 5 names).
HF_KEYS = {
    'dinov2': ['embeddings.cls_token', 'embeddings.mask_token', 'embeddings.position_embeddings',
               'embeddings.patch_embeddings.projection.weight',
               'encoder.layer.0.norm1.weight', 'encoder.layer.0.attention.q_proj.weight'],
    'dinov2_v4': ['embeddings.cls_token', 'embeddings.patch_embeddings.projection.weight',
                  'encoder.layer.0.attention.attention.query.weight'],
    'clip': ['vision_model.embeddings.class_embedding',
             'vision_model.embeddings.patch_embedding.weight',
             'vision_model.pre_layrnorm.weight',
             'vision_model.encoder.layers.0.self_attn.k_proj.weight'],
    'vit': ['embeddings.cls_token', 'embeddings.position_embeddings',
            'embeddings.patch_embeddings.projection.weight', 'layers.0.attention.q_proj.weight'],
}


def vit(**kwargs) -> VisionTransformer:
    return VisionTransformer(arch=ARCH, img_size=32, patch_size=8, **kwargs)


@pytest.mark.parametrize('name', sorted(HF_KEYS))
def test_huggingface_transformers_files_are_named(name):
    state = {key: torch.zeros(2) for key in HF_KEYS[name]}
    with pytest.raises(ValueError, match='HuggingFace transformers layout') as info:
        detect_layout(state)
    assert 'timm' in str(info.value)  # where the same weights come from instead


def test_a_file_that_loads_nothing_is_refused_even_non_strict():
    """strict=False skips missing / unexpected keys; a file with none of the model's keys
    (another model, a layout read wrongly) must not load 'successfully' with 0 tensors."""
    model = vit()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    foreign = {'model.encoder.weight': torch.zeros(4, 4)}
    with pytest.raises(CheckpointMismatchError, match='no tensor of the checkpoint') as info:
        load_pretrained(model, foreign, layout='timm', strict=False)
    assert 'strict=False to skip' not in str(info.value)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_final_norm_and_register_hints():
    source = vit(family='mae').state_dict()
    fine_tuned = {k: v for k, v in source.items() if not k.startswith('norm.')}
    fine_tuned.update({'fc_norm.weight': torch.ones(32), 'fc_norm.bias': torch.zeros(32)})
    with pytest.raises(CheckpointMismatchError, match='final_norm=False'):
        load_pretrained(vit(family='mae'), fine_tuned)
    report = load_pretrained(vit(family='mae', final_norm=False), fine_tuned)
    assert 'fc_norm.weight' in report.dropped

    with_registers = vit(family='dinov2', num_reg_tokens=4).state_dict()
    with pytest.raises(CheckpointMismatchError, match='num_reg_tokens=4'):
        load_pretrained(vit(family='dinov2'), with_registers)


def test_mmpretrain_deit3_without_class_position_loads():
    """mmpretrain's DeiT3 keeps no class position (timm's no_embed_class): a zero class row
    is prepended, as for timm / official DeiT-III files."""
    from mmpretrain.models.backbones import DeiT3

    ref = DeiT3(arch=dict(embed_dims=32, num_layers=2, num_heads=2, feedforward_channels=64),
                img_size=32, patch_size=8, out_type='raw')
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    state = {f'backbone.{k}': v for k, v in ref.state_dict().items()}
    assert state['backbone.pos_embed'].shape == (1, 16, 32)
    converted, report = convert_state_dict({'state_dict': state})
    assert report.source_layout == 'mmpretrain'
    model = vit(family='deit3')
    load_pretrained(model, {'state_dict': state})
    assert torch.equal(model.pos_embed[:, 0], torch.zeros(1, 32))
    assert torch.equal(model.pos_embed[:, 1:], ref.pos_embed)
    assert torch.equal(model.blocks[1].ls2.gamma, ref.layers[1].ffn.gamma2.weight)


def test_mmpretrain_avg_featmap_output_norm(caplog):
    """mmpretrain's avg_featmap feature is ln2(mean(patch tokens)) (MAE / EVA fine-tuned
    classifiers): ln2 was dropped at INFO and the feature silently differed (0.81 max, logits
    up to 5 off).  avg_featmap_norm=True loads and applies it; without it, a warning."""
    import logging

    from mmpretrain.models.backbones import VisionTransformer as MMPretrainViT
    ref = MMPretrainViT(arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                                  feedforward_channels=64),
                        img_size=32, patch_size=8, out_type='avg_featmap', final_norm=False)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1 + (1.0 if p.ndim == 1 else 0.0))
    ref.eval()
    state = {'state_dict': {f'backbone.{k}': v for k, v in ref.state_dict().items()}}
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        want = ref(x)[-1]
    model = vit(out_type='avg_featmap', final_norm=False, avg_featmap_norm=True).eval()
    load_pretrained(model, state)
    with torch.no_grad():
        torch.testing.assert_close(model(x)[-1], want, atol=1e-5, rtol=1e-5)
    plain = vit(out_type='avg_featmap', final_norm=False).eval()
    with caplog.at_level(logging.WARNING, logger='mmlinvit.converters.loading'):
        load_pretrained(plain, state)
    assert any('avg_featmap_norm=True' in r.getMessage() for r in caplog.records)
    with torch.no_grad():
        assert (plain(x)[-1] - want).abs().max() > 0.1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger='mmlinvit.converters.loading'):
        load_pretrained(vit(out_type='featmap', final_norm=False), state)  # not its output
    assert not any('avg_featmap_norm' in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="avg_featmap_norm=True normalises the 'avg_featmap'"):
        vit(out_type='featmap', avg_featmap_norm=True)


def test_operator_options_missing_from_a_linearized_checkpoint_are_refused(tmp_path):
    """An InLine checkpoint (no operator parameters) into InLine with its local branch: the
    block_operators record says the blocks were linearized, so the local branch's parameters
    are not 'operators starting from softmax weights' and must not stay random."""
    source = vit(attn_cfg='inline')
    path = str(tmp_path / 'inline.pth')
    torch.save(source.state_dict(), path)
    model = vit(attn_cfg=dict(type='inline', local_residual=True))
    with pytest.raises(CheckpointMismatchError, match=r"were trained with \['inline'\]"):
        load_pretrained(model, path)
    # softmax weights still start any operator, local branch included
    torch.save(vit().state_dict(), path)
    report = load_pretrained(model, path)
    assert report.initialised


def test_official_files_load_without_record_warnings(tmp_path, caplog):
    """Files without training records (official releases) are the normal case: the records
    are in the INFO report, not in the WARNING about weights that keep their init."""
    path = str(tmp_path / 'official.pth')
    torch.save({k: v for k, v in vit().state_dict().items()
                if k not in VisionTransformer.TRAINING_RECORDS}, path)
    with caplog.at_level('INFO', logger='mmlinvit.converters.loading'):
        report = load_pretrained(vit(), path)
    assert set(report.missing) == set(VisionTransformer.TRAINING_RECORDS)
    assert not [r for r in caplog.records if r.levelname == 'WARNING']


def test_an_mmrazor_distillation_file_is_refused(tmp_path):
    """mmrazor keeps the student under ``architecture.`` and the teacher under ``teacher.``:
    the teacher's prefix came first in the table, so a student's ``pretrained=`` silently
    took the teacher's weights from such a file."""
    teacher, student = vit(), vit(attn_cfg='elu')
    state = {f'teacher.backbone.{k}': v for k, v in teacher.state_dict().items()}
    state.update({f'architecture.backbone.{k}': v for k, v in student.state_dict().items()})
    with pytest.raises(CheckpointFileError, match='mmrazor.*convert_kd_ckpt_to_student'):
        convert_state_dict(state)
    path = str(tmp_path / 'kd.pth')
    torch.save({'state_dict': state}, path)
    with pytest.raises(CheckpointFileError, match=re.escape("keys under 'architecture.'")):
        load_pretrained(vit(attn_cfg='elu'), path)


def test_a_dinov2_training_file_loads_the_teacher():
    """DINOv2's training checkpoints hold ``student.`` and ``teacher.`` networks; the teacher
    is the one DINOv2 evaluates and releases."""
    teacher, student = vit(), vit()
    state = {f'teacher.backbone.{k}': v for k, v in teacher.state_dict().items()}
    state.update({f'student.backbone.{k}': v for k, v in student.state_dict().items()})
    state['student.dino_head.mlp.0.weight'] = torch.zeros(4, 32)
    converted, report = convert_state_dict(state)
    assert report.prefix == 'teacher.backbone.'
    assert torch.equal(converted['blocks.1.attn.qkv.weight'],
                       teacher.state_dict()['blocks.1.attn.qkv.weight'])


def test_a_file_with_a_teacher_only_loads_the_teacher():
    teacher = vit()
    state = {f'teacher.backbone.{k}': v for k, v in teacher.state_dict().items()}
    state['teacher.head.fc.weight'] = torch.zeros(3, 32)
    converted, report = convert_state_dict(state)
    assert report.prefix == 'teacher.backbone.'
    assert torch.equal(converted['blocks.1.attn.qkv.weight'],
                       teacher.state_dict()['blocks.1.attn.qkv.weight'])
