"""unified_update_model_status on every backend against tests/reference/ (docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.reference.unified_update_model_status import (
    NAMES,
    unified_update_model_status as reference,
)
from tests.support.compare import assert_bad_input_rejected, assert_exact

OP = "unified_update_model_status"
EOS = (2, 3)
SENTINEL = -999


def make_state(rng, bsz, k, *, real_bsz=None, seq_len=64, vocab=8):
    """Random slots: running decode / prefill (also dec == enc == 0), stopped, paused,
    padding past real_bsz; emitted counts 0..K+1 with EOS ids from a small vocabulary,
    step_idx near max_dec_len and prompt_len + step_idx near L."""
    w = k + 1
    real_bsz = bsz if real_bsz is None else real_bsz
    kind = rng.choice(["decode"] * 5 + ["prefill", "stopped", "paused", "idle"], size=bsz)
    enc = np.where(kind == "prefill", rng.integers(1, 30, bsz), 0).astype(np.int32)
    dec = np.where(
        kind == "decode",
        rng.integers(1, 50, bsz),
        np.where(kind == "idle", 0, rng.integers(0, 9, bsz)),
    ).astype(np.int32)
    stop = (kind == "stopped").reshape(bsz, 1)
    paused = kind == "paused"
    n = rng.integers(0, w + 1, bsz).astype(np.int32)
    out = rng.integers(0, vocab, (bsz, w)).astype(np.int64)
    out[np.arange(w)[None, :] >= n[:, None]] = -1
    step = rng.integers(0, 40, (bsz, 1)).astype(np.int64)
    max_dec = (step + rng.integers(1, w + 2, (bsz, 1))).astype(np.int64)
    max_dec[rng.random(bsz) < 0.5] = 10_000
    prompt = rng.integers(0, seq_len - 20, (bsz, 1)).astype(np.int64)
    hist = np.full((bsz, seq_len), SENTINEL, np.int64)
    return [
        enc,
        dec,
        np.array([rng.random() < 0.5]),
        rng.integers(0, vocab, (bsz, w)).astype(np.int64),
        out,
        n,
        stop,
        rng.integers(0, w + 1, real_bsz).astype(np.int32),
        paused,
        hist,
        prompt,
        step,
        np.array(EOS, np.int64).reshape(-1, 1),
        max_dec,
    ]


def check(backend, tensors, context, keep=False):
    want = reference(tensors, keep)
    got = backend.run(OP, tensors, (keep,))
    for name, g in zip(NAMES, got):
        assert_exact(name, g, want[name], context=f"{backend.name}, {context}")
    return dict(zip(NAMES, got))


@pytest.mark.parametrize("k", [1, 3, 5, 8])
@pytest.mark.parametrize("bsz", [1, 7, 64, 1500])
def test_random_states_match_reference(backend, bsz, k):
    rng = np.random.default_rng(10 * bsz + k)
    real = bsz if bsz < 7 else bsz - 3
    check(backend, make_state(rng, bsz, k, real_bsz=real), f"bsz={bsz} k={k}")


@pytest.mark.parametrize("k", [1, 5, 8])
def test_random_states_keeping_the_max_dec_len_token_match_reference(backend, k):
    rng = np.random.default_rng(300 + k)
    tensors = make_state(rng, 64, k)
    got = check(backend, tensors, f"k={k} keep", keep=True)
    upstream = reference(tensors)
    same = ("step_output_len", "step_idx", "stop_flags", "seq_lens_decoder", "seq_lens_encoder")
    for name in same:  # the stop decision does not depend on the replacement
        assert_exact(name, got[name], upstream[name], context=f"{backend.name}, keep vs upstream")
    assert not np.array_equal(got["step_output_ids"], upstream["step_output_ids"]), (
        "no item reached max_dec_len"
    )


def test_verify_then_update_over_several_steps_matches_reference(backend):
    """A chained state machine: verify (GREEDY) feeds update, for 6 steps at bsz 64."""
    from tests.reference.verify_draft_tokens import verify_draft_tokens as verify_ref
    from tests.support.op_states import verify_state

    rng = np.random.default_rng(4)
    bsz, w = 64, 4
    hist = np.full((bsz, 128), SENTINEL, np.int64)
    enc = np.zeros(bsz, np.int32)
    dec = rng.integers(1, 20, bsz).astype(np.int32)
    step = np.zeros((bsz, 1), np.int64)
    stop = np.zeros((bsz, 1), bool)
    for s in range(6):
        v = verify_state(rng, bsz, w - 1, 1)
        v[8], v[9], v[16] = stop, enc, step
        v[15] = np.full((bsz, 1), 12, np.int64)
        v[12][:] = False
        vout = verify_ref(v, (0, 2, 1, False, False))
        u = [
            enc,
            dec,
            np.array([True]),
            v[2],
            vout["step_output_ids"],
            vout["step_output_len"],
            stop,
            v[10],
            v[12],
            hist,
            np.full((bsz, 1), 5, np.int64),
            step,
            v[11],
            v[15],
        ]
        got = check(backend, u, f"step {s}")
        enc, dec, stop = got["seq_lens_encoder"], got["seq_lens_decoder"], got["stop_flags"]
        hist, step = got["token_ids_all"], got["step_idx"]
    assert stop.any() and not stop.all()


def one_slot(
    out,
    n,
    *,
    enc=0,
    dec=10,
    step=0,
    max_dec=100,
    prompt=3,
    seq_len=16,
    stop=False,
    paused=False,
    real=1,
):
    w = len(out)
    return [
        np.array([enc], np.int32),
        np.array([dec], np.int32),
        np.array([False]),
        np.array([[1] + [0] * (w - 1)], np.int64),
        np.array([out], np.int64),
        np.array([n], np.int32),
        np.array([[stop]]),
        np.full(real, 4, np.int32),
        np.array([paused]),
        np.full((1, seq_len), SENTINEL, np.int64),
        np.array([[prompt]], np.int64),
        np.array([[step]], np.int64),
        np.array(EOS, np.int64).reshape(-1, 1),
        np.array([[max_dec]], np.int64),
    ]


def test_decode_commits_tokens_history_and_next_input(backend):
    got = check(backend, one_slot([11, 12, -1], 2, step=4), "decode")
    assert (
        got["seq_lens_decoder"][0] == 12
        and got["step_idx"][0, 0] == 6
        and got["has_running_seqs"][0]
    )
    assert list(got["token_ids_all"][0, 7:9]) == [11, 12] and got["step_input_ids"][0, 0] == 12


def test_eos_in_the_middle_cuts_the_count_and_stops(backend):
    got = check(backend, one_slot([11, 3, 12], 3), "eos")
    assert (
        got["step_output_len"][0] == 2
        and got["stop_flags"][0, 0]
        and not got["has_running_seqs"][0]
    )
    assert got["step_input_ids"][0, 0] == 3


def test_max_dec_len_replaces_the_token_with_end_tokens_0(backend):
    got = check(backend, one_slot([11, 12, 13], 3, step=8, max_dec=10), "max_dec_len")
    assert list(got["step_output_ids"][0]) == [11, EOS[0], 13] and got["step_output_len"][0] == 2
    assert got["stop_flags"][0, 0] and got["step_idx"][0, 0] == 10


def test_max_dec_len_token_is_kept_when_asked_and_the_slot_still_stops(backend):
    got = check(
        backend, one_slot([11, 12, 13], 3, step=8, max_dec=10), "max_dec_len keep", keep=True
    )
    assert list(got["step_output_ids"][0]) == [11, 12, 13] and got["step_output_len"][0] == 2
    assert (
        got["stop_flags"][0, 0] and got["step_idx"][0, 0] == 10 and not got["has_running_seqs"][0]
    )
    # the kept token is what the history and the next input get
    assert list(got["token_ids_all"][0, 11:13]) == [11, 12] and got["step_input_ids"][0, 0] == 12


def test_prefill_folds_encoder_into_decoder_even_with_no_token(backend):
    got = check(backend, one_slot([-1, -1], 0, enc=7, dec=0), "prefill n=0")
    assert (
        got["seq_lens_encoder"][0] == 0
        and got["seq_lens_decoder"][0] == 7
        and got["step_idx"][0, 0] == 0
    )


def test_idle_slot_with_no_lengths_still_advances_step_idx(backend):
    got = check(backend, one_slot([11, -1], 1, enc=0, dec=0, step=5), "dec=enc=0")
    assert got["seq_lens_decoder"][0] == 0 and got["step_idx"][0, 0] == 6


def test_history_is_all_or_nothing_at_the_model_length(backend):
    # prompt 3 + new step 13 == L = 16: not recorded at all (one slot short of the check)
    got = check(backend, one_slot([11, 12, -1], 2, step=11, seq_len=16), "at L")
    assert (got["token_ids_all"] == SENTINEL).all() and got["step_idx"][0, 0] == 13
    got = check(backend, one_slot([11, 12, -1], 2, step=10, seq_len=16), "below L")
    assert list(got["token_ids_all"][0, 13:15]) == [11, 12]


@pytest.mark.parametrize("which", ["stopped", "paused"])
def test_stopped_or_paused_real_slot_is_zeroed(backend, which):
    got = check(
        backend,
        one_slot([11, -1], 1, enc=3, step=5, stop=which == "stopped", paused=which == "paused"),
        which,
    )
    assert (
        got["stop_flags"][0, 0]
        and got["seq_lens_this_time"][0] == 0
        and got["step_output_len"][0] == 0
    )
    assert (
        got["seq_lens_decoder"][0] == 0
        and got["step_idx"][0, 0] == 5
        and not got["has_running_seqs"][0]
    )


def test_paused_padding_slot_past_real_bsz_is_untouched(backend):
    got = check(backend, one_slot([11, -1], 1, paused=True, real=0), "padding")
    assert not got["stop_flags"][0, 0] and got["seq_lens_decoder"][0] == 10


def test_has_running_seqs_is_false_for_an_empty_batch(backend):
    tensors = one_slot([11], 1)
    tensors = [t[:0] if i not in (2, 12) else t for i, t in enumerate(tensors)]
    tensors[2] = np.array([True])
    got = check(backend, tensors, "bsz=0")
    assert not got["has_running_seqs"][0]


def test_batch_beyond_upstream_1024_cap(backend):
    """Deviation 1: any batch size; has_running_seqs from slots past 1024 counts too."""
    bsz = 3000
    tensors = make_state(np.random.default_rng(8), bsz, 2)
    tensors[6][:] = True
    tensors[6][2500] = False  # the only running slot is far past 1024
    tensors[8][:] = False
    tensors[13][:] = 10_000
    tensors[4][2500] = [5, 6, 7]
    tensors[5][2500] = 3
    got = check(backend, tensors, "bsz=3000")
    assert got["has_running_seqs"][0] and got["step_idx"][2500, 0] == tensors[11][2500, 0] + 3


# ---- out-of-range values: clamped the same way on every backend, never rejected --------

I32_MAX, I64_MAX = 2**31 - 1, 2**63 - 1

CLAMPED_VALUES = {
    # case: (tensor index, builder); the former host-only rejections, now clamped everywhere
    "prompt_lens_negative": (10, lambda t: -t[10] - 1),
    "prompt_lens_int64_max": (10, lambda t: np.full_like(t[10], I64_MAX)),
    "prompt_lens_int64_min": (10, lambda t: np.full_like(t[10], -I64_MAX - 1)),
    "step_output_len_negative": (5, lambda t: -np.ones(6, np.int32)),
    "step_output_len_above_width": (5, lambda t: np.full(6, 5, np.int32)),
    "step_output_len_int32_max": (5, lambda t: np.full(6, I32_MAX, np.int32)),
    "step_idx_int64_max": (11, lambda t: np.full_like(t[11], I64_MAX)),
    "step_idx_int64_min": (11, lambda t: np.full_like(t[11], -I64_MAX - 1)),
    "seq_lens_decoder_int32_max": (1, lambda t: np.full(6, I32_MAX, np.int32)),
    "seq_lens_encoder_int32_max": (0, lambda t: np.full(6, I32_MAX, np.int32)),
}


@pytest.mark.parametrize("case", sorted(CLAMPED_VALUES))
def test_out_of_range_values_are_clamped_the_same_on_every_backend(backend, case):
    index, build = CLAMPED_VALUES[case]
    tensors = make_state(np.random.default_rng(3), 6, 3)
    tensors[6][:] = False  # every slot running, so every slot meets the value
    tensors[8][:] = False
    tensors[1][:] = np.maximum(tensors[1], 1)
    tensors[index] = build(tensors)
    check(backend, tensors, case)


def test_prompt_lens_int64_max_never_writes_outside_the_history_row(backend):
    """Issue 13: prompt_lens + step_idx overflowed and the token went to token_ids_all[-1].
    Now the sum saturates: nothing is recorded, and no other row is touched."""
    tensors = one_slot([11, 12, -1], 2, step=4)
    tensors = [np.concatenate([t, t]) if i not in (2, 7, 12) else t for i, t in enumerate(tensors)]
    tensors[10] = np.array([[I64_MAX], [3]], np.int64)
    tensors[11] = np.array([[0], [4]], np.int64)  # old step 0: the first position is 2**63 - 1
    got = check(backend, tensors, "prompt_lens = 2**63 - 1")
    assert (got["token_ids_all"][0] == SENTINEL).all()
    assert list(got["token_ids_all"][1, 7:9]) == [11, 12]
    assert (np.delete(got["token_ids_all"][1], [7, 8]) == SENTINEL).all()
    assert got["step_idx"][0, 0] == 2 and got["step_input_ids"][0, 0] == 12


def test_step_idx_saturates_at_int64_max(backend):
    got = check(
        backend, one_slot([11, 12, -1], 2, step=I64_MAX - 1, max_dec=I64_MAX), "step near max"
    )
    assert (
        got["step_idx"][0, 0] == I64_MAX
        and got["step_output_len"][0] == 1
        and got["stop_flags"][0, 0]
    )
    assert (got["token_ids_all"] == SENTINEL).all()


def test_seq_lens_decoder_saturates_at_int32_max(backend):
    got = check(backend, one_slot([11, 12, -1], 2, dec=I32_MAX - 1), "dec near max")
    assert got["seq_lens_decoder"][0] == I32_MAX


def test_upstream_step_output_len_10_for_width_8_stops_at_max_dec_len(backend):
    """Upstream's own test: step_output_len 10 for a row of width 8, max_dec_len reached after
    5 tokens: the scan stops there (never past the row) and the 5th token becomes EOS."""
    out = [21, 22, 23, 24, 25, 26, 27, 28]
    got = check(backend, one_slot(out, 10, step=5, max_dec=10, seq_len=64), "len 10, width 8")
    assert (
        got["step_output_len"][0] == 5 and got["stop_flags"][0, 0] and got["step_idx"][0, 0] == 10
    )
    assert list(got["step_output_ids"][0]) == [21, 22, 23, 24, EOS[0], 26, 27, 28]
    assert list(got["token_ids_all"][0, 8:13]) == [21, 22, 23, 24, EOS[0]]


def test_step_output_len_above_the_width_without_a_stop_is_clamped_to_the_row(backend):
    got = check(backend, one_slot([21, 22, 23], 10, step=0, seq_len=64), "len 10, width 3")
    assert (
        got["step_output_len"][0] == 3
        and got["step_idx"][0, 0] == 3
        and got["step_input_ids"][0, 0] == 23
    )


def test_per_item_arrays_and_row_matrices_may_have_more_rows_than_slots(backend):
    """Upstream callers pad to max_bsz: rows past stop_flags' N are accepted and never read."""
    base = make_state(np.random.default_rng(11), 6, 3)
    want = reference(base)
    padded = list(base)
    for i in (0, 1, 3, 4, 5, 8, 9, 10, 11, 13):
        extra = np.full((3,) + base[i].shape[1:], 77, base[i].dtype)
        padded[i] = np.concatenate([base[i], extra])
    got = backend.run(OP, padded)
    for i, (name, g) in enumerate(zip(NAMES, got)):
        assert_exact(name, g[: len(want[name])], want[name], context=backend.name)
        if i in (0, 1, 3, 4, 5, 9, 11):
            assert (g[len(want[name]) :] == 77).all(), f"{name}: a row past N was written"


def test_huge_length_values_cost_no_more_than_the_buffers(backend):
    """Lengths of 2**31 - 1 (and step_idx / prompt_lens at the int64 limits): the work is
    bounded by the buffer sizes, so the call completes at once."""
    from tests.ops.child_process import run_op_in_child as run_in_child

    tensors = make_state(np.random.default_rng(5), 64, 3)
    tensors[5][:] = I32_MAX
    tensors[0][::2] = I32_MAX
    tensors[1][:] = I32_MAX
    tensors[10][::3] = I64_MAX
    tensors[11][::5] = I64_MAX
    want = reference(tensors)
    got = run_in_child(backend, OP, tensors)
    for name, g in zip(NAMES, got):
        assert_exact(name, g, want[name], context=backend.name)


def _valid():
    return make_state(np.random.default_rng(3), 6, 3)


BAD_INPUTS = {
    "seq_lens_encoder_int64": (0, lambda t: t[0].astype(np.int64), "seq_lens_encoder"),
    "has_running_seqs_int32": (2, lambda t: t[2].astype(np.int32), "has_running_seqs"),
    "has_running_seqs_two": (2, lambda t: np.zeros(2, bool), "has_running_seqs"),
    "step_output_ids_width_k": (4, lambda t: t[4][:, :-1].copy(), "step_output_ids"),
    "step_input_ids_batch_5": (3, lambda t: t[3][:5].copy(), "step_input_ids"),
    "token_ids_all_batch_5": (9, lambda t: np.zeros((5, 8), np.int64), "token_ids_all"),
    "token_ids_all_rank1": (9, lambda t: t[9].reshape(-1), "token_ids_all"),
    "step_idx_int32": (11, lambda t: t[11].astype(np.int32), "step_idx"),
    "max_dec_len_batch_5": (13, lambda t: t[13][:5].copy(), "max_dec_len"),
    "seq_lens_this_time_too_many": (7, lambda t: np.zeros(7, np.int32), "seq_lens_this_time"),
    "end_tokens_empty": (12, lambda t: np.zeros((0,), np.int64), "end_tokens"),
    "is_paused_float32": (8, lambda t: t[8].astype(np.float32), "is_paused"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    assert_bad_input_rejected(backend, OP, NAMES, BAD_INPUTS[case], _valid())


def test_paddle_op_writes_in_place_and_takes_keyword_arguments():
    paddle = pytest.importorskip("paddle")
    import fastdeploy_mtp.ops as ops

    tensors = one_slot([11, 12, -1], 2, step=4)
    pt = {n: paddle.to_tensor(a) for n, a in zip(NAMES, tensors)}
    ptr = pt["token_ids_all"].data_ptr()
    ops.unified_update_model_status(**dict(reversed(list(pt.items()))))
    want = reference(tensors)
    for n in NAMES:
        np.testing.assert_array_equal(pt[n].numpy(), want[n], err_msg=n)
    assert pt["token_ids_all"].data_ptr() == ptr
