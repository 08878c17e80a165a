"""Runs a multi-process (torchrun / gloo) command, retrying once on gloo's teardown abort.

Rarely (about 1 run in 20 on this 2-core CI machine), a gloo worker aborts with
``terminate called without an active exception`` (SIGABRT) while its background threads are
torn down; the run itself was correct. Only that exact signature is retried, once; every
other failure is reported as it is.
"""
import subprocess
from typing import List

GLOO_TEARDOWN_ABORT = 'terminate called without an active exception'


def run_multiprocess(cmd: List[str], **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)`` with one retry.

    Args:
        cmd: The command (a torchrun invocation or tools/dist_*.sh).
        **kwargs: Passed to :func:`subprocess.run` (env, cwd, timeout...).
    """
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0 and GLOO_TEARDOWN_ABORT in proc.stderr + proc.stdout:
        proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    return proc
