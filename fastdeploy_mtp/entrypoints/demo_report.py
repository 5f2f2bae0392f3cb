"""``demo``'s output: the comparison table and the ``--plot`` bar chart."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine_args import UsageError
from .offline import CommandError, per_position_text

if TYPE_CHECKING:
    from ..runtime.engine_metrics import Metrics


def table(rows: list[list[str]]) -> str:
    """``rows`` (the first is the header) as left-aligned columns, a rule under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def comparison_table(
    plain: str, base: Metrics, mode: str, metrics: Metrics, speedup: float | None
) -> str:
    """The demo's table: one row without speculation (``plain``, ``base``), one with it."""
    return table(
        [
            [
                "mode",
                "tokens/s",
                "target forwards",
                "mean accepted len",
                "acceptance per position",
                "speedup",
            ],
            [
                plain,
                f"{base.tokens_per_second:.1f}",
                str(base.target_forwards),
                f"{base.mean_accepted_length:.2f}",
                "-",
                "1.00x",
            ],
            [
                mode,
                f"{metrics.tokens_per_second:.1f}",
                str(metrics.target_forwards),
                f"{metrics.mean_accepted_length:.2f}",
                per_position_text(metrics),
                "-" if speedup is None else f"{speedup:.2f}x",
            ],
        ]
    )


def check_plot_path(path: str) -> None:
    """Refuse an unwritable ``--plot`` path, and a missing matplotlib, before the (slow) run.

    Raises:
        UsageError: ``path`` is a directory, in a missing directory, or not writable.
        CommandError: matplotlib is not installed.
    """
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise UsageError(f"--plot {path}: is a directory, give a file name (e.g. acceptance.png)")
    if not parent.is_dir():
        raise UsageError(f"--plot {path}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(f"--plot {path}: not writable")
    _import_agg()


def _import_agg() -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as exc:
        raise CommandError(f"--plot needs matplotlib (pip install matplotlib): {exc}") from None
    return FigureCanvasAgg


def plot_acceptance(path: str, metrics: Metrics, label: str) -> None:
    """Write a bar chart of ``metrics.acceptance_per_position`` (draft positions 1..K, 'n/a'
    where no draft was offered) to ``path`` (PNG unless the suffix names another format
    matplotlib knows), with the mean accepted length in the title. Uses matplotlib's Agg
    canvas (no display, no pyplot state).

    Raises:
        CommandError: matplotlib is not installed. OSError: ``path`` cannot be written.
    """
    canvas_cls = _import_agg()
    from matplotlib.figure import Figure

    acceptance = metrics.acceptance_per_position
    positions = list(range(1, len(acceptance) + 1))
    fig = Figure(figsize=(5.5, 3.5), dpi=100)
    canvas_cls(fig)
    ax = fig.add_subplot()
    ax.bar(positions, [0.0 if a is None else a for a in acceptance], color="tab:blue")
    for x, a in zip(positions, acceptance):
        ax.text(x, (a or 0.0) + 0.02, "n/a" if a is None else f"{a:.2f}", ha="center", va="bottom")
    ax.set_xticks(positions)
    ax.set_ylim(0.0, 1.1)
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / offered")
    ax.set_title(f"{label}: mean accepted length {metrics.mean_accepted_length:.2f}")
    fig.tight_layout()
    fig.savefig(path)
