"""eagle_get_hidden_states on every backend against tests/reference/ (docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ops.hidden_utils import FLOAT_DTYPES, check_random_state, check_row_gather, random_floats
from tests.reference.hidden_states import eagle_get_hidden_states as reference
from tests.support.compare import assert_rejected

OP = "eagle_get_hidden_states"
NAMES = (
    "input",
    "seq_lens_this_time",
    "seq_lens_encoder",
    "seq_lens_decoder",
    "stop_flags",
    "accept_nums",
    "base_model_seq_lens_this_time",
    "base_model_seq_lens_encoder",
)
ATTRS = (3,)  # actual_draft_token_num (not read)


def outputs(tensors):
    t, h = tensors[0].shape
    return [("out", (t, h), tensors[0].dtype), ("output_token_num", (1,), np.int32)]


def make_state(rng, bsz, hidden, dtype, k=3):
    """Draft state after draft_model_preprocess: prefill items (draft enc > 0), decode items
    with 1..k+1 target rows and 1..rows accepted, and idle items (slt == 0)."""
    kind = rng.choice(
        ["prefill", "decode", "idle_with_rows", "idle"], size=bsz, p=[0.2, 0.5, 0.15, 0.15]
    )
    enc = np.where(kind == "prefill", rng.integers(1, 12, size=bsz), 0).astype(np.int32)
    base = rng.integers(1, k + 2, size=bsz).astype(np.int32)
    base[kind == "prefill"] = enc[kind == "prefill"]
    base[kind == "idle"] = 0
    slt = np.where((kind == "decode") | (kind == "prefill"), 1, 0).astype(np.int32)
    acc = np.minimum(rng.integers(1, k + 2, size=bsz), base).astype(np.int32)
    tokens = int(base.sum())
    input_ = random_floats(rng, (tokens, hidden), dtype)
    zeros = np.zeros(bsz, np.int32)
    return [input_, slt, enc, zeros.copy(), np.zeros((bsz, 1), bool), acc, base, zeros.copy()]


def check(backend, tensors, context):
    return check_row_gather(
        backend, OP, NAMES, tensors, ATTRS, outputs(tensors), reference(*tensors, *ATTRS), context
    )


def test_output_token_num_saturates_instead_of_wrapping(backend):
    """Two items of 2**31 - 1 output rows each: the total is summed in 64 bits and stored
    saturated at 2**31 - 1 (it wrapped to -2); only the rows that exist are written."""
    rng = np.random.default_rng(17)
    big = 2**31 - 1
    tensors = make_state(rng, 3, 5, "float32")
    tensors[1] = np.array([1, 1, 1], np.int32)  # slt
    tensors[2] = np.array([big, 0, big], np.int32)  # enc: items 0 and 2 prefill
    tensors[5] = np.array([1, big, 1], np.int32)  # accept_nums
    tensors[6] = np.array([2, 2, 2], np.int32)  # base rows
    tensors[0] = random_floats(rng, (6, 5), "float32")
    got = check(backend, tensors, "2**31 - 1 rows")
    assert got[-1][0] == big


def test_length_values_of_2_31_do_not_cost_time(backend):
    from tests.ops.child_process import run_in_child

    rng = np.random.default_rng(18)
    big = 2**31 - 1
    tensors = make_state(rng, 4, 3, "float32")
    tensors[2] = np.array([0, big, 0, big], np.int32)
    tensors[5] = np.full(4, big, np.int32)
    tensors[6] = np.full(4, big, np.int32)
    run_in_child(lambda: bool(check(backend, tensors, "2**31 - 1")), timeout=60)


SIZES = [(1, 7), (3, 64), (257, 7), (257, 64), (1500, 7), (3, 4096), (33, 4096)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("bsz,hidden", SIZES)
def test_random_states_match_reference(backend, bsz, hidden, dtype):
    check_random_state(backend, check, make_state, bsz, hidden, dtype, salt=7)


def _explicit(hidden=5, dtype="float32"):
    # item 0 decode: 4 target rows, 2 accepted; item 1 prefill: 3 rows; item 2 idle with 2
    # target rows (skipped); item 3 decode: 1 row, 1 accepted
    base = np.array([4, 3, 2, 1], np.int32)
    rng = np.random.default_rng(0)
    input_ = random_floats(rng, (int(base.sum()), hidden), dtype)
    slt = np.array([1, 1, 0, 1], np.int32)
    enc = np.array([0, 3, 0, 0], np.int32)
    acc = np.array([2, 3, 1, 1], np.int32)
    z = np.zeros(4, np.int32)
    return [input_, slt, enc, z.copy(), np.zeros((4, 1), bool), acc, base, z.copy()]


def test_decode_items_take_their_first_accept_num_rows(backend):
    """the FIRST accept_num target rows of a decode item, batch order, all
    prefill rows in place (GPU develop layout, not XPU's prefill-first order)."""
    tensors = _explicit()
    out, n = check(backend, tensors, "explicit")
    x = tensors[0]
    assert int(n[0]) == 2 + 3 + 1
    np.testing.assert_array_equal(out[:6], x[[0, 1, 4, 5, 6, 9]])


def test_prefill_counts_use_the_draft_encoder_length(backend):
    """Counting uses the draft's seq_lens_encoder; the target's is not read."""
    tensors = _explicit()
    tensors[7] = np.array([0, 0, 99, 99], np.int32)  # base_model_seq_lens_encoder: ignored
    out, n = check(backend, tensors, "target encoder ignored")
    assert int(n[0]) == 6


def test_rows_past_output_token_num_are_zero(backend):
    """Deviation 2: upstream leaves the tail of `out` uninitialised; ours is zero (the
    kernels backends pre-fill the output with a 0xA5 pattern)."""
    out, n = check(backend, _explicit(hidden=9), "tail")
    assert out.shape[0] == 10
    assert (out[int(n[0]) :] == 0).all()


def test_decode_item_without_target_rows_gets_zero_rows(backend):
    """Upstream edge: base slt == 0 with draft slt != 0 counts accept_num output rows but
    maps no input row (garbage upstream); ours writes zero rows."""
    tensors = _explicit()
    tensors[6] = np.array([4, 3, 2, 0], np.int32)  # item 3 has no target rows
    tensors[0] = tensors[0][:9]
    out, n = check(backend, tensors, "no target rows")
    assert int(n[0]) == 6
    assert (out[5] == 0).all()


def test_accept_num_beyond_target_rows_does_not_read_the_next_item(backend):
    tensors = _explicit()
    tensors[5] = np.array([6, 3, 1, 1], np.int32)  # item 0 accepts 6 of its 4 rows
    out, n = check(backend, tensors, "accept > rows")
    x = tensors[0]
    assert int(n[0]) == 6 + 3 + 1
    np.testing.assert_array_equal(out[:4], x[:4])
    assert (out[4:6] == 0).all()
    np.testing.assert_array_equal(out[6:9], x[4:7])


def test_empty_batch_and_empty_input(backend):
    z = np.zeros(0, np.int32)
    tensors = [np.zeros((0, 8), np.float32), z, z, z, np.zeros((0, 1), bool), z, z, z]
    out, n = check(backend, tensors, "bsz=0")
    assert int(n[0]) == 0


def _valid():
    return make_state(np.random.default_rng(3), 6, 8, "float32")


BAD_INPUTS = {
    "input_int32": (0, lambda t: t[0].astype(np.int32), "input"),
    "input_float64": (0, lambda t: t[0].astype(np.float64), "input"),
    "input_rank1": (0, lambda t: t[0].reshape(-1), "input"),
    "seq_lens_this_time_int64": (1, lambda t: t[1].astype(np.int64), "seq_lens_this_time"),
    "seq_lens_encoder_batch_5": (2, lambda t: t[2][:5], "seq_lens_encoder"),
    "accept_nums_float32": (5, lambda t: t[5].astype(np.float32), "accept_nums"),
    "base_slt_batch_1": (6, lambda t: np.zeros(1, np.int32), "base_model_seq_lens_this_time"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    index, build, name = BAD_INPUTS[case]
    tensors = _valid()
    tensors[index] = build(tensors)
    h = tensors[0].shape[-1]
    outs = [("out", (tensors[0].shape[0], h), np.float32), ("output_token_num", (1,), np.int32)]
    if tensors[0].ndim != 2 or tensors[0].dtype != np.float32:
        outs = [("out", (1, 1), np.float32), ("output_token_num", (1,), np.int32)]
    if backend.name == "cpu":
        assert_rejected(backend, OP, NAMES, tensors, name, ATTRS)
    else:
        assert_rejected(backend, OP, NAMES, tensors, name, ATTRS, outs)


def test_framework_free_module_rejects_a_wrong_output_buffer():
    from fastdeploy_mtp import _kernels

    t = _valid()
    with pytest.raises(ValueError, match="`out` must have shape"):
        _kernels.eagle_get_hidden_states(
            *t, 3, out=np.zeros((1, 8), np.float32), output_token_num=np.zeros(1, np.int32)
        )
    with pytest.raises(ValueError, match="`out` must be float32, got float16"):
        _kernels.eagle_get_hidden_states(
            *t, 3, out=np.zeros(t[0].shape, np.float16), output_token_num=np.zeros(1, np.int32)
        )


def test_paddle_op_takes_keyword_arguments_in_the_registered_order():
    paddle = pytest.importorskip("paddle")
    import fastdeploy_mtp.ops as ops

    t = _explicit()
    p = {n: paddle.to_tensor(a) for n, a in zip(NAMES, t)}
    out, n = ops.eagle_get_hidden_states(
        **dict(reversed(list(p.items()))), actual_draft_token_num=1
    )
    want_out, want_n = reference(*t)
    np.testing.assert_array_equal(out.numpy(), want_out)
    np.testing.assert_array_equal(n.numpy(), want_n)
