"""Helpers shared by the hidden-state and logits op tests: float tensors of every dtype,
bfloat16 carried as uint16 bit patterns (see tests/backends.py)."""

from __future__ import annotations

import numpy as np

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def numpy_dtype(name: str):
    return np.uint16 if name == "bfloat16" else np.dtype(name)


def random_floats(rng, shape, dtype: str) -> np.ndarray:
    """Random finite values (no NaN, so equality is meaningful) with distinct rows."""
    x = rng.standard_normal(shape).astype(np.float32)
    if dtype == "float32":
        return x
    if dtype == "float16":
        return x.astype(np.float16)
    return (x.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 bits (truncated)
