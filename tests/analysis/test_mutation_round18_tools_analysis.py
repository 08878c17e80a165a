"""Mutation round 18 over the analysis helpers and tools that earlier rounds left partly open.

Each test checks behaviour against a reference that does not run the code under test:
values worked out by hand, modules built independently through their own constructors or
the OpenMMLab registries, the official DINOv2 golden outputs of ``tests/fixtures`` and the
documented recipes (docstrings).  Guarded here:

* ``mmlinvit.analysis.feature_pca``: float32 features of a double model, the (h, w) order of
  a non-square patch grid, the out-of-range message naming the depth, three components by
  default, colour ranges of features a hundred thousand times smaller than one;
* ``mmlinvit.analysis.compared_models``: the ViT-B/16 pair (DeiT family, Adventurer-B), the
  DINOv2 family and the 14-pixel patches reaching the ViT-L/14 pair's models;
* ``mmlinvit.analysis.digits_distill``: the cosine factor when the warm-up is every step, the
  student's documented recipe (AdamW lr / decay over student and head, clip 3, label
  smoothing 0.1, warm-up of a tenth with at least one step), the score in percent and the
  mean block gap, seeding of the student, the teacher's one-cycle steps over a partial last
  batch and its eval mode;
* ``tools/model_converters/convert_checkpoint.py``: exit code 1 and a message for each error
  kind, the official DINOv2 block-chunked layout converted by the CLI giving the official
  model's tokens;
* ``tools/analysis/count_flops.py``: integer ``crop_size``, ``--cfg-options``, CenterCrop
  ``size``, capitalised meta errors, ``--device cpu`` counting on CPU, the counted token
  table of ViT-B/16 against FLOPs counted by hand;
* ``tools/analysis/model_index.py``: labels of other backbones, empty checkpoint paths,
  ``load_from`` and the transfer type, default operators of the ViT classes (read from their
  constructors), collection keys, duplicate index entries, README markers, stale metafiles;
* ``tools/analysis/train_memory.py``: the documented defaults, the ``vs no-cp`` reference row
  (same crop and precision, no error), error rows of timed-out / failed children, the CUDA
  check, non-string ``type`` entries.
"""
import argparse
import inspect
import os
import os.path as osp
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest
import torch
import torch.nn as nn

from mmlinvit.analysis import digits_distill
from mmlinvit.analysis.compared_models import COMPARED_MODELS
from mmlinvit.analysis.feature_pca import patch_features, pca_rgb, principal_components
from mmlinvit.backbones import LinearVisionTransformer, VisionTransformer
from mmlinvit.utils.cli import load_script

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TINY = dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32)
DEMO_ELU = 'configs/demo/upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py'


def _tool(rel: str, name: str) -> Any:
    """A tool script loaded as a module under a name of this file."""
    return load_script(osp.join(REPO, rel), f'_round18_{name}')


# ----------------------------------------------------------------------------- feature_pca
def test_patch_features_are_float32_in_row_major_grid_order() -> None:
    """A double model on a 16 x 24 image (2 x 3 patches of 8): float32 features whose
    [i, j] entry is patch token 1 + 3 i + j (row-major, after the class token)."""
    torch.manual_seed(0)
    model = VisionTransformer(TINY, attn_cfg='softmax', img_size=32, patch_size=8).double()
    model.eval()
    images = torch.randn(1, 3, 16, 24, dtype=torch.float64)
    with torch.no_grad():
        tokens, hw = model.forward_tokens(images)
    assert tuple(hw) == (2, 3)
    feats = patch_features(model, images)
    assert feats.dtype == torch.float32 and feats.shape == (1, 2, 3, 16)
    for i in range(2):
        for j in range(3):
            torch.testing.assert_close(feats[0, i, j], tokens[0, 1 + 3 * i + j].float())


def test_patch_features_layer_equal_to_the_depth_is_refused_by_name() -> None:
    model = VisionTransformer(TINY, attn_cfg='softmax', img_size=32, patch_size=8).eval()
    with pytest.raises(IndexError, match='layer 2 is out of range for a model with 2 blocks'):
        patch_features(model, torch.randn(1, 3, 16, 16), layer=2)


def _axes_points(scale: float) -> torch.Tensor:
    """(+-3, 0, 0), (0, +-2, 0), (0, 0, +-1) times ``scale`` around 5 ``scale``: components
    e1, e2, e3 with variance ratios 18 : 8 : 2."""
    pts = torch.tensor([[3., 0, 0], [-3, 0, 0], [0, 2, 0], [0, -2, 0], [0, 0, 1], [0, 0, -1]])
    return ((pts + 5) * scale).reshape(1, 2, 3, 3)


def test_principal_components_in_double_precision_match_sklearn() -> None:
    """Features far from the origin (offset 3000, spread 0.01 .. 1e-4, float32 input): the
    components and variance ratios of scikit-learn's float64 PCA of the same values (a
    float32 SVD is off by about 2e-4 here)."""
    from sklearn.decomposition import PCA
    gen = torch.Generator().manual_seed(0)
    spread = torch.tensor([8., 4, 2, 1, .5, .25, .1, .05], dtype=torch.float64)
    x = (3000 + 1e-2 * torch.randn(400, 8, generator=gen, dtype=torch.float64) * spread).float()
    ref = PCA(n_components=3, svd_solver='full').fit(x.double().numpy())
    _, comps, ratio = principal_components(x, 3)
    np.testing.assert_allclose(comps.numpy(), ref.components_, atol=2e-5, rtol=0)
    np.testing.assert_allclose(ratio.numpy(), ref.explained_variance_ratio_, atol=2e-6, rtol=0)


def test_principal_components_default_to_three() -> None:
    _, comps, ratio = principal_components(_axes_points(1.0))
    torch.testing.assert_close(comps, torch.eye(3))
    torch.testing.assert_close(ratio, torch.tensor([18., 8., 2.]) / 28)


def test_pca_rgb_colours_features_of_scale_1e_minus_5() -> None:
    """The colour of a point is (x + 3) / 6, (y + 2) / 4, (z + 1) / 2 of the centred point
    whatever the scale of the features (spans of 6e-5 .. 2e-5 are real spans)."""
    rgb, _, _ = pca_rgb(_axes_points(1e-5))
    expected = torch.tensor([[1.0, 0.5, 0.5], [0.0, 0.5, 0.5], [0.5, 1.0, 0.5],
                             [0.5, 0.0, 0.5], [0.5, 0.5, 1.0], [0.5, 0.5, 0.0]])
    torch.testing.assert_close(rgb.reshape(6, 3), expected, atol=1e-3, rtol=0)


# ----------------------------------------------------------------------------- compared_models
def _shapes(model: nn.Module) -> Dict[str, Tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_vit_b16_pair_is_deit_b16_and_adventurer_b() -> None:
    """ViT-B/16 (DeiT): the model of a DeiT ViT-B/16 built here; Adventurer-B: 12 blocks of
    width 768 (Adventurer paper, Base)."""
    pair = COMPARED_MODELS['vit-b16']
    assert pair.label == 'ViT-B/16' and pair.patch_size == 16
    with torch.device('meta'):
        vit = pair.build_vit('softmax')
        ref = VisionTransformer('b', family='deit', attn_cfg='softmax')
        adventurer = pair.build_adventurer(pair.patch_size)
    assert _shapes(vit) == _shapes(ref)
    assert vit.patch_size == 16 and vit.num_prefix_tokens == 1
    assert adventurer.embed_dims == 768 and len(adventurer.layers) == 12
    assert adventurer.patch_size == 16


def test_vit_l14_pair_builds_dinov2_models_with_14_pixel_patches() -> None:
    pair = COMPARED_MODELS['vit-l14']
    with torch.device('meta'):
        vit = pair.build_vit('elu')
        ref = VisionTransformer('l', family='dinov2', attn_cfg='elu')
        adventurer = pair.build_adventurer(pair.patch_size)
    assert pair.patch_size == 14 and vit.patch_size == 14
    assert _shapes(vit) == _shapes(ref)  # layer scale, mask token, 37 x 37 position grid
    assert adventurer.patch_size == 14
    assert tuple(adventurer.state_dict()['patch_embed.proj.weight'].shape)[-2:] == (14, 14)


# ----------------------------------------------------------------------------- digits_distill
def test_cosine_factor_when_the_warm_up_is_every_step() -> None:
    """total == warmup == 1 (run_digits with iters=1): 1/1 for step 0, then the cosine at
    progress 0 (factor 1) instead of a division by zero."""
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = digits_distill.cosine_schedule(opt, total=1, warmup=1)
    lrs = [opt.param_groups[0]['lr']]
    opt.step()
    sched.step()
    lrs.append(opt.param_groups[0]['lr'])
    assert lrs == [1.0, 1.0]


def _digits_data(num: int = 16) -> dict:
    """A random-weight digits teacher and ``num`` distinct grey images."""
    torch.manual_seed(0)
    teacher = VisionTransformer(attn_cfg='softmax', **digits_distill.DIGITS_VIT).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    x = (torch.arange(num, dtype=torch.uint8) * 10)[:, None, None, None].expand(num, 3, 32, 32)
    return dict(teacher=teacher, x_student=x.clone(), y_student=torch.arange(num) % 10,
                x_test=x[:4].clone(), y_test=torch.arange(4))


def test_run_digits_follows_its_documented_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_digits' docstring: AdamW lr 2e-3, wd 0.05 (student and head), clip 3, label
    smoothing 0.1, warm-up over a tenth of the steps (at least one); the score is the held-out
    accuracy in percent, ``attn_rel_gap`` the mean over blocks."""
    seen: Dict[str, Any] = {}
    real_adamw, real_clip = torch.optim.AdamW, nn.utils.clip_grad_norm_
    real_ce, real_schedule = nn.functional.cross_entropy, digits_distill.cosine_schedule

    def adamw(params: List[nn.Parameter], **kwargs: Any) -> torch.optim.Optimizer:
        params = list(params)
        seen['adamw'] = (len(params), kwargs)
        return real_adamw(params, **kwargs)

    def clip(params: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.setdefault('clip', set()).add(max_norm)
        return real_clip(params, max_norm, *args, **kwargs)

    def cross_entropy(*args: Any, **kwargs: Any) -> torch.Tensor:
        seen.setdefault('smoothing', set()).add(kwargs.get('label_smoothing', 0.0))
        return real_ce(*args, **kwargs)

    def schedule(optimizer: torch.optim.Optimizer, total: int, warmup: int) -> Any:
        seen.setdefault('schedule', []).append((total, warmup))
        return real_schedule(optimizer, total, warmup)

    monkeypatch.setattr(torch.optim, 'AdamW', adamw)
    monkeypatch.setattr(nn.utils, 'clip_grad_norm_', clip)
    monkeypatch.setattr(nn.functional, 'cross_entropy', cross_entropy)
    monkeypatch.setattr(digits_distill, 'cosine_schedule', schedule)
    monkeypatch.setattr(digits_distill, 'digits_accuracy', lambda *args: 0.25)
    monkeypatch.setattr(digits_distill, 'attention_output_stats',
                        lambda student, teacher, x: ([1.0] * 4, [0.1, 0.2, 0.3, 0.6]))
    out = digits_distill.run_digits(_digits_data(), 'random', None, 0, 'elu', 3, 8)
    student = LinearVisionTransformer(attn_cfg='elu', **digits_distill.DIGITS_VIT)
    num_params = len(list(student.parameters())) + 2  # + the head's weight and bias
    count, kwargs = seen['adamw']
    assert count == num_params
    assert kwargs['lr'] == 2e-3 and kwargs['weight_decay'] == 0.05
    assert seen['clip'] == {3.0} and seen['smoothing'] == {0.1}
    assert seen['schedule'] == [(3, 1)]  # 3 // 10 = 0 -> at least one warm-up step
    assert out['score'] == 25.0 and out['attn_rel_gap'] == pytest.approx(0.3)
    assert out['loss'] is None


def test_run_digits_results_depend_only_on_its_seed() -> None:
    """The seed fixes the student and the batches: whatever the global RNG state before the
    call, the same seed gives the same student (its attention gap to the teacher)."""
    data = _digits_data()
    gaps = []
    for outside in (1, 2):
        torch.manual_seed(outside)
        torch.rand(outside)
        gaps.append(digits_distill.run_digits(data, 'random', None, 5, 'elu', 1, 8)
                    ['attn_rel_gap'])
    assert gaps[0] == gaps[1]


def test_train_digits_teacher_steps_over_a_partial_last_batch_and_returns_eval() -> None:
    """10 images in batches of 4: 3 optimizer steps per epoch (the last batch has 2), all
    inside the one-cycle schedule; the teacher and head come back in eval mode."""
    x = torch.randint(0, 256, (10, 3, 32, 32), generator=torch.Generator().manual_seed(0),
                      dtype=torch.uint8)
    backbone, head = digits_distill.train_digits_teacher(x, torch.arange(10), epochs=1,
                                                         batch_size=4)
    assert not backbone.training and not head.training


# ----------------------------------------------------------------------------- convert_checkpoint
@pytest.fixture(scope='module')
def convert() -> Any:
    return _tool('tools/model_converters/convert_checkpoint.py', 'convert_checkpoint')


def test_convert_errors_exit_1_with_a_message(convert: Any, tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    """Missing file (OSError), unknown layout (ValueError), an option the layout does not
    take (TypeError), keys the layout lacks (KeyError): exit 1, ``error:`` on stderr, nothing
    written."""
    dst = str(tmp_path / 'out.pth')
    unknown = str(tmp_path / 'unknown.pth')
    torch.save({'foo.weight': torch.zeros(1)}, unknown)
    timm_like = str(tmp_path / 'timm.pth')
    torch.save({'cls_token': torch.zeros(1, 1, 8), 'pos_embed': torch.zeros(1, 5, 8),
                'patch_embed.proj.weight': torch.zeros(8, 3, 4, 4)}, timm_like)
    cases = [([str(tmp_path / 'missing.pth'), dst], 'does not exist'),
             ([unknown, dst], 'Cannot detect the layout'),
             ([timm_like, dst, '--layout', 'timm', '--keep-projection'], 'keep_projection')]
    for argv, message in cases:
        assert convert.main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith('error: ') and message in err, err
        assert not os.path.exists(dst)


def test_convert_official_dinov2_block_chunks_gives_the_official_tokens(
        convert: Any, tmp_path: Path) -> None:
    """The official DINOv2 training layout (``blocks.<chunk>.<i>.``, ``block_chunks=2``) of
    the golden file, converted by the CLI with layout detection: the canonical file loads into
    the family-default model and reproduces the official model's tokens at 224."""
    import sys
    sys.path.insert(0, osp.join(REPO, 'tests'))
    try:
        from official_golden import load_generator, load_golden
    finally:
        sys.path.remove(osp.join(REPO, 'tests'))
    gen = load_generator('make_dinov2_reference')
    variant = load_golden('dinov2_official_reference.pt')['variants']['chunked']
    src, dst = str(tmp_path / 'chunked.pth'), str(tmp_path / 'sub' / 'canonical.pth')
    torch.save(variant['state_dict'], src)
    assert convert.main([src, dst]) == 0
    saved = torch.load(dst, weights_only=True)
    assert saved['meta']['source_layout'] == 'dinov2'
    model = VisionTransformer(family='dinov2', pretrained=dst, out_type='raw',
                              **variant['mmlinvit_kwargs'])
    model.init_weights()
    model.eval()
    x = gen.reference_input(224, 224, gen.input_seed(224, 224))
    with torch.no_grad():
        tokens = model.forward_tokens(x)[0]
    expected = variant['outputs']['tokens_224x224']
    assert (tokens - expected).abs().max().item() <= 1e-5


# ----------------------------------------------------------------------------- count_flops
@pytest.fixture(scope='module')
def count_flops() -> Any:
    return _tool('tools/analysis/count_flops.py', 'count_flops')


def test_count_flops_integer_crop_size_and_centre_crop_size(count_flops: Any) -> None:
    from mmengine.config import Config
    assert count_flops.config_input_size(Config(dict(crop_size=64))) == (64, 64)
    assert count_flops.config_input_size(Config(dict(crop_size=[48, 80]))) == (48, 80)
    # mmpretrain's CenterCrop (not only RandomCrop) names the crop: its real output size
    import mmpretrain.datasets  # noqa: F401  (registers the transforms)
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import TRANSFORMS
    step = dict(type='CenterCrop', crop_size=96)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        out = TRANSFORMS.build(dict(step))(dict(img=np.zeros((120, 150, 3), np.uint8)))
    pipeline = [dict(type='LoadImageFromFile'), step]
    assert count_flops._pipeline_crop(pipeline) == out['img'].shape[:2] == (96, 96)


def test_count_flops_falls_back_on_capitalised_meta_errors(count_flops: Any,
                                                           capsys: pytest.CaptureFixture) -> None:
    """``torch.unique`` has no Meta kernel; torch says so with a capital M ("... with Meta
    tensors"): the count is redone on CPU, as for ``.item()``."""
    def count(device: str) -> Tuple[int, str]:
        values = torch.unique(torch.tensor([3, 1, 3], device=device))
        return int(values.numel()), device

    assert count_flops.on_meta_or_cpu(count, 'meta', 'unique') == ((2, 'cpu'), 'cpu')
    assert 'counting with a real forward on CPU' in capsys.readouterr().err
    assert count_flops.on_meta_or_cpu(lambda device: device, 'cpu', 'x') == ('cpu', 'cpu')


def test_count_flops_falls_back_when_a_model_converts_a_meta_tensor_to_numpy(
        count_flops: Any) -> None:
    """FINDING (round 18, failed before the fix: TypeError passed through): a forward that
    reads values through numpy (``t.numpy()``, ``np.asarray(t)``) raises torch's
    ``TypeError: can't convert meta device type tensor to numpy`` on meta tensors, which
    ``on_meta_or_cpu`` lets through instead of counting on CPU as its docstring promises for
    models whose shapes depend on tensor values."""
    def count(device: str) -> int:
        return int(torch.ones(3, device=device).numpy().sum())

    assert count_flops.on_meta_or_cpu(count, 'meta', 'numpy') == (3, 'cpu')


def test_count_flops_cfg_options_reach_the_count(count_flops: Any) -> None:
    """``--cfg-options crop_size=32`` counts the demo at 32 x 32 (its crop is 64)."""
    row = count_flops.main([osp.join(REPO, DEMO_ELU), '--cfg-options', 'crop_size=32'])
    assert row['input'] == (32, 32)


def test_count_flops_table_counts_vit_b16_by_hand(count_flops: Any) -> None:
    """ViT-B/16 at 32 x 32: 4 patches + class token = 5 tokens, width 768, 12 blocks.  By
    hand (FLOPs = 2 MACs): patch conv 2 * 4 * 768 * 768, per block the GEMMs 24 N D^2 and
    softmax attention 4 N^2 D (QK^T and AV); ELU+1 attention 4 N d D with d = 64, plus
    the normaliser 2 N D."""
    n, d, depth, head = 5, 768, 12, 64
    patch = 2 * 4 * (3 * 16 * 16) * d
    softmax = patch + depth * (24 * n * d * d + 4 * n * n * d)
    elu = patch + depth * (24 * n * d * d + 4 * n * head * d + 2 * n * d)
    rows = count_flops.main(['--models', 'vit-b16', '--sizes', '32', '--operators', 'softmax',
                             'elu', '--no-adventurer'])
    assert [(r['operator'], r['counted'], r['tokens']) for r in rows] == [
        ('softmax', softmax, n), ('elu', elu, n)]
    assert rows[0]['ratio_counted'] == 1.0
    assert rows[1]['ratio_counted'] == pytest.approx(softmax / elu)


# ----------------------------------------------------------------------------- model_index
@pytest.fixture(scope='module')
def model_index() -> Any:
    return _tool('tools/analysis/model_index.py', 'model_index')


def test_model_index_labels_of_other_backbones(model_index: Any) -> None:
    """Default patch of an Adventurer and default operators of the ViT classes as their
    constructors define them; other backbones by their type name, '-' for no backbone."""
    from mmlinvit.backbones.adventurer import Adventurer
    patch = inspect.signature(Adventurer.__init__).parameters['patch_size'].default
    assert model_index._backbone_label(dict(type='mmlinvit.Adventurer', arch='b')) == \
        f'Adventurer-B/{patch}'
    assert model_index._backbone_label(dict(type='mmpretrain.ResNet'), True) == \
        'ResNet (random init)'
    assert model_index._backbone_label(dict(type='mmpretrain.ResNet')) == 'ResNet'
    assert model_index._backbone_label(None) == '-'
    for cls in (VisionTransformer, LinearVisionTransformer):
        default = inspect.signature(cls.__init__).parameters['attn_cfg'].default
        assert model_index._operator_label(dict(type=f'mmlinvit.{cls.__name__}')) == default
    assert model_index._operator_label(dict(type='mmpretrain.ResNet')) == '-'
    assert model_index._operator_label(dict(type='mmlinvit.Adventurer')) == 'mamba2'


def test_model_index_weights_read_and_random_init(model_index: Any) -> None:
    from mmengine.config import Config
    assert not model_index._reads_weights(dict(pretrained=''))
    assert model_index._checkpoints(Config(dict(model=dict(backbone=dict(pretrained=''))))) == []
    student = dict(type='ImageClassifier', backbone=dict(type='mmlinvit.VisionTransformer'))
    plain = Config(dict(model=student))
    assert model_index._deployed_backbone_random(plain, plain.model, student,
                                                 student['backbone'])
    resumed = Config(dict(model=student, load_from='run.pth'))
    assert not model_index._deployed_backbone_random(resumed, resumed.model, student,
                                                     student['backbone'])
    for transfer, random in (('random', True), ('copy_all', False)):
        model = dict(type='mmlinvit.DistillationModel', student=student,
                     weight_transfer=dict(type=transfer))
        cfg = Config(dict(model=model))
        assert model_index._deployed_backbone_random(cfg, model, student,
                                                     student['backbone']) is random


def _distill_cfg(**model: Any) -> Any:
    from mmengine.config import Config
    student = dict(type='ImageClassifier',
                   backbone=dict(type='mmlinvit.LinearVisionTransformer', arch='t'))
    teacher = dict(type='ImageClassifier',
                   backbone=dict(type='mmlinvit.VisionTransformer', arch='s', family='deit'))
    return Config(dict(default_scope='mmpretrain', crop_size=32,
                       model=dict(type='mmlinvit.DistillationModel', student=student,
                                  teacher=teacher, weight_transfer=dict(type='copy_all'),
                                  **model)))


def test_model_index_describe_distillation_teacher_and_scope(model_index: Any) -> None:
    """Without distill losses a DistillationModel only transfers weights; the teacher of a
    task model is named by its backbone; other scopes are refused."""
    from mmengine.config import Config
    plain = model_index.describe('configs/x/a.py', _distill_cfg())
    assert plain['Distillation'] is False
    assert plain['Teacher'] == 'DeiT ViT-S/16 (softmax)'
    assert plain['Student'] == 'DeiT ViT-T/16' and plain['Operator'] == 'elu'
    losses = model_index.describe('configs/x/a.py',
                                  _distill_cfg(distill_losses=dict(attn=dict(type='MSE'))))
    assert losses['Distillation'] is True
    with pytest.raises(ValueError, match='not one of'):
        model_index.describe('configs/x/a.py',
                             Config(dict(default_scope='mmdet', crop_size=32,
                                         model=dict(type='X'))))


def test_model_index_collection_keys(model_index: Any) -> None:
    assert model_index.collection_key('configs/adala_dinov2_ade20k.py') == 'adala'
    assert model_index.collection_key('configs/demo/x.py') == 'demo'
    with pytest.raises(KeyError, match='ROOT_PREFIXES'):
        model_index.collection_key('configs/other_recipe.py')
    with pytest.raises(KeyError, match='COLLECTIONS'):
        model_index.collection_key('configs/unknown/x.py')


def test_model_index_duplicates_and_readme_markers(model_index: Any, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml
    for name in ('a', 'b'):
        (tmp_path / name).mkdir()
        with open(tmp_path / name / 'metafile.yml', 'w') as f:
            yaml.safe_dump(dict(Models=[dict(Config='configs/demo/x.py', Metadata={})]), f)
    with open(tmp_path / 'model-index.yml', 'w') as f:
        yaml.safe_dump(dict(Import=['a/metafile.yml', 'b/metafile.yml']), f)
    monkeypatch.setattr(model_index, 'REPO', str(tmp_path))
    monkeypatch.setattr(model_index, 'INDEX_FILE', str(tmp_path / 'model-index.yml'))
    with pytest.raises(ValueError, match='listed twice'):
        model_index.read_index()
    readme = tmp_path / 'README.md'
    readme.write_text(f'head\n{model_index.TABLE_START}\nold table\n')  # no end marker
    monkeypatch.setattr(model_index, 'README', str(readme))
    with pytest.raises(KeyError, match='markers'):
        model_index.write_readme_table([])
    assert readme.read_text() == f'head\n{model_index.TABLE_START}\nold table\n'


# ----------------------------------------------------------------------------- train_memory
@pytest.fixture(scope='module')
def train_memory() -> Any:
    return _tool('tools/analysis/train_memory.py', 'train_memory')


def test_train_memory_documented_defaults(train_memory: Any) -> None:
    """Batch 2 (the recipes' per-GPU batch), fp32 and bf16, with_cp off and on."""
    args = train_memory.parse_args(['c.py'])
    assert args.batch == 2 and args.precision == ['fp32', 'bf16']
    assert args.with_cp == ['off', 'on'] and args.crop is None and args.device == 'cpu'


def test_train_memory_vs_no_cp_takes_the_row_of_the_same_crop_and_precision(
        train_memory: Any, capsys: pytest.CaptureFixture) -> None:
    """Per image: fp32 off 100, fp32 on 50, bf16 off (failed), bf16 on 30, crop 32 off 80,
    crop 32 on 20: ratios 1.00x, 0.50x, -, 0.25x (the failed row is no reference); the
    failed row shows its error."""
    base = dict(config='c.py', params_mib=1.0, optimizer_mib=2.0, step_s=1.0)
    rows = [dict(base, crop=64, precision='fp32', with_cp=False, per_image_mib=100.0),
            dict(base, crop=64, precision='fp32', with_cp=True, per_image_mib=50.0),
            dict(config='c.py', crop=64, precision='bf16', with_cp=False, error='boom-oom'),
            dict(base, crop=64, precision='bf16', with_cp=True, per_image_mib=30.0),
            dict(base, crop=32, precision='fp32', with_cp=False, per_image_mib=80.0),
            dict(base, crop=32, precision='fp32', with_cp=True, per_image_mib=20.0)]
    train_memory.print_table(rows)
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.split()[5] for line in lines] == ['1.00x', '0.50x', '-', '-', '1.00x', '0.25x']
    assert lines[2].split()[4] == 'boom-oom'


def test_train_memory_child_failures_become_error_rows(train_memory: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    args = argparse.Namespace(threads=1, case_timeout=7.0)
    spec = dict(config='c.py', crop=64, precision='fp32', with_cp=True)

    def timeout(cmd: List[str], *a: Any, **k: Any) -> dict:
        raise subprocess.TimeoutExpired(cmd, 7.0)

    monkeypatch.setattr(train_memory, 'run_json_child', timeout)
    assert train_memory.run_case_subprocess(args, spec) == dict(spec, error='timeout after 7 s')

    def failed(cmd: List[str], *a: Any, **k: Any) -> dict:
        raise RuntimeError('exit 1: ' + 'x' * 300)

    monkeypatch.setattr(train_memory, 'run_json_child', failed)
    row = train_memory.run_case_subprocess(args, spec)
    assert row == dict(spec, error=('exit 1: ' + 'x' * 300)[:200])


def test_train_memory_refuses_cuda_without_cuda(train_memory: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    with pytest.raises(SystemExit, match='torch.cuda.is_available'):
        train_memory.main(['c.py', '--device', 'cuda'])


def test_model_index_generate_removes_stale_metafiles(model_index: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A metafile of a directory without model configs any more is deleted; the demo
    collection (no paper) is written without a ``Paper`` key."""
    import shutil

    import yaml
    (tmp_path / 'configs' / 'demo').mkdir(parents=True)
    (tmp_path / 'configs' / 'gone').mkdir()
    (tmp_path / 'configs' / 'gone' / 'metafile.yml').write_text('Models: []\n')
    demo = sorted(osp.relpath(p, REPO) for p in
                  Path(REPO, 'configs', 'demo').glob('*.py'))  # the ELU demo inherits
    for config in demo:
        shutil.copy(osp.join(REPO, config), tmp_path / config)
    os.symlink(osp.join(REPO, 'configs', '_base_'), tmp_path / 'configs' / '_base_')
    os.symlink(osp.join(REPO, 'tools'), tmp_path / 'tools')
    (tmp_path / 'README.md').write_text(f'{model_index.TABLE_START}\n{model_index.TABLE_END}\n')
    for name, value in (('REPO', str(tmp_path)), ('CONFIG_ROOT', str(tmp_path / 'configs')),
                        ('INDEX_FILE', str(tmp_path / 'model-index.yml')),
                        ('README', str(tmp_path / 'README.md'))):
        monkeypatch.setattr(model_index, name, value)
    monkeypatch.setattr(model_index, 'count', lambda config, cfg: (1, 2, 'fake'))
    model_index.generate()
    assert not (tmp_path / 'configs' / 'gone' / 'metafile.yml').exists()
    with open(tmp_path / 'configs' / 'demo' / 'metafile.yml') as f:
        doc = yaml.safe_load(f)
    assert doc['Collections'] == [dict(Name='mmlinvit demo')]
    assert DEMO_ELU in [m['Config'] for m in doc['Models']]
