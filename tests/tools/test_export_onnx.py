"""tools/deployment/export_onnx.py: real configs and checkpoint files -> ONNX -> onnxruntime.

Each test saves a checkpoint of a model built from a recipe config (random weights), exports
it with the tool, runs the file with onnxruntime on a NEW input and compares with the PyTorch
model that holds the same weights (built here, independently of the tool).  A model with other
weights must disagree, so the checkpoint was really loaded.
"""
import importlib.util
from pathlib import Path
from typing import List

import pytest
import torch

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')

ROOT = Path(__file__).resolve().parents[2]
STUDENT_SEG = 'configs/demo/upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py'
TEACHER_SEG = 'configs/demo/upernet_vit-tiny-softmax_1xb8-300it_toy-64x64.py'
DISTILL_CLS = ('configs/copy_mlp_distill_attn/'
               'copy-mlp-distill-attn_deit-t-elu_8xb64-300e_cifar10-224x224.py')
ADVENTURER_SEG = 'configs/linearizer/upernet_adventurer-b_8xb2-160k_ade20k-512x512.py'
# `_delete_`: replace the base's size name instead of merging a dict into it.
TINY_ADVENTURER = ["model.backbone.arch={'embed_dims': 64, 'num_layers': 4, '_delete_': True}",
                   "model.backbone.mixer_cfg={'d_state': 16, 'headdim': 32, 'chunk_size': 16}",
                   'model.backbone.out_indices=[0, 1, 2, 3]']


def _tool():
    path = ROOT / 'tools' / 'deployment' / 'export_onnx.py'
    spec = importlib.util.spec_from_file_location('export_onnx_under_test', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(config: str, seed: int, cfg_options=None):
    """The config's model with random weights (pretrained loading removed)."""
    from mmengine.registry import MODELS, init_default_scope

    from mmlinvit.engine.launch import adapt_to_device, load_config
    cfg = load_config(str(ROOT / config), cfg_options)
    init_default_scope(cfg.default_scope)
    for node in ('backbone', 'teacher'):
        if node in cfg.model and 'pretrained' in cfg.model[node]:
            cfg.model[node]['pretrained'] = None
    if cfg.get('data_preprocessor') is not None:
        cfg.model.setdefault('data_preprocessor', cfg.data_preprocessor)
    adapt_to_device(cfg)
    torch.manual_seed(seed)
    model = MODELS.build(cfg.model).eval()
    with torch.no_grad():  # make every weight (norms too) seed-dependent
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model


def _onnx_outputs(path: Path, images: torch.Tensor) -> List[torch.Tensor]:
    import onnxruntime as ort
    session = ort.InferenceSession(str(path), providers=['CPUExecutionProvider'])
    return [torch.from_numpy(o)
            for o in session.run(None, {session.get_inputs()[0].name: images.numpy()})]


def _metadata(path: Path) -> dict:
    """The ``mmlinvit.input.*`` entries of an ONNX file's ``metadata_props``."""
    import json

    import onnx
    props = onnx.load(str(path), load_external_data=False).metadata_props
    return {p.key[len('mmlinvit.input.'):]: json.loads(p.value) for p in props
            if p.key.startswith('mmlinvit.input.')}


def _max_err(got, ref) -> float:
    assert len(got) == len(ref)
    assert all(tuple(a.shape) == tuple(b.shape) for a, b in zip(got, ref))
    return max(float((a - b).abs().max()) for a, b in zip(got, ref))


def test_student_segmentor_exports_whole_and_matches(tmp_path):
    model = _build(STUDENT_SEG, seed=1)
    ckpt = tmp_path / 'iter_200.pth'
    torch.save({'meta': {'iter': 200}, 'state_dict': model.state_dict()}, ckpt)
    out = tmp_path / 'student.onnx'
    info = _tool().main([str(ROOT / STUDENT_SEG), str(ckpt), '--out', str(out), '--shape', '64',
                         '64'])
    assert info['part'] == 'model' and info['backbone'] == 'LinearVisionTransformer'
    assert info['checkpoint_prefix'] == '' and max(info['max_abs_error']) < 1e-4
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = [model(images, None, mode='tensor')]
        other = [_build(STUDENT_SEG, seed=2)(images, None, mode='tensor')]
    got = _onnx_outputs(out, images)
    assert got[0].shape[:2] == (1, 6)  # (B, classes, h, w) decode-head logits
    assert _max_err(got, ref) < 1e-4
    assert _max_err(got, other) > 1e-2
    # the graph takes the preprocessor's output; the file says which (the config's values)
    meta = _metadata(out)
    pre = model.data_preprocessor
    # the preprocessor's fp32 values, written as the shortest decimals that give them back
    assert torch.tensor(meta['mean']).tolist() == pre.mean.flatten().tolist()
    assert torch.tensor(meta['std']).tolist() == pre.std.flatten().tolist()
    # ... the config's own numbers (fp32's 123.67500305175781 was written before)
    assert meta['mean'] == [123.675, 116.28, 103.53] and meta['std'] == [58.395, 57.12, 57.375]
    assert meta['bgr_to_rgb'] is True and meta['pad_to_multiple'] == 8
    assert 'LoadImageFromFile' in meta['prepare'] and 'RGB' in meta['prepare']
    # where to pad (DINOv2 configs pad centred) was not recorded
    assert meta['patch_padding'] == 'corner' and 'bottom / right' in meta['prepare']
    model.patch_padding = 'center'
    _tool()  # puts tools/deployment on sys.path
    from onnx_tools import graph_input_convention
    centred = graph_input_convention(model, model, 'student',
                                     dict(patch_size=8, pads_outside_backbone=True))
    assert centred['patch_padding'] == 'center' and 'split evenly' in centred['prepare']

    # an odd patch grid (9 x 9): the neck's covering 0.5x level exports too
    info = _tool().main([str(ROOT / STUDENT_SEG), str(ckpt), '--out', str(out), '--shape', '72',
                         '72'])
    images = torch.randn(1, 3, 72, 72)
    with torch.no_grad():
        ref = [model(images, None, mode='tensor')]
    assert _max_err(_onnx_outputs(out, images), ref) < 1e-4


def test_softmax_teacher_of_a_distillation_config(tmp_path):
    # The teacher's own checkpoint in the canonical layout (what convert_checkpoint.py writes).
    model = _build(DISTILL_CLS, seed=3)
    teacher = model.teacher
    ckpt = tmp_path / 'deit-t.pth'
    torch.save(teacher.state_dict(), ckpt)
    out = tmp_path / 'teacher.onnx'
    import logging

    from mmengine.logging import MMLogger
    messages: List[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    MMLogger.get_current_instance().addHandler(handler)
    try:
        info = _tool().main([str(ROOT / DISTILL_CLS), str(ckpt), '--which', 'teacher', '--out',
                             str(out), '--shape', '32', '48'])
    finally:
        MMLogger.get_current_instance().removeHandler(handler)
    # it said the teacher "keeps its random initialisation" while exporting CKPT's weights
    assert not [m for m in messages if 'random initialisation' in m], messages
    assert any(f'teacher backbone with the weights of {ckpt}' in m for m in messages), messages
    assert info['which'] == 'teacher' and info['part'] == 'backbone'
    assert info['backbone'] == 'VisionTransformer'
    images = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        ref = list(teacher(images))
    assert _max_err(_onnx_outputs(out, images), ref) < 1e-4
    # the student graph takes CIFAR statistics; the teacher's takes its own (ImageNet)
    meta = _metadata(out)
    assert meta['mean'] == pytest.approx([123.675, 116.28, 103.53])
    assert meta['std'] == pytest.approx([58.395, 57.12, 57.375])
    student_mean = model.data_preprocessor.mean.flatten().tolist()
    assert meta['mean'] != pytest.approx(student_mean)
    # A teacher checkpoint of another size is refused with the keys / shapes named.
    torch.save({k: v[..., :8] if v.ndim else v for k, v in teacher.state_dict().items()},
               tmp_path / 'bad.pth')
    with pytest.raises(SystemExit, match=r'error: .*other shapes.*pos_embed'):
        _tool().main([str(ROOT / DISTILL_CLS), str(tmp_path / 'bad.pth'), '--which', 'teacher',
                      '--out', str(tmp_path / 'bad.onnx'), '--shape', '32', '32'])


def test_adventurer_student_backbone_from_an_exported_backbone_file(tmp_path):
    model = _build(ADVENTURER_SEG, seed=4, cfg_options=dict(
        (item.split('=', 1)[0], eval(item.split('=', 1)[1])) for item in TINY_ADVENTURER))
    ckpt = tmp_path / 'student_backbone.pth'
    # a file from before the training records (flips, position grid) exports as well
    torch.save({k: v for k, v in model.backbone.state_dict().items()
                if k not in model.backbone.TRAINING_RECORDS}, ckpt)
    out = tmp_path / 'adventurer.onnx'
    info = _tool().main([str(ROOT / ADVENTURER_SEG), str(ckpt), '--part', 'backbone', '--out',
                         str(out), '--shape', '48', '64', '--cfg-options', *TINY_ADVENTURER])
    assert info['backbone'] == 'Adventurer' and info['checkpoint_prefix'] == ''
    images = torch.randn(1, 3, 48, 64)
    with torch.no_grad():
        ref = list(model.backbone(images))
    got = _onnx_outputs(out, images)
    assert len(got) == len(ref) == 4  # the four UPerNet feature maps
    assert _max_err(got, ref) < 1e-4


def test_shape_off_the_patch_grid_is_refused(tmp_path):
    """The graph would pad inside the backbone (bottom / right), not as the evaluated
    segmentor does (centred for DINOv2): refused with the nearest valid --shape."""
    with pytest.raises(SystemExit, match=r'multiple of the patch size 8.*--shape 72 64'):
        _tool().main([str(ROOT / STUDENT_SEG), 'none', '--out', str(tmp_path / 'x.onnx'),
                      '--shape', '66', '64'])
    assert not (tmp_path / 'x.onnx').exists()


LINEAR_HEAD_DINOV2 = 'configs/adala/linear-head_adala-dinov2-l-elu_64xb16-30e_in1k-512x512.py'
TINY_DINOV2 = ["model.backbone.arch={'embed_dims': 32, 'num_layers': 2, 'num_heads': 2, "
               "'mlp_hidden_dims': 64, '_delete_': True}", 'model.head.in_channels=32']


def test_classifier_off_the_patch_grid_exports_as_evaluated(tmp_path):
    """A classifier pads a side off the patch grid inside its backbone, as the graph does: the
    AdaLA linear head's own 512 crop at patch 14 was refused (with advice that computes
    another model); now exported, equal to the PyTorch classifier."""
    options = dict((item.split('=', 1)[0], eval(item.split('=', 1)[1])) for item in TINY_DINOV2)
    model = _build(LINEAR_HEAD_DINOV2, seed=5, cfg_options=options)
    ckpt = tmp_path / 'cls.pth'
    torch.save(model.state_dict(), ckpt)
    out = tmp_path / 'cls.onnx'
    info = _tool().main([str(ROOT / LINEAR_HEAD_DINOV2), str(ckpt), '--out', str(out),
                         '--shape', '64', '64', '--cfg-options', *TINY_DINOV2])
    assert info['part'] == 'model' and info['patch_size'] == 14
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = [model(images, None, mode='tensor')]
    assert _max_err(_onnx_outputs(out, images), ref) < 1e-4


def test_mask2former_segmentor_is_refused_with_the_backbone_route():
    """mmseg's Mask2Former head needs data samples in forward (mode='tensor' passes none): a
    bare TypeError before; the check names --part backbone."""
    from mmseg.models.decode_heads import Mask2FormerHead, UPerHead
    path = ROOT / 'tools' / 'deployment' / 'onnx_tools.py'
    spec = importlib.util.spec_from_file_location('onnx_tools_under_test', path)
    onnx_tools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(onnx_tools)

    class Head:
        forward = Mask2FormerHead.forward

    class Plain:
        forward = UPerHead.forward

    assert onnx_tools._needs_data_samples(Head()) and not onnx_tools._needs_data_samples(Plain())


def _runner_checkpoint(config: str, work_dir: Path) -> Path:
    """``iter_1.pth`` written by mmengine's Runner after one training iteration of ``config``
    on generated scenes: a real runner checkpoint, with the pickled message hub (mmengine
    ``HistoryBuffer`` objects) and optimizer state besides the weights."""
    from mmengine.config import Config
    from mmengine.runner import Runner

    from mmlinvit.config_scopes import register_config_scopes
    from mmlinvit.datasets import make_ade20k_layout
    register_config_scopes()
    data_root = str(work_dir / 'toy_ade')
    make_ade20k_layout(data_root, num_train=2, num_val=1, size=(64, 64), seed=1)
    cfg = Config.fromfile(str(ROOT / config))
    cfg.model.backbone.pretrained = None  # the demo's Stage-2 file; not needed here
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = data_root
        cfg[loader].update(batch_size=2, num_workers=0, persistent_workers=False)
    cfg.work_dir = str(work_dir / 'wd')
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=1, val_interval=1000)
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', by_epoch=False, interval=1)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.log_level = 'WARNING'
    cfg.experiment_name = f'export_onnx_runner_ckpt_{work_dir.name}'
    Runner.from_cfg(cfg).train()
    ckpt = work_dir / 'wd' / 'iter_1.pth'
    assert ckpt.is_file()
    return ckpt


def test_runner_checkpoint_exports_without_trust(tmp_path):
    """A real ``iter_N.pth`` of the Runner: plain ``weights_only=True`` refuses its pickled
    message hub; the tool reads it safely (the training state as inert stand-ins),
    without ``--trust-checkpoint``, and the export matches PyTorch."""
    import pickle
    ckpt = _runner_checkpoint(STUDENT_SEG, tmp_path)
    with pytest.raises(pickle.UnpicklingError):  # what a genuine runner checkpoint holds
        torch.load(ckpt, map_location='cpu', weights_only=True)
    out = tmp_path / 'student.onnx'
    args = [str(ROOT / STUDENT_SEG), str(ckpt), '--out', str(out), '--shape', '32', '32']
    info = _tool().main(args)
    assert info['part'] == 'model' and info['checkpoint_prefix'] == ''
    assert max(info['max_abs_error']) < 1e-4
    # Independent reference: the config's model holding the checkpoint's weights (strict).
    model = _build(STUDENT_SEG, seed=5)
    state = torch.load(ckpt, map_location='cpu', weights_only=False)
    assert 'message_hub' in state and 'optimizer' in state
    model.load_state_dict(state['state_dict'], strict=True)
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        ref = [model(images, None, mode='tensor')]
        other = [_build(STUDENT_SEG, seed=6)(images, None, mode='tensor')]
    got = _onnx_outputs(out, images)
    assert _max_err(got, ref) < 1e-4
    assert _max_err(got, other) > 1e-2  # the trained weights were really exported
