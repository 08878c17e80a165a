"""What the GPU suite shows: its printed tables and ``suite.png``.

matplotlib is imported inside :func:`plot` (Agg backend), so importing this module does not
need it.
"""
from typing import Dict, List, Optional, Sequence, Tuple

from mmlinvit.utils.benchmarking import print_table

from .metadata import L2_RULE_TOKENS
from .sdpa import SDPA_BACKENDS


def print_section(title: str, rows: Sequence[Dict[str, object]],
                  cols: Optional[Sequence[str]] = None) -> None:
    """``title``, then ``rows`` as a table (floats with 3 significant digits).

    Args:
        title: The line above the table.
        rows: Result rows; list values (per-round times) are left out of the table.
        cols: Columns to print (an ``error`` / ``skipped`` column is added when a row has
            one); ``None``: every scalar column.
    """
    print(title)
    if not rows:
        return
    if cols is None:
        cols = [c for c in dict.fromkeys(k for r in rows for k in r)
                if not any(isinstance(r.get(c), (list, dict)) for r in rows)]
    else:
        cols = [c for c in cols if any(c in r for r in rows)]
        cols += [c for c in ('skipped', 'error') if c not in cols and any(c in r for r in rows)]

    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f'{v:.3g}' if abs(v) < 1e4 else f'{v:.0f}'
        return '-' if v is None else str(v)

    print_table(cols, [{c: fmt(r.get(c)) for c in cols} for r in rows], indent='  ',
                rule=False)


def _numbers(rows: List[Dict[str, object]], x: str, y: str) -> Tuple[list, list]:
    pts = [(r[x], r[y]) for r in rows if isinstance(r.get(y), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot(result: Dict[str, object], path: str, dry: bool) -> None:
    """Saves ``suite.png``: the linear attention op's times, its bandwidth, the backbones.

    Args:
        result: The suite's result (``linear_attention``, ``linear_attention_sdpa``,
            ``backbones``, ``device``).
        path: The PNG file.
        dry: Whether this is the ``--dry-run`` (named in the title).
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    la = result.get('linear_attention') or []
    sdpa = [r for r in result.get('linear_attention_sdpa') or [] if r.get('sdpa') != 'default']
    if la:
        for key, style in (('triton ms', 'o-'), ('torch ms', 's-'), ('triton f+b ms', 'o:')):
            axes[0].plot(*_numbers(la, 'N', key), style, label=key)
        for backend in SDPA_BACKENDS:
            mine = [r for r in sdpa if r['sdpa'] == backend]
            axes[0].plot(*_numbers(mine, 'N', 'ms'), 'x--', label=f'sdpa-{backend} ms')
            axes[0].plot(*_numbers(mine, 'N', 'f+b ms'), 'x:', label=f'sdpa-{backend} f+b ms')
        axes[0].set(xscale='log', yscale='log', xlabel='tokens N', ylabel='ms',
                    title='linear attention op (B=1)')
        axes[0].legend(fontsize=7)
        axes[1].plot(*_numbers(la, 'N', 'HBM fwd'), 'o-', label='fwd')
        axes[1].plot(*_numbers(la, 'N', 'HBM f+b'), 's-', label='fwd+bwd')
        axes[1].axhline(0.7, color='gray', linestyle='--', label='target 70%')
        axes[1].axvline(L2_RULE_TOKENS, color='gray', linestyle=':', label='left: in L2')
        axes[1].set(xscale='log', xlabel='tokens N', ylabel='fraction of peak HBM BW',
                    title='Triton kernel bandwidth')
        axes[1].legend(fontsize=7)
    bb = [r for r in result.get('backbones') or [] if isinstance(r.get('ms'), (int, float))]
    if bb:
        labels = [f"{r['model']}\n{r['size']}" for r in bb]
        axes[2].bar(range(len(bb)), [r['ms'] for r in bb],
                    color=['C0' if 'softmax' in r['model'] else 'C1' for r in bb])
        axes[2].set_xticks(range(len(bb)), labels, fontsize=6, rotation=60)
        axes[2].set(ylabel='ms (batch 1, eager)', yscale='log', title='backbones')
    fig.suptitle(f"{result['device']} ({'dry run: timings meaningless' if dry else 'bf16'})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
