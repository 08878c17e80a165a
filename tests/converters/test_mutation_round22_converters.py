"""Mutation round 22 over :mod:`mmlinvit.converters` (``layouts``, ``loading``, ``report``;
``checkpoint_file`` had no survivor that was not equivalent): each test below failed on at
least one single-line change of these modules that the earlier rounds' tests (9, 13, 14, 16,
19, 20, 21, 21b) let pass.

Guarded here, each against an independent reference (timm's ``VisionTransformer`` run in
the test, or values written out by hand):

* ``layouts``: a timm ``pos_embed`` of one row (a 1x1 grid, ``no_embed_class=True``) is a
  square grid, and the file gives timm's own tokens;
* ``loading`` (mismatch messages): exactly 40 shape mismatches are listed with no count line,
  exactly a third of the tensors missing still offers ``strict=False``, the class-token hint
  is only for a checkpoint class token;
* ``report``: ``summarise_keys``'s default of 40 lines, at most 8 dropped keys per reason.
"""
from typing import Dict

import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.converters import CheckpointMismatchError, convert_timm, load_pretrained
from mmlinvit.converters.report import ConversionReport, summarise_keys

from test_mutation_round14_loading_layouts import _randomise
from test_mutation_round20_layouts_loading import _vit

pytestmark = pytest.mark.usefixtures('one_thread')


# --------------------------------------------------------------------------------- layouts


def test_a_one_position_grid_is_a_square_grid() -> None:
    """A timm ViT whose image is one patch (a 1x1 grid) with ``no_embed_class=True`` keeps a
    single ``pos_embed`` row: 1 is a square grid (1x1), 0 rows after the class row is none.
    The file converts (a zero class row prepended) and gives timm's own tokens."""
    timm = pytest.importorskip('timm')
    ref = _randomise(timm.models.vision_transformer.VisionTransformer(
        img_size=8, patch_size=8, embed_dim=16, depth=1, num_heads=2, mlp_ratio=2,
        num_classes=0, no_embed_class=True))
    sd = ref.state_dict()
    assert sd['pos_embed'].shape == (1, 1, 16)
    out, _ = convert_timm(sd)
    assert torch.equal(out['pos_embed'], torch.cat([torch.zeros(1, 1, 16), sd['pos_embed']], 1))
    ours = VisionTransformer(arch=dict(embed_dims=16, num_layers=1, num_heads=2,
                                       mlp_hidden_dims=32),
                             img_size=8, patch_size=8, out_type='raw', norm_eps=1e-6).eval()
    load_pretrained(ours, sd, layout='timm')
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_tokens(x)[0], ref.forward_features(x),
                                   atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------- loading


def _mismatch_message(model: torch.nn.Module, sd: Dict[str, torch.Tensor]) -> str:
    """The message of the :class:`CheckpointMismatchError` that loading ``sd`` raises."""
    with pytest.raises(CheckpointMismatchError) as info:
        load_pretrained(model, sd, layout='timm')
    return str(info.value)


def test_exactly_forty_shape_mismatches_are_all_listed_without_a_count_line() -> None:
    """Up to 40 shape mismatches are listed in full; the "... and N more" line is only for
    more than 40 (41 here; written out by hand)."""
    model = _vit(dict(num_layers=3))
    other = _vit(dict(num_layers=3, embed_dims=32, num_heads=2, mlp_hidden_dims=64)).state_dict()
    keys = [k for k, v in model.state_dict().items()
            if k in other and other[k].shape != v.shape and k != 'pos_embed']
    assert len(keys) >= 41
    msg = _mismatch_message(model, {k: other[k] for k in keys[:40]})
    assert 'shape mismatches (40):' in msg and '... and' not in msg
    msg = _mismatch_message(model, {k: other[k] for k in keys[:41]})
    assert 'shape mismatches (41):' in msg and '  ... and 1 more' in msg


def test_fix_line_of_a_third_of_the_weights_missing_still_offers_strict_false() -> None:
    """The "strict=False would leave N tensors at their initialisation" warning is for MORE
    than a third of the model's tensors missing; exactly a third still offers strict=False
    (the count and the threshold written out by hand)."""
    model = _vit(num_reg_tokens=1, with_mask_token=True)
    full = model.state_dict()  # 24 tensors
    required = [k for k in full if k not in model.OPTIONAL_CHECKPOINT_KEYS
                and k not in model.TRAINING_RECORDS]
    third = len(full) // 3
    assert len(full) % 3 == 0 and len(required) > third + 1
    for missing, warned in ((third, False), (third + 1, True)):
        sd = {k: v for k, v in full.items() if k not in required[-missing:]}
        msg = _mismatch_message(model, sd)
        assert f'missing keys ({missing})' in msg
        assert ('strict=False would leave' in msg) is warned, msg
        assert ('or load with strict=False to skip missing' in msg) is not warned, msg


def test_class_token_hint_only_for_a_checkpoint_class_token() -> None:
    """The hint to build the model with a class token is for a checkpoint that HAS one (it is
    then unexpected); a model without a class token that misses other weights gets no such
    hint."""
    model = _vit(with_cls_token=False, pos_embed_type='learned', check_operator_setting=False)
    assert model.cls_token is None
    sd = dict(model.state_dict())
    del sd['norm.weight']
    msg = _mismatch_message(model, sd)
    assert 'missing keys (1): norm.weight' in msg
    assert 'the checkpoint has a class token' not in msg


# ---------------------------------------------------------------------------------- report


def test_summarise_keys_shows_forty_lines_by_default() -> None:
    """The default ``limit`` is 40 lines: 41 keys that do not group give 40 of them and a
    count of the one left out (written out by hand)."""
    keys = [f'key{i:02d}' for i in range(41)]
    assert summarise_keys(keys) == keys[:40] + ['... and 1 more']
    assert summarise_keys(keys[:40]) == keys[:40]


def test_format_lists_at_most_eight_dropped_keys_per_reason() -> None:
    """Each drop reason lists at most 8 keys, then counts the rest (written out by hand)."""
    report = ConversionReport(source_layout='timm')
    for i in range(9):
        report.drop(f'decoder_k{i}', 'MAE decoder')
    shown = ', '.join(f'decoder_k{i}' for i in range(8))
    assert report.format().splitlines()[-1] == f'  MAE decoder: {shown}, ... and 1 more'
