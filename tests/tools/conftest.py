"""Fixtures shared by the tool tests: the deployment scripts loaded as modules, launcher
variables set to known values, and the globals tools change (mmengine's default scope, torch's
thread count and generator, ``sys.path``) restored after a test."""
import logging
import os
import os.path as osp
import subprocess
import sys
from typing import Any, Callable, Iterator, List

import pytest
import torch

from mmlinvit.utils.cli import load_script

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEPLOY = osp.join(REPO, 'tools', 'deployment')


@pytest.fixture
def onnx_tools(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``tools/deployment/onnx_tools.py`` as the module ``onnx_tools`` (what the tool scripts
    import); ``sys.path`` and ``sys.modules`` are restored afterwards."""
    monkeypatch.setattr(sys, 'path', list(sys.path))
    module = load_script(osp.join(DEPLOY, 'onnx_tools.py'), 'onnx_tools')
    monkeypatch.setitem(sys.modules, 'onnx_tools', module)
    return module


@pytest.fixture
def export_tool(onnx_tools: Any) -> Any:
    """``tools/deployment/export_onnx.py`` as a module (its ``sys.path`` insertions undone by
    the ``onnx_tools`` fixture)."""
    return load_script(osp.join(DEPLOY, 'export_onnx.py'), 'export_onnx_under_test')


@pytest.fixture
def clean_launch_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Launcher variables set to known values (and restored) around a tool's main()."""
    monkeypatch.setenv('LOCAL_RANK', '0')
    monkeypatch.setenv('RANK', '0')
    monkeypatch.setenv('WORLD_SIZE', '1')
    return monkeypatch


@pytest.fixture
def restore_globals() -> Iterator[None]:
    """Tools set mmengine's default scope (``init_default_scope``), may set the torch thread
    count, seed torch's global generator (``tools/linearize.py --seed``) and extend
    ``sys.path``: all are restored after the test."""
    from mmengine.registry import DefaultScope
    scopes = DefaultScope._instance_dict.copy()
    threads = torch.get_num_threads()
    rng = torch.get_rng_state()
    path = list(sys.path)
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(scopes)
    torch.set_num_threads(threads)
    torch.set_rng_state(rng)
    sys.path[:] = path


@pytest.fixture
def mmlinvit_logger(monkeypatch: pytest.MonkeyPatch) -> logging.Logger:
    """The ``mmlinvit`` logger with the forwarder as its only handler (restored after)."""
    import mmlinvit.registry  # noqa: F401  (installs the forwarder)
    from mmlinvit.log_forwarding import LOGGER_NAME, MMLoggerForwarder
    logger = logging.getLogger(LOGGER_NAME)
    forwarders = [h for h in logger.handlers if isinstance(h, MMLoggerForwarder)]
    assert len(forwarders) == 1
    monkeypatch.setattr(logger, 'handlers', forwarders)
    return logger


@pytest.fixture
def fresh_interpreter(tmp_path: Any) -> Callable[[str], List[str]]:
    """Runs Python code in a fresh interpreter (the repository on ``PYTHONPATH``, ``tmp_path``
    as the working directory), asserts it succeeded and returns its stdout words: for what an
    import does when nothing has been imported before."""

    def run(code: str) -> List[str]:
        env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS='1')
        proc = subprocess.run([sys.executable, '-c', code], cwd=str(tmp_path), env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.split()

    return run
