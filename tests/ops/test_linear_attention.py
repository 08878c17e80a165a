"""O(N) PyTorch linear attention against the O(N^2) reference, plus CPU dispatch rules."""
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import torch

from mmlinvit.ops.feature_maps import get_feature_map
from mmlinvit.ops.linear_attention import (BACKEND_ENV_VAR, inline_attention,
                                           inline_attention_torch, linear_attention,
                                           linear_attention_map_naive, linear_attention_naive,
                                           linear_attention_torch, select_backend)
from mmlinvit.ops.linear_attention import dispatch


def _qkv(n: int, m: int, d: int, e: int, batch: int = 1, heads: int = 2,
         dtype: torch.dtype = torch.float32, requires_grad: bool = False):
    q = torch.randn(batch, heads, n, d).to(dtype).requires_grad_(requires_grad)
    k = torch.randn(batch, heads, m, d).to(dtype).requires_grad_(requires_grad)
    v = torch.randn(batch, heads, m, e).to(dtype).requires_grad_(requires_grad)
    return q, k, v


def _positive_signed(x: torch.Tensor) -> torch.Tensor:
    """Features with mixed signs but a positive mean (well-conditioned identity-map normaliser)."""
    return 0.5 * x + 1.0


@pytest.mark.parametrize('feature_map', ['elu', 'relu', 'identity'])
@pytest.mark.parametrize('n,m,d,e', [(1, 1, 16, 16), (63, 63, 48, 40), (197, 130, 64, 64),
                                     (1025, 1025, 32, 24)])
def test_torch_matches_naive(feature_map, n, m, d, e):
    q, k, v = _qkv(n, m, d, e)
    if feature_map == 'identity':
        q, k = _positive_signed(q), _positive_signed(k)
    phi = get_feature_map(feature_map)
    ref = linear_attention_naive(phi(q), phi(k), v)
    out = linear_attention_torch(phi(q), phi(k), v)
    assert out.shape == (1, 2, n, e) and out.dtype == v.dtype
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # The dispatch entry point on CPU is the torch path with the map applied inside.
    torch.testing.assert_close(linear_attention(q, k, v, feature_map), ref, atol=1e-5, rtol=1e-5)


def test_torch_gradients_match_naive():
    q, k, v = _qkv(63, 97, 32, 16, batch=2, requires_grad=True)
    grad = torch.randn(2, 2, 63, 16)
    phi = get_feature_map('elu')
    ref = torch.autograd.grad(linear_attention_naive(phi(q), phi(k), v), (q, k, v), grad)
    out = torch.autograd.grad(linear_attention(q, k, v, 'elu', backend='torch'), (q, k, v), grad)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_torch_accepts_strided_views_and_does_not_modify_inputs():
    qkv = torch.randn(2, 57, 3, 4, 16)  # (B, N, 3, H, d) as produced by a fused qkv linear
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    before = qkv.clone()
    out = linear_attention(q, k, v, 'identity')
    ref = linear_attention_naive(q.contiguous(), k.contiguous(), v.contiguous())
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    assert torch.equal(qkv, before)


def test_relu_all_zero_features_stay_finite():
    q, k, v = _qkv(33, 33, 16, 16, requires_grad=True)
    with torch.no_grad():
        q.copy_(-q.abs() - 0.1)  # relu(q) == 0 everywhere: numerator and normaliser are 0
    out = linear_attention(q, k, v, 'relu', eps=1e-6)
    assert torch.isfinite(out).all() and torch.count_nonzero(out) == 0
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    # Keys with relu(k) == 0 everywhere: z == 0, the eps alone keeps the division finite.
    out = linear_attention(torch.randn(1, 2, 5, 16), -torch.rand(1, 2, 7, 16), v[:, :, :7],
                           'relu')
    assert torch.isfinite(out).all()


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_inputs_accumulate_in_fp32(dtype):
    # phi(k) = 6 and v = 30 everywhere: an fp16 running sum over 1025 tokens (184k) would
    # overflow; the 1/N-scaled fp32 mean is exactly 30.
    n = 1025
    q = torch.full((1, 1, 4, 16), 5.0, dtype=dtype)
    k = torch.full((1, 1, n, 16), 5.0, dtype=dtype)
    v = torch.full((1, 1, n, 8), 30.0, dtype=dtype)
    out = linear_attention(q, k, v, 'elu')
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), torch.full((1, 1, 4, 8), 30.0), atol=0.0, rtol=1e-3)
    # Random inputs: equal to the fp32 computation on the same (rounded) inputs.
    q, k, v = _qkv(197, 197, 64, 64, dtype=dtype)
    ref = linear_attention_naive(*(get_feature_map('elu')(t.float()) for t in (q, k)), v.float())
    torch.testing.assert_close(linear_attention(q, k, v).float(), ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize('n,m', [(1, 1), (63, 63), (197, 50)])
def test_inline_matches_explicit_map(n, m):
    d, e = 24, 16
    q, k, v = _qkv(n, m, d, e)
    scale = d**-0.5
    k_mean = k.mean(dim=-2, keepdim=True)
    attn = scale * q @ k.transpose(-2, -1) / m + (1 - scale * (q * k_mean).sum(-1, True)) / m
    torch.testing.assert_close(attn.sum(-1), torch.ones(1, 2, n), atol=1e-5, rtol=1e-5)
    ref = attn @ v
    torch.testing.assert_close(inline_attention_torch(q, k, v, scale), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(inline_attention(q, k, v, scale), ref, atol=1e-5, rtol=1e-5)


def test_map_rows_sum_to_one():
    q, k, _ = _qkv(20, 30, 8, 8)
    phi = get_feature_map('elu')
    attn = linear_attention_map_naive(phi(q), phi(k))
    torch.testing.assert_close(attn.sum(-1), torch.ones(1, 2, 20), atol=1e-4, rtol=1e-4)


def test_bad_shapes_have_clear_errors():
    q, k, v = _qkv(8, 8, 16, 16)
    with pytest.raises(ValueError, match='feature dim'):
        linear_attention_torch(q, k[..., :8], v)
    with pytest.raises(ValueError, match='token count'):
        linear_attention_torch(q, k, v[:, :, :4])
    with pytest.raises(ValueError, match='M >= 1'):
        linear_attention_torch(q, k[:, :, :0], v[:, :, :0])
    with pytest.raises(KeyError, match='available'):
        linear_attention(q, k, v, 'softplus')


# ------------------------------------------------------------------------------------------
# Dispatch on CPU (no kernel needed)
# ------------------------------------------------------------------------------------------


class _Collect(logging.Handler):

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def backend_log(monkeypatch):
    """Messages logged by the dispatcher, with the once-only memory cleared."""
    monkeypatch.setattr(dispatch, '_logged_choices', set())
    log = logging.getLogger('mmlinvit')
    handler = _Collect()
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield handler.messages
    log.removeHandler(handler)
    log.setLevel(old_level)


def test_cpu_default_is_torch_and_logged_once(monkeypatch, backend_log):
    monkeypatch.delenv(BACKEND_ENV_VAR, raising=False)
    q, k, v = _qkv(5, 5, 8, 8)
    for _ in range(3):
        assert select_backend(q, k, v) == 'torch'
        linear_attention(q, k, v)
    assert len(backend_log) == 1 and 'torch' in backend_log[0]


def test_env_var_forces_and_validates(monkeypatch, backend_log):
    q, k, v = _qkv(5, 5, 8, 8)
    monkeypatch.setenv(BACKEND_ENV_VAR, 'torch')
    assert select_backend(q, k, v) == 'torch'
    assert any('forced' in msg for msg in backend_log)
    monkeypatch.setenv(BACKEND_ENV_VAR, 'auto')
    assert select_backend(q, k, v) == 'torch'
    monkeypatch.setenv(BACKEND_ENV_VAR, 'cuda')
    with pytest.raises(ValueError, match=BACKEND_ENV_VAR):
        select_backend(q, k, v)
    # The explicit argument wins over the environment.
    assert select_backend(q, k, v, backend='torch') == 'torch'
    with pytest.raises(ValueError, match='available'):
        select_backend(q, k, v, backend='numpy')


def test_forcing_triton_on_cpu_without_interpreter_is_an_error(monkeypatch):
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    monkeypatch.setenv(BACKEND_ENV_VAR, 'triton')
    q, k, v = _qkv(5, 5, 8, 8)
    with pytest.raises(RuntimeError, match='triton'):
        linear_attention(q, k, v)
    with pytest.raises(RuntimeError, match='triton'):
        inline_attention(q, k, v, 0.5, backend='triton')


def test_forcing_triton_without_triton_installed_is_an_error(monkeypatch):
    monkeypatch.setattr(dispatch, 'triton_available', lambda: False)
    q, k, v = _qkv(5, 5, 8, 8)
    with pytest.raises(RuntimeError, match='not installed'):
        linear_attention(q, k, v, backend='triton')
    assert select_backend(q, k, v, backend='auto') == 'torch'


_WITHOUT_TRITON = '''
import importlib.abc, importlib.util, sys

class BlockTriton(importlib.abc.MetaPathFinder):
    """Makes triton look uninstalled: find_spec -> None, import -> ModuleNotFoundError."""

    def find_spec(self, name, path=None, target=None):
        if name == 'triton' or name.startswith('triton.'):
            raise ModuleNotFoundError(f'No module named {name!r} (blocked)')
        return None

_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: (
    None if name.split('.')[0] == 'triton' else _find_spec(name, package))
sys.meta_path.insert(0, BlockTriton())
import torch
from mmlinvit.ops.linear_attention import inline_attention, linear_attention, triton_available
assert not triton_available()
q = torch.randn(1, 2, 9, 8)
out = linear_attention(q, q, q) + inline_attention(q, q, q, 0.5)
assert torch.isfinite(out).all() and 'triton' not in sys.modules
try:
    linear_attention(q, q, q, backend='triton')
except RuntimeError as err:
    assert 'not installed' in str(err)
else:
    raise AssertionError('forcing triton without triton must fail')
print('ok')
'''


def test_package_imports_and_runs_without_triton():
    root = Path(__file__).resolve().parents[2]
    python_path = os.pathsep.join(filter(None, [str(root), os.environ.get('PYTHONPATH')]))
    env = dict(os.environ, PYTHONPATH=python_path)
    env.pop(BACKEND_ENV_VAR, None)
    proc = subprocess.run([sys.executable, '-c', _WITHOUT_TRITON], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith('ok'), proc.stderr[-3000:]
