"""ngram_match on every backend against tests/reference/ngram.py (docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ops.ngram_cases import (
    MATCH_NAMES as NAMES,
    assert_same_without_worker_threads,
    assert_wrapper_reads_threshold,
    decoding_match_state,
    match_state,
)
from tests.reference.ngram import ngram_match as reference
from tests.support.compare import assert_bad_input_rejected, exact_check

OP = "ngram_match"
check = exact_check(OP, NAMES, reference)


def one_item(prompt, generated, step, *, budget=3, max_dec=1000, enc=0, dec=1, slt=7, k=4):
    prompt = np.asarray(prompt, np.int64)
    all_ids = np.zeros(len(prompt) + max(len(generated), step + 1) + 1, np.int64)
    all_ids[: len(prompt)] = prompt
    all_ids[len(prompt) : len(prompt) + len(generated)] = generated
    return [
        prompt.reshape(1, -1),
        np.array([len(prompt)], np.int64),
        all_ids.reshape(1, -1),
        np.array([len(prompt)], np.int64),
        np.array([step], np.int64),
        np.array([budget], np.int32),
        np.full((1, k + 1), -1, np.int64),
        np.array([slt], np.int32),
        np.array([enc], np.int32),
        np.array([dec], np.int32),
        np.array([max_dec], np.int64),
    ]


def test_fixed_vectors(backend):
    # "6" (n = 1, since step 1 < 2) -> "7 8"
    got = check(backend, one_item([5, 6, 7, 8], [1, 6], 1, budget=2), (3, 4, 128, 0), "n=1")
    np.testing.assert_array_equal(got["draft_tokens"][0], [-1, 7, 8, -1, -1])
    assert got["seq_lens_this_time"][0] == 3
    # "1 6 7" in the prompt beats "7" earlier; budget 3 clamps at the prompt end
    got = check(backend, one_item([7, 0, 1, 6, 7, 9], [4, 1, 6, 7], 3), (3, 4, 128, 0), "n=3")
    np.testing.assert_array_equal(got["draft_tokens"][0], [-1, 9, -1, -1, -1])
    # history only: "2 3" -> "5"
    got = check(backend, one_item([9, 9], [2, 3, 5, 2, 3], 4), (2, 4, 128, 0), "history")
    np.testing.assert_array_equal(got["draft_tokens"][0, :3], [-1, 5, 2])


def test_prefill_idle_and_decode_items(backend):
    t = [
        np.concatenate(x)
        for x in zip(
            one_item([1, 2], [0, 1], 1, enc=5, slt=5),
            one_item([1, 2], [0, 1], 1, dec=0, slt=9),
            one_item([1, 2], [0, 1], 1, slt=9),
        )
    ]
    got = check(backend, t, (2, 4, 128, 0), "kinds")
    np.testing.assert_array_equal(got["seq_lens_this_time"], np.array([5, 0, 2], np.int32))


@pytest.mark.parametrize("vocab", [2, 5, 50])
@pytest.mark.parametrize("bsz", [1, 7, 64])
def test_random_states_match_reference(backend, vocab, bsz):
    rng = np.random.default_rng(31 * vocab + bsz)
    for k, max_n in ((4, 3), (8, 6)):
        t = match_state(rng, bsz, vocab=vocab, prompt_max=300, hist_max=200, k=k)
        check(backend, t, (max_n, k, 10**6, 0), f"vocab={vocab} bsz={bsz}")


def test_long_contexts_32k(backend):
    t = decoding_match_state(4, 2, vocab=30, prompt_max=32768, hist_max=2048, k=5)
    check(backend, t, (3, 5, 128, 0), "32K")


@pytest.mark.parametrize("offset", [-20, -2, 0, 1, 2, 4, 9, 25, None])
def test_threshold_same_rule_on_every_backend(backend, offset):
    # Deviation 6: upstream's CPU rule on every backend (prefill items keep their count
    # and stay counted as unprocessed).
    rng = np.random.default_rng(abs(offset or 0) + 3)
    for trial in range(4):
        t = match_state(rng, 20, vocab=4, prompt_max=50, hist_max=40, k=6)
        base = int(np.where(t[8] > 0, np.maximum(t[7], 0), (t[9] != 0).astype(np.int32)).sum())
        for thr in [-3, 0, 1, 2, 128] if offset is None else [base + offset]:
            check(backend, t, (4, 6, thr, 0), f"thr={thr} trial={trial}")


def test_budget_edges(backend):
    for budget, max_dec, want in (
        (1, 1000, 2),
        (0, 1000, 1),
        (5, 2, 1),
        (5, 3, 2),
        (5, 4, 3),
        (9, 1000, 5),
    ):
        # step 1; budget min(draft_token_num, max_dec - 2, width - 1 = 4)
        got = check(
            backend,
            one_item([5, 6, 7, 8, 9, 10, 11], [1, 6], 1, budget=budget, max_dec=max_dec),
            (3, 4, 128, 0),
            f"budget={budget} max_dec={max_dec}",
        )
        assert got["seq_lens_this_time"][0] == want, (budget, max_dec)


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_result_does_not_depend_on_thread_count(backend, threads):
    t = match_state(np.random.default_rng(8), 30, vocab=6, prompt_max=4000, hist_max=300, k=4)
    check(backend, t, (3, 4, 10**6, threads), f"threads={threads}")


def test_out_of_range_values_are_safe(backend):
    t = decoding_match_state(12, 8, vocab=3, prompt_max=30, hist_max=20, k=3)
    t[1][:2] = [10**7, -1]
    t[3][2:4] = [10**7, -4]  # prompt_lens
    t[4][4] = t[2].shape[1]  # step_idx past the row
    t[5][5] = 10**6  # draft_token_num beyond the row
    t[10][4:6] = 10**12
    check(backend, t, (3, 3, 10**6, 0), "out of range")


def test_batch_beyond_upstream_1024_cap(backend):
    t = match_state(np.random.default_rng(2), 1300, vocab=3, prompt_max=10, hist_max=6, k=3)
    check(backend, t, (2, 3, 10**6, 0), "bsz=1300")


def _valid():
    return match_state(np.random.default_rng(3), 5, vocab=4, prompt_max=20, hist_max=10, k=3)


BAD = {
    "token_ids_all_int32": (2, lambda t: t[2].astype(np.int32), "token_ids_all"),
    "prompt_lens_batch_4": (3, lambda t: t[3][:4], "prompt_lens"),
    "draft_tokens_rank1": (6, lambda t: t[6].reshape(-1), "draft_tokens"),
    "seq_lens_encoder_int64": (8, lambda t: t[8].astype(np.int64), "seq_lens_encoder"),
    "seq_lens_decoder_rank0": (9, lambda t: np.array(1, np.int32), "seq_lens_decoder"),
    "max_dec_len_int32": (10, lambda t: t[10].astype(np.int32), "max_dec_len"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    assert_bad_input_rejected(backend, OP, NAMES, BAD[case], _valid(), attrs=(3, 3, 128, 0))


def test_bad_attr_is_named(backend):
    with pytest.raises(ValueError, match="attr `max_ngram_size`"):
        backend.run(OP, _valid(), (0, 3, 128, 0))


def test_max_ngram_size_has_an_upper_bound_checked_on_the_host(backend):
    """Match lengths are packed in 16 bits by the CUDA search: max_ngram_size is bounded by
    kMaxNgramSize = 1024 (an error naming the attr); the bound itself works."""
    for bad in (1025, 2**31 - 1):
        with pytest.raises(ValueError, match=r"ngram_match: attr `max_ngram_size` must be <= 1024"):
            backend.run(OP, _valid(), (bad, 3, 128, 0))
    check(backend, _valid(), (1024, 3, 128, 0), "max_ngram_size 1024")


def test_upstream_prompt_lens_4_by_1_for_a_batch_of_1(backend):
    """Upstream's own test passes prompt_lens [4, 1] (max_bsz padding) for a batch of 1:
    per-item arrays and row matrices with more rows than the batch are accepted, and only
    rows 0..bsz-1 are read."""
    t = one_item([5, 6, 7, 8], [1, 6], 1, budget=2)
    t[3] = np.array([[4], [2**62], [-(2**62)], [7]], np.int64)
    got = check(backend, t, (3, 4, 128, 0), "prompt_lens [4, 1]")
    np.testing.assert_array_equal(got["draft_tokens"][0], [-1, 7, 8, -1, -1])
    padded = [np.concatenate([x, np.full((3, *x.shape[1:]), 2**31 - 1, x.dtype)]) for x in t]
    padded[7] = t[7]  # seq_lens_this_time sets the batch size
    check(backend, padded, (3, 4, 128, 0), "every other tensor padded to 4 rows")


def test_extreme_steps_and_limits_do_not_wrap(backend):
    """max_dec_len - step_idx - 1 is computed with saturation: no budget wraps positive."""
    i64 = np.iinfo(np.int64)
    for step, max_dec in ((i64.min, i64.max), (i64.max, i64.min), (1, i64.min), (i64.min, i64.min)):
        t = one_item([5, 6, 7, 8], [1, 6], 1, budget=2, max_dec=max_dec)
        t[4] = np.array([step], np.int64)
        check(backend, t, (3, 4, 128, 0), f"step={step} max_dec={max_dec}")


def test_failed_worker_thread_creation_runs_the_work_on_the_calling_thread(backend):
    t = decoding_match_state(5, 64, vocab=3, prompt_max=400, hist_max=300, k=4)
    assert_same_without_worker_threads(backend, OP, NAMES, reference, t, (3, 4, 10**6, 16))


def test_length_values_of_2_31_do_not_cost_time(backend):
    from tests.ops.child_process import run_in_child

    big = 2**31 - 1
    t = one_item([5, 6, 7, 8], [1, 6], 1, budget=big, max_dec=2**62)
    t[1] = np.array([big], np.int64)  # input_ids_len
    t[3] = np.array([big], np.int64)  # prompt_lens
    t[4] = np.array([big], np.int64)  # step_idx
    t[7] = np.array([big], np.int32)
    run_in_child(lambda: bool(check(backend, t, (1024, 4, big, 0), "2**31 - 1")), timeout=60)


def test_wrapper_threshold_defaults_to_upstream_env_var(monkeypatch):
    t = decoding_match_state(21, 30, vocab=3, prompt_max=40, hist_max=30, k=5)
    env = ("INFER_WITH_REFERENCE_TOKENUM_THRESHOLD", 128, 40)
    assert_wrapper_reads_threshold(monkeypatch, OP, NAMES, reference, t, (3, 5), env)
