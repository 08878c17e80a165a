"""``attention_output_stats`` must report mean((s - t)^2) / mean(t^2) per block (teacher in the
denominator), not the reverse; the reference is computed here with plain forward hooks."""
import pytest
import torch

from mmlinvit.analysis import attention_output_stats
from mmlinvit.analysis.layer_sensitivity import clone_with_attn, hybrid_attn_cfg
from mmlinvit.backbones import VisionTransformer

ARCH = dict(embed_dims=64, num_layers=4, num_heads=4, mlp_hidden_dims=128)


def test_gap_has_the_teacher_mean_square_in_the_denominator():
    cfg = dict(type='mmlinvit.VisionTransformer', arch=ARCH, family='deit', img_size=32,
               patch_size=8)
    torch.manual_seed(0)
    teacher = VisionTransformer(**{k: v for k, v in cfg.items() if k != 'type'}).eval()
    student = clone_with_attn(cfg, teacher, hybrid_attn_cfg(4, [0], 'elu'))
    outs = {}
    hooks = [m.blocks[i].attn.register_forward_hook(
        lambda mod, a, o, key=(name, i): outs.__setitem__(key, o))
        for name, m in (('t', teacher), ('s', student)) for i in range(4)]
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        teacher(images)
        student.eval()(images)
    for h in hooks:
        h.remove()
    mean_sq, gaps = attention_output_stats(student, teacher, images)
    for i in range(1, 4):
        s, t = outs[('s', i)], outs[('t', i)]
        ref = float((s - t).pow(2).mean() / t.pow(2).mean())
        rev = float((s - t).pow(2).mean() / s.pow(2).mean())
        assert abs(ref - rev) > 1e-3 * ref  # the two directions differ here
        assert gaps[i] == pytest.approx(ref, rel=1e-5)
