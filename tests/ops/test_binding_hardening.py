"""Hostile arguments at the bindings: every one is refused with a message naming the op and
the argument, before anything is written (regressions of the hardening issue)."""

from __future__ import annotations

import numpy as np
import pytest

import fastdeploy_mtp.ops as ops
from fastdeploy_mtp import _kernels
from tests.support.op_declarations import DECLARED, base_dtype


def _dtype(decl: dict, tensor: dict) -> str:
    dtype = base_dtype(decl, tensor["dtype"])
    return {"float": "float32", "any": "int32"}.get(dtype, dtype)


@pytest.mark.parametrize("op", sorted(DECLARED))
def test_raw_pointer_tuple_with_address_zero_is_refused(op):
    """A raw-pointer tuple carrying address 0 used to crash 12 ops."""
    decl = DECLARED[op]
    kwargs = {t["name"]: (0, _dtype(decl, t), (2,), "cpu") for t in decl["inputs"]}
    kwargs.update({o["name"]: (0, _dtype(decl, o), (2,), "cpu") for o in decl.get("outputs", [])})
    for a in decl.get("attrs", []):
        kwargs.setdefault(a["name"], False if a["type"] == "bool" else 1)
    first = decl["inputs"][0]["name"]
    with pytest.raises(
        ValueError, match=rf"^{op}: `{first}` has 2 element\(s\) but a null data pointer"
    ):
        getattr(_kernels, op)(**kwargs)


def test_raw_pointer_tuple_with_a_negative_or_huge_shape_is_refused():
    buf = np.zeros(4, np.int64)
    good = [
        (buf.ctypes.data, "int64", (2, 2), "cpu"),
        np.zeros(2, np.int32),
        np.zeros(2, np.int32),
        np.zeros(2, bool),
    ]
    for shape, message in (
        ((-1, 2), "negative dimension"),
        ((1 << 40, 1 << 40), "more elements than"),
    ):
        args = [(buf.ctypes.data, "int64", shape, "cpu"), *good[1:]]
        with pytest.raises(
            ValueError, match=rf"draft_model_postprocess: `base_model_draft_tokens` has .*{message}"
        ):
            _kernels.draft_model_postprocess(*args)


def test_read_only_numpy_array_is_a_clear_error_not_a_buffer_error():
    draft = np.zeros((2, 3), np.int64)
    draft.setflags(write=False)
    with pytest.raises(
        ValueError, match=r"^draft_model_postprocess: `base_model_draft_tokens` cannot be passed"
    ):
        _kernels.draft_model_postprocess(
            draft, np.zeros(2, np.int32), np.zeros(2, np.int32), np.zeros(2, bool)
        )


@pytest.mark.parametrize(
    "value, message",
    [(2**31, "does not fit in int32"), (-(2**31) - 1, "does not fit in int32"),
     (2**70, "does not fit in int32"), (1.5, "must be an integer"), ("3", "must be an integer"),
     (True, "must be an integer")],
)  # fmt: skip
def test_kernels_attr_outside_int32_names_the_op_and_the_attr(value, message):
    """pybind used to raise a TypeError that named neither."""
    t = [np.zeros((2, 3), np.int64), np.zeros((2, 3), np.int64), np.zeros((2, 8), np.int64)]
    n = np.zeros(2, np.int32)
    with pytest.raises(ValueError, match=rf"^draft_model_update: attr `substep`.*{message}"):
        _kernels.draft_model_update(
            np.zeros(2, np.int64), t[0], t[2], n.copy(), n.copy(), n.copy(),
            np.zeros((2, 1), np.int64), np.zeros(3, np.int32), np.zeros((2, 1), bool),
            np.zeros(1, bool), np.full((2, 1), 9, np.int64), np.zeros((1, 1), np.int64), t[1], 0,
            value,
        )  # fmt: skip


def test_kernels_bool_attr_accepts_0_and_1_only():
    tensors = [None if i in (3, 4, 5, 6) else np.zeros(1, np.int64) for i in range(17)]
    with pytest.raises(ValueError, match=r"^verify_draft_tokens: attr `reject_all` must be a bool"):
        _kernels.verify_draft_tokens(*tensors, 0, 2, 1, 2, False)


# ---- Paddle binding ------------------------------------------------------------------------


def _postprocess_args(paddle):
    draft = paddle.to_tensor(np.array([[5, 7, -1], [5, -1, 9]], np.int64))
    slt = paddle.to_tensor(np.array([3, 3], np.int32))
    enc = paddle.zeros([2], dtype="int32")
    stop = paddle.zeros([2, 1], dtype="bool")
    return draft, slt, enc, stop


def test_paddle_strided_in_place_tensor_is_refused_before_paddle_copies_it():
    """Paddle hands a custom op a contiguous copy of a strided view: the op's writes to
    `seq_lens_this_time = big[::2]` were lost without an error."""
    paddle = pytest.importorskip("paddle")
    draft, _, enc, stop = _postprocess_args(paddle)
    big = paddle.to_tensor(np.array([3, 0, 3, 0], np.int32))
    view = big[::2]
    assert not view.is_contiguous()
    with pytest.raises(
        ops.OpError,
        match=r"^draft_model_postprocess: `base_model_seq_lens_this_time` is written in",
    ):
        ops.draft_model_postprocess(draft, view, enc, stop)
    np.testing.assert_array_equal(big.numpy(), [3, 0, 3, 0])


def test_paddle_strided_read_only_input_is_accepted():
    """A view of an input the op only reads is safe (Paddle's copy holds the same values)."""
    paddle = pytest.importorskip("paddle")
    draft, slt, _, stop = _postprocess_args(paddle)
    enc = paddle.zeros([4], dtype="int32")[::2]
    ops.draft_model_postprocess(draft, slt, enc, stop)
    np.testing.assert_array_equal(slt.numpy(), [2, 2])


def test_paddle_attr_outside_int32_names_the_op_and_the_attr():
    paddle = pytest.importorskip("paddle")
    t = paddle.zeros([2, 4], dtype="int64")
    with pytest.raises(
        ops.OpError, match=r"^mtp_step_paddle: attr `block_size` = 2147483648 does not fit in int32"
    ):
        ops.mtp_step_paddle(*([t] * 11), 2**31, 0)


def test_paddle_argument_that_is_not_a_tensor_names_the_argument():
    paddle = pytest.importorskip("paddle")
    draft, slt, enc, _ = _postprocess_args(paddle)
    with pytest.raises(
        ops.OpError,
        match=r"^draft_model_postprocess: `base_model_stop_flags` must be a paddle.Tensor",
    ):
        ops.draft_model_postprocess(draft, slt, enc, np.zeros((2, 1), bool))


def test_paddle_uninitialized_tensor_names_the_op():
    paddle = pytest.importorskip("paddle")
    draft, slt, enc, _ = _postprocess_args(paddle)
    with pytest.raises(ops.OpError, match=r"^draft_model_postprocess: `base_model_stop_flags`"):
        ops.draft_model_postprocess(draft, slt, enc, paddle.Tensor())


def test_paddle_verify_draft_tokens_upstream_positional_call():
    """Upstream callers pass the 17 tensors, then max_seq_len, verify_window,
    verify_strategy, reject_all, accept_all; our optional verify_uniforms trails them."""
    paddle = pytest.importorskip("paddle")
    ids = paddle.full([1, 3], -1, "int64")
    n = paddle.zeros([1], "int32")
    args = [
        ids, n, paddle.to_tensor([[3, 7, 8]], "int64"), paddle.to_tensor([7, 9, 4], "int64"),
        None, None, None, paddle.ones([1, 1]), paddle.zeros([1, 1], "bool"),
        paddle.zeros([1], "int32"), paddle.to_tensor([3], "int32"),
        paddle.to_tensor([[2]], "int64"), paddle.zeros([1], "bool"), paddle.zeros([1], "int32"),
        paddle.zeros([1, 1], "int32"),
        paddle.to_tensor([[100]], "int64"), paddle.zeros([1, 1], "int64"),
    ]  # fmt: skip
    ops.verify_draft_tokens(*args, 2048, 2, int(ops.VerifyStrategy.GREEDY), False, False)
    np.testing.assert_array_equal(ids.numpy(), [[7, 9, -1]])
    np.testing.assert_array_equal(n.numpy(), [2])
