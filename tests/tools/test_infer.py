"""tools/infer.py through mmseg's / mmpretrain's inferencers on models the real Runner trained.

The reference for every prediction is the Runner's own test path on the same images (test
dataloader + ``model.test_step``), which shares no code with the tool.
"""
import importlib.util
import json
import os
import os.path as osp

import numpy as np
import pytest
import torch
from PIL import Image

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO_STUDENT = osp.join(REPO, 'configs', 'demo', 'upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py')


def _load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f'mmlinvit_tool_{name}',
                                                  osp.join(REPO, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train(cfg, work_dir: str, iters: int = 2) -> str:
    """Trains ``cfg`` for ``iters`` iterations with the Runner; returns the checkpoint."""
    from mmengine.runner import Runner
    cfg.work_dir = work_dir
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters, val_interval=1000)
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', by_epoch=False, interval=iters)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.log_level = 'WARNING'
    cfg.experiment_name = f'infer_test_{osp.basename(work_dir)}'
    Runner.from_cfg(cfg).train()
    ckpt = osp.join(work_dir, f'iter_{iters}.pth')
    assert osp.isfile(ckpt)
    return ckpt


def _runner_predictions(cfg, ckpt: str, work_dir: str):
    """(image path, data sample) of the Runner's test dataloader + model.test_step."""
    from mmengine.runner import Runner
    cfg = cfg.copy()
    cfg.work_dir = work_dir
    cfg.load_from = None
    cfg.experiment_name = f'infer_ref_{osp.basename(work_dir)}'
    runner = Runner.from_cfg(cfg)
    runner.load_checkpoint(ckpt, map_location='cpu')
    model = runner.model.eval()
    out = []
    with torch.no_grad():
        for data in runner.test_dataloader:
            for sample in model.test_step(data):
                out.append((sample.img_path, sample))
    return out


@pytest.fixture(scope='module')
def demo_student(tmp_path_factory):
    """The demo's ELU+1 student config trained for 2 iterations on generated scenes."""
    from mmengine.config import Config

    from mmlinvit.config_scopes import register_config_scopes
    from mmlinvit.datasets import make_ade20k_layout
    register_config_scopes()
    tmp = tmp_path_factory.mktemp('seg_infer')
    data_root = str(tmp / 'toy_ade')
    make_ade20k_layout(data_root, num_train=4, num_val=3, size=(64, 64), seed=1)
    cfg = Config.fromfile(DEMO_STUDENT)
    cfg.model.backbone.pretrained = None  # the demo sets Stage 2's weights; not needed here
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = data_root
        cfg[loader].batch_size = 2
    ckpt = _train(cfg, str(tmp / 'wd'))
    cfg_file = str(tmp / 'student_cfg.py')
    cfg.dump(cfg_file)
    return cfg, cfg_file, ckpt, osp.join(data_root, 'images', 'validation'), tmp


def test_segmentation_overlays_and_label_maps_match_runner(demo_student, capsys):
    cfg, cfg_file, ckpt, images, tmp = demo_student
    out_dir = str(tmp / 'out_seg')
    infer = _load_tool('infer')
    rows = infer.main([cfg_file, ckpt, images, '--out-dir', out_dir, '--device', 'cpu',
                       '--batch-size', '2'])
    printed = capsys.readouterr().out
    assert '3/3' in printed  # the progress bar counted the images
    names = sorted(os.listdir(images))
    assert len(rows) == len(names) == 3
    classes = json.load(open(osp.join(out_dir, 'classes.json')))
    assert classes['classes'] == list(cfg.metainfo['classes'])
    reference = {osp.basename(p): s.pred_sem_seg.data[0].numpy()
                 for p, s in _runner_predictions(cfg, ckpt, str(tmp / 'ref_seg'))}
    for name in names:
        stem = osp.splitext(name)[0]
        label = np.array(Image.open(osp.join(out_dir, 'pred', f'{stem}.png')))
        np.testing.assert_array_equal(label, reference[name])
        image = np.array(Image.open(osp.join(images, name)).convert('RGB'))
        overlay = np.array(Image.open(osp.join(out_dir, 'vis', name)).convert('RGB'))
        assert overlay.shape == image.shape
        assert np.abs(overlay.astype(int) - image.astype(int)).mean() > 5  # colour drawn
    assert sorted(os.listdir(osp.join(out_dir, 'pred'))) == [  # nothing else written there
        osp.splitext(n)[0] + '.png' for n in names]
    results = json.load(open(osp.join(out_dir, 'results.json')))
    assert [osp.basename(r['image']) for r in results] == names


def test_batches_of_images_of_other_sizes(demo_student, tmp_path):
    """--batch-size 3 over images of three sizes (a photo folder, ADE20K val): each image's
    label map is the one it gets alone (mmseg's preprocessor stacks equal sizes only; the
    batch was refused with 'The image size in a batch should be the same')."""
    _, cfg_file, ckpt, images, _ = demo_student
    mixed = tmp_path / 'mixed'
    mixed.mkdir()
    for name, size in zip(sorted(os.listdir(images)), ((64, 64), (80, 48), (48, 96))):
        Image.open(osp.join(images, name)).resize(size).save(mixed / name)
    infer = _load_tool('infer')
    labels = {}
    for batch in (1, 3):
        out_dir = str(tmp_path / f'out_{batch}')
        infer.main([cfg_file, ckpt, str(mixed), '--out-dir', out_dir, '--device', 'cpu',
                    '--batch-size', str(batch)])
        labels[batch] = {n: np.array(Image.open(osp.join(out_dir, 'pred', n)))
                         for n in sorted(os.listdir(osp.join(out_dir, 'pred')))}
    assert len(labels[1]) == 3 and sorted(labels[1]) == sorted(labels[3])
    for name, label in labels[1].items():
        np.testing.assert_array_equal(labels[3][name], label)


def test_distillation_checkpoint_runs_its_student(demo_student, tmp_path):
    """A DistillationModel checkpoint (student.* keys) predicts like the bare student."""
    cfg, cfg_file, ckpt, images, tmp = demo_student
    state = torch.load(ckpt, map_location='cpu', weights_only=False)
    state['state_dict'] = {f'student.{k}': v for k, v in state['state_dict'].items()}
    distill_ckpt = str(tmp_path / 'distill.pth')
    torch.save(state, distill_ckpt)
    distill_cfg = cfg.copy()
    distill_cfg.model = dict(type='mmlinvit.DistillationModel', student=cfg.model.to_dict(),
                             teacher=dict(type='mmlinvit.VisionTransformer', arch='t',
                                          pretrained='does/not/exist.pth'))
    distill_file = str(tmp_path / 'distill_cfg.py')
    distill_cfg.dump(distill_file)
    infer = _load_tool('infer')
    infer.main([cfg_file, ckpt, images, '--out-dir', str(tmp_path / 'plain'), '--device', 'cpu'])
    infer.main([distill_file, distill_ckpt, images, '--out-dir', str(tmp_path / 'distill'),
                '--device', 'cpu', '--no-labels'])
    for name in os.listdir(tmp_path / 'plain' / 'pred'):
        a = np.array(Image.open(tmp_path / 'plain' / 'pred' / name))
        b = np.array(Image.open(tmp_path / 'distill' / 'pred' / name))
        np.testing.assert_array_equal(a, b)


def test_bad_inputs_fail_clearly(demo_student, tmp_path):
    _, cfg_file, ckpt, images, _ = demo_student
    infer = _load_tool('infer')
    with pytest.raises(FileNotFoundError, match='neither an image file nor a directory'):
        infer.main([cfg_file, ckpt, str(tmp_path / 'nope.jpg'), '--out-dir', str(tmp_path)])
    (tmp_path / 'empty').mkdir()
    with pytest.raises(FileNotFoundError, match='no images'):
        infer.main([cfg_file, ckpt, str(tmp_path / 'empty'), '--out-dir', str(tmp_path)])
    with pytest.raises(SystemExit, match='does not exist'):
        infer.main([cfg_file, str(tmp_path / 'x.pth'), images, '--out-dir', str(tmp_path)])
    # a tensor byte changed after saving: torch.load (and mmengine) would read it silently
    import shutil

    from checkpoint_damage import flip_tensor_byte
    changed = str(tmp_path / 'changed.pth')
    shutil.copy(ckpt, changed)
    record = flip_tensor_byte(changed)
    with pytest.raises(SystemExit, match=rf"is damaged: its record '{record}' fails its CRC-32"):
        infer.main([cfg_file, changed, images, '--out-dir', str(tmp_path / 'out')])
    assert not (tmp_path / 'out').exists()
    # a config whose default_scope no tool world serves: one error line, not a KeyError trace
    with pytest.raises(SystemExit, match="error: default_scope='mmdet' is not supported"):
        infer.main([cfg_file, ckpt, images, '--out-dir', str(tmp_path / 'out'),
                    '--cfg-options', 'default_scope=mmdet'])
    assert not (tmp_path / 'out').exists()


def _classification_config(data_root: str):
    from mmengine.config import Config
    pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=32),
                dict(type='PackInputs')]

    def loader(shuffle):
        return dict(batch_size=2, num_workers=0,
                    sampler=dict(type='DefaultSampler', shuffle=shuffle),
                    dataset=dict(type='CustomDataset', data_root=data_root, pipeline=pipeline))

    return Config(dict(
        default_scope='mmpretrain',
        model=dict(
            type='ImageClassifier',
            data_preprocessor=dict(num_classes=3, mean=[127.5] * 3, std=[64.0] * 3,
                                   to_rgb=True),
            backbone=dict(type='mmlinvit.LinearVisionTransformer',
                          arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                                    mlp_hidden_dims=64),
                          img_size=32, patch_size=8, out_type='cls_token'),
            head=dict(type='LinearClsHead', num_classes=3, in_channels=32,
                      loss=dict(type='CrossEntropyLoss'))),
        train_dataloader=loader(True), test_dataloader=loader(False),
        test_cfg=dict(), test_evaluator=dict(type='Accuracy', topk=(1, )),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        default_hooks=dict(logger=dict(type='LoggerHook', interval=1)),
        visualizer=dict(type='UniversalVisualizer'),
        env_cfg=dict(dist_cfg=dict(backend='gloo')), randomness=dict(seed=0)))


def test_classification_topk_matches_runner(tmp_path, capsys):
    from mmlinvit.config_scopes import register_config_scopes
    register_config_scopes()
    rng = np.random.default_rng(0)
    data_root = tmp_path / 'cls'
    for c, name in enumerate(('cat', 'dog', 'fox')):
        (data_root / name).mkdir(parents=True)
        for i in range(2):
            img = rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)
            img[..., c] = 255
            Image.fromarray(img).save(data_root / name / f'{name}{i}.png')
    cfg = _classification_config(str(data_root))
    ckpt = _train(cfg, str(tmp_path / 'wd'))
    cfg_file = str(tmp_path / 'cls_cfg.py')
    cfg.dump(cfg_file)
    out_dir = tmp_path / 'out'
    inputs = [str(data_root / 'cat'), str(data_root / 'dog'), str(data_root / 'fox' / 'fox0.png')]
    infer = _load_tool('infer')
    rows = infer.main([cfg_file, ckpt, *inputs, '--out-dir', str(out_dir), '--topk', '2',
                       '--device', 'cpu'])
    assert '5/5' in capsys.readouterr().out
    assert len(rows) == 5
    reference = {osp.basename(p): s.pred_score.numpy()
                 for p, s in _runner_predictions(cfg, ckpt, str(tmp_path / 'ref'))}
    lines = (out_dir / 'topk.txt').read_text().splitlines()
    assert len(lines) == 5 and all(len(line.split('\t')) == 3 for line in lines)  # path, top 2
    for row in rows:
        name = osp.basename(row['image'])
        scores = reference[name]
        order = np.argsort(-scores)[:2]
        saved = json.load(open(out_dir / 'pred' / f'{osp.splitext(name)[0]}.json'))
        assert [t['label'] for t in saved['topk']] == order.tolist()
        assert [t['class'] for t in saved['topk']] == [['cat', 'dog', 'fox'][i] for i in order]
        np.testing.assert_allclose([t['score'] for t in saved['topk']], scores[order],
                                   rtol=1e-5, atol=1e-6)
        assert osp.isfile(saved['visualization'])


def test_array_dataset_config_reads_files_as_rgb(tmp_path, capsys):
    """CIFAR configs evaluate RGB arrays with to_rgb=False; image files (read as BGR) must
    reach the model in RGB too.  Reference: the config's own test pipeline and data
    preprocessor on the RGB array of the file, as the CIFAR evaluation feeds it."""
    from mmengine.config import Config
    from mmengine.dataset import Compose, default_collate
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS, TRANSFORMS

    from mmlinvit.config_scopes import register_config_scopes
    register_config_scopes()
    rel = 'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-t-elu_8xb64-300e_cifar10-224x224.py'
    cfg = Config.fromfile(osp.join(REPO, 'configs', rel))
    assert cfg.data_preprocessor.to_rgb is False  # the dataset yields RGB arrays
    student = cfg.model.student
    student.backbone.update(arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                                      mlp_hidden_dims=64), img_size=32, patch_size=8)
    student.head.in_channels = 32
    cfg.test_dataloader.dataset.pipeline[0].update(scale=32)
    cfg_file = str(tmp_path / 'cifar_cfg.py')
    cfg.dump(cfg_file)

    init_default_scope('mmpretrain')
    torch.manual_seed(0)
    model = MODELS.build(dict(student.to_dict(),
                              data_preprocessor=cfg.data_preprocessor.to_dict())).eval()
    for p in model.parameters():  # a model that tells the channels apart
        p.data.normal_(0, 0.3)
    ckpt = str(tmp_path / 'run.pth')
    torch.save(dict(state_dict={f'student.{k}': v for k, v in model.state_dict().items()}),
               ckpt)
    rgb = np.zeros((32, 32, 3), dtype=np.uint8)
    rgb[..., 0] = 250
    rgb[8:, :, 1] = 120
    Image.fromarray(rgb).save(tmp_path / 'red.png')

    pipeline = Compose([TRANSFORMS.build(t) for t in cfg.test_dataloader.dataset.pipeline])
    with torch.no_grad():
        expected = model.test_step(default_collate([pipeline(dict(img=rgb))]))[0].pred_score
        swapped = model.test_step(
            default_collate([pipeline(dict(img=rgb[..., ::-1].copy()))]))[0].pred_score
    assert (expected - swapped).abs().max() > 1e-3  # the channel order matters here

    infer = _load_tool('infer')
    rows = infer.main([cfg_file, ckpt, str(tmp_path / 'red.png'), '--out-dir',
                       str(tmp_path / 'out'), '--topk', '10', '--device', 'cpu'])
    scores = {t['label']: t['score'] for t in rows[0]['topk']}
    np.testing.assert_allclose([scores[i] for i in range(10)], expected.numpy(), rtol=1e-5,
                               atol=1e-6)
    assert 'set to_rgb=True' in capsys.readouterr().out


def test_checkpoint_without_classes_or_weights(demo_student, tmp_path, capsys):
    """A state-dict-only checkpoint is named with the config's classes (mmseg's inferencer
    would call them Cityscapes classes), and a bare backbone file is refused instead of
    predicting with a random head."""
    cfg, cfg_file, ckpt, images, _ = demo_student
    state = torch.load(ckpt, map_location='cpu', weights_only=False)['state_dict']
    bare_state = str(tmp_path / 'weights_only.pth')
    torch.save(dict(state_dict=state), bare_state)
    infer = _load_tool('infer')
    plain = infer.main([cfg_file, ckpt, images, '--out-dir', str(tmp_path / 'a'),
                        '--device', 'cpu'])
    rows = infer.main([cfg_file, bare_state, images, '--out-dir', str(tmp_path / 'b'),
                       '--device', 'cpu'])
    assert "from the config's test dataset" in capsys.readouterr().out
    classes = json.load(open(tmp_path / 'b' / 'classes.json'))
    assert classes['classes'] == list(cfg.metainfo['classes'])
    assert [r['classes_present'] for r in rows] == [r['classes_present'] for r in plain]
    backbone = str(tmp_path / 'student_backbone.pth')
    torch.save({k[len('backbone.'):]: v for k, v in state.items() if k.startswith('backbone.')},
               backbone)
    with pytest.raises(SystemExit, match=r'(?s)decode_head \d+/\d+.*bare backbone'):
        infer.main([cfg_file, backbone, images, '--out-dir', str(tmp_path / 'c'),
                    '--device', 'cpu'])


def test_classification_decodes_files_as_the_test_pipeline(tmp_path):
    """A camera JPEG with an EXIF rotation: the ImageNet configs decode it as stored
    (``color_type='color_ignore_orientation'``, as tools/test.py); mmpretrain's inferencer read
    it with ``mmcv.imread`` and turned it by 90 degrees.  Reference: the config's test pipeline
    on the file and the model's test step."""
    from mmengine.dataset import Compose, default_collate
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS, TRANSFORMS

    from mmlinvit.config_scopes import register_config_scopes
    register_config_scopes()
    cfg = _classification_config(str(tmp_path))
    cfg.test_dataloader.dataset.pipeline[0] = dict(type='LoadImageFromFile',
                                                   color_type='color_ignore_orientation')
    cfg.test_dataloader.dataset.metainfo = dict(classes=('a', 'b', 'c'))
    cfg_file = str(tmp_path / 'cfg.py')
    cfg.dump(cfg_file)
    init_default_scope('mmpretrain')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    for p in model.parameters():  # weights that tell the orientations apart
        p.data.normal_(0, 0.3)
    ckpt = str(tmp_path / 'model.pth')
    torch.save(dict(meta=dict(dataset_meta=dict(classes=['a', 'b', 'c'])),
                    state_dict=model.state_dict()), ckpt)
    rng = np.random.default_rng(0)
    pixels = np.zeros((24, 40, 3), dtype=np.uint8)
    pixels[:8] = 250  # a bright top band: turned, it becomes a side band
    pixels[8:] = rng.integers(0, 90, (16, 40, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display
    photo = str(tmp_path / 'photo.jpg')
    Image.fromarray(pixels).save(photo, quality=95, exif=exif)

    def scores(loader: dict) -> np.ndarray:
        pipeline = Compose([TRANSFORMS.build(t)
                            for t in [loader] + cfg.test_dataloader.dataset.pipeline[1:]])
        with torch.no_grad():
            return model.test_step(default_collate([pipeline(dict(img_path=photo))])
                                   )[0].pred_score.numpy()

    expected = scores(cfg.test_dataloader.dataset.pipeline[0])
    turned = scores(dict(type='LoadImageFromFile'))  # mmcv.imread's default: EXIF applied
    assert np.abs(expected - turned).max() > 1e-3
    infer = _load_tool('infer')
    rows = infer.main([cfg_file, ckpt, photo, '--out-dir', str(tmp_path / 'out'), '--topk', '3',
                       '--device', 'cpu'])
    got = {t['label']: t['score'] for t in rows[0]['topk']}
    np.testing.assert_allclose([got[i] for i in range(3)], expected, rtol=1e-5, atol=1e-6)
    drawn = np.asarray(Image.open(rows[0]['visualization']))
    assert drawn.shape[:2] == (24, 40)  # drawn as decoded, not turned


def test_segmentation_checkpoint_classes_without_palette(demo_student, tmp_path):
    """A checkpoint naming classes without a palette (hand-made / converted files) crashed
    inside mmseg ("The length of classes should be equal to palette"); it gets mmseg's fixed
    random colours, and label maps of a > 256-class model are 16-bit on every image."""
    cfg, cfg_file, ckpt, images, _ = demo_student
    loaded = torch.load(ckpt, map_location='cpu', weights_only=False)
    classes = list(loaded['meta']['dataset_meta']['classes'])
    loaded['meta']['dataset_meta'] = dict(classes=classes)
    no_palette = str(tmp_path / 'no_palette.pth')
    torch.save(loaded, no_palette)
    infer = _load_tool('infer')
    rows = infer.main([cfg_file, no_palette, images, '--out-dir', str(tmp_path / 'out'),
                       '--device', 'cpu'])
    saved = json.load(open(tmp_path / 'out' / 'classes.json'))
    assert len(saved['palette']) == len(classes) and len(rows) == 3
    assert Image.open(rows[0]['label_map']).mode == 'L'
    label = np.array(Image.open(rows[0]['label_map']))
    path = str(tmp_path / 'wide.png')
    infer._save_label_map(label, path, num_classes=300)
    wide = Image.open(path)
    assert wide.mode.startswith('I;16') and np.array_equal(np.array(wide), label)


def test_file_loader_given_as_a_class_keeps_its_decoding():
    """A Python-style config names the loader by its class: it was not recognised and mmcv's
    defaults (EXIF applied) replaced color_type='color_ignore_orientation'."""
    from mmcv.transforms import LoadImageFromFile
    from mmengine.config import Config
    infer = _load_tool('infer')
    cfg = Config(dict(test_dataloader=dict(dataset=dict(pipeline=[
        dict(type=LoadImageFromFile, color_type='color_ignore_orientation'),
        dict(type='PackInputs')]))))
    loader = infer._test_pipeline_file_loader(cfg)
    assert loader['color_type'] == 'color_ignore_orientation'
    assert infer.read_files_as_rgb(cfg) is None  # files are loaded by the pipeline itself
