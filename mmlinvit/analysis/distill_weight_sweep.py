"""Settings, run records and tables of the distillation-weight sweep (torch only).

The back end of ``tools/analysis/sweep_distill_weight.py``, which trains linear students with
no distillation, the raw attention-output MSE (``mmlinvit.AttentionOutputMSELoss``) and the
normalised one (``mmlinvit.NormalizedAttentionOutputMSELoss``) at several weights:

* a *setting* is ``(kind, weight)`` with kind ``'none'``, ``'raw'`` or ``'normalized'``
  (:func:`sweep_settings`, :func:`setting_label`, :func:`build_distill_loss`);
* every finished run is one JSON line; :func:`load_results` reads them back, one per
  :func:`run_key`;
* :func:`summarise` writes the Markdown tables: per task init x setting (mean +- sample
  standard deviation over seeds, ``ddof=1``; the mean alone for a single seed) and the
  regret of each setting (how far it lands below the best setting of the same init,
  averaged over inits).
"""
import json
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch.nn as nn

from mmlinvit.distill.losses import AttentionOutputMSELoss, NormalizedAttentionOutputMSELoss

#: ``(kind, weight)``: kind ``'none'`` (no distillation), ``'raw'`` or ``'normalized'``.
Setting = Tuple[str, float]
#: Registry names of the losses of the two distilling kinds.
LOSS_TYPES = {'raw': 'mmlinvit.AttentionOutputMSELoss',
              'normalized': 'mmlinvit.NormalizedAttentionOutputMSELoss'}
#: The weight-transfer inits compared (:mod:`mmlinvit.transfer` names) and their labels.
INIT_LABELS = {'random': 'Random', 'copy': 'Copy', 'mlp_copy': 'MLPCopy',
               'full_copy': 'FullCopy'}
#: Metric of each task, for the table titles.
TASK_METRICS = {'digits': 'held-out accuracy (%)', 'scenes': 'validation mIoU (%)'}


def sweep_settings(raw: Sequence[float], normalized: Sequence[float],
                   baseline: bool = True) -> List[Setting]:
    """The settings in table order: ``('none', 0)`` (when ``baseline``), then the raw and the
    normalised weights; a weight given twice is one setting."""
    out: List[Setting] = [('none', 0.0)] if baseline else []
    out += [('raw', float(w)) for w in raw]
    out += [('normalized', float(w)) for w in normalized]
    return list(dict.fromkeys(out))


def setting_label(setting: Setting) -> str:
    """``'w/o distill'``, ``'raw 50'``, ``'norm 1'``."""
    kind, weight = setting
    if kind == 'none':
        return 'w/o distill'
    return f'{"raw" if kind == "raw" else "norm"} {weight:g}'


def build_distill_loss(setting: Setting) -> Optional[nn.Module]:
    """The torch-only loss of a setting (``None`` for ``'none'``).

    Raises:
        ValueError: an unknown kind.
    """
    kind, weight = setting
    if kind == 'none':
        return None
    if kind == 'raw':
        return AttentionOutputMSELoss(loss_weight=weight)
    if kind == 'normalized':
        return NormalizedAttentionOutputMSELoss(loss_weight=weight)
    raise ValueError(f"Unknown setting kind {kind!r}; use 'none', 'raw' or 'normalized'")


def run_key(task: str, init: str, setting: Setting, seed: int, iters: int,
            operator: str) -> tuple:
    """What identifies one run (a rerun with the same key is skipped)."""
    return (task, init, setting[0], float(setting[1]), int(seed), int(iters), operator)


def record_key(record: dict) -> tuple:
    """:func:`run_key` of a recorded run."""
    return run_key(record['task'], record['init'], (record['kind'], record['weight']),
                   record['seed'], record['iters'], record['operator'])


def load_results(path: str) -> List[dict]:
    """The runs recorded in ``path`` so far (one JSON object per line), one per run: when two
    sweeps sharing a work dir recorded the same run, the last record counts."""
    if not osp.isfile(path):
        return []
    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f'{path}:{number} is not JSON ({err}); a run stopped while '
                                 f'writing it? Delete that line (its run is redone)') from err
    return list({record_key(r): r for r in records}.values())


def drop_partial_last_line(path: str) -> Optional[str]:
    """Cuts an unfinished last line (no newline: a sweep stopped while appending it) off
    ``path``, so that resuming redoes that run and appends after whole lines; returns the
    dropped text (``None`` when the file ends with a whole line or does not exist)."""
    if not osp.isfile(path):
        return None
    with open(path, 'rb+') as f:
        data = f.read()
        if not data or data.endswith(b'\n'):
            return None
        keep = data.rfind(b'\n') + 1
        f.truncate(keep)
    return data[keep:].decode('utf-8', errors='replace')


def _task_table(task: str, results: Sequence[dict], settings: Sequence[Setting],
                inits: Sequence[str], teacher: dict) -> Tuple[List[str], Dict[Setting, float]]:
    """One task's table lines and its regret per setting (complete settings only)."""
    cell: Dict[Tuple[str, Setting], List[float]] = {}
    for r in results:
        cell.setdefault((r['init'], (r['kind'], float(r['weight']))), []).append(r['score'])
    seeds = sorted({r['seed'] for r in results})
    iters = sorted({r['iters'] for r in results})
    operators = sorted({r['operator'] for r in results})
    lines = [f'\n### {task}: {TASK_METRICS[task]}, mean +- sample std (ddof=1) over seeds '
             f'{seeds} ({"/".join(operators)} students, {"/".join(map(str, iters))} '
             'iterations)']
    if teacher:
        ms = teacher.get('teacher_attn_mean_square', [])
        lines.append(f'softmax teacher: {teacher["teacher_score"]:.2f}; teacher attention-'
                     f'output mean square per block: {", ".join(f"{v:.4g}" for v in ms)}\n')
    lines.append('| init | ' + ' | '.join(setting_label(s) for s in settings) + ' |')
    lines.append('|---' * (len(settings) + 1) + '|')
    best_of_init = {}
    for init in inits:
        means = {s: float(np.mean(cell[(init, s)])) for s in settings if (init, s) in cell}
        best_of_init[init] = max(means.values()) if means else float('nan')
        row = []
        for s in settings:
            values = cell.get((init, s))
            if not values:
                row.append('-')
                continue
            text = f'{np.mean(values):.1f}'
            if len(values) > 1:  # sample standard deviation (n - 1 in the denominator)
                text += f' +- {np.std(values, ddof=1):.1f}'
            row.append(f'**{text}**' if means[s] == best_of_init[init] else text)
        lines.append(f'| {INIT_LABELS[init]} | ' + ' | '.join(row) + ' |')
    regrets = {}
    for s in settings:
        gaps = [best_of_init[i] - np.mean(cell[(i, s)]) for i in inits if (i, s) in cell]
        if len(gaps) == len(inits):
            regrets[s] = float(np.mean(gaps))
    return lines, regrets


def summarise(results: Sequence[dict], settings: Sequence[Setting], inits: Sequence[str],
              teachers: Dict[str, dict]) -> str:
    """Markdown: per task a table (init x setting, mean +- sample std over seeds) and the regret
    table (per setting and task: mean over inits of best-of-init minus this setting).

    Args:
        results: Run records (``task``, ``init``, ``kind``, ``weight``, ``seed``, ``iters``,
            ``operator``, ``score``).
        settings: The settings, in column order.
        inits: The inits, in row order (:data:`INIT_LABELS` keys).
        teachers: Per task the teacher's ``teacher_score`` and ``teacher_attn_mean_square``
            (a task without one gets no teacher line).
    """
    lines: List[str] = []
    regrets: Dict[str, Dict[Setting, float]] = {}
    tasks = [t for t in TASK_METRICS if any(r['task'] == t for r in results)]
    for task in tasks:
        task_lines, regrets[task] = _task_table(task, [r for r in results if r['task'] == task],
                                                settings, inits, teachers.get(task, {}))
        lines += task_lines
    if regrets:
        lines.append('\n### regret: mean over inits of (best setting of that init - this '
                     'setting), points; lower is better')
        lines.append('| setting | ' + ' | '.join(tasks) + ' | worst task |')
        lines.append('|---' * (len(tasks) + 2) + '|')
        worst = {}
        for s in settings:
            values = [regrets[t].get(s) for t in tasks]
            if any(v is None for v in values):
                continue
            worst[s] = max(values)
            lines.append(f'| {setting_label(s)} | ' + ' | '.join(f'{v:.2f}' for v in values) +
                         f' | {worst[s]:.2f} |')
        if worst:
            best = min(worst, key=worst.get)
            lines.append(f'\nsetting with the smallest worst-task regret: '
                         f'**{setting_label(best)}** ({worst[best]:.2f} points)')
    return '\n'.join(lines) + '\n'
