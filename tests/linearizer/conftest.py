"""ViT-Linearizer test settings: cheap config dumps and one intra-op thread (as tests/distill)."""
import pytest
from mmengine.config import Config


def _plain_text(cfg: Config) -> str:
    return '\n'.join(f'{key} = {value!r}' for key, value in cfg.to_dict().items()) + '\n'


@pytest.fixture(autouse=True, scope='session')
def _cheap_config_dump():
    """mmengine formats dumped configs with yapf (~2 s per Runner); the text is not tested."""
    original = Config.pretty_text
    Config.pretty_text = property(_plain_text)
    yield
    Config.pretty_text = original


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run faster on one thread on the shared 2-core machine."""
    import torch
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
