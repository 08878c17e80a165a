"""Attention of one query patch: softmax teacher vs the students' implied linear maps.

Saves one PNG with a row per (image, chosen layer): the image with the query patch marked,
the teacher's softmax map, each student's implied map (operators with ``attention_map()``:
elu, relu, hedgehog, identity, inline, mhla) and, when the Adventurer backbone exists, its
activation map (cosine similarity of the query patch's feature to every patch after the block
at the same relative depth), each overlaid on the image.  Maps are the mean over heads, or
``--head``.  Signed maps (InLine, identity) are drawn with a diverging colour map centred at 0.
``--compare-out`` adds a second PNG comparing the teacher with the first student: attention
maps and their difference, the first three principal components of the final patch features
(teacher basis) as RGB, and the per-patch cosine gap of those features.

Images (``--image``, several allowed): real photographs shipped with scikit-image
(``astronaut``, ``chelsea``, ``coffee``, ``rocket``, ``motorcycle``; the default is
``astronaut chelsea``), an image file (an existing path wins over a photo name), or ``scene``
for a procedurally drawn scene.  Each is centre-cropped to the aspect of ``--img-size``.

Weights are random unless checkpoints are given (loaded with
:func:`mmlinvit.converters.load_pretrained`); without ``--student-ckpt`` every student gets the
teacher's weights (a student right after linearization, before distillation), so the maps
differ only by the operator.

Example::

    python tools/analysis/visualize_attention.py --image chelsea cat.jpg --query 7 7 \\
        --students elu inline mhla --layers 0 5 11 --teacher-ckpt deit_base.pth \\
        --compare-out work_dirs/visualize_attention/compare.png
"""
import argparse
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mmlinvit.analysis import (COMPARED_MODELS, REAL_PHOTOS, ComparedModel,  # noqa: E402
                               activation_similarity_maps, center_crop_resize,
                               compare_teacher_student, load_photo, query_attention_maps,
                               save_teacher_student_figure, upsample_map)
from mmlinvit.backbones import VisionTransformer  # noqa: E402
from mmlinvit.backbones.outputs import resolve_out_indices  # noqa: E402
from mmlinvit.converters import load_pretrained  # noqa: E402
from mmlinvit.layers.patch_embed import patch_grid  # noqa: E402
from mmlinvit.utils.benchmarking import parse_size  # noqa: E402

ADVENTURER_FILE = os.path.join(ROOT, 'mmlinvit', 'backbones', 'adventurer.py')
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MODELS = dict(COMPARED_MODELS, tiny=ComparedModel(
    'tiny/16', dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64), 'deit',
    dict(embed_dims=32, num_layers=2), adventurer_mixer=dict(d_state=16, headdim=16)))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--image', nargs='+', default=['astronaut', 'chelsea'],
                        help=f'image files, scikit-image photos ({", ".join(REAL_PHOTOS)}) or '
                        f'"scene" (a generated scene); default: astronaut chelsea')
    parser.add_argument('--img-size', type=parse_size, default=(224, 224),
                        help='resize to N or HxW pixels')
    parser.add_argument('--model', default='vit-b16', choices=list(MODELS))
    parser.add_argument('--students', nargs='+', default=['elu'],
                        help='student operators (need attention_map())')
    parser.add_argument('--layers', nargs='+', type=int, default=None,
                        help='block indices (default: first, middle, last)')
    parser.add_argument('--query', nargs=2, type=int, default=None, metavar=('ROW', 'COL'),
                        help='query patch on the patch grid (default: the centre)')
    parser.add_argument('--head', type=int, default=None, help='one head (default: mean)')
    parser.add_argument('--teacher-ckpt', default=None)
    parser.add_argument('--student-ckpt', nargs='+', default=None,
                        help='one checkpoint for all students, or one per student')
    parser.add_argument('--checkpoint-layout', default='auto')
    parser.add_argument('--no-adventurer', action='store_true',
                        help='skip the Adventurer activation maps')
    parser.add_argument('--adventurer-ckpt', default=None)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--out', default=os.path.join(ROOT, 'work_dirs', 'visualize_attention',
                                                      'attention_maps.png'))
    parser.add_argument('--compare-out', default=None,
                        help='also write the teacher vs first-student comparison PNG here '
                        '(attention difference, feature PCA, cosine gap)')
    args = parser.parse_args(argv)
    if args.student_ckpt and len(args.student_ckpt) not in (1, len(args.students)):
        parser.error(f'--student-ckpt takes 1 or {len(args.students)} paths (one per student), '
                     f'got {len(args.student_ckpt)}')
    return args


def load_image(source: str, size_hw: Tuple[int, int], seed: int) -> Tuple[np.ndarray, str]:
    """(H, W, 3) uint8 RGB image and its caption.

    Args:
        source: An image file (wins when it exists), a :data:`REAL_PHOTOS` name, or
            ``'scene'`` for a generated scene.
        size_hw: Output (height, width); files and photos are centre-cropped to its aspect.
        seed: Seed of the generated scene.
    """
    from PIL import Image
    if os.path.isfile(source):
        with Image.open(source) as im:
            return center_crop_resize(np.asarray(im.convert('RGB')), size_hw), \
                os.path.basename(source)
    if source in REAL_PHOTOS:
        return load_photo(source, size_hw), source
    if source == 'scene':
        from mmlinvit.datasets.synthetic_scenes import draw_scene
        img, _ = draw_scene(np.random.default_rng(seed), size_hw[0], size_hw[1])
        return img, 'generated scene'
    raise FileNotFoundError(f'--image {source!r} is neither an existing file, nor a '
                            f'scikit-image photo ({", ".join(REAL_PHOTOS)}), nor "scene"')


def to_tensor(img: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(img).float().div(255).permute(2, 0, 1)
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return ((t - mean) / std).unsqueeze(0)


def build_vits(args: argparse.Namespace) -> Tuple[VisionTransformer, List[VisionTransformer]]:
    pair = MODELS[args.model]
    teacher = pair.build_vit('softmax').eval()
    if args.teacher_ckpt:
        load_pretrained(teacher, args.teacher_ckpt, layout=args.checkpoint_layout)
    students = []
    for i, op in enumerate(args.students):
        student = pair.build_vit(op).eval()
        if args.student_ckpt:
            ckpt = args.student_ckpt[0 if len(args.student_ckpt) == 1 else i]
            load_pretrained(student, ckpt, layout=args.checkpoint_layout)
        else:
            result = student.load_state_dict(teacher.state_dict(), strict=False)
            if result.unexpected_keys:
                raise RuntimeError(f'teacher keys {result.unexpected_keys} do not exist in the '
                                   f'{op!r} student')
        students.append(student)
    return teacher, students


def build_adventurer(args: argparse.Namespace, patch_size: int) -> torch.nn.Module:
    model = MODELS[args.model].build_adventurer(patch_size,
                                                with_mask_token=args.adventurer_ckpt is None,
                                                pretrained=args.adventurer_ckpt)
    model.init_weights()
    return model.eval()


def relative_block(layer: int, depth: int, other_depth: int) -> int:
    """Block of a ``other_depth``-deep model at the relative depth of ``layer``."""
    if depth == 1:
        return other_depth - 1
    return int(round(layer * (other_depth - 1) / (depth - 1)))


def render(images: List[np.ndarray], captions: List[str],
           columns: List[Tuple[str, Dict[int, tuple]]], layers: List[int],
           query: Tuple[int, int], patch: int, path: str, title: str) -> None:
    """One row per (image, layer); ``columns`` map layer -> ((B, h, w) maps, title suffix)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    nrows, ncols = len(images) * len(layers), len(columns) + 1
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.0 * ncols, 3.0 * nrows), squeeze=False)
    for r in range(nrows):
        index, layer = divmod(r, len(layers))
        image, layer = images[index], layers[layer]
        h_img, w_img = image.shape[:2]
        ax = axes[r, 0]
        ax.imshow(image)
        ax.add_patch(Rectangle((query[1] * patch, query[0] * patch), patch, patch, fill=False,
                               edgecolor='red', linewidth=2))
        ax.set_title(f'query (row {query[0]}, col {query[1]})', fontsize=9)
        ax.set_ylabel(f'{captions[index]}\nlayer {layer}', fontsize=10)
        for c, (name, maps) in enumerate(columns, start=1):
            ax = axes[r, c]
            grid_maps, shown_at = maps[layer]
            full = upsample_map(grid_maps[index], (h_img, w_img), patch_size=patch).numpy()
            lo, hi = float(full.min()), float(full.max())
            ax.imshow(image)
            if lo < 0:
                bound = max(abs(lo), abs(hi)) or 1.0
                overlay = ax.imshow(full, cmap='coolwarm', vmin=-bound, vmax=bound, alpha=0.6)
            else:
                overlay = ax.imshow(full, cmap='inferno', vmin=lo, vmax=hi if hi > lo else lo + 1,
                                    alpha=0.6)
            fig.colorbar(overlay, ax=ax, fraction=0.046, pad=0.02)
            ax.add_patch(Rectangle((query[1] * patch, query[0] * patch), patch, patch,
                                   fill=False, edgecolor='white', linewidth=1))
            ax.set_title(f'{name}{shown_at}' + (' (signed)' if lo < 0 else ''), fontsize=9)
        for ax in axes[r]:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def default_query(hw: Sequence[int], patch_size: int) -> Tuple[int, int]:
    """The centre patch (row, col) of the corner-padded patch grid of an (H, W) image.

    Args:
        hw: Image height and width in pixels.
        patch_size: Patch side.
    """
    grid = patch_grid(hw, patch_size)
    return grid[0] // 2, grid[1] // 2


def main(argv: Optional[List[str]] = None) -> str:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    teacher, students = build_vits(args)
    patch = teacher.patch_size
    loaded = [load_image(source, args.img_size, args.seed) for source in args.image]
    pictures = [image for image, _ in loaded]
    captions = [caption for _, caption in loaded]
    images = torch.cat([to_tensor(image) for image in pictures])
    query = (tuple(args.query) if args.query is not None else
             default_query(pictures[0].shape[:2], patch))
    depth = teacher.num_layers
    layers = args.layers if args.layers is not None else sorted({0, depth // 2, depth - 1})
    layers = resolve_out_indices(layers, depth, 'layers')  # negative: from the end

    def with_suffix(maps: Dict[int, torch.Tensor], suffix: str = '') -> Dict[int, tuple]:
        return {k: (v, suffix) for k, v in maps.items()}

    head_text = 'mean over heads' if args.head is None else f'head {args.head}'
    columns = [('softmax (teacher)',
                with_suffix(query_attention_maps(teacher, images, query, layers, args.head)))]
    for op, student in zip(args.students, students):
        maps = query_attention_maps(student, images, query, layers, args.head)
        columns.append((f'{op} (student, implied)', with_suffix(maps)))
    if not args.no_adventurer and os.path.exists(ADVENTURER_FILE):
        adventurer = build_adventurer(args, patch)
        blocks = {layer: relative_block(layer, depth, adventurer.num_layers) for layer in layers}
        sims = activation_similarity_maps(adventurer, images, query, sorted(set(blocks.values())))
        columns.append(('Adventurer cos-sim', {
            layer: (sims[block], f' (block {block})') for layer, block in blocks.items()
        }))
    weights = 'random weights' if not (args.teacher_ckpt or args.student_ckpt) else 'checkpoints'
    size = f'{pictures[0].shape[0]}x{pictures[0].shape[1]}'
    title = (f'{MODELS[args.model].label}, {size}, {head_text}, {weights}; overlays: attention of '
             f'the query patch to every patch')
    render(pictures, captions, columns, layers, query, patch, args.out, title)
    print(f'saved {args.out}')
    if args.compare_out:
        cmp = compare_teacher_student(teacher, students[0], images, query, layer=layers[-1])
        save_teacher_student_figure(
            args.compare_out, pictures, captions, cmp, patch,
            title=f'{MODELS[args.model].label}: softmax teacher vs {args.students[0]} student '
            f'({weights})')
        print(f'saved {args.compare_out}')
    return args.out


if __name__ == '__main__':
    main()
