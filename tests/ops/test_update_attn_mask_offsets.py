"""update_attn_mask_offsets on every backend against tests/reference/ (docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.reference.update_attn_mask_offsets import update_attn_mask_offsets as reference
from tests.support.compare import assert_exact, assert_rejected

OP = "update_attn_mask_offsets"
NAMES = (
    "ids_remove_padding",
    "seq_lens_this_time",
    "seq_lens_encoder",
    "seq_lens_decoder",
    "cu_seqlens_q",
    "attn_mask_offsets_full",
    "is_block_step",
    "decode_states",
)


def outputs(tensors):
    return [("attn_mask_offsets", (2 * tensors[0].shape[0],), np.int32)]


def make_state(rng, bsz, k=3, max_len=64):
    kind = rng.choice(["prefill", "decode", "idle"], size=bsz, p=[0.3, 0.5, 0.2])
    enc = np.where(kind == "prefill", rng.integers(1, 20, size=bsz), 0).astype(np.int32)
    dec = np.where(kind == "idle", 0, rng.integers(0, 40, size=bsz)).astype(np.int32)
    dec[(kind == "decode") & (dec == 0)] = 1
    slt = np.where(kind == "prefill", enc, rng.integers(1, k + 2, size=bsz)).astype(np.int32)
    slt[kind == "idle"] = 0
    cu = np.concatenate([[0], np.cumsum(slt)]).astype(np.int32)
    full = rng.integers(0, 1000, size=(bsz, max_len)).astype(np.int32)
    block = rng.random((bsz, 1)) < 0.1
    states = rng.choice(np.array([-1, 0, 1, 2], np.int32), size=(bsz, k + 1))
    ids = rng.integers(0, 5000, size=int(cu[-1])).astype(np.int64)
    return [ids, slt, enc, dec, cu, full, block, states]


def check(backend, tensors, context):
    want_out, want_states = reference(*tensors)
    got = backend.run(OP, tensors, (), outputs(tensors))
    for name, g, t in zip(NAMES[:-1], got, tensors):
        np.testing.assert_array_equal(g, t, err_msg=f"{name} changed ({context})")
    assert_exact("decode_states", got[7], want_states, f"{backend.name}, {context}")
    assert_exact("attn_mask_offsets", got[8], want_out, f"{backend.name}, {context}")
    return got[8], got[7]


@pytest.mark.parametrize("bsz", [1, 3, 257, 1500])
def test_random_states_match_reference(backend, bsz):
    check(backend, make_state(np.random.default_rng(bsz), bsz), f"bsz={bsz}")


def _one(enc, dec, slt, states, full_row=None, block=False):
    full = np.array([full_row if full_row is not None else np.arange(100, 116)], np.int32)
    return [
        np.zeros(slt, np.int64),
        np.array([slt], np.int32),
        np.array([enc], np.int32),
        np.array([dec], np.int32),
        np.array([0, slt], np.int32),
        full,
        np.array([[block]]),
        np.array([states], np.int32),
    ]


def test_output_is_2t_with_only_odd_slots_set(backend):
    out, _ = check(backend, _one(enc=3, dec=0, slt=3, states=[-1, -1, -1]), "prefill")
    assert out.shape == (6,)
    np.testing.assert_array_equal(out, [0, 101, 0, 102, 0, 103])  # full[b, i] + 1


def test_prefill_resumed_after_decode_state_2_uses_dec_plus_slt(backend):
    out, _ = check(backend, _one(enc=2, dec=10, slt=2, states=[2, -1, -1]), "resume")
    np.testing.assert_array_equal(out, [0, 12, 0, 12])


def test_prefill_state_2_without_decoded_tokens_uses_full(backend):
    out, _ = check(backend, _one(enc=2, dec=0, slt=2, states=[2, -1, -1]), "state 2, dec 0")
    np.testing.assert_array_equal(out, [0, 101, 0, 102])


def test_decode_offsets_and_states_keep_ones_as_minus_one(backend):
    """Decode uses dec + 1 + i; states become 0 for i < slt unless 1; the 1s
    and the tail become -1."""
    out, states = check(backend, _one(enc=0, dec=7, slt=3, states=[0, 1, 2, 0]), "decode")
    np.testing.assert_array_equal(out, [0, 8, 0, 9, 0, 10])
    np.testing.assert_array_equal(states, [[0, -1, 0, -1]])


def test_block_step_items_are_skipped(backend):
    out, states = check(
        backend, _one(enc=0, dec=7, slt=2, states=[1, 1, 1], block=True), "block step"
    )
    assert (out == 0).all()
    np.testing.assert_array_equal(states, [[1, 1, 1]])


def test_idle_item_is_skipped(backend):
    out, states = check(backend, _one(enc=0, dec=0, slt=1, states=[5, 5]), "idle")
    assert (out == 0).all()
    np.testing.assert_array_equal(states, [[5, 5]])


def test_prefill_longer_than_the_full_row_is_not_overread(backend):
    check(backend, _one(enc=5, dec=0, slt=5, states=[-1, -1], full_row=[3, 4, 5]), "short full row")


def test_zero_tokens(backend):
    t = _one(enc=0, dec=0, slt=0, states=[0])
    out, _ = check(backend, t, "T=0")
    assert out.shape == (0,)


def test_upstream_exclusive_cu_seqlens_q_of_length_n_is_accepted(backend):
    """Upstream's tests pass cu_seqlens_q as [N] (entry b = start of item b); only 0..N-1 are
    read, so the [N] form gives the same result as [N + 1]."""
    tensors = make_state(np.random.default_rng(12), 9)
    want_out, want_states = reference(*tensors)
    short = list(tensors)
    short[4] = tensors[4][:-1].copy()
    got_out, got_states = check(backend, short, "cu_seqlens_q [N]")
    assert_exact("attn_mask_offsets", got_out, want_out, backend.name)
    assert_exact("decode_states", got_states, want_states, backend.name)


def test_per_item_arrays_and_row_matrices_may_have_more_rows_than_the_batch(backend):
    tensors = make_state(np.random.default_rng(13), 6)
    want_out, want_states = reference(*tensors)
    padded = list(tensors)
    for i in (2, 3, 4, 5, 6, 7):
        padded[i] = np.concatenate(
            [tensors[i], np.ones((3,) + tensors[i].shape[1:], tensors[i].dtype)]
        )
    got = backend.run(OP, padded, (), outputs(padded))
    assert_exact("attn_mask_offsets", got[8], want_out, backend.name)
    assert_exact("decode_states", got[7][:6], want_states, backend.name)
    assert (got[7][6:] == 1).all(), "a decode_states row past the batch was written"


I32_MAX = 2**31 - 1


CLAMP_CASES = ("slt_int32_max_decode", "slt_int32_max_prefill", "resume_overflow")
CLAMP_CASES += ("full_int32_max", "q_negative", "q_huge")


@pytest.mark.parametrize("case", CLAMP_CASES)
def test_out_of_range_values_are_clamped_the_same_on_every_backend(backend, case):
    """Lengths and offsets are never rejected: token slots outside [0, 2T) are skipped and
    the offsets saturate at the int32 maximum (they used to wrap)."""
    if case == "slt_int32_max_decode":
        t = _one(enc=0, dec=I32_MAX - 1, slt=3, states=[0, 0, 0, 0])
        t[1][0] = I32_MAX
    elif case == "slt_int32_max_prefill":
        t = _one(enc=I32_MAX, dec=0, slt=4, states=[-1, -1])
        t[1][0] = I32_MAX
    elif case == "resume_overflow":
        t = _one(enc=3, dec=I32_MAX - 1, slt=3, states=[2, -1])
    elif case == "full_int32_max":
        t = _one(enc=3, dec=0, slt=3, states=[-1], full_row=[I32_MAX, 5, I32_MAX])
    elif case == "q_negative":
        t = _one(enc=0, dec=4, slt=3, states=[0, 0])
        t[4] = np.array([-2], np.int32)
    else:
        t = _one(enc=0, dec=4, slt=3, states=[0, 0])
        t[4] = np.array([I32_MAX], np.int32)
    out, _ = check(backend, t, case)
    assert (out[0::2] == 0).all()


def test_huge_length_values_cost_no_more_than_the_buffers(backend):
    """seq_lens_this_time = 2**31 - 1 (the last item of each kind, so that no two items'
    token ranges overlap) and huge encoder lengths: the loops stop at the T slots."""
    from tests.ops.child_process import run_op_in_child as run_in_child

    tensors = make_state(np.random.default_rng(14), 64)
    tensors[6][:] = False
    tensors[2][::3] = np.where(tensors[2][::3] > 0, I32_MAX, 0)
    tensors[1][-1], tensors[2][-1], tensors[3][-1] = I32_MAX, 0, 5
    tensors[0] = np.zeros(int(tensors[4][-1]) + 40, np.int64)  # T reaches into the last item
    want_out, want_states = reference(*tensors)
    got = run_in_child(backend, OP, tensors, (), outputs(tensors))
    assert_exact("attn_mask_offsets", got[8], want_out, backend.name)
    assert_exact("decode_states", got[7], want_states, backend.name)


BAD_INPUTS = {
    "ids_remove_padding_rank2": (0, lambda t: t[0].reshape(1, -1), "ids_remove_padding"),
    "seq_lens_decoder_int64": (3, lambda t: t[3].astype(np.int64), "seq_lens_decoder"),
    "cu_seqlens_q_len_n_minus_1": (4, lambda t: t[4][:-2], "cu_seqlens_q"),
    "cu_seqlens_q_rank2": (4, lambda t: t[4].reshape(-1, 1), "cu_seqlens_q"),
    "cu_seqlens_q_int64": (4, lambda t: t[4].astype(np.int64), "cu_seqlens_q"),
    "decode_states_batch_2": (7, lambda t: t[7][:2], "decode_states"),
    "attn_mask_offsets_full_batch_2": (5, lambda t: t[5][:2], "attn_mask_offsets_full"),
    "is_block_step_int32": (6, lambda t: t[6].astype(np.int32), "is_block_step"),
    "decode_states_int64": (7, lambda t: t[7].astype(np.int64), "decode_states"),
    "decode_states_rank1": (7, lambda t: t[7].reshape(-1), "decode_states"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    index, build, name = BAD_INPUTS[case]
    tensors = make_state(np.random.default_rng(9), 4)
    tensors[index] = np.ascontiguousarray(build(tensors))
    outs = [("attn_mask_offsets", (2 * max(tensors[0].size, 0),), np.int32)]
    assert_rejected(backend, OP, NAMES, tensors, name, (), () if backend.name == "cpu" else outs)


def test_paddle_rejected_call_leaves_decode_states_unchanged():
    paddle = pytest.importorskip("paddle")
    import fastdeploy_mtp.ops as ops

    t = make_state(np.random.default_rng(10), 5)
    p = [paddle.to_tensor(a) for a in t]
    p[4] = paddle.to_tensor(t[4][:-2])
    with pytest.raises(ops.OpError, match="`cu_seqlens_q`"):
        ops.update_attn_mask_offsets(*p)
    np.testing.assert_array_equal(p[7].numpy(), t[7])
