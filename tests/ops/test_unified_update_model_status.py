"""unified_update_model_status on every backend against tests/reference/ (docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.compare import assert_exact, assert_rejected
from tests.reference.unified_update_model_status import NAMES, unified_update_model_status as reference

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
        kind == "decode", rng.integers(1, 50, bsz), np.where(kind == "idle", 0, rng.integers(0, 9, bsz))
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


def check(backend, tensors, context):
    want = reference(tensors)
    got = backend.run(OP, tensors)
    for name, g in zip(NAMES, got):
        assert_exact(name, g, want[name], context=f"{backend.name}, {context}")
    return dict(zip(NAMES, got))


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("bsz", [1, 7, 64, 1500])
def test_random_states_match_reference(backend, bsz, k):
    rng = np.random.default_rng(10 * bsz + k)
    real = bsz if bsz < 7 else bsz - 3
    check(backend, make_state(rng, bsz, k, real_bsz=real), f"bsz={bsz} k={k}")


def test_verify_then_update_over_several_steps_matches_reference(backend):
    """A chained state machine: verify (GREEDY) feeds update, for 6 steps at bsz 64."""
    from tests.ops.test_verify_draft_tokens import make_state as verify_state
    from tests.reference.verify_draft_tokens import verify_draft_tokens as verify_ref

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


def one_slot(out, n, *, enc=0, dec=10, step=0, max_dec=100, prompt=3, seq_len=16, stop=False, paused=False, real=1):
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
    assert got["seq_lens_decoder"][0] == 12 and got["step_idx"][0, 0] == 6 and got["has_running_seqs"][0]
    assert list(got["token_ids_all"][0, 7:9]) == [11, 12] and got["step_input_ids"][0, 0] == 12


def test_eos_in_the_middle_cuts_the_count_and_stops(backend):
    got = check(backend, one_slot([11, 3, 12], 3), "eos")
    assert got["step_output_len"][0] == 2 and got["stop_flags"][0, 0] and not got["has_running_seqs"][0]
    assert got["step_input_ids"][0, 0] == 3


def test_max_dec_len_replaces_the_token_with_end_tokens_0(backend):
    got = check(backend, one_slot([11, 12, 13], 3, step=8, max_dec=10), "max_dec_len")
    assert list(got["step_output_ids"][0]) == [11, EOS[0], 13] and got["step_output_len"][0] == 2
    assert got["stop_flags"][0, 0] and got["step_idx"][0, 0] == 10


def test_prefill_folds_encoder_into_decoder_even_with_no_token(backend):
    got = check(backend, one_slot([-1, -1], 0, enc=7, dec=0), "prefill n=0")
    assert got["seq_lens_encoder"][0] == 0 and got["seq_lens_decoder"][0] == 7 and got["step_idx"][0, 0] == 0


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
    got = check(backend, one_slot([11, -1], 1, enc=3, step=5, stop=which == "stopped", paused=which == "paused"), which)
    assert got["stop_flags"][0, 0] and got["seq_lens_this_time"][0] == 0 and got["step_output_len"][0] == 0
    assert got["seq_lens_decoder"][0] == 0 and got["step_idx"][0, 0] == 5 and not got["has_running_seqs"][0]


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


def _valid():
    return make_state(np.random.default_rng(3), 6, 3)


BAD_INPUTS = {
    "seq_lens_encoder_int64": (0, lambda t: t[0].astype(np.int64), "seq_lens_encoder"),
    "has_running_seqs_int32": (2, lambda t: t[2].astype(np.int32), "has_running_seqs"),
    "has_running_seqs_two": (2, lambda t: np.zeros(2, bool), "has_running_seqs"),
    "step_output_ids_width_k": (4, lambda t: t[4][:, :-1].copy(), "step_output_ids"),
    "step_input_ids_batch_5": (3, lambda t: t[3][:5].copy(), "step_input_ids"),
    "token_ids_all_batch_7": (9, lambda t: np.zeros((7, 8), np.int64), "token_ids_all"),
    "token_ids_all_rank1": (9, lambda t: t[9].reshape(-1), "token_ids_all"),
    "step_idx_int32": (11, lambda t: t[11].astype(np.int32), "step_idx"),
    "max_dec_len_batch_5": (13, lambda t: t[13][:5].copy(), "max_dec_len"),
    "prompt_lens_negative": (10, lambda t: -t[10] - 1, "prompt_lens"),
    "step_output_len_negative": (5, lambda t: -np.ones(6, np.int32), "step_output_len"),
    "step_output_len_above_width": (5, lambda t: np.full(6, 5, np.int32), "step_output_len"),
    "seq_lens_this_time_too_many": (7, lambda t: np.zeros(7, np.int32), "seq_lens_this_time"),
    "end_tokens_empty": (12, lambda t: np.zeros((0,), np.int64), "end_tokens"),
    "is_paused_float32": (8, lambda t: t[8].astype(np.float32), "is_paused"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    if backend.name == "cuda" and case.startswith(("prompt_lens_negative", "step_output_len_")):
        pytest.skip("value checks read host tensors only (no device sync); CUDA clamps instead")
    index, build, name = BAD_INPUTS[case]
    tensors = _valid()
    tensors[index] = build(tensors)
    assert_rejected(backend, OP, NAMES, tensors, name)


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
