"""The op declarations (custom_ops/ops/*.toml) as the tests read them."""

from __future__ import annotations

import tomllib
from pathlib import Path

DECLARATION_DIR = Path(__file__).resolve().parents[2] / "custom_ops" / "ops"
NOT_OPS = ("constants", "manual_ops")  # the files of that folder that declare no kernel op
DECLARATION_FILES = sorted(p for p in DECLARATION_DIR.glob("*.toml") if p.stem not in NOT_OPS)
#: op name -> its parsed declaration
DECLARED: dict[str, dict] = {p.stem: tomllib.loads(p.read_text()) for p in DECLARATION_FILES}
#: The host-only ops (``host_only = true``: one host function on every backend, no kernels).
HOST_ONLY: frozenset[str] = frozenset(
    name for name, decl in DECLARED.items() if decl.get("host_only")
)


def base_dtype(decl: dict, dtype: str) -> str:
    """A declared dtype with `same:<input>` followed to the input's own dtype."""
    while dtype.startswith("same:"):
        dtype = next(t for t in decl["inputs"] if t["name"] == dtype[5:])["dtype"]
    return dtype
