"""A 2-process DDP (gloo, torchrun) run of a distillation config completes and stays in sync."""
import json
import os
import os.path as osp
import socket
import sys

from distill_testing import REPO, save_tiny_vit_checkpoint, write_image_folder
from torchrun_retry import GLOO_TEARDOWN_ABORT, run_multiprocess

HERE = osp.dirname(osp.abspath(__file__))
CONFIG = 'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-t-elu_8xb64-300e_cifar10-224x224.py'


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def test_two_process_ddp_distillation(tmp_path):
    data = write_image_folder(str(tmp_path / 'data'), num_per_class=4)
    teacher = save_tiny_vit_checkpoint(str(tmp_path / 'deit.pth'), family='deit')
    work_dir = str(tmp_path / 'work')
    os.makedirs(work_dir)
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get('PYTHONPATH', '')]))
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2',
           '--master_addr', '127.0.0.1', '--master_port', str(_free_port()),
           osp.join(HERE, 'run_ddp_distill.py'), CONFIG, data, work_dir, teacher]
    proc = run_multiprocess(cmd, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert GLOO_TEARDOWN_ABORT not in proc.stderr  # the process group is destroyed at the end
    results = [json.load(open(osp.join(work_dir, f'rank{r}.json'))) for r in (0, 1)]
    assert all(r['wrapped'] and r['wrapper'] == 'MMDistributedDataParallel' for r in results)
    assert all(r['world_size'] == 2 for r in results)
    # 8 images, 2 per GPU, 2 GPUs -> 2 iterations per rank; gradients were all-reduced
    assert [len(r['history']) for r in results] == [2, 2]
    assert results[0]['student_sha256'] == results[1]['student_sha256']
    assert 'distill.loss_attn_out' in results[0]['history'][0]
    assert osp.isfile(osp.join(work_dir, 'epoch_1.pth'))
