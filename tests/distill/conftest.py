"""Distillation-test settings: cheap config dumps (mmengine formats them with yapf, ~2 s per
Runner on the shared CI cores; the dumped text is not under test)."""
import pytest
from mmengine.config import Config


def _plain_text(cfg: Config) -> str:
    return '\n'.join(f'{key} = {value!r}' for key, value in cfg.to_dict().items()) + '\n'


@pytest.fixture(autouse=True, scope='session')
def _cheap_config_dump():
    original = Config.pretty_text
    Config.pretty_text = property(_plain_text)
    yield
    Config.pretty_text = original


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: these tiny models run several times faster than with two threads
    on a shared 2-core machine (no oversubscription)."""
    import torch
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
