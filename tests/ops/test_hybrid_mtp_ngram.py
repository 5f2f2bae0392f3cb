"""hybrid_mtp_ngram on every backend against tests/reference/ngram.py (docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ops.ngram_cases import (
    HYBRID_NAMES as NAMES,
    assert_same_without_worker_threads,
    assert_wrapper_reads_threshold,
    hybrid_state,
)
from tests.reference.ngram import hybrid_mtp_ngram as reference
from tests.support.compare import assert_bad_input_rejected, exact_check

OP = "hybrid_mtp_ngram"
check = exact_check(OP, NAMES, reference)


def one_item(prompt, history, step, *, slt=1, k=4, max_dec=1000, dec=1, width=None):
    """A single-item state; history is padded by one slot past step."""
    prompt = np.asarray(prompt, np.int64)
    pre = np.zeros(max(len(history), step + 1) + 1, np.int64)
    pre[: len(history)] = history
    draft = np.full((1, width or k + 1), -1, np.int64)
    draft[0, :slt] = 100 + np.arange(slt)
    return [
        prompt.reshape(1, -1),
        np.array([len(prompt)], np.int64),
        pre.reshape(1, -1),
        np.array([step], np.int64),
        np.array([k], np.int32),
        draft,
        np.array([slt], np.int32),
        np.array([dec], np.int32),
        np.array([max_dec], np.int64),
    ]


# (id, prompt, history, step, attrs (max_n, min_n, K), expected appended tokens)
FIXED = [
    ("prompt_match", [1, 2, 3, 4, 5, 6], [9, 9, 2, 3], 3, (3, 2, 4), [4, 5, 6]),
    ("longest_n_wins_over_earlier_shorter", [2, 3, 7, 1, 2, 3, 8], [0, 1, 2, 3], 3, (3, 2, 4), [8]),
    ("leftmost_of_equal_length", [5, 6, 1, 5, 6, 2], [0, 5, 6], 2, (2, 2, 4), [1, 5, 6, 2]),
    (
        "match_at_prompt_end_yields_nothing_then_history",
        [7, 5, 6],
        [5, 6, 4, 5, 6],
        4,
        (2, 2, 4),
        [4, 5],
    ),
    (
        "history_longer_n_beats_prompt_shorter",
        [5, 6, 9],
        [1, 5, 6, 3, 1, 5, 6],
        6,
        (3, 2, 4),
        [3, 1, 5],
    ),
    ("clamped_at_prompt_end", [1, 2, 3, 4], [0, 2, 3], 2, (2, 2, 4), [4]),
    ("no_match", [1, 2, 3, 4], [7, 8, 9], 2, (3, 2, 4), []),
    ("min_n_respected", [1, 2, 3, 4], [7, 8, 3], 2, (3, 2, 4), []),
]


@pytest.mark.parametrize("case", FIXED, ids=[c[0] for c in FIXED])
def test_fixed_vectors(backend, case):
    _, prompt, history, step, attrs, appended = case
    tensors = one_item(prompt, history, step, k=attrs[2])
    got = check(backend, tensors, (*attrs, 1024, 0), case[0])
    row, slt = got["draft_tokens"][0], got["seq_lens_this_time"][0]
    assert slt == 1 + len(appended)
    np.testing.assert_array_equal(row[1 : 1 + len(appended)], appended)
    assert (row[1 + len(appended) :] == -1).all()


@pytest.mark.parametrize("vocab", [2, 3, 7, 50])
@pytest.mark.parametrize("bsz", [1, 5, 64])
def test_random_states_match_reference(backend, vocab, bsz):
    rng = np.random.default_rng(100 * vocab + bsz)
    for k, max_n, min_n in ((4, 5, 2), (8, 3, 1), (2, 8, 3)):
        tensors = hybrid_state(rng, bsz, vocab=vocab, prompt_max=300, hist_max=200, k=k)
        check(backend, tensors, (max_n, min_n, k, 1024, 0), f"vocab={vocab} bsz={bsz} k={k}")


@pytest.mark.parametrize("vocab", [2, 50])
def test_long_contexts_32k(backend, vocab):
    rng = np.random.default_rng(vocab)
    tensors = hybrid_state(rng, 3, vocab=vocab, prompt_max=32768, hist_max=4096, k=5)
    tensors[1][:] = 32768  # full prompts
    check(backend, tensors, (5, 2, 5, 1024, 0), f"32K vocab={vocab}")


@pytest.mark.parametrize("offset", [-40, -3, -1, 0, 1, 2, 3, 5, 8, 13, 21, 40, None])
def test_threshold_same_rule_on_every_backend(backend, offset):
    # Deviation 6: upstream's CPU rule (capped running sum, skip when
    # sum + left >= thr - 1) on every backend, CUDA included. Thresholds are swept around
    # the batch's token count, where the cap bites; None: tiny absolute thresholds.
    rng = np.random.default_rng(abs(offset or 0) + 50)
    bitten = 0
    for trial in range(4):
        tensors = hybrid_state(rng, 24, vocab=4, prompt_max=60, hist_max=40, k=6)
        base = int(np.maximum(tensors[6], 0).sum())
        for thr in [-5, 0, 1, 2] if offset is None else [base + offset]:
            want = reference(*tensors, 4, 1, 6, thr)
            bitten += not np.array_equal(
                want["seq_lens_this_time"],
                reference(*tensors, 4, 1, 6, 10**6)["seq_lens_this_time"],
            )
            check(backend, tensors, (4, 1, 6, thr, 0), f"thr={thr} trial={trial}")
    assert bitten > 0, "the threshold never changed the result: the sweep tests nothing"


def test_threshold_caps_then_stops_later_items(backend):
    # item 0 fits fully, item 1 is cut to what is left, item 2 gets nothing
    tensors = [
        np.concatenate([t] * 3) for t in one_item([1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 2], 2, k=5)
    ]
    got = check(backend, tensors, (2, 2, 5, 10, 0), "thr=10")
    np.testing.assert_array_equal(got["seq_lens_this_time"], np.array([6, 3, 1], np.int32))


def test_budget_one(backend):
    # K - ori + 1 == 1: exactly one token is appended
    tensors = one_item([1, 2, 3, 4, 5], [0, 2, 3], 2, slt=4, k=4)
    got = check(backend, tensors, (2, 2, 4, 1024, 0), "budget 1")
    assert got["seq_lens_this_time"][0] == 5 and got["draft_tokens"][0, 4] == 4


def test_max_dec_len_reached_appends_nothing(backend):
    for max_dec in (3, 2, 0):  # step 2: budget max_dec - 3 <= 0
        tensors = one_item([1, 2, 3, 4, 5], [0, 2, 3], 2, max_dec=max_dec)
        got = check(backend, tensors, (2, 2, 4, 1024, 0), f"max_dec={max_dec}")
        assert got["seq_lens_this_time"][0] == 1
    tensors = one_item([1, 2, 3, 4, 5], [0, 2, 3], 2, max_dec=5)  # budget 2 by length
    got = check(backend, tensors, (2, 2, 4, 1024, 0), "max_dec=5")
    assert got["seq_lens_this_time"][0] == 3


def test_step_smaller_than_n_skips_that_n(backend):
    # step 1: n = 3 and 2 are skipped; only n = 1 can match ("3" -> "4")
    tensors = one_item([9, 3, 4, 5], [3, 3], 1, k=2)
    got = check(backend, tensors, (3, 1, 2, 1024, 0), "step < n")
    np.testing.assert_array_equal(got["draft_tokens"][0], [100, 4, 5])
    got = check(backend, one_item([9, 3, 4, 5], [3, 3], 1, k=2), (3, 2, 2, 1024, 0), "min 2")
    assert got["seq_lens_this_time"][0] == 1


def test_items_without_tokens_or_budget_are_left_alone(backend):
    rng = np.random.default_rng(9)
    tensors = hybrid_state(rng, 16, vocab=3, prompt_max=50, hist_max=30, k=3)
    tensors[6][::2] = 0  # ori == 0
    tensors[6][1::4] = 5  # ori > K + 1: budget < 0
    got = check(backend, tensors, (3, 1, 3, 1024, 0), "skips")
    np.testing.assert_array_equal(got["seq_lens_this_time"][::2], 0)
    np.testing.assert_array_equal(got["draft_tokens"][::2], tensors[5][::2])


def test_out_of_range_lengths_and_steps_are_safe(backend):
    rng = np.random.default_rng(10)
    tensors = hybrid_state(rng, 8, vocab=3, prompt_max=40, hist_max=20, k=3)
    tensors[1][:4] = [10**6, -3, 41, 0]  # input_ids_len beyond the row / negative
    tensors[3][4:6] = [tensors[2].shape[1], 10**9]  # step_idx outside pre_ids
    tensors[8][4:6] = 10**10
    tensors[6][6] = -2  # negative count: 0 in the running sum
    check(backend, tensors, (3, 1, 3, 20, 0), "out of range")


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_result_does_not_depend_on_thread_count(backend, threads):
    rng = np.random.default_rng(77)
    tensors = hybrid_state(rng, 40, vocab=5, prompt_max=3000, hist_max=500, k=4)
    check(backend, tensors, (4, 2, 4, 100, threads), f"threads={threads}")


def test_batch_beyond_upstream_1024_cap(backend):
    # Deviation 1: upstream's GPU phase 2 is one block of <= 1024 threads.
    rng = np.random.default_rng(5)
    tensors = hybrid_state(rng, 1500, vocab=3, prompt_max=12, hist_max=8, k=3, p_idle=0.0)
    got = check(backend, tensors, (3, 1, 3, 10**6, 0), "bsz=1500")
    assert (got["seq_lens_this_time"][1024:] != tensors[6][1024:]).any()


def test_per_item_tensors_of_shape_n_by_1(backend):
    rng = np.random.default_rng(6)
    t = hybrid_state(rng, 9, vocab=4, prompt_max=30, hist_max=20, k=3)
    for i in (1, 3, 4, 6, 7, 8):
        t[i] = t[i].reshape(9, 1)
    check(backend, t, (3, 1, 3, 1024, 0), "[N,1]")


def test_zero_items_is_a_no_op(backend):
    t = hybrid_state(np.random.default_rng(1), 0, vocab=4, prompt_max=5, hist_max=5, k=3)
    check(backend, t, (3, 1, 3, 1024, 0), "bsz=0")


def _valid():
    return hybrid_state(np.random.default_rng(3), 6, vocab=4, prompt_max=20, hist_max=10, k=3)


BAD = {
    "input_ids_int32": (0, lambda t: t[0].astype(np.int32), "input_ids"),
    "input_ids_len_int32": (1, lambda t: t[1].astype(np.int32), "input_ids_len"),
    "pre_ids_rank1": (2, lambda t: t[2].reshape(-1), "pre_ids"),
    "step_idx_batch_5": (3, lambda t: t[3][:5], "step_idx"),
    "draft_token_num_int64": (4, lambda t: t[4].astype(np.int64), "draft_token_num"),
    "draft_tokens_too_narrow": (5, lambda t: t[5][:, :3], "draft_tokens"),
    "draft_tokens_batch_5": (5, lambda t: np.zeros((5, 4), np.int64), "draft_tokens"),
    "seq_lens_this_time_int64": (6, lambda t: t[6].astype(np.int64), "seq_lens_this_time"),
    "seq_lens_decoder_n_by_2": (7, lambda t: np.zeros((6, 2), np.int32), "seq_lens_decoder"),
    "max_dec_len_float": (8, lambda t: t[8].astype(np.float32), "max_dec_len"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    assert_bad_input_rejected(backend, OP, NAMES, BAD[case], _valid(), attrs=(3, 1, 3, 1024, 0))


@pytest.mark.parametrize(
    "attrs,name",
    [
        ((3, 0, 3), "min_ngram_size"),
        ((1, 2, 3), "max_ngram_size"),
        ((3, 1, -1), "max_draft_tokens"),
    ],
)
def test_bad_attrs_are_named(backend, attrs, name):
    with pytest.raises(ValueError, match=f"attr `{name}`"):
        backend.run(OP, _valid(), (*attrs, 1024, 0))


def test_max_ngram_size_has_an_upper_bound_checked_on_the_host(backend):
    """Match lengths are packed in 16 bits by the CUDA search: max_ngram_size is bounded by
    kMaxNgramSize = 1024 (an error naming the attr); the bound itself works."""
    for bad in (1025, 2**31 - 1):
        with pytest.raises(
            ValueError, match=r"hybrid_mtp_ngram: attr `max_ngram_size` must be <= 1024"
        ):
            backend.run(OP, _valid(), (bad, 1, 3, 1024, 0))
    check(backend, _valid(), (1024, 1, 3, 1024, 0), "max_ngram_size 1024")


def test_rows_past_the_batch_are_accepted_and_not_read(backend):
    t = one_item([1, 2, 3, 1, 2, 5, 6], [1, 2], 1, slt=1)
    padded = [np.concatenate([x, np.full((3, *x.shape[1:]), 2**31 - 1, x.dtype)]) for x in t]
    padded[6] = t[6]  # seq_lens_this_time sets the batch size
    check(backend, padded, (3, 1, 3, 1024, 0), "every other tensor padded to 4 rows")


def test_extreme_steps_and_limits_do_not_wrap(backend):
    i64 = np.iinfo(np.int64)
    for step, max_dec in ((i64.min, i64.max), (i64.max, i64.min), (1, i64.min), (i64.min, i64.min)):
        t = one_item([1, 2, 3, 1, 2, 5, 6], [1, 2], 1, slt=1, max_dec=max_dec)
        t[3] = np.array([step], np.int64)
        check(backend, t, (3, 1, 3, 1024, 0), f"step={step} max_dec={max_dec}")


def test_failed_worker_thread_creation_runs_the_work_on_the_calling_thread(backend):
    t = hybrid_state(
        np.random.default_rng(6), 64, vocab=3, prompt_max=400, hist_max=300, k=5, p_idle=0.0
    )
    assert_same_without_worker_threads(backend, OP, NAMES, reference, t, (3, 1, 5, 10**6, 16))


def test_length_values_of_2_31_do_not_cost_time(backend):
    from tests.ops.child_process import run_in_child

    big = 2**31 - 1
    t = one_item([1, 2, 3, 1, 2, 5, 6], [1, 2], 1, slt=1, max_dec=2**62)
    t[1] = np.array([big], np.int64)  # input_ids_len
    t[3] = np.array([big], np.int64)  # step_idx
    t[7] = np.array([big], np.int32)
    run_in_child(lambda: bool(check(backend, t, (1024, 1, 3, big, 0), "2**31 - 1")), timeout=60)


def test_wrapper_threshold_defaults_to_upstream_env_var(monkeypatch):
    rng = np.random.default_rng(21)
    tensors = hybrid_state(rng, 20, vocab=3, prompt_max=40, hist_max=30, k=5, p_idle=0.0)
    env = ("SPEC_TOKENUM_THRESHOLD", 1024, 17)
    assert_wrapper_reads_threshold(monkeypatch, OP, NAMES, reference, tensors, (3, 1, 5), env)
