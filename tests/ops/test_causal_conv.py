"""Causal depthwise convolution by shifted multiply-adds vs nn.Conv1d (the reference)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmlinvit.layers.mamba2 import Mamba2Mixer
from mmlinvit.ops.causal_conv import causal_depthwise_conv1d


def _reference(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    return conv(x)[..., :x.shape[-1]]


@pytest.mark.parametrize('bias', [True, False])
@pytest.mark.parametrize('taps', [1, 2, 4])
@pytest.mark.parametrize('length', [1, 3, 4, 37])
def test_forward_and_backward_match_conv1d(length, taps, bias):
    torch.manual_seed(0)
    conv = nn.Conv1d(6, 6, taps, groups=6, padding=taps - 1, bias=bias).double()
    x = torch.randn(2, 6, length, dtype=torch.float64, requires_grad=True)
    want = _reference(conv, x)
    grads_want = torch.autograd.grad(want.pow(2).sum(), [x] + list(conv.parameters()))
    for channels_last in (False, True):
        inp = x.transpose(1, 2) if channels_last else x
        got = causal_depthwise_conv1d(inp, conv.weight, conv.bias, channels_last=channels_last)
        grads_got = torch.autograd.grad(got.pow(2).sum(), [x] + list(conv.parameters()))
        torch.testing.assert_close(got.transpose(1, 2) if channels_last else got, want,
                                   rtol=1e-12, atol=1e-12)
        for g, w in zip(grads_got, grads_want):
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_strided_input_and_dtypes():
    """A transposed (token-major) input, and bf16 x with fp32 parameters (the autocast case:
    summed with the fp32 weights in fp32, as the official causal_conv1d kernel; the 16-bit
    result of casting the weights to bf16 was 2-3x further off)."""
    conv = nn.Conv1d(5, 5, 4, groups=5, padding=3)
    x = torch.randn(2, 11, 5).transpose(1, 2)
    torch.testing.assert_close(causal_depthwise_conv1d(x, conv.weight, conv.bias),
                               _reference(conv, x.contiguous()), rtol=1e-6, atol=1e-6)
    x16 = x.bfloat16()
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            out = causal_depthwise_conv1d(x16.requires_grad_(grad), conv.weight, conv.bias)
        assert out.dtype == torch.float32
        # exactly the fp32 convolution of the bf16 values
        torch.testing.assert_close(out, _reference(conv, x16.detach().float().contiguous()),
                                   rtol=1e-6, atol=1e-6)
        x16 = x16.detach()


def test_mixer_conv_and_silu_round_once_under_autocast():
    """Under bf16 autocast the mixer's xBC is the bf16 rounding of silu(conv) computed in
    fp32 from in_proj's bf16 output and the fp32 conv weights (the official policy)."""
    torch.manual_seed(0)
    mixer = Mamba2Mixer(32, d_state=8, headdim=16, chunk_size=8, bias=True)
    u = torch.randn(2, 19, 32)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        xbc_lin = F.linear(u, *mixer._in_proj_rows(1))
        got = mixer.conv_input(u)
    assert xbc_lin.dtype == torch.bfloat16 and got.dtype == torch.float32
    want = _reference(mixer.conv1d, xbc_lin.float().transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match='weight'):
        causal_depthwise_conv1d(torch.randn(1, 4, 5), torch.randn(3, 1, 4))
    with pytest.raises(ValueError, match='bias'):
        causal_depthwise_conv1d(torch.randn(1, 4, 5), torch.randn(4, 1, 4), torch.randn(3))
    with pytest.raises(ValueError, match=r'\(batch, L, C\)'):
        causal_depthwise_conv1d(torch.randn(1, 4, 5), torch.randn(4, 1, 4), channels_last=True)


def test_mixer_uses_it_on_cpu_also_under_capture(monkeypatch):
    """The mixer's CPU path (token-major, shifted multiply-adds) equals in_proj + nn.Conv1d,
    eagerly and in its captured-graph form (out-of-place ops); the module is not called."""
    from mmlinvit.ops import causal_conv
    mixer = Mamba2Mixer(32, d_state=8, headdim=16, chunk_size=8, bias=True)
    u = torch.randn(2, 19, 32)
    rows = mixer.d_inner + 2 * 8
    xbc = F.linear(u, mixer.in_proj.weight[mixer.d_inner:mixer.d_inner + rows],
                   mixer.in_proj.bias[mixer.d_inner:mixer.d_inner + rows])
    want = _reference(mixer.conv1d, xbc.transpose(1, 2)).transpose(1, 2)
    calls = []
    mixer.conv1d.register_forward_hook(lambda *args: calls.append(1))
    got = mixer.conv_input(u)
    assert got.is_contiguous()  # token-major: the scan reads contiguous channels
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(causal_conv, 'capturing_graph', lambda: True)
    torch.testing.assert_close(mixer.conv_input(u), want, rtol=1e-6, atol=1e-6)
    for channels_last in (False, True):  # the captured form in both layouts, with autograd
        x = xbc.detach().clone().requires_grad_()
        inp = x if channels_last else x.transpose(1, 2)
        out = causal_conv.causal_depthwise_conv1d(inp, mixer.conv1d.weight, mixer.conv1d.bias,
                                                  channels_last=channels_last)
        torch.testing.assert_close(out if channels_last else out.transpose(1, 2), want,
                                   rtol=1e-6, atol=1e-6)
        out.sum().backward()
        assert torch.isfinite(x.grad).all()
    assert calls == []


@pytest.mark.parametrize('channels_last', [False, True])
@pytest.mark.parametrize('block', [2, 3, 128])
def test_cache_blocks_without_autograd_give_the_autograd_values(monkeypatch, block,
                                                                channels_last):
    """The no-autograd form (token blocks) equals the autograd form to the bit, with block
    edges inside the taps' reach (blocks shorter than K) and ragged last blocks."""
    from mmlinvit.ops import causal_conv
    monkeypatch.setattr(causal_conv, 'CACHE_BLOCK_TOKENS', block)
    conv = nn.Conv1d(13, 13, 4, groups=13, padding=3)
    x = torch.randn(2, 13, 301)
    x = x.transpose(1, 2).contiguous() if channels_last else x
    with torch.enable_grad():
        want = causal_depthwise_conv1d(x, conv.weight, conv.bias, channels_last=channels_last)
    assert want.requires_grad
    with torch.no_grad():
        got = causal_depthwise_conv1d(x, conv.weight, conv.bias, channels_last=channels_last)
        got_no_bias = causal_depthwise_conv1d(x, conv.weight, None,
                                              channels_last=channels_last)
    torch.testing.assert_close(got, want.detach(), rtol=0, atol=0)
    ref = _reference(conv, x.transpose(1, 2) if channels_last else x)
    ref = ref.transpose(1, 2) if channels_last else ref
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    bias_shape = (1, 1, 13) if channels_last else (1, 13, 1)
    torch.testing.assert_close(got_no_bias, ref - conv.bias.detach().view(bias_shape),
                               rtol=1e-5, atol=1e-5)
