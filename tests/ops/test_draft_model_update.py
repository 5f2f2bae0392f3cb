"""draft_model_update on every backend against tests/reference/ (docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.reference.draft_model_update import NAMES, draft_model_update as reference
from tests.support.compare import assert_bad_input_rejected, run_exact

OP = "draft_model_update"
MAX_SEQ_LEN = 64


def make_state(rng, bsz, k, *, pre_len=MAX_SEQ_LEN):
    """Random draft state mid-round: prefilled, decoding, stopped (with and without tokens
    this time), inactive and near-max_dec_len items."""
    w = k + 1
    kind = rng.choice(
        ["prefill", "decode", "stopped", "stopped_idle", "idle", "near_max"],
        size=bsz,
        p=[0.2, 0.35, 0.1, 0.1, 0.1, 0.15],
    )
    slt = np.where(
        np.isin(kind, ["idle", "stopped_idle"]), 0, rng.integers(1, w + 1, size=bsz)
    ).astype(np.int32)
    enc = np.where(kind == "prefill", rng.integers(1, 30, size=bsz), 0).astype(np.int32)
    dec = np.where(
        kind == "prefill", rng.integers(0, 5, size=bsz), rng.integers(1, 40, size=bsz)
    ).astype(np.int32)
    max_dec = rng.integers(30, 50, size=(bsz, 1)).astype(np.int64)
    step = rng.integers(0, 20, size=(bsz, 1)).astype(np.int64)
    near = kind == "near_max"
    step[near, 0] = max_dec[near, 0] - rng.integers(0, 3, size=near.sum())
    stop = np.isin(kind, ["stopped", "stopped_idle"]).reshape(bsz, 1)
    active = int((slt > 0).sum())
    return [
        rng.integers(0, 5000, size=active).astype(np.int64),  # inter_next_tokens (compacted)
        rng.integers(0, 5000, size=(bsz, w)).astype(np.int64),  # draft_tokens
        rng.integers(-1, 5000, size=(bsz, pre_len)).astype(np.int64),  # pre_ids
        slt,
        enc,
        dec,
        step,
        np.zeros((bsz + 1, 1), np.int32),  # cu_seqlens_q_output (unused)
        stop,
        np.array([rng.random() < 0.5]),  # not_need_stop
        max_dec,
        np.array([[2], [3]], np.int64),  # end_ids (unused)
        rng.integers(0, 5000, size=(bsz, w)).astype(np.int64),  # base_model_draft_tokens
    ]


def check(backend, tensors, substep=0, context=""):
    want = reference(*tensors, max_seq_len=MAX_SEQ_LEN, substep=substep)
    return run_exact(backend, OP, NAMES, tensors, (MAX_SEQ_LEN, substep), want, context)


@pytest.mark.parametrize("bsz", [1, 7, 64, 1500])
@pytest.mark.parametrize("k", [1, 3, 5, 8])
def test_random_batches_match_reference(backend, bsz, k):
    rng = np.random.default_rng(bsz * 100 + k)
    for substep in sorted({0, k - 1}):
        check(backend, make_state(rng, bsz, k), substep, f"bsz={bsz} k={k} substep={substep}")


def items(rows, pre_len=16, k=3):
    """Build a batch from per-item dicts (slt, enc, dec, step, stop, max_dec); tokens are
    100 + the compacted index."""
    bsz = len(rows)
    active = [r for r in rows if r["slt"] > 0]
    return [
        np.array([100 + i for i in range(len(active))], np.int64),
        np.full((bsz, k + 1), 7, np.int64),
        np.full((bsz, pre_len), -5, np.int64),
        np.array([r["slt"] for r in rows], np.int32),
        np.array([r.get("enc", 0) for r in rows], np.int32),
        np.array([r.get("dec", 0) for r in rows], np.int32),
        np.array([[r.get("step", 3)] for r in rows], np.int64),
        np.zeros((bsz + 1, 1), np.int32),
        np.array([[r.get("stop", False)] for r in rows]),
        np.array([False]),
        np.array([[r.get("max_dec", 50)] for r in rows], np.int64),
        np.array([[2]], np.int64),
        np.full((bsz, k + 1), 9, np.int64),
    ]


def test_compacted_index_counts_items_from_the_input_lengths(backend):
    # item 1 is stopped with slt > 0: its slt becomes 0 during the op, but it still owns
    # token 101, so item 2 must read 102 (upstream's GPU kernel could read 101 here).
    rows = [
        dict(slt=2, dec=5),
        dict(slt=1, dec=5, stop=True),
        dict(slt=3, dec=5),
        dict(slt=0, dec=5),
        dict(slt=1, dec=5),
    ]
    out = check(backend, items(rows), context="compaction")
    np.testing.assert_array_equal(out["draft_tokens"][:, 0], [100, -1, 102, 7, 103])


def test_stopped_item_writes_placeholders_and_zero_length(backend):
    out = check(
        backend, items([dict(slt=2, dec=5, enc=3, stop=True)]), substep=1, context="stopped"
    )
    assert out["draft_tokens"][0, 0] == -1 and out["base_model_draft_tokens"][0, 2] == -1
    assert out["seq_lens_this_time"][0] == 0 and out["seq_lens_encoder"][0] == 0
    assert not out["not_need_stop"][0]  # every item stopped with slt > 0


def test_prefill_branch_always_writes_pre_ids_index_1(backend):
    # a resumed request (step 6) still gets pre_ids[b, 1]: upstream's quirk, kept
    # on purpose (docs/compat.md, section 11)
    out = check(backend, items([dict(slt=4, enc=4, dec=2, step=6)]), context="prefill")
    assert out["pre_ids"][0, 1] == 100 and (out["pre_ids"][0, 2:] == -5).all()
    assert out["seq_lens_decoder"][0] == 6 and out["seq_lens_encoder"][0] == 0
    assert out["step_idx"][0, 0] == 7 and out["draft_tokens"][0, 0] == 100
    assert out["base_model_draft_tokens"][0, 1] == 100
    assert out["seq_lens_this_time"][0] == 1


@pytest.mark.parametrize("step,written", [(48, True), (49, False)])
def test_prefill_base_slot_checks_the_incremented_step(backend, step, written):
    out = check(backend, items([dict(slt=2, enc=2, step=step, max_dec=50)]), context=f"step={step}")
    assert out["base_model_draft_tokens"][0, 1] == (100 if written else 9)
    assert out["draft_tokens"][0, 0] == 100  # the draft token is recorded either way


def test_decode_advances_by_seq_lens_this_time(backend):
    out = check(backend, items([dict(slt=3, dec=10, step=4)]), substep=2, context="decode")
    assert out["seq_lens_decoder"][0] == 13 and out["step_idx"][0, 0] == 7
    assert out["pre_ids"][0, 7] == 100 and out["base_model_draft_tokens"][0, 3] == 100
    assert out["seq_lens_this_time"][0] == 1 and out["not_need_stop"][0]


@pytest.mark.parametrize("step", [49, 50, 60])
def test_decode_at_max_dec_len_writes_placeholder_and_does_not_advance(backend, step):
    out = check(
        backend, items([dict(slt=2, dec=10, step=step, max_dec=50)]), context=f"step={step}"
    )
    assert out["base_model_draft_tokens"][0, 1] == -1
    assert out["seq_lens_decoder"][0] == 10 and out["step_idx"][0, 0] == step
    assert out["draft_tokens"][0, 0] == 7  # not written


def test_items_without_tokens_this_time_are_untouched(backend):
    out = check(backend, items([dict(slt=0, dec=10), dict(slt=0, stop=True)]), context="idle")
    assert (out["seq_lens_this_time"] == 0).all() and (out["base_model_draft_tokens"] == 9).all()
    assert out["not_need_stop"][0]  # idle items do not count as stopped


def test_missing_token_reads_as_placeholder(backend):
    tensors = items([dict(slt=1, dec=4), dict(slt=1, dec=4)])
    tensors[0] = tensors[0][:1]  # one token for two active items
    out = check(backend, tensors, context="short inter_next_tokens")
    np.testing.assert_array_equal(out["draft_tokens"][:, 0], [100, -1])


def test_batch_beyond_upstream_512_limit(backend):
    rng = np.random.default_rng(4)
    out = check(backend, make_state(rng, 1800, 2), context="bsz=1800")
    assert (out["seq_lens_this_time"][600:] <= 1).all()


BAD = {
    "inter_next_tokens_int32": (0, lambda t: t[0].astype(np.int32), "inter_next_tokens"),
    "step_idx_int32": (6, lambda t: t[6].astype(np.int32), "step_idx"),
    "stop_flags_int8": (8, lambda t: t[8].astype(np.int8), "stop_flags"),
    "base_width_1": (12, lambda t: t[12][:, :1].copy(), "base_model_draft_tokens"),
    "pre_ids_batch_mismatch": (2, lambda t: t[2][:-1].copy(), "pre_ids"),
    "seq_lens_decoder_batch_mismatch": (5, lambda t: t[5][:-1].copy(), "seq_lens_decoder"),
    "cu_seqlens_q_output_int64": (7, lambda t: t[7].astype(np.int64), "cu_seqlens_q_output"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    tensors = make_state(np.random.default_rng(2), 5, 3)
    assert_bad_input_rejected(backend, OP, NAMES, BAD[case], tensors, (MAX_SEQ_LEN, 0))


@pytest.mark.parametrize(
    "index,name", [(3, "seq_lens_this_time"), (4, "seq_lens_encoder"), (5, "seq_lens_decoder")]
)
def test_negative_lengths_are_clamped_on_every_backend(backend, index, name):
    """Lengths are values (a device kernel cannot check them without a sync): a negative one
    reads as 0 on every backend, instead of a host-only rejection."""
    tensors = make_state(np.random.default_rng(2), 5, 3)
    tensors[index] = tensors[index].copy()
    tensors[index][:] = -1
    check(backend, tensors, context=f"negative {name}")


def test_extreme_lengths_and_steps_saturate_instead_of_wrapping(backend):
    big32, big64, min64 = 2**31 - 1, 2**63 - 1, -(2**63)
    rows = [
        dict(slt=big32, enc=big32, dec=big32, step=big64, max_dec=big64),  # prefill: sums saturate
        dict(slt=big32, dec=big32, step=5, max_dec=big64),  # decode: dec + slt, step + slt
        dict(slt=2, dec=4, step=min64 + 1, max_dec=min64),  # max_dec - 1 would underflow
        dict(slt=2, enc=-5, dec=3, step=1, max_dec=10),  # negative enc reads as 0: decode
    ]
    out = check(backend, items(rows), context="extreme values")
    assert out["seq_lens_decoder"][0] == big32 and out["step_idx"][0, 0] == big64
    assert out["seq_lens_decoder"][1] == big32 and out["step_idx"][1, 0] == 5 + big32


def test_substep_2_31_minus_1_is_rejected_without_overflow(backend):
    """substep + 1 would wrap to -2**31 in 32 bits and pass the bounds check; computed in 64
    bits it is refused, and nothing is written."""
    tensors = make_state(np.random.default_rng(2), 5, 3)
    before = [t.copy() for t in tensors]
    with pytest.raises(ValueError, match=r"draft_model_update: attr `substep` = 2147483647"):
        backend.run(OP, tensors, (MAX_SEQ_LEN, 2**31 - 1))
    for b, t in zip(before, tensors):
        np.testing.assert_array_equal(b, t)


def test_upstream_per_tensor_row_widths_draft_4_base_5(backend):
    """Upstream's own test: draft_tokens [N, 4] and base_model_draft_tokens [N, 5], each read
    with its own row stride; every substep 0..3 writes slot substep + 1 of the base row."""
    rng = np.random.default_rng(12)
    tensors = make_state(rng, 8, 3)
    tensors[12] = rng.integers(0, 5000, size=(8, 5)).astype(np.int64)
    for substep in range(4):
        check(backend, tensors, substep, context=f"widths 4 / 5, substep {substep}")


def test_cu_seqlens_q_output_of_shape_n_is_accepted_and_not_read(backend):
    """Upstream's own test passes cu_seqlens_q_output as [N]; it is never read."""
    tensors = make_state(np.random.default_rng(13), 6, 3)
    for shape in ((6,), (6, 1), (1,)):
        tensors[7] = np.full(shape, 2**31 - 1, np.int32)
        check(backend, tensors, context=f"cu_seqlens_q_output {shape}")


def test_width_zero_draft_rows_are_never_indexed(backend):
    """draft_tokens of width 0: column 0 does not exist, so it is not written."""
    rows = [dict(slt=1, dec=5), dict(slt=1, enc=3), dict(slt=1, dec=5, stop=True)]
    tensors = items(rows)
    tensors[1] = np.zeros((3, 0), np.int64)
    check(backend, tensors, context="width 0")


def test_length_values_of_2_31_do_not_cost_time(backend):
    from tests.ops.child_process import run_in_child

    rows = [
        dict(slt=2**31 - 1, dec=2**31 - 1, step=2**40, max_dec=2**62),
        dict(slt=2**31 - 1, enc=2**31 - 1),
    ]
    run_in_child(lambda: bool(check(backend, items(rows), context="2**31 - 1")), timeout=60)


@pytest.mark.parametrize(
    "substep,message", [(3, "attr `substep` = 3"), (-1, "attr `substep` must be >= 0")]
)
def test_substep_outside_the_draft_row_is_rejected(backend, substep, message):
    tensors = make_state(np.random.default_rng(2), 5, 3)  # K = 3: substep 0..2
    before = [t.copy() for t in tensors]
    with pytest.raises(ValueError, match=message):
        backend.run(OP, tensors, (MAX_SEQ_LEN, substep))
    for b, t in zip(before, tensors):
        np.testing.assert_array_equal(b, t)
