"""Mutation round 10: the ViT backbone's outputs, freezing, depths and sizes against mmpretrain.

Each test here fails on a one-line change of ``mmlinvit/backbones/{vit,base,outputs,
arch_zoo,operator_setting}.py`` or ``mmlinvit/models/{necks,segmentors}.py`` that the rest of
the suite let through (the mutation audit of session 16).
The reference is mmpretrain's ``VisionTransformer`` (installed, independent code) with the
same random weights, loaded through the ``'mmpretrain'`` checkpoint layout:

* the formatted outputs (``'raw'``, ``'cls_token'``, ``'featmap'``, ``'avg_featmap'`` with
  mmpretrain's ``ln2``) of the first and last blocks, with and without a class token (a
  learned position grid then has no class row), at the training grid, a non-square grid and
  a corner-padded input: only the last block is normalised, whatever ``out_indices`` holds;
* ``frozen_stages`` (which parameters stop training, which modules stay in eval mode) and
  ``get_layer_depth`` (layer-wise learning-rate decay) for every depth;
* the norm epsilons and the arch zoo (widths, depths, heads, MLP widths: mmpretrain's
  ``arch_zoo``, DINOv2-g's SwiGLU width from mmpretrain's ``SwiGLUFFNFused`` rule);
* timm's init of the class and register tokens (std 1e-6), and the stem order of timm /
  mmpretrain (position dropout, then CLIP's ``pre_norm``);
* the hand-stated rules that no reference computes: an ``out_indices`` entry past the last
  block is refused, only the DINOv2 giant gets a SwiGLU MLP by default, ``avg_featmap_norm``
  needs ``out_type='avg_featmap'``, ``'cls_avg'`` of an earlier block needs
  ``norm_all_outputs``, the operators are told the class AND register tokens, a load without
  weights does not count as loaded, a recorded grid must hold the checkpoint's rows, a stack
  of several operators takes the values all of them accept and names them all, a CLIP file
  from before the ``mlp_act`` record loads;
* the MAE family's grid resampling (mmpretrain's ``resize_pos_embed``, as MAE's fine-tuning
  code: no antialias), the pyramid neck's default norm (mmseg's ``Feature2Pyramid``: SyncBN)
  and the training-time padding of every per-pixel label (mmseg's ``stack_batch``).
"""
import math
from typing import Dict, Optional, Tuple

import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.backbones.arch_zoo import VIT_SIZES
from mmlinvit.backbones.operator_setting import declared_setting
from mmlinvit.backbones.training_record import MLP_ACT_RECORD, TrainingRecordMismatchError
from mmlinvit.converters import load_pretrained
from mmlinvit.layers.attention import ATTENTION_OPERATORS
from mmlinvit.models.necks import FullGridFeature2Pyramid

mmpretrain_backbones = pytest.importorskip('mmpretrain.models.backbones')

WIDTH, DEPTH, HEADS, HIDDEN = 64, 2, 2, 128
MMP_ARCH = dict(embed_dims=WIDTH, num_layers=DEPTH, num_heads=HEADS,
                feedforward_channels=HIDDEN)
OUR_ARCH = dict(embed_dims=WIDTH, num_layers=DEPTH, num_heads=HEADS, mlp_hidden_dims=HIDDEN)


def _randomise_(model: torch.nn.Module, seed: int = 0) -> None:
    """Every parameter random at a sensible scale (norm weights around 1, not the init)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.ndim == 1 and name.endswith('weight'):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith('bias'):
                p.copy_(0.1 * noise)
            elif name in ('cls_token', 'pos_embed'):
                p.copy_(0.5 * noise)
            else:
                p.copy_(noise / math.sqrt(p[0].numel()))


def _pair(with_cls_token: bool = True, out_type: str = 'featmap', out_indices=(0, 1),
          ours_extra: Optional[dict] = None, **kwargs) -> Tuple[torch.nn.Module, VisionTransformer]:
    """mmpretrain's ViT with random weights, and mmlinvit's with the same weights loaded.

    ``kwargs`` go to both constructors, ``ours_extra`` to mmlinvit's only.
    """
    ref = mmpretrain_backbones.VisionTransformer(
        arch=dict(MMP_ARCH), img_size=64, patch_size=16, with_cls_token=with_cls_token,
        out_type=out_type, out_indices=list(out_indices), **kwargs)
    _randomise_(ref)
    ref.eval()
    ours = VisionTransformer(OUR_ARCH, family='deit', img_size=64,
                             with_cls_token=with_cls_token, out_type=out_type,
                             out_indices=list(out_indices),
                             avg_featmap_norm=out_type == 'avg_featmap', **kwargs,
                             **(ours_extra or {})).eval()
    load_pretrained(ours, ref.state_dict(), layout='mmpretrain')
    return ref, ours


@pytest.mark.parametrize('out_indices', [(0, ), (0, 1)])
@pytest.mark.parametrize('with_cls_token,out_type', [
    (True, 'featmap'), (False, 'featmap'), (True, 'avg_featmap'), (False, 'avg_featmap'),
    (True, 'cls_token'), (False, 'raw')])
def test_outputs_match_mmpretrain(with_cls_token: bool, out_type: str, out_indices) -> None:
    """Each returned block as mmpretrain formats it, at the training grid, a non-square one
    and a size that is corner-padded to whole patches (50 x 70 -> a 4 x 5 grid)."""
    ref, ours = _pair(with_cls_token, out_type, out_indices)
    gen = torch.Generator().manual_seed(1)
    for hw in [(64, 64), (48, 96), (50, 70)]:
        x = torch.randn(2, 3, *hw, generator=gen)
        with torch.no_grad():
            want, got = ref(x), ours(x)
        assert len(got) == len(want) == len(out_indices)
        for block, (g, w) in zip(out_indices, zip(got, want)):
            assert g.shape == w.shape, (hw, block)
            torch.testing.assert_close(g, w, rtol=0, atol=1e-5, msg=f'{hw} block {block}')


def test_norm_epsilons_are_mmpretrains() -> None:
    """The final norm (mmpretrain ``ln1``), the avg_featmap norm (``ln2``) and the block
    norms of a DeiT-family model use mmpretrain's ``LN`` eps of 1e-6."""
    ref, ours = _pair(True, 'avg_featmap')
    assert ours.norm.eps == ref.ln1.eps
    assert ours.avg_norm.eps == ref.ln2.eps
    assert ours.blocks[0].norm1.eps == ref.layers[0].ln1.eps


def _group(name: str) -> str:
    """The part of a backbone a parameter belongs to, in mmlinvit's names."""
    head = name.split('.')[0]
    if head in ('blocks', 'layers'):
        return 'block' + name.split('.')[1]
    return {'norm': 'final', 'ln1': 'final', 'avg_norm': 'avg', 'ln2': 'avg'}.get(head, 'stem')


def _frozen_by_group(model: torch.nn.Module) -> Dict[str, Tuple[int, int]]:
    counts: Dict[str, Tuple[int, int]] = {}
    for name, p in model.named_parameters():
        frozen, total = counts.get(_group(name), (0, 0))
        counts[_group(name)] = (frozen + int(not p.requires_grad), total + 1)
    return counts


@pytest.mark.parametrize('frozen_stages', [-1, 0, 1, 2])
def test_frozen_stages_match_mmpretrain(frozen_stages: int) -> None:
    """The same parameters stop training (stem, the first blocks, the final and avg_featmap
    norms once every block is frozen) and the same blocks / norms are in eval mode in
    training (mmpretrain's state right after its ``_freeze_stages``, which its ``__init__``
    runs for ``frozen_stages > 0``; mmlinvit re-applies it in ``train()``)."""
    ref, ours = _pair(True, 'avg_featmap', (1, ), dict(patch_bias=False),
                      frozen_stages=frozen_stages, pre_norm=True)
    assert _frozen_by_group(ours) == _frozen_by_group(ref)
    ref.train()
    if frozen_stages > 0:
        ref._freeze_stages()
    ours.train()
    for i in range(DEPTH):
        assert ours.blocks[i].training == ref.layers[i].training, i
    assert ours.norm.training == ref.ln1.training
    assert ours.avg_norm.training == ref.ln2.training
    assert ours.patch_embed.training == ref.patch_embed.training


#: mmlinvit parameter name -> mmpretrain's.
DEPTH_NAMES = {
    'cls_token': 'cls_token',
    'pos_embed': 'pos_embed',
    'patch_embed.proj.weight': 'patch_embed.projection.weight',
    'patch_embed.proj.bias': 'patch_embed.projection.bias',
    'blocks.0.attn.qkv.weight': 'layers.0.attn.qkv.weight',
    'blocks.1.norm2.bias': 'layers.1.ln2.bias',
    'blocks.1.mlp.fc2.weight': 'layers.1.ffn.layers.1.weight',
    'norm.weight': 'ln1.weight',
    'avg_norm.bias': 'ln2.bias',
}


def test_layer_depths_match_mmpretrain() -> None:
    """Layer-wise decay depths: stem 0, block i at i + 1, norms and heads last, of
    ``num_layers + 2`` depths (mmpretrain's ``get_layer_depth``)."""
    ref, ours = _pair(True, 'avg_featmap')
    ours_names = {n for n, _ in ours.named_parameters()}
    ref_names = {n for n, _ in ref.named_parameters()}
    for our_name, ref_name in DEPTH_NAMES.items():
        assert our_name in ours_names and ref_name in ref_names
        assert (ours.get_layer_depth('backbone.' + our_name, 'backbone.') ==
                ref.get_layer_depth('backbone.' + ref_name, 'backbone.')), our_name
    assert (ours.get_layer_depth('head.fc.weight', 'backbone.') ==
            ref.get_layer_depth('head.fc.weight', 'backbone.'))


#: mmlinvit size -> mmpretrain arch_zoo name.
MMP_SIZES = {'t': 'deit-tiny', 's': 'deit-small', 'b': 'base', 'l': 'large', 'h': 'huge'}


@pytest.mark.parametrize('size', sorted(MMP_SIZES))
def test_arch_zoo_is_mmpretrains(size: str) -> None:
    theirs = mmpretrain_backbones.VisionTransformer.arch_zoo[MMP_SIZES[size]]
    assert VIT_SIZES[size] == dict(embed_dims=theirs['embed_dims'],
                                   num_layers=theirs['num_layers'],
                                   num_heads=theirs['num_heads'],
                                   mlp_hidden_dims=theirs['feedforward_channels'])


def test_giant_is_dinov2_giant() -> None:
    """ViT-g/14: mmpretrain's ``dinov2-giant`` sizes; its SwiGLU halves are
    ``SwiGLUFFNFused``'s ``(int(feedforward_channels * 2 / 3) + 7) // 8 * 8``."""
    theirs = mmpretrain_backbones.VisionTransformer.arch_zoo['dinov2-giant']
    ours = VIT_SIZES['g']
    assert (ours['embed_dims'], ours['num_layers'], ours['num_heads']) == (
        theirs['embed_dims'], theirs['num_layers'], theirs['num_heads'])
    assert ours['mlp_hidden_dims'] == (int(theirs['feedforward_channels'] * 2 / 3) + 7) // 8 * 8


def test_only_the_dinov2_giant_defaults_to_swiglu() -> None:
    """``mlp_type=None`` means SwiGLU for the DINOv2 giant only; a giant-sized model of
    another family keeps the plain two-layer MLP of ``mlp_hidden_dims``."""
    with torch.device('meta'):
        plain = VisionTransformer('g', family='deit3')
    mlp = plain.blocks[0].mlp
    assert mlp.fc1.weight.shape == (VIT_SIZES['g']['mlp_hidden_dims'], 1536)
    assert mlp.fc2.weight.shape == (1536, VIT_SIZES['g']['mlp_hidden_dims'])


@pytest.mark.parametrize('index', [DEPTH, -DEPTH - 1])
def test_out_indices_past_the_blocks_are_refused(index: int) -> None:
    """An ``out_indices`` entry that names no block raises (it would return nothing)."""
    with pytest.raises(IndexError, match='out of range'):
        VisionTransformer(OUR_ARCH, img_size=32, patch_size=16, out_indices=[index])


def test_class_and_register_tokens_start_as_timms() -> None:
    """timm's ``VisionTransformer.init_weights``: ``normal_(cls_token / reg_token,
    std=1e-6)``; the random init is what a student without a teacher class token keeps."""
    timm = pytest.importorskip('timm')
    torch.manual_seed(0)
    ref = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=16, embed_dim=256, depth=1, num_heads=4, reg_tokens=4)
    ours = VisionTransformer(dict(embed_dims=256, num_layers=1, num_heads=4,
                                  mlp_hidden_dims=64), img_size=32, patch_size=16,
                             num_reg_tokens=4)
    for name in ('cls_token', 'reg_token'):
        theirs_std = getattr(ref, name).detach().std().item()
        our_std = getattr(ours, name).detach().std().item()
        assert 0.5 < our_std / theirs_std < 2.0, (name, our_std, theirs_std)


def test_pre_norm_is_the_last_stem_operation() -> None:
    """CLIP's ``ln_pre`` comes after the position dropout (timm: ``pos_drop`` then
    ``norm_pre``; mmpretrain: ``drop_after_pos`` then ``pre_norm``): in training with dropout,
    every token entering the first block is still normalised (at init: zero mean and unit
    variance over the channels; the class token, of std 1e-6 plus a position, has a variance
    the LayerNorm eps shrinks, so the patch tokens are checked)."""
    torch.manual_seed(0)
    model = VisionTransformer(OUR_ARCH, family='clip', img_size=32, drop_rate=0.5).train()
    tokens = model.prepare_tokens(torch.randn(2, 3, 32, 32))[0][:, 1:]
    mean = tokens.mean(dim=-1)
    var = tokens.var(dim=-1, unbiased=False)
    torch.testing.assert_close(mean, torch.zeros_like(mean), rtol=0, atol=1e-5)
    torch.testing.assert_close(var, torch.ones_like(var), rtol=0, atol=1e-3)


def test_avg_featmap_norm_needs_the_avg_featmap_output() -> None:
    """mmpretrain's ``ln2`` normalises the (B, C) mean only; on a (B, C, h, w) map it would
    normalise over the columns."""
    with pytest.raises(ValueError, match='avg_featmap_norm'):
        VisionTransformer(OUR_ARCH, img_size=32, patch_size=16, out_type='featmap',
                          avg_featmap_norm=True)


def test_cls_avg_of_an_earlier_block_needs_norm_all_outputs() -> None:
    """DINOv2's linear input reads normalised blocks (``get_intermediate_layers(...,
    norm=True)``); one earlier block alone is returned unnormalised unless
    ``norm_all_outputs=True``, so that setting is refused, and accepted with it."""
    with pytest.raises(ValueError, match='norm_all_outputs=True'):
        VisionTransformer(OUR_ARCH, img_size=32, patch_size=16, out_type='cls_avg',
                          out_indices=[0])
    VisionTransformer(OUR_ARCH, img_size=32, patch_size=16, out_type='cls_avg',
                      out_indices=[0], norm_all_outputs=True)



def test_operators_are_told_the_class_and_register_tokens() -> None:
    """Every block's operator gets the (h, w) grid of the input and the number of tokens
    before the patches, class token AND registers (1 + 2 here): the operators that read the
    patch grid (MHLA's blocks and local branch, TTT's convolution) skip exactly those."""
    model = VisionTransformer(OUR_ARCH, img_size=32, patch_size=16, num_reg_tokens=2).eval()
    seen = []
    for blk in model.blocks:
        blk.attn.register_forward_pre_hook(lambda _, args: seen.append(args[1:]))
    with torch.no_grad():
        model(torch.randn(1, 3, 48, 80))
    assert len(seen) == DEPTH
    for hw_shape, num_prefix_tokens in seen:
        assert tuple(hw_shape) == (3, 5) and num_prefix_tokens == 3


def test_a_load_without_weights_does_not_count_as_loaded() -> None:
    """``weights_loaded`` (which silences the 'pretrained never loaded' warning) turns on
    only when a checkpoint brings weights: the training records the load hooks fill in are
    not weights."""
    model = VisionTransformer(OUR_ARCH, img_size=32, patch_size=16)
    model.load_state_dict({}, strict=False)
    assert not model.weights_loaded
    model.load_state_dict({'norm.weight': torch.ones(WIDTH)}, strict=False)
    assert model.weights_loaded


def test_a_recorded_grid_must_hold_the_checkpoint_rows() -> None:
    """A checkpoint ``pos_embed`` of 1 + 12 rows resamples when its recorded grid is 3 x 4
    (or, unrecorded, never: 12 is not a square) and not when the record says 3 x 5."""
    model = VisionTransformer(OUR_ARCH, img_size=32, patch_size=16)
    pos = torch.zeros(1, 1 + 12, WIDTH)
    assert model.pos_embed_loads(pos, (3, 4))
    assert not model.pos_embed_loads(pos, (3, 5))
    assert not model.pos_embed_loads(pos)


def test_mixed_stacks_merge_the_settings_and_name_every_operator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``declared_setting`` over layers of several operators: an argument takes the values
    every operator accepts (in the first declarer's order), the declarers are listed once
    each, in layer order, and the refusal names them all. Hand rule: the intersection of the
    ``paper_backbone_setting`` tuples (TTT's narrowed here with monkeypatch)."""
    with pytest.raises(ValueError, match=r"operator\(s\) \['mhla', 'ttt'\]"):
        VisionTransformer(OUR_ARCH, attn_cfg=['mhla', 'ttt'], img_size=32, patch_size=16,
                          with_cls_token=True)
    ttt = ATTENTION_OPERATORS.get('ttt')
    mhla_out_types = tuple(ATTENTION_OPERATORS.get('mhla').paper_backbone_setting['out_type'])
    narrowed = ('raw', 'featmap')
    monkeypatch.setattr(ttt, 'paper_backbone_setting', dict(out_type=narrowed))
    merged = declared_setting(['mhla', 'ttt', 'mhla', 'ttt'])
    assert merged['out_type'] == (tuple(v for v in mhla_out_types if v in narrowed),
                                  ['mhla', 'ttt'])
    assert merged['with_cls_token'] == ((False, ), ['mhla'])
    monkeypatch.setattr(ttt, 'paper_backbone_setting', dict(with_cls_token=(True, )))
    with pytest.raises(ValueError, match='incompatible with_cls_token'):
        declared_setting(['mhla', 'ttt'])


def test_clip_files_from_before_the_activation_record_load() -> None:
    """The documented rule of ``check_checkpoint_act``: a family-``'clip'`` checkpoint without
    ``mlp_act`` loads when it is an mmlinvit file from before that record (it has
    ``block_operators``; mmlinvit built it with the family's activation), and is refused when
    it records neither (a plain CLIP state dict: QuickGELU or GELU by source)."""
    torch.manual_seed(0)
    saved = VisionTransformer(OUR_ARCH, family='clip', img_size=32).state_dict()
    del saved[MLP_ACT_RECORD]
    model = VisionTransformer(OUR_ARCH, family='clip', img_size=32)
    load_pretrained(model, dict(saved))
    torch.testing.assert_close(model.blocks[1].mlp.fc2.weight, saved['blocks.1.mlp.fc2.weight'],
                               rtol=0, atol=0)
    del saved['block_operators']
    with pytest.raises(TrainingRecordMismatchError, match="act='quick_gelu'"):
        load_pretrained(VisionTransformer(OUR_ARCH, family='clip', img_size=32), saved)


def test_the_pyramid_norm_defaults_to_mmsegs() -> None:
    """``FullGridFeature2Pyramid`` without ``norm_cfg`` builds the 4x branch of mmseg's
    ``Feature2Pyramid`` with its default norm (SyncBN, trainable), so a config written for
    mmseg's neck trains the same model."""
    from mmseg.models.necks import Feature2Pyramid

    def norms(neck: torch.nn.Module) -> list:
        return [m for m in neck.upsample_4x.modules()
                if isinstance(m, torch.nn.modules.batchnorm._NormBase)]

    ref_norms, our_norms = norms(Feature2Pyramid(32)), norms(FullGridFeature2Pyramid(32))
    assert len(ref_norms) == 1 and isinstance(ref_norms[0], torch.nn.SyncBatchNorm)
    assert [type(m) for m in our_norms] == [type(m) for m in ref_norms]
    assert all(p.requires_grad for m in our_norms for p in m.parameters())


def test_training_pads_every_pixel_label_as_mmsegs_stack_batch() -> None:
    """``mmlinvit.EncoderDecoder.loss`` pads the inputs to whole patches in the model, so it
    pads the samples' per-pixel labels as mmseg's ``stack_batch`` pads a batch (bottom /
    right, value 255): the semantic map, the edge map and the depth map alike."""
    from mmengine.registry import init_default_scope
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    from mmseg.utils import stack_batch

    init_default_scope('mmseg')
    from mmseg.registry import MODELS
    torch.manual_seed(0)
    model = MODELS.build(dict(
        type='mmlinvit.EncoderDecoder',
        data_preprocessor=dict(type='SegDataPreProcessor', mean=[0.] * 3, std=[1.] * 3),
        backbone=dict(type='mmlinvit.VisionTransformer', arch=OUR_ARCH, family='deit',
                      img_size=32, out_type='featmap', out_indices=[1]),
        decode_head=dict(type='FCNHead', in_channels=WIDTH, channels=8, num_convs=1,
                         num_classes=3, norm_cfg=dict(type='GN', num_groups=4),
                         dropout_ratio=0.0, align_corners=False),
        train_cfg=dict(), test_cfg=dict(mode='whole'))).train()
    h, w = 20, 36
    labels = dict(gt_sem_seg=torch.randint(0, 3, (1, h, w)),
                  gt_edge_map=torch.randint(0, 2, (1, h, w)),
                  gt_depth_map=torch.rand(1, h, w))

    def samples() -> list:
        out = SegDataSample(metainfo=dict(ori_shape=(h, w), img_shape=(h, w)))
        for key, label in labels.items():
            setattr(out, key, PixelData(data=label.clone()))
        return [out]

    ours = samples()
    model.loss(torch.randn(1, 3, h, w), ours)
    _, theirs = stack_batch([torch.randn(3, h, w)], samples(), size_divisor=16,
                            seg_pad_val=255)
    for key in labels:
        torch.testing.assert_close(getattr(ours[0], key).data, getattr(theirs[0], key).data,
                                   rtol=0, atol=0, msg=key)


def test_mae_grids_resample_as_mmpretrain_and_maes_fine_tuning() -> None:
    """Family ``'mae'`` resamples its learned grid as MAE's fine-tuning code
    (``interpolate_pos_embed``) and mmpretrain's ``resize_pos_embed`` do: bicubic,
    ``align_corners=False``, no antialias (timm's antialiased kernel differs even when
    upsampling)."""
    from mmpretrain.models.utils import resize_pos_embed

    torch.manual_seed(0)
    model = VisionTransformer(OUR_ARCH, family='mae', img_size=64).eval()
    _randomise_(model)
    for hw_shape in ((3, 5), (6, 7)):
        want = resize_pos_embed(model.pos_embed.detach(), (4, 4), hw_shape, mode='bicubic',
                                num_extra_tokens=1)[:, 1:]
        with torch.no_grad():
            got = model.learned_patch_pos_embed(hw_shape)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
