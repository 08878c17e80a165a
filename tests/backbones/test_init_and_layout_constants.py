"""Constants a random or partly copied backbone starts from, and output layouts, against the
official code: timm's ViT init (position embedding std 0.02, zero linear biases, DeiT-III
LayerScale 1e-6), OpenAI CLIP's LayerNorm eps, DINOv2's SwiGLU and linear-eval features,
Mamba-2's step-size init, timm / mmcv DropPath, mmseg's row-major feature maps.

The MLPCopy recipes keep the student's random position embedding and LayerScale wherever the
teacher has none, so these constants are part of the recipe's default path.
"""
import torch
import torch.nn.functional as F

from mmlinvit.backbones import VisionTransformer
from mmlinvit.backbones.outputs import format_tokens, resolve_out_indices
from mmlinvit.layers.mamba2 import Mamba2Mixer
from mmlinvit.layers.transformer import DropPath, SwiGLUMlp

TINY = dict(embed_dims=32, num_layers=4, num_heads=2, mlp_hidden_dims=64)


def _image() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def test_learned_pos_embed_init_std_is_timms():
    torch.manual_seed(0)
    model = VisionTransformer(dict(embed_dims=256, num_layers=1, num_heads=4,
                                   mlp_hidden_dims=64), img_size=128, patch_size=8)
    model.init_weights()
    std = model.pos_embed.detach().std().item()
    assert 0.015 < std < 0.025, std


def test_linear_biases_start_at_zero_as_timm():
    torch.manual_seed(0)
    model = VisionTransformer(TINY, attn_cfg='elu', img_size=32, patch_size=8)
    model.init_weights()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            assert torch.count_nonzero(module.bias) == 0, name


def test_family_constants_are_the_official_ones():
    """timm deit3_*: init_values=1e-6; OpenAI CLIP: nn.LayerNorm's default eps 1e-5."""
    small = dict(embed_dims=32, num_layers=1, num_heads=2, mlp_hidden_dims=64)
    deit3 = VisionTransformer(small, family='deit3', img_size=32)
    deit3.init_weights()
    assert torch.all(deit3.blocks[0].ls1.gamma == 1e-6)
    assert torch.all(deit3.blocks[0].ls2.gamma == 1e-6)
    clip = VisionTransformer(small, family='clip', img_size=32)
    assert clip.blocks[0].norm1.eps == 1e-5 and clip.pre_norm.eps == 1e-5
    assert clip.norm.eps == 1e-5


def test_mamba2_initial_step_sizes_lie_in_dt_range():
    """Mamba-2: dt_bias = softplus^-1(dt), dt log-uniform in [dt_min, dt_max]."""
    torch.manual_seed(0)
    mixer = Mamba2Mixer(64, d_state=8, headdim=8)
    dt = F.softplus(mixer.dt_bias.detach())
    assert dt.min() >= 0.001 * (1 - 1e-4) and dt.max() <= 0.1 * (1 + 1e-4), dt
    torch.testing.assert_close(mixer.step_sizes(torch.zeros(1, 1, mixer.nheads))[0, 0], dt)


def test_drop_path_keeps_the_expectation():
    """timm / mmcv DropPath: the samples kept are divided by the keep probability."""
    drop = DropPath(0.25).train()
    torch.manual_seed(0)
    out = drop(torch.ones(4000, 3, 5))
    kept = out[:, 0, 0] != 0
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / 0.75))


def test_swiglu_gates_the_first_half():
    """DINOv2 SwiGLUFFN: x1, x2 = w12(x).chunk(2); w3(silu(x1) * x2)."""
    torch.manual_seed(0)
    mlp = SwiGLUMlp(8, 16)
    x = torch.randn(3, 8)
    hidden = mlp.fc1(x)
    torch.testing.assert_close(mlp(x), mlp.fc2(F.silu(hidden[:, :16]) * hidden[:, 16:]))


def test_cls_avg_over_blocks_reads_the_last_blocks_patch_mean():
    """DINOv2 create_linear_input(use_n_blocks=n, avgpool=True): the class tokens of the n
    blocks, then the mean of the LAST block's patch tokens."""
    torch.manual_seed(0)
    model = VisionTransformer(TINY, img_size=32, patch_size=8, out_type='cls_avg',
                              out_indices=(2, 3), norm_all_outputs=True).eval()
    with torch.no_grad():
        got = model(_image())[0]
        model.out_type = 'raw'
        raw = model(_image())
    assert not torch.allclose(raw[0][:, 1:].mean(1), raw[1][:, 1:].mean(1))
    expected = torch.cat([raw[0][:, 0], raw[1][:, 0], raw[1][:, 1:].mean(1)], dim=-1)
    torch.testing.assert_close(got, expected)


def test_negative_out_indices_count_from_the_end():
    assert resolve_out_indices([-1, -2, 0], 4) == [3, 2, 0]
    torch.manual_seed(0)
    last = VisionTransformer(TINY, img_size=32, patch_size=8, out_indices=-1).eval()
    third = VisionTransformer(TINY, img_size=32, patch_size=8, out_indices=3).eval()
    third.load_state_dict(last.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(last(_image())[0], third(_image())[0])


def test_featmap_is_row_major_on_a_non_square_grid():
    """mmseg / mmpretrain ViT: patch_token.reshape(B, h, w, C).permute(0, 3, 1, 2)."""
    tokens = torch.randn(2, 1 + 2 * 3, 4)
    got = format_tokens(tokens, 'featmap', 0, slice(1, None), (2, 3))
    torch.testing.assert_close(got, tokens[:, 1:].reshape(2, 2, 3, 4).permute(0, 3, 1, 2))
