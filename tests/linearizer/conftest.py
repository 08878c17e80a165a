"""ViT-Linearizer test settings: cheap config dumps and one intra-op thread (as tests/distill)."""
import pytest


@pytest.fixture(autouse=True)
def _linearizer_settings(one_thread, cheap_config_dump):
    """Every test of this folder: one intra-op thread, plain config dumps (tests/conftest.py)."""
