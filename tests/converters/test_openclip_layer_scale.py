"""OpenCLIP's LayerScale: ``ls_1`` scales the attention branch, ``ls_2`` the MLP branch
(open_clip ``ResidualAttentionBlock.forward``); swapped, the file still loads strictly."""
import torch

from mmlinvit.converters.layouts import convert_openai_clip


def test_openclip_layer_scale_goes_to_its_own_branch():
    width = 8
    state = {
        'class_embedding': torch.zeros(width),
        'positional_embedding': torch.zeros(5, width),
        'conv1.weight': torch.zeros(width, 3, 4, 4),
        'transformer.resblocks.0.ln_1.weight': torch.ones(width),
        'transformer.resblocks.0.ls_1.gamma': torch.full((width, ), 0.1),
        'transformer.resblocks.0.ls_2.gamma': torch.full((width, ), 0.2),
    }
    out, _ = convert_openai_clip(state)
    torch.testing.assert_close(out['blocks.0.ls1.gamma'], torch.full((width, ), 0.1))
    torch.testing.assert_close(out['blocks.0.ls2.gamma'], torch.full((width, ), 0.2))
    assert out['blocks.0.norm1.weight'].sum() == width
