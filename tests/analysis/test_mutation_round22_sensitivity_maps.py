"""Attention maps, layer sensitivity and their tools on branches that the rest of the suite
let pass (mutation round 22): each test below failed on at least one single-line change of
the module that no other test caught.

Guarded here, each against a reference written in the test (hand-worked numbers, float64 maps
from the operator's q / k by its documented formula, ``F.interpolate`` run per map, the
teacher block run on the input a hook of the test saw):

* ``mmlinvit.analysis.attention_maps``: ``head=0`` is a head (the ELU+1 kernel row of head 0
  in float64); the capturing hooks are removed, also when the map then fails; a batch of
  (B, h, w) maps is upsampled map by map; a grid that exactly covers the image is accepted,
  and one too short for a tall image is refused (height against height);
* ``mmlinvit.analysis.layer_sensitivity``: block timings in milliseconds (real ones) are no
  "predicted time <= 0" warning; ``--keep 0`` is the all-linear hybrid; the timed calls of
  ``layer_costs`` run each block (softmax and linearized) on the teacher's input to it;
* ``tools/analysis/visualize_attention.py``: a constant map gets the colour range [v, v + 1];
  the default query of an odd number of columns is an integer patch;
* ``tools/analysis/{visualize_attention,layer_sensitivity,model_index}.py``: run as scripts,
  they reach ``main`` (``--help``).
"""
import runpy
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmlinvit.analysis import query_attention_maps, upsample_map
from mmlinvit.analysis import layer_sensitivity as ls
from mmlinvit.backbones import VisionTransformer
from mmlinvit.utils.cli import load_script

from attention_fp64 import assert_close64, qkv64

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures('one_thread')


def _load_tool(name: str) -> ModuleType:
    return load_script(str(ROOT / 'tools' / 'analysis' / f'{name}.py'), f'{name}_round22')


# ----------------------------------------------------------------------------- attention maps
def test_maps_leave_no_hooks_on_the_model() -> None:
    """The capturing hooks are removed after the forward, also when the map then fails: a
    hook left behind would keep every later forward's operator input alive in its dict."""
    torch.manual_seed(0)
    model = VisionTransformer(dict(embed_dims=16, num_layers=2, num_heads=2,
                                   mlp_hidden_dims=32), img_size=16, patch_size=8).eval()
    images = torch.randn(1, 3, 16, 16)
    query_attention_maps(model, images, (1, 1), [0, 1])
    with pytest.raises(IndexError, match='outside the 2 x 2 patch grid'):
        query_attention_maps(model, images, (2, 0), [1])
    assert [len(blk.attn._forward_pre_hooks) for blk in model.blocks] == [0, 0]


def test_head_0_of_an_elu_map_is_the_first_heads_kernel_row() -> None:
    """``head=0`` is a head (``0 <= head``): the ELU+1 map of head 0 written out in float64
    from the operator's input (own hook) and its q / k (``qkv64``), as the operator documents
    it: ``phi(q_i).phi(k_j) / (sum_l phi(q_i).phi(k_l) + N eps)``; the query patch's row, patch
    columns only (class token dropped), on the 2 x 3 grid."""
    torch.manual_seed(0)
    model = VisionTransformer(dict(embed_dims=16, num_layers=2, num_heads=2,
                                   mlp_hidden_dims=32), attn_cfg='elu', img_size=(16, 24),
                              patch_size=8).eval()
    images = torch.randn(2, 3, 16, 24)  # 2 x 3 patches + the class token: N = 7
    op = model.blocks[1].attn
    seen = {}

    def keep_input(module: torch.nn.Module, args: tuple) -> None:
        seen.setdefault('x', args[0].detach())  # TransformerBlock passes x positionally

    handle = op.register_forward_pre_hook(keep_input)
    try:
        maps = query_attention_maps(model, images, (1, 2), [1], head=0)
    finally:
        handle.remove()
    q, k, _ = qkv64(op, seen['x'])
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    scores = phi_q @ phi_k.transpose(-2, -1)
    kernel = scores / (scores.sum(-1, keepdim=True) + 7 * op.eps)
    assert maps[1].shape == (2, 2, 3)
    assert_close64(maps[1], kernel[:, 0, 1 + 1 * 3 + 2, 1:].reshape(2, 2, 3))


# ----------------------------------------------------------------------------- upsample_map
def test_a_batch_of_maps_is_upsampled_map_by_map() -> None:
    """(2, 2, 3) maps to 4 x 6 pixels: each map becomes 2 x 2 blocks of its own values, as
    ``F.interpolate`` gives for that map alone (and as ``repeat_interleave`` writes it)."""
    maps = torch.arange(12.0).reshape(2, 2, 3)
    up = upsample_map(maps, (4, 6))
    assert up.shape == (2, 4, 6)
    for i in range(2):
        blocks = maps[i].repeat_interleave(2, 0).repeat_interleave(2, 1)
        torch.testing.assert_close(up[i], blocks)
        alone = F.interpolate(maps[i][None, None], size=(4, 6), mode='nearest')[0, 0]
        torch.testing.assert_close(up[i], alone)
    padded = upsample_map(maps, (3, 5), patch_size=2)  # 2 x 3 grid of 2-pixel patches, cropped
    torch.testing.assert_close(padded, up[:, :3, :5])


def test_a_grid_that_exactly_covers_the_image_is_accepted() -> None:
    """A 2 x 3 grid of 8-pixel patches is exactly 16 x 24 pixels: nothing to crop, no error."""
    grid = torch.arange(6.0).reshape(2, 3)
    up = upsample_map(grid, (16, 24), patch_size=8)
    torch.testing.assert_close(up, grid.repeat_interleave(8, 0).repeat_interleave(8, 1))


def test_a_wide_grid_too_short_for_a_tall_image_is_refused() -> None:
    """A 1 x 4 grid of 8-pixel patches is 8 x 32 pixels: it does not cover a 16 x 32 image
    (its 32-pixel width says nothing about the missing rows)."""
    with pytest.raises(ValueError, match='a 1x4 grid of 8-pixel patches does not cover a '
                       '16x32 image'):
        upsample_map(torch.zeros(1, 4), (16, 32), patch_size=8)


# ----------------------------------------------------------------------------- layer sensitivity
def test_millisecond_predictions_are_not_warned_as_non_positive() -> None:
    """Real block timings are milliseconds: blocks of 4 -> 1 ms and 3 -> 1 ms in an 8 ms
    teacher predict 3, 6 and 8 ms (all > 0), the blocks take 7 / 8 of the teacher, and the
    chosen k = 0 measured 3.1 ms within 0.5 x 8 ms: nothing to warn about."""
    sensitivity = [dict(feature_gap=0.3), dict(feature_gap=0.05)]
    blocks = [dict(softmax_s=0.004, linear_s=0.001, softmax_flops=40, linear_flops=10),
              dict(softmax_s=0.003, linear_s=0.001, softmax_flops=30, linear_flops=10)]
    costs = dict(teacher_s=0.008, teacher_flops=80, blocks=blocks, resolution=[8, 8])
    proposals = ls.propose(sensitivity, costs, 'elu')
    assert [p['predicted_s'] for p in proposals] == pytest.approx([0.003, 0.006, 0.008])
    for p, measured in zip(proposals, (0.0031, 0.006, 0.008)):
        p['measured_s'] = measured
    chosen = ls.choose(proposals, 0.008, 0.5, None)
    assert chosen['keep'] == 0
    assert ls.timing_warnings(costs, proposals, chosen, 0.5) == []



def test_keep_0_chooses_the_all_linear_hybrid() -> None:
    """``--keep 0`` is a valid budget (k = 0..L): the hybrid with no softmax layer, every
    layer linearized, whatever the time budget would say."""
    sensitivity = [dict(feature_gap=0.3), dict(feature_gap=0.05)]
    blocks = [dict(softmax_s=0.004, linear_s=0.001, softmax_flops=40, linear_flops=10),
              dict(softmax_s=0.003, linear_s=0.001, softmax_flops=30, linear_flops=10)]
    costs = dict(teacher_s=0.008, teacher_flops=80, blocks=blocks, resolution=[8, 8])
    chosen = ls.choose(ls.propose(sensitivity, costs, 'elu'), 0.008, None, 0)
    assert chosen['keep'] == 0 and chosen['softmax_layers'] == []
    assert chosen['attn_cfg'] == ['elu', 'elu']


def test_layer_costs_time_each_block_on_the_teachers_input_to_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake timer keeps what each timed call returns: the teacher, then per block the
    softmax block and its linearized clone, each run on the teacher's input to that block
    (taken by a hook written here): the softmax call returns the teacher block's output, the
    linear one an output of the same shape from the ELU operator (not the softmax one)."""
    torch.manual_seed(0)
    arch = dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32)
    cfg = dict(type='mmlinvit.VisionTransformer', arch=arch, family='deit', img_size=16,
               patch_size=8)
    teacher = VisionTransformer(**{k: v for k, v in cfg.items() if k != 'type'}).eval()
    returned = []

    def timer(fn: Callable[[], object], repeats: int) -> float:
        returned.append(fn())
        return 1.0

    inputs = {}

    def keep_input(index: int) -> Callable[[torch.nn.Module, tuple], None]:

        def hook(module: torch.nn.Module, args: tuple) -> None:
            inputs.setdefault(index, args[0].detach())

        return hook

    handles = [blk.register_forward_pre_hook(keep_input(i)) for i, blk in enumerate(teacher.blocks)]
    monkeypatch.setattr(ls, 'best_seconds', timer)
    try:
        costs = ls.layer_costs(cfg, teacher, 'elu', (16, 16), repeats=1)
    finally:
        for handle in handles:
            handle.remove()
    assert len(returned) == 1 + 2 * 2 and costs['teacher_s'] == 1.0
    for i, blk in enumerate(teacher.blocks):
        softmax_out, linear_out = returned[1 + 2 * i], returned[2 + 2 * i]
        with torch.no_grad():
            expected = blk(inputs[i], (2, 2), 1)
        torch.testing.assert_close(softmax_out, expected)
        assert isinstance(linear_out, torch.Tensor) and linear_out.shape == expected.shape
        assert not torch.allclose(linear_out, expected)


# ----------------------------------------------------------------------------- visualize tool
def test_a_constant_map_gets_a_colour_range_of_one_above_its_value(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A map that is 0.25 everywhere (min == max) cannot span its own range: the unsigned
    overlay runs from 0.25 to 1.25 (a zero-width colour range would hide the map)."""
    import matplotlib.pyplot as plt
    tool = _load_tool('visualize_attention')
    figures = []
    real_close = plt.close
    monkeypatch.setattr(plt, 'close', figures.append)
    image = np.zeros((16, 16, 3), dtype=np.uint8)
    flat = torch.full((1, 2, 2), 0.25)
    tool.render([image], ['img'], [('flat', {0: (flat, '')})], [0], (0, 0), 8,
                str(tmp_path / 'flat.png'), 'title')
    fig = figures[0]
    try:
        overlay = fig.axes[1].images[1]
        assert overlay.get_cmap().name == 'inferno'
        assert overlay.get_clim() == (0.25, 1.25)
    finally:
        real_close(fig)


def test_default_query_of_an_odd_number_of_columns_is_an_integer_patch() -> None:
    """16 x 40 pixels at patch 8: a 2 x 5 grid, centre (2 // 2, 5 // 2) = (1, 2), integers
    (5 / 2 = 2.5 is no patch)."""
    query = _load_tool('visualize_attention').default_query((16, 40), 8)
    assert query == (1, 2) and all(type(i) is int for i in query)


# ----------------------------------------------------------------------------- tools as scripts
@pytest.mark.parametrize('tool', ['visualize_attention', 'layer_sensitivity', 'model_index'])
def test_tools_run_their_main_as_scripts(tool: str, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture) -> None:
    """``python tools/analysis/<tool>.py --help`` reaches ``main``'s parser (usage printed,
    exit 0), run in-process as ``__main__``; the tool's ``sys.path`` insertion is undone."""
    monkeypatch.setattr(sys, 'path', list(sys.path))
    path = str(ROOT / 'tools' / 'analysis' / f'{tool}.py')
    monkeypatch.setattr(sys, 'argv', [path, '--help'])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(path, run_name='__main__')
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith('usage:')
