"""Training curves from mmengine's ``LocalVisBackend`` scalars (no OpenMMLab import needed).

Every runner whose visualizer has a ``LocalVisBackend`` (all runtime bases of this project)
appends one JSON object per logged iteration to ``<work_dir>/<timestamp>/vis_data/
scalars.json``: ``{"loss": ..., "decode.loss_ce": ..., "lr": ..., "step": <iteration>}``, and
one per validation (``{"mIoU": ..., "step": ...}``).  Training values are what the logger
prints: the mean over the log processor's window (``log_processor.window_size``, 10 iterations
by default).  :func:`read_scalars` parses such a file and :func:`save_loss_curves` plots the
loss terms of several runs side by side.
"""
import glob
import json
import math
import os
from typing import Dict, List, Mapping, Tuple

Series = Tuple[List[int], List[float]]


def read_scalars(path: str) -> Dict[str, Series]:
    """``{key: (steps, values)}`` from a ``scalars.json`` file (one JSON object per line).

    Args:
        path: The file written by ``LocalVisBackend``.

    Raises:
        FileNotFoundError: when the file does not exist.
        ValueError: naming the line that is not a JSON object with a ``step``.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f'{path} does not exist; runs write it when their visualizer '
                                f'has a LocalVisBackend (vis_backends in the runtime base)')
    series: Dict[str, Series] = {}
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f'{path}:{number} is not JSON ({err})') from err
            if not isinstance(record, dict) or 'step' not in record:
                raise ValueError(f'{path}:{number} has no "step": {line[:120]}')
            step = int(record['step'])
            for key, value in record.items():
                if key == 'step' or isinstance(value, bool) or not isinstance(value,
                                                                              (int, float)):
                    continue
                steps, values = series.setdefault(key, ([], []))
                steps.append(step)
                values.append(float(value))
    return series


def find_scalars(work_dir: str) -> str:
    """The newest ``<work_dir>/*/vis_data/scalars.json`` (the last run in that work dir).

    Raises:
        FileNotFoundError: naming the pattern that matched nothing.
    """
    pattern = os.path.join(work_dir, '*', 'vis_data', 'scalars.json')
    found = glob.glob(pattern)
    if not found:
        raise FileNotFoundError(f'no {pattern}: the run logged no scalars (is LocalVisBackend '
                                f'in visualizer.vis_backends?)')
    return max(found, key=os.path.getmtime)


def loss_keys(series: Mapping[str, Series]) -> List[str]:
    """Loss terms of a run: the total ``loss`` first, then every ``*loss*`` term."""
    keys = sorted(k for k in series if 'loss' in k.split('.')[-1] and k != 'loss')
    return (['loss'] if 'loss' in series else []) + keys


def save_loss_curves(path: str, runs: Mapping[str, str], title: str = '') -> str:
    """One panel per run with its loss terms against the iteration, saved as a PNG.

    Args:
        path: Output PNG path (folders are created).
        runs: ``{panel title: scalars.json path}``, in panel order.
        title: Figure title.

    Returns:
        ``path``.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    if not runs:
        raise ValueError('save_loss_curves needs at least one run')
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.4), squeeze=False)
    for ax, (name, scalars) in zip(axes[0], runs.items()):
        series = read_scalars(scalars)
        keys = loss_keys(series)
        if not keys:
            raise ValueError(f'{scalars} ({name}) has no loss scalars; keys: {sorted(series)}')
        finite = []
        for key in keys:
            steps, values = series[key]
            finite += [v for v in values if math.isfinite(v)]
            ax.plot(steps, values, label=key, linewidth=2.0 if key == 'loss' else 1.0,
                    marker='o' if len(steps) < 6 else None, markersize=3)
        if finite and min(finite) > 0 and max(finite) > 10 * min(finite):
            ax.set_yscale('log')  # positive terms spanning more than a decade
        ax.set_title(name, fontsize=10)
        ax.set_xlabel('iteration')
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0, 0].set_ylabel('loss')
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
