"""Entry point of the 2-process DDP test (run by torchrun; not a test module itself).

Usage: torchrun --nproc_per_node 2 run_ddp_distill.py CONFIG DATA_ROOT WORK_DIR TEACHER_CKPT
"""
import hashlib
import json
import os
import os.path as osp
import sys

import torch

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

from mmengine.config import Config  # noqa: E402
from mmengine.dist import get_rank  # noqa: E402
from mmengine.model import is_model_wrapper  # noqa: E402

from mmlinvit.engine.launch import (build_runner, finish_distributed,  # noqa: E402
                                     prepare_train_config)

from distill_testing import CONFIGS, LossRecorderHook, shrink_config  # noqa: E402


def main() -> None:
    config, data_root, work_dir, teacher_ckpt = sys.argv[1:5]
    torch.set_num_threads(1)
    cfg = Config.fromfile(osp.join(CONFIGS, config))
    shrink_config(cfg, data_root, work_dir, max_epochs=1, teacher_ckpt=teacher_ckpt)
    # the project's launch path (tools/dist_train.sh): gloo + CPU-friendly DDP wrapper
    prepare_train_config(cfg, config, work_dir=work_dir, launcher='pytorch')
    runner = build_runner(cfg, mode='train')
    recorder = LossRecorderHook()
    runner.register_hook(recorder)
    runner.train()
    model = runner.model
    wrapped = is_model_wrapper(model)
    student = (model.module if wrapped else model).student
    digest = hashlib.sha256()
    for name, param in sorted(student.state_dict().items()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().numpy().tobytes())
    out = dict(rank=get_rank(), world_size=int(os.environ['WORLD_SIZE']), wrapped=wrapped,
               wrapper=type(model).__name__, student_sha256=digest.hexdigest(),
               history=recorder.history)
    with open(osp.join(work_dir, f'rank{get_rank()}.json'), 'w') as f:
        json.dump(out, f)
    finish_distributed()  # as tools/train.py: no gloo group left to the interpreter's exit


if __name__ == '__main__':
    main()
