"""Mutation round 15: the ViT backbone and the token-backbone plumbing it shares.

Each test here fails on a one-line change of ``mmlinvit/backbones/{base,vit,outputs,
operator_setting}.py`` that the rest of the suite let through (the mutation audit of session
19), or on a bug that audit found (marked "Bug (round 15)" in its docstring).  References:

* mmpretrain's ``VisionTransformer`` (installed, independent code): what ``frozen_stages``
  puts in eval mode (its position dropout too), the epsilon of its ``pre_norm``, its
  ``ln2`` applied to the ``'avg_featmap'`` output only (``out_type`` switched after
  ``__init__``);
* mmpretrain's ``resize_pos_embed`` (plain bicubic) and timm's ``resample_abs_pos_embed``
  (antialiased bicubic) for the position grid served from the inference cache after
  ``pos_interp`` changes;
* hand-stated rules of the docstrings that no library computes: a captured graph (jit trace)
  keeps the resampling instead of a cached constant, the "pretrained never loaded" warning
  comes once, a per-layer ``attn_cfg`` needs exactly one entry per block, the mask token
  starts at zero (DINOv2's code), ``pos_embed_type='none'`` adds nothing, the load hooks
  leave other shapes to ``load_state_dict``, the operator-setting fix names what to change.
"""
import warnings
from typing import List

import pytest
import torch

from mmlinvit.backbones import VisionTransformer

mmpretrain_backbones = pytest.importorskip('mmpretrain.models.backbones')

WIDTH, DEPTH, HEADS, HIDDEN = 32, 2, 2, 64
OUR_ARCH = dict(embed_dims=WIDTH, num_layers=DEPTH, num_heads=HEADS, mlp_hidden_dims=HIDDEN)
MMP_ARCH = dict(embed_dims=WIDTH, num_layers=DEPTH, num_heads=HEADS,
                feedforward_channels=HIDDEN)


def _vit(**kwargs) -> VisionTransformer:
    """A tiny DeiT-family ViT on a 2 x 2 grid of 16-pixel patches."""
    return VisionTransformer(dict(OUR_ARCH), family='deit', img_size=32, patch_size=16,
                             **kwargs)


# ------------------------------------------------------------------ freezing
@pytest.mark.parametrize('frozen_stages', [-1, 1, DEPTH])
def test_frozen_stem_turns_the_position_dropout_off_as_mmpretrain(frozen_stages: int) -> None:
    """Bug (round 15; fails on the code before the fix): mmpretrain's ``_freeze_stages``
    puts ``drop_after_pos`` in eval mode with the frozen stem; mmlinvit left it training, so
    a linear probe (every block frozen) with ``drop_rate > 0`` read randomly dropped tokens:
    two training-mode forwards of the frozen backbone differed.  mmpretrain's state is the
    one right after its ``_freeze_stages`` (which mmlinvit re-applies in ``train()``)."""
    ref = mmpretrain_backbones.VisionTransformer(
        arch=dict(MMP_ARCH), img_size=32, patch_size=16, drop_rate=0.5,
        frozen_stages=frozen_stages)
    ref.train()
    if frozen_stages > 0:
        ref._freeze_stages()
    ours = _vit(drop_rate=0.5, frozen_stages=frozen_stages).train()
    assert ours.drop_after_pos.training == ref.drop_after_pos.training
    if frozen_stages == DEPTH:
        x = torch.randn(2, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(ref(x)[0], ref(x)[0], rtol=0, atol=0)
            torch.testing.assert_close(ours(x)[0], ours(x)[0], rtol=0, atol=0)


def test_pre_norm_epsilon_is_mmpretrains() -> None:
    """A DeiT-family model built with ``pre_norm=True`` uses the family's LayerNorm epsilon
    (1e-6) in it, as mmpretrain's ``pre_norm`` (its ``norm_cfg``), not PyTorch's 1e-5."""
    ref = mmpretrain_backbones.VisionTransformer(arch=dict(MMP_ARCH), img_size=32,
                                                 patch_size=16, pre_norm=True)
    assert _vit(pre_norm=True).pre_norm.eps == ref.pre_norm.eps


# ------------------------------------------------------------------ position grids
def test_inference_cache_follows_pos_interp() -> None:
    """The resampled grid kept for inference is keyed by ``pos_interp``: switching it on a
    model serves the new resampling (mmpretrain's plain bicubic ``resize_pos_embed``, then
    timm's antialiased ``resample_abs_pos_embed``), never the cached one."""
    from mmpretrain.models.utils import resize_pos_embed
    resample_abs_pos_embed = pytest.importorskip('timm.layers').resample_abs_pos_embed
    torch.manual_seed(0)
    model = VisionTransformer(dict(OUR_ARCH), family='deit', img_size=64, patch_size=16).eval()
    with torch.no_grad():
        model.pos_embed.normal_()
    pos = model.pos_embed.detach().clone()
    hw = (3, 2)  # downsampling: antialiasing changes the result
    with torch.no_grad():
        plain = model.learned_patch_pos_embed(hw)
        model.pos_interp = 'bicubic_antialias'
        smooth = model.learned_patch_pos_embed(hw)
    want_plain = resize_pos_embed(pos, (4, 4), hw, mode='bicubic', num_extra_tokens=1)[:, 1:]
    want_smooth = resample_abs_pos_embed(pos, list(hw), (4, 4), interpolation='bicubic',
                                         antialias=True, num_prefix_tokens=1)[:, 1:]
    assert not torch.allclose(want_plain, want_smooth, atol=1e-3)
    torch.testing.assert_close(plain, want_plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(smooth, want_smooth, rtol=1e-5, atol=1e-6)


def test_a_traced_graph_keeps_the_resampling() -> None:
    """Tracing always resamples (the class docstring of ``learned_patch_pos_embed``): a
    trace of a frozen model at another grid reads ``pos_embed`` when it runs, so a later
    update of the parameter reaches the traced module (a cached grid would be a constant of
    the graph).  The reference is the eager model after the update."""
    torch.manual_seed(0)
    model = _vit(out_type='featmap').eval().requires_grad_(False)
    x = torch.randn(1, 3, 48, 80)  # 3 x 5 grid, the model's is 2 x 2
    with torch.no_grad():
        model(x)  # fills the inference cache
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            traced = torch.jit.trace(model, (x, ), check_trace=False)
        model.pos_embed.add_(torch.randn_like(model.pos_embed))
        want = model(x)[0]
        got = traced(x)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ construction rules
def test_the_pretrained_not_loaded_warning_comes_once(tmp_path) -> None:
    """``warn_if_pretrained_not_loaded`` warns once per model, not on every forward."""
    path = str(tmp_path / 'never_loaded.pth')
    torch.save(_vit().state_dict(), path)
    model = _vit(pretrained=path).eval()
    x = torch.randn(1, 3, 32, 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        with torch.no_grad():
            for _ in range(3):
                model(x)
    messages: List[str] = [str(w.message) for w in caught if 'never loaded' in str(w.message)]
    assert len(messages) == 1, messages


def test_a_trace_defers_the_pretrained_not_loaded_warning(tmp_path) -> None:
    """``prepare_tokens`` does not warn while a graph is captured (a Python warning inside
    torch.compile / export / jit tracing); the next eager forward still warns, once."""
    path = str(tmp_path / 'never_loaded.pth')
    torch.save(_vit().state_dict(), path)
    model = _vit(pretrained=path).eval().requires_grad_(False)
    x = torch.randn(1, 3, 32, 32)

    def never_loaded(caught) -> int:
        return sum('never loaded' in str(w.message) for w in caught)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        torch.jit.trace(model, (x, ), check_trace=False)
    assert never_loaded(caught) == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        model(x)
    assert never_loaded(caught) == 1


def test_a_per_layer_attn_cfg_needs_one_entry_per_block() -> None:
    """A list ``attn_cfg`` longer than the stack is refused, as a shorter one (an entry past
    the last block would be silently ignored)."""
    for cfgs in (['softmax'] * (DEPTH - 1), ['softmax'] * (DEPTH + 1)):
        with pytest.raises(ValueError, match=f'{len(cfgs)} entries.*{DEPTH} layers'):
            _vit(attn_cfg=cfgs)


def test_the_dinov2_mask_token_starts_at_zero() -> None:
    """DINOv2's code builds ``mask_token = nn.Parameter(torch.zeros(1, embed_dim))`` and its
    ``init_weights`` leaves it alone (the OPTIONAL_CHECKPOINT_KEYS reason says so too); the
    class / register tokens get timm's std 1e-6 instead."""
    torch.manual_seed(0)
    model = VisionTransformer(dict(OUR_ARCH), family='dinov2', img_size=28, num_reg_tokens=2)
    assert model.mask_token is not None
    assert torch.count_nonzero(model.mask_token) == 0
    assert torch.count_nonzero(model.reg_token) > 0


def test_pos_embed_type_typos_are_refused() -> None:
    """An unknown ``pos_embed_type`` (a typo) raises instead of building a model without
    position embeddings."""
    with pytest.raises(KeyError, match="pos_embed_type 'sin-cos'"):
        _vit(pos_embed_type='sin-cos')


def test_no_position_embedding_adds_nothing() -> None:
    """``pos_embed_type='none'``: the first block reads the patch embedding itself (and the
    class token) at any grid, no learned or sin-cos positions."""
    torch.manual_seed(0)
    model = _vit(pos_embed_type='none').eval()
    x = torch.randn(1, 3, 48, 80)
    with torch.no_grad():
        tokens, hw = model.prepare_tokens(x)
        patches, _ = model.patch_embed(x)
    assert hw == (3, 5) and model.pos_embed is None
    torch.testing.assert_close(tokens[:, 1:], patches, rtol=0, atol=0)
    torch.testing.assert_close(tokens[:, :1], model.cls_token.detach(), rtol=0, atol=0)


def test_a_dropped_ln2_warns_only_for_an_avg_featmap_model() -> None:
    """``surplus_key_warnings``: dropping mmpretrain's ``ln2`` changes the features of an
    ``'avg_featmap'`` model only; a ``'featmap'`` model never read it."""
    dropped = ['avg_norm.weight', 'avg_norm.bias']
    assert len(_vit(out_type='avg_featmap').surplus_key_warnings(dropped)) == 1
    assert _vit(out_type='featmap').surplus_key_warnings(dropped) == []
    assert _vit(out_type='avg_featmap').surplus_key_warnings(['mask_token']) == []


# ------------------------------------------------------------------ loading rules
def test_registered_names_with_the_scope_take_the_paper_setting() -> None:
    """``attn_cfg='mmlinvit.mhla'`` (the registry name with its scope) is the ``'mhla'``
    operator for the paper setting too: the setting is applied, and named, as for the
    unscoped name."""
    with pytest.warns(UserWarning, match=r"operator\(s\) \['mhla'\]"):
        model = VisionTransformer(dict(OUR_ARCH), attn_cfg='mmlinvit.mhla', img_size=32,
                                  patch_size=16)
    assert model.cls_token is None and model.pos_embed_type == 'sincos'


def test_the_class_token_fix_keeps_a_given_patch_output() -> None:
    """MHLA refuses a class token; a model asked for ``out_type='featmap'`` (segmentation)
    is told to drop the class token only, not to switch to average pooling (the out_type
    fix is added only when ``out_type='cls_token'`` needs the class token)."""
    with pytest.raises(ValueError) as err:
        VisionTransformer(dict(OUR_ARCH), attn_cfg='mhla', img_size=32, patch_size=16,
                          with_cls_token=True, pos_embed_type='sincos', out_type='featmap')
    assert 'Build it with with_cls_token=False, i.e.' in str(err.value)
    with pytest.raises(ValueError, match="with_cls_token=False, out_type='avg_featmap'"):
        VisionTransformer(dict(OUR_ARCH), attn_cfg='mhla', img_size=32, patch_size=16,
                          with_cls_token=True, pos_embed_type='sincos', out_type='cls_token')
    # the class token left unset (MHLA's setting drops it): out_type is refused by the
    # operator setting itself, which names its first accepted value as the fix
    with pytest.raises(ValueError, match=r"built with out_type='cls_token'\. Build it with "
                                         r"out_type='avg_featmap'"):
        VisionTransformer(dict(OUR_ARCH), attn_cfg='mhla', img_size=32, patch_size=16,
                          pos_embed_type='sincos', out_type='cls_token')


def test_a_model_without_positions_ignores_a_checkpoint_grid() -> None:
    """A sin-cos model loading a learned-position checkpoint with ``strict=False``: the
    checkpoint's ``pos_embed`` is an unexpected key (PyTorch's contract), no crash in the
    load hooks, and every block weight loads."""
    torch.manual_seed(0)
    saved = _vit().state_dict()
    model = _vit(pos_embed_type='sincos')
    result = model.load_state_dict(saved, strict=False)
    assert 'pos_embed' in result.unexpected_keys
    torch.testing.assert_close(model.blocks[1].mlp.fc2.weight, saved['blocks.1.mlp.fc2.weight'],
                               rtol=0, atol=0)


def test_a_record_of_another_depth_is_reported_with_the_shapes() -> None:
    """The ``block_operators`` record of a deeper model (another shape) is left to
    ``load_state_dict``, which reports the size mismatch with both shapes even with
    ``strict=False`` (the record hook must not replace it by the model's)."""
    deeper = VisionTransformer(dict(OUR_ARCH, num_layers=DEPTH + 1), family='deit', img_size=32,
                               patch_size=16).state_dict()
    with pytest.raises(RuntimeError, match='size mismatch for block_operators'):
        _vit().load_state_dict(deeper, strict=False)


@pytest.mark.parametrize('shape', [(1, 1 + 4, 2 * WIDTH), (2, 1 + 4, WIDTH), (1, 1, WIDTH)])
def test_only_single_grids_of_the_model_width_resample(shape) -> None:
    """``pos_embed_loads``: a (1, extra rows + rows * cols, embed_dims) tensor; another
    width, a batch of grids or no patch row at all is not a grid this model resamples."""
    assert not _vit().pos_embed_loads(torch.zeros(shape))
    assert _vit().pos_embed_loads(torch.zeros(1, 1 + 9, WIDTH))


def test_cls_avg_settings_changed_after_init_are_checked_at_forward() -> None:
    """``out_indices`` set after ``__init__`` on a ``'cls_avg'`` model: an earlier block
    without ``norm_all_outputs`` is refused at forward, as in ``__init__``."""
    model = _vit(out_type='cls_avg').eval()
    model.out_indices = [0, DEPTH - 1]
    with pytest.raises(ValueError, match='norm_all_outputs=True'):
        model(torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize('out_type', ['cls_token', 'raw', 'featmap'])
def test_ln2_normalises_the_avg_featmap_output_only(out_type: str) -> None:
    """Bug (round 15; fails on the code before the fix): ``out_type`` may be changed after
    ``__init__`` (``forward`` re-checks it); a model built with ``avg_featmap_norm=True``
    then switched to another output applied mmpretrain's ``ln2`` to it anyway (a class token
    off by about 1, a ``'featmap'`` map refused by the LayerNorm).  mmpretrain's
    ``VisionTransformer`` with the same weights, switched the same way, is the reference:
    its ``_format_output`` applies ``ln2`` to ``'avg_featmap'`` only."""
    from mmlinvit.converters import load_pretrained
    torch.manual_seed(0)
    ref = mmpretrain_backbones.VisionTransformer(arch=dict(MMP_ARCH), img_size=32,
                                                 patch_size=16, out_type='avg_featmap')
    ref.eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ours = _vit(out_type='avg_featmap', avg_featmap_norm=True).eval()
    load_pretrained(ours, ref.state_dict(), layout='mmpretrain')
    ref.out_type = ours.out_type = out_type
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], ref(x)[0], rtol=1e-5, atol=1e-5)


def test_adventurer_frozen_stem_turns_its_position_dropout_off() -> None:
    """As the ViT's ``drop_after_pos`` (mmpretrain's rule): Adventurer's ``pos_drop`` kept
    training under a frozen stem, so a frozen Adventurer with ``drop_rate > 0`` gave random
    features in training mode."""
    from mmlinvit.backbones import Adventurer
    model = Adventurer(arch=dict(embed_dims=32, num_layers=2), img_size=32, patch_size=16,
                       drop_rate=0.5, frozen_stages=2,
                       mixer_cfg=dict(d_state=8, headdim=16, chunk_size=16)).train()
    assert not model.pos_drop.training
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], model(x)[0], rtol=0, atol=0)


@pytest.mark.parametrize('loader', ['torch', 'mmengine'])
@pytest.mark.parametrize('source_cls', [True, False])
def test_a_class_token_layout_mismatch_is_named_on_load(loader: str, source_cls: bool) -> None:
    """A class-token checkpoint loaded into a model built without one (or the reverse): the
    position-grid hook blamed the file ("inconsistent (edited by hand?)" / "no square grid");
    the error names the class token and the ``with_cls_token`` that loads it, also under
    mmengine's non-strict ``load_state_dict`` (``load_from``), which would otherwise only warn
    and keep the random ``pos_embed``."""
    from mmengine.runner.checkpoint import load_state_dict as mmengine_load
    out = dict(out_type='avg_featmap')
    src = _vit(with_cls_token=source_cls, **out)
    dst = _vit(with_cls_token=not source_cls, **out)
    state = dict(src.state_dict())
    assert ('cls_token' in state) == source_cls
    rows = 4 + int(source_cls)
    with pytest.raises(ValueError, match=rf"class token .*pos_embed: {rows} rows.*"
                       rf"with_cls_token={source_cls}"):
        if loader == 'torch':
            dst.load_state_dict(state)
        else:
            mmengine_load(dst, state, strict=False)
