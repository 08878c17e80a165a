"""Mutation round 16: weight transfer, transformer layers and the toy / checked data sets.

Written for single-change mutants of ``mmlinvit/transfer/{base,copy_strategies,mimetic}.py``,
``mmlinvit/layers/{pos_embed,norm,patch_embed,transformer}.py`` and
``mmlinvit/datasets/{integrity,synthetic_scenes}.py`` that the earlier tests (rounds 9, 10 and
15 included) let pass.  Guarded, each against an independent reference:

* position grids: a bf16 grid is resampled in fp32 and handed back in bf16, bit for bit as
  mmpretrain's ``resize_pos_embed`` (``bicubic``) and timm's ``resample_abs_pos_embed``
  (``bicubic_antialias``) do;
* gated RMS norm: both paths (autograd, in place) return the input dtype (Mamba-2 formula in
  float64), and a group size below one is refused when the norm is built;
* patch embedding: timm's ``PatchEmbed`` defaults;
* transformer block: ``layer_scale_init=0.0`` means no LayerScale, as timm's ``Block``;
  ``drop_path_rate`` drops the MLP branch per sample, as timm's ``drop_path2``;
* transfer: each of the seven documented ``TransferReport`` invariants is checked on its own;
  shape mismatches are all named (up to eight); a FullCopy refusal does not point at the
  ``mlp_copy`` opt-out; the default strategy is ``mlp_copy``; a teacher state dict missing a
  whole block is refused (FINDING: fails on the code before the fix in
  ``mmlinvit/transfer/base.py``, ``_teacher_shape``);
* integrity scan: progress every 5 % below the 1000-sample cap, in-memory samples (no
  ``img_path``) skipped, ``num_threads=0`` still scans;
* toy scenes: the unlabelled band stops at the image edge and a hidden object leaves none;
  ``max_objects=1`` is allowed.
"""
import re
from typing import List, Tuple

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from mmlinvit.backbones import VisionTransformer
from mmlinvit.datasets.integrity import ScanResult, scan_dataset_files
from mmlinvit.layers import TransformerBlock
from mmlinvit.layers.norm import GatedRMSNorm
from mmlinvit.layers.patch_embed import PatchEmbed
from mmlinvit.layers.pos_embed import resample_pos_grid
from mmlinvit.transfer import TransferStructureError, transfer_weights
from mmlinvit.transfer.base import TransferReport

TINY = dict(embed_dims=64, num_layers=2, num_heads=2, mlp_hidden_dims=128)
COMMON = dict(img_size=32, patch_size=8)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors: one intra-op thread is fastest on the shared cores."""


# ---------------------------------------------------------------------- layers.pos_embed
@pytest.mark.parametrize('mode', ['bicubic', 'bicubic_antialias'])
def test_bf16_grid_resampling_equals_mmpretrain_and_timm(mode: str):
    """A bf16 grid is resampled in fp32 and handed back in bf16, bit for bit what mmpretrain's
    ``resize_pos_embed`` (``bicubic``) and timm's ``resample_abs_pos_embed``
    (``bicubic_antialias``) return for it, on a non-square target."""
    torch.manual_seed(0)
    pos = torch.randn(1, 6 * 6, 8).to(torch.bfloat16)
    if mode == 'bicubic':
        from mmpretrain.models.utils import resize_pos_embed
        want = resize_pos_embed(pos, (6, 6), (4, 9), mode='bicubic', num_extra_tokens=0)
    else:
        from timm.layers import resample_abs_pos_embed
        want = resample_abs_pos_embed(pos, [4, 9], [6, 6], num_prefix_tokens=0,
                                      interpolation='bicubic', antialias=True)
    got = resample_pos_grid(pos, (6, 6), (4, 9), mode)
    assert got.dtype == torch.bfloat16 and want.dtype == torch.bfloat16
    assert torch.equal(got, want)


# ---------------------------------------------------------------------- layers.norm
def _gated_rms64(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, group: int,
                 eps: float) -> torch.Tensor:
    """Mamba-2's gated RMSNorm (``norm_before_gate=False``) in float64."""
    y = x.double() * F.silu(z.double())
    g = y.reshape(*y.shape[:-1], -1, group)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    return g.reshape(y.shape) * weight.double()


@pytest.mark.parametrize('consume', [False, True])
def test_gated_rms_norm_returns_the_input_dtype(consume: bool):
    """Statistics in fp32, output in the dtype of the input (bf16 in, bf16 out), equal to the
    float64 Mamba-2 formula rounded to bf16, on the autograd and on the in-place path."""
    torch.manual_seed(0)
    x, z = torch.randn(3, 8).to(torch.bfloat16), torch.randn(3, 8).to(torch.bfloat16)
    want = _gated_rms64(x, z, torch.ones(8), 4, 1e-5)
    with torch.no_grad():
        got = GatedRMSNorm(8, group_size=4)(x.clone(), z.clone(), consume=consume)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want.to(torch.bfloat16).double(), atol=1e-2,
                               rtol=1e-2)


@pytest.mark.parametrize('group_size', [0, -4])
def test_gated_rms_norm_refuses_a_group_size_below_one(group_size: int):
    """A group is a positive number of channels: 0 (no group) and -4 (which divides 8 as an
    integer) are refused by name when the norm is built, not at the first forward."""
    with pytest.raises(ValueError, match='group_size'):
        GatedRMSNorm(8, group_size=group_size)


# ---------------------------------------------------------------------- layers.patch_embed
def test_patch_embed_defaults_are_timms():
    """``PatchEmbed()`` is timm's ``PatchEmbed()`` projection: 3 -> 768 channels, 16 x 16
    patches, stride 16, with a bias."""
    from timm.layers import PatchEmbed as TimmPatchEmbed
    ours, theirs = PatchEmbed().proj, TimmPatchEmbed().proj
    assert (ours.in_channels, ours.out_channels, ours.kernel_size, ours.stride) == \
        (theirs.in_channels, theirs.out_channels, theirs.kernel_size, theirs.stride)
    assert (ours.bias is None) == (theirs.bias is None) and ours.bias is not None


# ---------------------------------------------------------------------- layers.transformer
def test_zero_layer_scale_init_means_no_layer_scale_as_in_timm():
    """timm's ``Block(init_values=0.0)`` has no LayerScale (``if init_values else
    Identity``); the block does the same with ``layer_scale_init=0.0``: no ``ls*`` weights."""
    from timm.models.vision_transformer import Block
    timm_keys = {k for k in Block(16, 2, init_values=0.0).state_dict() if '.ls' in f'.{k}'}
    ours = TransformerBlock(16, 2, 32, layer_scale_init=0.0)
    assert timm_keys == set()
    assert {k for k in ours.state_dict() if k.startswith('ls')} == timm_keys
    assert isinstance(ours.ls1, torch.nn.Identity) and isinstance(ours.ls2, torch.nn.Identity)


def test_block_drop_path_rate_reaches_the_mlp_branch():
    """``drop_path_rate`` drops the MLP branch per sample too (timm ``Block``'s ``drop_path2``).
    With the attention output zeroed, a training forward of 64 samples at rate 0.5 gives each
    sample either ``x`` (branch dropped) or ``x + 2 * branch`` (kept, scaled by 1 / 0.5), the
    branch being what the eval-mode block adds; both outcomes occur."""
    torch.manual_seed(0)
    block = TransformerBlock(16, 2, 32, drop_path_rate=0.5)
    with torch.no_grad():
        block.attn.proj.weight.zero_()
        block.attn.proj.bias.zero_()
    x = torch.randn(64, 5, 16)
    branch = block.eval()(x) - x
    out = block.train()(x)
    dropped = (out - x).abs().flatten(1).amax(1) < 1e-6
    kept = (out - x - 2 * branch).abs().flatten(1).amax(1) < 1e-5
    assert bool((dropped | kept).all()) and bool(dropped.any()) and bool(kept.any())
# ---------------------------------------------------------------------- transfer.base
_STUDENT, _TEACHER = {'a', 'b', 'c'}, {'a', 'b', 't'}


@pytest.mark.parametrize('fields, problem', [
    (dict(copied={'a', 'b'}, initialized={'b', 'c'}, no_counterpart={'t'}),
     'copied and initialized overlap'),
    (dict(copied={'a'}, initialized={'b'}, skipped={'b'}, no_counterpart={'t'}),
     'copied | initialized is not the set of student keys'),
    (dict(copied={'a', 'b'}, initialized={'c'}, skipped={'b'}, no_counterpart={'t'}),
     'copied, skipped and no_counterpart overlap'),
    (dict(copied={'a'}, initialized={'b', 'c'}, skipped={'b'}),
     'copied | skipped | no_counterpart is not the set of teacher keys'),
    (dict(copied={'a', 'b'}, initialized={'c'}, no_counterpart={'t'}, student_only={'a'}),
     'student_only is not within initialized'),
    (dict(copied={'a', 'b'}, initialized={'c'}, no_counterpart={'t'},
          strategy_initialized={'b'}), 'strategy_initialized is not within initialized'),
    (dict(copied={'a', 'b'}, initialized={'c'}, no_counterpart={'t'},
          adapted={'c': 'resampled'}), 'adapted is not within copied'),
])
def test_every_documented_report_invariant_is_checked(fields: dict, problem: str):
    """Each of the seven invariants of the ``TransferReport`` docstring, broken alone (the
    other six hold, written out by hand), raises with that invariant named."""
    with pytest.raises(AssertionError, match=re.escape(problem)):
        TransferReport('copy', **fields).validate(_STUDENT, _TEACHER)
    # The same report with the one violation removed is consistent.
    fixed = dict(copied={'a', 'b'}, initialized={'c'}, no_counterpart={'t'})
    TransferReport('copy', **fixed).validate(_STUDENT, _TEACHER)


def test_every_mismatched_tensor_is_named_up_to_eight():
    """A student with another MLP width: the six MLP tensors of the two blocks (fc1 weight and
    bias, fc2 weight) do not fit, and the error names all six with both shapes."""
    teacher = VisionTransformer(TINY, **COMMON)
    student = VisionTransformer(dict(TINY, mlp_hidden_dims=96), **COMMON)
    with pytest.raises(ValueError, match='^6 teacher tensors do not fit') as info:
        transfer_weights(student, teacher, 'mlp_copy')
    for i in range(2):
        assert f'blocks.{i}.mlp.fc1.weight: teacher (128, 64) vs student (96, 64)' in str(info.value)
        assert f'blocks.{i}.mlp.fc1.bias: teacher (128,) vs student (96,)' in str(info.value)
        assert f'blocks.{i}.mlp.fc2.weight: teacher (64, 128) vs student (64, 96)' in str(info.value)
    assert '...' not in str(info.value)


def test_full_copy_layer_scale_mismatch_does_not_suggest_the_mlp_copy_opt_out():
    """``include_layer_scale=False`` is an option of ``mlp_copy`` (and of the bases of mimetic
    / impulse): a FullCopy refusal names the structural fix only."""
    teacher = VisionTransformer(TINY, family='deit3', **COMMON)
    student = VisionTransformer(TINY, **COMMON)
    with pytest.raises(TransferStructureError, match='ls1.gamma') as info:
        transfer_weights(student, teacher, 'full_copy')
    assert 'include_layer_scale' not in str(info.value)
    with pytest.raises(TransferStructureError, match='include_layer_scale=False'):
        transfer_weights(student, teacher, 'mlp_copy')


def test_the_default_strategy_is_mlp_copy():
    """Without a strategy, ``transfer_weights`` copies the MLP sub-blocks and their norms
    (``mlp_copy``): for a 2-block DeiT pair exactly these twelve tensors, listed by hand."""
    teacher = VisionTransformer(TINY, **COMMON)
    student = VisionTransformer(TINY, attn_cfg='elu', **COMMON)
    report = transfer_weights(student, teacher)
    assert report.strategy == 'mlp_copy'
    assert report.copied == {f'blocks.{i}.{name}' for i in range(2)
                             for name in ('norm2.weight', 'norm2.bias', 'mlp.fc1.weight',
                                          'mlp.fc1.bias', 'mlp.fc2.weight', 'mlp.fc2.bias')}
# ---------------------------------------------------------------------- datasets.integrity
class _Listing:
    """The two methods of an mmengine dataset that the scan uses, over the given infos."""

    def __init__(self, infos: List[dict]) -> None:
        self.infos = infos

    def __len__(self) -> int:
        return len(self.infos)

    def get_data_info(self, idx: int) -> dict:
        return dict(self.infos[idx])


def _missing(tmp_path, num: int) -> _Listing:
    """``num`` samples whose image files do not exist (each fails to decode at once)."""
    return _Listing([dict(img_path=str(tmp_path / f'{i}.jpg'), seg_map_path=None)
                     for i in range(num)])


def test_progress_is_reported_every_5_percent_below_the_1000_sample_cap(tmp_path):
    """2100 samples: 5 % is 105 samples (below the documented cap of 1000 per report), so the
    reports come at 105, 210, ..., 2100: twenty of them."""
    calls: List[Tuple[int, int, int]] = []
    scan_dataset_files(_missing(tmp_path, 2100), num_threads=1,
                       progress=lambda *a: calls.append(a))
    assert [c[0] for c in calls] == [105 * k for k in range(1, 21)]
    assert calls[-1] == (2100, 2100, 2100)


def test_samples_without_an_image_file_are_skipped_by_the_scan(tmp_path):
    """An mmengine dataset of in-memory samples (CIFAR-like: ``img`` arrays, no ``img_path``)
    has nothing to decode: the scan checks none of them and reports nothing."""
    from mmengine.dataset import BaseDataset

    class InMemory(BaseDataset):

        def load_data_list(self) -> List[dict]:
            return [dict(img=np.zeros((4, 4, 3), np.uint8), gt_label=i) for i in range(3)]

    dataset = InMemory(serialize_data=False)
    good = tmp_path / 'good.png'
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(good)
    mixed = _Listing([dataset.get_data_info(0), dict(img_path=str(good))])
    assert scan_dataset_files(dataset, num_threads=1) == ScanResult(0, 0, [])
    assert scan_dataset_files(mixed, num_threads=1) == ScanResult(1, 1, [])


def test_zero_threads_still_scan_with_one(tmp_path):
    """``num_threads=0`` (e.g. a loader with ``num_workers=0`` passed through) decodes with one
    thread instead of failing to build the pool."""
    good = tmp_path / 'good.png'
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(good)
    result = scan_dataset_files(_Listing([dict(img_path=str(good))]), num_threads=0)
    assert result == ScanResult(1, 1, [])


# ---------------------------------------------------------------------- datasets.synthetic_scenes
def test_object_outline_stops_at_the_image_edge():
    """The band is around the object's border with the rest of the scene: an object reaching
    the image edge has no border there (``mode='edge'`` padding).  A mask of the left three
    columns of a 4x6 image has its band on columns 2 (inside) and 3 (outside), on every row."""
    from mmlinvit.datasets.synthetic_scenes import _outline
    mask = np.zeros((4, 6), bool)
    mask[:, :3] = True
    expected = np.zeros((4, 6), bool)
    expected[:, 2:4] = True
    np.testing.assert_array_equal(_outline(mask), expected)


@pytest.mark.parametrize('seed', range(4))
def test_max_objects_one_draws_exactly_one_object(seed: int):
    """``max_objects`` is the largest number of objects: with 1 every scene has exactly one
    object (the count is drawn from 1..max_objects), so at most one object class appears."""
    from mmlinvit.datasets.synthetic_scenes import draw_scene
    _, label = draw_scene(np.random.default_rng(seed), 32, 32, max_objects=1)
    assert len(set(np.unique(label).tolist()) - {-1, 0, 1}) <= 1


class _TwoConcentricTrees:
    """A generator for ``draw_scene`` that draws two trees at the image centre, a small one
    and then a large one hiding it (the horizon at mid-height, no vertical offset); every
    other draw (colours, noise) comes from a real generator."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.sizes = [0.15, 0.35]

    def integers(self, low: int, high: int) -> int:
        return 2

    def choice(self, options, p=None) -> int:
        return 3  # tree

    def uniform(self, low: float, high: float, size=None):
        if size is not None:
            return self.rng.uniform(low, high, size)
        return {(0.3, 0.6): 0.5, (0.1, 0.9): 0.5, (-0.1, 0.15): 0.0}.get(
            (low, high), self.sizes.pop(0) if (low, high) == (0.15, 0.35) else None)

    def normal(self, loc: float, scale: float, size):
        return self.rng.normal(loc, scale, size)


def test_a_hidden_objects_band_is_drawn_over_by_the_object_in_front():
    """A tree hidden behind a larger tree leaves no band of its own: the only unlabelled pixels
    are the visible tree's band, the disk's border pixels on both sides (computed here from
    the disk of radius 0.6 * 0.35 * 64 around the centre)."""
    from mmlinvit.datasets.synthetic_scenes import draw_scene
    _, label = draw_scene(_TwoConcentricTrees(), 64, 64)
    yy, xx = np.mgrid[0:64, 0:64].astype(np.float32)
    disk = (xx - 32)**2 + (yy - 32)**2 < (0.6 * 0.35 * 64)**2
    pad = np.pad(disk, 1)
    neighbours = [pad[:-2, 1:-1], pad[2:, 1:-1], pad[1:-1, :-2], pad[1:-1, 2:]]
    band = (disk & ~np.logical_and.reduce(neighbours)) | (~disk & np.logical_or.reduce(neighbours))
    np.testing.assert_array_equal(label == -1, band)
    np.testing.assert_array_equal(label == 3, disk & ~band)


@pytest.mark.parametrize('strategy', ['full_copy', 'mlp_copy'])
def test_a_teacher_state_dict_missing_a_whole_block_is_refused(strategy: str):
    """FINDING (fails on the code before the fix): a teacher state dict without any
    ``blocks.1.*`` tensor (blocks 0 and 2 present) passed the depth check (depth read as
    max index + 1 = 3), and the transfer left block 1 of the student at its initialisation
    without an error.  A canonical ViT state dict has every block from 0 to depth - 1."""
    arch = dict(TINY, num_layers=3)
    state = {k: v for k, v in VisionTransformer(arch, **COMMON).state_dict().items()
             if not k.startswith('blocks.1.')}
    student = VisionTransformer(arch, **COMMON)
    with pytest.raises(ValueError, match=r'no tensors of blocks \[1\]'):
        transfer_weights(student, state, strategy)
