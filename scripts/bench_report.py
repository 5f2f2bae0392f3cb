"""What the benchmark scripts share: their command line (the module docstring as the help text,
``--json``) and their output, result rows as a Markdown table on stdout and, with ``--json``,
as JSON in a file."""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable, Sequence


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark script's parser: `doc` (its module docstring) as the description, kept as
    written, and ``--json``, the file that also gets the rows (:func:`write_json`)."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    return ap


def print_table(header: Sequence[str], lines: Iterable[Sequence[str]]) -> None:
    """A Markdown table: the `header` row, its rule, then one row per item of `lines` (cells)."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for cells in lines:
        print("| " + " | ".join(cells) + " |")


def write_json(path: str | None, rows: list[dict], indent: int = 1) -> None:
    """`rows` as JSON in the file `path`; nothing when there is no path."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=indent)


def median_range(values: Sequence[float], digits: int = 0, unit: str = "") -> str:
    """`values` (one per repeat of a point) as ``"median [min, max]"``, each with `digits`
    decimals and `unit` after it; just the value when there is one, ``"-"`` when none."""
    if not values:
        return "-"

    def fmt(v: float) -> str:
        return f"{v:.{digits}f}{unit}"

    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}, {fmt(max(values))}]"
