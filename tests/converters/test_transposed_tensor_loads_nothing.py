"""A checkpoint tensor with the model's element count but another shape (e.g. transposed) is
a shape mismatch."""
import pytest
from mmlinvit.backbones import VisionTransformer
from mmlinvit.converters import CheckpointMismatchError
from mmlinvit.converters.loading import check_state_dict_fits


def test_transposed_weight_is_a_shape_mismatch():
    model = VisionTransformer(arch=dict(embed_dims=48, num_layers=1, num_heads=3,
                                        mlp_hidden_dims=96), family='deit', img_size=32)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    key = 'blocks.0.mlp.fc1.weight'
    sd[key] = sd[key].t().contiguous()  # (48, 96) instead of (96, 48)
    check_state_dict_fits(model, model.state_dict(), strict=True)
    with pytest.raises(CheckpointMismatchError,
                       match=r'blocks.0.mlp.fc1.weight: checkpoint \(48, 96\) vs model \(96, 48\)'):
        check_state_dict_fits(model, sd, strict=False)
