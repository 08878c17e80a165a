"""Export a linearized student (ViT or Adventurer) or a softmax teacher to ONNX and check it.

``python tools/deployment/export_onnx.py CONFIG CHECKPOINT`` builds the config's model,
loads the checkpoint (runner checkpoint, exported ``student_backbone.pth`` or any state dict
whose keys match under ``backbone.`` / ``student.`` / ``teacher.`` ...) and writes ONE ONNX
file.  Checkpoints are read with ``torch.load(weights_only=True)``; an mmengine runner
checkpoint (``iter_N.pth`` / ``epoch_N.pth``) also holds pickled training state (message hub,
optimizer), which only a full unpickle reads: pass ``--trust-checkpoint`` for such a file
when you trust it (unpickling runs code from the file).

* ``--part auto`` (default): mmseg segmentors and mmpretrain classifiers export whole, in
  ``mode='tensor'`` (segmentation: decode-head logits at 4 x the backbone's grid, e.g. (B,
  classes, H / 4, W / 4) for UPerNet at patch 16, 4 H / 14 for patch 14: resize them to the
  image; classification: class logits); a distillation model exports its student's backbone
  (a bare backbone student) or its student task model; ``--part backbone`` exports the
  backbone only (outputs ``out0``... = the ``out_indices`` features).  Mask2Former heads need
  data samples and cannot be exported whole: export their backbone;
* the graph takes the data preprocessor's OUTPUT (channel swap and normalisation are not in
  it): the mean / std / channel swap are printed and written into the file's
  ``metadata_props`` (``mmlinvit.input.*``); ``--which teacher`` records the teacher's own
  statistics (``teacher_input_norm``); a slide-inference config's graph is one window;
* ``--which teacher`` exports a distillation config's softmax teacher instead of the student.

The graph has a FIXED input size, ``--shape H W`` (default: the config's crop), batch
``--batch``: the ViTs resample their position grid to the input grid in ``forward``, so the
grid is part of the graph; export once per deployment resolution.  ``torch.onnx.export`` runs
with ``dynamo=True`` (``torch.export``); while exporting, kernel linear attention takes its
whole-tensor form (``linear_attention_graph``).

The file is then run with onnxruntime (CPU) on a fresh random input (not the one traced) and
compared with PyTorch; the maximum absolute error per output is printed, and the exit code is
1 when it exceeds ``--atol`` plus ``--rtol`` times the largest PyTorch magnitude.

Example::

    PYTHONPATH=. python tools/deployment/export_onnx.py \\
        configs/segmentation/upernet_adala-dinov2-l-elu_8xb2-160k_ade20k-518x518.py \\
        work_dirs/x/iter_160000.pth --out work_dirs/x/model.onnx --trust-checkpoint
"""
import argparse
import ast
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from mmlinvit.converters import UntrustedCheckpointError  # noqa: E402
from mmlinvit.converters.checkpoint_file import CheckpointFileError  # noqa: E402
from mmlinvit.utils.cli import add_trust_checkpoint_argument  # noqa: E402
from onnx_tools import (DEFAULT_OPSET, PARTS, WHICH, build_export_module,  # noqa: E402
                        check_export_shape, export_onnx, max_abs_errors, onnxruntime_outputs,
                        onnxruntime_session, write_onnx_metadata)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('checkpoint', help="checkpoint file, or 'none' for random weights")
    parser.add_argument('--out', default=None,
                        help='output .onnx (default: next to the checkpoint / work_dirs/onnx)')
    parser.add_argument('--part', default='auto', choices=PARTS)
    parser.add_argument('--which', default='student', choices=WHICH)
    add_trust_checkpoint_argument(
        parser, 'a runner checkpoint (iter_N.pth / epoch_N.pth), which holds training state '
        'besides tensors')
    parser.add_argument('--shape', nargs=2, type=int, default=None, metavar=('H', 'W'),
                        help="input size baked into the graph (default: the config's crop)")
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--opset', type=int, default=DEFAULT_OPSET)
    parser.add_argument('--atol', type=float, default=1e-4)
    parser.add_argument('--rtol', type=float, default=1e-4,
                        help='tolerance relative to the largest |PyTorch output|')
    parser.add_argument('--threads', type=int, default=2, help='onnxruntime intra-op threads')
    parser.add_argument('--no-check', action='store_true', help='skip the onnxruntime check')
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        help='key=value config overrides (python literals)')
    return parser.parse_args(argv)


def _cfg_options(items: List[str]) -> Optional[Dict[str, Any]]:
    options = {}
    for item in items:
        if '=' not in item:
            raise SystemExit(f'--cfg-options entry {item!r} is not key=value')
        key, value = item.split('=', 1)
        try:
            options[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[key] = value
    return options or None


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    checkpoint = None if args.checkpoint.lower() == 'none' else args.checkpoint
    if checkpoint is not None and not os.path.isfile(checkpoint):
        raise SystemExit(f'error: checkpoint {checkpoint} does not exist (pass "none" to export '
                         'random weights)')
    try:
        module, info = build_export_module(args.config, checkpoint, args.part, args.which,
                                           _cfg_options(args.cfg_options),
                                           trust_checkpoint=args.trust_checkpoint)
    except (UntrustedCheckpointError, CheckpointFileError, ValueError) as err:
        raise SystemExit(f'error: {err}') from None
    h, w = args.shape or info['crop']
    if info['pads_outside_backbone']:  # a segmentor pads outside the graph's backbone
        try:
            check_export_shape((h, w), info['patch_size'])
        except ValueError as err:
            raise SystemExit(f'error: {err}') from None
    elif info['patch_size'] and (h % info['patch_size'] or w % info['patch_size']):
        print(f'note: {h}x{w} is not a multiple of the patch size {info["patch_size"]}: the '
              f'graph pads it inside the backbone (bottom / right), as the evaluated model does')
    out = args.out or os.path.join(
        os.path.dirname(os.path.abspath(checkpoint)) if checkpoint else
        os.path.join(ROOT, 'work_dirs', 'onnx'),
        f'{os.path.splitext(os.path.basename(args.config))[0]}_{args.which}_{info["part"]}_'
        f'{h}x{w}.onnx')
    torch.manual_seed(0)
    images = torch.randn(args.batch, 3, h, w)
    t0 = time.perf_counter()
    names = export_onnx(module, images, out, args.opset)
    write_onnx_metadata(out, {f'mmlinvit.input.{k}': v for k, v in info['input'].items()})
    info.update(onnx=out, shape=[args.batch, 3, h, w], outputs=names,
                export_s=round(time.perf_counter() - t0, 1))
    print(f'exported {info["which"]} {info["part"]} ({info["model"]}, backbone '
          f'{info["backbone"]}) at {args.batch}x3x{h}x{w} to {out} in {info["export_s"]} s')
    print(f'  input: {info["input"]["prepare"]} (also in the file\'s metadata_props '
          f'mmlinvit.input.*)')
    if not args.no_check:
        # a fresh input, not the traced one: catches values specialised into the graph
        check_images = torch.randn(args.batch, 3, h, w,
                                   generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            ref = list(module(check_images))
        got = onnxruntime_outputs(onnxruntime_session(out, args.threads), check_images)
        errors = max_abs_errors(got, ref)
        scale = max(float(r.abs().max()) for r in ref)
        bound = args.atol + args.rtol * scale
        info.update(max_abs_error=errors, max_abs_reference=scale, tolerance=bound)
        for name, err, r in zip(names, errors, ref):
            print(f'  {name} {tuple(r.shape)}: max |onnxruntime - pytorch| = {err:.3e}')
        print(f'  tolerance {bound:.3e} (atol {args.atol} + rtol {args.rtol} x max |ref| '
              f'{scale:.3e})')
        if not all(err <= bound for err in errors):  # a NaN error fails too
            print(json.dumps(info))
            raise SystemExit(1)
    print(json.dumps(info))
    return info


if __name__ == '__main__':
    main()
