"""Which CUDA devices the ``auto`` backend choice sends to the Triton kernels.

Guards :func:`mmlinvit.ops.triton_utils.choose_auto_backend` (used by both dispatchers, linear
attention and the SSD scan): the kernels are tuned and tested on NVIDIA sm_80+, so ``auto``
keeps the PyTorch path on older GPUs (V100 sm_70, T4 sm_75: no bf16 ``tl.dot``) and on ROCm,
with the reason logged; a forced ``'triton'`` is not affected.  No GPU is needed: the device's
capability and ``torch.version.hip`` are replaced.
"""
from typing import List, Optional, Tuple

import pytest
import torch

from mmlinvit.ops import triton_utils
from mmlinvit.ops.triton_utils import MIN_AUTO_CAPABILITY, choose_auto_backend

CUDA = torch.device('cuda', 0)


def _choose(monkeypatch: pytest.MonkeyPatch, capability: Tuple[int, int],
            hip: Optional[str] = None,
            unsupported: Optional[str] = None) -> Tuple[str, List[Tuple[str, str]]]:
    """The auto choice on a CUDA device of ``capability`` (triton installed), and its log."""
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda device=None: capability)
    monkeypatch.setattr(torch.version, 'hip', hip)
    logged: List[Tuple[str, str]] = []
    choice = choose_auto_backend(CUDA, lambda: True, lambda: unsupported,
                                 lambda backend, reason: logged.append((backend, reason)))
    return choice, logged


@pytest.mark.parametrize('capability', [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)])
def test_sm80_and_newer_take_the_kernels(monkeypatch, capability):
    choice, logged = _choose(monkeypatch, capability)
    assert choice == 'triton'
    assert logged == [('triton', 'auto: CUDA tensors and triton installed')]


@pytest.mark.parametrize('capability', [(6, 1), (7, 0), (7, 5)])
def test_older_gpus_stay_on_torch_with_the_reason(monkeypatch, capability):
    choice, logged = _choose(monkeypatch, capability)
    assert choice == 'torch'
    (backend, reason), = logged
    assert backend == 'torch'
    assert f'compute capability {capability[0]}.{capability[1]} < 8.0' in reason
    assert "backend='triton' forces them" in reason


def test_rocm_stays_on_torch(monkeypatch):
    choice, logged = _choose(monkeypatch, (9, 4), hip='6.2.0')
    assert choice == 'torch'
    assert logged[0][0] == 'torch' and 'ROCm' in logged[0][1]


def test_input_limits_still_apply_on_new_gpus(monkeypatch):
    """The device check comes before, not instead of, the kernels' own input limits."""
    choice, logged = _choose(monkeypatch, (9, 0), unsupported='head dims {"d": 256}')
    assert choice == 'torch'
    assert logged == [('torch', 'auto: head dims {"d": 256}')]


def test_the_boundary_is_sm80():
    assert MIN_AUTO_CAPABILITY == (8, 0)


def test_forced_triton_is_not_refused_on_older_gpus(monkeypatch):
    """``check_forced_triton`` (the forced path) does not consult the device generation."""
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda device=None: (7, 5))
    monkeypatch.setattr(torch.version, 'hip', None)
    triton_utils.check_forced_triton(CUDA, True, lambda: None, 'linear attention')


def test_the_device_check_compiles_into_one_graph(monkeypatch):
    """``torch.compile(fullgraph=True)`` of a dispatch that reads the capability: dynamo does
    not fold ``torch.cuda.get_device_capability`` itself; the lookup is a constant to it."""
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda device=None: (7, 5))
    monkeypatch.setattr(torch.version, 'hip', None)

    def pick(x: torch.Tensor) -> torch.Tensor:
        reason = triton_utils.accelerator_unsupported_reason(CUDA)
        return x + 1 if reason is not None else x - 1

    torch._dynamo.reset()
    compiled = torch.compile(pick, fullgraph=True, backend='eager')
    assert torch.equal(compiled(torch.zeros(3)), torch.ones(3))
