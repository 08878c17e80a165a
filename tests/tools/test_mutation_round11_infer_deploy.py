"""Mutation round 11: tools/infer.py, tools/deployment/{export_onnx,onnx_tools,benchmark_onnx}.py
and tools/linearize.py against independent oracles.

* Segmentation: the tool's label maps against mmseg's own ``init_model`` + ``inference_model``
  (whole, slide and a resizing test pipeline) on a non-square real photograph, its overlays
  against the blending rule of mmseg's ``SegLocalVisualizer`` computed by hand, palettes
  against mmseg's ``BaseSegDataset``.
* Classification: the top-k against mmpretrain's own ``ImageClassificationInferencer``.
* ONNX: the exported graph followed by the recipe written into the file's metadata against
  mmseg's ``inference_model``; ``max_abs_errors`` and the tolerance by hand.
* linearize: options that reach the student (``--norm-eps``, ``--seed``) checked on the
  rebuilt student.
"""
import json
import os.path as osp
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest
import torch
from PIL import Image

from mmlinvit.utils.cli import load_script

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO_STUDENT = osp.join(REPO, 'configs', 'demo', 'upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py')
#: Class names / colours of the checkpoint, unlike the config's (sky, ground, ...).
CKPT_CLASSES = ['c0', 'c1', 'c2', 'c3', 'c4', 'c5']
CKPT_PALETTE = [[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0], [0, 255, 255],
                [255, 0, 255]]
PHOTO_HW = (45, 70)  # non-square, neither side a multiple of the patch size 8
TINY_VIT = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)


def _tool(relative: str, name: str) -> Any:
    """A tool script loaded as a module."""
    return load_script(osp.join(REPO, relative), name)


def _infer() -> Any:
    """tools/infer.py as a module."""
    return _tool('tools/infer.py', 'infer_round11')


def _onnx_tools() -> Any:
    """tools/deployment/onnx_tools.py as a module."""
    _tool('tools/deployment/export_onnx.py', 'export_onnx_round11')  # tools/deployment on path
    return _tool('tools/deployment/onnx_tools.py', 'onnx_tools_round11')


def _photo(path: str, size_hw: Tuple[int, int] = PHOTO_HW) -> np.ndarray:
    """Writes a real photograph (scikit-image's cat) as a PNG; returns its RGB pixels."""
    from mmlinvit.analysis import load_photo
    pytest.importorskip('skimage')
    rgb = load_photo('chelsea', size_hw)
    Image.fromarray(rgb).save(path)
    return rgb


# ------------------------------------------------------------------------------ segmentation
@pytest.fixture(scope='module')
def segmentor(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """The demo student config with random weights saved as a runner-style checkpoint whose
    classes / palette differ from the config's, and a non-square photograph."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from mmlinvit.config_scopes import register_config_scopes
    register_config_scopes()
    tmp = tmp_path_factory.mktemp('round11_seg')
    cfg = Config.fromfile(DEMO_STUDENT)
    cfg.model.backbone.pretrained = None
    cfg_file = str(tmp / 'seg_cfg.py')
    cfg.dump(cfg_file)
    init_default_scope('mmseg')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    with torch.no_grad():  # weights that give several classes on a photograph
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    state = model.state_dict()
    ckpt = str(tmp / 'iter_1.pth')
    torch.save(dict(meta=dict(dataset_meta=dict(classes=CKPT_CLASSES, palette=CKPT_PALETTE)),
                    state_dict=state), ckpt)
    bare = str(tmp / 'weights_only.pth')
    torch.save(dict(state_dict=state), bare)
    photo_dir = tmp / 'photos'
    photo_dir.mkdir()
    photo = str(photo_dir / 'cat.png')
    rgb = _photo(photo)
    return dict(cfg=cfg, cfg_file=cfg_file, ckpt=ckpt, bare=bare, photo=photo, rgb=rgb,
                tmp=tmp)


def _mmseg_label(cfg_file: str, ckpt: str, image: str,
                 cfg_options: Optional[Dict[str, Any]] = None) -> np.ndarray:
    """mmseg's own ``init_model`` + ``inference_model`` label map of ``image``."""
    from mmseg.apis import inference_model, init_model
    model = init_model(cfg_file, ckpt, device='cpu', cfg_options=cfg_options)
    return inference_model(model, image).pred_sem_seg.data[0].numpy()


def _tool_label(out_dir: str, image: str) -> np.ndarray:
    """The label map the tool wrote for ``image``."""
    stem = osp.splitext(osp.basename(image))[0]
    return np.array(Image.open(osp.join(out_dir, 'pred', f'{stem}.png')))


def test_label_map_equals_mmseg_inference_model(segmentor: Dict[str, Any], tmp_path: Path) -> None:
    """Whole-image inference of a non-square photo (padded to the patch grid): the label map
    equals mmseg's ``inference_model`` pixel for pixel, at the photo's size; the classes are
    the checkpoint's (mmseg's ``init_model`` takes them from there too)."""
    out_dir = str(tmp_path / 'out')
    rows = _infer().main([segmentor['cfg_file'], segmentor['ckpt'], segmentor['photo'],
                          '--out-dir', out_dir, '--device', 'cpu'])
    expected = _mmseg_label(segmentor['cfg_file'], segmentor['ckpt'], segmentor['photo'])
    assert expected.shape == PHOTO_HW and len(np.unique(expected)) >= 2
    got = _tool_label(out_dir, segmentor['photo'])
    np.testing.assert_array_equal(got, expected)
    saved = json.load(open(osp.join(out_dir, 'classes.json')))
    assert saved['classes'] == CKPT_CLASSES and saved['palette'] == CKPT_PALETTE
    assert rows[0]['classes_present'] == [CKPT_CLASSES[i] for i in np.unique(expected)]


def test_slide_inference_equals_mmseg(segmentor: Dict[str, Any], tmp_path: Path) -> None:
    """``model.test_cfg.mode=slide`` (windows smaller than the photo, overlapping)."""
    options = {'model.test_cfg.mode': 'slide', 'model.test_cfg.crop_size': (32, 32),
               'model.test_cfg.stride': (24, 24)}
    out_dir = str(tmp_path / 'out')
    _infer().main([segmentor['cfg_file'], segmentor['ckpt'], segmentor['photo'], '--out-dir',
                   out_dir, '--device', 'cpu', '--cfg-options',
                   'model.test_cfg.mode=slide', 'model.test_cfg.crop_size=(32,32)',
                   'model.test_cfg.stride=(24,24)'])
    expected = _mmseg_label(segmentor['cfg_file'], segmentor['ckpt'], segmentor['photo'],
                            options)
    whole = _mmseg_label(segmentor['cfg_file'], segmentor['ckpt'], segmentor['photo'])
    assert (expected != whole).any()  # the mode matters on this photo
    np.testing.assert_array_equal(_tool_label(out_dir, segmentor['photo']), expected)


def test_resizing_test_pipeline_maps_back_to_the_photo_size(segmentor: Dict[str, Any],
                                                            tmp_path: Path) -> None:
    """A test pipeline that resizes (keep_ratio, as the ADE20K configs): the label map is
    resized back to the photo's size, as mmseg's ``inference_model`` gives it."""
    cfg = segmentor['cfg'].copy()
    pipeline = [dict(type='LoadImageFromFile'),
                dict(type='Resize', scale=(96, 96), keep_ratio=True),
                dict(type='PackSegInputs')]
    cfg.test_pipeline = pipeline
    cfg.test_dataloader.dataset.pipeline = pipeline
    cfg_file = str(tmp_path / 'resize_cfg.py')
    cfg.dump(cfg_file)
    out_dir = str(tmp_path / 'out')
    _infer().main([cfg_file, segmentor['ckpt'], segmentor['photo'], '--out-dir', out_dir,
                   '--device', 'cpu'])
    expected = _mmseg_label(cfg_file, segmentor['ckpt'], segmentor['photo'])
    assert expected.shape == PHOTO_HW
    np.testing.assert_array_equal(_tool_label(out_dir, segmentor['photo']), expected)


def _blend(rgb: np.ndarray, label: np.ndarray, palette: List[List[int]],
           opacity: float) -> np.ndarray:
    """mmseg ``SegLocalVisualizer``'s colour blend, written out: image * (1 - a) + colour * a,
    truncated to uint8."""
    colours = np.asarray(palette, dtype=np.uint8)[label]
    return (rgb * (1 - opacity) + colours * opacity).astype(np.uint8)


@pytest.mark.parametrize('opacity', [0.5, 1.0])
def test_overlay_blends_the_checkpoint_palette(segmentor: Dict[str, Any], tmp_path: Path,
                                               opacity: float) -> None:
    """--no-labels overlays are the photo blended with the checkpoint's palette at --opacity
    (1.0 is allowed: the colours alone); with labels, text is drawn on top."""
    out_dir = str(tmp_path / 'out')
    _infer().main([segmentor['cfg_file'], segmentor['ckpt'], segmentor['photo'], '--out-dir',
                   out_dir, '--device', 'cpu', '--no-labels', '--opacity', str(opacity)])
    label = _tool_label(out_dir, segmentor['photo'])
    overlay = np.array(Image.open(osp.join(out_dir, 'vis', 'cat.png')).convert('RGB'))
    np.testing.assert_array_equal(overlay, _blend(segmentor['rgb'], label, CKPT_PALETTE,
                                                  opacity))
    if opacity == 0.5:
        with_text = str(tmp_path / 'text')
        _infer().main([segmentor['cfg_file'], segmentor['ckpt'], segmentor['photo'],
                       '--out-dir', with_text, '--device', 'cpu'])
        drawn = np.array(Image.open(osp.join(with_text, 'vis', 'cat.png')).convert('RGB'))
        assert (drawn != overlay).any(axis=-1).sum() > 10  # class names written


def test_checkpoint_without_meta_paints_the_config_palette(segmentor: Dict[str, Any],
                                                           tmp_path: Path) -> None:
    """A state-dict-only checkpoint: overlays in the config's palette (mmseg's inferencer
    model would otherwise carry Cityscapes colours)."""
    out_dir = str(tmp_path / 'out')
    _infer().main([segmentor['cfg_file'], segmentor['bare'], segmentor['photo'], '--out-dir',
                   out_dir, '--device', 'cpu', '--no-labels', '--opacity', '1'])
    label = _tool_label(out_dir, segmentor['photo'])
    overlay = np.array(Image.open(osp.join(out_dir, 'vis', 'cat.png')).convert('RGB'))
    palette = [list(c) for c in segmentor['cfg'].metainfo['palette']]
    np.testing.assert_array_equal(overlay, _blend(segmentor['rgb'], label, palette, 1.0))


def test_missing_palette_is_mmseg_dataset_palette() -> None:
    """Classes without (or with a mismatched) palette get the colours mmseg's
    ``BaseSegDataset`` generates for them."""
    from mmseg.datasets import BaseSegDataset
    names = ('a', 'b', 'c', 'd')
    expected = BaseSegDataset(metainfo=dict(classes=names), lazy_init=True).metainfo['palette']
    infer = _infer()
    assert infer._palette_for(names, None) == [list(map(int, c)) for c in expected]
    assert infer._palette_for(names, [[1, 2, 3]]) == [list(map(int, c)) for c in expected]
    assert infer._palette_for(names[:1], [[1, 2, 3]]) == [[1, 2, 3]]


def test_subset_of_dataset_classes_keeps_their_colours() -> None:
    """A config naming a subset of ADE20K's classes, checkpoint without meta: mmseg's
    ``ADE20KDataset`` colours them with their ADE20K colours."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.datasets import ADE20KDataset
    init_default_scope('mmseg')
    subset = ('floor', 'wall')
    cfg = Config(dict(test_dataloader=dict(dataset=dict(type='ADE20KDataset',
                                                        metainfo=dict(classes=subset)))))
    meta, _ = _infer().segmentation_classes(cfg, {})
    expected = ADE20KDataset(metainfo=dict(classes=subset), lazy_init=True).metainfo
    assert meta['classes'] == list(expected['classes'])
    assert meta['palette'] == [list(c) for c in expected['palette']]


def test_mmseg_0x_checkpoint_classes_and_palette(tmp_path: Path) -> None:
    """An mmseg 0.x checkpoint (``meta.CLASSES`` / ``meta.PALETTE``, no ``dataset_meta``):
    the names and colours mmseg's own ``init_model`` gives the model, not the config's."""
    from mmengine.config import Config
    from mmseg.apis import init_model
    cfg = Config.fromfile(DEMO_STUDENT)
    model = init_model(cfg, device='cpu')
    path = str(tmp_path / 'mmseg0x.pth')
    torch.save(dict(state_dict=model.state_dict(),
                    meta=dict(CLASSES=tuple(CKPT_CLASSES), PALETTE=CKPT_PALETTE)), path)
    expected = init_model(Config.fromfile(DEMO_STUDENT), path, device='cpu').dataset_meta
    meta, source = _infer().segmentation_classes(
        Config.fromfile(DEMO_STUDENT), torch.load(path, map_location='cpu', weights_only=False))
    assert meta['classes'] == list(expected['classes']) == CKPT_CLASSES
    assert meta['palette'] == [list(c) for c in expected['palette']]
    assert 'checkpoint' in source


def test_label_map_bit_depth_boundaries(tmp_path: Path) -> None:
    infer = _infer()
    label = np.array([[0, 255], [7, 3]])
    path = str(tmp_path / 'l.png')
    infer._save_label_map(label, path, num_classes=256)
    assert Image.open(path).mode == 'L'
    np.testing.assert_array_equal(np.array(Image.open(path)), label)
    infer._save_label_map(label, path, num_classes=257)
    assert Image.open(path).mode.startswith('I;16')
    with pytest.raises(ValueError, match='do not fit a PNG'):
        infer._save_label_map(np.array([[-1, 0]]), path, num_classes=3)


def test_collect_images_walks_as_documented(tmp_path: Path) -> None:
    """Directories: sorted (sub-folders too), sub-folders only with --recursive, any case of
    the suffix, duplicates dropped, stems that would overwrite each other refused."""
    top = tmp_path / 'imgs'
    top.mkdir()
    subs = ['d', 'b', 'e', 'a', 'c']  # os.walk lists them in directory order, not sorted
    for name in subs:
        (top / name).mkdir()
        (top / name / f'in_{name}.png').write_bytes(b'')
    for name in ('b.png', 'A.JPG', 'notes.txt'):
        (top / name).write_bytes(b'')
    infer = _infer()
    flat = infer.collect_images([str(top)])
    assert [osp.basename(p) for p in flat] == ['A.JPG', 'b.png']
    deep = infer.collect_images([str(top)], recursive=True)
    assert [osp.relpath(p, top) for p in deep] == ['A.JPG', 'b.png'] + [
        f'{name}/in_{name}.png' for name in sorted(subs)]
    again = infer.collect_images([str(top / 'b.png'), str(top) + '/./b.png'])
    assert again == [osp.normpath(str(top / 'b.png'))]
    (top / 'a' / 'b.png').write_bytes(b'')
    with pytest.raises(ValueError, match="same file name stem 'b'"):
        infer.collect_images([str(top)], recursive=True)


def test_file_loader_names_with_a_scope() -> None:
    infer = _infer()
    assert infer._is_file_loader(dict(type='mmseg.LoadImageFromFile'))
    assert infer._is_file_loader(dict(type='LoadImageFromFile'))
    assert not infer._is_file_loader(dict(type='LoadImageFromNDArray'))


def test_distillation_student_gets_the_wrappers_data_preprocessor(tmp_path: Path) -> None:
    """A DistillationModel whose data preprocessor sits on the wrapper: the student keeps it
    (without it the student would see unnormalised pixels), and its weights lose the
    ``student.`` prefix exactly."""
    from mmengine.config import Config
    pre = dict(type='SegDataPreProcessor', mean=[1.0, 2.0, 3.0], std=[4.0, 5.0, 6.0],
               bgr_to_rgb=True)
    cfg = Config(dict(model=dict(type='mmlinvit.DistillationModel', data_preprocessor=pre,
                                 student=dict(type='EncoderDecoder', backbone=dict(type='X')),
                                 teacher=dict(type='Y'))))
    ckpt = str(tmp_path / 'run.pth')
    torch.save(dict(state_dict={'student.backbone.w': torch.ones(2), 'teacher.w': torch.zeros(1),
                                'teacher.student.w': torch.zeros(1)},
                    meta=dict(dataset_meta=dict(classes=['a']))), ckpt)
    new_cfg, new_ckpt = _infer().inference_config(cfg, ckpt, str(tmp_path))
    assert new_cfg.model.type == 'EncoderDecoder'
    assert new_cfg.model.data_preprocessor == pre
    saved = torch.load(new_ckpt, weights_only=False)
    assert list(saved['state_dict']) == ['backbone.w']
    assert saved['meta'] == dict(dataset_meta=dict(classes=['a']))
    own = dict(pre, mean=[9.0, 9.0, 9.0])
    cfg.model.student.data_preprocessor = own
    assert _infer().inference_config(cfg, ckpt, str(tmp_path))[0].model.data_preprocessor == own


# ---------------------------------------------------------------------------- classification
def _cls_config(data_root: str) -> Any:
    """A tiny mmpretrain classifier with an ImageNet-style test pipeline (short edge, then a
    centre crop: non-square photos are cropped)."""
    from mmengine.config import Config
    pipeline = [dict(type='LoadImageFromFile'), dict(type='ResizeEdge', scale=40, edge='short'),
                dict(type='CenterCrop', crop_size=32), dict(type='PackInputs')]
    return Config(dict(
        default_scope='mmpretrain',
        model=dict(
            type='ImageClassifier',
            data_preprocessor=dict(num_classes=5, mean=[123.675, 116.28, 103.53],
                                   std=[58.395, 57.12, 57.375], to_rgb=True),
            backbone=dict(type='mmlinvit.LinearVisionTransformer', arch=TINY_VIT, img_size=32,
                          patch_size=8, out_type='cls_token'),
            head=dict(type='LinearClsHead', num_classes=5, in_channels=32)),
        test_dataloader=dict(batch_size=1, num_workers=0,
                             sampler=dict(type='DefaultSampler', shuffle=False),
                             dataset=dict(type='CustomDataset', data_root=data_root,
                                          pipeline=pipeline)),
        test_cfg=dict(), test_evaluator=dict(type='Accuracy', topk=(1, )),
        visualizer=dict(type='UniversalVisualizer')))


@pytest.fixture(scope='module')
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS

    from mmlinvit.config_scopes import register_config_scopes
    register_config_scopes()
    tmp = tmp_path_factory.mktemp('round11_cls')
    cfg = _cls_config(str(tmp))
    cfg_file = str(tmp / 'cls_cfg.py')
    cfg.dump(cfg_file)
    init_default_scope('mmpretrain')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    ckpt = str(tmp / 'cls.pth')
    classes = ['ant', 'bee', 'cat', 'dog', 'eel']
    torch.save(dict(meta=dict(dataset_meta=dict(classes=classes)),
                    state_dict=model.state_dict()), ckpt)
    photo = str(tmp / 'cat.png')
    rgb = _photo(photo, (36, 60))
    return dict(cfg_file=cfg_file, ckpt=ckpt, photo=photo, rgb=rgb, classes=classes, tmp=tmp)


def test_classification_equals_mmpretrain_inferencer(classifier: Dict[str, Any],
                                                     tmp_path: Path) -> None:
    """Top-k of a non-square PNG (no EXIF: both decode alike) equals mmpretrain's own
    ``ImageClassificationInferencer`` scores; ranks count from 1 in score order; topk.txt
    holds the path then ``<class> <score>`` per rank."""
    from mmpretrain.apis import ImageClassificationInferencer
    out_dir = tmp_path / 'out'
    rows = _infer().main([classifier['cfg_file'], classifier['ckpt'], classifier['photo'],
                          '--out-dir', str(out_dir), '--topk', '3', '--device', 'cpu'])
    reference = ImageClassificationInferencer(model=classifier['cfg_file'],
                                              pretrained=classifier['ckpt'], device='cpu')
    scores = np.asarray(reference(classifier['photo'])[0]['pred_scores'])
    order = np.argsort(-scores)[:3]
    topk = rows[0]['topk']
    assert [t['rank'] for t in topk] == [1, 2, 3]
    assert [t['label'] for t in topk] == order.tolist()
    assert [t['class'] for t in topk] == [classifier['classes'][i] for i in order]
    np.testing.assert_allclose([t['score'] for t in topk], scores[order], rtol=1e-5,
                               atol=1e-7)
    line = (out_dir / 'topk.txt').read_text().splitlines()[0].split('\t')
    assert line[0] == classifier['photo']
    assert line[1:] == [f'{classifier["classes"][i]} {scores[i]:.4f}' for i in order]
    assert json.load(open(out_dir / 'topk.json')) == rows


def test_classification_drawing_equals_mmpretrain(classifier: Dict[str, Any],
                                                  tmp_path: Path) -> None:
    """The drawn image of a PNG (no EXIF: both decode alike) equals the one mmpretrain's own
    inferencer draws (files load BGR, drawing takes RGB)."""
    from mmpretrain.apis import ImageClassificationInferencer
    rows = _infer().main([classifier['cfg_file'], classifier['ckpt'], classifier['photo'],
                          '--out-dir', str(tmp_path / 'out'), '--device', 'cpu'])
    reference = ImageClassificationInferencer(model=classifier['cfg_file'],
                                              pretrained=classifier['ckpt'], device='cpu')
    reference(classifier['photo'], show_dir=str(tmp_path / 'ref'))
    drawn = np.array(Image.open(rows[0]['visualization']).convert('RGB'))
    expected = np.array(Image.open(tmp_path / 'ref' / 'cat.png').convert('RGB'))
    assert drawn.shape == classifier['rgb'].shape
    np.testing.assert_array_equal(drawn, expected)


@pytest.mark.parametrize('argv,message', [
    (['--opacity', '1.5'], 'opacity'), (['--topk', '0'], 'topk'),
    (['--batch-size', '0'], 'batch-size')])
def test_bad_options_are_refused(argv: List[str], message: str,
                                 capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        _infer().parse_args(['c.py', 'x.pth', 'img.png', '--out-dir', 'o'] + argv)
    assert message in capsys.readouterr().err
    args = _infer().parse_args(['c.py', 'x.pth', 'img.png', '--out-dir', 'o', '--opacity', '1',
                                '--topk', '1', '--batch-size', '1'])
    assert (args.opacity, args.topk, args.batch_size) == (1.0, 1, 1)


# ------------------------------------------------------------------------------------- ONNX
@pytest.fixture(scope='module')
def exported(segmentor: Dict[str, Any]) -> Dict[str, Any]:
    """The demo student exported by the tool at 48 x 72 (the photo padded to the patch grid)."""
    pytest.importorskip('onnxruntime')
    pytest.importorskip('onnxscript')
    out = str(segmentor['tmp'] / 'seg.onnx')
    tool = _tool('tools/deployment/export_onnx.py', 'export_onnx_round11')
    info = tool.main([segmentor['cfg_file'], segmentor['ckpt'], '--out', out, '--shape', '48',
                      '72', '--atol', '1e-3', '--rtol', '0.5'])
    return dict(info=info, out=out)


def test_onnx_recipe_from_metadata_equals_mmseg(segmentor: Dict[str, Any], exported: Dict[str,
                                                Any]) -> None:
    """Following the file's ``mmlinvit.input.*`` recipe (channel swap, (x - mean) / std, zero
    padding at the bottom / right, logits resized to the padded size and cropped) on the
    45 x 70 photo gives mmseg ``inference_model``'s label map."""
    import onnx
    import onnxruntime as ort
    props = {p.key: json.loads(p.value) for p in onnx.load(exported['out']).metadata_props}
    mean = np.asarray(props['mmlinvit.input.mean'], np.float32)
    std = np.asarray(props['mmlinvit.input.std'], np.float32)
    assert props['mmlinvit.input.bgr_to_rgb'] is True
    assert props['mmlinvit.input.patch_padding'] == 'corner'
    bgr = segmentor['rgb'][..., ::-1].astype(np.float32)  # as LoadImageFromFile reads it
    pixels = bgr[..., ::-1] if props['mmlinvit.input.bgr_to_rgb'] else bgr
    x = torch.from_numpy(((pixels - mean) / std).transpose(2, 0, 1).copy())[None]
    x = torch.nn.functional.pad(x, (0, 72 - PHOTO_HW[1], 0, 48 - PHOTO_HW[0]))
    session = ort.InferenceSession(exported['out'], providers=['CPUExecutionProvider'])
    logits = torch.from_numpy(session.run(None, {'images': x.numpy()})[0])
    logits = torch.nn.functional.interpolate(logits, size=(48, 72), mode='bilinear',
                                             align_corners=False)
    logits = logits[..., :PHOTO_HW[0], :PHOTO_HW[1]]
    expected = _mmseg_label(segmentor['cfg_file'], segmentor['ckpt'], segmentor['photo'])
    got = logits.argmax(1)[0].numpy()
    top2 = logits[0].topk(2, dim=0).values
    near_tie = (top2[0] - top2[1]).numpy() < 1e-4  # float differences may flip only these
    assert ((got != expected) & ~near_tie).sum() == 0


def test_onnx_graph_has_the_fixed_shape_it_claims(exported: Dict[str, Any]) -> None:
    """The docs say the input size is baked in: onnxruntime refuses another one."""
    import onnxruntime as ort
    session = ort.InferenceSession(exported['out'], providers=['CPUExecutionProvider'])
    assert session.get_inputs()[0].shape == [1, 3, 48, 72]
    with pytest.raises(Exception, match='(?i)dimension|shape'):
        session.run(None, {'images': np.zeros((1, 3, 64, 64), np.float32)})


def test_onnx_check_tolerance_is_atol_plus_rtol_scale(exported: Dict[str, Any]) -> None:
    """The reported tolerance is ``atol + rtol * max|reference|``; the real error is at fp32
    rounding of the logits (which reach ~1e3 here: 1e-5 of their scale, far below the loose
    tolerance the tool was given)."""
    info = exported['info']
    assert info['shape'] == [1, 3, 48, 72] and info['outputs'] == ['out0']
    assert info['tolerance'] == pytest.approx(1e-3 + 0.5 * info['max_abs_reference'])
    assert info['max_abs_reference'] > 0.1
    assert max(info['max_abs_error']) < 1e-3 + 1e-5 * info['max_abs_reference']


def test_max_abs_errors_by_hand() -> None:
    tools = _onnx_tools()
    ref = [torch.zeros(2, 3), torch.ones(4)]
    got = [torch.tensor([[0.0, -2.0, 0.5], [0.0, 0.0, 0.0]]), torch.ones(4) + 0.25]
    assert tools.max_abs_errors(got, ref) == [2.0, 0.25]
    with pytest.raises(ValueError, match='shape'):  # same size, other shape: no broadcast
        tools.max_abs_errors([torch.zeros(2, 3)], [torch.zeros(3, 2)])
    with pytest.raises(ValueError, match='1 onnxruntime outputs vs 2'):
        tools.max_abs_errors([torch.zeros(1)], [torch.zeros(1), torch.zeros(1)])


def test_export_shape_rounds_up_to_the_patch_grid() -> None:
    tools = _onnx_tools()
    tools.check_export_shape((64, 72), 8)
    tools.check_export_shape((65, 71), None)
    with pytest.raises(ValueError, match='--shape 72 80 and pad'):
        tools.check_export_shape((65, 73), 8)
    with pytest.raises(ValueError, match='--shape 64 80 and pad'):  # one side off the grid
        tools.check_export_shape((64, 73), 8)
    backbone = torch.nn.Module()
    backbone.patch_size = (14, 16)
    assert tools._patch_size(backbone) == 14


def test_config_crop_sources() -> None:
    from mmengine.config import Config
    tools = _onnx_tools()
    backbone = torch.nn.Module()
    backbone.img_size = (40, 56)
    assert tools._config_crop(Config(dict(crop_size=(48, 64), model=dict())), backbone) == (48, 64)
    assert tools._config_crop(Config(dict(model=dict(data_preprocessor=dict(size=(32, 40))))),
                              backbone) == (32, 40)
    assert tools._config_crop(Config(dict(model=dict())), backbone) == (40, 56)
    assert tools._config_crop(Config(dict(crop_size=96, model=dict())), backbone) == (96, 96)


def test_cfg_options_keep_equals_signs_in_values() -> None:
    tool = _tool('tools/deployment/export_onnx.py', 'export_onnx_round11')
    assert tool._cfg_options(['a.b=x=y', 'c=[1, 2]', 'd=none']) == {
        'a.b': 'x=y', 'c': [1, 2], 'd': 'none'}
    assert tool._cfg_options([]) is None
    with pytest.raises(SystemExit, match='not key=value'):
        tool._cfg_options(['novalue'])


def test_onnx_check_reference_is_the_model_on_a_fresh_input(segmentor: Dict[str, Any],
                                                            exported: Dict[str, Any]) -> None:
    """The check's reference scale is max |PyTorch output| on the fresh (seed 1) input,
    computed here with mmseg's ``init_model`` holding the checkpoint."""
    from mmseg.apis import init_model
    model = init_model(segmentor['cfg_file'], segmentor['ckpt'], device='cpu')
    images = torch.randn(1, 3, 48, 72, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(images, None, mode='tensor')
    assert exported['info']['max_abs_reference'] == pytest.approx(float(logits.abs().max()),
                                                                  rel=1e-5)


def test_onnxruntime_session_takes_the_thread_count(exported: Dict[str, Any]) -> None:
    session = _onnx_tools().onnxruntime_session(exported['out'], threads=3)
    assert session.get_session_options().intra_op_num_threads == 3


def _identity_onnx(path: str) -> None:
    """A valid one-node ONNX file (images -> out0)."""
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node('Identity', ['images'], ['out0'])], 'g',
                              [helper.make_tensor_value_info('images', TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info('out0', TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph), path)


def test_export_main_bookkeeping(segmentor: Dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture) -> None:
    """Without the (slow) export: the default file name, --batch reaching the traced input,
    the input recipe written into the file, and exit status 1 when onnxruntime is off by
    more than atol + rtol * max |ref|."""
    import onnx
    tool = _tool('tools/deployment/export_onnx.py', 'export_onnx_round11')
    traced = []

    def fake_export(module: torch.nn.Module, images: torch.Tensor, path: str,
                    opset: int) -> List[str]:
        traced.append(tuple(images.shape))
        _identity_onnx(path)
        return ['out0']

    monkeypatch.setattr(tool, 'export_onnx', fake_export)
    monkeypatch.setattr(tool, 'onnxruntime_session', lambda path, threads: path)
    offset = 0.01
    monkeypatch.setattr(tool, 'onnxruntime_outputs', lambda session, images: [
        o + offset for o in tool.build_export_module(
            segmentor['cfg_file'], segmentor['ckpt'])[0](images)])
    info = tool.main([segmentor['cfg_file'], segmentor['ckpt'], '--shape', '32', '40',
                      '--batch', '2', '--atol', '0.02', '--rtol', '0'])
    expected = osp.join(osp.dirname(segmentor['ckpt']), 'seg_cfg_student_model_32x40.onnx')
    assert info['onnx'] == expected and traced == [(2, 3, 32, 40)]
    assert info['shape'] == [2, 3, 32, 40]
    assert max(info['max_abs_error']) == pytest.approx(offset, rel=1e-3)
    props = {p.key: json.loads(p.value) for p in onnx.load(expected).metadata_props}
    assert props['mmlinvit.input.mean'] == info['input']['mean']
    assert info['input']['mean'] == pytest.approx([123.675, 116.28, 103.53])
    assert props['mmlinvit.input.prepare'] == info['input']['prepare']
    assert props['mmlinvit.input.bgr_to_rgb'] is True  # SegDataPreProcessor(bgr_to_rgb=True)
    with pytest.raises(SystemExit) as exc:  # off by 0.01 > 0.005 + 0 x max |ref|
        tool.main([segmentor['cfg_file'], segmentor['ckpt'], '--shape', '32', '40',
                   '--atol', '0.005', '--rtol', '0'])
    assert exc.value.code == 1
    capsys.readouterr()


def test_decode_head_with_optional_data_samples_exports() -> None:
    """Only a REQUIRED ``batch_data_samples`` argument blocks the whole-model export."""
    tools = _onnx_tools()

    class OptionalSamplesHead:
        def forward(self, inputs: torch.Tensor,
                    batch_data_samples: Optional[list] = None) -> torch.Tensor:
            return inputs

    assert not tools._needs_data_samples(OptionalSamplesHead())


def test_student_graph_records_the_student_statistics() -> None:
    """A distillation model with ``teacher_input_norm``: the student's graph takes the
    student's statistics, the teacher's graph the teacher's."""
    from types import SimpleNamespace

    from mmpretrain.models import ClsDataPreprocessor
    tools = _onnx_tools()
    pre = ClsDataPreprocessor(mean=[1.0, 2.0, 3.0], std=[4.0, 5.0, 6.0], to_rgb=True)
    model = SimpleNamespace(data_preprocessor=pre, teacher_input_norm=SimpleNamespace(
        stats=dict(mean=[7.0, 8.0, 9.0], std=[1.0, 1.0, 1.0])))
    info = dict(patch_size=16, pads_outside_backbone=False)
    student = tools.graph_input_convention(model, model, 'student', info)
    teacher = tools.graph_input_convention(model, model, 'teacher', info)
    assert student['mean'] == [1.0, 2.0, 3.0] and student['std'] == [4.0, 5.0, 6.0]
    assert teacher['mean'] == [7.0, 8.0, 9.0] and student['bgr_to_rgb'] is True


def test_top_level_data_preprocessor_is_the_recorded_one(tmp_path: Path) -> None:
    """An mmpretrain config with its data preprocessor at the top level (as the CIFAR
    distillation configs): the graph's recorded statistics are the config's, as the Runner
    merges them."""
    cfg = _cls_config(str(tmp_path))
    cfg.data_preprocessor = dict(cfg.model.pop('data_preprocessor'), mean=[1.0, 2.0, 3.0],
                                 std=[4.0, 5.0, 6.0])
    cfg_file = str(tmp_path / 'top_level_pre.py')
    cfg.dump(cfg_file)
    _, info = _onnx_tools().build_export_module(cfg_file, None)
    assert info['input']['mean'] == [1.0, 2.0, 3.0] and info['input']['std'] == [4.0, 5.0, 6.0]
    assert info['input']['bgr_to_rgb'] is True


def test_load_weights_refuses_unexpected_keys(tmp_path: Path) -> None:
    """A file with the module's keys plus others (another model's) is not taken silently."""
    tools = _onnx_tools()
    linear = torch.nn.Linear(2, 2)
    path = str(tmp_path / 'w.pth')
    torch.save(dict(linear.state_dict(), extra=torch.zeros(1)), path)
    with pytest.raises(KeyError, match=r"unexpected \['extra'\]"):
        tools.load_weights(linear, path, 'model')
    torch.save({f'model.{k}': v for k, v in linear.state_dict().items()}, path)
    assert tools.load_weights(torch.nn.Linear(2, 2), path, 'model') == 'model.'


# --------------------------------------------------------------------------- benchmark_onnx
def test_benchmark_builds_each_operator() -> None:
    bench = _tool('tools/deployment/benchmark_onnx.py', 'benchmark_onnx_round11')
    teacher = bench.build(bench.TEACHER, 'tiny').backbone
    relu = bench.build('vit-relu', 'tiny').backbone
    elu = bench.build('vit-elu', 'tiny').backbone
    assert set(teacher.attn_cfgs) == {'softmax'}
    assert set(relu.attn_cfgs) == {'relu'} and set(elu.attn_cfgs) == {'elu'}
    assert type(bench.build('adventurer', 'tiny').backbone).__name__ == 'Adventurer'
    assert elu.out_indices == [1] and teacher.out_indices == [1]  # the last of 2 blocks
    out = bench.build('vit-elu', 'tiny')(torch.zeros(1, 3, 32, 48))
    assert len(out) == 1 and out[0].shape == (1, 64, 2, 3)  # last block, NCHW


def test_benchmark_ratio_is_teacher_over_student(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    """The table's ratio column is teacher ms / student ms, errors per model as measured
    (export and timing replaced by stand-ins: bookkeeping only)."""
    bench = _tool('tools/deployment/benchmark_onnx.py', 'benchmark_onnx_round11')
    monkeypatch.setattr(bench, 'export_onnx', lambda module, images, path: ['out0'])
    monkeypatch.setattr(bench, 'onnxruntime_session', lambda path, threads: path)

    def outputs(session: str, images: torch.Tensor) -> List[torch.Tensor]:
        offset = {bench.TEACHER: 0.5, 'vit-elu': 0.25}[osp.basename(session).split('_')[0]]
        return [torch.full((1, 64, 2, 2), offset)]

    monkeypatch.setattr(bench, 'onnxruntime_outputs', outputs)
    monkeypatch.setattr(bench, 'build', lambda name, arch: (
        lambda images: (torch.zeros(1, 64, 2, 2), )))
    monkeypatch.setattr(bench, 'time_round_robin', lambda fns, device, repeats, max_seconds: {
        bench.TEACHER: 30.0, 'vit-elu': 10.0})
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        rows = bench.main(['--arch', 'tiny', '--sizes', '32', '--students', 'vit-elu',
                           '--repeats', '1', '--threads', '1'])
        assert torch.get_num_threads() == 2  # the caller's thread count is given back
    finally:
        torch.set_num_threads(threads)
    assert rows[0]['teacher-softmax max abs err'] == 0.5
    assert rows[0]['vit-elu max abs err'] == 0.25
    assert rows[0]['vit-elu ort ms'] == 10.0
    last_row = capsys.readouterr().out.splitlines()[-1].split()
    assert last_row[:4] == ['32', '30.0', '10.0', '3.00x']  # size, teacher, student, ratio


# ------------------------------------------------------------------------------- linearize
def _linearize() -> Any:
    """tools/linearize.py as a module."""
    return _tool('tools/linearize.py', 'linearize_round11')


@pytest.fixture(scope='module')
def teacher_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    from mmlinvit.backbones import VisionTransformer
    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp('round11_lin') / 'teacher.pth')
    torch.save(VisionTransformer(TINY_VIT, family='deit', img_size=32,
                                 patch_size=8).state_dict(), path)
    return path


def _student(path: str) -> Tuple[Any, dict]:
    """The student rebuilt from a tools/linearize.py output (strict load), and the file."""
    from mmlinvit.backbones import VisionTransformer
    ckpt = torch.load(path, weights_only=True)
    model = VisionTransformer(**ckpt['meta']['student_cfg'])
    model.load_state_dict(ckpt['state_dict'], strict=True)
    return model, ckpt


def test_linearize_norm_eps_reaches_teacher_and_student(teacher_file: str, tmp_path: Path) -> None:
    out = str(tmp_path / 's.pth')
    assert _linearize().main([teacher_file, out, '--arch', json.dumps(TINY_VIT), '--operator',
                              'elu', '--norm-eps', '1e-3']) == 0
    student, ckpt = _student(out)
    assert ckpt['meta']['student_cfg']['norm_eps'] == 1e-3
    assert student.blocks[0].norm1.eps == 1e-3 and student.norm.eps == 1e-3


def test_linearize_act_override_reaches_the_student(tmp_path: Path) -> None:
    """--act for a file without an activation record (e.g. a LAION CLIP release)."""
    from mmlinvit.backbones import VisionTransformer
    from mmlinvit.backbones.training_record import MLP_ACT_RECORD
    state = VisionTransformer(TINY_VIT, family='deit', img_size=32, patch_size=8).state_dict()
    del state[MLP_ACT_RECORD]
    src, out = str(tmp_path / 't.pth'), str(tmp_path / 's.pth')
    torch.save(state, src)
    assert _linearize().main([src, out, '--arch', json.dumps(TINY_VIT), '--operator', 'elu',
                              '--act', 'quick_gelu']) == 0
    _, ckpt = _student(out)
    assert ckpt['meta']['student_cfg']['act'] == 'quick_gelu'


@pytest.mark.parametrize('argv,message', [
    (['--student-reg-tokens', '-1'], '--student-reg-tokens must be 0 or more'),
    (['--arch', json.dumps({k: v for k, v in TINY_VIT.items() if k != 'mlp_hidden_dims'})],
     "--arch dict is missing ['mlp_hidden_dims']")])
def test_linearize_usage_errors(teacher_file: str, tmp_path: Path, capsys: pytest.CaptureFixture,
                                argv: List[str], message: str) -> None:
    args = [teacher_file, str(tmp_path / 's.pth'), '--operator', 'elu']
    if '--arch' not in argv:
        args += ['--arch', json.dumps(TINY_VIT)]
    with pytest.raises(SystemExit) as exc:
        _linearize().main(args + argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_linearize_seed_draws_the_student_init(teacher_file: str, tmp_path: Path) -> None:
    """--seed fixes the initialisation of what is not copied: equal seeds, equal students;
    another seed, another attention init (the copied MLPs stay the teacher's)."""
    linearize = _linearize()
    states = {}
    for name, seed in (('a', 3), ('b', 3), ('c', 4)):
        out = str(tmp_path / f'{name}.pth')
        torch.manual_seed(100 + len(states))  # the tool must not depend on the global seed
        assert linearize.main([teacher_file, out, '--arch', json.dumps(TINY_VIT), '--operator',
                               'elu', '--seed', str(seed)]) == 0
        states[name] = torch.load(out, weights_only=True)
    key = 'blocks.0.attn.qkv.weight'
    assert torch.equal(states['a']['state_dict'][key], states['b']['state_dict'][key])
    assert not torch.equal(states['a']['state_dict'][key], states['c']['state_dict'][key])
    assert states['c']['meta']['seed'] == 4


def test_linearize_default_report_and_options(teacher_file: str, tmp_path: Path) -> None:
    out = tmp_path / 'nested' / 'student.pth'
    assert _linearize().main([teacher_file, str(out), '--arch', json.dumps(TINY_VIT),
                              '--operator-per-layer', ' softmax , elu ',
                              '--student-pos-embed', 'sincos']) == 0
    report = json.loads((tmp_path / 'nested' / 'student.json').read_text())
    assert report['operators'] == ['softmax', 'elu']
    student, ckpt = _student(str(out))
    assert ckpt['meta']['student_cfg']['pos_embed_type'] == 'sincos'
    assert student.pos_embed is None or not student.pos_embed.requires_grad
    assert ckpt['meta']['student_cfg']['out_type'] == 'cls_token'  # the teacher's pooling


def test_linearize_parsers() -> None:
    linearize = _linearize()
    assert linearize.parse_strategy_args([' alpha =0.5', 'base=mlp_copy', 'w=[1, 2]']) == {
        'alpha': 0.5, 'base': 'mlp_copy', 'w': [1, 2]}
    assert linearize.parse_operators(None, '["elu", {"type": "relu"}]') == [
        'elu', {'type': 'relu'}]
    assert linearize.parse_operators('{"type": "elu"}', None) == {'type': 'elu'}
    with pytest.raises(SystemExit):
        linearize.parse_operators('elu', 'elu,elu')


def test_teacher_structure_from_keys() -> None:
    """Tokens, registers, position type, patch and grid read from a state dict's keys."""
    linearize = _linearize()
    state = {'cls_token': torch.zeros(1, 1, 8), 'reg_token': torch.zeros(1, 3, 8),
             'pos_embed': torch.zeros(1, 1 + 2 * 2, 8),
             'patch_embed.proj.weight': torch.zeros(8, 3, 14, 14),
             'blocks.0.norm1.weight': torch.zeros(8), 'norm.weight': torch.zeros(8)}
    structure = linearize.teacher_structure(state)
    assert structure['with_cls_token'] and structure['num_reg_tokens'] == 3
    assert not structure['with_mask_token'] and structure['pos_embed_type'] == 'learned'
    assert structure['patch_size'] == 14 and 'final_norm' not in structure
    assert structure['img_size'] == 28  # the 2 x 2 grid behind the class token
    del state['norm.weight'], state['pos_embed'], state['cls_token']
    structure = linearize.teacher_structure(state)
    assert structure['final_norm'] is False and structure['pos_embed_type'] == 'sincos'
    assert not structure['with_cls_token'] and 'img_size' not in structure
    state['mask_token'] = torch.zeros(1, 1, 8)
    assert linearize.teacher_structure(state)['with_mask_token']
