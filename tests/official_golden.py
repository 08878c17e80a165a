"""Loading the official-code golden files of ``tests/fixtures`` and their generators.

Each ``tests/fixtures/make_<name>.py`` builds a public model with random weights and writes
``tests/fixtures/<golden>.pt``; the oracle tests import the generator (for its constants and
input functions) and read the golden file.
"""
import importlib.util
import os.path as osp
from types import ModuleType

import torch

FIXTURES = osp.join(osp.dirname(osp.abspath(__file__)), 'fixtures')


def load_generator(name: str) -> ModuleType:
    """Imports ``tests/fixtures/<name>.py`` (the fixtures folder is not a package).

    Args:
        name: Generator module name, e.g. ``'make_clip_reference'``.
    """
    spec = importlib.util.spec_from_file_location(name, osp.join(FIXTURES, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_golden(filename: str) -> dict:
    """Reads ``tests/fixtures/<filename>`` safely (tensors and plain containers only)."""
    return torch.load(osp.join(FIXTURES, filename), map_location='cpu', weights_only=True)


def max_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """Max abs error, relative to the reference's largest magnitude when that exceeds 1."""
    assert got.shape == expected.shape, (got.shape, expected.shape)
    scale = max(1.0, expected.abs().max().item())
    return (got.detach().float() - expected.float()).abs().max().item() / scale
