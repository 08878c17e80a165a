"""Attention of one query patch: softmax teacher vs the students' implied linear maps.

Saves one PNG with a row per chosen layer: the image with the query patch marked, the
teacher's softmax map, each student's implied map (operators with ``attention_map()``: elu,
relu, hedgehog, identity, inline, mhla) and, when the Adventurer backbone exists, its activation
map (cosine similarity of the query patch's feature to every patch after the block at the same
relative depth), each overlaid on the image.  Maps are the mean over heads, or ``--head``.
Signed maps (InLine, identity) are drawn with a diverging colour map centred at 0.

Weights are random unless checkpoints are given (loaded with
:func:`mmlinvit.converters.load_pretrained`); without ``--student-ckpt`` every student gets the
teacher's weights (a student right after linearization, before distillation), so the maps
differ only by the operator.  Without ``--image`` a procedurally drawn scene is used.

Example::

    PYTHONPATH=. python tools/analysis/visualize_attention.py --image cat.jpg --query 7 7 \\
        --students elu inline mhla --layers 0 5 11 --teacher-ckpt deit_base.pth
"""
import argparse
import os
import sys
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mmlinvit.analysis import (activation_similarity_maps, query_attention_maps,  # noqa: E402
                               upsample_map)
from mmlinvit.backbones import VisionTransformer  # noqa: E402
from mmlinvit.converters import load_pretrained  # noqa: E402

ADVENTURER_FILE = os.path.join(ROOT, 'mmlinvit', 'backbones', 'adventurer.py')
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: name -> (label, ViT arch, family, Adventurer arch)
MODELS = {
    'vit-b16': ('ViT-B/16', 'b', 'deit', 'b'),
    'vit-l14': ('ViT-L/14', 'l', 'dinov2', 'l'),
    'tiny': ('tiny/16', dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64),
             'deit', dict(embed_dims=32, num_layers=2)),
}
TINY_ADVENTURER_MIXER = dict(d_state=16, headdim=16)


def parse_size(text: str) -> Tuple[int, int]:
    """``'224'`` -> (224, 224); ``'224x448'`` -> (224, 448) (height x width)."""
    parts = text.lower().split('x')
    if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f'size {text!r} is not N or HxW')
    return int(parts[0]), int(parts[-1])


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--image', default=None, help='image path (default: a generated scene)')
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
    args = parser.parse_args(argv)
    if args.student_ckpt and len(args.student_ckpt) not in (1, len(args.students)):
        parser.error(f'--student-ckpt takes 1 or {len(args.students)} paths (one per student), '
                     f'got {len(args.student_ckpt)}')
    return args


def load_image(path: Optional[str], size_hw: Tuple[int, int], seed: int) -> np.ndarray:
    """(H, W, 3) uint8 RGB image: the file resized, or a generated scene."""
    from PIL import Image
    if path is None:
        from mmlinvit.datasets.synthetic_scenes import draw_scene
        img, _ = draw_scene(np.random.default_rng(seed), size_hw[0], size_hw[1])
        return img
    if not os.path.isfile(path):
        raise FileNotFoundError(f'--image {path!r} does not exist')
    with Image.open(path) as im:
        return np.asarray(im.convert('RGB').resize((size_hw[1], size_hw[0]), Image.BICUBIC))


def to_tensor(img: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(img).float().div(255).permute(2, 0, 1)
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return ((t - mean) / std).unsqueeze(0)


def build_vits(args: argparse.Namespace) -> Tuple[VisionTransformer, List[VisionTransformer]]:
    _, arch, family, _ = MODELS[args.model]
    teacher = VisionTransformer(arch, family=family, attn_cfg='softmax').eval()
    if args.teacher_ckpt:
        load_pretrained(teacher, args.teacher_ckpt, layout=args.checkpoint_layout)
    students = []
    for i, op in enumerate(args.students):
        student = VisionTransformer(arch, family=family, attn_cfg=op).eval()
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
    from mmlinvit.backbones.adventurer import Adventurer
    _, _, _, adv_arch = MODELS[args.model]
    mixer_cfg = TINY_ADVENTURER_MIXER if args.model == 'tiny' else None
    model = Adventurer(adv_arch, patch_size=patch_size, mixer_cfg=mixer_cfg,
                       with_mask_token=args.adventurer_ckpt is None,
                       pretrained=args.adventurer_ckpt)
    model.init_weights()
    return model.eval()


def relative_block(layer: int, depth: int, other_depth: int) -> int:
    """Block of a ``other_depth``-deep model at the relative depth of ``layer``."""
    if depth == 1:
        return other_depth - 1
    return int(round(layer * (other_depth - 1) / (depth - 1)))


def render(image: np.ndarray, columns: List[Tuple[str, Dict[int, torch.Tensor]]],
           layers: List[int], query: Tuple[int, int], patch: int, path: str,
           title: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    h_img, w_img = image.shape[:2]
    ncols = len(columns) + 1
    fig, axes = plt.subplots(len(layers), ncols, figsize=(3.0 * ncols, 3.0 * len(layers)),
                             squeeze=False)
    for r, layer in enumerate(layers):
        ax = axes[r, 0]
        ax.imshow(image)
        ax.add_patch(Rectangle((query[1] * patch, query[0] * patch), patch, patch, fill=False,
                               edgecolor='red', linewidth=2))
        ax.set_title(f'query (row {query[0]}, col {query[1]})', fontsize=9)
        ax.set_ylabel(f'layer {layer}', fontsize=10)
        for c, (name, maps) in enumerate(columns, start=1):
            ax = axes[r, c]
            grid_map, shown_at = maps[layer]
            full = upsample_map(grid_map, (h_img, w_img)).numpy()
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


def main(argv: Optional[List[str]] = None) -> str:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    teacher, students = build_vits(args)
    patch = teacher.patch_size
    image = load_image(args.image, args.img_size, args.seed)
    images = to_tensor(image)
    grid = (image.shape[0] // patch, image.shape[1] // patch)
    query = tuple(args.query) if args.query is not None else (grid[0] // 2, grid[1] // 2)
    depth = teacher.num_layers
    layers = args.layers if args.layers is not None else sorted({0, depth // 2, depth - 1})
    layers = [layer + depth if layer < 0 else layer for layer in layers]

    def with_suffix(maps: Dict[int, torch.Tensor], suffix: str = '') -> Dict[int, tuple]:
        return {k: (v[0], suffix) for k, v in maps.items()}

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
            layer: (sims[block][0], f' (block {block})') for layer, block in blocks.items()
        }))
    weights = 'random weights' if not (args.teacher_ckpt or args.student_ckpt) else 'checkpoints'
    title = (f'{MODELS[args.model][0]}, {image.shape[0]}x{image.shape[1]}, {head_text}, '
             f'{weights}; overlays: attention of the query patch to every patch')
    render(image, columns, layers, query, patch, args.out, title)
    print(f'saved {args.out}')
    return args.out


if __name__ == '__main__':
    main()
