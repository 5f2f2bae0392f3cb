"""Adapters from a fuzz case to each op's numpy reference (tests/reference/)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

REFERENCES: dict[str, Callable] = {}


def compare_with_reference(op: str, tensors: dict, attrs: dict, outputs: dict, results: dict) -> None:
    """Asserts that the op's results equal its reference on a copy of the inputs."""
    want = REFERENCES[op](
        {k: None if v is None else np.array(v, copy=True) for k, v in tensors.items()}, attrs, outputs
    )
    for name, value in want.items():
        got = results[name]
        assert np.array_equal(np.asarray(got), np.asarray(value)), f"{op}: `{name}` differs from the reference"
