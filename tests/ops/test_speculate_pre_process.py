"""speculate_pre_process on every backend against tests/reference/ (docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.reference.speculate_pre_process import (
    INPUTS,
    OUTPUTS,
    speculate_pre_process as reference,
)
from tests.support.compare import (
    assert_all_exact,
    assert_bad_input_rejected,
    assert_exact,
    assert_rejected,
)

OP = "speculate_pre_process"
NAMES = INPUTS + OUTPUTS


def out_specs(bsz, width, token_num):
    shapes = [(token_num,), (token_num,), (bsz + 1,), (bsz + 1,), (bsz + 1,), (bsz * width,), (1,)]
    dtypes = [np.int64] + [np.int32] * 6
    return [(name, shape, dtype) for name, shape, dtype in zip(OUTPUTS, shapes, dtypes)]


def make_state(rng, bsz, k, *, prompt_cap=40):
    w = k + 1
    kind = rng.choice(["prefill", "decode", "single", "idle"], size=bsz, p=[0.25, 0.45, 0.15, 0.15])
    slt = np.select(
        [kind == "prefill", kind == "decode", kind == "single"],
        [
            rng.integers(1, prompt_cap + 1, size=bsz),
            rng.integers(2, w + 1, size=bsz) if w > 1 else 1,
            1,
        ],
        0,
    ).astype(np.int32)
    enc = np.where(kind == "prefill", slt, 0).astype(np.int32)
    return [
        rng.integers(0, 30000, size=(bsz, prompt_cap)).astype(np.int64),
        slt,
        rng.integers(0, 30000, size=(bsz, w)).astype(np.int64),
        enc,
        rng.integers(0, 100, size=bsz).astype(np.int32),
    ]


def check(backend, tensors, token_num=None, context=""):
    bsz, width = tensors[2].shape
    token_num = int(np.maximum(tensors[1], 0).sum()) if token_num is None else token_num
    want = reference(*tensors, cpu_token_num=token_num)
    got = backend.run(OP, tensors, (token_num,), out_specs(bsz, width, token_num))
    assert_all_exact(NAMES, got, want, context=f"{backend.name} {context}")
    return dict(zip(NAMES, got))


@pytest.mark.parametrize("bsz", [1, 7, 64, 1500])
@pytest.mark.parametrize("k", [1, 3, 5, 8])
def test_random_batches_match_reference(backend, bsz, k):
    check(backend, make_state(np.random.default_rng(bsz + k), bsz, k), context=f"bsz={bsz} k={k}")


def fixed():
    # item 0: decode 3 tokens; item 1: prefill 4 tokens; item 2: idle; item 3: decode 1 token
    return [
        np.arange(100, 124, dtype=np.int64).reshape(4, 6),
        np.array([3, 4, 0, 1], np.int32),
        np.arange(10, 26, dtype=np.int64).reshape(4, 4),
        np.array([0, 4, 0, 0], np.int32),
        np.zeros(4, np.int32),
    ]


def test_decode_reads_draft_tokens_and_prefill_reads_input_ids(backend):
    out = check(backend, fixed(), context="fixed")
    np.testing.assert_array_equal(out["ids_remove_padding"], [10, 11, 12, 106, 107, 108, 109, 22])
    np.testing.assert_array_equal(out["batch_id_per_token"], [0, 0, 0, 1, 1, 1, 1, 3])
    np.testing.assert_array_equal(out["cu_seqlens_q"], [0, 3, 7, 7, 8])
    np.testing.assert_array_equal(out["cu_seqlens_k"], out["cu_seqlens_q"])


def test_output_rows_are_n_for_decode_one_for_prefill_or_single_zero_when_idle(backend):
    out = check(backend, fixed(), context="fixed")
    np.testing.assert_array_equal(out["cu_seq_lens_q_output"], [0, 3, 4, 4, 5])
    np.testing.assert_array_equal(out["batch_id_per_token_output"][:5], [0, 0, 0, 1, 3])
    assert (out["batch_id_per_token_output"][5:] == -1).all()
    assert out["real_output_token_num"][0] == 5


def test_zero_tokens_still_writes_the_offsets(backend):
    # upstream returns early and leaves cu_* uninitialised (docs/compat.md, section 2)
    tensors = fixed()
    tensors[1] = np.zeros(4, np.int32)
    out = check(backend, tensors, token_num=0, context="T=0")
    assert (out["cu_seqlens_q"] == 0).all() and (out["cu_seq_lens_q_output"] == 0).all()
    assert out["real_output_token_num"][0] == 0


def test_token_num_smaller_than_the_lengths_never_writes_out_of_bounds(backend):
    out = check(backend, fixed(), token_num=5, context="T too small")
    np.testing.assert_array_equal(out["ids_remove_padding"], [10, 11, 12, 106, 107])


def test_token_num_larger_than_the_lengths_leaves_fill_values(backend):
    out = check(backend, fixed(), token_num=10, context="T too large")
    np.testing.assert_array_equal(out["ids_remove_padding"][8:], [2, 2])
    np.testing.assert_array_equal(out["batch_id_per_token"][8:], [-1, -1])


def test_batch_beyond_cooperative_launch_limits(backend):
    check(backend, make_state(np.random.default_rng(3), 5000, 2, prompt_cap=8), context="bsz=5000")


BAD = {
    "input_ids_int32": (0, lambda t: t[0].astype(np.int32), "input_ids"),
    "seq_len_int64": (1, lambda t: t[1].astype(np.int64), "seq_len"),
    "draft_tokens_batch_mismatch": (2, lambda t: t[2][:-1].copy(), "draft_tokens"),
    "seq_lens_encoder_batch_mismatch": (3, lambda t: t[3][:-1].copy(), "seq_lens_encoder"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    assert_bad_input_rejected(backend, OP, INPUTS, BAD[case], fixed(), (8,), out_specs(4, 4, 8))


def test_negative_seq_len_counts_as_zero_on_every_backend(backend):
    """Formerly rejected on host tensors only (and clamped on CUDA); now the same everywhere."""
    tensors = fixed()
    tensors[1] = np.array([3, -4, 0, -(2**31)], np.int32)
    out = check(backend, tensors, token_num=3, context="negative seq_len")
    np.testing.assert_array_equal(out["cu_seqlens_q"], [0, 3, 3, 3, 3])
    np.testing.assert_array_equal(out["cu_seq_lens_q_output"], [0, 3, 3, 3, 3])


I32_MAX = 2**31 - 1


def test_length_sums_past_int32_saturate_instead_of_wrapping(backend):
    """seq_len = [2**31 - 1, 2**31 - 1, 1, 3]: the int32 offsets saturate at 2**31 - 1 (they
    used to wrap to a valid-looking offset); only tokens below T are written."""
    tensors = fixed()
    tensors[1] = np.array([I32_MAX, I32_MAX, 1, 3], np.int32)
    tensors[3] = np.array([0, 0, 0, 0], np.int32)
    out = check(backend, tensors, token_num=6, context="saturating offsets")
    np.testing.assert_array_equal(out["cu_seqlens_q"], [0, I32_MAX, I32_MAX, I32_MAX, I32_MAX])
    np.testing.assert_array_equal(
        out["cu_seq_lens_q_output"], [0, I32_MAX, I32_MAX, I32_MAX, I32_MAX]
    )
    np.testing.assert_array_equal(out["ids_remove_padding"], [10, 11, 12, 13, 2, 2])
    np.testing.assert_array_equal(out["batch_id_per_token"], [0, 0, 0, 0, 0, 0])
    assert (out["batch_id_per_token_output"] == 0).all() and out["real_output_token_num"][
        0
    ] == I32_MAX


def test_huge_lengths_cost_no_more_than_the_buffers(backend):
    """Lengths of 2**31 - 1: the work is bounded by T and N * W, not by the values."""
    from tests.ops.child_process import run_op_in_child as run_in_child

    tensors = make_state(np.random.default_rng(17), 64, 3)
    tensors[1][::5] = I32_MAX
    token_num = 500
    want = reference(*tensors, cpu_token_num=token_num)
    got = run_in_child(backend, OP, tensors, (token_num,), out_specs(64, 4, token_num))
    assert_all_exact(NAMES, got, want, context=backend.name)


def test_per_item_arrays_and_row_matrices_may_have_more_rows_than_the_batch(backend):
    """The batch is seq_len's length; longer seq_lens_encoder/decoder and taller input_ids /
    draft_tokens (upstream callers pad to max_bsz) are accepted and their extra rows unread."""
    tensors = fixed()
    want = reference(*tensors, cpu_token_num=8)
    padded = [np.concatenate([t, np.full((3,) + t.shape[1:], 5, t.dtype)]) for t in tensors]
    padded[1] = tensors[1]
    got = backend.run(OP, padded, (8,), out_specs(4, 4, 8))
    for name, g in zip(OUTPUTS, got[len(INPUTS) :]):
        assert_exact(name, g, want[name], context=backend.name)


def test_negative_token_num_is_rejected(backend):
    with pytest.raises(ValueError, match="attr `cpu_token_num` must be >= 0"):
        backend.run(OP, fixed(), (-1,), out_specs(4, 4, 0))


def test_token_num_above_what_the_rows_hold_is_refused_naming_it_before_any_allocation(backend):
    """T <= N * max(C, W): each item's tokens come from its own row of input_ids ([N, C]) or
    draft_tokens ([N, W]). fixed() has N = 4, C = 6, W = 4, so T = 24 still works (slots past
    the 8 real tokens keep their fill) and T = 25 is refused. T = 10**12 asks the Paddle op
    for 8 TB of outputs: it must be refused by name, before the allocator is asked (it used
    to fail with Paddle's "(ResourceExhausted) Fail to alloc memory of 8000000000000 size");
    the framework-free binding, given outputs for 8 tokens, names `cpu_token_num` too, not
    an output."""
    out = check(backend, fixed(), token_num=24, context="T = N * max(C, W)")
    assert (out["ids_remove_padding"][8:] == 2).all() and (
        out["batch_id_per_token"][8:] == -1
    ).all()
    for token_num in (10**12, 25):
        message = assert_rejected(
            backend, OP, INPUTS, fixed(), "cpu_token_num", (token_num,), out_specs(4, 4, 8)
        )
        assert (
            "attr `cpu_token_num` must be <= 24, the most tokens the batch's rows hold" in message
        ), message
        assert message.endswith(f"got {token_num}"), message


def test_token_num_bound_uses_the_wider_of_input_ids_and_draft_tokens(backend):
    """Decode items read draft_tokens: with input_ids narrower than the draft rows the bound
    is N * W (and input_ids' rows past N do not count)."""
    tensors = fixed()
    tensors[0] = np.zeros((6, 2), np.int64)  # 6 rows for a batch of 4, 2 columns
    tensors[3] = np.zeros(4, np.int32)  # every item decodes: 4 tokens from its draft row
    tensors[1] = np.array([4, 4, 4, 4], np.int32)
    check(backend, tensors, token_num=16, context="T = N * W")
    assert_rejected(backend, OP, INPUTS, tensors, "cpu_token_num", (17,), out_specs(4, 4, 17))


def test_python_wrapper_keeps_the_proposer_call_form():
    """FastDeploy's proposer calls speculate_pre_process(token_num, input_ids, seq_lens_this_time,
    draft_tokens, seq_lens_encoder, seq_lens_decoder) and unpacks seven outputs."""
    paddle = pytest.importorskip("paddle")
    import fastdeploy_mtp.ops as ops

    tensors = fixed()
    want = reference(*tensors, cpu_token_num=8)
    outs = ops.speculate_pre_process(8, *[paddle.to_tensor(t) for t in tensors])
    assert len(outs) == 7
    for name, got in zip(OUTPUTS, outs):
        np.testing.assert_array_equal(got.numpy(), want[name], err_msg=name)
