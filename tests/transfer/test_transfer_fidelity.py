"""A copied tensor computes what it computed in the teacher, or the transfer is refused.

A teacher whose LayerScale (``ls1`` / ``ls2.gamma``), CLIP ``pre_norm`` or other tensor around
the copied ones has no place in the student was accepted silently (listed only in the
report's ``no_counterpart``): MLPCopy from a DeiT-III teacher into a DeiT student ran the
copied MLP branch at 1/gamma of the teacher's, FullCopy from a CLIP teacher into a DeiT
student gave a "softmax copy" 1.5 off the teacher.  The reverse (a student LayerScale the
teacher lacks) kept gamma at its 1e-6 init.  Expected values are written out here: the
teacher's own modules, or the teacher itself for FullCopy into a softmax student.
"""
import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.transfer import transfer_weights

ARCH = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
COMMON = dict(img_size=32, patch_size=8, act='gelu')  # one MLP activation for all families


def randomized(model, gamma=0.1):
    """Random weights (so 'copied' is visible), LayerScale gammas set to ``gamma``."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
            if name.endswith('gamma'):
                p.fill_(gamma)
    return model.eval()


def teacher_of(family):
    return randomized(VisionTransformer(ARCH, family=family, **COMMON))


def test_mlp_copy_refuses_a_teacher_layer_scale_the_student_has_no_place_for():
    teacher = teacher_of('deit3')
    student = VisionTransformer(ARCH, family='deit', attn_cfg='elu', **COMMON)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    with pytest.raises(ValueError) as info:
        transfer_weights(student, teacher, 'mlp_copy')
    message = str(info.value)
    assert 'blocks.0.ls2.gamma' in message and 'blocks.1.ls2.gamma' in message
    assert 'layer_scale_init' in message and 'deit3' in message  # the student option
    assert 'include_layer_scale=False' in message                # the deliberate opt-out
    for key, value in student.state_dict().items():              # nothing was written
        assert torch.equal(value, before[key]), key


def test_include_layer_scale_false_leaves_the_gamma_out_on_purpose():
    teacher = teacher_of('deit3')
    student = VisionTransformer(ARCH, family='deit', attn_cfg='elu', **COMMON)
    report = transfer_weights(student, teacher, 'mlp_copy', include_layer_scale=False)
    assert {f'blocks.{i}.ls2.gamma' for i in range(2)} <= report.no_counterpart
    x = torch.randn(2, 5, ARCH['embed_dims'])
    with torch.no_grad():
        t_block, s_block = teacher.blocks[0], student.blocks[0]
        torch.testing.assert_close(s_block.mlp(s_block.norm2(x)), t_block.mlp(t_block.norm2(x)))


def test_a_student_layer_scale_the_teacher_lacks_is_refused():
    """DeiT teacher, DeiT-III student: the copied MLP would run under gamma = 1e-6."""
    teacher = teacher_of('deit')
    student = VisionTransformer(ARCH, family='deit3', attn_cfg='elu', **COMMON)
    with pytest.raises(ValueError, match=r'blocks\.0\.ls2\.gamma.*layer_scale_init=None'):
        transfer_weights(student, teacher, 'mlp_copy')


@pytest.mark.parametrize('base', ['mlp_copy'])
def test_structured_init_with_an_mlp_copy_base_is_refused_too(base):
    teacher = teacher_of('deit3')
    student = VisionTransformer(ARCH, family='deit', attn_cfg='elu', **COMMON)
    with pytest.raises(ValueError, match=r"blocks\.0\.ls2\.gamma.*base=dict\(type='mlp_copy'"):
        transfer_weights(student, teacher, 'mimetic', base=base)


@pytest.mark.parametrize('teacher_family,student_family', [
    ('deit3', 'deit'), ('dinov2', 'deit'), ('clip', 'deit'), ('deit', 'deit3'),
    ('deit', 'clip'), ('clip', 'mae'), ('deit', 'deit'), ('deit3', 'deit3'),
    ('dinov2', 'deit3'), ('clip', 'clip')])
def test_full_copy_into_a_softmax_student_is_the_teacher_or_refused(teacher_family,
                                                                    student_family):
    teacher = teacher_of(teacher_family)
    student = VisionTransformer(ARCH, family=student_family, **COMMON).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    try:
        transfer_weights(student, teacher, 'full_copy')
    except ValueError as err:
        assert 'no place in the student' in str(err) or 'does not have' in str(err), err
        return
    with torch.no_grad():
        diff = (student(x)[-1] - teacher(x)[-1]).abs().max().item()
    assert diff == 0.0, f'{teacher_family} -> {student_family}: max |diff| {diff}'


def test_clip_pre_norm_without_place_names_the_option():
    teacher = teacher_of('clip')
    student = VisionTransformer(ARCH, family='deit', **COMMON)
    with pytest.raises(ValueError, match=r'pre_norm\.weight.*pre_norm=True'):
        transfer_weights(student, teacher, 'full_copy')
    # MLPCopy does not copy around the stem: the copied MLP branch is the teacher's
    transfer_weights(student, teacher, 'mlp_copy')


def test_a_non_canonical_state_dict_is_refused_not_half_copied():
    """A timm CLIP state dict names ``pre_norm`` ``norm_pre``: FullCopy left it out."""
    teacher = teacher_of('clip')
    state = {('norm_pre.' + k[len('pre_norm.'):] if k.startswith('pre_norm.') else k): v
             for k, v in teacher.state_dict().items()}
    student = VisionTransformer(ARCH, family='clip', **COMMON)
    with pytest.raises(ValueError, match=r'norm_pre\.weight.*convert_state_dict'):
        transfer_weights(student, state, 'full_copy')


def test_tokens_the_student_is_built_without_stay_allowed():
    teacher = VisionTransformer(ARCH, family='dinov2', num_reg_tokens=2, **COMMON)
    student = VisionTransformer(ARCH, family='dinov2', attn_cfg='mhla', with_cls_token=False,
                                num_reg_tokens=0, with_mask_token=False, pos_embed_type='sincos',
                                out_type='avg_featmap', **COMMON)
    report = transfer_weights(student, teacher, 'full_copy')
    assert {'cls_token', 'reg_token', 'mask_token', 'pos_embed'} == report.no_counterpart
