"""The ``backend`` option of the kernel attention operators (config > env var > auto)."""
import pytest
import torch

from mmlinvit.layers.attention import build_attention_operator
from mmlinvit.ops.linear_attention import BACKEND_ENV_VAR, dispatch
from mmlinvit.ops.triton_utils import triton_available, triton_interpreter_enabled

KERNEL_OPERATORS = ('elu', 'relu', 'hedgehog', 'inline')


@pytest.fixture
def chosen_backends(monkeypatch):
    """Records what :func:`dispatch.select_backend` returns for each call."""
    chosen = []
    original = dispatch.select_backend

    def spy(q, k, v, backend=None):
        result = original(q, k, v, backend)
        chosen.append(result)
        return result

    monkeypatch.setattr(dispatch, 'select_backend', spy)
    return chosen


@pytest.mark.parametrize('op_type', KERNEL_OPERATORS)
def test_config_backend_wins_over_env_var(op_type, monkeypatch, chosen_backends):
    x = torch.randn(1, 5, 16)
    monkeypatch.setenv(BACKEND_ENV_VAR, 'triton')
    op = build_attention_operator(dict(type=op_type, backend='torch'), 16, 2)
    assert op.backend == 'torch'
    out = op(x)
    assert chosen_backends == ['torch']
    # The config value is used as is: an unusable env value is never read.
    monkeypatch.setenv(BACKEND_ENV_VAR, 'not-a-backend')
    torch.testing.assert_close(op(x), out)
    # Without a config value the env var applies (here: its bad value is reported).
    default = build_attention_operator(dict(type=op_type), 16, 2)
    assert default.backend is None
    with pytest.raises(ValueError, match=BACKEND_ENV_VAR):
        default(x)
    monkeypatch.setenv(BACKEND_ENV_VAR, 'torch')
    chosen_backends.clear()
    default.load_state_dict(op.state_dict())
    torch.testing.assert_close(default(x), out)
    assert chosen_backends == ['torch']


@pytest.mark.parametrize('op_type', KERNEL_OPERATORS)
def test_invalid_config_backend_is_refused_at_build(op_type):
    with pytest.raises(ValueError, match=r"'cuda'.*'auto', 'torch', 'triton'"):
        build_attention_operator(dict(type=op_type, backend='cuda'), 16, 2)


def test_config_triton_wins_over_env_torch(monkeypatch, chosen_backends):
    """backend='triton' in the config runs the kernel although the env var says torch."""
    if not (torch.cuda.is_available() or triton_interpreter_enabled()):
        pytest.skip('needs CUDA or TRITON_INTERPRET=1')
    if not triton_available():
        pytest.skip('triton is not installed')
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    x = torch.randn(1, 5, 16, device=device)
    monkeypatch.setenv(BACKEND_ENV_VAR, 'torch')
    op = build_attention_operator(dict(type='elu', backend='triton'), 16, 2).to(device)
    ref = build_attention_operator(dict(type='elu', backend='torch'), 16, 2).to(device)
    ref.load_state_dict(op.state_dict())
    with torch.no_grad():
        out = op(x)
        expected = ref(x)
    assert chosen_backends == ['triton', 'torch']
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
