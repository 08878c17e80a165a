"""``out_type='cls_avg'``: DINOv2's linear-evaluation input, against the official code.

DINOv2 trains its linear classifiers (``dinov2/eval/linear.py``, and the hub's
``dinov2_vit*14{,_reg}_lc`` heads) on ``cat([cls_1, ..., cls_n, mean(patch tokens of block
n)])`` over the last n blocks (n = 1 or 4), every block normalised by the final norm and
the registers left out of the mean.  The reference is
``tests/fixtures/dinov2_linear_official_reference.pt``, written by
``tests/fixtures/make_dinov2_linear_reference.py`` from the official
``DinoVisionTransformer`` (random weights, depth 5, without / with 4 registers) through the
official ``create_linear_input`` and ``_LinearClassifierWrapper``.  The weights go through a
real checkpoint file and ``pretrained=``; mmpretrain's ``ImageClassifier`` with a
``LinearClsHead(in_channels=(n + 1) * C)`` then gets the official input as its feature.
"""
import argparse
import os.path as osp
from typing import Dict, List

import pytest
import torch

from mmlinvit.backbones import Adventurer, VisionTransformer
from official_golden import load_generator, load_golden, max_error

TOL = 1e-5
GEN = load_generator('make_dinov2_linear_reference')

pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture(scope='module')
def golden() -> dict:
    return load_golden('dinov2_linear_official_reference.pt')


@pytest.fixture(scope='module')
def checkpoints(golden, tmp_path_factory) -> Dict[str, str]:
    """Each variant's official state dict as a checkpoint file (hub key layout)."""
    root = tmp_path_factory.mktemp('dinov2_linear')
    paths = {}
    for name, variant in golden['variants'].items():
        paths[name] = str(root / f'dinov2_{name}.pth')
        torch.save(variant['state_dict'], paths[name])
    return paths


def last_blocks(n: int) -> List[int]:
    """``out_indices`` of the last n blocks (DINOv2's ``n_last_blocks``)."""
    return list(range(-n, 0))


def build(golden: dict, checkpoints: Dict[str, str], name: str, **kwargs) -> VisionTransformer:
    """mmlinvit's model of a variant: family 'dinov2' defaults, the architecture only."""
    model = VisionTransformer(family='dinov2', pretrained=checkpoints[name],
                              **golden['variants'][name]['mmlinvit_kwargs'], **kwargs)
    model.init_weights()
    return model.eval()


def test_golden_file_matches_its_generator(golden):
    """Inputs re-derive bit-exactly; both official paths agree; registers are really there."""
    assert sorted(golden['variants']) == sorted(GEN.VARIANTS)
    x = GEN.reference_batch()
    for name, variant in golden['variants'].items():
        out = variant['outputs']
        assert x.double().sum().item() == out['input_sum'].item()
        assert variant['hub_kwargs']['num_register_tokens'] == GEN.VARIANTS[name]
        for n in GEN.N_LAST_BLOCKS:
            assert out[f'eval_linear_n{n}'].shape == (2, (n + 1) * GEN.base.EMBED_DIMS)
            assert max_error(out[f'hub_lc_n{n}'], out[f'eval_linear_n{n}']) <= 1e-6
    assert golden['variants']['reg4']['state_dict']['register_tokens'].shape[1] == 4


@pytest.mark.parametrize('n', GEN.N_LAST_BLOCKS)
@pytest.mark.parametrize('name', sorted(GEN.VARIANTS))
def test_cls_avg_matches_official_linear_input(golden, checkpoints, name, n):
    model = build(golden, checkpoints, name, out_type='cls_avg', out_indices=last_blocks(n),
                  norm_all_outputs=True)
    with torch.no_grad():
        outs = model(GEN.reference_batch())
    assert len(outs) == 1  # ONE tensor: what LinearClsHead (feats[-1]) reads
    official = golden['variants'][name]['outputs']
    errors = {key: max_error(outs[0], official[f'{key}_n{n}'])
              for key in ('eval_linear', 'hub_lc')}
    assert max(errors.values()) <= TOL, f'{name} n={n}: {errors}'


def test_registers_excluded_from_the_average(golden, checkpoints):
    """Control: averaging the registers too (or the class token) is off the official input
    by far more than the tolerance (5 of 261 tokens), so the oracle test above sees a wrong
    patch slice."""
    model = build(golden, checkpoints, 'reg4', out_type='raw')
    with torch.no_grad():
        tokens = model.forward_tokens(GEN.reference_batch())[0]
    official_avg = golden['variants']['reg4']['outputs']['eval_linear_n1'][:, GEN.base.EMBED_DIMS:]
    assert max_error(tokens[:, 5:].mean(1), official_avg) <= TOL
    assert max_error(tokens[:, 1:].mean(1), official_avg) > 100 * TOL
    assert max_error(tokens.mean(1), official_avg) > 100 * TOL


@pytest.mark.parametrize('n', GEN.N_LAST_BLOCKS)
def test_image_classifier_gets_the_official_input(golden, checkpoints, n):
    """mmpretrain ImageClassifier + LinearClsHead(in_channels=(n + 1) * C), neck None: the
    head's input is the official linear input, its logits its fc of it; loss and predict run."""
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    from mmpretrain.structures import DataSample

    init_default_scope('mmpretrain')
    dims = GEN.base.EMBED_DIMS
    model = MODELS.build(dict(
        type='ImageClassifier',
        backbone=dict(type='mmlinvit.VisionTransformer', family='dinov2',
                      pretrained=checkpoints['reg4'],
                      **golden['variants']['reg4']['mmlinvit_kwargs'], out_type='cls_avg',
                      out_indices=last_blocks(n), norm_all_outputs=True, frozen_stages=GEN.DEPTH),
        neck=None,
        head=dict(type='LinearClsHead', num_classes=3, in_channels=(n + 1) * dims,
                  loss=dict(type='CrossEntropyLoss', loss_weight=1.0), topk=(1, ))))
    model.init_weights()
    assert model.backbone.load_report is not None
    x = GEN.reference_batch()
    official = golden['variants']['reg4']['outputs'][f'eval_linear_n{n}']

    model.eval()
    with torch.no_grad():
        feats = model.extract_feat(x)
        logits = model(x, mode='tensor')
        preds = model(x, mode='predict')
    assert max_error(feats[-1], official) <= TOL
    assert max_error(logits, model.head.fc(official)) <= TOL
    assert len(preds) == 2 and preds[0].pred_score.shape == (3, )
    assert max_error(torch.stack([p.pred_score for p in preds]), logits.softmax(-1)) <= TOL

    model.train()
    samples = [DataSample().set_gt_label(label) for label in (0, 2)]
    losses = model(x, samples, mode='loss')
    loss = sum(v for k, v in losses.items() if 'loss' in k)
    assert torch.isfinite(loss)
    loss.backward()
    assert model.head.fc.weight.grad is not None and model.head.fc.weight.grad.abs().sum() > 0
    # Frozen probe: stem, blocks and the final norm get no gradient (as mmpretrain's ViT).
    assert all(p.grad is None for p in model.backbone.parameters())


@pytest.mark.parametrize('config', [
    'configs/adala/linear-probe_adala-dinov2-l-elu_64xb16-100e_in1k-512x512.py',
    'configs/adala/linear-head_adala-dinov2-l-elu_64xb16-30e_in1k-512x512.py'])
@pytest.mark.parametrize('n', GEN.N_LAST_BLOCKS)
def test_stage3_configs_with_the_dinov2_protocol_options(config, n):
    """The ``--cfg-options`` that switch the Stage-3 classifiers (ViT-L/14, 24 blocks, 1024
    channels) to DINOv2's linear input build and run (meta device: shapes only)."""
    from mmengine.config import Config, DictAction
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS

    repo = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    cfg = Config.fromfile(osp.join(repo, config))
    options = ['model.backbone.out_type=cls_avg',
               f'model.backbone.out_indices=[{",".join(map(str, last_blocks(n)))}]',
               'model.backbone.norm_all_outputs=True', f'model.head.in_channels={(n + 1) * 1024}']
    parser = argparse.ArgumentParser()  # as tools/train.py reads --cfg-options
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    cfg.merge_from_dict(parser.parse_args(['--cfg-options', *options]).cfg_options)
    init_default_scope('mmpretrain')
    with torch.device('meta'):
        model = MODELS.build(cfg.model)
        logits = model(torch.empty(1, 3, 512, 512), mode='tensor')
    assert model.backbone.out_indices == list(range(24 - n, 24))
    assert logits.shape == (1, 1000)


# ------------------------------------------------------------------------- other layouts
def test_adventurer_class_token_last():
    """Adventurer (class token LAST, patches before it): the same definition through its
    token layout, against a formula on its raw normalised outputs."""
    kwargs = dict(arch=dict(embed_dims=32, num_layers=4), img_size=32,
                  mixer_cfg=dict(d_state=8, headdim=16, chunk_size=16), out_indices=[-2, -1],
                  norm_all_outputs=True)
    torch.manual_seed(0)
    model = Adventurer(out_type='cls_avg', **kwargs).eval()
    raw = Adventurer(out_type='raw', **kwargs).eval()
    raw.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        got, = model(x)
        r2, r3 = raw(x)
    expected = torch.cat([r2[:, -1], r3[:, -1], r3[:, :-1].mean(1)], dim=-1)
    assert got.shape == (2, 3 * 32)
    assert max_error(got, expected) <= 1e-6


def test_unusable_settings_fail_naming_the_fix():
    arch = dict(embed_dims=32, num_layers=3, num_heads=2, mlp_hidden_dims=64)
    # Blocks before the last one read unnormalised: DINOv2 normalises every block.
    with pytest.raises(ValueError, match='norm_all_outputs=True'):
        VisionTransformer(arch, img_size=32, patch_size=8, out_type='cls_avg',
                          out_indices=[-2, -1])
    # No class token: plain ViT without one, MHLA (paper setting) with the check switched off.
    with pytest.raises(ValueError, match="class token.*out_type='avg_featmap'"):
        VisionTransformer(arch, img_size=32, patch_size=8, with_cls_token=False,
                          out_type='cls_avg')
    with pytest.raises(ValueError, match='out_type'):
        VisionTransformer(arch, img_size=32, patch_size=8, attn_cfg='mhla', out_type='cls_avg')
    with pytest.warns(UserWarning), pytest.raises(ValueError, match='has none'):
        VisionTransformer(arch, img_size=32, patch_size=8, attn_cfg='mhla', out_type='cls_avg',
                          check_operator_setting=False)
    # Set after construction: refused at forward.
    model = VisionTransformer(arch, img_size=32, patch_size=8, out_indices=[-2, -1])
    model.out_type = 'cls_avg'
    with pytest.raises(ValueError, match='norm_all_outputs=True'):
        model(torch.randn(1, 3, 32, 32))
    # The last block alone is normalised anyway.
    out, = VisionTransformer(arch, img_size=32, patch_size=8, out_type='cls_avg')(
        torch.randn(1, 3, 32, 32))
    assert out.shape == (1, 64)
