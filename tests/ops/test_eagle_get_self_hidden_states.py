"""eagle_get_self_hidden_states on every backend against tests/reference/ (docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ops.hidden_utils import FLOAT_DTYPES, check_random_state, check_row_gather, random_floats
from tests.reference.hidden_states import eagle_get_self_hidden_states as reference
from tests.support.compare import assert_rejected

OP = "eagle_get_self_hidden_states"
NAMES = ("input", "last_seq_lens_this_time", "seq_lens_this_time", "seq_lens_encoder")


def outputs(tensors):
    return [("out", tensors[0].shape, tensors[0].dtype), ("output_token_num", (1,), np.int32)]


def rows_of(last, slt, enc):
    return int(sum((min(n, 1) if e > 0 else n) for n, e in zip(last, enc)))


def make_state(rng, bsz, hidden, dtype, k=3):
    last = rng.integers(0, k + 2, size=bsz).astype(np.int32)
    enc = np.where(rng.random(bsz) < 0.2, rng.integers(1, 30, size=bsz), 0).astype(np.int32)
    slt = np.where((rng.random(bsz) < 0.7) & (last > 0), 1, 0).astype(np.int32)
    input_ = random_floats(rng, (rows_of(last, slt, enc), hidden), dtype)
    return [input_, last, slt, enc]


def check(backend, tensors, context):
    return check_row_gather(
        backend, OP, NAMES, tensors, (), outputs(tensors), reference(*tensors), context
    )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("bsz,hidden", [(1, 7), (3, 64), (257, 7), (1500, 64), (33, 4096)])
def test_random_states_match_reference(backend, bsz, hidden, dtype):
    check_random_state(backend, check, make_state, bsz, hidden, dtype, salt=11)


def test_keeps_the_last_row_of_each_active_item(backend):
    last = np.array([3, 2, 4, 1], np.int32)
    slt = np.array([1, 0, 1, 1], np.int32)
    enc = np.array([0, 0, 0, 7], np.int32)  # item 3: just prefilled, one row
    x = random_floats(np.random.default_rng(1), (3 + 2 + 4 + 1, 6), "float32")
    out, n = check(backend, [x, last, slt, enc], "explicit")
    assert int(n[0]) == 3
    np.testing.assert_array_equal(out[:3], x[[2, 8, 9]])
    assert (out[3:] == 0).all()


def test_prefill_item_with_nothing_left_occupies_one_row(backend):
    last = np.array([5, 2], np.int32)
    slt = np.array([0, 1], np.int32)
    enc = np.array([4, 0], np.int32)  # item 0: prefill, stopped: occupies min(last, 1) row
    x = random_floats(np.random.default_rng(2), (1 + 2, 4), "bfloat16")
    out, n = check(backend, [x, last, slt, enc], "prefill stopped")
    np.testing.assert_array_equal(out[0], x[2])


def test_active_item_without_rows_gets_a_zero_row(backend):
    x = random_floats(np.random.default_rng(3), (2, 4), "float16")
    out, n = check(
        backend,
        [x, np.array([0, 2], np.int32), np.array([1, 1], np.int32), np.zeros(2, np.int32)],
        "last=0",
    )
    assert int(n[0]) == 2
    assert (out[0].view(np.uint16) == 0).all()
    np.testing.assert_array_equal(out[1], x[1])


BAD_INPUTS = {
    "input_int64": (0, lambda t: t[0].astype(np.int64), "input"),
    "last_seq_lens_this_time_batch_2": (1, lambda t: t[1][:2], "last_seq_lens_this_time"),
    "seq_lens_encoder_bool": (3, lambda t: t[3].astype(bool), "seq_lens_encoder"),
}


def test_length_values_of_2_31_do_not_cost_time(backend):
    from tests.ops.child_process import run_in_child

    tensors = make_state(np.random.default_rng(19), 4, 3, "float32")
    for i in [1, 2]:
        tensors[i] = np.full(tensors[i].shape, 2**31 - 1, np.int32)
    run_in_child(lambda: bool(check(backend, tensors, "2**31 - 1")), timeout=60)


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    index, build, name = BAD_INPUTS[case]
    tensors = make_state(np.random.default_rng(4), 4, 8, "float32")
    tensors[index] = build(tensors)
    outs = [
        ("out", (max(tensors[0].shape[0], 1), 8), np.float32),
        ("output_token_num", (1,), np.int32),
    ]
    assert_rejected(backend, OP, NAMES, tensors, name, (), () if backend.name == "cpu" else outs)
