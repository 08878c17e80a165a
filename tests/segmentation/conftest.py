"""Fixtures of the segmentation tests: generated data in the real mmseg layouts."""
import pytest


@pytest.fixture(scope='session')
def ade_root(tmp_path_factory) -> str:
    """A generated ADE20K layout (8 train / 2 val scenes, 64 x 96: wider than the tiny
    sliding window, so inference pastes several windows)."""
    from mmlinvit.datasets import make_ade20k_layout
    root = str(tmp_path_factory.mktemp('data') / 'ade' / 'ADEChallengeData2016')
    make_ade20k_layout(root, num_train=8, num_val=2, size=(64, 96), seed=0)
    return root


@pytest.fixture(scope='session')
def city_root(tmp_path_factory) -> str:
    """A generated Cityscapes layout (4 train / 2 val scenes, 64 x 192)."""
    from mmlinvit.datasets import make_cityscapes_layout
    root = str(tmp_path_factory.mktemp('data') / 'cityscapes')
    make_cityscapes_layout(root, num_train=4, num_val=2, size=(64, 192), seed=0)
    return root


@pytest.fixture(autouse=True)
def _segmentation_settings(one_thread):
    """Every test of this folder runs on one intra-op thread (``tests/conftest.py``)."""
