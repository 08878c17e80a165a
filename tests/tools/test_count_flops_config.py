"""tools/analysis/count_flops.py CONFIG: classification, segmentation and distillation configs.

FLOPs (2 x MACs) are compared with closed forms written here, per layer of a ViT with N tokens,
width D, H heads of width d, MLP width M:  qkv 6 N D^2 + proj 2 N D^2 + MLP 4 N D M, and for
ELU+1 linear attention  phi(K)^T V  2 N d D  +  phi(Q) S  2 N d D  +  normaliser 2 N D;
patch embedding 2 P (3 p^2) D for P patches of p x p pixels.  Inputs are corner-padded to a
multiple of the patch size, so the grid is ceil(H / p) x ceil(W / p) (512 px at patch 14: 37).
"""
import importlib.util
import os.path as osp

import pytest

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _tool():
    spec = importlib.util.spec_from_file_location(
        'mmlinvit_tool_count_flops', osp.join(REPO, 'tools', 'analysis', 'count_flops.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _elu_vit_flops(hw, patch, dims, layers, heads, mlp, prefix=1):
    grid = -(-hw[0] // patch) * -(-hw[1] // patch)
    n, d = grid + prefix, dims // heads
    per_layer = 6 * n * dims**2 + 2 * n * dims**2 + 4 * n * dims * mlp
    per_layer += 4 * n * d * dims + 2 * n * dims
    return layers * per_layer + 2 * grid * 3 * patch * patch * dims


def test_bare_backbone_distillation_config(capsys):
    """AdaLA Stage 1: the student is a bare DINOv2-L/14 ELU+1 backbone at 512 x 512."""
    row = _tool().main([osp.join(
        REPO, 'configs/adala/vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512.py')])
    assert row['part'] == 'student' and row['input'] == (512, 512)
    assert row['flops'] == _elu_vit_flops((512, 512), 14, 1024, 24, 16, 4096)
    out = capsys.readouterr().out
    assert 'FLOPs = 2 x MACs' in out and 'params' in out


def test_classification_distillation_config():
    """DeiT-T ELU+1 ImageClassifier student on CIFAR-10 (10 classes) at 224."""
    tool = _tool()
    row = tool.main([osp.join(REPO, 'configs/copy_mlp_distill_attn/'
                              'copy-mlp-distill-attn_deit-t-elu_8xb64-300e_cifar10-224x224.py')])
    assert row['input'] == (224, 224) and row['part'] == 'student'
    head = 2 * 192 * 10
    assert row['flops'] == _elu_vit_flops((224, 224), 16, 192, 12, 3, 768) + head
    # parameters of the same student built independently through mmpretrain's registry
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    cfg = Config.fromfile(osp.join(
        REPO, 'configs/copy_mlp_distill_attn/'
        'copy-mlp-distill-attn_deit-t-elu_8xb64-300e_cifar10-224x224.py'))
    init_default_scope('mmpretrain')
    student = MODELS.build(cfg.model.student)
    assert row['params'] == sum(p.numel() for p in student.parameters())


def test_segmentation_config_and_shape_override():
    """The demo UPerNet: backbone share follows the closed form, --shape rescales it."""
    tool = _tool()
    cfg = osp.join(REPO, 'configs/demo/upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py')
    row = tool.main([cfg])
    assert row['part'] == 'model' and row['input'] == (64, 64)
    backbone = _elu_vit_flops((64, 64), 8, 64, 4, 4, 128)
    assert row['flops'] > backbone  # neck + UPerNet head on top
    big = tool.main([cfg, '--shape', '128', '96'])
    assert big['input'] == (128, 96)
    assert big['flops'] > row['flops']
    with pytest.raises(SystemExit):
        tool.main(['--shape', '128'])  # --shape needs a CONFIG


def test_mhla_config_counts_on_the_default_meta_device(capsys):
    """MHLA's block bookkeeping needed tensor values ("Tensor.item() cannot be called on meta
    tensors"); its block indices now come from the grid sizes, so the default --device meta
    counts it, equal to a real forward on CPU."""
    config = osp.join(REPO, 'configs/copy_mlp_distill_attn/'
                      'copy-mlp-distill-attn_deit-t-mhla_8xb64-300e_cifar10-224x224.py')
    row = _tool().main([config])
    assert row['device'] == 'meta' and row['flops'] > 0 and row['input'] == (224, 224)
    assert 'real forward' not in capsys.readouterr().err
    assert _tool().main([config, '--device', 'cpu'])['flops'] == row['flops']


def test_value_dependent_shapes_are_counted_on_cpu(capsys):
    """A model that reads tensor values cannot run on meta tensors: counted on CPU, noted."""
    def count(device):
        if device == 'meta':
            raise RuntimeError('Tensor.item() cannot be called on meta tensors')
        return device

    assert _tool().on_meta_or_cpu(count, 'meta', 'x') == ('cpu', 'cpu')
    assert 'counting with a real forward on CPU' in capsys.readouterr().err
