"""torch.compile (CPU inductor) of the linear ViT and Adventurer matches eager.

``fullgraph=True``: the whole forward must be captured without graph breaks (linear attention
switches to its whole-tensor form while compiling; the SSD scan is plain torch).  The inductor
CPU backend generates and compiles C++, so the test needs a C++ compiler.
"""
import os
import shutil

import pytest
import torch

from mmlinvit.backbones import Adventurer, LinearVisionTransformer
from mmlinvit.ops.linear_attention import dispatch
from mmlinvit.ops.ssd import dispatch as ssd_dispatch

CXX = os.environ.get('CXX', 'g++')
pytestmark = pytest.mark.skipif(
    shutil.which(CXX) is None and shutil.which('clang++') is None,
    reason=f'torch.compile with the CPU inductor backend compiles generated C++: no C++ '
    f'compiler ({CXX} / clang++) on PATH; install g++ (apt-get install g++) to run this test')


def _models():
    torch.manual_seed(0)
    vit = LinearVisionTransformer(dict(embed_dims=32, num_layers=1, num_heads=2,
                                       mlp_hidden_dims=64), img_size=32, patch_size=8,
                                  out_type='featmap')
    adventurer = Adventurer(dict(embed_dims=32, num_layers=1), img_size=32, patch_size=8,
                            mixer_cfg=dict(d_state=8, headdim=16, chunk_size=16),
                            out_type='featmap')
    mhla = LinearVisionTransformer(dict(embed_dims=32, num_layers=1, num_heads=2,
                                        mlp_hidden_dims=64), img_size=32, patch_size=8,
                                   attn_cfg=dict(type='mhla', block_grid=(2, 2)),
                                   check_operator_setting=False, out_type='featmap')
    return {'linear-vit': vit.eval(), 'adventurer': adventurer.eval(), 'mhla': mhla.eval()}


def test_first_call_compiles_whole(monkeypatch):
    """The compiled call as the first forward of the process (mmengine's ``compile=True``):
    the backend choice's one-time log line broke the graph (fullgraph=True failed), and MHLA's
    data-dependent block indices broke it per block (inductor failed with fullgraph=True)."""
    monkeypatch.setattr(dispatch, '_logged_choices', set())
    monkeypatch.setattr(ssd_dispatch, '_logged_choices', set())
    torch._dynamo.reset()
    images = torch.randn(1, 3, 32, 48)
    for name, model in _models().items():
        compiled = torch.compile(model, backend='eager', fullgraph=True, dynamic=False)
        with torch.no_grad():
            out = compiled(images)
            ref = model(images)
        torch.testing.assert_close(out[0], ref[0], atol=1e-6, rtol=1e-5, msg=name)
    torch._dynamo.reset()


def test_compiled_linear_vit_and_adventurer_match_eager(monkeypatch):
    import torch._inductor.config as inductor_config
    monkeypatch.setattr(inductor_config, 'compile_threads', 1)  # no worker pool on 2 cores
    torch._dynamo.reset()
    seen = []
    graph_form = dispatch.linear_attention_graph
    monkeypatch.setattr(dispatch, 'linear_attention_graph',
                        lambda *a, **k: seen.append(1) or graph_form(*a, **k))
    images = torch.randn(2, 3, 32, 48)  # 4 x 6 patches, not the 4 x 4 training grid
    for name, model in _models().items():
        compiled = torch.compile(model, backend='inductor', fullgraph=True, dynamic=False)
        with torch.no_grad():
            ref = model(images)
            out = compiled(images)
        assert len(out) == len(ref) == 1
        assert out[0].shape == ref[0].shape == (2, 32, 4, 6), name
        torch.testing.assert_close(out[0], ref[0], atol=1e-5, rtol=1e-4, msg=name)
    # The compiled ViT traced the whole-tensor linear attention, not the chunked Function.
    assert seen
    torch._dynamo.reset()
