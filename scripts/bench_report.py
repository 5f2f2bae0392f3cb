"""Output of the benchmark scripts: result rows as a Markdown table on stdout and, when asked,
as JSON in a file."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence


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
