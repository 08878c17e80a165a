"""tools/slurm_train.sh and tools/slurm_test.sh: the srun command they build (a stand-in
``srun`` on PATH records it), and what a task started by them does on a CPU-only machine."""
import os
import os.path as osp
import stat
import subprocess
import sys
from typing import Dict, List

import pytest

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

# records its arguments, one per line, and the variables the launcher exports
RECORDING_SRUN = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$SRUN_RECORD"
echo "MASTER_PORT=$MASTER_PORT" >> "$SRUN_RECORD.env"
echo "PYTHONPATH=$PYTHONPATH" >> "$SRUN_RECORD.env"
"""

# runs the command as task 0 of 1, with the variables Slurm gives a task
RUNNING_SRUN = """#!/usr/bin/env bash
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do
    case "$1" in -p) shift 2 ;; *) shift ;; esac
done
SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 SLURM_NODELIST=localhost exec "$@"
"""


def _fake_srun(tmp_path, body: str) -> Dict[str, str]:
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    srun = bin_dir / 'srun'
    srun.write_text(body)
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    return dict(os.environ, PATH=f'{bin_dir}{os.pathsep}{os.environ["PATH"]}',
                SRUN_RECORD=str(tmp_path / 'srun_args'), PYTHON=sys.executable,
                CUDA_VISIBLE_DEVICES='', OMP_NUM_THREADS='1')


def _recorded(tmp_path) -> List[str]:
    return (tmp_path / 'srun_args').read_text().splitlines()


def test_slurm_train_builds_the_srun_command(tmp_path):
    env = _fake_srun(tmp_path, RECORDING_SRUN)
    env.update(GPUS='16', GPUS_PER_NODE='8', CPUS_PER_TASK='6', PORT='29511',
               SRUN_ARGS='--quotatype=auto --exclusive')
    proc = subprocess.run(['bash', osp.join(REPO, 'tools', 'slurm_train.sh'), 'gpu', 'adala',
                           'configs/x.py', 'work_dirs/x', '--amp', '--cfg-options', 'a=1'],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    args = _recorded(tmp_path)
    assert args[:2] == ['-p', 'gpu']
    for flag in ('--job-name=adala', '--gres=gpu:8', '--ntasks=16', '--ntasks-per-node=8',
                 '--cpus-per-task=6', '--kill-on-bad-exit=1', '--quotatype=auto',
                 '--exclusive'):
        assert flag in args, args
    command = args[args.index(sys.executable):]
    assert command == [sys.executable, '-u', osp.join(REPO, 'tools', 'train.py'),
                       'configs/x.py', '--work-dir', 'work_dirs/x', '--launcher', 'slurm',
                       '--amp', '--cfg-options', 'a=1']
    exported = (tmp_path / 'srun_args.env').read_text()
    assert 'MASTER_PORT=29511' in exported
    assert f'PYTHONPATH={REPO}' in exported


def test_slurm_train_without_work_dir_and_defaults(tmp_path):
    """A flag as fourth argument is passed on (no work directory); 8 tasks on one node."""
    env = _fake_srun(tmp_path, RECORDING_SRUN)
    for name in ('GPUS', 'GPUS_PER_NODE', 'CPUS_PER_TASK', 'SRUN_ARGS', 'PORT', 'MASTER_PORT'):
        env.pop(name, None)
    proc = subprocess.run(['bash', osp.join(REPO, 'tools', 'slurm_train.sh'), 'gpu', 'job',
                           'c.py', '--resume'], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    args = _recorded(tmp_path)
    assert '--ntasks=8' in args and '--gres=gpu:8' in args and '--cpus-per-task=5' in args
    assert args[args.index(sys.executable):][3:] == ['c.py', '--launcher', 'slurm', '--resume']
    assert 'MASTER_PORT=29500' in (tmp_path / 'srun_args.env').read_text()


def test_slurm_test_builds_the_srun_command(tmp_path):
    env = _fake_srun(tmp_path, RECORDING_SRUN)
    env.update(GPUS='4')
    proc = subprocess.run(['bash', osp.join(REPO, 'tools', 'slurm_test.sh'), 'p', 'eval',
                           'c.py', 'iter_4.pth', '--out', 'o'], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    args = _recorded(tmp_path)
    assert '--ntasks=4' in args and '--gres=gpu:4' in args and '--ntasks-per-node=4' in args
    assert args[args.index(sys.executable):][2:] == [
        osp.join(REPO, 'tools', 'test.py'), 'c.py', 'iter_4.pth', '--launcher', 'slurm',
        '--out', 'o']


@pytest.mark.parametrize('script,argv', [('slurm_train.sh', ['p', 'j']),
                                         ('slurm_test.sh', ['p', 'j', 'c.py'])])
def test_too_few_arguments_print_the_usage(tmp_path, script, argv):
    env = _fake_srun(tmp_path, RECORDING_SRUN)
    proc = subprocess.run(['bash', osp.join(REPO, 'tools', script)] + argv, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert 'usage:' in proc.stderr
    assert not (tmp_path / 'srun_args').exists()


def test_a_slurm_task_on_a_cpu_only_machine_names_torchrun(tmp_path):
    """The task really starts tools/train.py with --launcher slurm: without a GPU it stops
    with one error line naming the torchrun launch (mmengine's own message was a CUDA
    driver error)."""
    env = _fake_srun(tmp_path, RUNNING_SRUN)
    env.update(GPUS='1')
    cfg = tmp_path / 'cfg.py'
    cfg.write_text("default_scope = 'mmseg'\nmodel = dict(type='EncoderDecoder')\n")
    proc = subprocess.run(['bash', osp.join(REPO, 'tools', 'slurm_train.sh'), 'p', 'j',
                           str(cfg), str(tmp_path / 'wd')], env=env, capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode != 0
    assert '--launcher slurm' in proc.stderr and 'torchrun' in proc.stderr, proc.stderr[-2000:]
    assert 'Traceback' not in proc.stderr


def test_the_repository_is_found_with_cdpath_exported_and_master_port_kept(tmp_path):
    """``cd`` consults an exported CDPATH for a relative path (and prints where it went): the
    repository was looked up in another folder with a ``tools`` directory."""
    elsewhere = tmp_path / 'elsewhere'
    (elsewhere / 'tools').mkdir(parents=True)
    env = _fake_srun(tmp_path, RECORDING_SRUN)
    env.pop('PORT', None)
    env.update(CDPATH=str(elsewhere), MASTER_PORT='29777')
    proc = subprocess.run(['bash', osp.join('tools', 'slurm_train.sh'), 'p', 'j', 'c.py'],
                          env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    args = _recorded(tmp_path)
    assert osp.join(REPO, 'tools', 'train.py') in args, args
    exported = (tmp_path / 'srun_args.env').read_text()
    assert f'PYTHONPATH={REPO}' in exported and 'MASTER_PORT=29777' in exported
