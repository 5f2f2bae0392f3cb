"""speculate_get_token_penalty_multi_scores on every backend against tests/reference/
(docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ops.hidden_utils import FLOAT_DTYPES, random_floats
from tests.reference.speculate_get_token_penalty_multi_scores import (
    NAMES,
    ban_value,
    from_f32,
    speculate_get_token_penalty_multi_scores as reference,
    to_f32,
)
from tests.support.compare import assert_bit_exact, assert_rejected

OP = "speculate_get_token_penalty_multi_scores"
I = {name: i for i, name in enumerate(NAMES)}  # noqa: E741 - index by name


def scores(values, dtype: str) -> np.ndarray:
    """[n, 1] score tensor of the logits' dtype (bfloat16 as uint16 bits)."""
    return from_f32(np.asarray(values, np.float32).reshape(-1, 1), dtype)


def make_state(rng, bsz, vocab, dtype, k=3, hist=12, prompt=4, with_step=True, pad_rows=2):
    """A consistent batch: item b has 1..k+1 logits rows starting at cu_seqlens_q_output[b],
    then `pad_rows` padding rows (batch id -1). Small vocabularies so ids repeat."""
    width = prompt + hist + 2
    slt = rng.integers(1, k + 2, size=bsz).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(slt)[:-1]]).astype(np.int32)
    rows = int(slt.sum()) + pad_rows
    batch_id = np.full(rows, -1, np.int32)
    for b in range(bsz):
        batch_id[cu[b] : cu[b] + slt[b]] = b
    tokens = np.full((bsz, width), -1, np.int64)
    prompt_lens = rng.integers(0, prompt + 1, size=bsz).astype(np.int64)
    generated = rng.integers(0, hist + 1, size=bsz)
    for b in range(bsz):
        n = int(prompt_lens[b] + generated[b])
        tokens[b, :n] = rng.integers(0, vocab, size=n)
    step = rng.integers(0, vocab, size=(bsz, k + 1)).astype(np.int64)
    step[rng.random((bsz, k + 1)) < 0.1] = -1  # placeholders
    temps = rng.uniform(0.3, 2.0, size=bsz).astype(np.float32)
    temps[rng.random(bsz) < 0.2] = 0.0  # greedy items
    nbad = 3
    return [
        tokens,
        prompt_lens,
        random_floats(rng, (rows, vocab), dtype),
        scores(rng.uniform(0.5, 2.0, bsz), dtype),
        scores(rng.uniform(0.0, 1.0, bsz), dtype),
        scores(rng.uniform(0.0, 1.0, bsz), dtype),
        temps.reshape(-1, 1),
        rng.integers(0, vocab, size=(bsz, nbad)).astype(np.int64),
        rng.integers(0, nbad + 1, size=bsz).astype(np.int64),
        rng.integers(0, hist + 1, size=bsz).astype(np.int64),
        rng.integers(0, hist + 2, size=bsz).astype(np.int64),
        np.array([vocab - 1, 0], np.int64),
        slt,
        batch_id,
        cu,
        step if with_step else None,
    ]


def run(backend, tensors, context=""):
    got = backend.run(OP, tensors, [0])
    want = reference(*tensors)["logits"]
    assert_bit_exact("logits", got[I["logits"]], want, f"{backend.name}, {context}")
    for name, g, t in zip(NAMES, got, tensors):
        if name != "logits" and t is not None:
            np.testing.assert_array_equal(g, t, err_msg=f"{name} changed ({context})")
    return got[I["logits"]]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("with_step", [True, False])
@pytest.mark.parametrize("bsz,vocab", [(1, 8), (5, 16), (37, 40)])
def test_random_states_match_reference(backend, bsz, vocab, dtype, with_step):
    rng = np.random.default_rng(bsz * 31 + vocab)
    run(
        backend,
        make_state(rng, bsz, vocab, dtype, with_step=with_step),
        f"N={bsz} V={vocab} {dtype} {with_step}",
    )


def single_row_call(tensors, b, j):
    """The non-speculative call for row j of item b: one item, one row, history = the
    committed tokens followed by the drafts d1..dj that count, cur_len + j."""
    tokens, prompt_lens, logits, alpha, beta, gamma, temps = tensors[:7]
    bad, bad_len, cur_len, min_len, eos, _, _, cu, step = tensors[7:]
    p = int(prompt_lens[b])
    committed = tokens[b][: p + int(np.argmax(np.append(tokens[b][p:], -1) < 0))]
    drafts = step[b, 1 : 1 + min(j, step.shape[1] - 1)]
    history = np.concatenate([committed, drafts[drafts >= 0]])
    row = np.full((1, tokens.shape[1] + step.shape[1]), -1, np.int64)
    row[0, : len(history)] = history
    return [
        row,
        prompt_lens[b : b + 1],
        logits[int(cu[b]) + j : int(cu[b]) + j + 1].copy(),
        alpha[b : b + 1],
        beta[b : b + 1],
        gamma[b : b + 1],
        temps[b : b + 1],
        bad[b : b + 1],
        bad_len[b : b + 1],
        cur_len[b : b + 1] + j,
        min_len[b : b + 1],
        eos,
        np.ones(1, np.int32),
        np.zeros(1, np.int32),
        np.zeros(1, np.int32),
        None,
    ]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_speculative_rows_equal_non_speculative_single_rows(backend, dtype):
    """Exactness: with step_input_ids, row j of an item is bit for bit the row a
    non-speculative call gives for the history committed + d1..dj at cur_len + j."""
    rng = np.random.default_rng(11)
    for trial in range(3):
        tensors = make_state(rng, 6, 12, dtype, k=4, pad_rows=0)
        spec = backend.run(OP, tensors, [0])[I["logits"]]
        for b in range(6):
            for j in range(int(tensors[I["seq_lens_this_time"]][b])):
                single = backend.run(OP, single_row_call(tensors, b, j), [0])[I["logits"]]
                r = int(tensors[I["cu_seqlens_q_output"]][b]) + j
                assert_bit_exact(
                    "logits", spec[r : r + 1], single, f"{backend.name}, trial {trial} b={b} j={j}"
                )


def test_without_step_input_ids_every_row_counts_the_committed_history_only(backend):
    """Upstream's call form: every row of the item is penalised as row 0 (inexact under
    speculation: the drafts before row j are not counted)."""
    tensors = make_state(np.random.default_rng(3), 1, 10, "float32", pad_rows=0)
    tensors[I["seq_lens_this_time"]] = np.array([3], np.int32)
    tensors[I["batch_id_per_token_output"]] = np.zeros(3, np.int32)
    tensors[I["logits"]] = np.tile(np.linspace(-2, 2, 10, dtype=np.float32), (3, 1))
    tensors[I["min_len"]] = np.zeros(1, np.int64)
    tensors[I["bad_tokens_len"]] = np.zeros(1, np.int64)
    tensors[I["step_input_ids"]] = np.array([[1, 9, 9, 9, 9]], np.int64)
    with_step = run(backend, tensors, "with step")
    assert with_step[0, 9] != with_step[1, 9] != with_step[2, 9]  # 9 counted 0, 1, 2 more times
    tensors[I["step_input_ids"]] = None
    without = run(backend, tensors, "without step")
    np.testing.assert_array_equal(without[1], without[0])
    np.testing.assert_array_equal(without[2], without[0])
    np.testing.assert_array_equal(without[0], with_step[0])


def explicit_state(dtype="float32", vocab=8):
    """One item, rows j = 0, 1, 2; history after a 2-token prompt = [5, 5, 7]; drafts [9?]."""
    return [
        np.array([[1, 2, 5, 5, 7, -1, -1]], np.int64),
        np.array([2], np.int64),
        np.tile(np.arange(1, vocab + 1, dtype=np.float32), (3, 1)).astype(np.float32),
        scores([2.0], dtype),
        scores([0.5], dtype),
        scores([0.25], dtype),
        np.ones((1, 1), np.float32),
        np.array([[3]], np.int64),
        np.array([0], np.int64),
        np.array([3], np.int64),
        np.array([0], np.int64),
        np.array([2], np.int64),
        np.array([3], np.int32),
        np.array([0, 0, 0], np.int32),
        np.array([0], np.int32),
        np.array([[7, 6, 5]], np.int64),
    ]


def test_penalties_follow_the_formula_with_drafts(backend):
    got = run(backend, explicit_state(), "explicit")
    # id 5 (logit 6): count 2 in rows 0, 1; 3 in row 2 (draft d2 = 5): 6 / 2 - (c * 0.5 + 0.25)
    np.testing.assert_array_equal(got[:, 5], np.float32([1.75, 1.75, 1.25]))
    # id 7 (logit 8): count 1: 8 / 2 - 0.75
    np.testing.assert_array_equal(got[:, 7], np.float32([3.25, 3.25, 3.25]))
    # id 6 (logit 7): draft d1, counted from row 1 on
    np.testing.assert_array_equal(got[:, 6], np.float32([7.0, 2.75, 2.75]))
    np.testing.assert_array_equal(got[:, 0], np.float32([1, 1, 1]))  # not in the history


def test_negative_logit_is_multiplied_by_alpha(backend):
    tensors = explicit_state()
    tensors[I["logits"]][:, 7] = -4.0
    got = run(backend, tensors, "negative")
    np.testing.assert_array_equal(got[:, 7], np.float32([-8.75, -8.75, -8.75]))


def test_min_length_bans_eos_below_min_len_only(backend):
    """cur_len 3, rows j = 0, 1, 2, min_len 5: rows 0 and 1 ban EOS (3 + j < 5), row 2 not."""
    tensors = explicit_state()
    tensors[I["min_len"]] = np.array([5], np.int64)
    tensors[I["eos_token_id"]] = np.array([2, 4, 99, -1], np.int64)  # 99, -1: outside V
    got = run(backend, tensors, "min length")
    np.testing.assert_array_equal(got[:, 2], np.float32([-1e10, -1e10, 3]))
    np.testing.assert_array_equal(got[:, 4], np.float32([-1e10, -1e10, 5]))
    tensors[I["cur_len"]] = np.array([-1], np.int64)  # no min length, no penalties
    got = run(backend, tensors, "cur_len < 0")
    np.testing.assert_array_equal(got, explicit_state()[I["logits"]])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_bad_words_are_banned_after_temperature(backend, dtype):
    tensors = explicit_state(dtype)
    tensors[I["logits"]] = from_f32(tensors[I["logits"]], dtype)
    tensors[I["temperatures"]] = np.full((1, 1), 0.5, np.float32)
    tensors[I["bad_tokens"]] = np.array([[3, 0, 100, -2]], np.int64)
    tensors[I["bad_tokens_len"]] = np.array([4], np.int64)
    got = to_f32(run(backend, tensors, "bad words"), dtype)
    ban = to_f32(from_f32(ban_value(dtype), dtype), dtype)
    np.testing.assert_array_equal(got[:, 3], [ban] * 3)
    np.testing.assert_array_equal(got[:, 0], [ban] * 3)
    np.testing.assert_array_equal(got[:, 1], np.float32([4, 4, 4]))  # 2 / 0.5: scaled
    if dtype == "float16":
        assert ban == np.float32(-1e4)


def test_padding_rows_are_untouched(backend):
    tensors = make_state(np.random.default_rng(5), 4, 16, "float32", pad_rows=3)
    tensors[I["temperatures"]][:] = 0.7
    bid = tensors[I["batch_id_per_token_output"]]
    bid[-2] = 4  # == N: outside the batch
    bid[-1] = -7
    got = run(backend, tensors, "padding")
    np.testing.assert_array_equal(got[-3:], tensors[I["logits"]][-3:])


def test_greedy_rows_are_not_scaled(backend):
    tensors = make_state(np.random.default_rng(6), 5, 16, "float32", with_step=False, pad_rows=0)
    tensors[I["temperatures"]] = np.array([[0.0], [-1.0], [np.nan], [np.inf], [2.0]], np.float32)
    tensors[I["cur_len"]] = np.full(5, -1, np.int64)  # nothing counted, no min length
    tensors[I["bad_tokens_len"]] = np.zeros(5, np.int64)
    got = run(backend, tensors, "greedy")
    bid = tensors[I["batch_id_per_token_output"]]
    orig = tensors[I["logits"]]
    np.testing.assert_array_equal(got[bid < 4], orig[bid < 4])
    np.testing.assert_array_equal(got[bid == 4], orig[bid == 4] / np.float32(2))


def test_alpha_not_positive_reads_as_one(backend):
    tensors = explicit_state()
    tensors[I["penalty_scores"]] = scores([0.0], "float32")
    got = run(backend, tensors, "alpha 0")
    np.testing.assert_array_equal(got[:, 7], np.float32([7.25, 7.25, 7.25]))  # 8 - 0.75


def test_hostile_values_are_clamped_the_same_on_every_backend(backend):
    rng = np.random.default_rng(7)
    tensors = make_state(rng, 6, 16, "float32")
    big = np.iinfo(np.int64).max
    tensors[I["prompt_lens"]] = np.array([-5, big, 3, -big - 1, 0, 2], np.int64)
    tensors[I["bad_tokens_len"]] = np.array([-3, big, 2, 1, -big - 1, 3], np.int64)
    tensors[I["bad_tokens"]][0, 0] = 16  # == V
    tensors[I["bad_tokens"]][1, 1] = -5
    tensors[I["eos_token_id"]] = np.array([-1, 16, big, 3], np.int64)
    tensors[I["cur_len"]] = np.array([big, 0, -big - 1, 2, big - 1, 1], np.int64)
    tensors[I["min_len"]] = np.array([big, -big - 1, big, 5, big, 0], np.int64)
    tensors[I["token_ids_all"]][2, 5] = 16  # past V: skipped, does not end the scan
    tensors[I["token_ids_all"]][3, 6] = big
    tensors[I["step_input_ids"]][4, 1] = 1000
    tensors[I["cu_seqlens_q_output"]][5] = np.iinfo(np.int32).max  # j < 0: read as 0
    tensors[I["cu_seqlens_q_output"]][1] = np.iinfo(np.int32).min
    run(backend, tensors, "hostile")


def test_history_scan_stops_at_the_end_of_the_row(backend):
    """No -1 ends item 0's generated ids: the scan stops at the row's end, item 1's ids
    (which follow in memory) are not counted."""
    tensors = explicit_state()
    tensors[I["token_ids_all"]] = np.array([[1, 2, 5, 5, 7], [0, 0, 0, 0, 0]], np.int64)
    got = run(backend, tensors, "full row")
    np.testing.assert_array_equal(got[:, 0], np.float32([1, 1, 1]))


def test_huge_length_values_cost_no_more_than_the_buffers(backend):
    from tests.ops.child_process import run_in_child

    tensors = make_state(np.random.default_rng(8), 4, 8, "float16")
    top = 2**31 - 1
    for name in ("prompt_lens", "bad_tokens_len", "cur_len", "min_len"):
        tensors[I[name]] = np.full(4, top, np.int64)
    tensors[I["cu_seqlens_q_output"]] = np.full(4, -top, np.int32)  # j = r + 2**31 - 1
    run_in_child(lambda: bool(run(backend, tensors, "2**31 - 1 values") is not None), timeout=60)


def test_per_item_arrays_may_have_more_rows_than_the_batch(backend):
    tensors = make_state(np.random.default_rng(9), 3, 16, "bfloat16")
    padded = [np.concatenate([t, t[:2]]) if t is not None and i not in (2, 11, 12, 13) else t
              for i, t in enumerate(tensors)]  # fmt: skip
    want = reference(*tensors)["logits"]
    got = backend.run(OP, padded, [0])[I["logits"]]
    assert_bit_exact("logits", got, want, backend.name)


BAD_INPUTS = {
    "logits_int32": (I["logits"], lambda t: t[2].astype(np.int32), "logits"),
    "logits_rank_1": (I["logits"], lambda t: t[2].reshape(-1), "logits"),
    "penalty_scores_float16": (
        I["penalty_scores"],
        lambda t: t[3].astype(np.float16),
        "penalty_scores",
    ),
    "temperatures_float16": (I["temperatures"], lambda t: t[6].astype(np.float16), "temperatures"),
    "token_ids_all_int32": (I["token_ids_all"], lambda t: t[0].astype(np.int32), "token_ids_all"),
    "token_ids_all_rows": (I["token_ids_all"], lambda t: t[0][:2], "token_ids_all"),
    "bad_tokens_rows": (I["bad_tokens"], lambda t: t[7][:1], "bad_tokens"),
    "cur_len_batch": (I["cur_len"], lambda t: t[9][:2], "cur_len"),
    "batch_id_short": (
        I["batch_id_per_token_output"],
        lambda t: t[13][:-1],
        "batch_id_per_token_output",
    ),
    "cu_seqlens_short": (I["cu_seqlens_q_output"], lambda t: t[14][:2], "cu_seqlens_q_output"),
    "step_input_ids_rows": (I["step_input_ids"], lambda t: t[15][:1], "step_input_ids"),
    "step_input_ids_int32": (
        I["step_input_ids"],
        lambda t: t[15].astype(np.int32),
        "step_input_ids",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    index, build, name = BAD_INPUTS[case]
    tensors = make_state(np.random.default_rng(10), 3, 8, "float32")
    tensors[index] = np.ascontiguousarray(build(tensors))
    assert_rejected(backend, OP, NAMES, tensors, name, attrs=[0])


def test_paddle_upstream_positional_call():
    """FastDeploy's call form: the 15 tensors, then max_seq_len, positionally; our
    step_input_ids may follow the attr."""
    paddle = pytest.importorskip("paddle")
    import fastdeploy_mtp.ops as ops

    tensors = make_state(np.random.default_rng(12), 3, 8, "float32")
    pts = [paddle.to_tensor(t) for t in tensors[:-1]]
    ptr = pts[2].data_ptr()
    ops.speculate_get_token_penalty_multi_scores(*pts, 2048)
    assert pts[2].data_ptr() == ptr, "logits reallocated"
    want = reference(*tensors[:-1], None)["logits"]
    np.testing.assert_array_equal(pts[2].numpy(), want)
    pts = [paddle.to_tensor(t) for t in tensors[:-1]]
    ops.speculate_get_token_penalty_multi_scores(*pts, 2048, paddle.to_tensor(tensors[-1]))
    np.testing.assert_array_equal(pts[2].numpy(), reference(*tensors)["logits"])
