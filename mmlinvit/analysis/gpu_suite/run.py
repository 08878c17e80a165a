"""Bookkeeping of one GPU-suite run: the result dict, its JSON file and one guarded case.

Every case (one N, one L, one model) runs through :meth:`SuiteRun.run_case`: a failure (an
out-of-memory error included) is written into its rows' ``error`` field and under
``errors[label]``, and ``suite.json`` is rewritten atomically after every case, so a killed
run keeps what it measured.
"""
import contextlib
import gc
import json
import os
import traceback
from typing import Callable, Dict, Optional, Sequence

import torch


def _json_default(obj: object) -> object:
    return str(obj)


def write_json_atomic(path: str, obj: object) -> None:
    """Writes ``obj`` to ``path`` through a temporary file and ``os.replace``: a reader (or a
    run killed mid-write) sees the previous complete file or the new one, never half of it.

    Args:
        path: The JSON file.
        obj: What to write (values JSON cannot hold are written as ``str``).
    """
    tmp = f'{path}.tmp'
    with open(tmp, 'w') as f:
        json.dump(obj, f, indent=2, default=_json_default)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class SuiteRun:
    """The state of one suite run: where it runs, its result dict and where that is saved.

    Args:
        device: The device the sections run on (CUDA, or CPU for ``--dry-run``).
        dry: Whether this is the ``--dry-run`` (tiny sizes, fp32 instead of bf16).

    Attributes:
        result: The run's result (``'errors'``: label -> traceback); sections add their rows.
        path: ``suite.json``, or None: :meth:`save` writes nothing.
        copy_bw: The measured copy bandwidth in TB/s (set after the ceilings section; None
            before it or on CPU).
    """

    def __init__(self, device: torch.device, dry: bool = False) -> None:
        self.device = device
        self.dry = dry
        self.result: Dict[str, object] = {'errors': {}}
        self.path: Optional[str] = None
        self.copy_bw: Optional[float] = None

    def save(self) -> None:
        """Writes :attr:`result` to :attr:`path` atomically (nothing when it is None)."""
        if self.path is not None:
            write_json_atomic(self.path, self.result)

    def free_device_memory(self) -> None:
        """Collects garbage and returns cached CUDA blocks (after a failed case)."""
        gc.collect()
        if self.device.type == 'cuda':
            with contextlib.suppress(Exception):  # a sticky CUDA error must not end the run
                torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    def run_case(self, label: str, rows: Sequence[Dict[str, object]],
                 body: Callable[[], None]) -> bool:
        """Runs one measurement case; returns whether it succeeded.

        The rows are already in the result (``body`` fills them in place), so what the case
        measured before failing stays; an exception (``torch.cuda.OutOfMemoryError``
        included) is written as ``'Type: message'`` into every row's ``error`` and its
        traceback under ``errors[label]``, the CUDA cache is emptied, and the JSON is saved
        either way.

        Args:
            label: The case's name (in the printed failure and as the key under ``errors``).
            rows: The result rows the case fills.
            body: The measurement.
        """
        failed = False
        try:
            body()
        except Exception as exc:  # one failing case must not cost the other cases' numbers
            text = str(exc).splitlines()[0][:200] if str(exc) else ''
            message = f'{type(exc).__name__}: {text}'
            for row in rows:
                row['error'] = message
            self.result['errors'][label] = traceback.format_exc()[-3000:]
            print(f'   {label} FAILED: {message}')
            failed = True
        if failed:  # outside the except block: the traceback (and the case's tensors) are gone
            self.free_device_memory()
        self.save()
        return not failed
