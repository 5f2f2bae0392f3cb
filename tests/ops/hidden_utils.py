"""Helpers shared by the hidden-state and logits op tests: float tensors of every dtype,
bfloat16 carried as uint16 bit patterns (see tests/support/backends.py)."""

from __future__ import annotations

import numpy as np

from tests.support.compare import assert_bit_exact, assert_exact

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def random_floats(rng, shape, dtype: str) -> np.ndarray:
    """Random finite values (no NaN, so equality is meaningful) with distinct rows."""
    x = rng.standard_normal(shape).astype(np.float32)
    if dtype == "float32":
        return x
    if dtype == "float16":
        return x.astype(np.float16)
    return (x.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 bits (truncated)


def check_row_gather(backend, op, names, tensors, attrs, outputs, want, context):
    """Runs a row-gather op (outputs ``out`` and ``output_token_num``), checks that no
    input changed, ``out`` is bit-exact and the count exact; returns ``(out, count)``."""
    want_out, want_n = want
    got = backend.run(op, tensors, attrs, outputs)
    for name, g, t in zip(names, got, tensors):
        np.testing.assert_array_equal(g, t, err_msg=f"{name} changed ({context})")
    assert_bit_exact("out", got[-2], want_out, f"{backend.name}, {context}")
    assert_exact("output_token_num", got[-1], want_n, f"{backend.name}, {context}")
    return got[-2], got[-1]


def check_random_state(backend, check, make_state, bsz: int, width: int, dtype: str, salt: int):
    """`check(backend, tensors, context)` on `make_state(rng, bsz, width, dtype)`, the rng
    seeded from the sizes (`salt` differs per op, so no two ops draw the same states)."""
    rng = np.random.default_rng(bsz * salt + width)
    return check(backend, make_state(rng, bsz, width, dtype), f"bsz={bsz} width={width} {dtype}")
