"""Shared pytest settings: small thread count and deterministic seeds for the 2-core CI.

Fixtures for any folder or module to opt in to (``pytestmark =
pytest.mark.usefixtures('one_thread')`` in a module, or an autouse fixture of a folder's
``conftest.py`` that requests them): ``one_thread`` and ``cheap_config_dump``.
"""
import logging
import os
from typing import Iterator, List

# Triton kernels are tested on CPU through the interpreter; it must be switched on before
# triton is first imported (torch._dynamo and timm import it), so do it before anything else.
if not os.path.exists('/dev/nvidia0'):  # no GPU here
    os.environ.setdefault('TRITON_INTERPRET', '1')
os.environ.setdefault('OMP_NUM_THREADS', '2')

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _default_scope() -> Iterator[None]:
    """Each test ends with the mmengine default scope it started with: a Runner (built by many
    tests) makes its config's ``default_scope`` current for the whole process, and a later
    test that builds ``type='CrossEntropyLoss'`` then gets mmpretrain's class instead of
    mmseg's.  (mmengine is not imported here for tests that never import it.)"""
    import sys
    registry = sys.modules.get('mmengine.registry')
    saved = dict(registry.DefaultScope._instance_dict) if registry is not None else None
    yield
    registry = sys.modules.get('mmengine.registry')
    if registry is not None:
        instances = registry.DefaultScope._instance_dict
        instances.clear()
        instances.update(saved or {})


@pytest.fixture
def one_thread():
    """One intra-op thread for the test: tiny models run several times faster than with two
    threads on a shared 2-core machine (no oversubscription); the count is restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _plain_config_text(cfg) -> str:
    return '\n'.join(f'{key} = {value!r}' for key, value in cfg.to_dict().items()) + '\n'


@pytest.fixture(scope='session')
def cheap_config_dump():
    """mmengine formats every dumped config with yapf (~2 s per Runner on the shared cores);
    tests that do not look at the dumped text replace it by one ``key = value`` per line."""
    from mmengine.config import Config
    original = Config.pretty_text
    Config.pretty_text = property(_plain_config_text)
    yield
    Config.pretty_text = original


class _WarningMessages(logging.Handler):
    """Keeps the messages of the records at WARNING or above."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings_logged() -> Iterator[List[str]]:
    """The messages the current MMLogger emits at WARNING or above during the test (it does
    not propagate to the root logger, so pytest's ``caplog`` does not see them)."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    handler = _WarningMessages()
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)
