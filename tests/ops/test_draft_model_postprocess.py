"""draft_model_postprocess on every backend against tests/reference/ (docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.reference.draft_model_postprocess import draft_model_postprocess as reference
from tests.support.compare import assert_bad_input_rejected, assert_exact, run_exact
from tests.support.op_states import SENTINEL, postprocess_state as make_state

OP = "draft_model_postprocess"
NAMES = (
    "base_model_draft_tokens",
    "base_model_seq_lens_this_time",
    "base_model_seq_lens_encoder",
    "base_model_stop_flags",
)


def check(backend, tensors, context):
    """Returns the tensors after the call, in NAMES order."""
    return list(run_exact(backend, OP, NAMES, tensors, (), reference(*tensors), context).values())


@pytest.mark.parametrize("bsz", [1, 3, 257, 1500])
@pytest.mark.parametrize("width", [2, 3, 4, 5, 6, 7, 8, 9])
def test_random_states_match_reference(backend, bsz, width):
    rng = np.random.default_rng(1000 * bsz + width)
    check(backend, make_state(rng, bsz, width), f"bsz={bsz} width={width}")


def test_batch_beyond_upstream_1024_cap(backend):
    # Deviation 1: upstream's GPU kernel runs one block of <= 1024 threads.
    rng = np.random.default_rng(7)
    got = check(backend, make_state(rng, 3000, 4, p_stop=0.0, p_prefill=0.0), "bsz=3000")
    assert (got[1][1024:] != SENTINEL).all(), "items past 1024 were not written"


def test_all_stopped_items_get_zero(backend):
    rng = np.random.default_rng(11)
    tensors = make_state(rng, 64, 5, p_stop=1.0)
    got = check(backend, tensors, "all stopped")
    assert (got[1] == 0).all()


def test_all_prefill_items_keep_their_count(backend):
    rng = np.random.default_rng(12)
    tensors = make_state(rng, 64, 5, p_stop=0.0, p_prefill=1.0)
    tensors[1] = rng.integers(1, 512, size=64).astype(np.int32)
    got = check(backend, tensors, "all prefill")
    np.testing.assert_array_equal(got[1], tensors[1])


def test_holes_in_the_middle_of_a_row_do_not_end_the_count(backend):
    draft = np.array(
        [
            [7, -1, 9, -1, 4],  # 3: not the prefix length 1
            [-1, -1, -1, -1, 8],  # 1: only the last slot
            [-1, -1, -1, -1, -1],  # 0
            [1, 2, 3, 4, 5],  # 5
            [-1, 2, -1, 4, -1],  # 2
        ],
        dtype=np.int64,
    )
    tensors = [draft, np.full(5, SENTINEL, np.int32), np.zeros(5, np.int32), np.zeros((5, 1), bool)]
    got = check(backend, tensors, "holes")
    np.testing.assert_array_equal(got[1], np.array([3, 1, 0, 5, 2], np.int32))


def test_length_values_of_2_31_do_not_cost_time(backend):
    """The count is bounded by the row width, whatever the length values say."""
    from tests.ops.child_process import run_in_child

    tensors = make_state(np.random.default_rng(20), 6, 4)
    tensors[1] = np.full(6, 2**31 - 1, np.int32)
    tensors[2] = np.array([2**31 - 1, 0, -(2**31), 0, 2**31 - 1, 0], np.int32)
    run_in_child(lambda: bool(check(backend, tensors, "2**31 - 1")), timeout=60)


def test_stop_wins_over_prefill(backend):
    tensors = [
        np.array([[1, 2], [3, 4]], np.int64),
        np.array([SENTINEL, SENTINEL], np.int32),
        np.array([5, 5], np.int32),
        np.array([[True], [False]]),
    ]
    got = check(backend, tensors, "stopped prefill")
    np.testing.assert_array_equal(got[1], np.array([0, SENTINEL], np.int32))


def test_accepts_per_item_tensors_of_shape_n_by_1(backend):
    rng = np.random.default_rng(5)
    draft, slt, enc, stop = make_state(rng, 9, 4)
    check(backend, [draft, slt.reshape(9, 1), enc.reshape(9, 1), stop.reshape(9)], "[N,1] per-item")


def test_zero_items_is_a_no_op(backend):
    tensors = [
        np.zeros((0, 4), np.int64),
        np.zeros(0, np.int32),
        np.zeros(0, np.int32),
        np.zeros((0, 1), bool),
    ]
    check(backend, tensors, "bsz=0")


PADDED = {
    # tensor index: extra rows that would change the result if they were read
    0: lambda t, m: np.concatenate([t[0], np.full((m, t[0].shape[1]), 77, np.int64)]),
    2: lambda t, m: np.concatenate([t[2], np.full(m, 9, np.int32)]),
    3: lambda t, m: np.concatenate([t[3], np.ones((m, *t[3].shape[1:]), bool)]),
}


@pytest.mark.parametrize(
    "padded", [[0], [2], [3], [0, 2, 3]], ids=["draft", "encoder", "stop", "all"]
)
@pytest.mark.parametrize("stop_shape", ["n_by_1", "n"])
def test_every_tensor_may_have_more_rows_than_the_batch_and_its_extra_rows_are_untouched(
    backend, padded, stop_shape
):
    """N is seq_lens_this_time's length; every other tensor may have more rows (upstream
    callers pad to max_bsz): they are accepted, the result is the one without them, and the
    extra rows are neither read nor written. The draft rows keep their own width (5 here)."""
    rng = np.random.default_rng(31)
    tensors = make_state(rng, 7, 5, p_stop=0.3, p_prefill=0.3)
    if stop_shape == "n":
        tensors[3] = tensors[3].reshape(-1)
    want = reference(*tensors)
    bigger = list(tensors)
    for index in padded:
        bigger[index] = PADDED[index](tensors, 4)
    got = backend.run(OP, bigger)
    context = f"{backend.name}, padded {[NAMES[i] for i in padded]}"
    assert_exact(NAMES[1], got[1], want[NAMES[1]], context=context)
    for name, g, given in zip(NAMES, got, bigger):
        if name != NAMES[1]:
            assert_exact(name, g, given, context=f"{context}: a read-only tensor changed")


def _valid(bsz=6, width=4):
    return make_state(np.random.default_rng(3), bsz, width)


BAD_INPUTS = {
    # case id: (tensor index, replacement builder, name expected in the message); the batch
    # is 6, so the *_batch_<n> cases have fewer rows than it
    "draft_tokens_int32": (0, lambda t: t[0].astype(np.int32), "base_model_draft_tokens"),
    "seq_lens_this_time_int64": (
        1,
        lambda t: t[1].astype(np.int64),
        "base_model_seq_lens_this_time",
    ),
    "seq_lens_encoder_float32": (
        2,
        lambda t: t[2].astype(np.float32),
        "base_model_seq_lens_encoder",
    ),
    "stop_flags_int32": (3, lambda t: t[3].astype(np.int32), "base_model_stop_flags"),
    "draft_tokens_rank1": (0, lambda t: t[0].reshape(-1), "base_model_draft_tokens"),
    "draft_tokens_rank3": (0, lambda t: t[0].reshape(6, 2, 2), "base_model_draft_tokens"),
    "seq_lens_this_time_rank0": (
        1,
        lambda t: np.array(3, np.int32),
        "base_model_seq_lens_this_time",
    ),
    "stop_flags_n_by_2": (3, lambda t: np.zeros((6, 2), bool), "base_model_stop_flags"),
    "draft_tokens_batch_5": (0, lambda t: np.zeros((5, 4), np.int64), "base_model_draft_tokens"),
    "seq_lens_encoder_batch_5": (2, lambda t: np.zeros(5, np.int32), "base_model_seq_lens_encoder"),
    "stop_flags_batch_1": (3, lambda t: np.zeros((1, 1), bool), "base_model_stop_flags"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    assert_bad_input_rejected(backend, OP, NAMES, BAD_INPUTS[case], _valid())


def test_paddle_rejected_call_leaves_inputs_unchanged():
    """The Paddle op writes in place; a rejected call must not have touched its tensors."""
    paddle = pytest.importorskip("paddle")
    import fastdeploy_mtp.ops as ops

    draft, slt, enc, stop = _valid()
    t_draft = paddle.to_tensor(draft)
    t_slt = paddle.to_tensor(slt)
    t_enc = paddle.to_tensor(np.zeros(5, np.int32))  # batch mismatch
    t_stop = paddle.to_tensor(stop)
    with pytest.raises(ops.OpError, match="`base_model_seq_lens_encoder`.*m >= 6"):
        ops.draft_model_postprocess(t_draft, t_slt, t_enc, t_stop)
    np.testing.assert_array_equal(t_slt.numpy(), slt)
    np.testing.assert_array_equal(t_draft.numpy(), draft)


def test_paddle_op_writes_in_place_through_the_same_buffer():
    paddle = pytest.importorskip("paddle")
    import fastdeploy_mtp.ops as ops

    draft, slt, enc, stop = _valid()
    t_slt = paddle.to_tensor(slt)
    ptr = t_slt.data_ptr()
    result = ops.draft_model_postprocess(
        paddle.to_tensor(draft), t_slt, paddle.to_tensor(enc), paddle.to_tensor(stop)
    )
    assert result is None
    assert t_slt.data_ptr() == ptr
    np.testing.assert_array_equal(
        t_slt.numpy(), reference(draft, slt, enc, stop)["base_model_seq_lens_this_time"]
    )


def test_paddle_op_takes_keyword_arguments_in_the_registered_order():
    """`.Inputs()` order == the kernel's parameter order == the wrapper's keywords."""
    paddle = pytest.importorskip("paddle")
    import fastdeploy_mtp.ops as ops

    draft, slt, enc, stop = _valid()
    t_slt = paddle.to_tensor(slt)
    ops.draft_model_postprocess(
        base_model_stop_flags=paddle.to_tensor(stop),
        base_model_seq_lens_encoder=paddle.to_tensor(enc),
        base_model_seq_lens_this_time=t_slt,
        base_model_draft_tokens=paddle.to_tensor(draft),
    )
    np.testing.assert_array_equal(
        t_slt.numpy(), reference(draft, slt, enc, stop)["base_model_seq_lens_this_time"]
    )
