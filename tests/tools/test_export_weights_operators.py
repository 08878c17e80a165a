"""``export_onnx.py`` loads weights by name: a softmax-trained checkpoint exported through a
linear config (the demo softmax checkpoint with the demo ELU config) exited 0, where
``tools/test.py`` refuses the same pair; it is refused with the operators named."""
import importlib.util
from pathlib import Path

import pytest
import torch

from mmlinvit.backbones import VisionTransformer

ROOT = Path(__file__).resolve().parents[2]
ARCH = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)


def _onnx_tools():
    path = ROOT / 'tools' / 'deployment' / 'onnx_tools.py'
    spec = importlib.util.spec_from_file_location('onnx_tools_under_test', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_softmax_weights_are_not_exported_as_a_linear_model(tmp_path):
    tools = _onnx_tools()
    path = str(tmp_path / 'softmax.pth')
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in
                               VisionTransformer(arch=ARCH, img_size=32,
                                                 patch_size=8).state_dict().items()}}, path)
    elu = VisionTransformer(arch=ARCH, img_size=32, patch_size=8, attn_cfg='elu')
    with pytest.raises(ValueError, match=r"trained with attention operators \['softmax'\] but "
                                         r"the model to evaluate .* runs \['elu'\]"):
        tools.load_weights(elu, path, 'student backbone')
    softmax = VisionTransformer(arch=ARCH, img_size=32, patch_size=8)
    assert tools.load_weights(softmax, path, 'teacher backbone') == 'backbone.'
