"""Set-up shared by the Triton kernel tests (imported first by their test modules).

With a GPU the compiled kernels are tested on CUDA tensors.  Without one they run in the
Triton CPU interpreter, which needs ``TRITON_INTERPRET=1`` in the environment *before triton is
imported* and while the kernels run.  Importing this module sets it when triton is not imported
yet; when something else (e.g. timm -> torch._dynamo) already imported triton without it, the
kernel tests are re-run in a fresh interpreter subprocess by
:func:`run_in_interpreter_subprocess`.
"""
import contextlib
import importlib
import importlib.util
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator, List, Tuple

import pytest
import torch

HAS_TRITON = importlib.util.find_spec('triton') is not None
ON_GPU = torch.cuda.is_available()
if HAS_TRITON and not ON_GPU and 'triton' not in sys.modules:
    os.environ['TRITON_INTERPRET'] = '1'
#: Whether the kernel tests can run in this process (GPU, or the interpreter switched on in time).
RUN_HERE = HAS_TRITON and (ON_GPU or os.environ.get('TRITON_INTERPRET') == '1')

requires_triton = pytest.mark.skipif(not HAS_TRITON, reason='triton is not installed')
run_here = pytest.mark.skipif(
    not RUN_HERE, reason='triton was imported without TRITON_INTERPRET=1 and there is no GPU; '
    'covered by test_kernels_in_interpreter_subprocess')
#: Marks the launcher test that re-runs a kernel test module in the subprocess.
only_in_parent = pytest.mark.skipif(RUN_HERE, reason='kernel tests run in this process')


def run_in_interpreter_subprocess(test_file: str) -> None:
    """Runs the tests of ``test_file`` under ``TRITON_INTERPRET=1`` in a fresh pytest process.

    Args:
        test_file: Path of the test module (its ``__file__``).

    Raises:
        AssertionError: the child failed, or skipped more than its own launcher test.
    """
    env = dict(os.environ, TRITON_INTERPRET='1')
    root = Path(__file__).resolve().parents[2]
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(root), env.get('PYTHONPATH')]))
    proc = subprocess.run(
        [sys.executable, '-m', 'pytest', str(Path(test_file).resolve()), '-q', '-x',
         '-p', 'no:cacheprovider'], cwd=root, env=env, capture_output=True, text=True,
        timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    skipped = re.search(r'(\d+) skipped', summary)
    # Only the launcher itself may be skipped in the child.
    assert ' passed' in summary and (skipped is None or skipped.group(1) == '1'), summary


def import_kernels(module_name: str) -> Tuple[ModuleType, torch.device]:
    """The kernel module and the device its kernels run on (CPU = interpreter).

    Args:
        module_name: Dotted name of the module that defines the kernels and ``INTERPRETED``.

    Returns:
        (module, device).
    """
    module = importlib.import_module(module_name)
    return module, torch.device('cpu' if module.INTERPRETED else 'cuda')


def allow_interpreter_dispatch(monkeypatch: pytest.MonkeyPatch,
                               kernels: Tuple[ModuleType, torch.device]) -> torch.device:
    """Lets dispatch force 'triton' on CPU tensors when the kernels are interpreted.

    Args:
        monkeypatch: The test's monkeypatch fixture (undoes the environment change).
        kernels: (module, device) from :func:`import_kernels`.

    Returns:
        The device the kernels run on.
    """
    module, device = kernels
    if module.INTERPRETED:
        monkeypatch.setenv('TRITON_INTERPRET', '1')
    return device


class _CollectMessages(logging.Handler):
    """Keeps the formatted message of every record it receives."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def collect_backend_log(monkeypatch: pytest.MonkeyPatch,
                        dispatch_module: ModuleType) -> Iterator[List[str]]:
    """Collects INFO messages of the ``mmlinvit`` logger with the dispatcher's memory cleared.

    Args:
        monkeypatch: The test's monkeypatch fixture (restores the log-once memory).
        dispatch_module: The dispatcher whose ``_logged_choices`` is emptied.

    Yields:
        The list the messages are appended to (still readable after the block).
    """
    monkeypatch.setattr(dispatch_module, '_logged_choices', set())
    log = logging.getLogger('mmlinvit')
    handler, old_level = _CollectMessages(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler.messages
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
