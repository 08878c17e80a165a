"""Which images (and label maps) a dataset config will find, counted before anything is built.

mmseg's ``BaseSegDataset`` lists ``<img_path>/**/*<img_suffix>`` (or the stems of its
``ann_file``) and expects ``<seg_map_path>/<stem><seg_map_suffix>`` next to each image;
mmpretrain's ``CustomDataset`` / ``ImageNet`` list class sub-folders (or the lines of an
``ann_file``) for files with one of its ``extensions``.  An empty folder or a wrong suffix
makes that list empty, and mmengine then fails inside ``Runner.train()`` with "need at least
one array to concatenate"; an image without its label map fails hours later in a data worker.

:func:`pair_dataset_files` applies the same rules to the folders with ``os.walk`` (one walk per
folder, no decoding) and returns a :class:`PairingReport` with the counts and, when something
does not pair up, a message naming the folder, the suffix looked for and what was found.  The
dataset's own class resolves the paths and suffix defaults (it is built with
``lazy_init=True``, which reads no file), so the rules follow mmseg / mmpretrain exactly.
"""
import collections
import copy
import dataclasses
import os
import os.path as osp
from typing import Any, Dict, List, Optional, Sequence, Set

from mmengine.registry import DATASETS, DefaultScope

#: Examples shown per problem.
MAX_EXAMPLES = 3
#: Cityscapes label maps in train ids, as mmseg's converter names them.
CITYSCAPES_TRAIN_ID_SUFFIX = '_gtFine_labelTrainIds.png'


@dataclasses.dataclass
class PairingReport:
    """What a dataset will load.

    Args:
        where: Config location of the dataset (``train_dataloader.dataset``).
        layout: ``'segmentation'`` (images + label maps) or ``'classification'`` (images).
        num_images: Images the dataset will list.
        num_labels: Of those, images whose label map exists (segmentation), or ``None``.
        problems: Human-readable problems (empty: the files pair up).
    """

    where: str
    layout: str
    num_images: int = 0
    num_labels: Optional[int] = None
    problems: List[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        """One line with the counts, for the log."""
        labels = '' if self.num_labels is None else f', {self.num_labels} label maps'
        return f'{self.where}: {self.num_images} images{labels}'


def build_lazy_dataset(dataset_cfg: dict, scope: Optional[str]) -> Any:
    """Builds a dataset config through mmengine's registry without reading its files.

    Args:
        dataset_cfg: One (non-wrapper) dataset config.
        scope: The config's ``default_scope`` (``'mmseg'`` / ``'mmpretrain'``).

    Returns:
        The dataset, built with ``lazy_init=True`` (paths joined, suffixes resolved).
    """
    cfg = copy.deepcopy(dict(dataset_cfg))
    cfg['lazy_init'] = True
    if scope is None:
        return DATASETS.build(cfg)
    with DefaultScope.overwrite_default_scope(scope):
        return DATASETS.build(cfg)


def _walk(folder: str) -> List[str]:
    """Relative paths ('/'-separated) of every file under ``folder``, sorted.

    Only what can be opened counts: a dangling symbolic link (``os.walk`` lists it among the
    files) is skipped, as mmengine's ``list_dir_or_file`` skips it (``entry.is_file()``).
    """
    found = []
    for root, _, files in os.walk(folder, followlinks=True):
        rel_root = osp.relpath(root, folder)
        for name in files:
            if not osp.isfile(osp.join(root, name)):
                continue
            found.append(name if rel_root == '.' else f'{rel_root}/{name}'.replace(os.sep, '/'))
    return sorted(found)


def describe_files(files: Sequence[str]) -> str:
    """``'64 files: 60 *.png, 4 *.txt (e.g. 'a.png', ...)'`` or ``'no files at all'``."""
    if not files:
        return 'no files at all'
    by_ext = collections.Counter(osp.splitext(f)[1].lower() or '(no extension)' for f in files)
    kinds = ', '.join(f'{n} *{ext}' for ext, n in by_ext.most_common(5))
    examples = ', '.join(repr(f) for f in files[:MAX_EXAMPLES])
    return f'{len(files)} files: {kinds} (e.g. {examples})'


def _examples(items: Sequence[str]) -> str:
    shown = ', '.join(repr(i) for i in items[:MAX_EXAMPLES])
    return shown + (f' and {len(items) - MAX_EXAMPLES} more' if len(items) > MAX_EXAMPLES else '')


def _has_ann_file(ann_file: str) -> bool:
    return bool(ann_file) and not osp.isdir(ann_file)  # mmseg: '' joined with data_root = a dir


def _listed(files: Sequence[str]) -> List[str]:
    """The files of :func:`_walk` that mmengine's ``list_dir_or_file`` lists (mmseg's and
    mmpretrain's folder modes): it skips file names starting with '.', e.g. the ``._*``
    AppleDouble files a copy from macOS leaves beside every image."""
    return [f for f in files if not f.rsplit('/', 1)[-1].startswith('.')]


def _read_lines(path: str, report: PairingReport, strip: bool = True) -> List[str]:
    """The non-blank lines of an annotation file; blank ones are a problem of the report.

    mmengine's ``list_from_file`` keeps blank lines, and mmseg reads one as the image
    ``<img_path>/<img_suffix>`` (mmpretrain as an image without a name): the run fails in a
    data worker when the sampler reaches it.  ``strip=False`` keeps each line as
    ``list_from_file`` returns it (mmpretrain's unlabelled mode joins it whole to the folder).
    """
    with open(path) as f:
        raw = f.read().splitlines()
    lines = [line.strip() for line in raw]
    blank = [i + 1 for i, line in enumerate(lines) if not line]
    if blank:
        shown = ', '.join(str(i) for i in blank[:MAX_EXAMPLES]) + (
            f' and {len(blank) - MAX_EXAMPLES} more' if len(blank) > MAX_EXAMPLES else '')
        report.problems.append(
            f'{report.where}: the annotation file {path!r} has {len(blank)} blank line(s) (line '
            f'{shown}); mmseg / mmpretrain read each as an image without a name, and the run '
            f'would stop when the sampler reaches it. Fix: remove the blank lines.')
    return [kept for kept, line in zip(lines if strip else raw, lines) if line]


def _pair_segmentation(ds: Any, report: PairingReport) -> None:
    img_dir = ds.data_prefix.get('img_path') or ''
    seg_dir = ds.data_prefix.get('seg_map_path')
    img_suffix, seg_suffix = ds.img_suffix, ds.seg_map_suffix
    img_files = _walk(img_dir)
    if _has_ann_file(ds.ann_file):
        stems = _read_lines(ds.ann_file, report)
        present = set(img_files)
        missing = [s + img_suffix for s in stems if s + img_suffix not in present]
        if missing:
            report.problems.append(
                f'{report.where}: {len(missing)} of the {len(stems)} images listed in '
                f'{ds.ann_file!r} are not in {img_dir!r} (looked for <stem>{img_suffix}, e.g. '
                f'{_examples(missing)}); the folder holds {describe_files(img_files)}. Fix '
                f'img_suffix or data_prefix.img_path, or the list.')
        stems = [s for s in stems if s + img_suffix in present]
        images = [s + img_suffix for s in stems]
    else:
        images = [f for f in _listed(img_files) if f.endswith(img_suffix)]
        # mmseg: img[:-len(img_suffix)], i.e. '' for every image when img_suffix is ''
        stems = [f[:-len(img_suffix)] for f in images]
        if not images:
            report.problems.append(
                f'{report.where}: no images *{img_suffix} under {img_dir!r} (img_suffix='
                f'{img_suffix!r}); found {describe_files(img_files)}. Set img_suffix to the '
                f"images' ending (e.g. --cfg-options {report.where}.img_suffix=...) or point "
                f'data_prefix.img_path at the image folder.')
    report.num_images = len(images)
    if seg_dir is None or not images:
        return
    if not img_suffix and not _has_ann_file(ds.ann_file) and len(images) > 1:
        # every stem is '': mmseg opens <seg_map_path>/<seg_map_suffix> (a hidden file the
        # walk does not list, when it exists) as the label map of every image
        report.num_labels = 0
        report.problems.append(
            f"{report.where}: img_suffix='' with {len(images)} images under {img_dir!r}: "
            f"mmseg cuts len('') = 0 characters off each image name (img[:-0] is '') and "
            f'pairs every image with the same label map <seg_map_path>/{seg_suffix}. Set '
            f"img_suffix to the images' ending (e.g. --cfg-options {report.where}.img_suffix="
            f'.jpg).')
        return
    label_files: Set[str] = set(_walk(seg_dir))
    unpaired = [s for s in stems if s + seg_suffix not in label_files]
    report.num_labels = len(images) - len(unpaired)
    if unpaired:
        converted = [s for s in stems if s + seg_suffix in label_files]
        if seg_suffix.endswith(CITYSCAPES_TRAIN_ID_SUFFIX) and converted:
            fix = (f'The *{CITYSCAPES_TRAIN_ID_SUFFIX} maps are written by mmseg\'s Cityscapes '
                   f'converter and only some exist: the conversion did not finish. Run it again '
                   f'(pip install cityscapesscripts; python tools/dataset_converters/'
                   f'cityscapes.py <data_root> --nproc 8 from an mmsegmentation checkout); do '
                   f'not point seg_map_suffix at *_gtFine_labelIds.png, which holds the raw '
                   f'label ids 0-33, not the 19 train ids.')
        else:
            fix = ('Fix seg_map_suffix or data_prefix.seg_map_path, or add the missing label '
                   'maps.')
        report.problems.append(
            f'{report.where}: {len(unpaired)} of {len(images)} images under {img_dir!r} have no '
            f'label map <stem>{seg_suffix} under {seg_dir!r} (seg_map_suffix={seg_suffix!r}; '
            f'e.g. {_examples([s + seg_suffix for s in unpaired])}); that folder holds '
            f'{describe_files(sorted(label_files))}. {fix}')


def _has_int_label(line: str) -> bool:
    """Whether mmpretrain reads ``line`` as ``<image> <label>``: it splits the stripped line
    at its last space and takes ``int`` of the second part."""
    parts = line.rsplit(' ', 1)
    if len(parts) != 2:
        return False
    try:
        int(parts[1])
    except ValueError:
        return False
    return True


def _pair_classification(ds: Any, report: PairingReport) -> None:
    folder = ds.img_prefix
    if not osp.isdir(folder):
        report.problems.append(f'{report.where}: the image folder {folder!r} does not exist.')
        return
    files = _walk(folder)
    extensions = tuple(sorted(ds.extensions))
    valid = [f for f in _listed(files) if f.lower().endswith(extensions)]
    if _has_ann_file(ds.ann_file):
        # mmpretrain: x.strip().rsplit(' ', 1) with labels, the raw line without
        lines = _read_lines(ds.ann_file, report, strip=ds.with_label)
        names = [line.rsplit(' ', 1)[0] if ds.with_label else line for line in lines]
        if ds.with_label:
            unlabelled = [(i, line) for i, line in enumerate(lines, 1)
                          if not _has_int_label(line)]
            if unlabelled:
                shown = '; '.join(f'line {i}: {line!r}' for i, line in unlabelled[:MAX_EXAMPLES])
                report.problems.append(
                    f'{report.where}: {len(unlabelled)} line(s) of {ds.ann_file!r} do not end in '
                    f'an integer label ({shown}); mmpretrain splits each line at its last space '
                    f'into "<image> <label>" and stops loading the data list with ValueError. '
                    f'Fix: write "<image> <class index>" on each line, or set with_label=False '
                    f'for a list of images only.')
        present = set(files)
        missing = [n for n in names if n not in present]
        report.num_images = len(names) - len(missing)
        if missing:
            report.problems.append(
                f'{report.where}: {len(missing)} of the {len(names)} images listed in '
                f'{ds.ann_file!r} are not under {folder!r} (e.g. {_examples(missing)}); the '
                f'folder holds {describe_files(files)}.')
        elif not names:
            report.problems.append(f'{report.where}: the annotation file {ds.ann_file!r} lists '
                                   f'no images.')
        return
    loose = [f for f in valid if '/' not in f]
    if ds.with_label:  # one sub-folder per class; files directly in the folder are ignored
        valid = [f for f in valid if '/' in f]
    report.num_images = len(valid)
    if not valid:
        layout = ('<class>/*' if ds.with_label else '**/*')
        flat = ''
        if ds.with_label and loose:
            flat = (f' The {len(loose)} images lie directly in the folder (as '
                    f'ILSVRC2012_img_val.tar extracts), where a labelled dataset does not look '
                    f'without an annotation file: give one that lists \'<file> <class index>\' '
                    f'per line (ImageNet reads <data_root>/meta/<split>.txt when it exists, '
                    f'e.g. \'ILSVRC2012_val_00000001.JPEG 65\'), or move the images into '
                    f'their class folders.')
        report.problems.append(
            f'{report.where}: no images {layout}{{{",".join(extensions)}}} under {folder!r} '
            f'(with_label={ds.with_label}); found {describe_files(files)}.{flat} Point '
            f'data_prefix at the image folder'
            + (', put each class in its own sub-folder' if ds.with_label else '')
            + ', or set extensions= to the images\' ending.')


def pair_dataset_files(dataset_cfg: dict, where: str,
                       scope: Optional[str]) -> Optional[PairingReport]:
    """Counts the images (and label maps) a dataset config will load; reports what is off.

    Args:
        dataset_cfg: One (non-wrapper) dataset config whose folders exist.
        where: Its config location, for messages.
        scope: The config's ``default_scope``.

    Returns:
        A :class:`PairingReport`, or ``None`` for datasets that do not read image folders
        (e.g. CIFAR's pickled batches, COCO json).
    """
    ds = build_lazy_dataset(dataset_cfg, scope)
    prefix: Dict[str, Any] = getattr(ds, 'data_prefix', None) or {}
    if hasattr(ds, 'img_suffix') and hasattr(ds, 'seg_map_suffix') and prefix.get('img_path'):
        report = PairingReport(where, 'segmentation')
        _pair_segmentation(ds, report)
        return report
    if hasattr(ds, 'extensions') and hasattr(ds, 'with_label') and prefix.get('img_path'):
        report = PairingReport(where, 'classification')
        _pair_classification(ds, report)
        return report
    return None
