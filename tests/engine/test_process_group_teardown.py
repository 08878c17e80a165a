"""Issue 11 item 11: tools/train.py and tools/test.py destroy the process group they trained
or evaluated with.

A gloo group left to the interpreter's exit is torn down while its C++ threads still hold
work with Python references, and the process aborts after a correct run ("terminate called
without an active exception", SIGABRT; pytorch/pytorch#190489).  tools/*.py now end with
``mmlinvit.engine.launch.finish_distributed``.
"""
import os.path as osp
import socket

import pytest
import torch
import torch.distributed as dist

from train_testing import dump, load_tool, make_toy_scenes, toy_config


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


@pytest.fixture
def one_process_group_env(monkeypatch):
    """What torchrun exports for ``--launcher pytorch`` (a group of one process)."""
    for key, value in dict(RANK='0', LOCAL_RANK='0', WORLD_SIZE='1', LOCAL_WORLD_SIZE='1',
                           MASTER_ADDR='127.0.0.1', MASTER_PORT=str(_free_port())).items():
        monkeypatch.setenv(key, value)
    yield
    if dist.is_initialized():  # leave no group behind for the next test
        dist.destroy_process_group()


def test_tools_destroy_the_process_group(tmp_path, one_process_group_env):
    torch.set_num_threads(1)
    data = make_toy_scenes(str(tmp_path / 'toy_ade'), num_train=4)
    work_dir = str(tmp_path / 'wd')
    path = dump(toy_config(data, work_dir, max_iters=2, interval=2), str(tmp_path / 'cfg.py'))
    load_tool('train').main([path, '--work-dir', work_dir, '--launcher', 'pytorch'])
    assert osp.isfile(osp.join(work_dir, 'iter_2.pth'))
    assert not dist.is_initialized()
    load_tool('test').main([path, osp.join(work_dir, 'iter_2.pth'), '--work-dir',
                            str(tmp_path / 'test_wd'), '--launcher', 'pytorch'])
    assert not dist.is_initialized()
