"""draft_model_preprocess on every backend against tests/reference/ (docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.compare import assert_all_exact, assert_rejected
from tests.reference.draft_model_preprocess import NAMES, draft_model_preprocess as reference

OP = "draft_model_preprocess"


def make_state(rng, bsz, k, *, num_model_step=1, pre_len=64, prompt_len=48, mix=None):
    """A random mid-run batch: prefill, decode, stopped and near-max_dec_len items."""
    w = k + 1
    mix = mix or {"prefill": 0.25, "decode": 0.45, "stopped": 0.15, "near_max": 0.15}
    kinds = rng.choice(list(mix), size=bsz, p=np.array(list(mix.values())) / sum(mix.values()))
    max_dec = rng.integers(20, 40, size=(bsz, 1)).astype(np.int64)
    tgt_step = rng.integers(1, 15, size=(bsz, 1)).astype(np.int64)
    near = kinds == "near_max"
    tgt_step[near, 0] = max_dec[near, 0] - rng.integers(0, num_model_step + 1, size=near.sum())
    enc = np.where(kinds == "prefill", rng.integers(1, prompt_len, size=bsz), 0).astype(np.int32)
    accept_num = rng.integers(1, w + 1, size=bsz).astype(np.int32)
    tensors = [
        rng.integers(0, 1000, size=(bsz, w)).astype(np.int64),  # draft_tokens
        rng.integers(0, 1000, size=(bsz, prompt_len)).astype(np.int64),  # input_ids
        rng.random((bsz, 1)) < 0.5,  # stop_flags (overwritten for every item)
        np.full(bsz, -999, np.int32),  # seq_lens_this_time (sentinel)
        enc,
        rng.integers(0, 100, size=bsz).astype(np.int32),  # seq_lens_decoder
        np.full((bsz, 1), -999, np.int64),  # step_idx (sentinel)
        np.array([rng.random() < 0.5]),  # not_need_stop
        rng.integers(-1, 1000, size=(bsz, pre_len)).astype(np.int64),  # pre_ids
        rng.integers(0, 1000, size=(bsz, w)).astype(np.int64),  # accept_tokens
        accept_num,
        rng.integers(0, 50, size=bsz).astype(np.int32),  # target seq_lens_encoder (unused)
        rng.integers(10, 100, size=bsz).astype(np.int32),  # target seq_lens_decoder
        tgt_step,
        (kinds == "stopped").reshape(bsz, 1),  # target stop flags
        max_dec,
        rng.integers(0, 1000, size=(bsz, w)).astype(np.int64),  # target draft tokens
    ]
    return tensors


def check(backend, tensors, num_model_step=1, is_splitwise_prefill=False, context=""):
    want = reference(*tensors, num_model_step=num_model_step, is_splitwise_prefill=is_splitwise_prefill)
    got = backend.run(OP, tensors, (num_model_step, is_splitwise_prefill))
    assert_all_exact(NAMES, got, want, context=f"{backend.name} {context}")
    return dict(zip(NAMES, got))


@pytest.mark.parametrize("bsz", [1, 7, 64, 1500])
@pytest.mark.parametrize("k", [1, 3, 5])
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
    tensors = one_item(target_model_step_idx=np.array([[49]], np.int64), seq_lens_encoder=np.array([5], np.int32))
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


@pytest.mark.parametrize("accept_num", [-1, 5])
def test_accept_num_outside_zero_to_k_plus_one_is_rejected_on_host(backend, accept_num):
    """Host tensors are value-checked; on CUDA the kernel clamps instead (no device sync)."""
    if backend.name == "cuda":
        pytest.skip("device values are not read back; the kernel clamps accept_num to [0, K+1]")
    assert_rejected(backend, OP, NAMES, one_item(accept_num=np.array([accept_num], np.int32)), "accept_num", (1, False))


def test_batch_beyond_upstream_1024_cap(backend):
    rng = np.random.default_rng(9)
    out = check(backend, make_state(rng, 2100, 3), context="bsz=2100")
    assert (out["seq_lens_this_time"] != -999).all()


BAD = {
    "draft_tokens_int32": (0, lambda t: t[0].astype(np.int32), "draft_tokens"),
    "accept_num_int64": (10, lambda t: t[10].astype(np.int64), "accept_num"),
    "stop_flags_uint8": (2, lambda t: t[2].astype(np.uint8), "stop_flags"),
    "accept_tokens_width_k": (9, lambda t: t[9][:, :-1].copy(), "accept_tokens"),
    "target_draft_width_k": (16, lambda t: t[16][:, :-1].copy(), "target_model_draft_tokens"),
    "pre_ids_batch_mismatch": (8, lambda t: np.zeros((1, 16), np.int64), "pre_ids"),
    "max_dec_len_batch_mismatch": (15, lambda t: np.zeros((2, 1), np.int64), "max_dec_len"),
    "not_need_stop_two_elements": (7, lambda t: np.zeros(2, bool), "not_need_stop"),
    "input_ids_rank1": (1, lambda t: t[1].reshape(-1), "input_ids"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    index, build, name = BAD[case]
    tensors = make_state(np.random.default_rng(1), 4, 3)
    tensors[index] = build(tensors)
    assert_rejected(backend, OP, NAMES, tensors, name, (1, False))


def test_num_model_step_below_one_is_rejected(backend):
    tensors = make_state(np.random.default_rng(1), 4, 3)
    with pytest.raises(ValueError, match="attr `num_model_step` must be >= 1"):
        backend.run(OP, tensors, (0, False))
