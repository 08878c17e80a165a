"""Fixtures shared by the tool tests: the deployment scripts loaded as modules, launcher
variables set to known values, and mmengine's default scope / torch's thread count restored
after a test."""
import logging
import os.path as osp
import sys
from typing import Any, Iterator

import pytest
import torch

from mmlinvit.utils.cli import load_script

DEPLOY = osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'tools',
                  'deployment')


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
def restore_scope_and_threads() -> Iterator[None]:
    """Tools set mmengine's default scope (``init_default_scope``) and may set the torch thread
    count: both are restored after the test."""
    from mmengine.registry import DefaultScope
    scopes = DefaultScope._instance_dict.copy()
    threads = torch.get_num_threads()
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(scopes)
    torch.set_num_threads(threads)


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
