"""Distillation-test settings: cheap config dumps (mmengine formats them with yapf, ~2 s per
Runner on the shared CI cores; the dumped text is not under test) and one intra-op thread."""
import pytest


@pytest.fixture(autouse=True)
def _distill_settings(one_thread, cheap_config_dump):
    """Every test of this folder: one intra-op thread, plain config dumps (tests/conftest.py)."""
