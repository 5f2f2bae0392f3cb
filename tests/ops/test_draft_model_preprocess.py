"""draft_model_preprocess on every backend against tests/reference/ (docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.reference.draft_model_preprocess import NAMES, draft_model_preprocess as reference
from tests.support.compare import assert_bad_input_rejected, run_exact
from tests.support.op_states import preprocess_state as make_state

OP = "draft_model_preprocess"


def check(backend, tensors, num_model_step=1, is_splitwise_prefill=False, context=""):
    want = reference(
        *tensors, num_model_step=num_model_step, is_splitwise_prefill=is_splitwise_prefill
    )
    attrs = (num_model_step, is_splitwise_prefill)
    return run_exact(backend, OP, NAMES, tensors, attrs, want, context)


@pytest.mark.parametrize("bsz", [1, 7, 64, 1500])
@pytest.mark.parametrize("k", [1, 3, 5, 8])
def test_random_batches_match_reference(backend, bsz, k):
    rng = np.random.default_rng(bsz * 10 + k)
    for num_model_step, splitwise in ((1, False), (k, False), (k, True)):
        check(
            backend,
            make_state(rng, bsz, k, num_model_step=num_model_step),
            num_model_step,
            splitwise,
            f"bsz={bsz} k={k} steps={num_model_step} splitwise={splitwise}",
        )


def one_item(**overrides):
    """A single decode item with readable values; override any tensor by name."""
    t = dict(
        draft_tokens=np.array([[70, 71, 72, 73]], np.int64),
        input_ids=np.array([[10, 11, 12, 13, 14, 15]], np.int64),
        stop_flags=np.array([[True]]),
        seq_lens_this_time=np.array([-999], np.int32),
        seq_lens_encoder=np.array([0], np.int32),
        seq_lens_decoder=np.array([33], np.int32),
        step_idx=np.array([[-999]], np.int64),
        not_need_stop=np.array([False]),
        pre_ids=np.arange(100, 116, dtype=np.int64).reshape(1, 16),
        accept_tokens=np.array([[501, 502, 503, 504]], np.int64),
        accept_num=np.array([3], np.int32),
        target_model_seq_lens_encoder=np.array([0], np.int32),
        target_model_seq_lens_decoder=np.array([40], np.int32),
        target_model_step_idx=np.array([[9]], np.int64),
        target_model_stop_flags=np.array([[False]]),
        max_dec_len=np.array([[50]], np.int64),
        target_model_draft_tokens=np.array([[501, 61, 62, 63]], np.int64),
    )
    t.update(overrides)
    return [t[n] for n in NAMES]


def test_decode_builds_the_shadow_state(backend):
    out = check(backend, one_item(), context="decode")
    assert out["seq_lens_decoder"][0] == 40 - 3  # target dec - accept_num
    assert out["step_idx"][0, 0] == 9 - 3  # target step - accept_num
    np.testing.assert_array_equal(out["draft_tokens"][0, :3], [501, 502, 503])
    np.testing.assert_array_equal(out["pre_ids"][0, 6:9], [501, 502, 503])  # tgt - a + i
    assert out["seq_lens_this_time"][0] == 3 and not out["stop_flags"][0, 0]
    assert out["not_need_stop"][0]


def test_prefill_writes_the_first_token_at_enc_minus_one(backend):
    out = check(backend, one_item(seq_lens_encoder=np.array([4], np.int32)), context="prefill")
    assert out["input_ids"][0, 3] == 501  # truncate-first-token: enc - 1, not enc
    assert out["input_ids"][0, 4] == 14
    assert out["pre_ids"][0, 0] == 501
    assert out["seq_lens_this_time"][0] == 4
    assert out["step_idx"][0, 0] == 9 - 1
    assert out["seq_lens_decoder"][0] == 33  # untouched in prefill


def test_target_draft_slots_are_reset_for_every_item_even_stopped(backend):
    out = check(backend, one_item(target_model_stop_flags=np.array([[True]])), context="stopped")
    np.testing.assert_array_equal(out["target_model_draft_tokens"][0], [501, -1, -1, -1])


def test_stopped_target_skips_and_zeroes_the_item(backend):
    out = check(backend, one_item(target_model_stop_flags=np.array([[True]])), context="stopped")
    assert out["stop_flags"][0, 0]
    assert out["seq_lens_this_time"][0] == 0 and out["seq_lens_decoder"][0] == 0
    assert out["seq_lens_encoder"][0] == 0 and out["step_idx"][0, 0] == 0
    assert not out["not_need_stop"][0]


@pytest.mark.parametrize("target_step,skipped", [(47, False), (48, True), (49, True)])
def test_skip_when_the_round_would_pass_max_dec_len(backend, target_step, skipped):
    # skip iff target_step + num_model_step >= max_dec_len (50), with 2 substeps
    tensors = one_item(target_model_step_idx=np.array([[target_step]], np.int64))
    out = check(backend, tensors, num_model_step=2, context=f"step={target_step}")
    assert bool(out["stop_flags"][0, 0]) == skipped


def test_splitwise_prefill_node_does_not_skip_at_max_dec_len(backend):
    tensors = one_item(
        target_model_step_idx=np.array([[49]], np.int64), seq_lens_encoder=np.array([5], np.int32)
    )
    out = check(backend, tensors, num_model_step=2, is_splitwise_prefill=True, context="P node")
    assert not out["stop_flags"][0, 0] and out["seq_lens_this_time"][0] == 5


def test_not_need_stop_is_true_when_any_item_is_kept(backend):
    rng = np.random.default_rng(3)
    tensors = make_state(rng, 40, 2, mix={"stopped": 1.0})
    tensors[14][17, 0] = False  # one target item still running
    out = check(backend, tensors, context="one running")
    assert out["not_need_stop"][0]


def test_history_positions_past_the_row_are_dropped(backend):
    # target step 18, 4 accepted, L = 16: positions 14, 15 are written, 16, 17 dropped
    tensors = one_item(
        accept_num=np.array([4], np.int32),
        target_model_step_idx=np.array([[18]], np.int64),
        max_dec_len=np.array([[100]], np.int64),
    )
    out = check(backend, tensors, context="history past L")
    assert out["seq_lens_this_time"][0] == 4
    np.testing.assert_array_equal(out["pre_ids"][0, 14:16], [501, 502])


@pytest.mark.parametrize("accept_num,kept", [(-1, 0), (5, 4), (2**31 - 1, 4), (-(2**31), 0)])
def test_accept_num_outside_the_accepted_row_is_clamped_on_every_backend(backend, accept_num, kept):
    """accept_num is a value (a device kernel cannot check it without a sync): every backend
    clamps it to [0, accept_tokens width] instead of rejecting it on the host."""
    out = check(
        backend,
        one_item(accept_num=np.array([accept_num], np.int32)),
        context=f"accept_num={accept_num}",
    )
    assert out["seq_lens_this_time"][0] == kept
    assert out["step_idx"][0, 0] == 9 - kept
    np.testing.assert_array_equal(out["draft_tokens"][0, :kept], [501, 502, 503, 504][:kept])


def test_upstream_per_tensor_row_widths_draft_4_accept_100_target_10(backend):
    """Upstream's own test: draft_tokens [N, 4], accept_tokens [N, 100],
    target_model_draft_tokens [N, 10] in one call, each read with its own row stride. Columns
    a row lacks are skipped: accept_num up to 14 fills 4 draft slots but 14 history tokens."""
    rng = np.random.default_rng(11)
    bsz = 10
    tensors = make_state(rng, bsz, 3)
    tensors[9] = rng.integers(0, 100, size=(bsz, 100)).astype(np.int64)  # accept_tokens
    tensors[10] = rng.integers(1, 15, size=bsz).astype(np.int32)  # accept_num, up to 14
    tensors[16] = np.zeros((bsz, 10), np.int64)  # target_model_draft_tokens
    tensors[8] = rng.integers(0, 100, size=(bsz, 100)).astype(np.int64)  # pre_ids
    tensors[13] = rng.integers(20, 40, size=(bsz, 1)).astype(np.int64)  # target step_idx
    tensors[15] = np.full((bsz, 1), 1000, np.int64)  # max_dec_len
    out = check(backend, tensors, context="per-tensor widths")
    decode = (tensors[4] == 0) & ~tensors[14].reshape(-1)
    np.testing.assert_array_equal(out["seq_lens_this_time"][decode], tensors[10][decode])
    np.testing.assert_array_equal(out["target_model_draft_tokens"][:, 1:], -1)


def test_width_zero_rows_are_never_indexed(backend):
    """accept_tokens (and every other row tensor) of width 0 with accept_num 0: a prefill
    item has no first token to write, a decode item accepts nothing; nothing is read."""
    for enc in (0, 4):
        tensors = one_item(
            draft_tokens=np.zeros((1, 0), np.int64),
            input_ids=np.zeros((1, 0), np.int64),
            pre_ids=np.zeros((1, 0), np.int64),
            accept_tokens=np.zeros((1, 0), np.int64),
            accept_num=np.array([0], np.int32),
            target_model_draft_tokens=np.zeros((1, 0), np.int64),
            seq_lens_encoder=np.array([enc], np.int32),
        )
        out = check(backend, tensors, context=f"width 0, enc={enc}")
        assert out["seq_lens_this_time"][0] == enc


def test_extreme_steps_and_lengths_saturate_instead_of_wrapping(backend):
    """target_step + num_model_step >= max_dec_len is decided without the sum; steps and
    lengths that would leave their dtype's range stick at its limit."""
    i64, i32 = np.iinfo(np.int64), np.iinfo(np.int32)
    for tgt, max_dec, tgt_dec, enc in [
        (i64.max, i64.max, 40, 0),  # the sum would wrap negative: still skipped
        (i64.min, 50, i32.min, 0),  # kept; step and dec saturate at the minimum
        (i64.min, i64.min, 40, 3),  # max_dec_len - num_model_step underflows: skipped
        (i64.min, 50, 40, 3),  # prefill: step - 1 saturates
        (5, i64.min + 1, 40, 0),
    ]:
        tensors = one_item(
            target_model_step_idx=np.array([[tgt]], np.int64),
            max_dec_len=np.array([[max_dec]], np.int64),
            target_model_seq_lens_decoder=np.array([tgt_dec], np.int32),
            seq_lens_encoder=np.array([enc], np.int32),
        )
        check(
            backend,
            tensors,
            num_model_step=2,
            context=f"tgt={tgt} max_dec={max_dec} dec={tgt_dec} enc={enc}",
        )


def test_length_values_of_2_31_do_not_cost_time(backend):
    """Work is bounded by the buffers, not by length values (a generous limit in a child)."""
    from tests.ops.child_process import run_in_child

    big = 2**31 - 1
    for enc in (0, big):
        tensors = one_item(
            accept_num=np.array([big], np.int32),
            seq_lens_encoder=np.array([enc], np.int32),
            target_model_step_idx=np.array([[big]], np.int64),
            max_dec_len=np.array([[2**62]], np.int64),
        )
        run_in_child(lambda t=tensors: bool(check(backend, t, context="2**31 - 1")), timeout=60)


def test_batch_beyond_upstream_1024_cap(backend):
    rng = np.random.default_rng(9)
    out = check(backend, make_state(rng, 2100, 3), context="bsz=2100")
    assert (out["seq_lens_this_time"] != -999).all()


BAD = {
    "draft_tokens_int32": (0, lambda t: t[0].astype(np.int32), "draft_tokens"),
    "accept_num_int64": (10, lambda t: t[10].astype(np.int64), "accept_num"),
    "stop_flags_uint8": (2, lambda t: t[2].astype(np.uint8), "stop_flags"),
    "accept_tokens_rank1": (9, lambda t: t[9].reshape(-1), "accept_tokens"),
    "target_draft_batch_mismatch": (16, lambda t: t[16][:1].copy(), "target_model_draft_tokens"),
    "pre_ids_batch_mismatch": (8, lambda t: np.zeros((1, 16), np.int64), "pre_ids"),
    "max_dec_len_batch_mismatch": (15, lambda t: np.zeros((2, 1), np.int64), "max_dec_len"),
    "not_need_stop_two_elements": (7, lambda t: np.zeros(2, bool), "not_need_stop"),
    "input_ids_rank1": (1, lambda t: t[1].reshape(-1), "input_ids"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    assert_bad_input_rejected(
        backend, OP, NAMES, BAD[case], make_state(np.random.default_rng(1), 4, 3), (1, False)
    )


def test_num_model_step_below_one_is_rejected(backend):
    tensors = make_state(np.random.default_rng(1), 4, 3)
    with pytest.raises(ValueError, match="attr `num_model_step` must be >= 1"):
        backend.run(OP, tensors, (0, False))
