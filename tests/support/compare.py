"""Comparison helpers for op tests: every mismatch is labelled with the tensor's name.

Integers and bools compare exactly; floats with tolerances the caller writes down.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np


def _first_mismatches(got: np.ndarray, want: np.ndarray, limit: int = 5) -> str:
    bad = np.argwhere(got != want)
    shown = ", ".join(
        f"{tuple(int(i) for i in idx)}: got {got[tuple(idx)]!r} want {want[tuple(idx)]!r}"
        for idx in bad[:limit]
    )
    return f"{len(bad)} mismatching element(s); first: {shown}"


def assert_exact(name: str, got: np.ndarray, want: np.ndarray, context: str = "") -> None:
    """Integer/bool tensors: same shape, same dtype, every element equal."""
    label = f"{name}{' (' + context + ')' if context else ''}"
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{label}: shape {got.shape} != expected {want.shape}"
    assert got.dtype == want.dtype, f"{label}: dtype {got.dtype} != expected {want.dtype}"
    if not np.array_equal(got, want):
        raise AssertionError(f"{label}: {_first_mismatches(got, want)}")


def assert_close(
    name: str, got: np.ndarray, want: np.ndarray, *, rtol: float, atol: float, context: str = ""
) -> None:
    """Float tensors: same shape and dtype, |got - want| <= atol + rtol * |want|."""
    label = f"{name}{' (' + context + ')' if context else ''}"
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{label}: shape {got.shape} != expected {want.shape}"
    assert got.dtype == want.dtype, f"{label}: dtype {got.dtype} != expected {want.dtype}"
    np.testing.assert_allclose(
        got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, err_msg=label
    )


def assert_all_exact(
    names: Sequence[str],
    got: Sequence[np.ndarray],
    want: Mapping[str, np.ndarray],
    context: str = "",
) -> None:
    """Compares every tensor of an op call (inputs included: untouched ones must stay)."""
    assert len(names) == len(got), "one result per tensor name"
    for name, g in zip(names, got):
        assert_exact(name, g, want[name], context)


def run_exact(
    backend,
    op: str,
    names: Sequence[str],
    tensors: Sequence[np.ndarray],
    attrs: Sequence,
    want: Mapping[str, np.ndarray],
    context: str = "",
) -> dict[str, np.ndarray]:
    """Runs `op` on `backend` and compares every tensor after the call with `want` exactly
    (:func:`assert_all_exact`); returns the tensors by name."""
    got = backend.run(op, tensors, attrs)
    assert_all_exact(names, got, want, context=f"{backend.name}, {context}")
    return dict(zip(names, got))


def exact_check(op: str, names: Sequence[str], reference: Callable[..., Mapping]) -> Callable:
    """The `check(backend, tensors, attrs, context)` of an op whose reference takes the same
    positional arguments as the op (`reference(*tensors, *attrs)`): :func:`run_exact` against
    that reference; returns the tensors by name."""

    def check(backend, tensors, attrs, context: str = "") -> dict[str, np.ndarray]:
        want = reference(*tensors, *attrs)
        return run_exact(backend, op, names, tensors, attrs, want, context)

    return check


def assert_bit_exact(name: str, got: np.ndarray, want: np.ndarray, context: str = "") -> None:
    """Float tensors that an op only copies: same shape and dtype, identical bit patterns
    (so -0.0 vs 0.0 or a changed NaN payload fails)."""
    got = np.asarray(got)
    want = np.asarray(want)
    label = f"{name}{' (' + context + ')' if context else ''}"
    assert got.dtype == want.dtype, f"{label}: dtype {got.dtype} != expected {want.dtype}"
    unsigned = np.dtype(f"uint{8 * got.dtype.itemsize}")
    assert_exact(name, got.view(unsigned), want.view(unsigned), context)


def assert_rejected(
    backend,
    op: str,
    names: Sequence[str],
    tensors: Sequence[np.ndarray],
    bad_name: str,
    attrs=(),
    outputs=(),
) -> str:
    """The op must raise a ValueError that names `op` and the tensor `bad_name`, and leave
    every tensor unchanged: the buffers the op was actually given (the backend's copies, read
    back after the failed call and attached to the error), not the caller's arrays, which no
    backend hands to the op. Returns the message."""
    import pytest

    before = [np.array(t, copy=True) for t in tensors]
    with pytest.raises(ValueError) as info:
        backend.run(op, tensors, attrs, outputs)
    message = str(info.value)
    assert message.startswith(f"{op}: "), f"message does not name the op: {message!r}"
    assert f"`{bad_name}`" in message, f"message does not name `{bad_name}`: {message!r}"
    received = getattr(info.value, "received", None)
    assert received is not None, "the backend did not record the buffers the op received"
    assert len(received) == len(before), "one received buffer per tensor"
    for name, b, got in zip(names, before, received):
        if b is None or b.dtype == object:
            continue
        np.testing.assert_array_equal(got, b, err_msg=f"{name} changed by a rejected call")
    return message


def assert_bad_input_rejected(
    backend,
    op: str,
    names: Sequence[str],
    bad_case,
    tensors: list[np.ndarray],
    attrs=(),
    outputs=(),
) -> str:
    """`bad_case` is ``(index, build, bad_name)``: valid `tensors` with ``tensors[index]``
    replaced by ``build(tensors)`` must be rejected as :func:`assert_rejected` says."""
    index, build, bad_name = bad_case
    tensors[index] = build(tensors)
    return assert_rejected(backend, op, names, tensors, bad_name, attrs, outputs)
