"""Training records: what a checkpoint's weights were trained with travels with them.

ELU+1, ReLU and softmax attention own the same ``qkv`` / ``proj``, so without the record an
ELU student's weights load without complaint into a softmax model (or a ReLU one) that then
computes features the weights were not trained for; likewise an Adventurer's weights into a
model that reverses the patch scan in other blocks.  (Public-code Adventurer checkpoints, which
have no record, are tested in ``tests/converters/test_adventurer_layout.py``.)
"""
import pytest
import torch

from mmlinvit.backbones import Adventurer, LinearVisionTransformer, VisionTransformer
from mmlinvit.backbones.adventurer import FlipScheduleMismatchError
from mmlinvit.backbones.training_record import (NAME_BYTES, TrainingRecordMismatchError,
                                                decode_names, describe_blocks, encode_names)
from mmlinvit.backbones.vit import AttentionOperatorMismatchError
from mmlinvit.converters import load_pretrained

ARCH = dict(embed_dims=32, num_layers=3, num_heads=2, mlp_hidden_dims=64)


def vit(attn_cfg='softmax', **kwargs) -> VisionTransformer:
    return VisionTransformer(arch=ARCH, img_size=32, patch_size=16, attn_cfg=attn_cfg, **kwargs)


def adventurer(flip_schedule, **kwargs) -> Adventurer:
    """Two blocks: 'paper' flips block 1, 'official' and 'none' none."""
    return Adventurer(arch=dict(embed_dims=32, num_layers=2), img_size=64, patch_size=16,
                      flip_schedule=flip_schedule,
                      mixer_cfg=dict(d_state=8, headdim=16, chunk_size=16), **kwargs)


def load(model, path, via):
    if via == 'load_pretrained':
        load_pretrained(model, path)
    elif via == 'load_state_dict':
        model.load_state_dict(torch.load(path, weights_only=True))
    else:
        from mmengine.runner import load_checkpoint
        load_checkpoint(model, path, map_location='cpu')


def test_names_round_trip_and_block_ranges():
    names = ['softmax', 'elu', 'hedgehog', 'x' * NAME_BYTES]
    assert decode_names(encode_names(names)) == names
    with pytest.raises(ValueError, match='longer than'):
        encode_names(['x' * (NAME_BYTES + 1)])
    assert describe_blocks([5, 0, 1, 2]) == '0-2, 5'
    assert describe_blocks([3]) == '3'


def test_every_model_records_its_operators():
    assert decode_names(vit().block_operators) == ['softmax'] * 3
    assert decode_names(LinearVisionTransformer(arch=ARCH, img_size=32,
                                                patch_size=16).block_operators) == ['elu'] * 3
    hybrid = vit(['softmax', dict(type='mmlinvit.relu'), 'elu'])
    assert decode_names(hybrid.block_operators) == ['softmax', 'relu', 'elu']
    assert 'block_operators' in hybrid.state_dict()


@pytest.mark.parametrize('via', ['load_pretrained', 'load_state_dict', 'mmengine'])
def test_student_weights_refuse_another_operator(tmp_path, via):
    student = vit('elu')
    path = str(tmp_path / 'student_backbone.pth')
    torch.save(student.state_dict(), path)
    for wrong in (vit('softmax'), vit('relu')):
        before = {k: v.clone() for k, v in wrong.state_dict().items()}
        with pytest.raises(AttentionOperatorMismatchError,
                           match=r"(?s)blocks 0-2: 'elu' in the checkpoint, '(softmax|relu)' in "
                                 r"the model.*attn_cfg='elu'"):
            load(wrong, path, via)
        # refused before any tensor was copied
        assert all(torch.equal(v, before[k]) for k, v in wrong.state_dict().items())
    right = vit('elu')
    load(right, path, via)
    assert all(torch.equal(v, student.state_dict()[k]) for k, v in right.state_dict().items())


def test_softmax_weights_initialise_any_operator_and_the_record_stays_the_models(tmp_path):
    """Linearization starts from softmax weights: allowed, and the student keeps saying what
    it is (a loaded 'softmax' record must not overwrite it)."""
    teacher = vit('softmax')
    student = vit(['elu', 'relu', 'softmax'])
    student.load_state_dict(teacher.state_dict(), strict=True)
    assert decode_names(student.block_operators) == ['elu', 'relu', 'softmax']
    assert decode_names(student.state_dict()['block_operators']) == ['elu', 'relu', 'softmax']
    # ... so a softmax model refuses the student's checkpoint afterwards
    with pytest.raises(AttentionOperatorMismatchError,
                       match=r"(?s)block 0: 'elu' in the checkpoint, 'softmax'.*"
                             r"block 1: 'relu' in the checkpoint, 'softmax'.*"
                             r"attn_cfg=\['elu', 'relu', 'softmax'\]"):
        vit('softmax').load_state_dict(student.state_dict())


def test_checkpoints_without_the_record_load_and_get_the_models_record():
    """Official checkpoints (and mmlinvit's from before the record) have none."""
    student = vit('elu')
    old = {k: v for k, v in student.state_dict().items() if k != 'block_operators'}
    model = vit('relu')
    model.load_state_dict(old, strict=True)
    assert decode_names(model.block_operators) == ['relu'] * 3
    report = load_pretrained(vit('relu'), old)
    assert 'block_operators' in report.initialised


PAPER_SETTING = dict(with_cls_token=False, pos_embed_type='sincos', out_type='avg_featmap')


@pytest.mark.parametrize('via', ['load_pretrained', 'load_state_dict', 'mmengine'])
@pytest.mark.parametrize('other', [dict(type='mhla', block_grid=(1, 4)),
                                   dict(type='mhla', feature_map='elu'),
                                   dict(type='mhla', eps=1e-2),
                                   dict(type='ttt', inner_lr=0.5),
                                   dict(type='relu', eps=1e-2),
                                   dict(type='hedgehog', eps=1e-2),
                                   dict(type='identity', eps=1e-2)])
def test_operator_settings_travel_with_the_weights(tmp_path, via, other):
    """Same parameters, another computation: an MHLA checkpoint with 2 x 2 blocks loaded into
    1 x 4 blocks (or feature_map='elu') gave features 2.5 (1.9) off at a scale of 0.81, no
    word (the record named the operator only); MHLA's eps was not recorded either (eps=1e-2
    weights run with the default 1e-6: features 0.045 off at a scale of 1.17), nor the kernel
    operators' (one ReLU / Hedgehog operator, C = 64, 197 tokens: outputs 0.019 / 0.030 off at
    a mean magnitude of 0.07; identity attention's eps bounds its normaliser: 459 off)."""
    trained = dict(type=other['type'])
    student = vit(trained, **PAPER_SETTING)
    path = str(tmp_path / 'student.pth')
    torch.save(student.state_dict(), path)
    setting = next(k for k in other if k != 'type')
    with pytest.raises(AttentionOperatorMismatchError,
                       match=rf"(?s)other settings.*blocks 0-2 \({other['type']}\): .*"
                             rf"{setting}=.* in the checkpoint"):
        load(vit(other, **PAPER_SETTING), path, via)
    load(vit(dict(trained), **PAPER_SETTING), path, via)
    # softmax weights (no settings recorded) still start any operator's settings
    teacher = vit('softmax', **PAPER_SETTING)
    vit(other, **PAPER_SETTING).load_state_dict(teacher.state_dict(), strict=False)
    # a checkpoint from before the record loads
    old = {k: v for k, v in student.state_dict().items() if k != 'operator_settings'}
    vit(other, **PAPER_SETTING).load_state_dict(old)


def test_only_the_settings_both_records_name_are_compared():
    """A setting recorded by a later version (or an earlier one's missing) is not a clash."""
    student = vit(dict(type='mhla'), **PAPER_SETTING)
    state = student.state_dict()
    later = [name + ' later_setting=1' for name in decode_names(state['operator_settings'])]
    state['operator_settings'] = encode_names(later, width=state['operator_settings'].shape[1])
    vit(dict(type='mhla'), **PAPER_SETTING).load_state_dict(state)
    state['operator_settings'] = encode_names(
        [name.replace('block_grid=(2,2)', 'block_grid=(1,4)') for name in later],
        width=state['operator_settings'].shape[1])
    with pytest.raises(AttentionOperatorMismatchError, match='block_grid'):
        vit(dict(type='mhla'), **PAPER_SETTING).load_state_dict(state)


def test_mismatch_errors_are_value_errors():
    assert issubclass(AttentionOperatorMismatchError, TrainingRecordMismatchError)
    assert issubclass(TrainingRecordMismatchError, ValueError)


@pytest.mark.parametrize('via', ['load_pretrained', 'load_state_dict', 'mmengine'])
def test_recorded_flips_must_match(tmp_path, via):
    """mmlinvit checkpoints carry flipped_blocks; a model with other flips refuses them on
    every loading path (before any tensor is copied), and accepts its own."""
    trained = adventurer(with_mask_token=False, flip_schedule='paper')
    assert trained.flipped_blocks.tolist() == [False, True]
    path = str(tmp_path / 'student_backbone.pth')
    torch.save(trained.state_dict(), path)
    other = adventurer(with_mask_token=False, flip_schedule='none')
    before = {k: v.clone() for k, v in other.state_dict().items()}

    with pytest.raises(FlipScheduleMismatchError,
                       match=r"(?s)blocks \[1\] \(flip_schedule='paper'\).*reverses blocks "
                             r"\[\] \(flip_schedule='none'\).*flip_schedule=\[1\]"):
        load(other, path, via)
    assert all(torch.equal(v, before[k]) for k, v in other.state_dict().items())
    same = adventurer(with_mask_token=False, flip_schedule=[1])
    load(same, path, via)
    assert all(torch.equal(v, trained.state_dict()[k]) for k, v in same.state_dict().items())


def test_checkpoints_without_the_record_still_load_strictly():
    """Files from before the record: the model's own flips are used, strict loads pass."""
    trained = adventurer(with_mask_token=False, flip_schedule='paper')
    old = {k: v for k, v in trained.state_dict().items() if k != 'flipped_blocks'}
    model = adventurer(with_mask_token=False, flip_schedule='none')
    model.load_state_dict(old, strict=True)
    assert model.flipped_blocks.tolist() == [False, False]
