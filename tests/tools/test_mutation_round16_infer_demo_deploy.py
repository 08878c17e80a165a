"""Mutation round 16: tools/infer.py, tools/demo.py, tools/deployment/{export_onnx,onnx_tools,
benchmark_onnx}.py and tools/linearize.py on branches the earlier rounds (11, 13) left open.
Each test below failed on at least one single-line change of these tools that the rest of the
suite let pass.

Guarded here, each against an independent reference (mmcv / mmpretrain / mmseg / mmengine
classes run in the test, or values written out by hand):

* ``tools/infer.py``: ``--opacity 0`` is in the documented range; label maps round-trip at
  the 16-bit limit and are never truncated to 8 bits; the runs of equal image shapes that go
  into one forward; config classes outside the dataset's get mmseg's generated palette;
  CIFAR-style configs (no ``LoadImageFromFile``) get ``to_rgb`` as mmpretrain's
  ``ClsDataPreprocessor`` defaults it, and configs that load files keep theirs; files of such
  configs are decoded as mmpretrain's inferencer decodes them (EXIF orientation applied, as
  ``mmcv.imread``); grayscale files drawn as mmpretrain's ``UniversalVisualizer`` draws them;
  legacy (non-zip) checkpoints; an unscoped ``DistillationModel`` type; a bare-backbone
  distillation student refused with the export route;
* ``tools/demo.py``: the wiring of the AdaLA stages and of Stage 3 (Stage 2 starts from the
  Stage-1 checkpoint, Stage 3 from the Stage-2 backbone, the seed, the training split, the
  iteration-based cosine schedule), the photo normalisation by the segmentor's own
  ``SegDataPreProcessor``;
* ``tools/infer.py`` finding (fixed in tools/infer.py; the test failed before): directories
  of PPM / PGM images, which mmpretrain's ``CustomDataset`` lists and ``mmcv.imread`` decodes,
  were refused as holding no images;
* ``tools/deployment``: ``which='teacher'`` of a plain model is refused; the recorded input
  statistics keep the config's decimals and the model's own preprocessor wins over a top-level
  one (mmengine's ``Runner`` merge); the padding default of mmseg's own ``EncoderDecoder``
  (bottom / right, as mmseg's ``stack_batch``); ``none`` in any case; an error equal to the
  tolerance passes (real onnxruntime run of an identity graph); seeded benchmark models;
* ``tools/linearize.py``: ``mmlinvit.``-scoped operator / strategy names (as the registries
  resolve them); no "registers dropped" warning with an explicit ``--student-reg-tokens``.
"""
import json
import os.path as osp
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
import torch
from PIL import Image

from mmlinvit.utils.cli import load_script

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
pytestmark = pytest.mark.usefixtures('restore_globals')
TINY_VIT = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)


@pytest.fixture(scope='module', autouse=True)
def _restore_sys_path() -> Iterator[None]:
    """The deployment scripts put their folders on ``sys.path`` when loaded: taken back."""
    saved = list(sys.path)
    yield
    sys.path[:] = saved


def _tool(relative: str, name: str) -> Any:
    """A tool script loaded as a module under a name of this file."""
    return load_script(osp.join(REPO, relative), f'round16_{name}')


@pytest.fixture(scope='module')
def infer() -> Any:
    """tools/infer.py as a module."""
    return _tool('tools/infer.py', 'infer')


# ----------------------------------------------------------------------------------- infer
def test_opacity_bounds_are_inclusive(infer: Any) -> None:
    """``--opacity`` is documented as a value in [0, 1]: both ends are accepted (0 shows the
    image alone, as mmseg's ``SegLocalVisualizer`` blends it)."""
    base = ['c.py', 'x.pth', 'img.png', '--out-dir', 'o']
    assert infer.parse_args(base + ['--opacity', '0']).opacity == 0.0
    assert infer.parse_args(base + ['--opacity', '1']).opacity == 1.0


def test_label_maps_keep_every_value(infer: Any, tmp_path: Path) -> None:
    """A PNG holds 0..65535: the largest value is written (16 bits), and a value over 255 is
    never truncated to 8 bits, whatever the class count."""
    path = str(tmp_path / 'l.png')
    top = np.array([[0, 65535], [1, 2]])
    infer._save_label_map(top, path, num_classes=70000)
    np.testing.assert_array_equal(np.array(Image.open(path)), top)
    wide = np.array([[0, 300], [1, 2]])
    infer._save_label_map(wide, path, num_classes=3)
    np.testing.assert_array_equal(np.array(Image.open(path)), wide)
    with pytest.raises(ValueError, match='do not fit a PNG'):
        infer._save_label_map(np.array([[65536]]), path, num_classes=3)


def test_equal_shape_runs_by_hand(infer: Any) -> None:
    """Only CONSECUTIVE images of one shape share a forward (mmseg's preprocessor stacks
    equal sizes only): A A B A -> [0, 2), [2, 3), [3, 4)."""
    a, b = (3, 32, 48), (3, 48, 32)
    assert infer._equal_shape_runs([a, a, b, a]) == [(0, 2), (2, 3), (3, 4)]
    assert infer._equal_shape_runs([a, b, b]) == [(0, 1), (1, 3)]
    assert infer._equal_shape_runs([a]) == [(0, 1)]


def test_classes_outside_the_dataset_get_mmsegs_generated_palette(infer: Any) -> None:
    """A config naming classes the dataset does not have (checkpoint without meta): one
    colour per class, the ones mmseg's ``BaseSegDataset`` generates for a class list without
    a palette (not a crash looking them up in ADE20K's palette)."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.datasets import BaseSegDataset
    init_default_scope('mmseg')
    names = ('sky', 'hovercraft', 'lava')  # 'sky' is an ADE20K class, the others are not
    cfg = Config(dict(test_dataloader=dict(dataset=dict(type='ADE20KDataset',
                                                        metainfo=dict(classes=names)))))
    meta, _ = infer.segmentation_classes(cfg, {})
    expected = BaseSegDataset(metainfo=dict(classes=names), lazy_init=True).metainfo['palette']
    assert meta['classes'] == list(names)
    assert meta['palette'] == [list(map(int, c)) for c in expected]


def test_a_dataset_named_by_its_class_gives_its_classes(infer: Any) -> None:
    """A Python-style config names the dataset class itself (``type=ADE20KDataset``); a
    checkpoint without meta then gets that dataset's classes and colours (the class was
    looked up by its ``str()`` and none were found)."""
    from mmengine.config import Config
    from mmseg.datasets import ADE20KDataset
    cfg = Config(dict(test_dataloader=dict(dataset=dict(type=ADE20KDataset))))
    meta, _ = infer.segmentation_classes(cfg, {})
    expected = ADE20KDataset(lazy_init=True).metainfo
    assert meta['classes'] == list(expected['classes'])
    assert meta['palette'] == [list(map(int, c)) for c in expected['palette']]


def _cls_cfg(pipeline: List[dict], model_pre: Any = None, top_pre: Any = None) -> Any:
    """A classification config with the given test pipeline and data preprocessors."""
    from mmengine.config import Config
    model = dict(type='ImageClassifier')
    if model_pre is not None:
        model['data_preprocessor'] = model_pre
    cfg = dict(model=model, test_dataloader=dict(dataset=dict(pipeline=pipeline)))
    if top_pre is not None:
        cfg['data_preprocessor'] = top_pre
    return Config(cfg)


def test_array_pipeline_turns_on_rgb_as_mmpretrain_defaults_it(infer: Any) -> None:
    """A test pipeline without ``LoadImageFromFile`` (CIFAR: RGB arrays): a preprocessor
    that does not name ``to_rgb`` has mmpretrain's default (no swap), so files, read as BGR,
    need ``to_rgb=True``; the top-level preprocessor (as the CIFAR configs place it) too."""
    from mmpretrain.models import ClsDataPreprocessor
    stats = dict(mean=[125.3, 123.0, 113.9], std=[63.0, 62.1, 66.7])
    assert ClsDataPreprocessor(**stats).to_rgb is False  # the default that is overridden
    cfg = _cls_cfg([dict(type='PackInputs')], model_pre=dict(stats))
    assert 'to_rgb=True' in infer.read_files_as_rgb(cfg)
    assert cfg.model.data_preprocessor.to_rgb is True
    cfg = _cls_cfg([dict(type='PackInputs')], top_pre=dict(stats, to_rgb=False))
    assert 'data_preprocessor' in infer.read_files_as_rgb(cfg)
    assert cfg.data_preprocessor.to_rgb is True


def test_file_pipeline_keeps_the_configs_channel_order(infer: Any) -> None:
    """A test pipeline that loads files itself already sees what the model was evaluated
    on: a BGR model (``to_rgb=False``) is left alone."""
    pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
    cfg = _cls_cfg(pipeline, model_pre=dict(mean=[0.0] * 3, std=[1.0] * 3, to_rgb=False))
    assert infer.read_files_as_rgb(cfg) is None
    assert cfg.model.data_preprocessor.to_rgb is False


def _exif_rotated_jpeg(path: str) -> None:
    """A 20 x 40 JPEG whose EXIF orientation (6) turns it to 40 x 20."""
    pixels = np.arange(20 * 40 * 3, dtype=np.uint8).reshape(20, 40, 3)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(pixels).save(path, exif=exif)


def test_array_pipeline_files_decode_as_mmpretrains_inferencer(infer: Any,
                                                               tmp_path: Path) -> None:
    """Without a ``LoadImageFromFile`` in the test pipeline, files are read as mmpretrain's
    ``ImageClassificationInferencer`` reads them (``mmcv.imread``: EXIF orientation applied);
    a pipeline's own loader keeps its ``color_type``."""
    import mmcv
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import TRANSFORMS
    init_default_scope('mmpretrain')
    path = str(tmp_path / 'rotated.jpg')
    _exif_rotated_jpeg(path)
    loader = TRANSFORMS.build(infer._test_pipeline_file_loader(_cls_cfg([dict(type='PackInputs')])))
    img = loader(dict(img_path=path))['img']
    np.testing.assert_array_equal(img, mmcv.imread(path))
    assert img.shape == (40, 20, 3)
    own = infer._test_pipeline_file_loader(_cls_cfg([
        dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
        dict(type='PackInputs')]))
    assert TRANSFORMS.build(own)(dict(img_path=path))['img'].shape == (20, 40, 3)


def test_legacy_checkpoint_is_read_for_the_checks(infer: Any, tmp_path: Path) -> None:
    """A checkpoint in torch's legacy (non-zip) format cannot be memory-mapped: it is read as
    mmengine reads it."""
    from mmengine.runner.checkpoint import _load_checkpoint
    path = str(tmp_path / 'legacy.pth')
    state = {'backbone.w': torch.arange(4.0)}
    torch.save(dict(state_dict=state, meta=dict(dataset_meta=dict(classes=['a']))), path,
               _use_new_zipfile_serialization=False)
    view = infer.checkpoint_view(path)
    reference = _load_checkpoint(path, map_location='cpu')
    assert view['meta'] == reference['meta']
    torch.testing.assert_close(view['state_dict'], reference['state_dict'])


def test_unscoped_distillation_type_runs_its_student(infer: Any, tmp_path: Path) -> None:
    """``type='DistillationModel'`` (the name without its scope, registered under mmlinvit)
    is a distillation model too: its student is rebuilt alone with ``student.*`` weights."""
    from mmengine.config import Config
    from mmlinvit.registry import MODELS
    assert MODELS.get('DistillationModel') is MODELS.get('mmlinvit.DistillationModel')
    cfg = Config(dict(model=dict(type='DistillationModel',
                                 student=dict(type='EncoderDecoder', backbone=dict(type='X')),
                                 teacher=dict(type='Y'))))
    ckpt = str(tmp_path / 'run.pth')
    torch.save(dict(state_dict={'student.backbone.w': torch.ones(2), 'teacher.w': torch.ones(1)}),
               ckpt)
    new_cfg, new_ckpt = infer.inference_config(cfg, ckpt, str(tmp_path))
    assert new_cfg.model.type == 'EncoderDecoder'
    assert list(torch.load(new_ckpt, weights_only=False)['state_dict']) == ['backbone.w']



def test_grayscale_files_are_drawn_unmirrored(infer: Any, tmp_path: Path) -> None:
    """A test pipeline decoding files as grayscale: the drawing is mmpretrain's
    ``UniversalVisualizer.visualize_cls`` of the image as decoded (only 3-channel BGR files
    are turned to RGB; reversing a 2-D image's last axis would mirror it)."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    from mmpretrain.structures import DataSample
    from mmpretrain.visualization import UniversalVisualizer
    pipeline = [dict(type='LoadImageFromFile', color_type='grayscale'),
                dict(type='PackInputs')]
    cfg = Config(dict(
        default_scope='mmpretrain',
        model=dict(type='ImageClassifier',
                   backbone=dict(type='mmlinvit.LinearVisionTransformer', arch=TINY_VIT,
                                 img_size=32, patch_size=8, out_type='cls_token'),
                   head=dict(type='LinearClsHead', num_classes=3, in_channels=32)),
        test_dataloader=dict(dataset=dict(type='CustomDataset', pipeline=pipeline))))
    init_default_scope('mmpretrain')
    ckpt = str(tmp_path / 'cls.pth')
    torch.save(dict(state_dict=MODELS.build(cfg.model).state_dict(),
                    meta=dict(dataset_meta=dict(classes=['a', 'b', 'c']))), ckpt)
    path = str(tmp_path / 'ramp.png')
    gray = np.tile(np.arange(0, 240, 4, dtype=np.uint8), (40, 1))  # dark left, bright right
    Image.fromarray(gray).save(path)
    visualizers = UniversalVisualizer._instance_dict.copy()  # global instances: restored
    try:
        inferencer = infer.classification_inferencer(cfg, ckpt, 'cpu')
        sample = DataSample().set_pred_score(torch.tensor([0.1, 0.7, 0.2])).set_pred_label(1)
        drawn = inferencer.visualize([path], [sample], show_dir=str(tmp_path / 'vis'))[0]
        reference = UniversalVisualizer(name='round16_reference')
        reference.visualize_cls(gray, sample, classes=['a', 'b', 'c'], draw_gt=False,
                                draw_pred=True, draw_score=True, name='ramp')
        np.testing.assert_array_equal(drawn, reference.get_image())
    finally:
        UniversalVisualizer._instance_dict.clear()
        UniversalVisualizer._instance_dict.update(visualizers)


def test_directories_contribute_the_image_files_mmpretrain_reads(infer: Any,
                                                                  tmp_path: Path) -> None:
    """FINDING (round 16, fixed; failed before): a directory of PPM / PGM images
    (in the extensions of mmpretrain's ``CustomDataset``, decoded by ``mmcv.imread``) was
    refused as holding "no images"."""
    import inspect

    import mmcv
    from mmpretrain.datasets import CustomDataset
    extensions = inspect.signature(CustomDataset).parameters['extensions'].default
    assert '.ppm' in extensions and '.pgm' in extensions
    folder = tmp_path / 'netpbm'
    folder.mkdir()
    rgb = np.zeros((4, 6, 3), np.uint8)
    Image.fromarray(rgb).save(folder / 'colour.ppm')
    Image.fromarray(rgb[..., 0]).save(folder / 'gray.pgm')
    assert mmcv.imread(str(folder / 'gray.pgm')).shape == (4, 6, 3)
    found = infer.collect_images([str(folder)])
    assert [osp.basename(p) for p in found] == ['colour.ppm', 'gray.pgm']
    assert all(s.lower() in infer.IMAGE_SUFFIXES for s in extensions)


def test_bare_backbone_distillation_is_refused_with_the_export_route(infer: Any,
                                                                     tmp_path: Path) -> None:
    """A DistillationModel whose student is a bare backbone (Stage 1 / 2: no task head) has
    nothing to predict with: a ValueError naming the export tool, not a backbone handed to
    the inferencer as if it were a task model."""
    from mmengine.config import Config
    cfg = Config(dict(model=dict(type='mmlinvit.DistillationModel',
                                 student=dict(type='mmlinvit.LinearVisionTransformer',
                                              arch='t'),
                                 teacher=dict(type='mmlinvit.VisionTransformer', arch='t'))))
    ckpt = str(tmp_path / 'run.pth')
    torch.save(dict(state_dict={'student.cls_token': torch.zeros(1, 1, 4)}), ckpt)
    with pytest.raises(ValueError, match='export_student.py'):
        infer.inference_config(cfg, ckpt, str(tmp_path))

# ------------------------------------------------------------------------------------ demo
@pytest.fixture(scope='module')
def demo() -> Any:
    """tools/demo.py as a module."""
    return _tool('tools/demo.py', 'demo')


def _fake_training(demo: Any, monkeypatch: pytest.MonkeyPatch) -> List[Any]:
    """Replaces the demo's training by a recorder of the configs it would train; the Stage-2
    run leaves the student backbone its ExportStudentHook would write."""
    trained: List[Any] = []

    def fake_train(cfg: Any) -> Any:
        trained.append(cfg)
        if len(trained) == 2:
            Path(cfg.work_dir).mkdir(parents=True, exist_ok=True)
            (Path(cfg.work_dir) / 'student_backbone.pth').write_bytes(b'')
        return SimpleNamespace(cfg=cfg, work_dir=cfg.work_dir,
                               log_dir=osp.join(cfg.work_dir, 'log'))

    monkeypatch.setattr(demo, '_train', fake_train)
    monkeypatch.setattr(demo, 'last_checkpoint_target',
                        lambda work_dir: osp.join(work_dir, 'epoch_1.pth'))
    return trained


def test_demo_adala_stages_are_chained(demo: Any, monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    """Stage 1 starts student and teacher from the teacher's backbone; Stage 2 takes the
    Stage-1 checkpoint (``load_from``; no ``pretrained`` student over it) and the teacher's
    backbone again; both read the training images of the scenes (the teacher's training
    split) with the run's seed; the cosine schedule is the recipe's (configs/adala:
    epochs converted to iterations) scaled down."""
    from mmengine.config import Config
    trained = _fake_training(demo, monkeypatch)
    teacher_cfg = Config.fromfile(demo.TEACHER_CFG, format_python_code=False)
    data_root = str(tmp_path / 'data')
    stage1, stage2, logs = demo.run_adala(dict(demo.PLANS['quick']), data_root,
                                          str(tmp_path / 'work'), teacher_cfg, 'teacher.pth',
                                          seed=7)
    cfg1, cfg2 = trained
    assert cfg1.model.student.pretrained == cfg1.model.teacher.pretrained == 'teacher.pth'
    assert stage1 == osp.join(cfg1.work_dir, 'epoch_1.pth') == cfg2.load_from
    assert cfg2.model.student.pretrained is None
    assert cfg2.model.teacher.pretrained == 'teacher.pth'
    assert stage2 == osp.join(cfg2.work_dir, 'student_backbone.pth')
    assert logs == dict(stage1=osp.join(cfg1.work_dir, 'log'),
                        stage2=osp.join(cfg2.work_dir, 'log'))
    train_images = teacher_cfg.train_dataloader.dataset.data_prefix['img_path']
    for cfg, path in ((cfg1, demo.STAGE1_CFG), (cfg2, demo.STAGE2_CFG)):
        assert cfg.randomness.seed == 7
        assert cfg.train_dataloader.dataset.data_root == data_root
        assert cfg.train_dataloader.dataset.data_prefix == train_images
        recipe = Config.fromfile(path, format_python_code=False)
        cosine = [s for s in recipe.param_scheduler if s['type'] == 'CosineAnnealingLR'][0]
        mine = cfg.param_scheduler[-1]
        for key in ('type', 'by_epoch', 'convert_to_iter_based', 'begin'):
            assert mine[key] == cosine[key], key


def test_demo_teacher_and_student_runs(demo: Any, monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    """The teacher and the Stage-3 student train, validate AND test on the drawn scenes
    with the run's seed; Stage 3 starts its backbone from the Stage-2 student backbone."""
    trained = _fake_training(demo, monkeypatch)
    data_root = str(tmp_path / 'data')
    plan = dict(demo.PLANS['quick'])
    demo.train_teacher(plan, data_root, str(tmp_path / 'work'), seed=5)
    demo.train_student(plan, data_root, str(tmp_path / 'work'), 'stage2_backbone.pth', seed=5)
    teacher, student = trained
    assert student.model.backbone.pretrained == 'stage2_backbone.pth'
    for cfg in (teacher, student):
        assert cfg.randomness.seed == 5
        for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
            assert cfg[loader].dataset.data_root == data_root, loader


class _Segmentor(torch.nn.Module):
    """A stand-in segmentor: mmseg's ``SegDataPreProcessor`` and a backbone that records
    whether it was in training mode."""

    def __init__(self, preprocessor: torch.nn.Module) -> None:
        super().__init__()
        self.data_preprocessor = preprocessor
        self.backbone = torch.nn.Dropout(0.5)
        self.backbone.patch_size = 8


def test_demo_photos_are_normalised_as_the_segmentors_preprocessor(
        demo: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The photos reach both backbones as mmseg's ``SegDataPreProcessor`` (mean / std,
    ``bgr_to_rgb``) makes a file of them, in eval mode."""
    from mmseg.models import SegDataPreProcessor
    stats = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])
    rng = np.random.RandomState(0)
    photos = {name: rng.randint(0, 256, demo.PHOTO_SIZE + (3, ), dtype=np.uint8)
              for name in demo.PHOTOS}
    monkeypatch.setattr(demo, 'load_photo', lambda name, size: photos[name])
    monkeypatch.setattr(demo, 'save_teacher_student_figure', lambda *args, **kwargs: None)
    seen: Dict[str, Any] = {}

    def fake_compare(teacher: torch.nn.Module, student: torch.nn.Module,
                     images: torch.Tensor) -> Any:
        seen.update(images=images.clone(), training=(teacher.training, student.training))
        return SimpleNamespace(attention_tv=np.array([0.25]),
                               feature_cosine_gap=np.array([0.5]))

    monkeypatch.setattr(demo, 'compare_teacher_student', fake_compare)
    teacher = _Segmentor(SegDataPreProcessor(**stats, bgr_to_rgb=True)).train()
    student = _Segmentor(SegDataPreProcessor(**stats, bgr_to_rgb=True)).train()
    stats_out = demo.compare_on_photos(SimpleNamespace(model=teacher),
                                       SimpleNamespace(model=student), str(tmp_path / 'p.png'))
    assert stats_out == dict(photo_attention_tv=0.25, photo_feature_cosine_gap=0.5)
    reference = SegDataPreProcessor(**stats, bgr_to_rgb=True)
    files = [torch.from_numpy(photos[name][..., ::-1].copy()).permute(2, 0, 1)
             for name in demo.PHOTOS]  # as LoadImageFromFile reads them: BGR
    expected = reference(dict(inputs=files), training=False)['inputs']
    torch.testing.assert_close(seen['images'], expected)
    assert seen['training'] == (False, False)


def _cls_config_file(tmp_path: Path) -> str:
    """A tiny mmpretrain classifier config (not a distillation model), written to a file."""
    from mmengine.config import Config
    cfg = Config(dict(
        default_scope='mmpretrain',
        model=dict(
            type='ImageClassifier',
            data_preprocessor=dict(num_classes=5, mean=[123.675, 116.28, 103.53],
                                   std=[58.395, 57.12, 57.375], to_rgb=True),
            backbone=dict(type='mmlinvit.LinearVisionTransformer', arch=TINY_VIT, img_size=32,
                          patch_size=8, out_type='cls_token'),
            head=dict(type='LinearClsHead', num_classes=5, in_channels=32))))
    path = str(tmp_path / 'cls_cfg.py')
    cfg.dump(path)
    return path


def test_teacher_of_a_plain_model_is_refused(onnx_tools: Any, tmp_path: Path) -> None:
    """``which='teacher'`` of a model that is no distillation model is an error, not the
    model itself exported under the teacher's name; the configured statistics are recorded
    with the config's own decimals (fp32 buffers read back as 123.675, not 123.67500305...)."""
    path = _cls_config_file(tmp_path)
    with pytest.raises(ValueError, match='not a distillation model'):
        onnx_tools.build_export_module(path, None, which='teacher')
    _, info = onnx_tools.build_export_module(path, None)
    assert info['input']['mean'] == [123.675, 116.28, 103.53]
    assert info['input']['std'] == [58.395, 57.12, 57.375]
    assert json.dumps(info['input']['mean']) == '[123.675, 116.28, 103.53]'



def test_models_own_preprocessor_wins_over_the_top_level_one(onnx_tools: Any,
                                                              tmp_path: Path) -> None:
    """A config with a top-level ``data_preprocessor`` AND one in ``model``: mmengine's
    ``Runner`` keeps the model's (``model.setdefault``), so the recorded statistics are the
    model's."""
    from mmengine.config import Config
    cfg = Config.fromfile(_cls_config_file(tmp_path))
    cfg.data_preprocessor = dict(num_classes=5, mean=[1.0, 2.0, 3.0], std=[4.0, 5.0, 6.0])
    path = str(tmp_path / 'both.py')
    cfg.dump(path)
    _, info = onnx_tools.build_export_module(path, None)
    assert info['input']['mean'] == [123.675, 116.28, 103.53]
    assert info['input']['bgr_to_rgb'] is True

def test_segmentor_padding_default_is_mmsegs_corner(onnx_tools: Any) -> None:
    """A segmentor without ``patch_padding`` (mmseg's own ``EncoderDecoder``) pads as mmseg's
    ``stack_batch`` does: zeros at the bottom / right, which the recipe must say."""
    from mmseg.utils import stack_batch
    padded, _ = stack_batch([torch.ones(3, 5, 6)], size_divisor=8, pad_val=0)
    assert padded[0, :, :5, :6].eq(1).all() and padded[0, :, 5:].eq(0).all()
    assert padded[0, :, :, 6:].eq(0).all()  # the image stays in the top-left corner
    model = SimpleNamespace(data_preprocessor=None)
    recipe = onnx_tools.graph_input_convention(
        model, SimpleNamespace(), 'student', dict(patch_size=8, pads_outside_backbone=True))
    assert recipe['patch_padding'] == 'corner' and 'bottom / right' in recipe['prepare']


def test_export_none_checkpoint_in_any_case(export_tool: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented ``'none'`` for random weights is read in any case (``None``, ``NONE``)."""
    seen = []

    def fake_build(config: str, checkpoint: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(checkpoint)
        raise ValueError('stop here')

    monkeypatch.setattr(export_tool, 'build_export_module', fake_build)
    for spelling in ('none', 'None', 'NONE'):
        with pytest.raises(SystemExit, match='stop here'):
            export_tool.main(['cfg.py', spelling])
    assert seen == [None, None, None]


def _identity_onnx(path: str) -> None:
    """A valid one-node ONNX file (images -> out0)."""
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node('Identity', ['images'], ['out0'])], 'g',
                              [helper.make_tensor_value_info('images', TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info('out0', TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid('', 18)]), path)


class _Identity(torch.nn.Module):
    def forward(self, images: torch.Tensor) -> Any:
        return (images, )


def _fake_build(export_tool: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``main`` without a config: an identity backbone (patch 8, padded inside the graph)."""
    pytest.importorskip('onnx')
    info = dict(crop=(8, 8), pads_outside_backbone=False, patch_size=8, which='student',
                part='backbone', model='Identity', backbone='Identity',
                input=dict(prepare='as is'))
    monkeypatch.setattr(export_tool, 'build_export_module',
                        lambda *args, **kwargs: (_Identity(), dict(info)))
    monkeypatch.setattr(export_tool, 'export_onnx',
                        lambda module, images, out, opset: _identity_onnx(out) or ['out0'])


def test_export_check_passes_an_error_equal_to_the_tolerance(
        export_tool: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture) -> None:
    """The exit status is 1 only when the error EXCEEDS atol + rtol x max |ref| (documented):
    an exact graph (identity, real onnxruntime run) with ``--atol 0 --rtol 0`` passes."""
    pytest.importorskip('onnxruntime')
    _fake_build(export_tool, monkeypatch)
    out = str(tmp_path / 'id.onnx')
    result = export_tool.main(['cfg.py', 'none', '--out', out, '--atol', '0', '--rtol', '0',
                               '--threads', '1'])
    assert result['max_abs_error'] == [0.0] and result['tolerance'] == 0.0
    capsys.readouterr()


def test_benchmark_models_are_seeded() -> None:
    """Every benchmarked model has the same random weights in every run (seeded build), so
    that repeated benchmarks time and check the same models."""
    bench = _tool('tools/deployment/benchmark_onnx.py', 'benchmark_onnx')
    for name in (bench.TEACHER, 'adventurer'):
        first = bench.build(name, 'tiny').state_dict()
        torch.randn(7)  # another draw in between changes nothing
        second = bench.build(name, 'tiny').state_dict()
        for key, value in first.items():
            torch.testing.assert_close(second[key], value, msg=key)


# ------------------------------------------------------------------------------- linearize
@pytest.fixture(scope='module')
def linearize() -> Any:
    """tools/linearize.py as a module."""
    return _tool('tools/linearize.py', 'linearize')


def test_linearize_takes_scoped_names(linearize: Any) -> None:
    """Operator and strategy names with the ``mmlinvit.`` scope name the registered classes
    (the registries resolve them), so the checks accept them."""
    from mmlinvit.layers.attention import ATTENTION_OPERATORS
    from mmlinvit.transfer import TRANSFER_STRATEGIES
    assert ATTENTION_OPERATORS.get('mmlinvit.elu') is ATTENTION_OPERATORS.get('elu')
    assert TRANSFER_STRATEGIES.get('mmlinvit.mlp_copy') is TRANSFER_STRATEGIES.get('mlp_copy')
    linearize.check_names('mmlinvit.elu', 'mmlinvit.mlp_copy', 't', 'deit')
    linearize.check_names([{'type': 'mmlinvit.relu'}, 'softmax'], 'mlp_copy', 't', 'deit')


@pytest.mark.filterwarnings('ignore:attention operator')
def test_linearize_explicit_register_count_is_not_warned_about(
        linearize: Any, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """An MHLA student of a register teacher: the "registers dropped" warning appears only
    when they ARE dropped, not with an explicit ``--student-reg-tokens``."""
    from mmlinvit.backbones import VisionTransformer
    arch = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
    teacher = VisionTransformer(arch, family='dinov2', img_size=28, patch_size=14,
                                num_reg_tokens=4)
    src = str(tmp_path / 'reg.pth')
    torch.save(teacher.state_dict(), src)
    common = ['--arch', json.dumps(arch), '--family', 'dinov2', '--operator', 'mhla']
    assert linearize.main([src, str(tmp_path / 'a.pth')] + common) == 0
    assert 'warning: the teacher has 4 register tokens' in capsys.readouterr().err
    assert linearize.main([src, str(tmp_path / 'b.pth'), '--student-reg-tokens', '4']
                          + common) == 0
    assert 'register tokens' not in capsys.readouterr().err
    saved = torch.load(str(tmp_path / 'b.pth'), weights_only=False)
    assert saved['meta']['student_cfg']['num_reg_tokens'] == 4
