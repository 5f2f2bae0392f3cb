"""speculate_get_logits on every backend against tests/reference/ (docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ops.hidden_utils import FLOAT_DTYPES, check_random_state, random_floats
from tests.reference.speculate_get_logits import speculate_get_logits as reference
from tests.support.compare import assert_bit_exact, assert_exact, assert_rejected

OP = "speculate_get_logits"
NAMES = (
    "draft_logits",
    "next_token_num",
    "batch_token_num",
    "cu_next_token_offset",
    "cu_batch_token_offset",
    "logits",
    "first_token_logits",
    "seq_lens_this_time",
    "seq_lens_encoder",
)
FLOATS = {"draft_logits", "logits", "first_token_logits"}
SENTINEL = -999


def make_state(rng, bsz, vocab, dtype, k=3, p_prefill=0.25):
    enc = np.where(rng.random(bsz) < p_prefill, rng.integers(1, 50, size=bsz), 0).astype(np.int32)
    slt = rng.integers(0, k + 2, size=bsz).astype(np.int32)
    slt[enc > 0] = enc[enc > 0]
    n_next = int(np.where(enc > 0, 1, slt).sum())
    draft = random_floats(rng, (bsz * (k + 1), vocab), dtype)  # rows it does not write keep these
    cu_next = np.full(bsz + 1, SENTINEL, np.int32)
    cu_batch = np.full(bsz + 1, SENTINEL, np.int32)
    cu_next[0] = cu_batch[0] = 0
    return [
        draft,
        np.full(bsz, SENTINEL, np.int32),
        np.full(bsz, SENTINEL, np.int32),
        cu_next,
        cu_batch,
        random_floats(rng, (n_next, vocab), dtype),
        random_floats(rng, (bsz, vocab), dtype),
        slt,
        enc,
    ]


def check(backend, tensors, context):
    want = reference(*tensors)
    got = backend.run(OP, tensors)
    for name, g in zip(NAMES, got):
        if name in FLOATS:
            assert_bit_exact(name, g, want[name], f"{backend.name}, {context}")
        else:
            assert_exact(name, g, want[name], f"{backend.name}, {context}")
    return dict(zip(NAMES, got))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("bsz,vocab", [(1, 7), (3, 64), (257, 33), (1500, 5), (4, 4096)])
def test_random_states_match_reference(backend, bsz, vocab, dtype):
    check_random_state(backend, check, make_state, bsz, vocab, dtype, salt=17)


def test_offsets_are_inclusive_and_slot_zero_is_never_written(backend):
    """cu_*[1..bsz] are inclusive sums (GPU convention, not XPU's exclusive
    [0..bsz-1]); [0] is never written and is taken as 0."""
    rng = np.random.default_rng(2)
    tensors = make_state(rng, 4, 8, "float32", p_prefill=0.0)
    tensors[7] = np.array([2, 0, 3, 1], np.int32)
    tensors[5] = random_floats(rng, (6, 8), "float32")
    tensors[3][0] = tensors[4][0] = 41  # not 0: must be left alone, and still read as 0
    got = check(backend, tensors, "inclusive")
    np.testing.assert_array_equal(got["cu_batch_token_offset"], [41, 2, 2, 5, 6])
    np.testing.assert_array_equal(got["cu_next_token_offset"], [41, 2, 2, 5, 6])
    np.testing.assert_array_equal(got["draft_logits"][:6], tensors[5])


def test_prefill_item_takes_two_rows_first_token_then_logits(backend):
    """A prefill item writes first_token_logits[b], then its logits row."""
    rng = np.random.default_rng(3)
    tensors = make_state(rng, 3, 5, "bfloat16", p_prefill=0.0)
    tensors[7] = np.array([2, 9, 1], np.int32)
    tensors[8] = np.array([0, 9, 0], np.int32)  # item 1 prefill
    tensors[5] = random_floats(rng, (2 + 1 + 1, 5), "bfloat16")
    got = check(backend, tensors, "prefill")
    np.testing.assert_array_equal(got["batch_token_num"], [2, 2, 1])
    np.testing.assert_array_equal(got["next_token_num"], [2, 1, 1])
    d, lg, first = got["draft_logits"], tensors[5], tensors[6]
    np.testing.assert_array_equal(d[2], first[1])
    np.testing.assert_array_equal(d[3], lg[2])
    np.testing.assert_array_equal(d[4], lg[3])
    np.testing.assert_array_equal(d[5:], tensors[0][5:])  # rows past the items keep their values


def test_rows_past_the_tensors_are_skipped_not_overrun(backend):
    rng = np.random.default_rng(4)
    tensors = make_state(rng, 3, 6, "float32", p_prefill=0.0)
    tensors[7] = np.array([4, 4, 4], np.int32)
    tensors[0] = random_floats(rng, (10, 6), "float32")  # 12 rows wanted, 10 exist
    tensors[5] = random_floats(rng, (7, 6), "float32")  # 12 rows read, 7 exist
    check(backend, tensors, "short tensors")


def test_offsets_saturate_at_the_buffers_and_counts_are_what_was_written(backend):
    """Rows wanted past the end of `logits` / `draft_logits` are not counted: the inclusive
    offsets stop at the buffers' rows, each count is the difference of its offsets."""
    rng = np.random.default_rng(14)
    tensors = make_state(rng, 4, 6, "float32", p_prefill=0.0)
    tensors[7] = np.array([4, 4, 0, 4], np.int32)
    tensors[8] = np.array([0, 0, 3, 0], np.int32)  # item 2 prefill: 1 + 2 rows wanted
    tensors[0] = random_floats(rng, (10, 6), "float32")  # 14 rows wanted, 10 exist
    tensors[5] = random_floats(rng, (7, 6), "float32")  # 13 rows wanted, 7 exist
    got = check(backend, tensors, "saturated offsets")
    np.testing.assert_array_equal(got["cu_batch_token_offset"][1:], [4, 8, 10, 10])
    np.testing.assert_array_equal(got["batch_token_num"], [4, 4, 2, 0])
    np.testing.assert_array_equal(got["cu_next_token_offset"][1:], [4, 7, 7, 7])
    np.testing.assert_array_equal(got["next_token_num"], [4, 3, 0, 0])


def test_int32_length_sums_do_not_wrap_into_a_negative_row(backend):
    """seq_lens_this_time [2**31-1, 2**31-1, 1] with item 2 in prefill: int32 running offsets
    wrapped to -2 and wrote first_token_logits[2] at draft_logits[-2]. Offsets are 64-bit and
    saturate at the buffers: item 2 gets no rows, nothing outside a tensor is touched."""
    rng = np.random.default_rng(15)
    tensors = make_state(rng, 3, 5, "float32", p_prefill=0.0)
    tensors[7] = np.array([2**31 - 1, 2**31 - 1, 1], np.int32)
    tensors[8] = np.array([0, 0, 1], np.int32)
    tensors[0] = random_floats(rng, (6, 5), "float32")
    tensors[5] = random_floats(rng, (4, 5), "float32")
    got = check(backend, tensors, "2**31 - 1 lengths")
    np.testing.assert_array_equal(got["cu_batch_token_offset"][1:], [6, 6, 6])
    np.testing.assert_array_equal(got["batch_token_num"], [6, 0, 0])
    np.testing.assert_array_equal(got["draft_logits"][:4], tensors[5])
    np.testing.assert_array_equal(got["draft_logits"][4:], tensors[0][4:])  # no source: kept


def test_length_values_of_2_31_do_not_cost_time(backend):
    from tests.ops.child_process import run_in_child

    rng = np.random.default_rng(16)
    tensors = make_state(rng, 4, 3, "float16", p_prefill=0.0)
    tensors[7] = np.full(4, 2**31 - 1, np.int32)
    run_in_child(lambda: bool(check(backend, tensors, "2**31 - 1 lengths")), timeout=60)


def test_batch_beyond_one_block(backend):
    check(backend, make_state(np.random.default_rng(6), 3000, 3, "float16"), "bsz=3000")


BAD_INPUTS = {
    "draft_logits_int32": (0, lambda t: t[0].astype(np.int32), "draft_logits"),
    "logits_float16": (5, lambda t: t[5].astype(np.float16), "logits"),
    "logits_vocab_mismatch": (5, lambda t: t[5][:, :3], "logits"),
    "first_token_logits_batch_2": (6, lambda t: t[6][:2], "first_token_logits"),
    "cu_batch_token_offset_len_n": (4, lambda t: t[4][:-1], "cu_batch_token_offset"),
    "next_token_num_int64": (1, lambda t: t[1].astype(np.int64), "next_token_num"),
    "seq_lens_encoder_batch_1": (8, lambda t: np.zeros(1, np.int32), "seq_lens_encoder"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    index, build, name = BAD_INPUTS[case]
    tensors = make_state(np.random.default_rng(5), 4, 8, "float32")
    tensors[index] = np.ascontiguousarray(build(tensors))
    assert_rejected(backend, OP, NAMES, tensors, name)


def test_undeclared_upstream_writes_are_declared_outputs():
    """Deviation 4: next_token_num and cu_next_token_offset, which upstream writes without
    declaring, are in-place outputs (after FastDeploy's three) and are written in place."""
    paddle = pytest.importorskip("paddle")
    import fastdeploy_mtp.ops as ops
    from fastdeploy_mtp.ops._loader import paddle_op

    tensors = make_state(np.random.default_rng(7), 3, 4, "float32")
    pts = [paddle.to_tensor(t) for t in tensors]
    ptrs = [p.data_ptr() for p in pts]
    ops.speculate_get_logits(*pts)
    want = reference(*tensors)
    for name, p, ptr in zip(NAMES, pts, ptrs):
        assert p.data_ptr() == ptr, f"{name} reallocated"
        np.testing.assert_array_equal(p.numpy(), want[name], err_msg=name)
    outs = paddle_op("speculate_get_logits")(*[paddle.to_tensor(t) for t in tensors])
    assert len(outs) == 5


def test_no_allocation_in_the_framework_free_call():
    """Deviation 7 (CPU side): every buffer is the caller's; the call returns nothing."""
    from fastdeploy_mtp import _kernels

    tensors = make_state(np.random.default_rng(8), 3, 4, "float32")
    assert _kernels.speculate_get_logits(*tensors) is None
