"""Shared pytest settings: small thread count and deterministic seeds for the 2-core CI."""
import os

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
