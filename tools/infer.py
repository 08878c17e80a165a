"""Run a trained mmlinvit model on images with mmseg's / mmpretrain's inferencers.

Usage::

    python tools/infer.py CONFIG CHECKPOINT IMAGE_OR_DIR [IMAGE_OR_DIR ...] --out-dir DIR
        [--device cpu|cuda] [--batch-size N] [--topk K] [--opacity A] [--cfg-options ...]

The config's ``default_scope`` picks the task:

* segmentation (``mmseg``, :class:`mmseg.apis.MMSegInferencer`): ``DIR/vis/<name>`` colour
  overlays (the checkpoint's classes and palette) and ``DIR/pred/<stem>.png`` raw label maps.
  Pixel values are class indices 0..C-1 into ``DIR/classes.json`` (``classes``, ``palette``).
  Note: ADE20K-style annotation files store index + 1 with 0 = unlabelled
  (``reduce_zero_label``); the predictions are the model's indices, not that file convention.
  Label maps are 8-bit PNGs for models of up to 256 classes and 16-bit PNGs beyond.
* classification (``mmpretrain``, :class:`mmpretrain.apis.ImageClassificationInferencer`):
  ``DIR/pred/<stem>.json`` with the top-k classes and scores, ``DIR/topk.json`` (all images)
  and ``DIR/topk.txt`` (one line per image: the path, then ``<class> <score>`` per rank,
  tab-separated), plus ``DIR/vis/<stem>.png`` with the prediction drawn on the image.  Files
  are decoded by the test pipeline's ``LoadImageFromFile`` (e.g. EXIF orientation ignored by
  the ImageNet configs, as in ``tools/test.py``; mmpretrain's inferencer alone turns rotated
  JPEGs).  Configs whose test pipeline takes arrays from the dataset (CIFAR) get
  ``to_rgb=True``, since files are read as BGR (:func:`read_files_as_rgb`).

A directory argument contributes its image files (``--recursive`` descends into
sub-folders).  A progress bar counts images.  Checkpoints of ``mmlinvit.DistillationModel``
runs are accepted when the student is a whole task model (e.g. the distillation segmentation
configs): the student is rebuilt alone from ``model.student`` and its ``student.*`` weights.
``pretrained=`` paths inside the config are not read (the checkpoint carries every weight).

Examples::

    python tools/infer.py configs/demo/upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py \\
        work_dirs/demo/student/iter_200.pth work_dirs/demo/data/toy_ade/ADEChallengeData2016/images/validation \\
        --out-dir work_dirs/demo/infer
"""
import argparse
import json
import os
import os.path as osp
import sys
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmengine.config import Config, ConfigDict, DictAction
from mmengine.runner.checkpoint import _load_checkpoint
from mmengine.utils import ProgressBar
from PIL import Image

from mmlinvit.config_scopes import ConfigsNotInstalledError, register_config_scopes
from mmlinvit.engine.checkpoint_coverage import CheckpointCoverageError, check_checkpoint_covers
from mmlinvit.engine.launch import ToolConfigError, load_config, world_of
from mmlinvit.converters.checkpoint_file import checkpoint_file_problem
from mmlinvit.engine.preflight import clear_checkpoints

#: Image file suffixes a directory argument contributes (mmpretrain's ``CustomDataset``
#: extensions, PPM / PGM included, plus ``.tiff`` and ``.webp``).
IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')
#: ``model.type`` of mmlinvit's distillation wrapper.
DISTILLATION_TYPES = ('mmlinvit.DistillationModel', 'DistillationModel')


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Parses the command line."""
    parser = argparse.ArgumentParser(description='Inference of an mmlinvit config on images')
    parser.add_argument('config', help='config file (segmentation or classification)')
    parser.add_argument('checkpoint', help='trained weights (runner checkpoint)')
    parser.add_argument('inputs', nargs='+', help='image files and/or directories of images')
    parser.add_argument('--out-dir', required=True, help='where results are written')
    parser.add_argument('--device', default=None,
                        help="'cpu', 'cuda', 'cuda:1'... (default: cuda when available)")
    parser.add_argument('--batch-size', type=int, default=1, help='images per forward')
    parser.add_argument('--topk', type=int, default=5, help='classification: classes kept')
    parser.add_argument('--opacity', type=float, default=0.5,
                        help='segmentation: overlay opacity in [0, 1]')
    parser.add_argument('--no-labels', action='store_true',
                        help='segmentation: do not write class names onto the overlays')
    parser.add_argument('--recursive', action='store_true',
                        help='descend into sub-folders of directory arguments')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config keys, e.g. model.test_cfg.mode=slide')
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f'--batch-size must be >= 1, got {args.batch_size}')
    if args.topk < 1:
        parser.error(f'--topk must be >= 1, got {args.topk}')
    if not 0.0 <= args.opacity <= 1.0:
        parser.error(f'--opacity must be in [0, 1], got {args.opacity}')
    return args


def collect_images(inputs: Sequence[str], recursive: bool = False) -> List[str]:
    """Expands files and directories into a sorted list of image paths.

    Args:
        inputs: Image files and / or directories.
        recursive: Descend into sub-directories.

    Returns:
        Image paths, directories expanded in sorted order, duplicates removed.

    Raises:
        FileNotFoundError: An input does not exist, or a directory holds no images.
        ValueError: Two images share a file stem (their outputs would overwrite each other).
    """
    images: List[str] = []
    for item in inputs:
        if osp.isdir(item):
            found = []
            for root, dirs, files in os.walk(item):
                dirs.sort()
                found += [osp.join(root, f) for f in sorted(files)
                          if f.lower().endswith(IMAGE_SUFFIXES)]
                if not recursive:
                    break
            if not found:
                raise FileNotFoundError(f'no images ({", ".join(IMAGE_SUFFIXES)}) in directory '
                                        f'{item!r}' + ('' if recursive else
                                                       ' (use --recursive for sub-folders)'))
            images += found
        elif osp.isfile(item):
            images.append(item)
        else:
            raise FileNotFoundError(f'input {item!r} is neither an image file nor a directory')
    unique = list(dict.fromkeys(osp.normpath(p) for p in images))
    stems: Dict[str, str] = {}
    for path in unique:
        stem = osp.splitext(osp.basename(path))[0]
        if stem in stems:
            raise ValueError(f'{stems[stem]!r} and {path!r} have the same file name stem '
                             f'{stem!r}; their outputs would overwrite each other. Run them '
                             f'separately (different --out-dir).')
        stems[stem] = path
    return unique


def inference_config(cfg: Config, checkpoint: str, tmp_dir: str) -> Tuple[Config, str]:
    """The config and checkpoint an inferencer needs.

    A ``DistillationModel`` with a whole task model as student becomes that student, and its
    ``student.*`` weights are written to a checkpoint of their own in ``tmp_dir``.

    Args:
        cfg: The loaded config.
        checkpoint: The checkpoint given on the command line.
        tmp_dir: Directory for a rewritten checkpoint.

    Returns:
        (config, checkpoint path).
    """
    cfg = cfg.copy()
    model = cfg.model
    if model.get('type') in DISTILLATION_TYPES:
        student = model.get('student')
        if not isinstance(student, dict) or 'backbone' not in student:
            raise ValueError(
                'this DistillationModel trains a bare backbone (no task head), so there is '
                'nothing to run inference with; export it with '
                'tools/model_converters/export_student.py and run a task config whose '
                'backbone loads it (e.g. a Stage-3 / fine-tuning config)')
        student = ConfigDict(student)
        if 'data_preprocessor' not in student and model.get('data_preprocessor'):
            student['data_preprocessor'] = model['data_preprocessor']
        cfg.model = student
        ckpt = _load_checkpoint(checkpoint, map_location='cpu')
        state = ckpt.get('state_dict', ckpt)
        prefix = 'student.'
        kept = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if not kept:
            raise KeyError(f'{checkpoint!r} has no {prefix}* weights; it is not a checkpoint '
                           f'of this DistillationModel config')
        checkpoint = osp.join(tmp_dir, 'student.pth')
        torch.save(dict(state_dict=kept, meta=ckpt.get('meta', {})), checkpoint)
    clear_checkpoints(cfg.model)
    return cfg, checkpoint


def checkpoint_view(path: str) -> Dict[str, Any]:
    """The checkpoint for the tool's own checks (keys, shapes, meta), memory-mapped: the
    inferencer reads the weights itself, so the tensors' data are not read a second time.

    Args:
        path: A local checkpoint file (zip format is mapped; older files are read).
    """
    try:
        return torch.load(path, map_location='cpu', mmap=True, weights_only=False)
    except RuntimeError:  # legacy (non-zip) serialisation cannot be memory-mapped
        return _load_checkpoint(path, map_location='cpu')


def read_files_as_rgb(cfg: Config) -> Optional[str]:
    """Makes a classification config whose dataset yields arrays see image files as RGB.

    mmpretrain's inferencer reads files with ``mmcv.imread`` (BGR, as ``LoadImageFromFile``)
    and drops ``LoadImageFromFile`` from the test pipeline.  A test pipeline without that
    transform gets its images from the dataset as arrays, which mmpretrain's array datasets
    (CIFAR-10 / 100) give in RGB, so such configs set ``to_rgb=False``: with files that would
    hand the model channel-swapped images without any error.  Here ``to_rgb`` becomes True,
    so the model sees RGB as it did in training.

    Args:
        cfg: The inference config (changed in place).

    Returns:
        A note saying what changed, or ``None`` when the test pipeline loads files itself.
    """
    pipeline = cfg.get('test_dataloader', {}).get('dataset', {}).get('pipeline', [])
    if any(_is_file_loader(t) for t in pipeline):
        return None
    changed = []
    for name, pre in (('data_preprocessor', cfg.get('data_preprocessor')),
                      ('model.data_preprocessor', cfg.model.get('data_preprocessor'))):
        if isinstance(pre, dict) and not pre.get('to_rgb', False):
            pre['to_rgb'] = True
            changed.append(name)
    if not changed:
        return None
    return (f'the test pipeline takes arrays from the dataset (RGB), image files are read as '
            f'BGR: set to_rgb=True in {" and ".join(changed)}')


def _save_label_map(label: np.ndarray, path: str, num_classes: int) -> None:
    """Writes class indices as an 8-bit (<= 256 classes) or 16-bit PNG (the model's class
    count decides, so every map of a run has one bit depth), never truncated."""
    label = np.asarray(label)
    if label.min() < 0 or label.max() > 65535:
        raise ValueError(f'label values {label.min()}..{label.max()} do not fit a PNG')
    if num_classes <= 256 and label.max() < 256:
        Image.fromarray(label.astype(np.uint8)).save(path)
    else:
        Image.fromarray(label.astype(np.uint16)).save(path)


def _batched_forward(inferencer: Any, images: List[str],
                     batch_size: int) -> Iterator[Tuple[List[str], Any]]:
    """Yields (image paths, predictions) batch by batch, with one progress bar for all.

    Runs the inferencer's own preprocess and forward steps (its ``__call__`` has a progress
    bar per call and writes its own outputs).
    """
    bar = ProgressBar(len(images), file=sys.stdout)
    for start in range(0, len(images), batch_size):
        batch = images[start:start + batch_size]
        data = next(iter(inferencer.preprocess(batch, batch_size=len(batch))))
        # Images of other sizes after the test pipeline (ADE20K, photo folders) go in
        # separate forwards: mmseg's preprocessor stacks only equal sizes.
        for lo, hi in _equal_shape_runs([tuple(x.shape) for x in data['inputs']]):
            part = {key: value[lo:hi] for key, value in data.items()}
            yield batch[lo:hi], inferencer.forward(part)
        for _ in batch:
            bar.update()
    sys.stdout.write('\n')


def _equal_shape_runs(shapes: List[Tuple[int, ...]]) -> List[Tuple[int, int]]:
    """(start, stop) of the runs of consecutive equal shapes."""
    runs, start = [], 0
    for i in range(1, len(shapes) + 1):
        if i == len(shapes) or shapes[i] != shapes[start]:
            runs.append((start, i))
            start = i
    return runs


def segmentation_classes(cfg: Config, checkpoint: Dict[str, Any]) -> Tuple[Dict[str, Any], str]:
    """Classes and palette of a segmentation checkpoint, and where they come from.

    A runner checkpoint carries them (``meta.dataset_meta``; mmseg 0.x checkpoints
    ``meta.CLASSES`` / ``meta.PALETTE``, read as mmseg's ``init_model`` reads them); for a
    checkpoint without them, mmseg's inferencer would silently name the classes and paint the
    overlays as Cityscapes, so they are taken from the config's test dataset (its class ``METAINFO`` updated by the
    config's ``metainfo``).

    Args:
        cfg: The inference config.
        checkpoint: The loaded checkpoint.

    Returns:
        (``dict(classes=..., palette=...)``, a description of the source).

    Raises:
        ValueError: when neither the checkpoint nor the config's test dataset names classes.
    """
    checkpoint_meta = checkpoint.get('meta') or {}
    meta = checkpoint_meta.get('dataset_meta') or {}
    if meta.get('classes'):
        return (dict(classes=list(meta['classes']),
                     palette=_palette_for(meta['classes'], meta.get('palette'))),
                'the checkpoint')
    if checkpoint_meta.get('CLASSES'):
        # an mmseg 0.x checkpoint: its names and colours, as mmseg's init_model reads them
        return (dict(classes=list(checkpoint_meta['CLASSES']),
                     palette=_palette_for(checkpoint_meta['CLASSES'],
                                          checkpoint_meta.get('PALETTE'))),
                'the checkpoint (mmseg 0.x meta.CLASSES / PALETTE)')
    from mmseg.registry import DATASETS
    dataset = cfg.get('test_dataloader', {}).get('dataset', {})
    kind = dataset.get('type', '')
    # a Python-style config names the class itself (``type=ADE20KDataset``)
    dataset_cls = kind if isinstance(kind, type) else DATASETS.get(str(kind))
    base = dict(getattr(dataset_cls, 'METAINFO', None) or {})
    metainfo = dict(base, **(dataset.get('metainfo') or {}))
    classes, palette = metainfo.get('classes'), metainfo.get('palette')
    if (classes and palette and len(palette) != len(classes) and base.get('palette')
            and set(classes) <= set(base.get('classes') or ())):
        # a subset of the dataset's classes: their own colours, as mmseg's datasets pick them
        index = {name: i for i, name in enumerate(base['classes'])}
        metainfo['palette'] = [base['palette'][index[name]] for name in classes]
    if not metainfo.get('classes'):
        raise ValueError(
            f'the checkpoint has no class names (meta.dataset_meta) and the config\'s test '
            f'dataset {dataset.get("type")!r} names none: set test_dataloader.dataset.metainfo='
            f'dict(classes=[...], palette=[...]) (--cfg-options)')
    return (dict(classes=list(metainfo['classes']),
                 palette=_palette_for(metainfo['classes'], metainfo.get('palette'))),
            f'the config\'s test dataset ({dataset.get("type")}), the checkpoint has none')


def _palette_for(classes: Sequence[str], palette: Optional[Sequence]) -> List[List[int]]:
    """``palette``, or (missing / not one colour per class) fixed random colours, as mmseg's
    datasets make without one."""
    if not palette or len(palette) != len(classes):
        palette = np.random.RandomState(42).randint(0, 255, (len(classes), 3)).tolist()
    return [list(map(int, colour)) for colour in palette]


def run_segmentation(cfg: Config, checkpoint: str, images: List[str], args: argparse.Namespace
                     ) -> List[Dict[str, Any]]:
    """MMSegInferencer over ``images``: overlays in vis/, label maps in pred/."""
    from mmseg.apis import MMSegInferencer
    loaded = checkpoint_view(checkpoint)
    meta, source = segmentation_classes(cfg, loaded)
    inferencer = MMSegInferencer(model=cfg, weights=checkpoint, device=args.device,
                                 show_progress=False, classes=meta['classes'],
                                 palette=meta['palette'])
    check_checkpoint_covers(inferencer.model, loaded, repr(args.checkpoint))
    inferencer.model.dataset_meta = meta
    print(f'classes: {len(meta["classes"])} from {source}', flush=True)
    vis_dir, pred_dir = osp.join(args.out_dir, 'vis'), osp.join(args.out_dir, 'pred')
    os.makedirs(pred_dir, exist_ok=True)
    with open(osp.join(args.out_dir, 'classes.json'), 'w') as f:
        json.dump(dict(classes=list(meta['classes']),
                       palette=[list(map(int, c)) for c in meta['palette']],
                       label_map_values='class index 0..C-1 (model output; no +1 offset)'),
                  f, indent=2)
    rows = []
    for batch, preds in _batched_forward(inferencer, images, args.batch_size):
        # (the inferencer's __call__ would also write counter-named label maps)
        inferencer.visualize(batch, preds, img_out_dir=vis_dir, opacity=args.opacity,
                             with_labels=not args.no_labels)
        labels = inferencer.postprocess(preds, None)['predictions']
        labels = labels if len(batch) > 1 else [labels]
        for path, label in zip(batch, labels):
            stem = osp.splitext(osp.basename(path))[0]
            label_path = osp.join(pred_dir, f'{stem}.png')
            _save_label_map(label, label_path, len(meta['classes']))
            present = np.unique(label)
            rows.append(dict(image=path, overlay=osp.join(vis_dir, osp.basename(path)),
                             label_map=label_path,
                             classes_present=[meta['classes'][int(i)] for i in present]))
    return rows


def _is_file_loader(transform: dict) -> bool:
    """Whether a pipeline entry is ``LoadImageFromFile`` (its type named, with or without a
    scope, or given as the class, as Python-style configs do)."""
    from mmcv.transforms import LoadImageFromFile
    kind = transform.get('type', '')
    if isinstance(kind, type):
        return issubclass(kind, LoadImageFromFile)
    return str(kind).split('.')[-1] == 'LoadImageFromFile'


def _test_pipeline_file_loader(cfg: Config) -> dict:
    """The test pipeline's ``LoadImageFromFile`` settings (mmcv's defaults without one)."""
    pipeline = cfg.get('test_dataloader', {}).get('dataset', {}).get('pipeline', [])
    for transform in pipeline:
        if _is_file_loader(transform):
            return dict(transform)
    return dict(type='LoadImageFromFile')


def classification_inferencer(cfg: Config, checkpoint: str, device: Optional[str]) -> Any:
    """mmpretrain's ``ImageClassificationInferencer`` that decodes files as the test pipeline.

    mmpretrain's inferencer drops the test pipeline's ``LoadImageFromFile`` and reads files
    with ``mmcv.imread``'s defaults, which turn JPEGs by their EXIF orientation: with the
    ImageNet configs (``color_type='color_ignore_orientation'``, as the official evaluations
    decode) a rotated camera JPEG reached the model turned by 90 degrees, unlike in
    ``tools/test.py``.  This one reads files (and draws them) with the test pipeline's own
    ``LoadImageFromFile``.

    Args:
        cfg: The inference config.
        checkpoint: The weights.
        device: ``--device``.

    Returns:
        The inferencer.
    """
    from mmcv.transforms import Compose
    from mmengine.dataset import default_collate
    from mmpretrain.apis import ImageClassificationInferencer
    from mmpretrain.registry import TRANSFORMS

    loader = TRANSFORMS.build(_test_pipeline_file_loader(cfg))

    def read(image: Any) -> np.ndarray:
        """BGR array of a file, decoded as the test pipeline does (arrays pass through)."""
        if isinstance(image, str):
            return loader(dict(img_path=image))['img']
        return image

    class PipelineDecodingInferencer(ImageClassificationInferencer):
        """Reads files with the test pipeline's ``LoadImageFromFile``."""

        def preprocess(self, inputs: List[Any], batch_size: int = 1) -> Iterator[dict]:
            def load(image: Any) -> dict:
                img = read(image)
                return dict(img=img, img_shape=img.shape[:2], ori_shape=img.shape[:2])

            chunks = self._get_chunk_data(map(Compose([load, self.pipeline]), inputs),
                                          batch_size)
            yield from map(default_collate, chunks)

        def visualize(self, ori_inputs: List[Any], preds: List[Any], show: bool = False,
                      wait_time: int = 0, resize: Optional[int] = None,
                      rescale_factor: Optional[float] = None, draw_score: bool = True,
                      show_dir: Optional[str] = None) -> Optional[List[np.ndarray]]:
            """mmpretrain's ``visualize`` (same arguments and outputs) on the images as read."""
            if not show and show_dir is None:
                return None
            if self.visualizer is None:
                from mmpretrain.visualization import UniversalVisualizer
                self.visualizer = UniversalVisualizer()
            drawn = []
            for i, (image, sample) in enumerate(zip(ori_inputs, preds)):
                is_file = isinstance(image, str)
                name = osp.splitext(osp.basename(image))[0] if is_file else str(i)
                out_file = None
                if show_dir is not None:
                    os.makedirs(show_dir, exist_ok=True)
                    out_file = osp.join(show_dir, f'{name}.png')
                pixels = read(image) if is_file else image
                if is_file and pixels.ndim == 3:
                    pixels = pixels[..., ::-1]  # files load BGR; grayscale stays as it is
                self.visualizer.visualize_cls(
                    pixels, sample, classes=self.classes, resize=resize, show=show,
                    wait_time=wait_time, rescale_factor=rescale_factor, draw_gt=False,
                    draw_pred=True, draw_score=draw_score, name=name, out_file=out_file)
                drawn.append(self.visualizer.get_image())
            if show:
                self.visualizer.close()
            return drawn

    return PipelineDecodingInferencer(model=cfg, pretrained=checkpoint, device=device)


def run_classification(cfg: Config, checkpoint: str, images: List[str],
                       args: argparse.Namespace) -> List[Dict[str, Any]]:
    """ImageClassificationInferencer over ``images``: top-k json / txt, drawn images in vis/."""
    inferencer = classification_inferencer(cfg, checkpoint, args.device)
    check_checkpoint_covers(inferencer.model, checkpoint_view(checkpoint), repr(args.checkpoint))
    classes = inferencer.classes
    vis_dir, pred_dir = osp.join(args.out_dir, 'vis'), osp.join(args.out_dir, 'pred')
    os.makedirs(pred_dir, exist_ok=True)
    os.makedirs(vis_dir, exist_ok=True)
    rows = []
    for batch, preds in _batched_forward(inferencer, images, args.batch_size):
        inferencer.visualize(batch, preds, show_dir=vis_dir)
        for path, result in zip(batch, inferencer.postprocess(preds, None)):
            scores = np.asarray(result['pred_scores'], dtype=np.float64)
            k = min(args.topk, scores.size)
            order = np.argsort(-scores, kind='stable')[:k]
            topk = [dict(rank=r + 1, label=int(i), score=float(scores[i]),
                         **({'class': str(classes[i])} if classes is not None else {}))
                    for r, i in enumerate(order)]
            stem = osp.splitext(osp.basename(path))[0]
            row = dict(image=path, topk=topk, visualization=osp.join(vis_dir, f'{stem}.png'))
            with open(osp.join(pred_dir, f'{stem}.json'), 'w') as f:
                json.dump(row, f, indent=2)
            rows.append(row)
    with open(osp.join(args.out_dir, 'topk.txt'), 'w') as f:
        for row in rows:
            # tab-separated: ImageNet class names contain commas
            best = '\t'.join(f'{t.get("class", t["label"])} {t["score"]:.4f}'
                              for t in row['topk'])
            f.write(f'{row["image"]}\t{best}\n')
    return rows


def main(argv: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """Runs inference; returns one record per image (also written to ``DIR/results.json``)."""
    args = parse_args(argv)
    register_config_scopes()
    if not osp.isfile(args.checkpoint):
        raise SystemExit(f'error: checkpoint {args.checkpoint!r} does not exist')
    problem = checkpoint_file_problem(args.checkpoint)  # truncated, changed bytes (CRC-32)
    if problem is not None:
        raise SystemExit(f'error: checkpoint {args.checkpoint!r} {problem}')
    images = collect_images(args.inputs, args.recursive)
    try:
        cfg = load_config(args.config, args.cfg_options)
        world = world_of(cfg)
    except (ConfigsNotInstalledError, ToolConfigError) as err:
        raise SystemExit(f'error: {err}') from None
    os.makedirs(args.out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_dir:
        cfg, checkpoint = inference_config(cfg, args.checkpoint, tmp_dir)
        if world.scope != 'mmseg':
            note = read_files_as_rgb(cfg)
            if note:
                print(f'note: {note}', flush=True)
        print(f'{world.task}: {len(images)} image(s) -> {args.out_dir}', flush=True)
        try:
            if world.scope == 'mmseg':
                rows = run_segmentation(cfg, checkpoint, images, args)
            else:
                rows = run_classification(cfg, checkpoint, images, args)
        except CheckpointCoverageError as err:
            raise SystemExit(f'error: {err}') from None
    name = 'results.json' if world.scope == 'mmseg' else 'topk.json'
    with open(osp.join(args.out_dir, name), 'w') as f:
        json.dump(rows, f, indent=2)
    print(f'wrote {len(rows)} result(s) to {args.out_dir} ({name})')
    return rows


if __name__ == '__main__':
    main()
