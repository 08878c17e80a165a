"""Runs a multi-process (torchrun / gloo) command for a test; no retries.

Until issue 11, about 1 gloo run in 4 on the 2-core CI machine aborted after a correct run
with ``terminate called without an active exception`` (SIGABRT), and this helper retried it
once.  The cause was in the project: tools/train.py, tools/test.py and the DDP test entry
point left their gloo process group to the interpreter's exit, where it is torn down while
gloo's C++ threads still hold work objects with Python references (pytorch/pytorch#190489:
applications must call ``destroy_process_group``).  They now end with
:func:`mmlinvit.engine.launch.finish_distributed`, so the abort is reported like any other
failure: a new occurrence is a bug to fix, not to retry.
"""
import subprocess
from typing import List

GLOO_TEARDOWN_ABORT = 'terminate called without an active exception'


def run_multiprocess(cmd: List[str], **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)``.

    Args:
        cmd: The command (a torchrun invocation or tools/dist_*.sh).
        **kwargs: Passed to :func:`subprocess.run` (env, cwd, timeout...).
    """
    return subprocess.run(cmd, capture_output=True, text=True, **kwargs)
