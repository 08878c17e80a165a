"""Fixtures shared by the engine tests."""
from typing import Iterator

import pytest
from mmengine.logging import MMLogger


@pytest.fixture(scope='module')
def no_new_global_loggers() -> Iterator[None]:
    """Removes the mmengine global loggers a test module creates, their file handlers closed
    (mmseg / mmengine log through ``print_log(logger='current')``, which creates one when there
    is none; a runner creates one per run)."""
    before = set(MMLogger._instance_dict)
    yield
    for name in set(MMLogger._instance_dict) - before:
        for handler in MMLogger._instance_dict.pop(name).handlers:
            handler.close()
