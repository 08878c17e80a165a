"""ops/linear_attention and ops/ssd follow one pattern (issue #14, item 3).

The same file roles (naive / torch_impl / triton_kernel / checks / dispatch), the same
``<op>_naive`` / ``<op>_torch`` / ``<op>_triton`` names with one contract, one place for the
kernels' limits, and the same error types for the same mistakes.
"""
import ast
import importlib
import importlib.util
from pathlib import Path

import pytest
import torch

from mmlinvit.ops import linear_attention, ssd
from mmlinvit.ops.triton_utils import KERNEL_MAX_HEAD_DIM

OPS = Path(__file__).resolve().parents[2] / 'mmlinvit' / 'ops'
ROLES = ('naive.py', 'torch_impl.py', 'triton_kernel.py', 'checks.py', 'dispatch.py')


def _la_inputs(d=16, dtype=torch.float32):
    q, k, v = (torch.randn(1, 2, 9, d, dtype=dtype) for _ in range(3))
    return (q, k, v), dict()


def _ssd_inputs(p=8, dtype=torch.float32):
    x = torch.randn(1, 9, 2, p, dtype=dtype)
    dt = torch.rand(1, 9, 2, dtype=dtype)
    A = -torch.rand(2, dtype=dtype)
    B = torch.randn(1, 9, 1, 16, dtype=dtype)
    return (x, dt, A, B, B.clone()), dict()


CASES = {
    'linear_attention': (linear_attention.linear_attention, linear_attention.select_backend,
                         linear_attention.BACKEND_ENV_VAR, _la_inputs),
    'ssd_scan': (ssd.ssd_scan, lambda *a, backend=None: ssd.select_ssd_backend(
        *a, None, backend=backend), ssd.SSD_BACKEND_ENV_VAR, _ssd_inputs),
}


@pytest.mark.parametrize('package', ['linear_attention', 'ssd'])
def test_both_packages_have_the_same_file_roles(package):
    files = sorted(p.name for p in (OPS / package).glob('*.py') if p.name != '__init__.py')
    assert files == sorted(ROLES)


@pytest.mark.parametrize('package,op', [('linear_attention', 'linear_attention'),
                                        ('ssd', 'ssd_scan')])
def test_each_role_defines_the_op_under_its_role_name(package, op):
    """<op>_naive in naive.py, <op>_torch in torch_impl.py, <op>_triton in triton_kernel.py."""
    for role, suffix in (('naive', 'naive'), ('torch_impl', 'torch'), ('triton_kernel',
                                                                        'triton')):
        tree = ast.parse((OPS / package / f'{role}.py').read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert f'{op}_{suffix}' in defined, (role, sorted(defined))
        aliases = [n for n in tree.body if isinstance(n, ast.Assign)
                   and isinstance(n.value, ast.Name) and n.value.id in defined]
        assert not aliases, f'{role}.py re-exports functions under second names'


def test_kernel_limits_live_in_one_place():
    """No module of ops/ defines its own head-dim limit or dtype list next to triton_utils'."""
    for path in OPS.rglob('*.py'):
        if path.name == 'triton_utils.py':
            continue
        text = path.read_text()
        assert '= KERNEL_MAX_HEAD_DIM' not in text and '= KERNEL_DTYPES' not in text, path
        assert '(torch.float32, torch.float16, torch.bfloat16)' not in text, path
        assert f'> {KERNEL_MAX_HEAD_DIM}' not in text, path


@pytest.mark.parametrize('name', sorted(CASES))
def test_same_errors_for_the_same_mistakes(name, monkeypatch):
    op, select, env_var, make = CASES[name]
    args, _ = make()
    with pytest.raises(ValueError, match=r"Unknown .* backend 'cuda'; available: \['auto'"):
        op(*args, backend='cuda')
    monkeypatch.setenv(env_var, 'gpu')
    with pytest.raises(ValueError, match=f"{env_var}='gpu' is not a .* backend; available"):
        op(*args)
    monkeypatch.delenv(env_var)
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    if importlib.util.find_spec('triton') is not None:
        with pytest.raises(RuntimeError, match="backend='triton' needs CUDA tensors"):
            select(*args, backend='triton')
        monkeypatch.setenv('TRITON_INTERPRET', '1')
        big, _ = make(KERNEL_MAX_HEAD_DIM + 2)
        with pytest.raises(ValueError, match=f"cannot take these inputs: head dims / state "
                           f"size .*{KERNEL_MAX_HEAD_DIM + 2}.*use backend='torch'"):
            select(*big, backend='triton')
        double, _ = make(dtype=torch.float64)
        with pytest.raises(ValueError, match="has dtype torch.float64.*use backend='torch'"):
            select(*double, backend='triton')


def test_unknown_feature_map_is_a_value_error_on_every_path():
    q, k, v = _la_inputs()[0]
    for call in (lambda: linear_attention.linear_attention(q, k, v, 'softplus'),
                 lambda: linear_attention.linear_attention_torch(q, k, v, 'softplus'),
                 lambda: linear_attention.linear_attention_naive(q, k, v, 'softplus')):
        with pytest.raises(ValueError, match=r"Unknown feature map 'softplus'.*available"):
            call()


def test_the_three_paths_share_one_contract():
    """Raw q, k, v and the feature map's name give the same result on naive and torch."""
    q, k, v = (torch.randn(1, 2, 33, 8, dtype=torch.float64) for _ in range(3))
    for fm in ('elu', 'relu'):
        torch.testing.assert_close(linear_attention.linear_attention_torch(q, k, v, fm),
                                   linear_attention.linear_attention_naive(q, k, v, fm),
                                   atol=1e-6, rtol=1e-5)  # both accumulate in fp32
    x, dt, A, B, C = _ssd_inputs()[0]
    torch.testing.assert_close(ssd.ssd_scan_torch(x, dt, A, B, C, chunk_size=4),
                               ssd.ssd_scan_naive(x, dt, A, B, C), atol=1e-5, rtol=1e-5)
